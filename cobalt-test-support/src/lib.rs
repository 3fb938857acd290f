//! Fixtures for Cobalt's own tests (not published): free loopback ports, real CoAP
//! peers (libcoap's command-line tools, aiocoap, Californium) started on them and
//! killed on drop, commands run with a wall-clock limit, and PSK and PKI fixtures.
//!
//! It does not depend on `cobalt`, so that `cobalt`'s own tests can use it. A peer
//! that is not installed skips the test with a `SKIPPED:` note, or fails it under
//! `COBALT_REQUIRE_PEERS=1` (see [`peers::require`]); `scripts/install-test-deps.sh`
//! installs them all.

pub mod netns;
pub mod peers;
#[cfg(feature = "pki")]
pub mod pki;
pub mod ports;
pub mod process;
pub mod psk;
pub mod ready;
pub mod temp;

//! Interoperability with real CoAP peers over UDP, in both directions, through the
//! `cobalt` binary and the library: libcoap's `coap-client-notls` / `coap-server-notls`,
//! aiocoap (`aiocoap-client`, the scripts in `tests/peers/`) and Californium
//! (`tests/peers/californium`). One module per area: requests and blocks ([`udp`]),
//! observe ([`observe`]), Californium ([`californium`]), the ETSI plugtest test
//! descriptions ([`plugtest`]) and Q-Block with libcoap 4.3.4 ([`qblock`]). The stream transports' interop tests are in
//! `cobalt/tests/interop`; both find and start the peers through
//! `cobalt_test_support::peers`.
//!
//! The peers are installed by `scripts/install-test-deps.sh`. A missing peer skips the
//! test with a note on stderr, or fails it when `COBALT_REQUIRE_PEERS=1`.

#[path = "../common/binary.rs"]
mod binary;

mod californium;
mod observe;
mod plugtest;
mod qblock;
mod tokens;
mod udp;

use cobalt::{Observation, Response};
use cobalt_test_support::peers::aiocoap::{self, Serve};
use cobalt_test_support::peers::libcoap::{self, Port};
use cobalt_test_support::peers::{require, PeerServer, COMMAND_LIMIT};
use cobalt_test_support::ports::V4;
use cobalt_test_support::process::{self, Ran};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// libcoap's example server on 127.0.0.1, allowing 10 resources created by PUT
/// (`-d 10`); `None` (after the skip note) if it is not installed.
fn libcoap_server() -> Option<PeerServer> {
    require(libcoap::SERVER, libcoap::tool(libcoap::SERVER))
        .map(|bin| libcoap::server(&bin, V4, &["-d", "10"], Port::Coap, None))
}

/// `tests/peers/aiocoap_server.py` over UDP on 127.0.0.1; `None` (after the skip
/// note) if aiocoap is not installed.
fn aiocoap_server() -> Option<PeerServer> {
    require("aiocoap", aiocoap::python()).map(|python| aiocoap::server(&python, Serve::Udp, None))
}

/// `coap-client-notls ARGS` giving up after 5 s of waiting (`-B 5`).
fn coap_client(bin: &Path, args: &[&str]) -> Ran {
    process::run(
        Command::new(bin).arg("-B").arg("5").args(args),
        COMMAND_LIMIT,
    )
}

/// The next `n` notifications of `obs`, each within 10 s.
async fn notifications(obs: &mut Observation, n: usize) -> Vec<Response> {
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        let next = tokio::time::timeout(Duration::from_secs(10), obs.next())
            .await
            .expect("a notification within 10 s")
            .expect("the observation goes on")
            .expect("a notification");
        got.push(next);
    }
    got
}

/// A single-threaded runtime for the async client.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

//! The allocator of the `cobalt` binary: memory comes back to the system after a flood.
//!
//! jemalloc replaces the C library's `malloc` for the whole process (OpenSSL's DTLS and
//! TLS state included, which a Rust `#[global_allocator]` alone would leave to glibc),
//! and a background thread returns pages freed for a second to the system
//! (`dirty_decay_ms:1000`, `muzzy_decay_ms:0`). Measured with `bench/floods.sh`
//! (bench/README.md, "Allocator"): after a flood of 19,000 half-open DTLS handshakes
//! the server's RSS went from 672 MiB back to 66 MiB once they expired (glibc's malloc
//! kept 655 MiB), and after 8,000 TCP connections closed from 67 MiB to 15 MiB (glibc:
//! peak 129 MiB, kept 128 MiB). glibc with a periodic `malloc_trim` gave the memory back
//! too, but stalled the process for up to 55 ms per trim at that size; mimalloc kept
//! most of it. `MALLOC_CONF` in the environment overrides these settings.

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read at its start (a C string; jemalloc reads the pointer).
#[allow(non_upper_case_globals)]
#[export_name = "malloc_conf"]
pub static malloc_conf: &[u8] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

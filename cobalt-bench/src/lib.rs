//! CoAPBench, the paper's load generator (issue 4): the engine of `cobalt bench`.
//!
//! Closed loop (default): `-c N` virtual clients, each with its own UDP socket and at
//! most one request in flight, driven by `--threads` OS threads that each run one loop
//! over their share of the sockets, moving the datagrams with io_uring (one system call
//! per loop for all of them) or, where that is unavailable or `--io epoll` asks for it,
//! with epoll (see the `client` module). Open loop with `--rate`: requests leave on a
//! fixed schedule and latency counts from the intended send time. The `coap://` and
//! `http://` generators share that loop, the `engine` module: pacing, timeouts,
//! counting and progress are written once, and each protocol only says how a request
//! starts and what its answers mean.
//! A sweep (`-c 1,10,100` or `-c 10..100:10`) runs one step per concurrency, each with
//! a warm-up, and prints one result line per step (table, `--csv` or `--json`;
//! `--plot` draws an SVG). `--server-pid` adds the server's CPU time per request and
//! its RSS, and every step reports the load generator's own CPU use. `http://` URIs
//! benchmark an HTTP/1.1 server the same way (the `http` module), and `--workers` spreads the
//! clients over `cobalt bench worker` machines (not for `coaps://`,
//! whose credentials the worker protocol does not carry).
//!
//! `coaps://` (DTLS 1.2), `coap+tcp://` and `coap+ws://` (RFC 8323, the `stream`
//! module) give every virtual client its own session or connection, set up (DTLS
//! handshake, CSM exchange) before the measurement. `coaps://` runs on the engine with
//! the I/O of `coap://` (the `dtls_udp` module: the same batching, so that a server's
//! CPU per request over the two compares like with like); the streams run in the
//! `session` module, one single-threaded tokio runtime per `--threads`. `--new-session`
//! opens a new session or connection for every request instead (`coaps://` too, in the
//! `session` module with the `dtls` one), to measure handshakes per second.
//! `coaps+tcp://` and `coaps+ws://` run TLS under the same connections (credentials as
//! for `cobalt get`; without them the system's CAs are trusted).
//!
//! `cobalt bench-responder` ([`responder`]; [`http_responder`] for HTTP) is the raw floor to compare servers with:
//!
//! ```text
//! taskset -c 1 cobalt bench-responder --bind 127.0.0.1:5690 &
//! taskset -c 0 cobalt bench coap://127.0.0.1:5690/ -c 1,10,100,1000 --server-pid $!
//! ```
//!
//! Counting rules: `completed` requests got a matching 2.xx response (piggybacked
//! ACK, or separate response matched by token, which is acknowledged; HTTP: 2xx), and
//! only they count towards requests/s and latency; a matching answer with any other
//! code (5.03 from an overloaded server, 4.04, ...) ends its exchange and is counted
//! in `non_2xx`, by code, in every output format and the plot. `lost` ones had no
//! answer within `--timeout` and are never retransmitted; `resets` got an RST;
//! `errors` counts socket errors (an ICMP port unreachable also leaves its request to
//! time out as lost) and malformed answers (which end the exchange). Stray and
//! duplicate datagrams are ignored. Over sessions, a connection that breaks is an error
//! that ends its exchange, and the client reconnects (the `session` module). A step that cannot
//! run says why and who is to blame ([`StepError`]).

mod client;
mod dtls;
mod dtls_udp;
mod engine;
mod http;
pub mod http_responder;
pub mod output;
mod pacing;
pub mod plot;
mod poll;
pub mod procfs;
pub mod responder;
mod session;
pub mod stats;
mod step;
mod step_error;
mod stream;
pub mod sys;
pub mod target;
mod uring;

pub use client::{Io, AUTO_URING_MAX_CLIENTS};
pub use http::request_bytes as http_request_bytes;
pub use step::{measure_step, request_template, run_step, Config, Measured};
pub use step_error::{Blame, StepError};

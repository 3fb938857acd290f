//! Cobalt: a CoAP (RFC 7252) server and client for IoT cloud services.
//!
//! ```no_run
//! use cobalt::server::{get, post, Observable, Request};
//! use cobalt::{Client, Code, Server};
//!
//! # async fn demo() -> cobalt::Result<()> {
//! // A server: resources are async handlers; `temp` can be observed (RFC 7641).
//! let temp = Observable::new();
//! let server = Server::new()
//!     .route("/hello", get(|| async { "hello world" }))
//!     .route("/echo", post(|r: Request| async move { (Code::CHANGED, r.payload().to_vec()) }))
//!     .route("/temp", get(|| async { "21.5" }).observable(&temp))
//!     .tcp("[::]:5683".parse().unwrap()) // also coap+tcp://
//!     .bind("[::]:5683")
//!     .await?;
//!
//! // A client: one for every scheme; errors say what happened and what to try.
//! let client = Client::new();
//! let hello = client.get("coap://127.0.0.1/hello").await?;
//! println!("{} {}", hello.code, hello.text_payload());
//! let mut observation = client.observe("coap+tcp://127.0.0.1/temp").await?;
//! if let Some(n) = observation.next().await {
//!     println!("{}", n?.text_payload());
//! }
//! observation.cancel().await?;
//! server.shutdown(std::time::Duration::from_secs(1)).await;
//! # Ok(()) }
//! ```
//!
//! # Transports
//!
//! | URI scheme | transport | server | client |
//! |---|---|---|---|
//! | `coap://` | UDP (RFC 7252), one `SO_REUSEPORT` socket per shard | [`Server::bind`] | [`Client`] |
//! | `coaps://` | DTLS 1.2 with a PSK or certificates (RFC 7252 §9) | [`Server::dtls`], [`Server::bind_dtls`] | [`Client::with_psk`], [`Client::with_x509`] |
//! | `coap+tcp://` | TCP (RFC 8323) | [`Server::tcp`] | a pooled connection per server |
//! | `coaps+tcp://` | TLS 1.2/1.3 (RFC 8323 §8.2) | [`Server::tls`] | as `coaps://`, or the system's CAs |
//! | `coap+ws://` | WebSockets (RFC 8323 §4) | [`Server::ws`] | a pooled WebSocket per server |
//! | `coaps+ws://` | secure WebSockets | [`Server::wss`] | as `coaps+tcp://` |
//!
//! Block-wise transfers (RFC 7959, BERT over TCP), observe, separate responses and
//! deduplication work over each. The [blocking client](client::blocking) does the same
//! from synchronous code.
//!
//! # Features
//!
//! - `vendored-openssl` (default): DTLS and TLS through OpenSSL built from source.
//! - `openssl`: DTLS and TLS through the system's OpenSSL (libssl-dev).
//! - neither (`default-features = false`): plain CoAP with no C dependency; `coaps://`,
//!   `coaps+tcp://` and `coaps+ws://` fail with [`Error::Unsupported`] naming the feature.
//!
//! # Structure
//!
//! The protocol itself lives in the sans-IO crate [`cobalt_proto`]; this crate adds the
//! connectors ([`transport`]), the shard threads that drive endpoints ([`runtime`]),
//! the [`Server`] with its resource tree, and the [`Client`]. A server's settings can
//! come from one TOML file with environment and command-line overrides ([`config`]);
//! its counters are exported in the Prometheus format ([`metrics`]).
#![warn(missing_docs)]

pub mod client;
pub mod config;
mod error;
pub mod metrics;
pub mod runtime;
pub mod server;
pub mod transport;

pub use client::{Client, Observation, RequestBuilder};
pub use cobalt_proto as proto;
pub use cobalt_proto::endpoint::EndpointConfig;
pub use cobalt_proto::message::{content_format, Code};
pub use cobalt_proto::uri::Scheme;
pub use error::{
    BlockError, ConnectionError, ConnectionErrorKind, CredentialsError, Error, HandshakeFailure,
    Result, Unsupported,
};
pub use server::{Request, Response, Server, ServerHandle};

/// The README's examples, compiled as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

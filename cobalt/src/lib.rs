//! Cobalt: a CoAP (RFC 7252) server and client for IoT cloud services.
//!
//! The protocol itself lives in the sans-IO crate [`cobalt_proto`]; this crate adds the
//! connectors (UDP, and TCP per RFC 8323), the shard threads that drive endpoints, the [`Server`] with its
//! resource tree, and the [`Client`] (async and [blocking](client::blocking)).
//! A server's settings can come from one TOML file with environment and command-line
//! overrides ([`config`]); its counters are exported in the Prometheus format ([`metrics`]).
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
pub use error::{Error, Result};
pub use server::{Request, Response, Server, ServerHandle};

/// The README's examples, compiled as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

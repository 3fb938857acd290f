//! Cobalt's sans-IO CoAP protocol core.
//!
//! This crate holds no sockets, threads or clocks: the [`message`] codec, the
//! [`endpoint`] state machine (fed datagrams, timeouts and application commands with an
//! explicit `now`), its pluggable [`congestion`] control, the RFC 8323 [`tcp_connection`]
//! state machine, the [`session`] surface applications use over either, and the RFC
//! 6690 [`link_format`]. With the feature `sim`, a deterministic virtual-time simulator
//! that runs applications on datagram and stream nodes over lossy networks,
//! constrained links and chunking byte streams (`sim`). The
//! [`settings`] types' parameters are checked in one place each; with the feature
//! `serde` they read and write configuration files.
#![warn(missing_docs)]

pub mod address;
pub mod blockwise;
pub mod budget;
pub mod congestion;
pub mod endpoint;
pub mod link_format;
pub mod message;
pub mod observe;
pub mod session;
pub mod settings;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
pub mod stateless;
pub mod tables;
pub mod tcp_connection;
pub mod uri;

//! The drivers: the shard loop that drives a sans-IO endpoint over a datagram socket
//! and the threads it runs on, and the listeners whose tasks drive RFC 8323 connections
//! over streams. Both are generic over what they serve (`service`).

pub(crate) mod command;
pub(crate) mod driver;
pub(crate) mod exchanges;
pub(crate) mod io;
pub(crate) mod listener;
pub(crate) mod notifications;
pub(crate) mod service;
pub(crate) mod wake;

pub use io::{StageCounters, Stages};

pub use crate::trace::{StreamTracer, Tracer};

//! The shard loop that drives a sans-IO endpoint over a socket, and the threads it runs on.

pub(crate) mod command;
pub(crate) mod driver;
pub(crate) mod io;
pub(crate) mod service;
mod trace;

pub use io::{StageCounters, Stages};

pub use trace::{StreamTracer, Tracer};

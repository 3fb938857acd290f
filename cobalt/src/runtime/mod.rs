//! The shard loop that drives a sans-IO endpoint over a socket, and the threads it runs on.

pub(crate) mod driver;
pub(crate) mod io;

pub use io::{StageCounters, Stages};

pub use driver::{StreamTracer, Tracer};

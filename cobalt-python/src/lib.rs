//! The native core of the `cobalt` Python package (`cobalt._cobalt`): Cobalt's client
//! and server driven by a tokio runtime of their own, and an inbox through
//! which they hand their results to an asyncio event loop.
//!
//! Nothing here runs Python on Cobalt's threads. A finished request, a notification or
//! a request for a Python handler is pushed into the event loop's inbox, which wakes
//! the loop through a descriptor the loop watches (`loop.add_reader`); the loop takes the
//! events, with the GIL, when it gets to them. The protocol threads never wait for the
//! GIL, so a busy Python handler does not stall them. The pure-Python package
//! (`python/cobalt/`) is the public API; this module is its engine room.

mod client;
mod convert;
mod doorbell;
mod inbox;
mod replies;
mod runtime;
mod server;

use pyo3::prelude::*;

/// `cobalt._cobalt`: the classes and functions the `cobalt` package is built on.
#[pymodule]
fn _cobalt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<inbox::Inbox>()?;
    m.add_class::<client::Client>()?;
    m.add_class::<client::Prepared>()?;
    m.add_class::<client::Call>()?;
    m.add_class::<client::Observation>()?;
    m.add_class::<server::Server>()?;
    m.add_class::<server::Request>()?;
    m.add_class::<server::Observable>()?;
    m.add_function(wrap_pyfunction!(server::start_server, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::is_running, m)?)?;
    Ok(())
}

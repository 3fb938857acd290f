//! The tokio runtime that runs Cobalt's clients and the servers' connection listeners:
//! made on first use, shut down (its threads joined) by `cobalt.shutdown()` or at the
//! interpreter's exit, and made again by the next use after that.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::sync::Mutex;
use std::time::Duration;
use tokio::runtime::{Handle, Runtime};

/// Worker threads of the runtime. The protocol's hot work runs on a server's shard
/// threads (its own); the runtime carries clients and stream connections.
const WORKER_THREADS: usize = 2;

/// How long `shutdown` waits for tasks to stop before it leaves them.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

static RUNTIME: Mutex<Option<Runtime>> = Mutex::new(None);

/// The runtime's handle, starting the runtime if it is not running.
pub fn handle() -> PyResult<Handle> {
    let mut slot = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(rt) = slot.as_ref() {
        return Ok(rt.handle().clone());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .thread_name("cobalt-runtime")
        .enable_all()
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start Cobalt's runtime: {e}")))?;
    let handle = rt.handle().clone();
    *slot = Some(rt);
    Ok(handle)
}

/// Stops the runtime and joins its threads (waiting up to 5 s for its tasks). Clients
/// made before stop working; servers must have been shut down first.
#[pyfunction]
pub fn shutdown(py: Python<'_>) {
    let taken = RUNTIME.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(rt) = taken {
        py.detach(|| rt.shutdown_timeout(SHUTDOWN_WAIT));
    }
}

/// Whether the runtime is running (it starts on first use).
#[pyfunction]
pub fn is_running() -> bool {
    RUNTIME.lock().unwrap_or_else(|e| e.into_inner()).is_some()
}

//! The inbox of an asyncio event loop: what Cobalt's threads hand to Python (finished
//! requests, notifications, requests for Python handlers), queued without the GIL and
//! announced through a descriptor the loop watches (a [`Doorbell`]).
//!
//! Requests for Python handlers are queued quietly and announced once their shard has
//! queued its whole batch ([`Shared::queue`], [`Shared::announce`]): the loop then
//! takes them together, and its handlers' answers go back together too (the inbox
//! holds them while the loop handles the batch, see [`crate::replies`]).

use crate::doorbell::Doorbell;
use crate::replies::{Held, Reply};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Something for the event loop, made into its Python object on the loop's thread,
/// with the GIL: a `(kind, id, value, error)` tuple or a request (see
/// [`Inbox::drain`]).
pub type Event = Box<dyn for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, PyAny>> + Send>;

/// The tuple of an event: `value` and `error` are `None` where absent.
pub fn event_tuple<'py>(
    py: Python<'py>,
    kind: &'static str,
    id: u64,
    value: Option<Bound<'py, PyAny>>,
    error: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let none = || py.None().into_bound(py);
    let tuple = PyTuple::new(
        py,
        [
            kind.into_pyobject(py)?.into_any(),
            id.into_pyobject(py)?.into_any(),
            value.unwrap_or_else(none),
            error.unwrap_or_else(none),
        ],
    )?;
    Ok(tuple.into_any())
}

/// The queue and its doorbell, shared with Cobalt's threads.
pub struct Shared {
    events: Mutex<Vec<Event>>,
    /// The doorbell has been rung and not yet cleared by `drain`.
    armed: AtomicBool,
    /// The loop has gone: events are dropped as they come (a request's handler then
    /// answers 5.00, a call's outcome is lost).
    closed: AtomicBool,
    /// The answers of the loop's handlers while it handles a batch.
    held: Held,
    doorbell: Doorbell,
}

impl Shared {
    /// Queues `event` and wakes the loop unless a wake-up is already pending.
    pub fn push(&self, event: Event) {
        if self.queue(event) {
            self.wake();
        }
    }

    /// Queues `event` without waking the loop: [`Shared::announce`] must follow
    /// (when the rest of the batch it belongs to is queued too). False if the loop
    /// has gone and the event was dropped.
    pub fn queue(&self, event: Event) -> bool {
        if self.closed.load(Ordering::Acquire) {
            return false;
        }
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event);
        true
    }

    /// Wakes the loop if events wait that it has not been woken for.
    pub fn announce(&self) {
        if self.armed.load(Ordering::Acquire) {
            return;
        }
        let waiting = !self
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty();
        if waiting {
            self.wake();
        }
    }

    /// Sends an answer of a handler of this loop: held while the loop handles a
    /// batch, at once otherwise.
    pub fn answer(&self, reply: Reply) {
        self.held.send(reply);
    }

    fn wake(&self) {
        if !self.armed.swap(true, Ordering::AcqRel) {
            self.doorbell.ring();
        }
    }
}

/// An event loop's inbox: `loop.add_reader(inbox.fileno(), ...)`, then `drain()` when
/// it is readable.
#[pyclass(frozen, module = "cobalt._cobalt")]
pub struct Inbox {
    pub(crate) shared: Arc<Shared>,
}

impl Drop for Inbox {
    /// The loop's side is gone: whatever still pushes (a server's handlers, calls in
    /// flight) has its events dropped instead of queued for no one.
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.held.release();
        // Their responders go with them: those requests are answered 5.00.
        self.shared
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

#[pymethods]
impl Inbox {
    #[new]
    fn new() -> PyResult<Inbox> {
        Ok(Inbox {
            shared: Arc::new(Shared {
                events: Mutex::new(Vec::new()),
                armed: AtomicBool::new(false),
                closed: AtomicBool::new(false),
                held: Held::default(),
                doorbell: Doorbell::new()?,
            }),
        })
    }

    /// Drops the waiting events and every later one: the loop is closing. Requests
    /// for its handlers are answered 5.00 from then on.
    fn close(&self, py: Python<'_>) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.held.release();
        let events =
            std::mem::take(&mut *self.shared.events.lock().unwrap_or_else(|e| e.into_inner()));
        py.detach(|| drop(events));
    }

    /// The descriptor that becomes readable when events are waiting.
    fn fileno(&self) -> i32 {
        self.shared.doorbell.fd()
    }

    /// Takes the waiting events, oldest first: requests for the loop's handlers (a
    /// `Request`) and `(kind, id, value, error)` tuples: `("reply", token, response,
    /// error)`, `("notification", token, response | None, error)`, `("observing",
    /// token, Observation | None, error)` and `("done", token, None, None)`. A
    /// response is `(code, payload, options)`, an error `(kind, message)`.
    ///
    /// Answers given from then on are held until `release` (call it when the batch
    /// is handled, also when that failed), and then handed over together.
    fn drain<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        self.shared.doorbell.clear();
        self.shared.armed.store(false, Ordering::Release);
        let events =
            std::mem::take(&mut *self.shared.events.lock().unwrap_or_else(|e| e.into_inner()));
        let events = events.into_iter().map(|e| e(py)).collect::<PyResult<_>>()?;
        self.shared.held.hold();
        Ok(events)
    }

    /// Hands over the answers held since `drain`, with one wake-up per thread that
    /// waits for some, and sends later ones at once.
    fn release(&self) {
        self.shared.held.release();
    }
}

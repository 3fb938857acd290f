//! The inbox of an asyncio event loop: what Cobalt's threads hand to Python (finished
//! requests, notifications, requests for Python handlers), queued without the GIL and
//! announced by one byte on a socket the loop watches.

use crate::client::Observation;
use crate::convert::{error_tuple, response_tuple};
use crate::server::{Request, Responder};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Something for the event loop.
pub enum Event {
    /// A request's answer (or why there is none), for the call `token`.
    Reply {
        token: u64,
        result: cobalt::Result<cobalt::Response>,
    },
    /// An observation's next notification; `None` when it has ended.
    Notification {
        token: u64,
        result: Option<cobalt::Result<cobalt::Response>>,
    },
    /// An observation registered (or why not), for the call `token`.
    Observing {
        token: u64,
        result: cobalt::Result<cobalt::Observation>,
    },
    /// A server's shutdown (for `token`) is complete.
    Done { token: u64 },
    /// A request for the Python handler `handler` of a server; its answer goes back
    /// through `responder`.
    Request {
        handler: usize,
        request: cobalt::Request,
        responder: oneshot::Sender<cobalt::Response>,
    },
}

/// The queue and its wake-up socket, shared with Cobalt's threads.
pub struct Shared {
    events: Mutex<Vec<Event>>,
    /// A wake-up byte has been written and not yet consumed by `drain`.
    armed: AtomicBool,
    reader: UnixStream,
    writer: UnixStream,
}

impl Shared {
    /// Queues `event` and wakes the loop unless a wake-up is already pending.
    pub fn push(&self, event: Event) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event);
        if !self.armed.swap(true, Ordering::AcqRel) {
            // A full socket buffer means unread wake-ups: the loop wakes anyway.
            let _ = (&self.writer).write(&[1]);
        }
    }
}

/// An event loop's inbox: `loop.add_reader(inbox.fileno(), ...)`, then `drain()` when
/// it is readable.
#[pyclass(frozen, module = "cobalt._cobalt")]
pub struct Inbox {
    pub(crate) shared: Arc<Shared>,
}

#[pymethods]
impl Inbox {
    #[new]
    fn new() -> PyResult<Inbox> {
        let (reader, writer) = UnixStream::pair()?;
        reader.set_nonblocking(true)?;
        writer.set_nonblocking(true)?;
        Ok(Inbox {
            shared: Arc::new(Shared {
                events: Mutex::new(Vec::new()),
                armed: AtomicBool::new(false),
                reader,
                writer,
            }),
        })
    }

    /// The descriptor that becomes readable when events are waiting.
    fn fileno(&self) -> i32 {
        self.shared.reader.as_raw_fd()
    }

    /// Takes the waiting events, oldest first, as `(kind, id, value, error)` tuples:
    /// `("reply", token, response, error)`, `("notification", token, response | None,
    /// error)`, `("observing", token, Observation | None, error)` and `("request",
    /// handler, Request, Responder)`. A response is `(code, payload, options)`, an
    /// error `(kind, message)`.
    fn drain<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let mut sink = [0u8; 256];
        loop {
            match (&self.shared.reader).read(&mut sink) {
                Ok(n) if n == sink.len() => continue,
                Ok(_) => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        self.shared.armed.store(false, Ordering::Release);
        let events =
            std::mem::take(&mut *self.shared.events.lock().unwrap_or_else(|e| e.into_inner()));
        events.into_iter().map(|e| event_tuple(py, e)).collect()
    }
}

fn event_tuple(py: Python<'_>, event: Event) -> PyResult<Bound<'_, PyTuple>> {
    let none = || py.None().into_bound(py);
    let (kind, id, value, error) = match event {
        Event::Reply { token, result } => match result {
            Ok(r) => ("reply", token, response_tuple(py, &r)?, none()),
            Err(e) => ("reply", token, none(), error_tuple(py, &e)?),
        },
        Event::Notification { token, result } => match result {
            Some(Ok(r)) => ("notification", token, response_tuple(py, &r)?, none()),
            Some(Err(e)) => ("notification", token, none(), error_tuple(py, &e)?),
            None => ("notification", token, none(), none()),
        },
        Event::Observing { token, result } => match result {
            Ok(o) => {
                let o = Bound::new(py, Observation::new(o))?.into_any();
                ("observing", token, o, none())
            }
            Err(e) => ("observing", token, none(), error_tuple(py, &e)?),
        },
        Event::Done { token } => ("done", token, none(), none()),
        Event::Request {
            handler,
            request,
            responder,
        } => {
            let request = Bound::new(py, Request::new(request))?.into_any();
            let responder = Bound::new(py, Responder::new(responder))?.into_any();
            ("request", handler as u64, request, responder)
        }
    };
    PyTuple::new(
        py,
        [
            kind.into_pyobject(py)?.into_any(),
            id.into_pyobject(py)?.into_any(),
            value,
            error,
        ],
    )
}

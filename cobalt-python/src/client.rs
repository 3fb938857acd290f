//! Cobalt's client for Python: a request is prepared (method, URI, payload, options),
//! then sent or observed, either handing its outcome to an event loop's inbox or
//! blocking the calling thread (with the GIL released) until it is there.

use crate::convert::{error_tuple, response_tuple};
use crate::inbox::{event_tuple, Inbox};
use crate::runtime;
use cobalt::transport::credentials::X509Credentials;
use cobalt::{Code, RequestBuilder};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::AbortHandle;

/// `(value | None, error | None)`, as the blocking calls return them: a response or
/// an observation, else the error.
type Outcome<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>);

/// A CoAP client (every scheme), with the credentials it was made with.
#[pyclass(frozen, module = "cobalt._cobalt")]
pub struct Client {
    inner: cobalt::Client,
}

#[pymethods]
impl Client {
    /// A client; `psk_identity` and `psk_key` for `coaps://` with a pre-shared key, or
    /// `ca_pem` (and optionally `cert_pem`/`key_pem`, `server_name`) for certificates.
    #[new]
    #[pyo3(signature = (*, psk_identity=None, psk_key=None, cert_pem=None, key_pem=None, ca_pem=None, server_name=None))]
    fn new(
        psk_identity: Option<Vec<u8>>,
        psk_key: Option<Vec<u8>>,
        cert_pem: Option<Vec<u8>>,
        key_pem: Option<Vec<u8>>,
        ca_pem: Option<Vec<u8>>,
        server_name: Option<String>,
    ) -> PyResult<Client> {
        let base = cobalt::Client::new();
        let x509 = cert_pem.is_some() || key_pem.is_some() || ca_pem.is_some();
        let inner = match (psk_identity, psk_key) {
            (Some(_), Some(_)) if x509 => {
                return Err(PyValueError::new_err(
                    "give a client either a pre-shared key or certificates, not both",
                ))
            }
            (Some(identity), Some(key)) => base.with_psk(identity, key),
            (None, None) if x509 => {
                if cert_pem.is_some() != key_pem.is_some() {
                    return Err(PyValueError::new_err(
                        "a client certificate needs its key: give both cert and key, or neither",
                    ));
                }
                base.with_x509(X509Credentials {
                    cert_chain_pem: cert_pem.unwrap_or_default(),
                    key_pem: key_pem.unwrap_or_default(),
                    ca_pem,
                    server_name,
                })
            }
            (None, None) => base,
            _ => {
                return Err(PyValueError::new_err(
                    "a pre-shared key needs both psk_identity and psk_key",
                ))
            }
        };
        Ok(Client { inner })
    }

    /// A request ready to be sent or observed: `method` is the request code (1 GET,
    /// 2 POST, 3 PUT, 4 DELETE, 5 FETCH, ...), `timeout` in seconds, `options` extra
    /// `(number, value)` pairs.
    #[pyo3(signature = (method, uri, payload=None, content_format=None, accept=None, confirmable=true, timeout=None, block_size=None, options=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn prepare(
        &self,
        method: u8,
        uri: &str,
        payload: Option<Vec<u8>>,
        content_format: Option<u16>,
        accept: Option<u16>,
        confirmable: bool,
        timeout: Option<f64>,
        block_size: Option<usize>,
        options: Vec<(u16, Vec<u8>)>,
    ) -> PyResult<Prepared> {
        let code = Code(method);
        if !code.is_request() {
            return Err(PyValueError::new_err(format!(
                "{method} is not a request method code (1 GET, 2 POST, 3 PUT, 4 DELETE, 5 FETCH, 6 PATCH, 7 iPATCH)"
            )));
        }
        let mut b = self.inner.request(code, uri);
        if let Some(p) = payload {
            b = b.payload(p);
        }
        if let Some(cf) = content_format {
            b = b.content_format(cf);
        }
        if let Some(cf) = accept {
            b = b.accept(cf);
        }
        if !confirmable {
            b = b.non_confirmable();
        }
        if let Some(t) = timeout {
            let t = Duration::try_from_secs_f64(t).map_err(|_| {
                PyValueError::new_err(format!("timeout {t} is not a number of seconds >= 0"))
            })?;
            b = b.timeout(t);
        }
        if let Some(size) = block_size {
            b = b
                .block_size(size)
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
        }
        for (number, value) in options {
            b = b.option(number, value);
        }
        Ok(Prepared {
            builder: Mutex::new(Some(b)),
        })
    }
}

/// A request prepared by `Client.prepare`, to be used once.
#[pyclass(frozen, module = "cobalt._cobalt")]
pub struct Prepared {
    builder: Mutex<Option<RequestBuilder>>,
}

impl Prepared {
    fn take(&self) -> PyResult<RequestBuilder> {
        self.builder
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("this request has already been sent"))
    }
}

#[pymethods]
impl Prepared {
    /// Sends the request; its answer arrives in `inbox` as `("reply", token, ...)`.
    fn send(&self, inbox: &Inbox, token: u64) -> PyResult<Call> {
        let builder = self.take()?;
        let shared = inbox.shared.clone();
        spawn(async move {
            let result = builder.send().await;
            shared.push(Box::new(move |py| {
                answer(py, "reply", token, result.map(Some))
            }));
        })
    }

    /// Registers an observation; it arrives in `inbox` as `("observing", token, ...)`.
    fn observe(&self, inbox: &Inbox, token: u64) -> PyResult<Call> {
        let builder = self.take()?;
        let shared = inbox.shared.clone();
        spawn(async move {
            let result = builder.observe().await;
            shared.push(Box::new(move |py| match result {
                Ok(o) => {
                    let o = Bound::new(py, Observation::new(o))?.into_any();
                    event_tuple(py, "observing", token, Some(o), None)
                }
                Err(e) => event_tuple(py, "observing", token, None, Some(error_tuple(py, &e)?)),
            }));
        })
    }

    /// Sends the request and waits for its answer, the GIL released.
    fn send_blocking<'py>(&self, py: Python<'py>) -> PyResult<Outcome<'py>> {
        let builder = self.take()?;
        let result = block_on(py, builder.send())?;
        outcome(py, result.map(Some))
    }

    /// Registers an observation and waits until it is registered, the GIL released.
    fn observe_blocking<'py>(&self, py: Python<'py>) -> PyResult<Outcome<'py>> {
        let builder = self.take()?;
        let none = py.None().into_bound(py);
        Ok(match block_on(py, builder.observe())? {
            Ok(o) => (Bound::new(py, Observation::new(o))?.into_any(), none),
            Err(e) => (none, error_tuple(py, &e)?),
        })
    }
}

/// A request or observation step in progress; `cancel()` abandons it.
#[pyclass(frozen, module = "cobalt._cobalt")]
pub struct Call {
    task: AbortHandle,
}

#[pymethods]
impl Call {
    /// Abandons the call: no answer will arrive in the inbox.
    fn cancel(&self) {
        self.task.abort();
    }
}

/// An observation: its notifications one at a time, then its end.
#[pyclass(frozen, module = "cobalt._cobalt")]
pub struct Observation {
    /// `None` once cancelled or closed.
    inner: Arc<tokio::sync::Mutex<Option<cobalt::Observation>>>,
}

impl Observation {
    pub fn new(o: cobalt::Observation) -> Observation {
        Observation {
            inner: Arc::new(tokio::sync::Mutex::new(Some(o))),
        }
    }
}

/// The observation's next notification, `None` once it has ended.
async fn next_of(
    inner: &tokio::sync::Mutex<Option<cobalt::Observation>>,
) -> Option<cobalt::Result<cobalt::Response>> {
    let mut slot = inner.lock().await;
    let next = slot.as_mut()?.next().await;
    if next.is_none() {
        *slot = None;
    }
    next
}

/// Ends the relation with the server (a GET with Observe=1); `None` if it had ended.
async fn cancel_of(
    inner: &tokio::sync::Mutex<Option<cobalt::Observation>>,
) -> Option<cobalt::Result<cobalt::Response>> {
    let o = inner.lock().await.take()?;
    Some(o.cancel().await)
}

#[pymethods]
impl Observation {
    /// Asks for the next notification; it arrives in `inbox` as `("notification",
    /// token, response | None, error | None)` (both `None`: the observation ended).
    fn next(&self, inbox: &Inbox, token: u64) -> PyResult<Call> {
        let (inner, shared) = (self.inner.clone(), inbox.shared.clone());
        spawn(async move {
            let result = next_of(&inner).await;
            shared.push(Box::new(move |py| {
                answer(py, "notification", token, result.transpose())
            }));
        })
    }

    /// Waits for the next notification, the GIL released: `(None, None)` at the end.
    fn next_blocking<'py>(&self, py: Python<'py>) -> PyResult<Outcome<'py>> {
        let inner = self.inner.clone();
        let result = block_on(py, async move { next_of(&inner).await })?;
        outcome(py, result.transpose())
    }

    /// Ends the relation (a GET with Observe=1); the server's answer arrives in `inbox`
    /// as `("notification", token, ...)`; `(None, None)` if it had already ended.
    fn cancel(&self, inbox: &Inbox, token: u64) -> PyResult<Call> {
        let (inner, shared) = (self.inner.clone(), inbox.shared.clone());
        spawn(async move {
            let result = cancel_of(&inner).await;
            shared.push(Box::new(move |py| {
                answer(py, "notification", token, result.transpose())
            }));
        })
    }

    /// Ends the relation and waits for the server's answer, the GIL released.
    fn cancel_blocking<'py>(&self, py: Python<'py>) -> PyResult<Outcome<'py>> {
        let inner = self.inner.clone();
        let result = block_on(py, async move { cancel_of(&inner).await })?;
        outcome(py, result.transpose())
    }

    /// Forgets the observation without asking the server: over UDP the next
    /// notification is answered with RST, over TCP a deregistration goes out.
    fn close(&self) {
        if let Ok(mut slot) = self.inner.try_lock() {
            slot.take();
        } else {
            // A step is in progress: drop it when that step lets go.
            let inner = self.inner.clone();
            let _ = spawn(async move {
                inner.lock().await.take();
            });
        }
    }
}

/// Spawns `task` on Cobalt's runtime.
fn spawn(task: impl Future<Output = ()> + Send + 'static) -> PyResult<Call> {
    let handle = runtime::handle()?;
    Ok(Call {
        task: handle.spawn(task).abort_handle(),
    })
}

/// Runs `f` on Cobalt's runtime until it is done, the GIL released, checking for
/// signals (Ctrl-C) every 100 ms.
fn block_on<T: Send + 'static>(
    py: Python<'_>,
    f: impl Future<Output = T> + Send + 'static,
) -> PyResult<T> {
    let handle = runtime::handle()?;
    let mut task = handle.spawn(f);
    loop {
        let step = py.detach(|| {
            handle.block_on(async {
                tokio::time::timeout(Duration::from_millis(100), &mut task).await
            })
        });
        match step {
            Ok(Ok(done)) => return Ok(done),
            Ok(Err(e)) => {
                return Err(PyRuntimeError::new_err(format!(
                    "the request's task failed: {e}"
                )))
            }
            Err(_) => {
                if let Err(e) = py.check_signals() {
                    task.abort();
                    return Err(e);
                }
            }
        }
    }
}

fn outcome<'py>(
    py: Python<'py>,
    result: cobalt::Result<Option<cobalt::Response>>,
) -> PyResult<Outcome<'py>> {
    let none = py.None().into_bound(py);
    Ok(match result {
        Ok(Some(r)) => (response_tuple(py, &r)?, none),
        Ok(None) => (none.clone(), none),
        Err(e) => (none, error_tuple(py, &e)?),
    })
}

/// The event of a call's outcome: a response, nothing (an observation's end) or an error.
fn answer<'py>(
    py: Python<'py>,
    kind: &'static str,
    token: u64,
    result: cobalt::Result<Option<cobalt::Response>>,
) -> PyResult<Bound<'py, PyAny>> {
    match result {
        Ok(Some(r)) => event_tuple(py, kind, token, Some(response_tuple(py, &r)?), None),
        Ok(None) => event_tuple(py, kind, token, None, None),
        Err(e) => event_tuple(py, kind, token, None, Some(error_tuple(py, &e)?)),
    }
}

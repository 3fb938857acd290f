//! Cobalt's server with Python handlers: the protocol runs on the server's shard
//! threads; a request for a Python handler is pushed into the event loop's inbox and
//! its shard awaits the answer (`Request.respond`) without the GIL.

use crate::inbox::{event_tuple, Inbox, Shared};
use crate::replies::{Pump, Reply, Responder};
use crate::runtime;
use cobalt::config::Config;
use cobalt::server::MethodRouter;
use cobalt::transport::credentials::{PskStore, X509Credentials};
use cobalt::{Code, Scheme, ServerHandle};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyDict};
use std::borrow::Cow;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::oneshot;

/// A request as a Python handler sees it, and where its answer goes (`respond`, once).
#[pyclass(frozen, module = "cobalt._cobalt")]
pub struct Request {
    inner: cobalt::Request,
    /// The number of the Python handler it is for.
    handler: u64,
    /// Taken by the first `respond`.
    responder: Mutex<Option<Responder>>,
    /// The pump of the thread whose handler future waits for the answer.
    pump: Option<Arc<Pump>>,
    /// The inbox it came through, which holds answers while its loop handles a batch.
    inbox: Arc<Shared>,
}

#[pymethods]
impl Request {
    /// The number of the handler it is for (as `start_server`'s routes give it).
    #[getter]
    fn handler(&self) -> u64 {
        self.handler
    }

    /// The method code (1 GET, 2 POST, 3 PUT, 4 DELETE, 5 FETCH, ...).
    #[getter]
    fn method(&self) -> u8 {
        self.inner.method().0
    }

    /// The path, `/` and the Uri-Path segments.
    #[getter]
    fn path(&self) -> String {
        self.inner.path()
    }

    /// The Uri-Query items, in order.
    #[getter]
    fn query(&self) -> Vec<String> {
        self.inner.query().map(str::to_string).collect()
    }

    /// The body (reassembled when it came in Block1 blocks).
    #[getter]
    fn payload<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.inner.payload())
    }

    /// The Content-Format option, if any.
    #[getter]
    fn content_format(&self) -> Option<u16> {
        self.inner.content_format()
    }

    /// The Accept option, if any.
    #[getter]
    fn accept(&self) -> Option<u16> {
        self.inner.accept()
    }

    /// Who sent it: `(host, port)`.
    #[getter]
    fn peer(&self) -> (String, u16) {
        let p = self.inner.peer();
        (p.ip().to_string(), p.port())
    }

    /// The transport it came over: `coap`, `coaps`, `coap+tcp`, ...
    #[getter]
    fn scheme(&self) -> &'static str {
        self.inner.identity().scheme().as_str()
    }

    /// The PSK identity the peer authenticated with (DTLS, TLS), if any.
    #[getter]
    fn psk_identity<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.inner
            .identity()
            .psk_identity()
            .map(|i| PyBytes::new(py, i))
    }

    /// The subject of the peer's verified certificate (DTLS, TLS), if any.
    #[getter]
    fn certificate_subject(&self) -> Option<String> {
        self.inner
            .identity()
            .certificate_subject()
            .map(str::to_string)
    }

    /// The route's path parameters (`{name}` in the route) by name.
    #[getter]
    fn params<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.inner.params() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Every option, in order, as `(number, value)`.
    #[getter]
    fn options<'py>(&self, py: Python<'py>) -> Vec<(u16, Bound<'py, PyBytes>)> {
        self.inner
            .options()
            .iter()
            .map(|o| (o.number, PyBytes::new(py, o.value)))
            .collect()
    }

    /// Answers the request with `code` (e.g. 69 for 2.05), `payload` and `options`
    /// (`(number, value)` pairs). False if it was answered before, or the server no
    /// longer waits for it (shut down, or the peer's exchange ended). Answers given
    /// while the loop handles a batch from its inbox go when the batch is done.
    #[pyo3(signature = (code, payload, options=Vec::new()))]
    fn respond(
        &self,
        code: u8,
        payload: Cow<'_, [u8]>,
        options: Vec<(u16, PyBackedBytes)>,
    ) -> PyResult<bool> {
        let code = Code(code);
        if !code.is_response() {
            return Err(PyValueError::new_err(format!(
                "{code} is not a response code (2.xx, 4.xx or 5.xx)"
            )));
        }
        let Some(responder) = self
            .responder
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return Ok(false);
        };
        if responder.is_closed() {
            return Ok(false);
        }
        let mut response = cobalt::Response::new(code).with_payload(payload.into_owned());
        for (number, value) in options {
            response = response.with_option(number, &value);
        }
        self.inbox.answer(Reply {
            responder,
            response,
            pump: self.pump.clone(),
        });
        Ok(true)
    }
}

/// An observable resource's handle: `changed()` notifies its observers.
#[pyclass(frozen, module = "cobalt._cobalt")]
pub struct Observable {
    inner: cobalt::server::Observable,
}

#[pymethods]
impl Observable {
    #[new]
    fn new() -> Observable {
        Observable {
            inner: cobalt::server::Observable::new(),
        }
    }

    /// The resource changed: every observer gets the GET handler's new answer.
    fn changed(&self) {
        self.inner.changed();
    }

    /// As `changed`, with confirmable notifications.
    fn changed_confirmable(&self) {
        self.inner.changed_confirmable();
    }

    /// The resource is gone: every observer gets 4.04 and is removed.
    fn deleted(&self) {
        self.inner.deleted();
    }

    /// Observers registered now.
    fn observer_count(&self) -> usize {
        self.inner.observer_count()
    }
}

/// A running server.
#[pyclass(frozen, module = "cobalt._cobalt")]
pub struct Server {
    handle: Mutex<Option<ServerHandle>>,
    addresses: Vec<(String, String)>,
}

#[pymethods]
impl Server {
    /// The listeners: `(scheme, "host:port")`, the UDP one first.
    fn addresses(&self) -> Vec<(String, String)> {
        self.addresses.clone()
    }

    /// Stops the server: handlers in progress have `grace` seconds to answer, then
    /// every shard thread is joined. `("done", token, None, None)` arrives in `inbox`.
    fn shutdown(&self, inbox: &Inbox, token: u64, grace: f64) -> PyResult<()> {
        let handle = self.take();
        let shared = inbox.shared.clone();
        let grace = seconds(grace)?;
        runtime::handle()?.spawn(async move {
            if let Some(h) = handle {
                h.shutdown(grace).await;
            }
            shared.push(Box::new(move |py| {
                event_tuple(py, "done", token, None, None)
            }));
        });
        Ok(())
    }

    /// Stops the server as `shutdown` does and waits, the GIL released (for a server
    /// whose handlers do not need the calling thread, or at exit).
    fn shutdown_blocking(&self, py: Python<'_>, grace: f64) -> PyResult<()> {
        let grace = seconds(grace)?;
        if let Some(h) = self.take() {
            let rt = runtime::handle()?;
            py.detach(|| rt.block_on(h.shutdown(grace)));
        }
        Ok(())
    }
}

impl Server {
    fn take(&self) -> Option<ServerHandle> {
        self.handle.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

fn seconds(s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| PyValueError::new_err(format!("{s} is not a number of seconds >= 0")))
}

/// One resource: its path, its methods' handlers (method code, handler number), its
/// link attributes (`(name, value)`, `None` for a flag) and its observable handle.
type RouteSpec<'py> = (
    String,
    Vec<(u8, usize)>,
    Vec<(String, Option<String>)>,
    Option<Bound<'py, Observable>>,
);

/// Starts a server for `routes` whose requests go to `inbox` as `("request", handler,
/// Request, None)`. Settings come from `config` (the `cobalt serve` file; none:
/// the defaults), the environment (`COBALT_<SECTION>_<KEY>`) and then `settings`
/// (`("server.port", "5683")`, ...); UDP listens on the configured address, and
/// `listeners` adds `(scheme, port)` on the same address. The secure schemes need
/// `psk_file` or `psk` pairs, or `cert` and `key` (PEM files, `ca` to verify clients).
#[pyfunction]
#[pyo3(signature = (routes, inbox, config=None, settings=Vec::new(), listeners=Vec::new(), psk_file=None, psk=Vec::new(), cert=None, key=None, ca=None))]
#[allow(clippy::too_many_arguments)]
pub fn start_server(
    py: Python<'_>,
    routes: Vec<RouteSpec<'_>>,
    inbox: &Inbox,
    config: Option<PathBuf>,
    settings: Vec<(String, String)>,
    listeners: Vec<(String, u16)>,
    psk_file: Option<PathBuf>,
    psk: Vec<(Vec<u8>, Vec<u8>)>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    ca: Option<PathBuf>,
) -> PyResult<Server> {
    let config = load_config(config, &settings)?;
    let mut server = cobalt::Server::new().with_config(&config.server_settings());
    for (path, methods, attrs, observable) in routes {
        let mut resource = MethodRouter::default();
        for (method, handler) in methods {
            resource = resource.on(Code(method), python_handler(&inbox.shared, handler));
        }
        for (name, value) in attrs {
            resource = match value {
                Some(v) => resource.attr(&name, &v),
                None => resource.flag(&name),
            };
        }
        if let Some(o) = observable {
            resource = resource.observable(&o.get().inner);
        }
        server = server.route(&path, resource);
    }
    let mut keys = match &psk_file {
        Some(file) => PskStore::load(file).map_err(|e| PyValueError::new_err(e.to_string()))?,
        None => PskStore::new(),
    };
    for (identity, key) in psk {
        keys.insert(identity, key);
    }
    if !keys.is_empty() {
        server = server.psk(keys);
    }
    match (&cert, &key) {
        (Some(cert), Some(key)) => {
            let read = |p: &PathBuf| {
                std::fs::read(p)
                    .map_err(|e| PyOSError::new_err(format!("cannot read {}: {e}", p.display())))
            };
            server = server.x509(X509Credentials {
                cert_chain_pem: read(cert)?,
                key_pem: read(key)?,
                ca_pem: ca.as_ref().map(read).transpose()?,
                server_name: None,
            });
        }
        (None, None) => {}
        _ => {
            return Err(PyValueError::new_err(
                "a server certificate needs its key: give both cert and key",
            ))
        }
    }
    let bind = config.server.bind;
    server = server.listen(Scheme::Coap, config.server.socket_addr());
    for (scheme, port) in listeners {
        let scheme: Scheme = scheme.parse().map_err(|_| {
            PyValueError::new_err(format!(
                "unknown scheme {scheme:?}: coap, coaps, coap+tcp, coaps+tcp, coap+ws or coaps+ws"
            ))
        })?;
        server = server.listen(scheme, (bind, port));
    }
    let rt = runtime::handle()?;
    let handle = py
        .detach(|| rt.block_on(server.start()))
        .map_err(|e| PyOSError::new_err(format!("cannot start the server: {e}")))?;
    let addresses = handle
        .listeners()
        .map(|(s, a)| (s.as_str().to_string(), a.to_string()))
        .collect();
    Ok(Server {
        handle: Mutex::new(Some(handle)),
        addresses,
    })
}

/// The configuration: defaults < file < environment < `settings`.
fn load_config(file: Option<PathBuf>, settings: &[(String, String)]) -> PyResult<Config> {
    let bad = |e: cobalt::config::ConfigError| PyValueError::new_err(e.to_string());
    let mut loader = Config::loader();
    if let Some(path) = &file {
        loader = loader.file(path).map_err(bad)?;
    }
    loader = loader.env_from_process().map_err(bad)?;
    for (key, value) in settings {
        loader = loader.set(key, value, "Site.serve").map_err(bad)?;
    }
    loader.build().map_err(bad)
}

/// The Rust handler of a Python one: queues the request in the loop's inbox and waits
/// for the answer (5.00 if the Python side drops it unanswered).
fn python_handler(
    inbox: &Arc<Shared>,
    handler: usize,
) -> impl Fn(cobalt::Request) -> Pin<Box<dyn Future<Output = cobalt::Response> + Send>>
       + Clone
       + Send
       + Sync
       + 'static {
    let inbox = inbox.clone();
    move |request: cobalt::Request| {
        let (responder, answer) = oneshot::channel();
        let pump = Pump::current();
        let shared = inbox.clone();
        inbox.queue(Box::new(move |py| {
            let request = Request {
                inner: request,
                handler: handler as u64,
                responder: Mutex::new(Some(responder)),
                pump,
                inbox: shared,
            };
            Ok(Bound::new(py, request)?.into_any())
        }));
        Box::pin(Answer {
            inbox: inbox.clone(),
            stage: Stage::Queued,
            answer,
        })
    }
}

/// A Python handler's answer, awaited on the thread that took its request.
///
/// Its request is queued without waking the loop: the first poll (where the request
/// was taken, in the middle of the shard's batch) only yields, and the next one, once
/// the shard has queued the rest of its batch, wakes the loop for all of them.
struct Answer {
    inbox: Arc<Shared>,
    stage: Stage,
    answer: oneshot::Receiver<cobalt::Response>,
}

/// Where an [`Answer`] is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Not polled yet.
    Queued,
    /// Polled once: the next poll announces the request.
    Yielded,
    /// Announced: waiting for the answer.
    Announced,
}

impl Future for Answer {
    type Output = cobalt::Response;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<cobalt::Response> {
        match self.stage {
            Stage::Queued => {
                self.stage = Stage::Yielded;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Stage::Yielded => {
                self.stage = Stage::Announced;
                self.inbox.announce();
            }
            Stage::Announced => {}
        }
        Pin::new(&mut self.answer).poll(cx).map(|answer| {
            answer.unwrap_or_else(|_| {
                cobalt::Response::new(Code::INTERNAL_SERVER_ERROR)
                    .with_payload("the Python handler ended without an answer")
            })
        })
    }
}

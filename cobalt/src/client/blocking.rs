//! A blocking client for scripts and tests: the async [`Client`](super::Client) driven
//! by a private runtime, with the same constructors and requests, and observations
//! that are iterators.
//!
//! ```no_run
//! let client = cobalt::client::blocking::Client::new();
//! let response = client.get("coap://127.0.0.1/hello")?;
//! println!("{}", response.text_payload());
//! for notification in client.observe("coap://127.0.0.1/temp")?.take(3) {
//!     println!("{}", notification?.text_payload());
//! }
//! # Ok::<(), cobalt::Error>(())
//! ```

use crate::server::Response;
use crate::{Error, Result};
use cobalt_proto::endpoint::EndpointConfig;
use cobalt_proto::message::Code;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::runtime::Runtime;

/// A blocking CoAP client. Do not use it from inside an async runtime.
#[derive(Debug)]
pub struct Client {
    inner: super::Client,
    /// Made on first use; a runtime that cannot be made is every request's error.
    rt: OnceLock<Result<Arc<Runtime>, String>>,
}

impl Default for Client {
    fn default() -> Self {
        Client::new()
    }
}

impl Client {
    /// A client with the RFC 7252 default parameters, like
    /// [`Client::new`](super::Client::new).
    pub fn new() -> Client {
        Client::from_async(super::Client::new())
    }

    /// A client with custom protocol parameters, like
    /// [`Client::with_config`](super::Client::with_config).
    pub fn with_config(config: EndpointConfig) -> Result<Client> {
        Ok(Client::from_async(super::Client::with_config(config)?))
    }

    /// The blocking face of an async client (sharing its sockets and state), e.g. one
    /// made with [`Client::with_psk`](super::Client::with_psk).
    pub fn from_async(inner: super::Client) -> Client {
        Client {
            inner,
            rt: OnceLock::new(),
        }
    }

    /// This client with its async client replaced by what `change` makes of it.
    pub(crate) fn map_async(self, change: impl FnOnce(super::Client) -> super::Client) -> Client {
        Client {
            inner: change(self.inner),
            rt: self.rt,
        }
    }

    fn runtime(&self) -> Result<Arc<Runtime>> {
        self.rt
            .get_or_init(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|e| {
                Error::Io(std::io::Error::other(format!(
                    "cannot start a runtime: {e}"
                )))
            })
    }

    fn block_on<T>(&self, f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        self.runtime()?.block_on(f)
    }

    /// GET `uri`.
    pub fn get(&self, uri: &str) -> Result<Response> {
        self.block_on(self.inner.get(uri))
    }

    /// POST `payload` to `uri`.
    pub fn post(&self, uri: &str, payload: impl Into<Vec<u8>>) -> Result<Response> {
        self.block_on(self.inner.post(uri, payload))
    }

    /// PUT `payload` to `uri`.
    pub fn put(&self, uri: &str, payload: impl Into<Vec<u8>>) -> Result<Response> {
        self.block_on(self.inner.put(uri, payload))
    }

    /// DELETE `uri`.
    pub fn delete(&self, uri: &str) -> Result<Response> {
        self.block_on(self.inner.delete(uri))
    }

    /// Any method, with an overall timeout.
    pub fn request(
        &self,
        method: Code,
        uri: &str,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Response> {
        self.block_on(
            self.inner
                .request(method, uri)
                .payload(payload)
                .timeout(timeout)
                .send(),
        )
    }

    /// Ends what this client (and the clients it shares state with) opened, like
    /// [`Client::close`](super::Client::close): DTLS sessions end with close_notify,
    /// TCP, TLS and WebSocket connections are released and closed. Call it before a
    /// program exits; the client stays usable.
    pub fn close(&self) {
        if let Ok(rt) = self.runtime() {
            rt.block_on(self.inner.close());
        }
    }

    /// Registers as an observer of `uri` (RFC 7641), like
    /// [`Client::observe`](super::Client::observe); the notifications come from the
    /// returned iterator.
    pub fn observe(&self, uri: &str) -> Result<Observation> {
        let rt = self.runtime()?;
        let inner = rt.block_on(self.inner.observe(uri))?;
        Ok(Observation { inner, rt })
    }
}

/// A blocking observation: an iterator of notifications, the first being the
/// registration's answer; see [`crate::Observation`] for how it behaves and ends.
/// Dropping it ends the relation like dropping the async one; [`Observation::cancel`]
/// ends it with a GET carrying Observe=1 and returns the server's answer.
#[derive(Debug)]
pub struct Observation {
    inner: crate::Observation,
    rt: Arc<Runtime>,
}

impl Observation {
    /// The next notification, waiting at most `timeout`; `Some(Err(Error::Deadline))`
    /// when none came in time (the observation goes on).
    pub fn next_timeout(&mut self, timeout: Duration) -> Option<Result<Response>> {
        let next = self.inner.next();
        self.rt
            .block_on(async { tokio::time::timeout(timeout, next).await })
            .unwrap_or(Some(Err(Error::Deadline(timeout))))
    }

    /// Ends the relation proactively (GET with Observe=1, RFC 7641 §3.6) and returns
    /// the server's answer.
    pub fn cancel(self) -> Result<Response> {
        self.rt.block_on(self.inner.cancel())
    }
}

impl Iterator for Observation {
    type Item = Result<Response>;

    /// The next notification; `None` once the relation has ended.
    fn next(&mut self) -> Option<Result<Response>> {
        self.rt.block_on(self.inner.next())
    }
}

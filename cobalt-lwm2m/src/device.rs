//! Device management of one registered client (LwM2M 1.1 §6.3, §6.4): Read,
//! Discover, Write (replace or partial update), Execute, Create, Delete, and
//! Observe with its cancellation, each one CoAP request through the server's own
//! client for the socket the device registered at.

use crate::codec::{decode, encode, DecodeError, DecodeLimits, Format};
use crate::limits::ManagerLimits;
use crate::path::LwPath;
use crate::registration::ClientInfo;
use crate::route::Route;
use crate::value::Entry;
use cobalt::proto::link_format::{self, Link};
use cobalt::proto::message::Message;
use cobalt::server::{Exchange, Layer, Refusal};
use cobalt::{content_format, Code, Observation, Response, Scheme};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Why a management operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ManageError {
    /// No client is registered with that endpoint name.
    #[error("no client {0:?} is registered: check `GET /clients` for the registered endpoints")]
    NotRegistered(String),
    /// The client is registered but cannot be reached now (the reason says why).
    #[error("{0}")]
    Unreachable(String),
    /// The request did not get an answer (timeout, reset, DTLS session gone...).
    #[error("request to the device failed: {0}")]
    Request(#[from] cobalt::Error),
    /// The device answered with an error code.
    #[error("the device answered {code}{}", if message.is_empty() { String::new() } else { format!(": {message}") })]
    Refused {
        /// Its response code.
        code: Code,
        /// Its diagnostic payload, if any (at most 200 characters).
        message: String,
    },
    /// The device's answer could not be decoded (or the values not encoded).
    #[error("{0}")]
    Decode(#[from] DecodeError),
    /// The device's Discover answer is not link-format (or has too many links).
    #[error("the device's Discover answer is not usable link-format: {0}")]
    BadLinks(String),
    /// The device answered in a content format the manager does not decode.
    #[error("the device answered in content format {0:?}, which the manager does not decode")]
    UnexpectedFormat(Option<u16>),
    /// Too many observations are open already.
    #[error("{0} observations are open, the most the manager keeps; cancel one first")]
    TooManyObservations(usize),
    /// The operation does not apply to that path.
    #[error("{0}")]
    BadPath(String),
}

/// How a Write changes what it writes to (LwM2M 1.1 §6.3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Replace the resource or instance (PUT).
    Replace,
    /// Partial update of an object instance: only the given resources change (POST).
    Update,
}

/// One registered client to manage.
pub struct Device {
    info: ClientInfo,
    route: Route,
    limits: ManagerLimits,
    observations: Arc<Semaphore>,
}

impl Device {
    pub(crate) fn new(
        info: ClientInfo,
        route: Route,
        limits: ManagerLimits,
        observations: Arc<Semaphore>,
    ) -> Device {
        let route = Route {
            client: route
                .client
                .layer(AnswerSizeLimit(limits.decode.max_payload_bytes)),
            ..route
        };
        Device {
            info,
            route,
            limits,
            observations,
        }
    }

    /// What it registered.
    pub fn info(&self) -> &ClientInfo {
        &self.info
    }

    /// Where it is reached: its address and the transport it registered over.
    pub fn address(&self) -> (std::net::SocketAddr, Scheme) {
        (self.route.peer, self.route.scheme)
    }

    /// The URI of `path` on the device, as the route's client sends it: `coap://`
    /// on the socket it registered at (for a DTLS listener, the route's client is
    /// that listener's, and the request goes inside the device's DTLS session).
    fn uri(&self, path: &LwPath) -> String {
        let peer =
            std::net::SocketAddr::new(self.route.peer.ip().to_canonical(), self.route.peer.port());
        let root = self.info.root.trim_end_matches('/');
        format!("coap://{peer}{root}{path}")
    }

    fn request(&self, method: Code, path: &LwPath) -> cobalt::RequestBuilder {
        self.route
            .client
            .request(method, &self.uri(path))
            .timeout(self.limits.request_timeout)
    }

    /// Whether a request can go now: not over a stream transport (the server's
    /// client would open a new connection instead of using the device's), and, for
    /// a client in queue mode that has not been heard from within `queue_awake`,
    /// once it sends its next update (waiting up to `request_timeout`).
    async fn ready(&self) -> Result<(), ManageError> {
        if !matches!(self.route.scheme, Scheme::Coap | Scheme::Coaps) {
            return Err(ManageError::Unreachable(format!(
                "{} registered over {}; the manager reaches devices over coap and coaps only",
                self.info.endpoint, self.route.scheme
            )));
        }
        if !self.info.queue_mode {
            return Ok(());
        }
        let mut heard = self.route.heard.subscribe();
        if heard.borrow_and_update().elapsed() < self.limits.queue_awake {
            return Ok(());
        }
        match tokio::time::timeout(self.limits.request_timeout, heard.changed()).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(ManageError::Unreachable(format!(
                "{} is in queue mode and asleep: it sent no update within {:?}; try again after its next update",
                self.info.endpoint, self.limits.request_timeout
            ))),
        }
    }

    /// Read: `GET path` asking for `format`; the values it answered.
    pub async fn read(&self, path: &LwPath, format: Format) -> Result<Vec<Entry>, ManageError> {
        self.ready().await?;
        if format.is_single_value() && !path.is_resource() {
            return Err(ManageError::BadPath(format!(
                "{format} carries one resource, but {path} is not a resource: read it as json, cbor or tlv"
            )));
        }
        let r = self
            .request(Code::GET, path)
            .accept(format.content_format())
            .send()
            .await?;
        decode_answer(path, &r, &self.limits.decode)
    }

    /// Discover: `GET path` with Accept link-format; the links (objects, instances,
    /// resources and their attributes) it answered.
    pub async fn discover(&self, path: &LwPath) -> Result<Vec<Link>, ManageError> {
        self.ready().await?;
        let r = self
            .request(Code::GET, path)
            .accept(content_format::LINK_FORMAT)
            .send()
            .await?;
        expect(&r, Code::CONTENT)?;
        // The answer is bounded by the route's AnswerSizeLimit.
        let text = std::str::from_utf8(&r.payload)
            .map_err(|e| ManageError::BadLinks(format!("not UTF-8: {e}")))?;
        let links = link_format::parse(text).map_err(|e| ManageError::BadLinks(e.to_string()))?;
        if links.len() > self.limits.decode.max_entries {
            return Err(ManageError::BadLinks(format!(
                "{} links, more than the {} decoded",
                links.len(),
                self.limits.decode.max_entries
            )));
        }
        Ok(links)
    }

    /// Write: the values in `entries` to `path` in `format` (`Replace`: PUT;
    /// `Update`: POST, a partial update of an instance).
    pub async fn write(
        &self,
        path: &LwPath,
        entries: &[Entry],
        format: Format,
        mode: WriteMode,
    ) -> Result<(), ManageError> {
        self.ready().await?;
        if path.depth() < 2 {
            return Err(ManageError::BadPath(format!(
                "Write goes to an object instance or a resource, not {path}"
            )));
        }
        if let Some(outside) = entries.iter().find(|e| !path.contains(&e.path)) {
            return Err(ManageError::BadPath(format!(
                "{} is not below {path}, which the Write goes to",
                outside.path
            )));
        }
        let method = match mode {
            WriteMode::Replace => Code::PUT,
            WriteMode::Update => Code::POST,
        };
        let r = self
            .request(method, path)
            .content_format(format.content_format())
            .payload(encode(format, entries)?)
            .send()
            .await?;
        expect(&r, Code::CHANGED)
    }

    /// Execute: `POST` on an executable resource, with optional arguments
    /// (`0='a',1` as LwM2M 1.1 §5.4.3 writes them, sent as text).
    pub async fn execute(&self, path: &LwPath, arguments: Option<&str>) -> Result<(), ManageError> {
        self.ready().await?;
        if path.depth() != 3 {
            return Err(ManageError::BadPath(format!(
                "Execute goes to a resource (/object/instance/resource), not {path}"
            )));
        }
        let mut req = self.request(Code::POST, path);
        if let Some(args) = arguments.filter(|a| !a.is_empty()) {
            req = req
                .content_format(content_format::TEXT_PLAIN)
                .payload(args.as_bytes().to_vec());
        }
        expect(&req.send().await?, Code::CHANGED)
    }

    /// Create: a new instance of object `object` with `entries` (each
    /// `/object/instance/resource`, the instance id chosen by the caller); answers
    /// 2.01.
    pub async fn create(
        &self,
        object: u16,
        entries: &[Entry],
        format: Format,
    ) -> Result<(), ManageError> {
        self.ready().await?;
        if let Some(outside) = entries
            .iter()
            .find(|e| e.path.object != object || e.path.depth() < 3)
        {
            return Err(ManageError::BadPath(format!(
                "{} is not a resource of object {object}",
                outside.path
            )));
        }
        let r = self
            .request(Code::POST, &LwPath::object(object))
            .content_format(format.content_format())
            .payload(encode(format, entries)?)
            .send()
            .await?;
        expect(&r, Code::CREATED)
    }

    /// Delete: an object instance.
    pub async fn delete(&self, path: &LwPath) -> Result<(), ManageError> {
        self.ready().await?;
        if path.depth() != 2 {
            return Err(ManageError::BadPath(format!(
                "Delete removes an object instance (/object/instance), not {path}"
            )));
        }
        expect(
            &self.request(Code::DELETE, path).send().await?,
            Code::DELETED,
        )
    }

    /// Observe: the values of `path` now and after every change the device reports,
    /// in `format`, until the observation is cancelled (or dropped).
    pub async fn observe(
        &self,
        path: &LwPath,
        format: Format,
    ) -> Result<DeviceObservation, ManageError> {
        self.ready().await?;
        let permit = self
            .observations
            .clone()
            .try_acquire_owned()
            .map_err(|_| ManageError::TooManyObservations(self.limits.max_observations))?;
        let observation = self
            .route
            .client
            .request(Code::GET, &self.uri(path))
            .accept(format.content_format())
            .observe()
            .await?;
        Ok(DeviceObservation {
            observation,
            path: *path,
            limits: self.limits.decode.clone(),
            _permit: permit,
        })
    }
}

/// Refuses an answer or notification that goes past what the manager decodes, block
/// by block: a device cannot make the client reassemble a large block-wise body
/// only for the decoder to refuse it.
struct AnswerSizeLimit(usize);

impl Layer for AnswerSizeLimit {
    fn on_receive(
        &self,
        _: &mut Exchange,
        _: &Message,
        response: &mut Message,
    ) -> Result<(), Refusal> {
        let offset = response.block2().map_or(0, |b| b.offset());
        if offset.saturating_add(response.payload.len()) > self.0 {
            return Err(Refusal::new(format!(
                "the device's answer is larger than the {} bytes the manager decodes",
                self.0
            )));
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        "lwm2m-answer-size"
    }
}

/// The values of a 2.05 answer (or notification) about `path`, in the content format
/// it names (plain text when it names none).
fn decode_answer(
    path: &LwPath,
    r: &Response,
    limits: &DecodeLimits,
) -> Result<Vec<Entry>, ManageError> {
    expect(r, Code::CONTENT)?;
    let cf = r.options.content_format();
    let format = Format::from_content_format(cf.unwrap_or(content_format::TEXT_PLAIN))
        .ok_or(ManageError::UnexpectedFormat(cf))?;
    Ok(decode(format, path, &r.payload, limits)?)
}

/// The error a non-`ok` answer makes.
fn expect(r: &Response, ok: Code) -> Result<(), ManageError> {
    if r.code == ok {
        return Ok(());
    }
    let message: String = String::from_utf8_lossy(&r.payload)
        .chars()
        .take(200)
        .collect();
    Err(ManageError::Refused {
        code: r.code,
        message,
    })
}

/// An open observation of a device's path: each notification decoded.
pub struct DeviceObservation {
    observation: Observation,
    path: LwPath,
    limits: crate::DecodeLimits,
    _permit: OwnedSemaphorePermit,
}

impl DeviceObservation {
    /// The path observed.
    pub fn path(&self) -> &LwPath {
        &self.path
    }

    /// The next notification's values (the first is the answer to the registration);
    /// `None` when the observation ended.
    pub async fn next(&mut self) -> Option<Result<Vec<Entry>, ManageError>> {
        let r = match self.observation.next().await? {
            Ok(r) => r,
            Err(e) => return Some(Err(e.into())),
        };
        Some(decode_answer(&self.path, &r, &self.limits))
    }

    /// Cancels it at the device (GET with Observe=1).
    pub async fn cancel(self) -> Result<(), ManageError> {
        self.observation.cancel().await?;
        Ok(())
    }
}

//! The client: async requests and observations over UDP, and a [`blocking`] wrapper.
//!
//! ```no_run
//! # async fn demo() -> cobalt::Result<()> {
//! let client = cobalt::Client::new();
//! let response = client.get("coap://127.0.0.1/hello").await?;
//! println!("{} {}", response.code, response.text_payload());
//! # Ok(()) }
//! ```

pub mod blocking;
mod observe;

pub use observe::Observation;

use crate::runtime::driver::{spawn_driver, Command, ReplyTo};
use crate::runtime::Tracer;
use crate::server::Response;
use crate::transport::udp::{any_for, bind_shard_sockets};
use crate::{Error, Result};
use cobalt_proto::endpoint::EndpointConfig;
use cobalt_proto::message::{opt, BlockValue, Code, Message, MessageType};
use cobalt_proto::uri::{CoapUri, Scheme};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// An async CoAP client. Cheap to clone; clones share sockets and state. Its socket
/// (one per address family, bound on first use) is served by a background thread
/// that stops when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    config: EndpointConfig,
    tracer: Option<Tracer>,
    v4: Mutex<Option<mpsc::UnboundedSender<Command>>>,
    v6: Mutex<Option<mpsc::UnboundedSender<Command>>>,
    next_key: AtomicU64,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.config)
            .field("traced", &self.tracer.is_some())
            .finish()
    }
}

impl Default for Client {
    fn default() -> Self {
        Client::new()
    }
}

impl Client {
    /// A client with the RFC 7252 default parameters.
    pub fn new() -> Client {
        Client::with_config_unchecked(EndpointConfig::default())
    }

    /// A client with custom protocol parameters.
    pub fn with_config(config: EndpointConfig) -> Result<Client> {
        config.validate()?;
        Ok(Client::with_config_unchecked(config))
    }

    fn with_config_unchecked(config: EndpointConfig) -> Client {
        Client {
            inner: Arc::new(Inner {
                config,
                tracer: None,
                v4: Mutex::new(None),
                v6: Mutex::new(None),
                next_key: AtomicU64::new(1),
            }),
        }
    }

    /// A client that shows every datagram it sends or receives to `tracer`
    /// (direction: `true` = sent), e.g. to print the messages like `cobalt -v`.
    pub fn with_tracer(config: EndpointConfig, tracer: Tracer) -> Result<Client> {
        config.validate()?;
        let mut c = Client::with_config_unchecked(config);
        if let Some(inner) = Arc::get_mut(&mut c.inner) {
            inner.tracer = Some(tracer);
        }
        Ok(c)
    }

    /// GET `uri`.
    pub async fn get(&self, uri: &str) -> Result<Response> {
        self.request(Code::GET, uri).send().await
    }

    /// POST `payload` to `uri`.
    pub async fn post(&self, uri: &str, payload: impl Into<Vec<u8>>) -> Result<Response> {
        self.request(Code::POST, uri).payload(payload).send().await
    }

    /// PUT `payload` to `uri`.
    pub async fn put(&self, uri: &str, payload: impl Into<Vec<u8>>) -> Result<Response> {
        self.request(Code::PUT, uri).payload(payload).send().await
    }

    /// DELETE `uri`.
    pub async fn delete(&self, uri: &str) -> Result<Response> {
        self.request(Code::DELETE, uri).send().await
    }

    /// Starts building a request with any method.
    pub fn request(&self, method: Code, uri: &str) -> RequestBuilder {
        RequestBuilder {
            client: self.clone(),
            uri: uri.to_string(),
            message: Message::new(MessageType::Confirmable, method, 0),
            timeout: None,
        }
    }

    /// Registers as an observer of `uri` (RFC 7641); notifications arrive on the
    /// returned [`Observation`] until it is dropped.
    pub async fn observe(&self, uri: &str) -> Result<Observation> {
        self.request(Code::GET, uri).observe().await
    }

    fn driver_for(&self, peer: &SocketAddr) -> Result<mpsc::UnboundedSender<Command>> {
        let slot = if peer.is_ipv4() {
            &self.inner.v4
        } else {
            &self.inner.v6
        };
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = slot.as_ref().filter(|tx| !tx.is_closed()) {
            return Ok(tx.clone());
        }
        let socket = bind_shard_sockets(any_for(peer), 1)?.remove(0);
        let (tx, _thread) = spawn_driver(
            "cobalt-client".into(),
            socket,
            self.inner.config.clone(),
            None,
            self.inner.tracer.clone(),
        )?;
        *slot = Some(tx.clone());
        Ok(tx)
    }

    fn next_key(&self) -> u64 {
        self.inner.next_key.fetch_add(1, Ordering::Relaxed)
    }
}

/// A request being built; finish with [`RequestBuilder::send`] or [`RequestBuilder::observe`].
#[derive(Debug)]
pub struct RequestBuilder {
    client: Client,
    uri: String,
    message: Message,
    timeout: Option<Duration>,
}

impl RequestBuilder {
    /// Sets the payload.
    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> RequestBuilder {
        self.message.payload = payload.into();
        self
    }

    /// Sets Content-Format.
    pub fn content_format(mut self, cf: u16) -> RequestBuilder {
        self.message
            .options
            .set_uint(opt::CONTENT_FORMAT, u32::from(cf));
        self
    }

    /// Sets Accept.
    pub fn accept(mut self, cf: u16) -> RequestBuilder {
        self.message.options.set_uint(opt::ACCEPT, u32::from(cf));
        self
    }

    /// Sends as a non-confirmable message.
    pub fn non_confirmable(mut self) -> RequestBuilder {
        self.message.mtype = MessageType::NonConfirmable;
        self
    }

    /// Adds an option (repeatable options accumulate).
    pub fn option(mut self, number: u16, value: impl Into<Vec<u8>>) -> RequestBuilder {
        self.message.options.push(number, value);
        self
    }

    /// Gives up after `timeout` overall, whatever the retransmission state.
    pub fn timeout(mut self, timeout: Duration) -> RequestBuilder {
        self.timeout = Some(timeout);
        self
    }

    async fn prepare(mut self) -> Result<(Client, SocketAddr, Message, Option<Duration>)> {
        let uri = CoapUri::parse(&self.uri)?;
        if uri.scheme != Scheme::Coap {
            return Err(Error::Unsupported(format!(
                "{}:// is not supported yet; use coap://",
                uri.scheme.as_str()
            )));
        }
        let peer = resolve(&uri).await?;
        uri.apply_to(&mut self.message.options);
        Ok((self.client, peer, self.message, self.timeout))
    }

    /// Sends the request and waits for the response. A response in Block2 blocks is
    /// fetched block by block and returned whole (RFC 7959).
    pub async fn send(self) -> Result<Response> {
        let (client, peer, message, timeout) = self.prepare().await?;
        let exchange = fetch_whole(&client, peer, message);
        match timeout {
            Some(t) => tokio::time::timeout(t, exchange)
                .await
                .map_err(|_| Error::Deadline(t))?,
            None => exchange.await,
        }
    }

    /// Sends the request with Observe=0 and returns the stream of notifications.
    pub async fn observe(mut self) -> Result<Observation> {
        self.message.options.set_uint(opt::OBSERVE, 0);
        let (client, peer, message, _) = self.prepare().await?;
        let driver = client.driver_for(&peer)?;
        let key = client.next_key();
        let (tx, rx) = mpsc::unbounded_channel();
        driver
            .send(Command::Request {
                key,
                peer,
                message,
                reply: ReplyTo::Stream(tx),
            })
            .map_err(|_| Error::Shutdown)?;
        Ok(Observation::new(
            rx,
            CancelGuard {
                driver,
                key,
                armed: true,
            },
        ))
    }
}

/// Largest body the client reassembles from blocks (16 MiB).
pub const MAX_BODY: usize = 16 << 20;

/// One request/response exchange through the driver.
async fn exchange(client: &Client, peer: SocketAddr, message: Message) -> Result<Message> {
    let driver = client.driver_for(&peer)?;
    let key = client.next_key();
    let (tx, rx) = oneshot::channel();
    driver
        .send(Command::Request {
            key,
            peer,
            message,
            reply: ReplyTo::Once(tx),
        })
        .map_err(|_| Error::Shutdown)?;
    let mut guard = CancelGuard {
        driver,
        key,
        armed: true,
    };
    let result = rx.await;
    guard.armed = false;
    result.map_err(|_| Error::Shutdown)?
}

/// Request bodies larger than this go in Block1 blocks of this size (RFC 7959 §2.5), so
/// every message fits in one datagram that any peer accepts (RFC 7252 §4.6).
pub const BLOCK1_SIZE: usize = 1024;

/// Sends a request whose body may need Block1 blocks; returns the final response (or
/// the first answer that is not 2.31 Continue, e.g. 4.13, for the caller to see).
async fn send_body(client: &Client, peer: SocketAddr, request: Message) -> Result<Message> {
    if request.payload.len() <= BLOCK1_SIZE || request.options.contains(opt::BLOCK1) {
        return exchange(client, peer, request).await;
    }
    let mut template = request;
    let body = std::mem::take(&mut template.payload);
    let mut szx = BlockValue::szx_for_size(BLOCK1_SIZE).unwrap_or(6);
    let mut offset = 0;
    loop {
        let size = 1usize << (szx + 4);
        let end = (offset + size).min(body.len());
        let more = end < body.len();
        let block = BlockValue::new((offset / size) as u32, more, szx)
            .ok_or_else(|| Error::BlockTransfer("request body too large for Block1".into()))?;
        let mut req = template.clone();
        req.payload = body[offset..end].to_vec();
        req.options.set_uint(opt::BLOCK1, block.encode());
        if offset == 0 {
            req.options
                .set_uint(opt::SIZE1, u32::try_from(body.len()).unwrap_or(u32::MAX));
        }
        let response = exchange(client, peer, req).await?;
        if !more || response.code != Code::CONTINUE {
            return Ok(response);
        }
        // The server may ask for smaller blocks; the offset stays what it received.
        if let Some(b) = response.block1() {
            szx = szx.min(b.szx);
        }
        offset = end;
    }
}

/// Sends a request (its body in Block1 blocks if large) and follows Block2 until the
/// representation is complete.
async fn fetch_whole(client: &Client, peer: SocketAddr, request: Message) -> Result<Response> {
    let uploaded = request.payload.len() > BLOCK1_SIZE && !request.options.contains(opt::BLOCK1);
    // After a Block1 upload the later blocks are asked for without the body (§3.3).
    let mut follow_up = request.clone();
    if uploaded {
        follow_up.payload.clear();
    }
    let mut first = send_body(client, peer, request).await?;
    if uploaded {
        first.options.remove(opt::BLOCK1);
    }
    let Some(mut block) = first.block2().filter(|b| b.more && first.code.is_success()) else {
        return Ok(Response::from_message(first));
    };
    let etag = first.options.get(opt::ETAG).map(<[u8]>::to_vec);
    let mut whole = Response::from_message(first);
    while block.more {
        if whole.payload.len() > MAX_BODY {
            return Err(Error::BlockTransfer(format!(
                "representation larger than {MAX_BODY} bytes"
            )));
        }
        let next = BlockValue::new(block.num + 1, false, block.szx)
            .ok_or_else(|| Error::BlockTransfer("too many blocks".into()))?;
        let mut req = follow_up.clone();
        req.options.set_uint(opt::BLOCK2, next.encode());
        let part = exchange(client, peer, req).await?;
        if !part.code.is_success() {
            return Err(Error::BlockTransfer(format!(
                "server answered {} to block {}",
                part.code, next.num
            )));
        }
        if part.options.get(opt::ETAG).map(<[u8]>::to_vec) != etag {
            return Err(Error::BlockTransfer(
                "the representation changed during the transfer (ETag differs)".into(),
            ));
        }
        block = part
            .block2()
            .ok_or_else(|| Error::BlockTransfer("a block response lacks Block2".into()))?;
        if block.offset() != whole.payload.len() {
            return Err(Error::BlockTransfer(format!(
                "expected the block at offset {}, got {}",
                whole.payload.len(),
                block.offset()
            )));
        }
        whole.payload.extend_from_slice(&part.payload);
    }
    whole.options.remove(opt::BLOCK2);
    Ok(whole)
}

/// Tells the driver to forget a request when the caller stops waiting for it.
#[derive(Debug)]
pub(crate) struct CancelGuard {
    driver: mpsc::UnboundedSender<Command>,
    key: u64,
    armed: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.driver.send(Command::Cancel { key: self.key });
        }
    }
}

async fn resolve(uri: &CoapUri) -> Result<SocketAddr> {
    if let Some(ip) = uri.ip() {
        return Ok(SocketAddr::new(ip, uri.port));
    }
    let mut addrs = tokio::net::lookup_host((uri.host.as_str(), uri.port))
        .await
        .map_err(|e| Error::Resolve {
            host: uri.host.clone(),
            reason: e.to_string(),
        })?;
    addrs.next().ok_or_else(|| Error::Resolve {
        host: uri.host.clone(),
        reason: "no addresses".into(),
    })
}

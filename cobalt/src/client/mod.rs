//! The client: async requests and observations over UDP, DTLS, TCP and WebSockets,
//! and a [`blocking`] wrapper.
//!
//! ```no_run
//! # async fn demo() -> cobalt::Result<()> {
//! let client = cobalt::Client::new();
//! let response = client.get("coap://127.0.0.1/hello").await?;
//! println!("{} {}", response.code, response.text_payload());
//! # Ok(()) }
//! ```

pub mod blocking;
mod blockwise;
mod group;
pub use group::MAX_GROUP_ANSWERS;
pub(crate) mod hooks;
pub use blockwise::MAX_BODY;
mod observation_set;
mod observe;
mod qblock;
mod qblock_upload;
mod route;

pub use hooks::{Exchange, Refusal};
pub use observation_set::{ObservationSet, SET_BUFFERED_NOTIFICATIONS};
pub use observe::{Observation, Reregistration, MAX_REREGISTRATIONS};

use crate::error::{SetupError, Unsupported};
use crate::runtime::command::Command;
use crate::runtime::driver::{spawn_driver, DriverIo};
use crate::runtime::service::NoService;
use crate::server::Response;
use crate::trace::StreamTracer;
use crate::trace::Tracer;
use crate::transport::credentials::{ClientCredentials, ClientPsk, X509Credentials};
use crate::transport::dtls::{DtlsBackend, DtlsConfig, OpensslDtls};
use crate::transport::tcp::{TcpPool, TracerSlot};
use crate::transport::tls::{Alpn, TlsConnector};
use crate::transport::udp::{any_for, bind_shard_sockets, report_unreachable};
use crate::{Error, Result};
use cobalt_proto::blockwise::MAX_UDP_SZX;
use cobalt_proto::endpoint::EndpointConfig;
use cobalt_proto::message::{opt, BlockValue, Code, Message, MessageType, Token};
use cobalt_proto::settings::Settings;
use cobalt_proto::tcp_connection::{Framing, TcpConfig};
use cobalt_proto::uri::{CoapUri, Scheme};
use hooks::{ClientHooks, ClientLayers};
use route::Route;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// An async CoAP client. Cheap to clone; clones share sockets and state. Its socket
/// (one per address family, bound on first use) is served by a background thread
/// that stops when the last clone is dropped.
///
/// The client ends what it opened: when the last clone is dropped, or at once with
/// [`Client::close`], its DTLS sessions end with close_notify and its TCP, TLS and
/// WebSocket connections are released and closed, so that servers need not keep
/// them until their idle timeouts.
///
/// `coaps://` requests go over DTLS 1.2 with a pre-shared key
/// ([`Client::with_psk`] or [`RequestBuilder::psk`]); there is one DTLS socket and
/// session table per key and address family.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
    /// The credentials for `coaps://` requests made through this handle.
    auth: Option<Arc<ClientCredentials>>,
    /// Set on the handle a `coaps://` request runs on: its driver is a DTLS one.
    secure: Option<Arc<ClientCredentials>>,
    /// The layers every request of this handle passes, outermost first.
    layers: ClientLayers,
}

/// DTLS drivers by address family (`true` = IPv4) and credentials.
type DtlsDrivers = HashMap<(bool, ClientCredentials), mpsc::UnboundedSender<Command>>;

/// Connection pools of `coaps+tcp` and `coaps+ws` (`true`) by credentials (none:
/// the system's trusted CAs).
type TlsPools = HashMap<(bool, Option<ClientCredentials>), Arc<TcpPool>>;

struct Inner {
    config: EndpointConfig,
    tracer: Option<Tracer>,
    /// A server shard's own command queue and whether its socket is IPv6.
    shard: Option<(mpsc::UnboundedSender<Command>, bool)>,
    v4: Mutex<Option<mpsc::UnboundedSender<Command>>>,
    v6: Mutex<Option<mpsc::UnboundedSender<Command>>>,
    tcp: Arc<TcpPool>,
    dtls: Mutex<DtlsDrivers>,
    ws: Arc<TcpPool>,
    tls: Mutex<TlsPools>,
    /// Shows the messages of TCP, TLS and WebSocket connections opened from now on.
    stream_tracer: TracerSlot,
    /// `coaps://` with a pre-shared key runs on Mbed TLS and asks each server for a
    /// DTLS Connection ID ([`Client::with_dtls_cid`]).
    dtls_cid: bool,
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

    /// A client with `config`, which the caller has validated.
    pub(crate) fn with_config_unchecked(config: EndpointConfig) -> Client {
        let stream_tracer = TracerSlot::default();
        Client {
            inner: Arc::new(Inner {
                config,
                tracer: None,
                shard: None,
                v4: Mutex::new(None),
                v6: Mutex::new(None),
                tcp: Arc::new(TcpPool::default().traced(stream_tracer.clone())),
                dtls: Mutex::new(HashMap::new()),
                ws: Arc::new(TcpPool::new(Framing::WebSocket).traced(stream_tracer.clone())),
                tls: Mutex::new(HashMap::new()),
                stream_tracer,
                dtls_cid: false,
            }),
            auth: None,
            secure: None,
            layers: ClientLayers::default(),
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

    /// This client, before its first request, with its `coaps://` sessions (PSK, or
    /// a certificate with ECDHE-ECDSA) on Mbed TLS asking each server for a DTLS
    /// Connection ID (RFC 9146): a session then survives a change of this client's
    /// address or port (NAT rebinding) without a new handshake. A server that grants
    /// none still gets a plain session. Needs the `mbedtls` feature. Fails
    /// when the client has been cloned or used already.
    pub fn with_dtls_cid(mut self) -> Result<Client> {
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            return Err(Error::Unsupported(Unsupported::Argument(
                "Client::with_dtls_cid must be called on a new client, before it is cloned".into(),
            )));
        };
        inner.dtls_cid = true;
        Ok(self)
    }

    /// This client (sharing its sockets and state) using `identity` and `key` for
    /// `coaps://` requests (DTLS 1.2 with TLS_PSK_WITH_AES_128_CCM_8 or
    /// TLS_PSK_WITH_AES_128_GCM_SHA256).
    pub fn with_psk(&self, identity: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Client {
        self.with_dtls_auth(ClientCredentials::Psk(ClientPsk::new(identity, key)))
    }

    /// This client (sharing its sockets and state) using certificates for `coaps://`
    /// requests (DTLS 1.2 with the ECDHE-ECDSA suites): the server's certificate must
    /// chain to `credentials.ca_pem`; a client certificate is presented if given.
    pub fn with_x509(&self, credentials: X509Credentials) -> Client {
        self.with_dtls_auth(ClientCredentials::X509(credentials))
    }

    fn with_dtls_auth(&self, auth: ClientCredentials) -> Client {
        Client {
            inner: self.inner.clone(),
            auth: Some(Arc::new(auth)),
            secure: None,
            layers: self.layers.clone(),
        }
    }

    /// This client with `layer` inside the layers it has (see
    /// [`Client::layer`](Client::layer), in the layer module).
    pub(crate) fn with_layer(mut self, layer: Arc<dyn ClientHooks>) -> Client {
        self.layers.push(layer);
        self
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
            block_szx: None,
            auth: None,
            q_block: false,
        }
    }

    /// Opens the connection that requests to a `coap+tcp://`, `coaps+tcp://`,
    /// `coap+ws://` or `coaps+ws://` URI will use (TCP and TLS handshakes, WebSocket
    /// upgrade, CSM exchange) and waits until it is ready, so that the time of later
    /// requests does not include it. For `coap://` it starts the client's socket
    /// and driver for the address's family (sending nothing), so that what they
    /// take is there before the first request (e.g. to measure what requests and
    /// observations add); `coaps://` has nothing to open before its handshake.
    pub async fn connect(&self, uri: &str) -> Result<()> {
        let uri = CoapUri::parse(uri)?;
        if uri.scheme == Scheme::Coap {
            let peer = resolve(&uri).await?;
            let driver = self.driver_for(&self.socket_peer(peer))?;
            // Any answer (a datagram driver has no settings to report) says that it
            // runs, its socket set up.
            let (tx, rx) = tokio::sync::oneshot::channel();
            if driver.send(Command::Settings { reply: tx }).is_ok() {
                let _ = rx.await;
            }
            return Ok(());
        }
        if !is_stream(uri.scheme) {
            return Ok(());
        }
        let peer = resolve(&uri).await?;
        self.pool(uri.scheme)?.settings(peer, &uri.host).await?;
        Ok(())
    }

    /// Ends what this client (and its clones) opened and waits until it is done:
    /// DTLS sessions end with close_notify, TCP, TLS and WebSocket connections are
    /// released (RFC 8323 §5.5) and closed (TCP FIN, TLS close_notify, WebSocket
    /// close). Requests and observations in flight end with [`Error::Shutdown`]. The
    /// client stays usable: a later request opens anew. (A client made for a server's
    /// handlers leaves the server's sockets alone.) Call it before a program exits,
    /// which would otherwise cut the sessions off unannounced.
    pub async fn close(&self) {
        let mut drivers: Vec<mpsc::UnboundedSender<Command>> = Vec::new();
        for slot in [&self.inner.v4, &self.inner.v6] {
            drivers.extend(slot.lock().unwrap_or_else(|e| e.into_inner()).take());
        }
        let dtls = std::mem::take(&mut *self.inner.dtls.lock().unwrap_or_else(|e| e.into_inner()));
        drivers.extend(dtls.into_values());
        for driver in &drivers {
            let _ = driver.send(Command::Shutdown {
                grace: Duration::ZERO,
            });
        }
        let tls: Vec<Arc<TcpPool>> = {
            let pools = self.inner.tls.lock().unwrap_or_else(|e| e.into_inner());
            pools.values().cloned().collect()
        };
        let pools = [&self.inner.tcp, &self.inner.ws].into_iter().chain(&tls);
        futures_util::future::join_all(pools.map(|pool| pool.close())).await;
        // A driver lets go of its commands once its sessions are closed and it exits.
        futures_util::future::join_all(drivers.iter().map(|d| d.closed())).await;
    }

    /// Registers as an observer of `uri` (RFC 7641); notifications arrive on the
    /// returned [`Observation`] until it is dropped.
    pub async fn observe(&self, uri: &str) -> Result<Observation> {
        self.request(Code::GET, uri).observe().await
    }

    /// A client that sends through a server shard's endpoint and socket.
    pub(crate) fn for_shard(
        commands: mpsc::UnboundedSender<Command>,
        v6: bool,
        config: EndpointConfig,
    ) -> Client {
        let mut c = Client::with_config_unchecked(config);
        if let Some(inner) = Arc::get_mut(&mut c.inner) {
            inner.shard = Some((commands, v6));
        }
        c
    }

    /// The address to use for `peer` on the socket that will carry the request: an
    /// IPv4 peer is reached through a dual-stack shard socket as an IPv4-mapped address.
    fn socket_peer(&self, peer: SocketAddr) -> SocketAddr {
        if self.secure.is_some() {
            return peer;
        }
        match (&self.inner.shard, peer) {
            (Some((_, true)), SocketAddr::V4(a)) => {
                SocketAddr::new(std::net::IpAddr::V6(a.ip().to_ipv6_mapped()), a.port())
            }
            _ => peer,
        }
    }

    /// The datagram driver for requests to `peer` with this handle's credentials
    /// (if `coaps`): a server shard's own, or the client's, started on first use.
    fn driver_for(&self, peer: &SocketAddr) -> Result<mpsc::UnboundedSender<Command>> {
        if let Some(auth) = &self.secure {
            return self.dtls_driver_for(peer, auth);
        }
        if let Some((tx, v6)) = &self.inner.shard {
            if *v6 || peer.is_ipv4() {
                return Ok(tx.clone());
            }
        }
        let slot = if peer.is_ipv4() {
            &self.inner.v4
        } else {
            &self.inner.v6
        };
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = slot.as_ref().filter(|tx| !tx.is_closed()) {
            return Ok(tx.clone());
        }
        let tx = self.spawn_driver("cobalt-client", peer, None)?;
        *slot = Some(tx.clone());
        Ok(tx)
    }

    /// Starts a client driver (a thread with its own socket for `peer`'s address
    /// family, with DTLS under the endpoint when `dtls` is given).
    fn spawn_driver(
        &self,
        name: &str,
        peer: &SocketAddr,
        dtls: Option<Box<dyn DtlsBackend>>,
    ) -> Result<mpsc::UnboundedSender<Command>> {
        let socket = client_socket(peer)?;
        let (tx, _thread) = spawn_driver::<NoService>(
            name.into(),
            DriverIo::Owned(socket),
            own_driver_config(&self.inner.config),
            None,
            self.inner.tracer.clone(),
            None,
            None,
            dtls,
        )?;
        Ok(tx)
    }

    /// The DTLS driver for `peer`'s address family and `auth`, started on first use.
    fn dtls_driver_for(
        &self,
        peer: &SocketAddr,
        auth: &ClientCredentials,
    ) -> Result<mpsc::UnboundedSender<Command>> {
        let mut drivers = self.inner.dtls.lock().unwrap_or_else(|e| e.into_inner());
        let key = (peer.is_ipv4(), auth.clone());
        if let Some(tx) = drivers.get(&key).filter(|tx| !tx.is_closed()) {
            return Ok(tx.clone());
        }
        let layer: Box<dyn DtlsBackend> = if self.inner.dtls_cid {
            crate::transport::dtls::select::mbedtls_client(auth, DtlsConfig::default())?
        } else {
            Box::new(
                OpensslDtls::client_with(auth, DtlsConfig::default())
                    .map_err(|e| e.into_error("DTLS", Scheme::Coaps))?,
            )
        };
        let tx = self.spawn_driver("cobalt-client-dtls", peer, Some(layer))?;
        drivers.retain(|_, tx| !tx.is_closed());
        drivers.insert(key, tx.clone());
        Ok(tx)
    }

    /// The pool of `coaps+tcp` (or, with `ws`, `coaps+ws`) connections made with this
    /// handle's credentials.
    fn tls_pool(&self, ws: bool) -> Result<Arc<TcpPool>> {
        let framing = if ws {
            Framing::WebSocket
        } else {
            Framing::Stream
        };
        let auth = self.auth.as_deref();
        let mut pools = self.inner.tls.lock().unwrap_or_else(|e| e.into_inner());
        let key = (ws, auth.cloned());
        if let Some(pool) = pools.get(&key) {
            return Ok(pool.clone());
        }
        let scheme = if ws {
            Scheme::CoapsWs
        } else {
            Scheme::CoapsTcp
        };
        let connector = TlsConnector::new(auth, Alpn::for_framing(framing))
            .map_err(|e| e.into_error("TLS", scheme))?;
        let pool =
            Arc::new(TcpPool::secure(framing, connector).traced(self.inner.stream_tracer.clone()));
        pool.set_config(self.inner.tcp.config());
        pools.insert(key, pool.clone());
        Ok(pool)
    }

    /// Shows every message of the `coap+tcp`, `coaps+tcp`, `coap+ws` and `coaps+ws`
    /// connections this client (and its clones) opens from now on to `tracer`
    /// (direction: `true` = sent; received are responses and the server's CSM), e.g. to
    /// print them like `cobalt -v`.
    pub fn set_stream_tracer(&self, tracer: StreamTracer) {
        *self
            .inner
            .stream_tracer
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(tracer);
    }

    /// The pool of `coap+ws://` connections for [`Scheme::CoapWs`], else that of
    /// `coap+tcp://`.
    /// The connection pool of a connection-oriented scheme: one for `coap+tcp`, one
    /// for `coap+ws`, and for `coaps+tcp`/`coaps+ws` one per credentials (this
    /// handle's, see [`Client::with_psk`] and [`Client::with_x509`]).
    pub(crate) fn pool(&self, scheme: Scheme) -> Result<Arc<TcpPool>> {
        match scheme {
            Scheme::CoapWs => Ok(self.inner.ws.clone()),
            Scheme::CoapTcp => Ok(self.inner.tcp.clone()),
            other => self.tls_pool(other == Scheme::CoapsWs),
        }
    }

    /// Settings of the `coap+tcp://` and `coap+ws://` connections this client (and its
    /// clones) opens from now on: Max-Message-Size, whether to announce BERT
    /// (`block_wise_transfer`, on by default), timeouts.
    pub fn set_tcp_config(&self, config: TcpConfig) {
        self.inner.tcp.set_config(config.clone());
        let tls = self.inner.tls.lock().unwrap_or_else(|e| e.into_inner());
        for pool in tls.values() {
            pool.set_config(config.clone());
        }
        self.inner.ws.set_config(config);
    }
}

/// A request being built; finish with [`RequestBuilder::send`] or [`RequestBuilder::observe`].
#[derive(Debug)]
pub struct RequestBuilder {
    client: Client,
    uri: String,
    message: Message,
    timeout: Option<Duration>,
    block_szx: Option<u8>,
    auth: Option<ClientCredentials>,
    /// Download the answer with Q-Block2 (RFC 9177) over UDP and DTLS.
    q_block: bool,
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

    /// Sends the request with this token instead of a fresh random one: up to eight
    /// bytes with any server, longer ones (RFC 8974 extended tokens, up to the
    /// configuration's `max_token_len`) with servers that support them. A token still in
    /// use for another request to the same server is replaced by a fresh one; the
    /// following requests of a block-wise transfer carry the same token.
    pub fn token(mut self, token: Token) -> RequestBuilder {
        self.message.token = token;
        self
    }

    /// Adds an option (repeatable options accumulate).
    pub fn option(mut self, number: u16, value: impl AsRef<[u8]>) -> RequestBuilder {
        self.message.options.push(number, value);
        self
    }

    /// Block size for uploads (Block1) and, asked of the server, for downloads (Block2):
    /// 16 to 1024 bytes, a power of two. Without it uploads use 1024-byte blocks and the
    /// server chooses the download block size.
    pub fn block_size(mut self, bytes: usize) -> Result<RequestBuilder> {
        let szx = BlockValue::szx_for_size(bytes).ok_or_else(|| {
            Error::Unsupported(Unsupported::Argument(format!(
                "block size {bytes} is not one of 16, 32, 64, 128, 256, 512, 1024"
            )))
        })?;
        self.block_szx = Some(szx);
        if let Some(b) = BlockValue::new(0, false, szx) {
            self.message.options.set_uint(opt::BLOCK2, b.encode());
        }
        Ok(self)
    }

    /// Downloads the answer with Q-Block2 (RFC 9177) over `coap://` and `coaps://`:
    /// the server sends the body in sets of blocks without waiting for a request per
    /// block, and the blocks lost on the way are asked for again, several in one
    /// request, up to MAX_RETRANSMIT (4) rounds without a new block
    /// ([`BlockError::Incomplete`](crate::BlockError::Incomplete)). A server
    /// without Q-Block answers as usual (whole or in Block2 blocks). The blocks are of
    /// [`RequestBuilder::block_size`], 1024 bytes without it.
    ///
    /// A body larger than one block (PUT, POST, ...) goes up with Q-Block1: in sets of
    /// up to MAX_PAYLOADS (10) blocks, NON for a non-confirmable request, CON otherwise,
    /// the next set after the server's 2.31 (Continue) or NON_TIMEOUT (2 s); the
    /// blocks a 4.08 lists as missing are sent again, up to MAX_RETRANSMIT rounds
    /// ([`BlockError::UploadIncomplete`](crate::BlockError::UploadIncomplete)). A
    /// server without Q-Block1 (4.02) gets the body in Block1 blocks. Other transports
    /// go as without it.
    pub fn q_block(mut self) -> RequestBuilder {
        self.q_block = true;
        self
    }

    /// The pre-shared key for a `coaps://` request (overrides [`Client::with_psk`]).
    pub fn psk(mut self, identity: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> RequestBuilder {
        self.auth = Some(ClientCredentials::Psk(ClientPsk::new(identity, key)));
        self
    }

    /// Certificates for a `coaps://` request (overrides [`Client::with_x509`]).
    pub fn x509(mut self, credentials: X509Credentials) -> RequestBuilder {
        self.auth = Some(ClientCredentials::X509(credentials));
        self
    }

    /// Gives up after `timeout` overall, whatever the retransmission state.
    pub fn timeout(mut self, timeout: Duration) -> RequestBuilder {
        self.timeout = Some(timeout);
        self
    }

    /// The route to the URI's server (credentials checked, name resolved), with the
    /// URI's options set on the request.
    async fn route(&mut self) -> Result<Route> {
        let uri = CoapUri::parse(&self.uri)?;
        let mut client = self.authenticated_client();
        match uri.scheme {
            Scheme::Coap => {}
            Scheme::Coaps => {
                let auth =
                    client
                        .auth
                        .clone()
                        .ok_or(Error::Unsupported(Unsupported::NoCredentials {
                            scheme: Scheme::Coaps,
                            how: "RequestBuilder::psk, Client::with_psk or Client::with_x509",
                        }))?;
                client.secure = Some(auth);
            }
            scheme => {
                let peer = resolve(&uri).await?;
                uri.apply_to(&mut self.message.options);
                let pool = client.pool(scheme)?;
                return Ok(Route::stream(
                    peer,
                    pool,
                    uri.host,
                    scheme,
                    client.layers.clone(),
                ));
            }
        }
        let peer = client.socket_peer(resolve(&uri).await?);
        uri.apply_to(&mut self.message.options);
        Ok(Route::datagram(
            client.driver_for(&peer)?,
            peer,
            uri.scheme,
            client.layers.clone(),
        ))
    }

    /// Sends the request and waits for the response. A response in Block2 blocks is
    /// fetched block by block and returned whole (RFC 7959).
    ///
    /// `coap+tcp://` URIs go over a pooled TCP connection per server (RFC 8323), with
    /// the whole body in one message when it fits the server's Max-Message-Size (from
    /// its CSM), else in Block1 blocks of the largest size that fits — BERT blocks
    /// (RFC 8323 §6) when both ends announced BERT — or of [`RequestBuilder::block_size`]
    /// when given; BERT answers are reassembled. Without [`RequestBuilder::timeout`] a TCP request
    /// gives up after 60 s. `coap+ws://` URIs go the same way over a pooled WebSocket
    /// per server (RFC 8323 §4, path `/.well-known/coap`, subprotocol `coap`).
    pub async fn send(mut self) -> Result<Response> {
        let route = self.route().await?;
        let q_block = self.q_block && !route.is_stream();
        let exchange = async {
            let szx = self.block_szx.unwrap_or(MAX_UDP_SZX);
            if q_block && self.message.payload.is_empty() {
                qblock::download(&route, self.message, szx).await
            } else if q_block && self.message.payload.len() > 16 << szx {
                qblock_upload::upload(&route, self.message, szx).await
            } else {
                route.send_whole(self.message, self.block_szx).await
            }
        };
        match self.timeout.or(route.default_timeout()) {
            Some(t) => tokio::time::timeout(t, exchange)
                .await
                .map_err(|_| Error::Deadline(t))?,
            None => exchange.await,
        }
    }

    /// Sends the request as NON to the multicast group of its `coap://` URI (such as
    /// `coap://224.0.1.187/.well-known/core` or `coap://[ff02::fd%eth0]/...`) and
    /// returns every answer that arrives within `wait`, each with its responder's
    /// address, in the order received (at most [`MAX_GROUP_ANSWERS`]). Servers wait
    /// a random Leisure before answering (RFC 7252 §8.2) and say nothing when they
    /// have nothing useful to say (groupcomm-bis), so no answer is not an error: the
    /// list is empty. Each call uses a fresh token on a socket of its own, closed when
    /// `wait` ends, so a late answer is never taken for another request's.
    pub async fn multicast(mut self, wait: Duration) -> Result<Vec<(SocketAddr, Response)>> {
        let uri = CoapUri::parse(&self.uri)?;
        if uri.scheme != Scheme::Coap {
            return Err(Error::Unsupported(Unsupported::Argument(format!(
                "group requests go over coap:// only (RFC 7252 §8; groupcomm-bis), not {}",
                uri.scheme
            ))));
        }
        let group = resolve(&uri).await?;
        uri.apply_to(&mut self.message.options);
        group::ask_group(self.message, group, wait).await
    }

    /// The client to send with: this request's credentials ([`RequestBuilder::psk`],
    /// [`RequestBuilder::x509`]) in place of the client's, if given.
    fn authenticated_client(&mut self) -> Client {
        match self.auth.take() {
            Some(auth) => self.client.with_dtls_auth(auth),
            None => self.client.clone(),
        }
    }

    /// Sends the request with Observe=0 and returns the stream of notifications.
    /// With [`RequestBuilder::q_block`] over UDP and DTLS the notifications longer
    /// than a block come in Q-Block2 sets (RFC 9177 §4.4) and are yielded whole.
    ///
    /// `coap+tcp://` and `coap+ws://` observations go over the pooled connection to
    /// the server (RFC 8323 §7); see [`Observation`] for how they end.
    pub fn observe(self) -> impl Future<Output = Result<Observation>> + Send {
        // Boxed: the builder and the resolving future would otherwise take room in
        // every task that opens an observation, for as long as it observes.
        Box::pin(async move {
            let (route, registration) = self.registration().await?;
            Observation::register(route, registration)
        })
    }

    /// The route to the server and the registration to send it: the request with
    /// Observe=0, asking for notifications in Q-Block2 sets with
    /// [`RequestBuilder::q_block`] over UDP and DTLS.
    async fn registration(mut self) -> Result<(Route, Message)> {
        self.message.options.set_uint(opt::OBSERVE, 0);
        let route = self.route().await?;
        if self.q_block && !route.is_stream() {
            let szx = self.block_szx.unwrap_or(MAX_UDP_SZX);
            qblock::ask_notifications_in_qblock2(&mut self.message, szx);
        }
        Ok((route, self.message))
    }
}

/// The configuration of a client's own driver: `config` without address
/// verification. Such an endpoint serves nothing, and answers a request with a 4.04
/// no larger than the request, so no answer of its needs an address verified first
/// (RFC 9175 §2.4); with verification on it would remember every server it talks to
/// as verified (some 80 bytes per server for a client of thousands).
fn own_driver_config(config: &EndpointConfig) -> EndpointConfig {
    EndpointConfig {
        amplification_factor: 0,
        ..config.clone()
    }
}

/// Whether a scheme runs over a connection (RFC 8323) rather than datagrams.
fn is_stream(scheme: Scheme) -> bool {
    !matches!(scheme, Scheme::Coap | Scheme::Coaps)
}

/// The interface index of an IPv6 zone: a number, or an interface name.
fn zone_index(zone: &str) -> Option<u32> {
    if let Ok(n) = zone.parse() {
        return Some(n);
    }
    let name = std::ffi::CString::new(zone).ok()?;
    // SAFETY: a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}

/// A client's UDP socket for peers of `peer`'s address family, reporting ICMP errors
/// so that a request to a closed port fails at once ([`Error::Unreachable`]).
fn client_socket(peer: &SocketAddr) -> Result<std::net::UdpSocket> {
    let socket = bind_shard_sockets(any_for(peer), 1)?.remove(0);
    if let Err(e) = report_unreachable(&socket) {
        tracing::debug!(error = %e, "ICMP errors will not be reported");
    }
    Ok(socket)
}

async fn resolve(uri: &CoapUri) -> Result<SocketAddr> {
    if let Some(ip) = uri.ip() {
        let mut addr = SocketAddr::new(ip, uri.port);
        if let (SocketAddr::V6(a), Some(zone)) = (&mut addr, &uri.zone) {
            a.set_scope_id(zone_index(zone).ok_or_else(|| Error::Resolve {
                host: format!("{}%{zone}", uri.host),
                reason: format!("no network interface '{zone}'"),
            })?);
        }
        return Ok(addr);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clients_own_driver_verifies_no_addresses_and_keeps_the_rest() {
        let config = EndpointConfig {
            max_client_exchanges: 12_345,
            ..EndpointConfig::default()
        };
        assert!(config.amplification_factor > 0);
        let own = own_driver_config(&config);
        assert_eq!(own.amplification_factor, 0);
        assert_eq!(own.max_client_exchanges, 12_345);
        assert!(own.validate().is_ok());
    }
}

//! `coap+tcp://`, `coap+ws://` and their TLS forms `coaps+tcp://`, `coaps+ws://`: one
//! connection per virtual client carrying RFC 8323
//! messages, driven by cobalt-proto's sans-IO [`TcpConnection`] (CSM exchange, framing,
//! Ping/Pong, Release/Abort, token matching).
//!
//! Set-up connects, upgrades to a WebSocket for `coap+ws` (`GET /.well-known/coap`,
//! subprotocol `coap`) and waits for the server's CSM (RFC 8323 §5.3); the client's own
//! CSM goes first. Then each exchange is one request, matched to its response by the
//! token the connection assigns. A request unanswered by its deadline is cancelled (a
//! late response is dropped) and counts as lost; a connection that closes or aborts
//! counts as an error, and the client reconnects.
//!
//! The code is generic over the byte stream ([`Dial`]: plain TCP, or TLS over it for
//! `coaps+tcp://` and `coaps+ws://`) and over how messages ride on it ([`Carrier`]:
//! RFC 8323 §3 frames, or WebSocket messages).

use crate::session::{Outcome, Session};
use cobalt::transport::ws::client_upgrade;
use cobalt_proto::message::{decode, TcpMessage};
use cobalt_proto::tcp_connection::{Framing, TcpConfig, TcpConnection, TcpEvent};
use futures_util::{SinkExt, StreamExt};
use std::io;
use std::marker::PhantomData;
use std::net::SocketAddr;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Bytes, Message};
use tokio_tungstenite::WebSocketStream;

/// Bytes read at once from a stream.
const READ_CHUNK: usize = 16 * 1024;
/// The WebSocket read buffer: CoAP requests and their answers are small.
const READ_CHUNK_WS: usize = 4 * 1024;

/// Opens the byte stream under a connection.
pub(crate) trait Dial {
    /// The stream: TCP, or TLS over TCP.
    type Stream: AsyncRead + AsyncWrite + Unpin;
    /// Connects to `addr`.
    async fn dial(&self, addr: SocketAddr) -> io::Result<Self::Stream>;
}

/// A plain TCP connection (Nagle off).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlainTcp;

impl Dial for PlainTcp {
    type Stream = TcpStream;

    async fn dial(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(stream)
    }
}

/// TLS over a TCP connection (`coaps+tcp`, `coaps+ws`), with the library's client
/// context: the handshake is part of the set-up, like the CSM.
#[derive(Debug, Clone)]
pub(crate) struct Tls {
    /// The client context (credentials, ALPN).
    pub connector: cobalt::transport::tls::TlsConnector,
    /// The name the server's certificate must carry (the URI's host).
    pub host: String,
}

impl Dial for Tls {
    type Stream = cobalt::transport::tls::TlsStream<TcpStream>;

    async fn dial(&self, addr: SocketAddr) -> io::Result<Self::Stream> {
        let stream = PlainTcp.dial(addr).await?;
        self.connector.connect(stream, &self.host, addr).await
    }
}

/// How CoAP messages ride on a stream.
pub(crate) trait Carrier: Sized {
    /// The framing of the [`TcpConnection`] on this carrier.
    const FRAMING: Framing;
    /// The stream it runs on.
    type Stream;
    /// Starts the carrier on a fresh stream to `addr` (`host` as in the URI).
    async fn start(stream: Self::Stream, host: &str, addr: SocketAddr) -> Result<Self, String>;
    /// Writes one output of [`TcpConnection::poll_transmit`].
    async fn send(&mut self, data: Vec<u8>) -> io::Result<()>;
    /// The next bytes (a stream) or the payload of the next binary message (a
    /// WebSocket); `None` once the peer closed or the transport failed.
    async fn recv(&mut self) -> Option<&[u8]>;
    /// Closes the transport.
    async fn close(&mut self);
}

/// RFC 8323 §3 frames straight on the stream (`coap+tcp`).
pub(crate) struct Frames<S> {
    stream: S,
    buf: Vec<u8>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Carrier for Frames<S> {
    const FRAMING: Framing = Framing::Stream;
    type Stream = S;

    async fn start(stream: S, _host: &str, _addr: SocketAddr) -> Result<Self, String> {
        Ok(Frames {
            stream,
            buf: vec![0; READ_CHUNK],
        })
    }

    async fn send(&mut self, data: Vec<u8>) -> io::Result<()> {
        self.stream.write_all(&data).await
    }

    async fn recv(&mut self) -> Option<&[u8]> {
        match self.stream.read(&mut self.buf).await {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(&self.buf[..n]),
        }
    }

    async fn close(&mut self) {
        let _ = self.stream.shutdown().await;
    }
}

/// One CoAP message per binary WebSocket message (`coap+ws`, RFC 8323 §4).
pub(crate) struct WebSocket<S> {
    ws: WebSocketStream<S>,
    message: Bytes,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Carrier for WebSocket<S> {
    const FRAMING: Framing = Framing::WebSocket;
    type Stream = S;

    async fn start(stream: S, host: &str, addr: SocketAddr) -> Result<Self, String> {
        // tungstenite zero-fills its whole read buffer (128 KiB by default) before every
        // read: with many connections that memset dominated the generator's CPU.
        let config = WebSocketConfig::default().read_buffer_size(READ_CHUNK_WS);
        let ws = client_upgrade(stream, host, addr.port(), false, config)
            .await
            .map_err(|e| format!("{e} (is it a coap+ws server, e.g. cobalt serve --ws?)"))?;
        Ok(WebSocket {
            ws,
            message: Bytes::new(),
        })
    }

    async fn send(&mut self, data: Vec<u8>) -> io::Result<()> {
        self.ws
            .send(Message::Binary(data.into()))
            .await
            .map_err(io::Error::other)
    }

    async fn recv(&mut self) -> Option<&[u8]> {
        loop {
            match self.ws.next().await {
                Some(Ok(Message::Binary(b))) => {
                    self.message = b;
                    return Some(&self.message);
                }
                // Pings are answered by tungstenite; pongs and raw frames mean nothing here.
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                // Text (not allowed by RFC 8323 §4.4), Close, errors, end.
                _ => return None,
            }
        }
    }

    async fn close(&mut self) {
        let _ = self.ws.close(None).await;
    }
}

/// What every `coap+tcp` or `coap+ws` client of a step shares.
pub(crate) struct StreamSetup<D> {
    /// Opens the stream.
    pub dial: D,
    /// The server.
    pub target: SocketAddr,
    /// The URI's host.
    pub host: String,
    /// The URI's scheme, for messages.
    pub scheme: &'static str,
    /// The request (its token is assigned per request).
    pub request: TcpMessage,
}

impl<D> StreamSetup<D> {
    /// The request of a CoAP-over-UDP `template` (from [`crate::request_template`]) as an
    /// RFC 8323 message without token.
    pub fn new(
        dial: D,
        target: SocketAddr,
        host: &str,
        scheme: &'static str,
        template: &[u8],
    ) -> Result<StreamSetup<D>, String> {
        let m = decode(template).map_err(|e| format!("bad request template: {e:?}"))?;
        let mut request = TcpMessage::new(m.code);
        request.options = m.options;
        request.payload = m.payload;
        Ok(StreamSetup {
            dial,
            target,
            host: host.to_string(),
            scheme,
            request,
        })
    }
}

/// One virtual client: its connection.
pub(crate) struct StreamClient<D, C> {
    link: C,
    conn: TcpConnection,
    seed: u32,
    _dial: PhantomData<D>,
}

impl<D: Dial, C: Carrier<Stream = D::Stream>> StreamClient<D, C> {
    /// Connects, starts the carrier and exchanges CSMs, all before `deadline`.
    async fn connect(
        setup: &StreamSetup<D>,
        seed: u32,
        deadline: Instant,
    ) -> Result<(C, TcpConnection), String> {
        let (scheme, addr) = (setup.scheme, setup.target);
        let late = || format!("no {scheme} connection to {addr} before the set-up deadline");
        let stream = timeout_at(deadline, setup.dial.dial(addr))
            .await
            .map_err(|_| late())?
            .map_err(|e| {
                let flag = match (C::FRAMING, scheme.starts_with("coaps")) {
                    (Framing::Stream, false) => "--tcp",
                    (Framing::WebSocket, false) => "--ws",
                    (Framing::Stream, true) => "--tls",
                    (Framing::WebSocket, true) => "--tls --ws",
                };
                format!(
                    "cannot connect to {addr}: {e} (is a {scheme} server listening there, e.g. \
                     cobalt serve {flag}?)"
                )
            })?;
        let mut link = timeout_at(deadline, C::start(stream, &setup.host, addr))
            .await
            .map_err(|_| late())??;
        let config = TcpConfig {
            idle_timeout: None,
            ..TcpConfig::default()
        };
        let mut conn =
            TcpConnection::with_framing(config, C::FRAMING, std::time::Instant::now(), seed);
        let csm = async {
            while !conn.is_established() {
                while let Some(bytes) = conn.poll_transmit() {
                    link.send(bytes)
                        .await
                        .map_err(|e| format!("cannot write to {addr}: {e}"))?;
                }
                while let Some(ev) = conn.poll_event() {
                    if let TcpEvent::Closed { reason, .. } = ev {
                        return Err(format!("{scheme} connection to {addr} ended: {reason}"));
                    }
                }
                if conn.is_established() {
                    break;
                }
                match link.recv().await {
                    Some(data) => conn.handle_bytes(std::time::Instant::now(), data),
                    None => {
                        return Err(format!(
                            "the server at {addr} closed the {scheme} connection before \
                             sending its CSM"
                        ))
                    }
                }
            }
            Ok(())
        };
        timeout_at(deadline, csm).await.map_err(|_| {
            format!("the server at {addr} sent no CSM before the set-up deadline")
        })??;
        // Its settings are known; nothing else is expected before the first request.
        while conn.poll_event().is_some() {}
        Ok((link, conn))
    }

    /// Writes everything the connection has queued.
    async fn flush(&mut self) -> io::Result<()> {
        while let Some(bytes) = self.conn.poll_transmit() {
            self.link.send(bytes).await?;
        }
        Ok(())
    }
}

impl<D: Dial, C: Carrier<Stream = D::Stream>> Session for StreamClient<D, C> {
    type Setup = StreamSetup<D>;

    async fn open(setup: &StreamSetup<D>, seed: u64, deadline: Instant) -> Result<Self, String> {
        let seed = seed as u32;
        let (link, conn) = Self::connect(setup, seed, deadline).await?;
        Ok(StreamClient {
            link,
            conn,
            seed,
            _dial: PhantomData,
        })
    }

    async fn reopen(&mut self, setup: &StreamSetup<D>, deadline: Instant) -> Result<(), String> {
        self.seed = self.seed.wrapping_add(0x9E37_79B9);
        let (link, conn) = Self::connect(setup, self.seed, deadline).await?;
        self.link = link;
        self.conn = conn;
        Ok(())
    }

    async fn exchange(&mut self, setup: &StreamSetup<D>, deadline: Instant) -> Outcome {
        let now = std::time::Instant::now();
        let Ok(token) = self.conn.request(now, setup.request.clone()) else {
            return Outcome::Broken;
        };
        if self.flush().await.is_err() {
            return Outcome::Broken;
        }
        loop {
            let data = tokio::select! {
                d = self.link.recv() => d,
                _ = tokio::time::sleep_until(deadline) => {
                    self.conn.cancel(token);
                    return Outcome::Lost;
                }
            };
            match data {
                Some(bytes) => self.conn.handle_bytes(std::time::Instant::now(), bytes),
                None => {
                    self.conn.handle_eof();
                    return Outcome::Broken;
                }
            }
            // Pongs, or an Abort this side sends for a malformed message.
            let flushed = self.flush().await;
            let mut outcome = None;
            while let Some(ev) = self.conn.poll_event() {
                match ev {
                    TcpEvent::Response { token: t, message } if t == token => {
                        outcome = outcome.or(Some(Outcome::Answered(message.code.0)));
                    }
                    TcpEvent::Closed { .. } => outcome = Some(Outcome::Broken),
                    _ => {}
                }
            }
            match (outcome, flushed) {
                (Some(o), _) => return o,
                (None, Err(_)) => return Outcome::Broken,
                (None, Ok(())) => {}
            }
        }
    }

    async fn close(&mut self) {
        self.link.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_proto::message::{opt, Code};

    #[test]
    fn the_request_is_reframed_without_type_mid_or_token() {
        let t = crate::target::parse_uri("coap+tcp://h/a/b?x=1").unwrap();
        let template = crate::request_template(&t, Code::POST, true, Some("hi"));
        let addr = SocketAddr::from(([127, 0, 0, 1], 5683));
        let s = StreamSetup::new(PlainTcp, addr, "h", "coap+tcp", &template).unwrap();
        assert_eq!(s.request.code, Code::POST);
        assert!(s.request.token.is_empty());
        assert_eq!(s.request.options.uri_path_string(), "/a/b");
        assert_eq!(s.request.options.get(opt::URI_QUERY), Some(&b"x=1"[..]));
        assert_eq!(s.request.payload, b"hi");
        assert!(StreamSetup::new(PlainTcp, addr, "h", "coap+tcp", &[1, 2]).is_err());
    }
}

//! CoAP over WebSockets (RFC 8323 §4, `coap+ws://`): the HTTP/1.1 upgrade of the
//! server side, the client's upgrade, and the `Link` that carries one CoAP message
//! per binary WebSocket message.
//!
//! The connection loops are those of CoAP over TCP (the client's in [`super::tcp`], the
//! server's in the server's listener); only the transport differs. WebSocket framing (masking, control
//! frames, fragmentation, the frame size limit) is `tokio-tungstenite`'s; the server's
//! upgrade request is parsed here so that every refusal gets a proper HTTP status:
//!
//! * a path other than `/.well-known/coap` (RFC 8323 §4.2): 404;
//! * a method other than GET: 405;
//! * no `Sec-WebSocket-Protocol: coap` (RFC 8323 §4.1): 400;
//! * not a WebSocket upgrade, or a WebSocket version other than 13: 426;
//! * an unparseable request: 400; a request head over 8 KiB: 431;
//! * a request head not complete within
//!   [`TcpServerLimits::handshake_timeout`](super::limits::TcpServerLimits::handshake_timeout):
//!   the connection is closed (slowloris);
//! * over [`TcpServerLimits::max_connections`](super::limits::TcpServerLimits::max_connections): 503.
//!
//! WebSocket messages and frames above the connection's Max-Message-Size (plus the
//! 14 bytes of slack the TCP transport allows too) are refused from their header:
//! the connection is sent an Abort and closed with status 1009. A WebSocket message
//! whose bytes take longer than [`TcpConfig::frame_timeout`] to arrive, counted from
//! the first byte read after the previous complete message, ends the connection
//! (slowloris after the upgrade); a silent connection is left to the CSM and idle
//! timeouts of the CoAP layer.

use super::limits::TcpServerLimits;
use super::link::{Input, Link, Stream};
use cobalt_proto::tcp_connection::{Framing, TcpConfig};
use futures_util::{SinkExt, StreamExt};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest, Bytes, Message};
use tokio_tungstenite::WebSocketStream;

/// The path of CoAP over WebSockets (RFC 8323 §4.2).
pub const WELL_KNOWN_COAP: &str = "/.well-known/coap";

/// The WebSocket subprotocol of CoAP (RFC 8323 §4.1, §11.8).
pub const SUBPROTOCOL: &str = "coap";

/// Largest HTTP request head accepted for an upgrade.
const MAX_REQUEST_HEAD: usize = 8 * 1024;

/// Most header fields accepted in an upgrade request.
const MAX_HEADERS: usize = 64;

/// Slack above Max-Message-Size, as for TCP frames (framing header and token).
const SIZE_SLACK: usize = 14;

/// The WebSocket limits for a connection with these settings.
fn ws_config(config: &TcpConfig) -> WebSocketConfig {
    let limit = (config.max_message_size as usize).saturating_add(SIZE_SLACK);
    WebSocketConfig::default()
        .max_message_size(Some(limit))
        .max_frame_size(Some(limit))
        // tungstenite zero-fills its read buffer (128 KiB by default) before every
        // read; CoAP messages are small, so a small buffer saves that work per message.
        .read_buffer_size(READ_BUFFER)
}

/// The WebSocket read buffer (larger messages take several reads).
const READ_BUFFER: usize = 4 * 1024;

/// The TCP stream under a WebSocket, failing reads once a WebSocket message has been
/// arriving for longer than the frame timeout.
pub(crate) struct TimedStream<S> {
    stream: S,
    frame_timeout: Duration,
    /// Armed when the first byte after the last complete message is read.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> TimedStream<S> {
    fn new(stream: S, frame_timeout: Duration) -> TimedStream<S> {
        TimedStream {
            stream,
            frame_timeout,
            deadline: None,
        }
    }

    /// A whole message has arrived: the next byte starts a new one.
    fn message_complete(&mut self) {
        self.deadline = None;
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for TimedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(d) = self.deadline.as_mut() {
            if d.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "WebSocket message not completed in time",
                )));
            }
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(())))
            && buf.filled().len() > before
            && self.deadline.is_none()
        {
            let mut sleep = Box::pin(tokio::time::sleep(self.frame_timeout));
            // Registers the waker, so that a peer that stops sending is noticed too.
            let _ = sleep.as_mut().poll(cx);
            self.deadline = Some(sleep);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TimedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A WebSocket carrying CoAP messages.
pub(crate) struct WsLink<S> {
    ws: WebSocketStream<TimedStream<S>>,
    message: Bytes,
    /// The close status to send, when the peer broke the rules.
    close_code: Option<CloseCode>,
}

impl<S> WsLink<S> {
    fn new(ws: WebSocketStream<TimedStream<S>>) -> WsLink<S> {
        WsLink {
            ws,
            message: Bytes::new(),
            close_code: None,
        }
    }
}

impl<S: Stream> Link for WsLink<S> {
    const FRAMING: Framing = Framing::WebSocket;

    async fn recv(&mut self) -> Input<'_> {
        loop {
            let next = self.ws.next().await;
            if matches!(next, Some(Ok(_))) {
                self.ws.get_mut().message_complete();
            }
            match next {
                Some(Ok(Message::Binary(b))) => {
                    self.message = b;
                    return Input::Data(&self.message);
                }
                // Pings are answered by tungstenite; pongs and raw frames mean nothing here.
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
                // RFC 8323 §4.4: CoAP messages travel in binary messages only.
                Some(Ok(Message::Text(_))) => {
                    self.close_code = Some(CloseCode::Unsupported);
                    return Input::Closed;
                }
                Some(Ok(Message::Close(_))) | None => return Input::Closed,
                Some(Err(tungstenite::Error::Capacity(_))) => {
                    self.close_code = Some(CloseCode::Size);
                    return Input::TooLarge;
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "WebSocket error");
                    self.close_code = Some(CloseCode::Protocol);
                    return Input::Closed;
                }
            }
        }
    }

    async fn send(&mut self, data: Vec<u8>) -> io::Result<()> {
        self.ws
            .send(Message::Binary(data.into()))
            .await
            .map_err(io::Error::other)
    }

    async fn close(&mut self) {
        let frame = CloseFrame {
            code: self.close_code.unwrap_or(CloseCode::Normal),
            reason: "".into(),
        };
        let _ = self.ws.close(Some(frame)).await;
        let _ = self.ws.get_mut().stream.shutdown().await;
    }
}

// ---------------------------------------------------------------------------------
// Server side

/// Why an upgrade request is refused: the HTTP status and extra header lines.
#[derive(Debug)]
struct Refusal {
    status: &'static str,
    headers: &'static str,
    reason: &'static str,
}

impl Refusal {
    const fn new(status: &'static str, reason: &'static str) -> Refusal {
        Refusal {
            status,
            headers: "",
            reason,
        }
    }
}

/// The HTTP error response for a refusal (the connection is closed after it).
fn refusal_response(r: &Refusal) -> String {
    let body = format!("{}\n", r.reason);
    format!(
        "HTTP/1.1 {}\r\n{}Content-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        r.status,
        r.headers,
        body.len(),
        body
    )
}

/// Longest the server waits to write a refusal to a peer that does not read.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// Tells a connection over the limit that the server is busy, without waiting for it.
pub(crate) fn refuse(stream: TcpStream, reason: &'static str) {
    let r = Refusal {
        status: "503 Service Unavailable",
        headers: "Retry-After: 1\r\n",
        reason,
    };
    let _ = stream.try_write(refusal_response(&r).as_bytes());
}

/// Reads and answers the upgrade request of an accepted connection (plain or TLS);
/// `None` if it was refused, timed out or failed.
pub(crate) async fn accept<S: Stream>(
    mut stream: S,
    peer: SocketAddr,
    limits: &TcpServerLimits,
) -> Option<WsLink<S>> {
    let upgraded = tokio::time::timeout(limits.handshake_timeout, upgrade(&mut stream)).await;
    let tail = match upgraded {
        Ok(Ok(tail)) => tail,
        Ok(Err(Some(refusal))) => {
            tracing::debug!(%peer, reason = refusal.reason, "WebSocket upgrade refused");
            let response = refusal_response(&refusal);
            let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, async {
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
            })
            .await;
            return None;
        }
        Ok(Err(None)) => return None,
        Err(_) => {
            tracing::debug!(%peer, "WebSocket upgrade request not completed in time");
            return None;
        }
    };
    let ws = WebSocketStream::from_partially_read(
        TimedStream::new(stream, limits.connection.frame_timeout),
        tail,
        Role::Server,
        Some(ws_config(&limits.connection)),
    )
    .await;
    Some(WsLink::new(ws))
}

/// Reads the request head, validates it and writes the 101 response; returns what
/// followed the head. `Err(None)`: the peer went away.
async fn upgrade<S: Stream>(stream: &mut S) -> Result<Vec<u8>, Option<Refusal>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let room = MAX_REQUEST_HEAD - buf.len();
        if room == 0 {
            return Err(Some(Refusal::new(
                "431 Request Header Fields Too Large",
                "request head too large",
            )));
        }
        let want = room.min(chunk.len());
        let n = match stream.read(&mut chunk[..want]).await {
            Ok(0) | Err(_) => return Err(None),
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&buf) {
            Ok(httparse::Status::Partial) => continue,
            Ok(httparse::Status::Complete(len)) => {
                let key = check_request(&request).map_err(Some)?;
                let response = format!(
                    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\nSec-WebSocket-Protocol: {SUBPROTOCOL}\r\n\r\n",
                    derive_accept_key(key.as_bytes())
                );
                stream
                    .write_all(response.as_bytes())
                    .await
                    .map_err(|_| None)?;
                return Ok(buf[len..].to_vec());
            }
            Err(httparse::Error::TooManyHeaders) => {
                return Err(Some(Refusal::new(
                    "431 Request Header Fields Too Large",
                    "too many header fields",
                )))
            }
            Err(_) => return Err(Some(Refusal::new("400 Bad Request", "malformed request"))),
        }
    }
}

/// The header fields of `request` named `name`, their values split at commas.
fn tokens<'a>(
    request: &'a httparse::Request<'_, '_>,
    name: &'a str,
) -> impl Iterator<Item = &'a str> + 'a {
    request
        .headers
        .iter()
        .filter(move |h| h.name.eq_ignore_ascii_case(name))
        .filter_map(|h| std::str::from_utf8(h.value).ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// Checks an upgrade request (RFC 6455 §4.2.1, RFC 8323 §4); returns its
/// Sec-WebSocket-Key.
fn check_request(request: &httparse::Request<'_, '_>) -> Result<String, Refusal> {
    if request.method != Some("GET") {
        return Err(Refusal {
            status: "405 Method Not Allowed",
            headers: "Allow: GET\r\n",
            reason: "only GET upgrades to a WebSocket",
        });
    }
    if request.version != Some(1) {
        return Err(Refusal::new("400 Bad Request", "HTTP/1.1 required"));
    }
    let path = request.path.unwrap_or("");
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    if path != WELL_KNOWN_COAP {
        return Err(Refusal::new(
            "404 Not Found",
            "CoAP over WebSockets is served at /.well-known/coap",
        ));
    }
    let is_upgrade = tokens(request, "upgrade").any(|t| t.eq_ignore_ascii_case("websocket"))
        && tokens(request, "connection").any(|t| t.eq_ignore_ascii_case("upgrade"));
    if !is_upgrade {
        return Err(Refusal {
            status: "426 Upgrade Required",
            headers: "Upgrade: websocket\r\nConnection: Upgrade\r\n",
            reason: "a WebSocket upgrade is required",
        });
    }
    if !tokens(request, "sec-websocket-version").any(|t| t == "13") {
        return Err(Refusal {
            status: "426 Upgrade Required",
            headers: "Sec-WebSocket-Version: 13\r\n",
            reason: "WebSocket version 13 required",
        });
    }
    if !tokens(request, "sec-websocket-protocol").any(|t| t == SUBPROTOCOL) {
        return Err(Refusal::new(
            "400 Bad Request",
            "subprotocol coap required (Sec-WebSocket-Protocol: coap)",
        ));
    }
    let mut keys = request
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("sec-websocket-key"));
    match (keys.next(), keys.next()) {
        // A base64-encoded 16-byte nonce is 24 characters.
        (Some(k), None) if k.value.len() == 24 && k.value.is_ascii() => {
            Ok(String::from_utf8_lossy(k.value).into_owned())
        }
        _ => Err(Refusal::new("400 Bad Request", "bad Sec-WebSocket-Key")),
    }
}

// ---------------------------------------------------------------------------------
// Client side

/// Upgrades a connection to `peer` (plain TCP, or TLS when `secure`) to a WebSocket
/// with subprotocol `coap` on `/.well-known/coap`, naming `host` in the Host header,
/// and returns the link.
pub(crate) async fn connect<S: Stream>(
    stream: S,
    peer: SocketAddr,
    host: &str,
    config: &TcpConfig,
    secure: bool,
) -> io::Result<WsLink<S>> {
    let stream = TimedStream::new(stream, config.frame_timeout);
    let ws = client_upgrade(stream, host, peer.port(), secure, ws_config(config)).await?;
    Ok(WsLink::new(ws))
}

/// The client side of the CoAP-over-WebSockets handshake (RFC 8323 §4) on a connected
/// stream (plain TCP, or TLS when `secure`): an HTTP/1.1 upgrade of
/// `/.well-known/coap` at `host`:`port` with subprotocol `coap`. Fails, saying why,
/// unless the server upgrades and agrees to the subprotocol.
pub async fn client_upgrade<S>(
    stream: S,
    host: &str,
    port: u16,
    secure: bool,
    config: WebSocketConfig,
) -> io::Result<WebSocketStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let scheme = if secure { "wss" } else { "ws" };
    let uri = format!("{scheme}://{host}:{port}{WELL_KNOWN_COAP}");
    let mut request = uri.as_str().into_client_request().map_err(|e| {
        io::Error::other(format!("cannot build the WebSocket upgrade for {uri}: {e}"))
    })?;
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        HeaderValue::from_static(SUBPROTOCOL),
    );
    let (ws, response) = tokio_tungstenite::client_async_with_config(request, stream, Some(config))
        .await
        .map_err(|e| io::Error::other(format!("WebSocket upgrade at {uri} failed: {e}")))?;
    let agreed = response
        .headers()
        .get("Sec-WebSocket-Protocol")
        .is_some_and(|v| v.as_bytes() == SUBPROTOCOL.as_bytes());
    if !agreed {
        return Err(io::Error::other(format!(
            "the WebSocket server at {uri} did not agree to subprotocol {SUBPROTOCOL}"
        )));
    }
    Ok(ws)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(raw: &str) -> Result<String, &'static str> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut headers);
        assert!(request.parse(raw.as_bytes()).unwrap().is_complete());
        check_request(&request).map_err(|r| r.status)
    }

    const GOOD: &str = "GET /.well-known/coap HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: chat, coap\r\n\r\n";

    #[test]
    fn accepts_a_coap_upgrade() {
        assert_eq!(check(GOOD).as_deref(), Ok("dGhlIHNhbXBsZSBub25jZQ=="));
        // RFC 6455's example key and accept value.
        assert_eq!(
            derive_accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn refusals() {
        assert_eq!(
            check(&GOOD.replace("GET", "POST")),
            Err("405 Method Not Allowed")
        );
        assert_eq!(
            check(&GOOD.replace("HTTP/1.1", "HTTP/1.0")),
            Err("400 Bad Request")
        );
        assert_eq!(
            check(&GOOD.replace("/.well-known/coap", "/")),
            Err("404 Not Found")
        );
        assert_eq!(
            check(&GOOD.replace("chat, coap", "chat")),
            Err("400 Bad Request")
        );
        assert_eq!(
            check(&GOOD.replace("Sec-WebSocket-Protocol: chat, coap\r\n", "")),
            Err("400 Bad Request")
        );
        assert_eq!(
            check(&GOOD.replace("websocket", "h2c")),
            Err("426 Upgrade Required")
        );
        assert_eq!(
            check(&GOOD.replace(": 13", ": 8")),
            Err("426 Upgrade Required")
        );
        assert_eq!(
            check(&GOOD.replace("dGhlIHNhbXBsZSBub25jZQ==", "short")),
            Err("400 Bad Request")
        );
        // A query does not change the path.
        assert!(check(&GOOD.replace("/.well-known/coap", "/.well-known/coap?x")).is_ok());
    }
}

//! The transport under one CoAP-over-TCP or CoAP-over-WebSockets connection, as the
//! connection loops see it: a [`Link`] that yields input and takes output.

use cobalt_proto::tcp_connection::{Framing, TcpConnection};
use std::future::Future;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Size of the buffer each connection reads into.
const READ_CHUNK: usize = 16 * 1024;

/// What a [`Link`] received.
pub(crate) enum Input<'a> {
    /// Bytes from the stream, or the payload of one binary WebSocket message.
    Data(&'a [u8]),
    /// The peer sent a WebSocket message above the size limit (not read).
    TooLarge,
    /// The peer closed the transport, or it failed.
    Closed,
}

/// The transport under one connection, as the connection loops see it: a byte stream
/// (`coap+tcp`) or a WebSocket (`coap+ws`).
pub(crate) trait Link: Send {
    /// The framing the `TcpConnection` on this transport uses.
    const FRAMING: Framing;
    /// Waits for the next input; cancel-safe.
    fn recv(&mut self) -> impl Future<Output = Input<'_>> + Send;
    /// Writes one output of `TcpConnection::poll_transmit`.
    fn send(&mut self, data: Vec<u8>) -> impl Future<Output = std::io::Result<()>> + Send;
    /// Closes the transport after the connection's last message.
    fn close(&mut self) -> impl Future<Output = ()> + Send;
}

/// A byte stream a connection runs over: a TCP stream, or TLS over one.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for S {}

/// A byte stream (plain TCP or TLS) carrying `coap+tcp` frames.
pub(crate) struct TcpLink<S> {
    stream: S,
    buf: Vec<u8>,
}

impl<S: Stream> TcpLink<S> {
    pub(crate) fn new(stream: S) -> TcpLink<S> {
        TcpLink {
            stream,
            buf: vec![0u8; READ_CHUNK],
        }
    }
}

impl<S: Stream> Link for TcpLink<S> {
    const FRAMING: Framing = Framing::Stream;

    async fn recv(&mut self) -> Input<'_> {
        match self.stream.read(&mut self.buf).await {
            Ok(0) | Err(_) => Input::Closed,
            Ok(n) => Input::Data(&self.buf[..n]),
        }
    }

    async fn send(&mut self, data: Vec<u8>) -> std::io::Result<()> {
        self.stream.write_all(&data).await
    }

    async fn close(&mut self) {
        let _ = self.stream.shutdown().await;
    }
}

/// Feeds one [`Input`] to the connection.
pub(crate) fn handle_input(conn: &mut TcpConnection, input: Input<'_>) {
    match input {
        Input::Data(bytes) => conn.handle_bytes(Instant::now(), bytes),
        Input::TooLarge => conn.abort(None, "message exceeds Max-Message-Size"),
        Input::Closed => conn.handle_eof(),
    }
}

/// Writes everything the connection has queued (showing each output to `trace`);
/// false if the transport failed or the peer did not read for `write_timeout`.
pub(crate) async fn flush<L: Link>(
    conn: &mut TcpConnection,
    link: &mut L,
    write_timeout: Duration,
    trace: impl Fn(&[u8]),
) -> bool {
    while let Some(bytes) = conn.poll_transmit() {
        trace(&bytes);
        match tokio::time::timeout(write_timeout, link.send(bytes)).await {
            Ok(Ok(())) => {}
            _ => return false,
        }
    }
    true
}

/// Sleeps until `at`, or forever without one.
pub(crate) async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

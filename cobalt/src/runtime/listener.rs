//! The connection-oriented listeners (`coap+tcp`, `coaps+tcp`, `coap+ws`, `coaps+ws`,
//! RFC 8323) and the stream driver: one task per accepted connection, where the
//! sans-IO `TcpConnection` of `cobalt-proto` runs over a
//! [`Link`](crate::transport::link::Link), and a [`Service`] made for the connection
//! (the server role: handlers, uploads, observe relations) answers its requests through
//! the connection's protocol [`Session`]. The driver knows nothing of resources; the
//! service nothing of sockets.

use super::service::Service;
use crate::metrics::TcpCounters;
use crate::transport::identity::Credential;
use crate::transport::limits::TcpServerLimits;
use crate::transport::link::{flush, handle_input, sleep_until, Link, Stream, TcpLink};
use crate::transport::per_ip::{IpBudget, IpPermit};
use crate::transport::tls::TlsAcceptor;
use cobalt_proto::session::stream::Connection;
use cobalt_proto::session::{Session, SessionEvent};
use cobalt_proto::tcp_connection::{CloseReason, Framing, TcpConfig, TcpConnection, TcpEvent};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;

/// A running TCP listener of a server.
#[derive(Debug)]
pub(crate) struct TcpListenerHandle {
    pub(crate) local_addr: SocketAddr,
    pub(crate) counters: Arc<TcpCounters>,
    shutdown: watch::Sender<Option<Duration>>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpListenerHandle {
    /// Stops accepting; connections finish their handlers for up to `grace`, then
    /// send Release and close.
    pub(crate) fn shutdown(&self, grace: Duration) {
        let _ = self.shutdown.send(Some(grace));
    }

    /// Waits until the listener and all its connections have stopped.
    pub(crate) async fn wait(self) {
        let _ = self.task.await;
    }
}

/// Counts a connection's close under its reason, where the reason has a counter.
fn count_close(counters: &TcpCounters, reason: &CloseReason) {
    let counter = match reason {
        CloseReason::LocalAbort(_) => &counters.protocol_errors,
        CloseReason::CsmTimeout | CloseReason::FrameTimeout | CloseReason::KeepaliveTimeout => {
            &counters.timeouts
        }
        CloseReason::IdleTimeout => &counters.idle_closed,
        _ => return,
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What a listener serves: the framing, and whether TLS runs under it.
#[derive(Debug, Clone)]
pub(crate) struct Transport {
    /// Stream framing (`coap+tcp`) or WebSocket messages (`coap+ws`).
    pub framing: Framing,
    /// TLS under the framing (`coaps+tcp`, `coaps+ws`).
    pub tls: Option<TlsAcceptor>,
}

/// Binds `addr` and serves over `coap+tcp` (stream framing) or `coap+ws` (WebSocket
/// framing, after an HTTP upgrade), with TLS under either when `transport.tls` is set,
/// on the current tokio runtime. Each connection gets the service `make(peer, done)`
/// makes, `done` taking its work finished off the connection's task; the listener
/// counts what it sees in `counters`.
pub(crate) async fn listen<S: Service<Connection> + Send>(
    addr: SocketAddr,
    make: impl Fn(SocketAddr, mpsc::UnboundedSender<S::Completion>) -> S + Send + 'static,
    tcp: TcpServerLimits,
    transport: Transport,
    counters: Arc<TcpCounters>,
) -> std::io::Result<TcpListenerHandle> {
    let framing = transport.framing;
    let listener = TcpListener::bind(addr).await?;
    let local_addr = listener.local_addr()?;
    let (shutdown, mut stop) = watch::channel(None);
    let seen = counters.clone();
    let task = tokio::spawn(async move {
        let permits = Arc::new(Semaphore::new(tcp.max_connections.max(1)));
        let per_ip = IpBudget::new(tcp.max_connections_per_ip.max(1));
        let handshakes_per_ip = IpBudget::new(tcp.max_handshakes_per_ip.max(1));
        // TLS handshakes and WebSocket upgrades come before CoAP.
        let handshaking = transport.tls.is_some() || framing == Framing::WebSocket;
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(x) => x,
                        Err(e) => {
                            // EMFILE and the like: back off instead of spinning.
                            tracing::warn!(error = %e, "TCP accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let _ = stream.set_nodelay(true);
                    let ip_permits = per_ip.try_acquire(peer.ip()).and_then(|conn| {
                        if !handshaking {
                            return Some((conn, None));
                        }
                        handshakes_per_ip.try_acquire(peer.ip()).map(|h| (conn, Some(h)))
                    });
                    let Some((ip_permit, handshake)) = ip_permits else {
                        seen.refused_per_ip.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(%peer, "connection refused: too many from this address");
                        refuse_connection(stream, &transport, &tcp, "too many connections from this address");
                        continue;
                    };
                    let Ok(permit) = permits.clone().try_acquire_owned() else {
                        seen.refused.fetch_add(1, Ordering::Relaxed);
                        refuse_connection(stream, &transport, &tcp, "too many connections");
                        continue;
                    };
                    seen.accepted.fetch_add(1, Ordering::Relaxed);
                    seen.open.fetch_add(1, Ordering::Relaxed);
                    let (done, completions) = mpsc::unbounded_channel();
                    let conn = ServerConn {
                        counters: seen.clone(),
                        peer,
                        service: make(peer, done),
                        completions,
                        tcp: tcp.clone(),
                        stop: stop.clone(),
                        handshake,
                        credential: None,
                    };
                    let tls = transport.tls.clone();
                    let counters = seen.clone();
                    conns.spawn(async move {
                        conn.serve(stream, framing, tls).await;
                        counters.open.fetch_sub(1, Ordering::Relaxed);
                        drop((permit, ip_permit));
                    });
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                _ = stop.changed() => break,
            }
        }
        drop(listener);
        while conns.join_next().await.is_some() {}
    });
    Ok(TcpListenerHandle {
        local_addr,
        counters,
        shutdown,
        task,
    })
}

/// Closes a connection over a limit, saying why where the transport can say anything:
/// an Abort over TCP, a 503 over WebSockets; over TLS nothing can be said before a
/// handshake.
fn refuse_connection(
    stream: TcpStream,
    transport: &Transport,
    tcp: &TcpServerLimits,
    why: &'static str,
) {
    match (transport.framing, &transport.tls) {
        (_, Some(_)) => {}
        (Framing::Stream, None) => refuse(stream, &tcp.connection, why),
        (Framing::WebSocket, None) => crate::transport::ws::refuse(stream, why),
    }
}

/// Tells a connection over the limit why it is closed, without waiting for it.
fn refuse(stream: TcpStream, config: &TcpConfig, why: &str) {
    let mut conn = TcpConnection::new(config.clone(), Instant::now());
    conn.abort(None, why);
    if let Some(bytes) = conn.poll_transmit() {
        let _ = stream.try_write(&bytes);
    }
}

/// One accepted connection, before and while it speaks CoAP.
struct ServerConn<S: Service<Connection>> {
    counters: Arc<TcpCounters>,
    peer: SocketAddr,
    /// What answers the connection's requests.
    service: S,
    /// The service's work finished off the connection's task.
    completions: mpsc::UnboundedReceiver<S::Completion>,
    tcp: TcpServerLimits,
    stop: watch::Receiver<Option<Duration>>,
    /// The address's place among handshakes in progress (TLS, WebSocket upgrade),
    /// given back once the connection speaks CoAP.
    handshake: Option<IpPermit>,
    /// What the peer proved in its TLS handshake (PSK identity, verified certificate).
    credential: Option<Arc<Credential>>,
}

impl<S: Service<Connection> + Send> ServerConn<S> {
    /// Runs the TLS handshake (if any) and the WebSocket upgrade (if any), then the
    /// connection.
    async fn serve(mut self, stream: TcpStream, framing: Framing, tls: Option<TlsAcceptor>) {
        let Some(tls) = tls else {
            return self.serve_over(stream, framing).await;
        };
        match tokio::time::timeout(self.tcp.handshake_timeout, tls.accept(stream)).await {
            Ok(Ok(stream)) => {
                self.credential = crate::transport::tls::peer_credential(&stream);
                if framing == Framing::Stream {
                    self.handshake = None;
                }
                self.serve_over(stream, framing).await
            }
            Ok(Err(e)) => {
                self.counters
                    .handshake_failures
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(peer = %self.peer, error = %e, "TLS handshake failed");
            }
            Err(_) => {
                self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(peer = %self.peer, "TLS handshake not completed in time");
            }
        }
    }

    async fn serve_over<T: Stream>(mut self, stream: T, framing: Framing) {
        match framing {
            Framing::Stream => self.run(TcpLink::new(stream)).await,
            Framing::WebSocket => {
                match crate::transport::ws::accept(stream, self.peer, &self.tcp).await {
                    Some(link) => {
                        self.handshake = None;
                        self.run(link).await
                    }
                    None => {
                        self.counters
                            .handshake_failures
                            .fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    async fn run<L: Link>(mut self, mut link: L) {
        let conn = TcpConnection::with_framing(
            self.tcp.connection.clone(),
            L::FRAMING,
            Instant::now(),
            rand::random(),
        );
        let mut session = Connection::new(self.peer, conn);
        let server = &mut self.service;
        let changes = server.changes();
        // The service's relations counted in the listener's gauge.
        let mut counted = 0;
        let mut drain_until: Option<tokio::time::Instant> = None;
        if self.stop.borrow().is_some() {
            drain_until = Some(tokio::time::Instant::now());
        }
        loop {
            // Events first: they may queue responses.
            while let Some(ev) = session.poll_event() {
                match ev {
                    SessionEvent::Request { id, peer, request } => {
                        let credential = self.credential.as_ref();
                        server.on_request(
                            &mut session,
                            Instant::now(),
                            id,
                            peer,
                            credential,
                            request,
                        )
                    }
                    SessionEvent::Connection {
                        event: TcpEvent::Closed { reason, .. },
                        ..
                    } => {
                        count_close(&self.counters, &reason);
                        tracing::debug!(peer = %self.peer, %reason, framing = ?L::FRAMING, relations = server.observer_count(), "connection closed");
                    }
                    other => server.on_event(other),
                }
            }
            if !session.connection().is_closed() && server.has_work() {
                server.step(&mut session, Instant::now());
            }
            counted = count_relations(&self.counters, counted, server.observer_count());
            let conn = session.connection_mut();
            if !flush(conn, &mut link, self.tcp.write_timeout, |_| {}).await || conn.is_closed() {
                break;
            }
            if let Some(until) = drain_until {
                if !server.busy() || tokio::time::Instant::now() >= until {
                    conn.release();
                    let _ = flush(conn, &mut link, self.tcp.write_timeout, |_| {}).await;
                    break;
                }
            }
            let timer = [conn.poll_timeout(), server.poll_timeout()]
                .into_iter()
                .flatten()
                .min()
                .map(tokio::time::Instant::from_std)
                .into_iter()
                .chain(drain_until)
                .min();
            let more = server.has_work();
            tokio::select! {
                input = link.recv(), if drain_until.is_none() => handle_input(session.connection_mut(), input),
                Some(done) = self.completions.recv() => {
                    server.on_completion(&mut session, Instant::now(), done);
                }
                // The inbox keeps the wake-up of a change posted meanwhile.
                _ = changes.changed() => server.take_changes(),
                _ = std::future::ready(()), if more => {}
                _ = sleep_until(timer) => {
                    let now = Instant::now();
                    session.connection_mut().handle_timeout(now);
                    server.handle_timeout(now);
                }
                _ = self.stop.changed(), if drain_until.is_none() => {
                    let grace = self.stop.borrow().unwrap_or_default();
                    drain_until = Some(tokio::time::Instant::now() + grace);
                }
            }
        }
        // Dropping the service ends the connection's relations and uploads.
        count_relations(&self.counters, counted, 0);
        drop(self.service);
        let _ = tokio::time::timeout(self.tcp.write_timeout, link.close()).await;
    }
}

/// Moves the listener's gauge of relations from `counted` of a connection's to `now`;
/// returns `now`.
fn count_relations(counters: &TcpCounters, counted: usize, now: usize) -> usize {
    let gauge = &counters.observers;
    if now > counted {
        gauge.fetch_add((now - counted) as u64, Ordering::Relaxed);
    } else if now < counted {
        gauge.fetch_sub((counted - now) as u64, Ordering::Relaxed);
    }
    now
}

//! The connection-oriented listeners (`coap+tcp`, `coaps+tcp`, `coap+ws`, `coaps+ws`,
//! RFC 8323) and the stream driver: one task per accepted connection, where the
//! sans-IO `TcpConnection` of `cobalt-proto` runs over a
//! [`Link`](crate::transport::link::Link), and a [`Service`] made for the connection
//! (the server role: handlers, uploads, observe relations) answers its requests through
//! the connection's protocol [`Session`]. The driver knows nothing of resources; the
//! service nothing of sockets.
//!
//! A listener holds `max_connections` connections, at most `max_connections_per_ip` of
//! them from one address (see [`TcpServerLimits`]). When it is full, a connection from
//! an address holding fewer than the most-represented one takes the place of that
//! address's connection heard from least recently, which is sent an Abort (7.05) saying
//! why where the transport allows (after the TLS handshake and the WebSocket upgrade)
//! and closed ([`holders`]): a few addresses holding idle connections cannot lock the
//! others out.

mod holders;

use super::service::Service;
use crate::metrics::TcpCounters;
use crate::transport::identity::Credential;
use crate::transport::limits::TcpServerLimits;
use crate::transport::link::{flush, handle_input, sleep_until, Link, Stream, TcpLink};
use crate::transport::per_ip::{IpBudget, IpPermit};
use crate::transport::tls::TlsAcceptor;
use cobalt_proto::address::AddressPrefix;
use cobalt_proto::session::stream::Connection;
use cobalt_proto::session::{Session, SessionEvent};
use cobalt_proto::tcp_connection::{CloseReason, Framing, TcpConfig, TcpConnection, TcpEvent};
use holders::{Holders, Place, Refusal};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
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
    /// How the per-address budgets count IPv6 peers (`ipv6_budget_prefix`).
    pub address_prefix: AddressPrefix,
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
        let mut holders = Holders::new(
            tcp.max_connections,
            tcp.max_connections_per_ip,
            transport.address_prefix,
            Instant::now(),
        );
        let handshakes_per_ip =
            IpBudget::new(tcp.max_handshakes_per_ip.max(1), transport.address_prefix);
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
                    let handshake = match handshaking.then(|| handshakes_per_ip.try_acquire(peer.ip())) {
                        None => None,
                        Some(Some(permit)) => Some(permit),
                        Some(None) => {
                            seen.refused_per_ip.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(%peer, "connection refused: too many handshakes from this address");
                            refuse_connection(stream, &transport, &tcp, "too many handshakes from this address");
                            continue;
                        }
                    };
                    let (seat, place) = match holders.admit(peer.ip(), Instant::now()) {
                        Ok(admitted) => admitted,
                        Err(Refusal::AddressBudget) => {
                            seen.refused_per_ip.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(%peer, "connection refused: too many from this address");
                            refuse_connection(stream, &transport, &tcp, "too many connections from this address");
                            continue;
                        }
                        Err(Refusal::Full) => {
                            seen.refused.fetch_add(1, Ordering::Relaxed);
                            refuse_connection(stream, &transport, &tcp, "too many connections");
                            continue;
                        }
                    };
                    if seat.evicted {
                        seen.evicted.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(%peer, "listener full: the idlest connection of the address holding the most evicted");
                    }
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
                        place,
                        credential: None,
                    };
                    let tls = transport.tls.clone();
                    let counters = seen.clone();
                    let task = conns.spawn(async move {
                        conn.serve(stream, framing, tls).await;
                        counters.open.fetch_sub(1, Ordering::Relaxed);
                    });
                    holders.hold(task.id(), seat);
                }
                Some(ended) = conns.join_next_with_id(), if !conns.is_empty() => {
                    holders.release(match ended {
                        Ok((id, ())) => id,
                        Err(e) => e.id(),
                    });
                }
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
    /// The connection's place in the listener: told when it is evicted, stamped when a
    /// message arrives.
    place: Place,
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
        let handshake = tokio::time::timeout(self.tcp.handshake_timeout, tls.accept(stream));
        let accepted = tokio::select! {
            accepted = handshake => accepted,
            // Nothing can be said before the handshake: the connection just closes.
            _ = &mut self.place.eviction => return,
        };
        match accepted {
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
                let upgrade = crate::transport::ws::accept(stream, self.peer, &self.tcp);
                let upgraded = tokio::select! {
                    upgraded = upgrade => upgraded,
                    // Evicted before the upgrade completed: closed without a word.
                    _ = &mut self.place.eviction => return,
                };
                match upgraded {
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
        let last_heard = self.place.last_heard.clone();
        let mut evicted = false;
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
                input = link.recv(), if drain_until.is_none() => {
                    last_heard.stamp(Instant::now());
                    handle_input(session.connection_mut(), input);
                }
                _ = &mut self.place.eviction => {
                    tracing::debug!(peer = %self.peer, "connection evicted to make room for another address");
                    let conn = session.connection_mut();
                    conn.abort(None, EVICTED);
                    let _ = flush(conn, &mut link, EVICTED_WRITE_TIMEOUT, |_| {}).await;
                    evicted = true;
                    break;
                }
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
        let closing = if evicted {
            EVICTED_WRITE_TIMEOUT
        } else {
            self.tcp.write_timeout
        };
        let _ = tokio::time::timeout(closing, link.close()).await;
    }
}

/// The diagnostic of the Abort an evicted connection is sent.
const EVICTED: &str =
    "evicted: the server is full and this address holds the most connections; reconnect later";

/// How long an evicted connection may take to be sent its Abort: its place is already
/// another's, so it does not get the full `write_timeout`.
const EVICTED_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

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

//! One shard: a thread with a current-thread tokio runtime that owns a UDP socket and
//! an [`Endpoint`]. Datagrams go socket → endpoint → inline handler → endpoint →
//! socket without changing threads; only handlers that are not ready on their first
//! poll become tasks (on the same thread), whose responses come back via a queue.

use crate::changes::ChangeInbox;
use crate::error::Unsupported;
use crate::metrics::{ShardLink, ShardMetrics, ShardSnapshot};
use crate::runtime::command::Command;
use crate::runtime::exchanges::{ExchangeErrors, Exchanges};
use crate::runtime::io::{self, Inbound, Input, ShardIo};
use crate::runtime::service::{MakeService, Service, ServiceLinks};
use crate::trace::Tracer;
use crate::transport::dtls::{AddressUpdate, DtlsBackend, DtlsEvent};
use crate::transport::{mmsg, udp};
use crate::Error;
use cobalt_proto::endpoint::{Endpoint, EndpointConfig, Event};
use cobalt_proto::message::{Code, Message, MessageType};
use cobalt_proto::session::{Failure, SessionError, SessionEvent};
use cobalt_proto::tcp_connection::CloseReason;
use cobalt_proto::uri::Scheme;
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Receive batches per wake-up before timers and commands get a turn.
const RECV_ROUNDS: usize = 4;

/// How often a server shard publishes its metrics unasked (readers ask for fresh
/// values, see [`ShardMetrics`]; this keeps the debug log of malformed datagrams and
/// rejections going). Checked on the turns the shard takes anyway: an idle shard
/// does not wake for it.
const METRICS_EVERY: Duration = Duration::from_secs(1);

/// The nearest deadline a shard waits for in a blocking receive. A receive timeout
/// runs in the kernel's ticks (4–10 ms), so a shard whose timers fall due in quick
/// succession (a thousand uploads idling out a few microseconds apart) would pay a
/// tick for each; nearer deadlines are waited for in the poller, whose timers fire
/// everything due to the millisecond.
const BLOCKING_WAIT_MIN: Duration = Duration::from_millis(20);

/// Whether a shard may block in its socket's receive until `deadline` (`None`: no
/// timer pending): only when that is at least [`BLOCKING_WAIT_MIN`] away.
fn may_block_until(now: Instant, deadline: Option<Instant>) -> bool {
    deadline.is_none_or(|d| d.saturating_duration_since(now) >= BLOCKING_WAIT_MIN)
}

/// A shard: its socket, its endpoint and, for a server, the [`Service`] it runs.
pub(crate) struct Driver<S: Service<Endpoint>> {
    tracer: Option<Tracer>,
    io: ShardIo,
    endpoint: Endpoint,
    server: Option<S>,
    commands: mpsc::UnboundedReceiver<Command>,
    completions: mpsc::UnboundedReceiver<S::Completion>,
    /// The client requests and observations in flight.
    exchanges: Exchanges<DatagramErrors>,
    draining: Option<Instant>,
    outbox: Vec<cobalt_proto::endpoint::Transmit>,
    /// Receive batches per wake-up (from `runtime.recv_batch`).
    recv_rounds: usize,
    /// Where this shard publishes its counters when asked (servers only).
    metrics: Option<Arc<ShardMetrics>>,
    /// When the shard next publishes its counters unasked ([`METRICS_EVERY`]).
    metrics_due: Option<Instant>,
    /// CoAP over DTLS (`coaps`): every datagram passes through this session table.
    dtls: Option<Box<dyn DtlsBackend>>,
    /// The peers of the datagrams of the batch just handled.
    heard: Vec<SocketAddr>,
    /// DTLS sessions the batch just handled moved to a new address (the endpoint's
    /// state has moved; the server's moves after the batch).
    moved: Vec<AddressUpdate>,
    /// The shard's runtime: while it has tasks, the shard waits in its poller.
    runtime: tokio::runtime::RuntimeMetrics,
}

/// What a shard waiting in a blocking receive on its socket found in its queues.
enum Queued<C> {
    Command(Option<Command>),
    Completion(C),
    Changed,
}

impl<S: Service<Endpoint>> Driver<S> {
    pub(crate) fn new(
        io: ShardIo,
        config: EndpointConfig,
        server: Option<(
            MakeService<S, Endpoint>,
            mpsc::UnboundedSender<Command>,
            bool,
        )>,
        commands: mpsc::UnboundedReceiver<Command>,
    ) -> Driver<S> {
        let (done, completions) = mpsc::unbounded_channel();
        Driver {
            tracer: None,
            io,
            endpoint: Endpoint::new(config, Instant::now()),
            server: server.map(|(make, commands, v6)| make(ServiceLinks { done, commands, v6 })),
            commands,
            completions,
            exchanges: Exchanges::new(DatagramErrors),
            draining: None,
            outbox: Vec::new(),
            recv_rounds: RECV_ROUNDS,
            metrics: None,
            metrics_due: None,
            dtls: None,
            heard: Vec::new(),
            moved: Vec::new(),
            runtime: tokio::runtime::Handle::current().metrics(),
        }
    }

    /// Runs until shut down (server) or until every client handle is gone (client).
    pub(crate) async fn run(mut self) {
        let mut commands_open = true;
        let mut inputs_open = true;
        let mut timer = Wakeup::new(Instant::now());
        loop {
            self.process_events();
            self.flush().await;
            if let Some(deadline) = self.draining {
                let busy = self.endpoint.state_counts().server_exchanges > 0;
                if busy && Instant::now() >= deadline {
                    // The grace period is over: what the handlers did not answer gets
                    // 5.03 rather than nothing (an empty ACK may have promised more).
                    let n = self
                        .endpoint
                        .respond_to_unanswered(Instant::now(), &shutting_down());
                    tracing::debug!(requests = n, "shutting down: unanswered requests get 5.03");
                    self.flush().await;
                    break;
                }
                if !busy {
                    break;
                }
            }
            if !commands_open && self.exchanges.is_empty() && self.server.is_none() {
                break;
            }
            let mut timeout = self.next_deadline();
            let now = Instant::now();
            if self.metrics_due.is_some_and(|due| now >= due) {
                self.publish_metrics();
                self.metrics_due = Some(now + METRICS_EVERY);
            }
            // Timers that are due run now, not only when the sleep below wins: on a
            // saturated socket the input branch is always ready and a freshly made
            // sleep never gets its turn, which starved separate ACKs, retransmissions
            // and housekeeping and let the timer queue grow without bound.
            if timeout.is_some_and(|t| t <= now) {
                self.fire_timers(now);
                self.process_events();
                self.flush().await;
                timeout = self.next_deadline();
            }
            // Notifications to send: a turn of them competes with reading the socket.
            let notify = self.server.as_ref().is_some_and(S::has_work);
            let inbox = self.server.as_ref().map(S::changes);
            // A lone socket with nothing else to wait for: block in its receive, as
            // the raw responder does (see `ShardIo::Lone`).
            if !notify
                && commands_open
                && inputs_open
                && self.draining.is_none()
                && self.io.waker().is_some()
                && self.runtime.num_alive_tasks() == 0
                && may_block_until(now, timeout)
            {
                commands_open = self.wait_on_socket(now, timeout, inbox.as_deref());
                continue;
            }
            let changed = async {
                match &inbox {
                    Some(inbox) => inbox.changed().await,
                    None => std::future::pending().await,
                }
            };
            if let Some(t) = timeout {
                timer.arm(t);
            }
            let drain_deadline = async {
                match self.draining {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                input = self.io.next(), if self.draining.is_none() && inputs_open => match input {
                    Input::Readable { errors } => {
                        if errors {
                            self.take_socket_errors();
                        }
                        self.receive_batches(None);
                    }
                    Input::Datagram(d) => self.receive_handed_over(d),
                    Input::Closed => inputs_open = false,
                },
                cmd = self.commands.recv(), if commands_open => match cmd {
                    Some(cmd) => self.command(cmd),
                    None => commands_open = false,
                },
                Some(done) = self.completions.recv() => self.complete(done),
                _ = changed => {
                    if let Some(server) = &mut self.server {
                        server.take_changes();
                    }
                }
                _ = std::future::ready(()), if notify => {
                    if let Some(server) = &mut self.server {
                        server.step(&mut self.endpoint, Instant::now());
                    }
                    // Let the runtime poll its I/O and timers: without a turn of its
                    // own it would not learn that the socket became readable.
                    tokio::task::yield_now().await;
                }
                _ = timer.sleep.as_mut(), if timeout.is_some() => self.fire_timers(Instant::now()),
                _ = drain_deadline => {}
            }
        }
        self.exchanges
            .fail_all(&mut self.endpoint, Instant::now(), |_| Error::Shutdown);
        self.publish_metrics();
        if self.server.is_none() {
            self.close_sessions().await;
        }
    }

    /// A client's driver ends what it opened: every DTLS session is closed with
    /// close_notify, so that the server need not keep it until its idle timeout.
    async fn close_sessions(&mut self) {
        if let Some(dtls) = &mut self.dtls {
            dtls.close_all();
            self.flush().await;
        }
    }

    /// The earliest deadline of the endpoint, the DTLS layer and the server role.
    fn next_deadline(&self) -> Option<Instant> {
        min_deadline(
            min_deadline(
                self.endpoint.poll_timeout(),
                self.dtls.as_ref().and_then(|d| d.poll_timeout()),
            ),
            self.server.as_ref().and_then(S::poll_timeout),
        )
    }

    /// Runs every timer due at `now`.
    fn fire_timers(&mut self, now: Instant) {
        self.endpoint.handle_timeout(now);
        if let Some(d) = &mut self.dtls {
            d.handle_timeout(now);
        }
        if let Some(server) = &mut self.server {
            server.handle_timeout(now);
        }
    }

    /// Publishes the endpoint's counters and state sizes for the metrics exporter
    /// (when it asks, about once a second, and when the shard stops).
    fn publish_metrics(&self) {
        if let Some(m) = &self.metrics {
            m.publish_current(|| {
                let observers = self.server.as_ref().map_or(0, S::observer_count);
                let counts = self.endpoint.state_counts();
                let mut snapshot =
                    ShardSnapshot::from_endpoint(&self.endpoint.stats(), counts, observers);
                if let Some(server) = &self.server {
                    snapshot = server.report(snapshot);
                }
                if let Some(dtls) = &self.dtls {
                    snapshot = snapshot.with_dtls(&dtls.stats());
                }
                snapshot
            });
        }
    }

    /// Waits in a blocking receive on the shard's lone socket until a datagram comes,
    /// `deadline` passes, or another thread puts something in the shard's queues (it
    /// then wakes the shard with a datagram, see [`crate::runtime::wake`]), and handles
    /// what came. `now`: the turn's clock reading (microseconds old, against a receive
    /// timeout of whole milliseconds). Returns false once the command queue has closed.
    fn wait_on_socket(
        &mut self,
        now: Instant,
        deadline: Option<Instant>,
        inbox: Option<&ChangeInbox>,
    ) -> bool {
        let received = {
            let Some((waker, wake)) = self.io.waker() else {
                return true;
            };
            waker.sleeping();
            let mut changed = pin!(async {
                match inbox {
                    Some(inbox) => inbox.changed().await,
                    None => std::future::pending().await,
                }
            });
            let (commands, completions) = (&mut self.commands, &mut self.completions);
            // Polled with the socket's waker (not the runtime's), and outside the
            // runtime's cooperative budget, which this loop never yields to renew.
            let mut queues = pin!(tokio::task::unconstrained(std::future::poll_fn(|cx| {
                if let Poll::Ready(cmd) = commands.poll_recv(cx) {
                    return Poll::Ready(Queued::Command(cmd));
                }
                if let Poll::Ready(Some(done)) = completions.poll_recv(cx) {
                    return Poll::Ready(Queued::Completion(done));
                }
                if changed.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Queued::Changed);
                }
                Poll::Pending
            })));
            let queued = queues.as_mut().poll(&mut Context::from_waker(wake));
            if let Poll::Ready(queued) = queued {
                waker.awake();
                return self.take_queued(queued);
            }
            // The queues stay registered with the waker until the receive returns (the
            // wait for a change until the end of this block).
            let wait = deadline.map(|d| d.saturating_duration_since(now));
            let received = self.io.receive_waiting(wait);
            if let Some((waker, _)) = self.io.waker() {
                waker.awake();
            }
            received
        };
        match received {
            Ok(n) => self.receive_batches(Some(n)),
            Err(e) if udp::is_unreachable(&e) => self.take_socket_errors(),
            // Nothing came (timeout, a signal): the timers and queues get their turn.
            Err(e) if mmsg::nothing_received(&e) => {}
            Err(e) => tracing::debug!(error = %e, "receive failed"),
        }
        true
    }

    /// Handles what a shard about to block found in its queues; returns false when
    /// that is the news that the command queue has closed.
    fn take_queued(&mut self, queued: Queued<S::Completion>) -> bool {
        match queued {
            Queued::Command(Some(cmd)) => self.command(cmd),
            Queued::Command(None) => return false,
            Queued::Completion(done) => self.complete(done),
            Queued::Changed => {
                if let Some(server) = &mut self.server {
                    server.take_changes();
                }
            }
        }
        true
    }

    /// Hands a handler's answer, and those that came back meanwhile, to the server.
    fn complete(&mut self, done: S::Completion) {
        if let Some(server) = &mut self.server {
            let now = Instant::now();
            server.on_completion(&mut self.endpoint, now, done);
            // The answers that came back meanwhile go out in the same flush.
            while let Ok(done) = self.completions.try_recv() {
                server.on_completion(&mut self.endpoint, now, done);
            }
        }
    }

    /// Reads what the socket has, a batch per system call, up to a bound so that
    /// timers and commands get their turn; `first`: the size of a batch already
    /// received.
    fn receive_batches(&mut self, mut first: Option<usize>) {
        let now = Instant::now();
        let mut icmp = false;
        for _ in 0..self.recv_rounds {
            let received = match first.take() {
                Some(n) => Ok(n),
                None => self.io.receive(),
            };
            let n = match received {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                // A pending ICMP error is reported instead of the datagrams: read it
                // from the error queue, then the datagrams.
                Err(e) if udp::is_unreachable(&e) && !icmp => {
                    icmp = true;
                    continue;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "receive failed");
                    break;
                }
            };
            if self.dtls.is_none() {
                for peer in self.io.senders(n).iter().flatten() {
                    self.endpoint.prefetch_peer(*peer);
                }
            }
            for i in 0..n {
                let Some((peer, bytes, truncated)) = self.io.received(i) else {
                    continue;
                };
                let peer = feed(
                    &mut self.endpoint,
                    self.dtls.as_mut(),
                    self.tracer.as_ref(),
                    now,
                    peer,
                    bytes,
                    truncated,
                    &mut self.moved,
                );
                self.heard.push(peer);
            }
            if n < mmsg::BATCH {
                break;
            }
        }
        if icmp {
            self.take_socket_errors();
        }
        self.after_batch();
    }

    /// Reads the ICMP errors queued on a client socket and fails the requests to each
    /// unreachable peer at once ("port not open") instead of at their timeout.
    fn take_socket_errors(&mut self) {
        let mut errors = Vec::new();
        self.io.take_errors(&mut errors);
        let now = Instant::now();
        for (peer, e) in errors {
            let reason = udp::describe_unreachable(&e);
            tracing::debug!(%peer, %reason, "ICMP error");
            if let Some(d) = &mut self.dtls {
                d.forget(peer);
            }
            self.fail_peer(now, peer, |peer| Error::Unreachable {
                peer,
                reason: reason.clone(),
            });
        }
    }

    /// Ends every request waiting on `peer` with `err`.
    fn fail_peer(&mut self, now: Instant, peer: SocketAddr, err: impl Fn(SocketAddr) -> Error) {
        self.exchanges.fail_peer(&mut self.endpoint, now, peer, err);
    }

    /// Observers waiting for the ACK of a notification from the peers just heard may
    /// get their next one.
    fn after_batch(&mut self) {
        if let Some(server) = &mut self.server {
            for m in &self.moved {
                server.on_moved(m.from, m.to);
            }
            server.on_heard(&self.endpoint, &self.heard);
        }
        self.moved.clear();
        self.heard.clear();
    }

    /// Takes a datagram from a receiver thread, and whatever else is queued (bounded).
    fn receive_handed_over(&mut self, first: Inbound) {
        let now = Instant::now();
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(d) = next.take() {
            let peer = feed(
                &mut self.endpoint,
                self.dtls.as_mut(),
                self.tracer.as_ref(),
                now,
                d.peer,
                &d.bytes,
                d.truncated,
                &mut self.moved,
            );
            self.heard.push(peer);
            taken += 1;
            if taken < mmsg::BATCH * self.recv_rounds {
                if let ShardIo::Staged { inbound, .. } = &mut self.io {
                    next = inbound.try_recv().ok();
                }
            }
        }
        self.after_batch();
    }

    fn command(&mut self, cmd: Command) {
        let now = Instant::now();
        match self.exchanges.command(&mut self.endpoint, now, cmd) {
            None => {}
            Some(Command::Shutdown { grace }) => self.draining = Some(now + grace),
            Some(Command::PublishMetrics) => self.publish_metrics(),
            Some(Command::Settings { reply }) => {
                let scheme = if self.dtls.is_some() {
                    Scheme::Coaps
                } else {
                    Scheme::Coap
                };
                let _ = reply.send(Err(Error::Unsupported(Unsupported::Scheme {
                    scheme,
                    what: "has no connection whose settings could be asked for",
                })));
            }
            Some(other) => other.fail(Error::Shutdown),
        }
    }

    fn process_events(&mut self) {
        self.dtls_events();
        // One clock reading for the events of a batch, as for its datagrams
        // (`receive_batches`): they are handled within microseconds of each other.
        let now = Instant::now();
        while let Some(ev) = self.endpoint.poll_event() {
            match ev {
                Event::Request { id, peer, request } => match &mut self.server {
                    Some(server) => {
                        let id = cobalt_proto::session::Inbound::Datagram(id);
                        // Over DTLS, what the peer proved in its handshake.
                        let credential = self.dtls.as_ref().and_then(|d| d.credential(peer));
                        server.on_request(
                            &mut self.endpoint,
                            now,
                            id,
                            peer,
                            credential.as_ref(),
                            request,
                        )
                    }
                    None => {
                        // A client-only endpoint serves nothing.
                        let not_found =
                            Message::new(request.mtype, cobalt_proto::message::Code::NOT_FOUND, 0);
                        let _ = self.endpoint.respond(now, id, not_found);
                    }
                },
                event @ (Event::Response { .. } | Event::Timeout { .. } | Event::Reset { .. }) => {
                    let event = SessionEvent::from(event);
                    if let SessionEvent::Failed {
                        peer,
                        reason: Failure::Timeout { .. },
                        ..
                    } = &event
                    {
                        if let Some(d) = &mut self.dtls {
                            // The peer may have lost the session (restart, eviction).
                            d.forget(*peer);
                        }
                    }
                    self.exchanges.on_event(&mut self.endpoint, now, event);
                }
                event @ (Event::ResponseFailed { .. }
                | Event::UnmatchedReset { .. }
                | Event::Unverified { .. }
                | Event::Verified { .. }) => {
                    match &event {
                        Event::ResponseFailed { id, reason } => tracing::debug!(
                            ?id,
                            ?reason,
                            "confirmable response or notification not delivered"
                        ),
                        Event::Unverified { peer, .. } => tracing::debug!(
                            %peer,
                            "address not verified; answer or notification withheld"
                        ),
                        _ => {}
                    }
                    if let Some(server) = &mut self.server {
                        server.on_event(SessionEvent::Endpoint(event));
                    }
                }
            }
        }
    }

    /// Fails the requests waiting on a peer whose DTLS handshake failed.
    fn dtls_events(&mut self) {
        let Some(dtls) = &mut self.dtls else {
            return;
        };
        let events: Vec<DtlsEvent> = std::iter::from_fn(|| dtls.poll_event()).collect();
        for ev in events {
            match ev {
                DtlsEvent::HandshakeFailed { peer, reason } => {
                    tracing::debug!(%peer, %reason, "DTLS handshake failed");
                    let kind = crate::error::HandshakeFailure::from_reason(&reason);
                    self.fail_peer(Instant::now(), peer, |peer| Error::Dtls {
                        peer,
                        kind,
                        reason: reason.clone(),
                    });
                }
                DtlsEvent::Connected { peer } => tracing::debug!(%peer, "DTLS session up"),
                DtlsEvent::Closed { peer, reason } => {
                    tracing::debug!(%peer, %reason, "DTLS session closed")
                }
            }
        }
    }

    /// With DTLS, traces the CoAP datagrams in the outbox and replaces them with the
    /// records that carry them (and any handshake records). Returns whether it traced.
    fn seal_for_dtls(&mut self) -> bool {
        let Some(dtls) = &mut self.dtls else {
            return false;
        };
        let now = Instant::now();
        for tx in self.outbox.drain(..) {
            if let Some(t) = &self.tracer {
                t(true, tx.peer, &tx.bytes);
            }
            dtls.encrypt(now, tx.peer, &tx.bytes);
            self.endpoint.recycle(tx.bytes);
        }
        self.outbox
            .extend(std::iter::from_fn(|| dtls.poll_transmit()));
        true
    }

    async fn flush(&mut self) {
        self.outbox
            .extend(std::iter::from_fn(|| self.endpoint.poll_transmit()));
        let traced = self.seal_for_dtls();
        if self.outbox.is_empty() {
            return;
        }
        if let Some(t) = self.tracer.as_ref().filter(|_| !traced) {
            for tx in &self.outbox {
                t(true, tx.peer, &tx.bytes);
            }
        }
        if let ShardIo::Staged { outbound, .. } = &mut self.io {
            let _ = outbound.send(std::mem::take(&mut self.outbox));
            return;
        }
        let Some(fd) = self.io.own_socket().map(|s| s.as_raw_fd()) else {
            return;
        };
        let mut sent = 0;
        let mut icmp = false;
        while sent < self.outbox.len() {
            // Sent straight away: the socket is not registered for writing (see
            // `ShardIo::socket`), so the runtime has no write readiness to consult.
            let pending = self.outbox[sent..].iter();
            match mmsg::send_batch(fd, pending.map(|t| (t.peer, t.bytes.as_slice()))) {
                Ok(n) => sent += n.max(1),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let waited = match self.io.own_socket() {
                        Some(socket) => io::wait_writable(socket).await,
                        None => Ok(()),
                    };
                    if let Err(e) = waited {
                        tracing::debug!(error = %e, "cannot wait for the socket to take more");
                        sent = self.outbox.len();
                    }
                }
                // A pending ICMP error (about any earlier datagram) is reported by this
                // send, which then sent nothing: send the same datagram again, once.
                Err(e) if udp::is_unreachable(&e) && !icmp => icmp = true,
                Err(e) => {
                    // One bad destination (e.g. unreachable) must not stall the rest.
                    tracing::debug!(peer = %self.outbox[sent].peer, error = %e, "send failed");
                    sent += 1;
                }
            }
        }
        // The endpoint encodes later datagrams into these buffers.
        for tx in self.outbox.drain(..) {
            self.endpoint.recycle(tx.bytes);
        }
        if icmp {
            self.take_socket_errors();
        }
    }
}

/// The shard's one timer, kept from turn to turn: it is moved only when the next
/// deadline, rounded up to the millisecond (the runtime's timer resolution), changes.
/// Under load the endpoint's next deadline moves with nearly every datagram (a
/// separate-ACK deadline per confirmable request); a timer made and dropped on every
/// turn cost an insertion into and a removal from the runtime's timer wheel each time.
struct Wakeup {
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// Where deadlines are rounded from.
    origin: Instant,
    /// The deadline the timer is set to.
    at: Instant,
}

impl Wakeup {
    fn new(now: Instant) -> Wakeup {
        Wakeup {
            sleep: Box::pin(tokio::time::sleep_until(now.into())),
            origin: now,
            at: now,
        }
    }

    /// Sets the timer to `deadline`, rounded up to the next whole millisecond.
    fn arm(&mut self, deadline: Instant) {
        let at = round_up_to_millis(self.origin, deadline);
        if at != self.at {
            self.at = at;
            self.sleep.as_mut().reset(at.into());
        }
    }
}

/// `t` rounded up to a whole number of milliseconds after `origin` (`origin` itself
/// for an instant before it).
fn round_up_to_millis(origin: Instant, t: Instant) -> Instant {
    let since = t.saturating_duration_since(origin);
    let millis = since.as_nanos().div_ceil(1_000_000);
    origin + std::time::Duration::from_millis(millis.min(u128::from(u64::MAX)) as u64)
}

/// The answer to a request whose handler has not answered when a shutdown's grace
/// period ends (the endpoint sets type, message ID and token).
fn shutting_down() -> Message {
    let mut m = Message::new(MessageType::Acknowledgement, Code::SERVICE_UNAVAILABLE, 0);
    // Short: to an address not verified only a few bytes may go (RFC 9175 §2.4).
    m.payload = b"shutting down".to_vec();
    m
}

/// The earlier of two optional deadlines.
fn min_deadline(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Hands one received datagram to the endpoint (and the tracer); with DTLS, the
/// CoAP datagrams its records carry. A record that moved its session to a new
/// address (DTLS Connection ID) moves the endpoint's state of the peer there first
/// and is noted in `moved`. Returns the datagram's peer.
#[allow(clippy::too_many_arguments)]
fn feed(
    endpoint: &mut Endpoint,
    dtls: Option<&mut Box<dyn DtlsBackend>>,
    tracer: Option<&Tracer>,
    now: Instant,
    peer: SocketAddr,
    bytes: &[u8],
    truncated: bool,
    moved: &mut Vec<AddressUpdate>,
) -> SocketAddr {
    if let Some(dtls) = dtls {
        if truncated {
            return peer; // a record cut short cannot be authenticated
        }
        let plain = dtls.handle_datagram(now, peer, bytes);
        while let Some(update) = dtls.poll_address_update() {
            endpoint.move_peer(now, update.from, update.to);
            moved.push(update);
        }
        for datagram in plain {
            feed(endpoint, None, tracer, now, peer, &datagram, false, moved);
        }
        return peer;
    }
    if let Some(t) = tracer {
        t(false, peer, bytes);
    }
    if truncated {
        endpoint.handle_oversized(peer, bytes, mmsg::SLOT);
    } else {
        endpoint.handle_datagram(now, peer, bytes);
    }
    peer
}

/// How the datagram driver words the errors of client requests.
#[derive(Debug)]
struct DatagramErrors;

impl ExchangeErrors for DatagramErrors {
    fn refused(&self, _peer: SocketAddr, _what: &str, _error: SessionError) -> Error {
        Error::TooManyRequests
    }

    fn closed(&self, _peer: SocketAddr, _reason: CloseReason) -> Error {
        Error::Shutdown // a datagram endpoint has no connection to close
    }
}

/// A metrics reader's way to a shard: a [`Command::PublishMetrics`] in its command
/// queue, which also wakes a shard blocked in its receive.
struct ShardCommands {
    /// Weak: the metrics outlive the shard without keeping its queue open.
    commands: mpsc::WeakUnboundedSender<Command>,
}

thread_local! {
    /// Whether this thread runs a shard. A reader on one (a handler reading the
    /// metrics) is given the values last published instead of waiting: a shard that
    /// waited for itself, or for another shard whose handler waits for it, would stall
    /// until the reader's time runs out.
    static ON_A_SHARD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl ShardLink for ShardCommands {
    fn ask(&self) -> bool {
        self.commands
            .upgrade()
            .is_some_and(|shard| shard.send(Command::PublishMetrics).is_ok())
    }

    fn can_answer(&self) -> bool {
        !ON_A_SHARD.get()
            && self
                .commands
                .upgrade()
                .is_some_and(|shard| !shard.is_closed())
    }
}

/// Where a new driver gets its datagrams.
pub(crate) enum DriverIo {
    /// A socket of its own (registered with the driver's runtime on its thread).
    Owned(std::net::UdpSocket),
    /// A socket of its own that no other socket shares the port of: the driver waits
    /// in a blocking receive on it when it has nothing else to wait for
    /// ([`ShardIo::Lone`]).
    Lone(std::net::UdpSocket),
    /// Handed over by receiver threads of single-socket mode; `local` is the socket's address.
    Staged(ShardIo, SocketAddr),
}

/// Starts a driver on its own thread with a current-thread runtime.
#[allow(clippy::too_many_arguments)]
pub(crate) fn spawn_driver<S: Service<Endpoint>>(
    name: String,
    io: DriverIo,
    config: EndpointConfig,
    server: Option<MakeService<S, Endpoint>>,
    tracer: Option<Tracer>,
    recv_batch: Option<usize>,
    metrics: Option<Arc<ShardMetrics>>,
    dtls: Option<Box<dyn DtlsBackend>>,
) -> std::io::Result<(mpsc::UnboundedSender<Command>, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let slot = metrics.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // A server shard keeps a sender to itself so that its handlers' client requests
    // go out on the shard's own socket and come back to it.
    let v6 = match &io {
        DriverIo::Owned(s) | DriverIo::Lone(s) => s.local_addr()?.is_ipv6(),
        DriverIo::Staged(_, local) => local.is_ipv6(),
    };
    let server = server.map(|make| (make, tx.clone(), v6));
    let handle = std::thread::Builder::new().name(name).spawn(move || {
        ON_A_SHARD.set(true);
        rt.block_on(async move {
            let io = match io {
                DriverIo::Owned(socket) => match ShardIo::socket(socket) {
                    Ok(io) => io,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot register socket");
                        return;
                    }
                },
                DriverIo::Lone(socket) => match ShardIo::lone(socket) {
                    Ok(io) => io,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot prepare socket");
                        return;
                    }
                },
                DriverIo::Staged(io, _) => io,
            };
            let mut driver = Driver::new(io, config, server, rx);
            driver.tracer = tracer;
            driver.recv_rounds = recv_batch.map_or(RECV_ROUNDS, |n| n.div_ceil(mmsg::BATCH).max(1));
            driver.metrics_due = metrics.as_ref().map(|_| Instant::now() + METRICS_EVERY);
            driver.metrics = metrics;
            driver.dtls = dtls;
            driver.run().await
        })
    })?;
    if let Some(slot) = slot {
        slot.link(Box::new(ShardCommands {
            commands: tx.downgrade(),
        }));
    }
    Ok((tx, handle))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::command::ReplyTo;
    use crate::runtime::service::NoService;

    /// A reader on any shard's thread reads the last published values instead of
    /// asking: two shards whose handlers read the metrics at once would otherwise each
    /// wait for the other until the reader's time ran out.
    #[test]
    fn only_readers_off_the_shards_wait_for_a_shard() {
        let (tx, rx) = mpsc::unbounded_channel();
        let link = ShardCommands {
            commands: tx.downgrade(),
        };
        assert!(link.can_answer(), "a thread of the application");
        let link = std::thread::spawn(move || {
            ON_A_SHARD.set(true);
            assert!(!link.can_answer(), "another shard's thread");
            link
        })
        .join()
        .unwrap();
        drop((tx, rx));
        assert!(!link.can_answer(), "a shard that has stopped");
    }

    #[test]
    fn a_shard_blocks_in_its_receive_only_for_a_deadline_ticks_away() {
        let now = Instant::now();
        assert!(may_block_until(now, None), "no timer: block");
        assert!(may_block_until(now, Some(now + Duration::from_secs(2))));
        assert!(may_block_until(now, Some(now + BLOCKING_WAIT_MIN)));
        for near in [0, 50, 5_000, 19_999] {
            let deadline = now + Duration::from_micros(near);
            assert!(!may_block_until(now, Some(deadline)), "{near} µs away");
        }
        assert!(
            !may_block_until(now, Some(now - Duration::from_millis(1))),
            "overdue"
        );
    }

    #[test]
    fn a_shard_blocked_in_its_receive_is_woken_by_a_command_from_another_thread() {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let (commands, thread) = spawn_driver::<NoService>(
            "lone-test".into(),
            DriverIo::Lone(socket),
            EndpointConfig::default(),
            None,
            None,
            None,
            None,
            None,
        )
        .unwrap();
        // With nothing to do and no deadline, the shard blocks in its receive; only
        // the wake datagram of this command's waker gets it to send the request.
        std::thread::sleep(Duration::from_millis(50));
        let (reply, answer) = tokio::sync::oneshot::channel();
        let get = Message::new(MessageType::Confirmable, Code::GET, 0);
        commands
            .send(Command::Request {
                key: 1,
                peer: server.local_addr().unwrap(),
                message: get,
                reply: ReplyTo::Once(reply),
            })
            .unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = server.recv_from(&mut buf).expect("the request went out");
        let request = cobalt_proto::message::codec::decode(&buf[..n]).unwrap();
        assert_eq!(request.code, Code::GET);
        // The answer wakes it through its socket as any datagram does.
        let mut content = Message::new(MessageType::Acknowledgement, Code::CONTENT, request.mid);
        content.token = request.token.clone();
        server
            .send_to(&cobalt_proto::message::codec::encode(&content), from)
            .unwrap();
        let answered = answer.blocking_recv().unwrap().unwrap();
        assert_eq!(answered.code, Code::CONTENT);
        // A command from another thread also ends it.
        commands
            .send(Command::Shutdown {
                grace: Duration::ZERO,
            })
            .unwrap();
        drop(commands);
        thread.join().unwrap();
    }

    #[test]
    fn deadlines_round_up_to_the_next_whole_millisecond() {
        let origin = Instant::now();
        let ms = Duration::from_millis;
        let at = |d| round_up_to_millis(origin, origin + d);
        assert_eq!(at(Duration::from_micros(1)), origin + ms(1));
        assert_eq!(at(Duration::from_micros(1_200)), origin + ms(2));
        assert_eq!(at(ms(3)), origin + ms(3), "a whole millisecond stays");
        assert_eq!(at(Duration::ZERO), origin);
        let before = origin.checked_sub(ms(5)).unwrap_or(origin);
        assert_eq!(round_up_to_millis(origin, before), origin);
    }

    #[tokio::test(start_paused = true)]
    async fn the_timer_moves_only_when_the_rounded_deadline_does() {
        let origin = Instant::now();
        let mut timer = Wakeup::new(origin);
        timer.arm(origin + Duration::from_micros(10_100));
        let set = timer.sleep.deadline();
        assert_eq!(timer.at, origin + Duration::from_millis(11));
        // Deadlines within the same millisecond leave the timer where it is.
        timer.arm(origin + Duration::from_micros(10_900));
        assert_eq!(timer.sleep.deadline(), set);
        timer.arm(origin + Duration::from_micros(11_001));
        assert_eq!(timer.at, origin + Duration::from_millis(12));
        assert_eq!(
            timer.sleep.deadline(),
            tokio::time::Instant::from_std(origin + Duration::from_millis(12))
        );
    }
}

//! The load generator of the transports with sessions (`coap+tcp://`, `coap+ws://`,
//! and `coaps://` with `--new-session`): each generator thread runs a single-threaded tokio runtime with one
//! future per virtual client, and every client owns its connection or DTLS session.
//!
//! A step goes: set-up (connect, CSM exchange or DTLS handshake; not measured, and any
//! failure fails the step with its reason), `ready`, wait for `go`, then the loop. As
//! in [`crate::client`], a client has one request in flight, never retransmits, and
//! either sends again as soon as its exchange ends (closed loop) or waits for the
//! schedule of [`Pacing`] (open loop, `--rate`), latency counting from the intended
//! send time.
//!
//! Counting rules on top of the UDP ones: a connection that breaks (closed, aborted,
//! DTLS alert) counts as an error and ends its exchange, and the client reconnects
//! before its next request, that request's latency including the reconnection. A
//! reconnection that fails counts as an error, and its request as lost at the timeout.
//! With `--new-session` every request gets a fresh connection or session, so each
//! completed request is one handshake.

use crate::client::splitmix;
use crate::engine::StepShared;
use crate::pacing::Pacing;
use crate::stats::{AnswerCode, Recorder};
use crate::sys::now_ns;
use crate::StepError;
use futures_util::stream::{self, FuturesUnordered, StreamExt, TryStreamExt};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::Instant;

/// Handshakes (DTLS, TCP/TLS connections, WebSocket upgrades) the whole step keeps in
/// flight at most: a `cobalt serve` takes this many at once from one address by
/// default (`dtls.max_handshakes_per_ip`, `connections.max_handshakes_per_ip`), and
/// every client of a step comes from one address. Each of `--threads` threads gets its
/// share (at least one).
pub const HANDSHAKES_IN_FLIGHT: usize = 32;
/// Set-up gets at least this long, whatever `--timeout` says.
const MIN_SETUP_TIME: Duration = Duration::from_secs(10);
/// Open loop: the shortest period of the schedule's ticker thread, in nanoseconds.
const MIN_TICK_NS: u64 = 50_000;

/// How one exchange ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The matching response arrived, with this code (only 2.xx completes the request).
    Answered(u8),
    /// The server answered with RST (CoAP over DTLS).
    Reset,
    /// The answer was malformed: an error that ends the exchange.
    Garbage,
    /// No answer before the deadline.
    Lost,
    /// The request could not reach the server (a refused reconnection, ICMP
    /// unreachable): an error, and the request counts as lost at its deadline.
    Unreachable,
    /// The connection or session broke: an error; the client reconnects.
    Broken,
}

/// A virtual client's connection or session with the server.
pub(crate) trait Session: Sized {
    /// What every client of a step shares: the server, the request, credentials.
    type Setup;

    /// Opens a connection or session and runs its handshake before `deadline`; the
    /// error says what failed and what to check.
    async fn open(setup: &Self::Setup, seed: u64, deadline: Instant) -> Result<Self, String>;

    /// Replaces the connection or session with a new one, as [`Session::open`] does.
    async fn reopen(&mut self, setup: &Self::Setup, deadline: Instant) -> Result<(), String>;

    /// Sends one request and waits for its response until `deadline`.
    async fn exchange(&mut self, setup: &Self::Setup, deadline: Instant) -> Outcome;

    /// Ends the connection after its single request (`--new-session`).
    async fn close(&mut self);
}

/// What the clients of one thread share.
struct Thread<'a, T> {
    shared: &'a StepShared,
    setup: &'a T,
    new_session: bool,
    /// Reconnections (`--new-session`, or after a break) in flight, bounded like the
    /// set-up.
    handshakes: Semaphore,
    rec: RefCell<Recorder>,
    pacing: RefCell<Pacing>,
    /// Open loop: the intended send time handed to each idle client, and its wake-up.
    slots: Vec<(Cell<Option<u64>>, Notify)>,
    /// Open loop: a client became idle.
    idle: Notify,
    /// Open loop: requests are due (from the ticker thread, see [`tick`]).
    tick: &'a Notify,
    /// Becomes true when the step ends (end time, Ctrl-C, stop).
    stop: watch::Sender<bool>,
    measure_start: u64,
    end: u64,
}

/// The tokio instant at `ns` on the [`now_ns`] clock.
fn instant_at(ns: u64) -> Instant {
    let now = now_ns();
    Instant::now() + Duration::from_nanos(ns.saturating_sub(now))
}

/// One generator thread's part of a step.
pub(crate) struct Share<'a> {
    /// What every thread of the step shares.
    pub shared: &'a StepShared,
    /// Virtual clients of this thread.
    pub clients: usize,
    /// Seeds the clients' message IDs and tokens.
    pub seed: u64,
    /// Open loop: one request every `interval_ns` from this thread (see
    /// [`crate::client::run_thread`]); `None` for the closed loop.
    pub interval_ns: Option<u64>,
    /// `--new-session`.
    pub new_session: bool,
    /// Handshakes this thread keeps in flight at most (its share of
    /// [`HANDSHAKES_IN_FLIGHT`]).
    pub handshakes: usize,
}

/// Runs one thread's share of a step; see the module docs.
pub(crate) fn run_thread<S: Session>(
    share: &Share,
    setup: &S::Setup,
) -> Result<Recorder, StepError> {
    let Share {
        shared,
        clients,
        seed,
        interval_ns,
        new_session,
        handshakes,
    } = *share;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StepError::from(format!("cannot start a load-generator runtime: {e}")));
    // A session that cannot be set up is the server's (or the network's) doing.
    let sessions = rt.as_ref().map_err(Clone::clone).and_then(|rt| {
        rt.block_on(open_all::<S>(shared, setup, clients, seed, handshakes))
            .map_err(StepError::network)
    });
    if sessions.is_err() {
        shared.abort.store(true, Ordering::SeqCst);
    }
    shared.ready.fetch_add(1, Ordering::SeqCst);
    while !shared.go.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_micros(200));
    }
    let (rt, sessions) = (rt?, sessions?);
    let tick = Notify::new();
    let thread = Thread {
        shared,
        setup,
        new_session,
        handshakes: Semaphore::new(handshakes.max(1)),
        rec: RefCell::new(Recorder::new()),
        pacing: RefCell::new(Pacing::new(interval_ns)),
        slots: (0..clients)
            .map(|_| (Cell::new(None), Notify::new()))
            .collect(),
        idle: Notify::new(),
        tick: &tick,
        stop: watch::channel(false).0,
        measure_start: shared.measure_start_ns.load(Ordering::SeqCst),
        end: shared.end_ns.load(Ordering::SeqCst),
    };
    let start = now_ns();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        if let Some(interval) = interval_ns {
            let (tick, done) = (&tick, &done);
            let ticker = std::thread::Builder::new()
                .name("bench-tick".into())
                .spawn_scoped(s, move || self::tick(tick, start, interval, done));
            if let Err(e) = ticker {
                shared.abort.store(true, Ordering::SeqCst);
                return Err(StepError::from(format!(
                    "cannot start the schedule's ticker thread: {e}"
                )));
            }
        }
        rt.block_on(thread.run(sessions, start));
        done.store(true, Ordering::Relaxed);
        Ok(())
    })?;
    Ok(thread.rec.into_inner())
}

/// The open loop's clock: wakes the pacer at the schedule's due times `start + k ×
/// interval` (every few of them when they are closer than [`MIN_TICK_NS`]) until
/// `done`. A thread of its own because tokio's timers have a millisecond resolution,
/// which would delay requests by up to a millisecond and add that to their latency.
fn tick(tick: &Notify, start: u64, interval: u64, done: &AtomicBool) {
    let period = interval.max(1) * MIN_TICK_NS.div_ceil(interval.max(1));
    let mut next = start;
    while !done.load(Ordering::Relaxed) {
        let now = now_ns();
        if now < next {
            // Short naps, so that the end of the step is noticed quickly.
            std::thread::sleep(Duration::from_nanos((next - now).min(50_000_000)));
            continue;
        }
        tick.notify_one();
        next += period * ((now - next) / period + 1);
    }
}

/// Sets up every client of a thread, `handshakes` at a time; the first failure ends
/// the set-up.
async fn open_all<S: Session>(
    shared: &StepShared,
    setup: &S::Setup,
    clients: usize,
    seed: u64,
    handshakes: usize,
) -> Result<Vec<S>, String> {
    let limit = Duration::from_nanos(shared.timeout_ns).max(MIN_SETUP_TIME);
    let deadline = Instant::now() + limit;
    let mut rng = seed;
    let seeds: Vec<u64> = (0..clients).map(|_| splitmix(&mut rng)).collect();
    stream::iter(seeds.into_iter().enumerate())
        .map(|(i, seed)| async move {
            if shared.abort.load(Ordering::Relaxed) {
                return Err("another load-generator thread failed".to_string());
            }
            S::open(setup, seed, deadline)
                .await
                .map_err(|e| format!("cannot set up client {} of {clients}: {e}", i + 1))
        })
        .buffer_unordered(handshakes.max(1))
        .try_collect()
        .await
}

impl<T> Thread<'_, T> {
    #[inline]
    fn in_window(&self, t: u64) -> bool {
        t >= self.measure_start && t < self.end
    }

    /// Runs the clients until the step ends.
    async fn run<S: Session<Setup = T>>(&self, sessions: Vec<S>, start: u64) {
        let _ = self.pacing.borrow_mut().start(sessions.len(), start);
        let mut clients: FuturesUnordered<_> = sessions
            .into_iter()
            .enumerate()
            .map(|(i, s)| self.client(i, s))
            .collect();
        let all = async { while clients.next().await.is_some() {} };
        tokio::join!(all, self.pace(), self.watch_end());
    }

    /// Ends the step at its end time, on Ctrl-C, or when told to stop.
    async fn watch_end(&self) {
        loop {
            let now = now_ns();
            if now >= self.end || self.shared.stopping() {
                break;
            }
            let nap = (self.end - now).min(50_000_000);
            tokio::time::sleep(Duration::from_nanos(nap)).await;
        }
        self.stop.send_replace(true);
    }

    /// Resolves once the step has ended.
    async fn ended(&self) {
        let mut rx = self.stop.subscribe();
        let _ = rx.wait_for(|stopped| *stopped).await;
    }

    /// Open loop: hands each due request to an idle client.
    async fn pace(&self) {
        if !self.pacing.borrow().is_open_loop() {
            return;
        }
        loop {
            let wake = {
                let mut pacing = self.pacing.borrow_mut();
                while let Some((i, due)) = pacing.next_due(now_ns()) {
                    self.slots[i].0.set(Some(due));
                    self.slots[i].1.notify_one();
                }
                pacing.wake()
            };
            // Without an idle client, ticks are of no use until one comes back.
            let ticked = async {
                match wake {
                    Some(_) => self.tick.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = ticked => {}
                _ = self.idle.notified() => {}
                _ = self.ended() => return,
            }
        }
    }

    /// Waits for client `i`'s next turn; returns the request's intended send time, or
    /// `None` once the step has ended.
    async fn turn(&self, i: usize) -> Option<u64> {
        if *self.stop.borrow() {
            return None;
        }
        if !self.pacing.borrow().is_open_loop() {
            return Some(now_ns());
        }
        let (due, wake) = &self.slots[i];
        let scheduled = async {
            loop {
                if let Some(t) = due.take() {
                    return t;
                }
                wake.notified().await;
            }
        };
        tokio::select! {
            t = scheduled => Some(t),
            _ = self.ended() => None,
        }
    }

    /// Client `i`'s exchange is over.
    fn release(&self, i: usize) {
        if !self.pacing.borrow_mut().release(i) {
            self.idle.notify_one();
        }
    }

    /// Counts an exchange that ended at `t` (outside the window it only shows in the
    /// progress line).
    fn record(&self, outcome: &Outcome, intended: u64, t: u64) {
        if let Outcome::Answered(code) = outcome {
            let counter = if AnswerCode::Coap(*code).is_success() {
                &self.shared.progress
            } else {
                &self.shared.progress_other
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        if !self.in_window(t) {
            return;
        }
        let mut rec = self.rec.borrow_mut();
        match outcome {
            Outcome::Answered(code) => {
                rec.answer(AnswerCode::Coap(*code), t.saturating_sub(intended))
            }
            Outcome::Reset => rec.resets += 1,
            Outcome::Lost => rec.lost += 1,
            Outcome::Garbage | Outcome::Broken | Outcome::Unreachable => rec.errors += 1,
        }
    }

    /// One virtual client's loop.
    async fn client<S: Session<Setup = T>>(&self, i: usize, mut session: S) {
        let timeout = self.shared.timeout_ns;
        let mut broken = false;
        while let Some(intended) = self.turn(i).await {
            let sent = now_ns().max(intended);
            let deadline = instant_at(sent + timeout);
            if self.in_window(sent) {
                self.rec.borrow_mut().sent += 1;
            }
            let exchange = async {
                if broken || self.new_session {
                    let _permit = self.handshakes.acquire().await;
                    if session.reopen(self.setup, deadline).await.is_err() {
                        return Outcome::Unreachable;
                    }
                    broken = false;
                }
                session.exchange(self.setup, deadline).await
            };
            let outcome = tokio::select! {
                o = exchange => o,
                _ = self.ended() => break,
            };
            self.record(&outcome, intended, now_ns());
            match outcome {
                Outcome::Broken => broken = true,
                Outcome::Unreachable => {
                    broken = true;
                    tokio::select! {
                        _ = tokio::time::sleep_until(deadline) => {}
                        _ = self.ended() => break,
                    }
                    self.record(&Outcome::Lost, intended, now_ns());
                }
                _ if self.new_session => {
                    tokio::select! {
                        _ = session.close() => {}
                        _ = self.ended() => break,
                    }
                }
                _ => {}
            }
            self.release(i);
        }
    }
}

//! The one closed/open-loop engine of the generators that run without an async runtime
//! (`coap://` and `http://`): each generator thread owns one [`Exchanges`], which keeps
//! every virtual client's exchange (one request in flight at most, when it was sent,
//! when it was meant to be sent), the [`Pacing`] schedule, the timeouts, the counting
//! window and the progress counters, and drives a protocol's [`Generator`]: start a
//! request, wait for I/O and report how exchanges ended, retransmit, give up.
//!
//! The loop: expire what timed out (every `timeout / 20`, 1–50 ms), send what the open
//! loop's schedule says is due, wait for I/O until the next deadline (at most 100 ms, so
//! that Ctrl-C and the end of the step are noticed), then start the next request of
//! every client whose exchange ended: at once in the closed loop, on the schedule in the
//! open loop, with latency counted from the intended send time.

use crate::pacing::Pacing;
use crate::stats::{AnswerCode, Recorder};
use crate::sys::{interrupted, now_ns};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Written in a URI's query (`?ep=bench-{client}`), replaced in each coap:// client's
/// requests by its number, 8 digits (`bench-00000042`): the same length, so the
/// template is patched in place like the MID and token.
pub const CLIENT_PLACEHOLDER: &[u8; 8] = b"{client}";

/// Where `template` holds [`CLIENT_PLACEHOLDER`], if it does.
pub fn client_field(template: &[u8]) -> Option<usize> {
    template
        .windows(CLIENT_PLACEHOLDER.len())
        .position(|w| w == CLIENT_PLACEHOLDER)
}

/// Writes `n` as the 8 digits of a client's number over the start of `field`.
pub fn write_client_number(field: &mut [u8], mut n: usize) {
    for digit in field[..CLIENT_PLACEHOLDER.len()].iter_mut().rev() {
        *digit = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// What every thread of one step shares.
pub struct StepShared {
    /// Server address.
    pub target: SocketAddr,
    /// The encoded request: version/type/TKL=8, code, MID 0, an 8-byte token, options
    /// and payload. Each send patches in the MID and token.
    pub template: Vec<u8>,
    /// Where the template holds [`CLIENT_PLACEHOLDER`]: each client writes its number
    /// there (coap:// only), e.g. a unique endpoint name per client.
    pub client_field: Option<usize>,
    /// A request unanswered for this long counts as lost.
    pub timeout_ns: u64,
    /// `--cc`: retransmit on this algorithm's timers (one controller per client).
    pub cc: Option<cobalt_proto::congestion::Algorithm>,
    /// Threads that finished setting up their sockets (successfully or not).
    pub ready: AtomicUsize,
    /// Set by the coordinator once `measure_start_ns` and `end_ns` are published.
    pub go: AtomicBool,
    /// Start of the measured window (absolute `now_ns`), after the warm-up.
    pub measure_start_ns: AtomicU64,
    /// End of the step (absolute `now_ns`).
    pub end_ns: AtomicU64,
    /// Set by a thread whose setup failed, so that the others stop at once.
    pub abort: AtomicBool,
    /// Completed (2.xx) requests so far (warm-up included), for progress output.
    pub progress: AtomicU64,
    /// Other answers (4.xx, 5.xx, ...) so far, for progress output.
    pub progress_other: AtomicU64,
    /// Set to end the step early (besides Ctrl-C), e.g. when a coordinator goes away.
    pub stop: std::sync::Arc<AtomicBool>,
}

impl StepShared {
    /// True when the step must end now: Ctrl-C or an explicit stop.
    #[inline]
    pub fn stopping(&self) -> bool {
        interrupted() || self.stop.load(Ordering::Relaxed)
    }
}

/// Longest a thread waits for I/O before re-checking the clock and Ctrl-C.
const MAX_WAIT_NS: u64 = 100_000_000;

/// What the engine asks of one protocol's clients (all of one generator thread).
pub(crate) trait Generator {
    /// How many clients there are (indices `0..clients()`).
    fn clients(&self) -> usize;

    /// Sends a fresh request from client `i` at time `t`. `Ok(false)` when it did not
    /// go out (a refused connection, a full buffer): an error, and the request counts
    /// as lost at its timeout. `Err` ends the thread's run (out of file descriptors).
    fn start(&mut self, i: usize, t: u64) -> Result<bool, String>;

    /// Called at every timeout scan for client `i`, whose request is outstanding and
    /// not yet timed out: may retransmit it; true gives up on it now (lost).
    fn tick(&mut self, _i: usize, _now: u64) -> bool {
        false
    }

    /// Client `i`'s request is lost (timed out or given up).
    fn lost(&mut self, i: usize);

    /// Waits up to `wait_ns` for I/O and reports what happened to `ex`.
    fn poll(&mut self, wait_ns: u64, ex: &mut Exchanges) -> Result<(), String>;

    /// How often outstanding requests are checked: often enough to notice a timeout
    /// within 5% of it (1–50 ms).
    fn scan_every(&self, timeout_ns: u64) -> u64 {
        (timeout_ns / 20).clamp(1_000_000, 50_000_000)
    }
}

/// One client's exchange.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// When the request went out (`now_ns` clock).
    sent_at: u64,
    /// When it was meant to go out: `sent_at` in the closed loop, its slot in the
    /// schedule in the open loop. Latency counts from here.
    intended: u64,
    /// A request is in flight.
    outstanding: bool,
}

/// The exchanges of one generator thread and what they counted.
pub(crate) struct Exchanges {
    slots: Vec<Slot>,
    /// Clients whose exchange ended since the last poll, with the time.
    ended: Vec<(usize, u64)>,
    /// Counters of the measured window.
    pub(crate) rec: Recorder,
    measure_start: u64,
    end: u64,
    pacing: Pacing,
    /// 2.xx answers and other answers, warm-up included (progress output).
    done: u64,
    other: u64,
}

impl Exchanges {
    /// Exchanges of `clients` clients, measured between `measure_start` and `end`.
    pub(crate) fn new(clients: usize, measure_start: u64, end: u64, interval: Option<u64>) -> Self {
        Exchanges {
            slots: vec![Slot::default(); clients],
            ended: Vec::with_capacity(clients),
            rec: Recorder::new(),
            measure_start,
            end,
            pacing: Pacing::new(interval),
            done: 0,
            other: 0,
        }
    }

    /// True when `t` falls in the measured window.
    #[inline]
    pub(crate) fn in_window(&self, t: u64) -> bool {
        t >= self.measure_start && t < self.end
    }

    /// True when client `i` has a request in flight.
    #[inline]
    pub(crate) fn outstanding(&self, i: usize) -> bool {
        self.slots.get(i).is_some_and(|s| s.outstanding)
    }

    /// Client `i`'s request was answered at `t` with `code` (only 2.xx completes it).
    pub(crate) fn answered(&mut self, i: usize, code: AnswerCode, t: u64) {
        if !self.outstanding(i) {
            return;
        }
        if code.is_success() {
            self.done += 1;
        } else {
            self.other += 1;
        }
        if self.in_window(t) {
            let intended = self.slots[i].intended;
            self.rec.answer(code, t.saturating_sub(intended));
        }
        self.end_exchange(i, t);
    }

    /// Client `i`'s request was reset (CoAP RST) at `t`.
    pub(crate) fn reset(&mut self, i: usize, t: u64) {
        if !self.outstanding(i) {
            return;
        }
        if self.in_window(t) {
            self.rec.resets += 1;
        }
        self.end_exchange(i, t);
    }

    /// An error at `t` that ends client `i`'s exchange (a malformed answer, a broken
    /// connection) if one is in flight.
    pub(crate) fn failed(&mut self, i: usize, t: u64) {
        self.error(t);
        if self.outstanding(i) {
            self.end_exchange(i, t);
        }
    }

    /// An error at `t` that leaves the exchange running (ICMP unreachable: the request
    /// is lost at its timeout).
    pub(crate) fn error(&mut self, t: u64) {
        if self.in_window(t) {
            self.rec.errors += 1;
        }
    }

    fn end_exchange(&mut self, i: usize, t: u64) {
        self.slots[i].outstanding = false;
        self.ended.push((i, t));
    }

    /// Starts a request on client `i` at `now`, meant for `intended`.
    fn start<G: Generator>(
        &mut self,
        g: &mut G,
        i: usize,
        now: u64,
        intended: u64,
    ) -> Result<(), String> {
        let t = now_ns().max(now);
        self.slots[i] = Slot {
            sent_at: t,
            intended: intended.min(t),
            outstanding: true,
        };
        let counted = self.in_window(t);
        if counted {
            self.rec.sent += 1;
        }
        if !g.start(i, t)? && counted {
            self.rec.errors += 1;
        }
        Ok(())
    }

    /// Open loop: sends every request that is due, as long as there are idle clients.
    fn dispatch<G: Generator>(&mut self, g: &mut G, now: u64) -> Result<(), String> {
        while let Some((i, due)) = self.pacing.next_due(now) {
            self.start(g, i, now, due)?;
        }
        Ok(())
    }

    /// Starts the next requests of the clients whose exchange ended.
    fn restart_ended<G: Generator>(&mut self, g: &mut G) -> Result<(), String> {
        let mut ended = std::mem::take(&mut self.ended);
        for &(i, t) in &ended {
            if self.pacing.release(i) {
                self.start(g, i, t, t)?;
            } else {
                self.dispatch(g, t)?;
            }
        }
        ended.clear();
        self.ended = ended;
        Ok(())
    }

    /// Counts timed-out requests as lost (and those the generator gives up on).
    fn expire<G: Generator>(&mut self, g: &mut G, now: u64, timeout: u64) {
        for i in 0..self.slots.len() {
            let s = self.slots[i];
            if !s.outstanding {
                continue;
            }
            let timed_out = now.saturating_sub(s.sent_at) >= timeout;
            if timed_out || g.tick(i, now) {
                if self.in_window(now) {
                    self.rec.lost += 1;
                }
                g.lost(i);
                self.end_exchange(i, now);
            }
        }
    }

    /// Runs the step until its end, Ctrl-C, or a fatal error of the generator.
    pub(crate) fn run<G: Generator>(
        &mut self,
        g: &mut G,
        shared: &StepShared,
    ) -> Result<(), String> {
        let timeout = shared.timeout_ns;
        let scan_every = g.scan_every(timeout);
        let start = now_ns();
        for i in self.pacing.start(self.slots.len(), start) {
            self.start(g, i, start, start)?;
        }
        self.dispatch(g, start)?;
        let mut next_scan = start + scan_every;
        let (mut reported, mut reported_other) = (0u64, 0u64);
        loop {
            let now = now_ns();
            if now >= self.end || shared.stopping() {
                return Ok(());
            }
            if now >= next_scan {
                self.expire(g, now, timeout);
                next_scan = now + scan_every;
            }
            self.restart_ended(g)?;
            self.dispatch(g, now)?;
            let mut wake = next_scan.min(self.end);
            if let Some(due) = self.pacing.wake() {
                wake = wake.min(due);
            }
            g.poll(wake.saturating_sub(now).min(MAX_WAIT_NS), self)?;
            self.restart_ended(g)?;
            if self.done != reported {
                shared
                    .progress
                    .fetch_add(self.done - reported, Ordering::Relaxed);
                reported = self.done;
            }
            if self.other != reported_other {
                shared
                    .progress_other
                    .fetch_add(self.other - reported_other, Ordering::Relaxed);
                reported_other = self.other;
            }
        }
    }
}

/// Runs one thread's share of a step: builds its generator with `setup`, reports
/// `ready`, waits for `go`, then runs the engine until the step ends.
///
/// `interval_ns` selects the open loop: one request every `interval_ns` nanoseconds
/// from this thread.
pub(crate) fn run_thread<G: Generator>(
    shared: &StepShared,
    interval_ns: Option<u64>,
    setup: impl FnOnce() -> Result<G, String>,
) -> Result<Recorder, String> {
    let generator = setup();
    if generator.is_err() {
        shared.abort.store(true, Ordering::SeqCst);
    }
    shared.ready.fetch_add(1, Ordering::SeqCst);
    while !shared.go.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    let mut g = generator?;
    let mut ex = Exchanges::new(
        g.clients(),
        shared.measure_start_ns.load(Ordering::SeqCst),
        shared.end_ns.load(Ordering::SeqCst),
        interval_ns,
    );
    ex.run(&mut g, shared)?;
    Ok(ex.rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_writes_its_number_over_the_placeholder() {
        let mut template = b"\x58\x02\0\0tokenxyz?ep=bench-{client}&lt=60".to_vec();
        let at = client_field(&template).unwrap();
        write_client_number(&mut template[at..], 42);
        assert_eq!(&template[at - 6..at + 8], b"bench-00000042");
        write_client_number(&mut template[at..], 123_456_789);
        assert_eq!(&template[at..at + 8], b"23456789", "wraps at 10^8");
        assert_eq!(client_field(b"no placeholder here"), None);
    }
}

//! The endpoint's timers, with lazy cancellation: timers are never removed when they
//! become moot; the endpoint checks on expiry whether the state that armed a timer
//! still wants it, so cancelling is free.
//!
//! Timers with varying delays (retransmissions) sit in a min-heap. The one timer every
//! confirmable request arms — the separate-ACK deadline — always has the same delay, so
//! those deadlines arrive in order and live in a FIFO: O(1) to arm and to expire, which
//! matters at hundreds of thousands of requests per second. The FIFO holds one second of
//! requests at full rate (24 bytes each, about 3 MB at 130,000 requests per second) and
//! gives its capacity back after a burst.

use super::ids::{ExchangeId, RequestId};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::SocketAddr;
use std::time::Instant;

/// What a timer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Timer {
    /// Retransmit the CON sent to this peer with this MID, or give up.
    Retransmit(SocketAddr, u16),
    /// Send an empty ACK if the handler has not answered yet.
    SeparateAck(ExchangeId),
    /// Give up waiting for a response.
    ClientDeadline(RequestId),
    /// Rotate the deduplication generations and sweep idle peers.
    Housekeeping,
    /// Message IDs to this peer may be used again: send what is queued.
    MidsFree(SocketAddr),
    /// The NON rate allows the next held notification to this peer.
    NonPacer(SocketAddr),
    /// Send the address-verification ping with this MID again, or give up.
    Probe(SocketAddr, u16),
}

/// Deadlines in time order.
#[derive(Debug, Default)]
pub(crate) struct TimerQueue {
    heap: BinaryHeap<Reverse<(Instant, Timer)>>,
    /// Separate-ACK deadlines in time order.
    acks: VecDeque<(Instant, ExchangeId)>,
}

/// The FIFO keeps at most this many slots beyond four times its length.
const ACKS_MIN_CAPACITY: usize = 1024;

impl TimerQueue {
    /// Arms a timer with any deadline.
    pub(crate) fn arm(&mut self, at: Instant, timer: Timer) {
        self.heap.push(Reverse((at, timer)));
    }

    /// Arms the separate-ACK timer of an exchange. Its deadline is normally not earlier
    /// than any armed before (a constant delay from a monotonic `now`); one that is
    /// goes to the heap.
    pub(crate) fn arm_separate_ack(&mut self, at: Instant, id: ExchangeId) {
        match self.acks.back() {
            Some((last, _)) if *last > at => self.arm(at, Timer::SeparateAck(id)),
            _ => self.acks.push_back((at, id)),
        }
    }

    /// Drops the separate-ACK deadline of an exchange just answered when it is the
    /// first in line, as it is when requests are answered in the order they came (an
    /// inline handler's are): a moot deadline would otherwise fire a second later, and
    /// under load keep the next deadline always near. One answered out of order stays
    /// until it fires (and is moot then).
    pub(crate) fn disarm_separate_ack(&mut self, id: ExchangeId) {
        if self.acks.front().is_some_and(|(_, first)| *first == id) {
            self.pop_ack();
        }
    }

    /// Earliest deadline (possibly of a moot timer).
    pub(crate) fn next(&self) -> Option<Instant> {
        let heap = self.heap.peek().map(|Reverse((at, _))| *at);
        let fifo = self.acks.front().map(|(at, _)| *at);
        match (heap, fifo) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Removes and returns the earliest timer due at or before `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(Instant, Timer)> {
        let heap = self
            .heap
            .peek()
            .map(|Reverse((at, _))| *at)
            .filter(|at| *at <= now);
        let fifo = self.acks.front().map(|(at, _)| *at).filter(|at| *at <= now);
        match (heap, fifo) {
            (Some(h), Some(f)) if f < h => self.pop_ack(),
            (Some(_), _) => {
                let t = self.heap.pop().map(|Reverse(t)| t);
                // A burst (a retransmission timer for each of 10,000 registrations, moot
                // once answered) leaves the heap its room when it has fired: give that
                // back now, not at the next housekeeping a minute later.
                self.shrink();
                t
            }
            (None, Some(_)) => self.pop_ack(),
            (None, None) => None,
        }
    }

    /// Gives the heap's memory back after a burst of timers (e.g. a retransmission
    /// timer for each of 100,000 confirmable notifications) has fired (also done as
    /// they fire).
    pub(crate) fn shrink(&mut self) {
        crate::tables::shrink_when_sparse(&mut self.heap);
    }

    /// Slots the timers hold, used or not (for tests of memory coming back).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.heap.capacity() + self.acks.capacity()
    }

    fn pop_ack(&mut self) -> Option<(Instant, Timer)> {
        let (at, id) = self.acks.pop_front()?;
        if self.acks.capacity() > ACKS_MIN_CAPACITY.max(4 * self.acks.len()) {
            self.acks
                .shrink_to(ACKS_MIN_CAPACITY.max(2 * self.acks.len()));
        }
        Some((at, Timer::SeparateAck(id)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn answering_in_order_takes_the_separate_ack_deadlines_away() {
        let t0 = Instant::now();
        let mut q = TimerQueue::default();
        let at = |ms| t0 + Duration::from_millis(ms);
        for id in 1..=3 {
            q.arm_separate_ack(at(1000 + id), ExchangeId(id));
        }
        q.disarm_separate_ack(ExchangeId(2)); // out of order: stays
        assert_eq!(q.next(), Some(at(1001)));
        q.disarm_separate_ack(ExchangeId(1));
        assert_eq!(
            q.next(),
            Some(at(1002)),
            "the second is moot but still armed"
        );
        q.arm(at(50), Timer::ClientDeadline(RequestId(9)));
        q.disarm_separate_ack(ExchangeId(2));
        q.disarm_separate_ack(ExchangeId(3));
        assert_eq!(q.next(), Some(at(50)), "only the heap's timer is left");
        assert!(q.pop_due(at(5000)).is_some() && q.pop_due(at(5000)).is_none());
    }

    #[test]
    fn heap_and_fifo_fire_in_deadline_order() {
        let t0 = Instant::now();
        let mut q = TimerQueue::default();
        let at = |ms| t0 + Duration::from_millis(ms);
        q.arm_separate_ack(at(10), ExchangeId(1));
        q.arm(at(5), Timer::ClientDeadline(RequestId(1)));
        q.arm_separate_ack(at(20), ExchangeId(2));
        q.arm_separate_ack(at(15), ExchangeId(3)); // out of order: heap
        q.arm(at(30), Timer::ClientDeadline(RequestId(4)));
        assert_eq!(q.next(), Some(at(5)));
        let fired: Vec<Instant> = std::iter::from_fn(|| q.pop_due(at(25)))
            .map(|t| t.0)
            .collect();
        assert_eq!(fired, vec![at(5), at(10), at(15), at(20)]);
        assert_eq!(q.next(), Some(at(30)));
        assert!(q.pop_due(at(29)).is_none());
    }

    #[test]
    fn the_heap_gives_its_capacity_back_as_a_burst_fires() {
        let t0 = Instant::now();
        let mut q = TimerQueue::default();
        for i in 0..10_000u64 {
            q.arm(
                t0 + Duration::from_millis(i),
                Timer::ClientDeadline(RequestId(i)),
            );
        }
        assert!(q.heap.capacity() >= 10_000);
        let later = t0 + Duration::from_secs(10);
        assert_eq!(std::iter::from_fn(|| q.pop_due(later)).count(), 10_000);
        assert!(
            q.heap.capacity() <= crate::tables::KEEP,
            "{}",
            q.heap.capacity()
        );
    }

    #[test]
    fn the_fifo_gives_its_capacity_back_after_a_burst() {
        let t0 = Instant::now();
        let mut q = TimerQueue::default();
        for i in 0..100_000u64 {
            q.arm_separate_ack(t0 + Duration::from_micros(i), ExchangeId(i));
        }
        assert!(q.acks.capacity() >= 100_000);
        let later = t0 + Duration::from_secs(1);
        assert_eq!(std::iter::from_fn(|| q.pop_due(later)).count(), 100_000);
        assert!(
            q.acks.capacity() <= ACKS_MIN_CAPACITY * 2,
            "{}",
            q.acks.capacity()
        );
    }
}

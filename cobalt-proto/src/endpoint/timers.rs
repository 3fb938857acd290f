//! The endpoint's timers, with lazy cancellation: timers are never removed when they
//! become moot; the endpoint checks on expiry whether the state that armed a timer
//! still wants it, so cancelling is free.
//!
//! Timers with varying delays (retransmissions) sit in a min-heap. The one timer every
//! confirmable request arms — the separate-ACK deadline — always has the same delay, so
//! those deadlines arrive in order and live in a FIFO: O(1) to arm and to expire, which
//! matters at hundreds of thousands of requests per second.

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
    fifo: VecDeque<(Instant, Timer)>,
}

impl TimerQueue {
    /// Arms a timer with any deadline.
    pub(crate) fn arm(&mut self, at: Instant, timer: Timer) {
        self.heap.push(Reverse((at, timer)));
    }

    /// Arms a timer whose deadline is not earlier than any armed with this method
    /// before (a constant delay from a monotonic `now`); falls back to the heap otherwise.
    pub(crate) fn arm_in_order(&mut self, at: Instant, timer: Timer) {
        match self.fifo.back() {
            Some((last, _)) if *last > at => self.arm(at, timer),
            _ => self.fifo.push_back((at, timer)),
        }
    }

    /// Earliest deadline (possibly of a moot timer).
    pub(crate) fn next(&self) -> Option<Instant> {
        let heap = self.heap.peek().map(|Reverse((at, _))| *at);
        let fifo = self.fifo.front().map(|(at, _)| *at);
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
        let fifo = self.fifo.front().map(|(at, _)| *at).filter(|at| *at <= now);
        match (heap, fifo) {
            (Some(h), Some(f)) if f < h => self.fifo.pop_front(),
            (Some(_), _) => self.heap.pop().map(|Reverse(t)| t),
            (None, Some(_)) => self.fifo.pop_front(),
            (None, None) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn heap_and_fifo_fire_in_deadline_order() {
        let t0 = Instant::now();
        let mut q = TimerQueue::default();
        let at = |ms| t0 + Duration::from_millis(ms);
        q.arm_in_order(at(10), Timer::Housekeeping);
        q.arm(at(5), Timer::ClientDeadline(RequestId(1)));
        q.arm_in_order(at(20), Timer::SeparateAck(ExchangeId(2)));
        q.arm_in_order(at(15), Timer::SeparateAck(ExchangeId(3))); // out of order: heap
        q.arm(at(30), Timer::ClientDeadline(RequestId(4)));
        assert_eq!(q.next(), Some(at(5)));
        let fired: Vec<Instant> = std::iter::from_fn(|| q.pop_due(at(25)))
            .map(|t| t.0)
            .collect();
        assert_eq!(fired, vec![at(5), at(10), at(15), at(20)]);
        assert_eq!(q.next(), Some(at(30)));
        assert!(q.pop_due(at(29)).is_none());
    }
}

//! The endpoint's timer queue: a min-heap of deadlines with lazy cancellation.
//!
//! Timers are never removed when they become moot; the endpoint checks on expiry
//! whether the state that armed a timer still wants it. That keeps arming O(log n)
//! and cancelling free.

use super::{ExchangeId, RequestId};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
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
}

/// Deadlines in time order.
#[derive(Debug, Default)]
pub(crate) struct TimerQueue {
    heap: BinaryHeap<Reverse<(Instant, Timer)>>,
}

impl TimerQueue {
    pub(crate) fn arm(&mut self, at: Instant, timer: Timer) {
        self.heap.push(Reverse((at, timer)));
    }

    /// Earliest deadline (possibly of a moot timer).
    pub(crate) fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// Removes and returns the earliest timer due at or before `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(Instant, Timer)> {
        match self.heap.peek() {
            Some(Reverse((at, _))) if *at <= now => self.heap.pop().map(|Reverse(t)| t),
            _ => None,
        }
    }
}

//! Reliability: confirmable messages retransmitted with binary exponential backoff
//! until acknowledged, reset, or given up after MAX_RETRANSMIT.

use super::*;

impl Endpoint {
    pub(super) fn send_confirmable(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        mid: u16,
        bytes: Vec<u8>,
        owner: Owner,
    ) {
        let factor = if self.config.ack_random_factor > 1.0 {
            self.rng.random_range(1.0..self.config.ack_random_factor)
        } else {
            1.0
        };
        let timeout = self.config.ack_timeout.mul_f64(factor);
        let next_at = now + timeout;
        self.transmit(peer, bytes.clone());
        self.pending.insert(
            (peer, mid),
            PendingCon {
                bytes,
                owner,
                retransmissions: 0,
                timeout,
                next_at,
                budget: None,
            },
        );
        self.timers.arm(next_at, Timer::Retransmit(peer, mid));
    }

    pub(super) fn on_retransmit_timer(
        &mut self,
        now: Instant,
        at: Instant,
        peer: SocketAddr,
        mid: u16,
    ) {
        let Some(p) = self.pending.get_mut(&(peer, mid)) else {
            return;
        };
        if p.next_at != at {
            return;
        }
        let affordable = p.budget.is_none_or(|b| b >= p.bytes.len());
        if p.retransmissions < self.config.max_retransmit && affordable {
            if let Some(b) = &mut p.budget {
                *b -= p.bytes.len();
            }
            p.retransmissions += 1;
            p.timeout *= 2;
            p.next_at = now + p.timeout;
            let (next_at, bytes) = (p.next_at, p.bytes.clone());
            self.stats.retransmissions += 1;
            self.timers.arm(next_at, Timer::Retransmit(peer, mid));
            self.transmit(peer, bytes);
            return;
        }
        let Some(p) = self.pending.remove(&(peer, mid)) else {
            return;
        };
        match p.owner {
            Owner::Client(id) => self.fail_client(
                now,
                id,
                Event::Timeout {
                    id,
                    retransmissions: p.retransmissions,
                },
            ),
            Owner::Server(id) => self.events.push_back(Event::ResponseFailed {
                id,
                reason: DeliveryFailure::Timeout,
            }),
        }
    }

    /// Limits the retransmissions of a confirmable message to `budget` bytes.
    pub(super) fn limit_retransmissions(&mut self, peer: SocketAddr, mid: u16, budget: usize) {
        if let Some(p) = self.pending.get_mut(&(peer, mid)) {
            p.budget = Some(budget);
        }
    }

    pub(super) fn handle_reset(&mut self, now: Instant, peer: SocketAddr, mid: u16) {
        if self.probe_answered(now, peer, mid) {
            return;
        }
        let Some(p) = self.pending.remove(&(peer, mid)) else {
            // Possibly the answer to a NON notification: the application knows.
            self.stats.unmatched += 1;
            self.events.push_back(Event::UnmatchedReset { peer, mid });
            return;
        };
        // The RST proves that the peer receives at its address.
        self.verified(now, peer);
        match p.owner {
            Owner::Client(id) => self.fail_client(now, id, Event::Reset { id }),
            Owner::Server(id) => self.events.push_back(Event::ResponseFailed {
                id,
                reason: DeliveryFailure::Reset,
            }),
        }
    }
}

//! The request schedule shared by the CoAP and HTTP generators: closed loop (a client
//! sends its next request as soon as the previous one ends) or open loop (a request is
//! due every `interval` nanoseconds, on whichever client is idle, and its latency counts
//! from that intended time, so a slow server cannot hide behind coordinated omission).

/// One generator thread's schedule.
#[derive(Debug)]
pub(crate) struct Pacing {
    /// Open loop: nanoseconds between intended sends.
    interval: Option<u64>,
    /// Open loop: intended time of the next request.
    next_due: u64,
    /// Open loop: clients with no request in flight.
    idle: Vec<u32>,
}

impl Pacing {
    /// A closed loop (`None`) or an open loop with one request every `interval_ns`.
    pub(crate) fn new(interval_ns: Option<u64>) -> Pacing {
        Pacing {
            interval: interval_ns.map(|i| i.max(1)),
            next_due: 0,
            idle: Vec::new(),
        }
    }

    /// True with a schedule (`--rate`), false in the closed loop.
    pub(crate) fn is_open_loop(&self) -> bool {
        self.interval.is_some()
    }

    /// Starts the schedule at `start` for `clients` clients; returns the clients that
    /// send at once (all of them in the closed loop, none in the open loop).
    pub(crate) fn start(&mut self, clients: usize, start: u64) -> std::ops::Range<usize> {
        if self.interval.is_some() {
            self.idle = (0..clients as u32).rev().collect();
            self.next_due = start;
            0..0
        } else {
            0..clients
        }
    }

    /// The next client whose request is due at `now`, with the request's intended time.
    pub(crate) fn next_due(&mut self, now: u64) -> Option<(usize, u64)> {
        let interval = self.interval?;
        if self.next_due > now {
            return None;
        }
        // No idle client: requests queue up, their latency keeps counting from `next_due`.
        let i = self.idle.pop()?;
        let due = self.next_due;
        self.next_due += interval;
        Some((i as usize, due))
    }

    /// A client's exchange ended: true if it sends again at once (closed loop); in the
    /// open loop it waits for the schedule.
    pub(crate) fn release(&mut self, client: usize) -> bool {
        if self.interval.is_some() {
            self.idle.push(client as u32);
            false
        } else {
            true
        }
    }

    /// When the loop must wake up for the schedule, if it must.
    pub(crate) fn wake(&self) -> Option<u64> {
        (self.interval.is_some() && !self.idle.is_empty()).then_some(self.next_due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_loop_sends_all_at_once_and_again_on_release() {
        let mut p = Pacing::new(None);
        assert!(!p.is_open_loop());
        assert_eq!(p.start(3, 100), 0..3);
        assert_eq!(p.next_due(1_000), None);
        assert!(p.release(1));
        assert_eq!(p.wake(), None);
    }

    #[test]
    fn open_loop_spaces_requests_and_queues_when_no_client_is_idle() {
        let mut p = Pacing::new(Some(10));
        assert!(p.is_open_loop());
        assert_eq!(p.start(2, 100), 0..0);
        assert_eq!(p.wake(), Some(100));
        assert_eq!(p.next_due(105), Some((0, 100)));
        assert_eq!(p.next_due(105), None, "next one is due at 110");
        assert_eq!(p.next_due(125), Some((1, 110)));
        assert_eq!(
            p.next_due(125),
            None,
            "no idle client: the 120 request waits"
        );
        assert!(!p.release(0));
        assert_eq!(p.next_due(125), Some((0, 120)), "latency counts from 120");
    }
}

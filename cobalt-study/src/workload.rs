//! What a client does, independent of how it runs: its plan (one flow of 50 exchanges,
//! or short-lived flows of U{1..10}), and for CoAP over UDP the exchange logic itself,
//! driven over a Cobalt [`Endpoint`] in virtual time or over real sockets.

use crate::case::{Variant, Workload, EXCHANGES, MAX_RETRANSMIT, TOKEN_LEN};
use cobalt_proto::endpoint::{Endpoint, EndpointConfig, Event, RequestId};
use cobalt_proto::message::{Code, Message, MessageType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The Uri-Path of the resource every client GETs.
pub const PATH: &str = "r";

/// Exchanges of each short-lived client, adding up to [`EXCHANGES`]: one flow of 50 for
/// continuous clients, U{1..10} each (the last one cut to fit) for random clients.
pub fn plan(workload: Workload, seed: u64) -> Vec<u32> {
    match workload {
        Workload::Continuous => vec![EXCHANGES],
        Workload::Random => {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut left = EXCHANGES;
            let mut v = Vec::new();
            while left > 0 {
                let n = rng.random_range(1..=10).min(left);
                v.push(n);
                left -= n;
            }
            v
        }
    }
}

/// The endpoint configuration of a UDP client of `variant`.
pub fn client_config(variant: Variant) -> EndpointConfig {
    EndpointConfig {
        congestion_control: variant.algorithm().unwrap_or_default(),
        max_retransmit: MAX_RETRANSMIT,
        token_len: TOKEN_LEN,
        ..EndpointConfig::default()
    }
}

/// The request every client sends: a confirmable GET of [`PATH`].
pub fn request() -> Message {
    let mut get = Message::new(MessageType::Confirmable, Code::GET, 0);
    get.options.set_uri_path(PATH);
    get
}

/// What a client's driver must do after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing (the request is under way).
    Wait,
    /// Start the next short-lived client: a new socket and a fresh endpoint, then
    /// [`UdpClient::send`].
    NewSession,
    /// All exchanges are done.
    Finished,
}

/// One CoAP-over-UDP client's progress through its plan.
#[derive(Debug, Clone)]
pub struct UdpClient {
    server: SocketAddr,
    plan: Vec<u32>,
    session: usize,
    left_in_session: u32,
    /// Exchanges completed.
    pub done: u32,
    /// When the first request left.
    pub started: Option<Instant>,
    /// When the last response arrived.
    pub finished: Option<Instant>,
    /// Retransmissions of the endpoints that are gone (add the current one's).
    pub retransmissions: u64,
    /// Exchanges that ended in a timeout (after MAX_RETRANSMIT) and were repeated.
    pub failures: u64,
    pending: Option<RequestId>,
}

impl UdpClient {
    /// A client with `plan` talking to `server`.
    pub fn new(server: SocketAddr, plan: Vec<u32>) -> UdpClient {
        let first = plan.first().copied().unwrap_or(0);
        UdpClient {
            server,
            plan,
            session: 0,
            left_in_session: first,
            done: 0,
            started: None,
            finished: None,
            retransmissions: 0,
            failures: 0,
            pending: None,
        }
    }

    /// Sends the next request on `ep` (the first one starts the clock).
    pub fn send(&mut self, now: Instant, ep: &mut Endpoint) {
        self.started.get_or_insert(now);
        self.pending = ep.request(now, self.server, request()).ok();
    }

    /// Counts the retransmissions of an endpoint about to be replaced or finished.
    pub fn retire(&mut self, ep: &Endpoint) {
        self.retransmissions += ep.stats().retransmissions;
    }

    /// Handles an event of the client's endpoint.
    pub fn on_event(&mut self, now: Instant, ep: &mut Endpoint, event: Event) -> Next {
        match event {
            Event::Response { id, response } if Some(id) == self.pending => {
                self.pending = None;
                if !response.code.is_success() {
                    // Not counted: try again.
                    self.failures += 1;
                    self.send(now, ep);
                    return Next::Wait;
                }
                self.done += 1;
                self.left_in_session = self.left_in_session.saturating_sub(1);
                if self.done >= EXCHANGES {
                    self.finished = Some(now);
                    return Next::Finished;
                }
                if self.left_in_session == 0 {
                    self.session += 1;
                    self.left_in_session = self.plan.get(self.session).copied().unwrap_or(1);
                    return Next::NewSession;
                }
                self.send(now, ep);
                Next::Wait
            }
            Event::Timeout { id, .. } | Event::Reset { id, .. } if Some(id) == self.pending => {
                self.failures += 1;
                self.send(now, ep);
                Next::Wait
            }
            _ => Next::Wait,
        }
    }

    /// Flow completion time.
    pub fn fct(&self) -> Option<Duration> {
        Some(self.finished?.duration_since(self.started?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_add_up_to_fifty() {
        assert_eq!(plan(Workload::Continuous, 1), [50]);
        for seed in 0..100 {
            let p = plan(Workload::Random, seed);
            assert_eq!(p.iter().sum::<u32>(), 50);
            assert!(p.iter().all(|n| (1..=10).contains(n)));
            assert!(p.len() >= 5);
        }
        assert_ne!(plan(Workload::Random, 1), plan(Workload::Random, 2));
    }
}

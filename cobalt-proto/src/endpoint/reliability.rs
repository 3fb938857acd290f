//! Reliability: confirmable messages retransmitted until acknowledged, reset, or given
//! up after MAX_RETRANSMIT, on the timeouts of the peer's congestion controller
//! ([`crate::congestion`]), which learns from every answer.

use super::*;
use crate::congestion::{CongestionStats, SharedFactory};

impl Endpoint {
    /// Runs the congestion-control algorithm of `factory` instead of the configured
    /// [`EndpointConfig::congestion_control`] for every peer (what was learnt so far is
    /// forgotten).
    pub fn set_congestion_factory(&mut self, factory: SharedFactory) {
        let places = &mut self.peers.congestion_places();
        self.congestion.set_factory(factory, places);
    }

    /// The overall RTO estimate for `peer`, if its algorithm keeps one and the peer has
    /// congestion state.
    pub fn congestion_rto(&mut self, now: Instant, peer: SocketAddr) -> Option<Duration> {
        let places = &mut self.peers.congestion_places();
        self.congestion.rto(now, places, peer)
    }

    /// Peers with congestion state.
    pub fn congestion_peers(&self) -> usize {
        self.congestion.len()
    }

    /// Counters of the congestion layer.
    pub fn congestion_stats(&self) -> CongestionStats {
        self.congestion.stats()
    }

    /// The confirmable message to `peer` with `mid` is no longer pending: an answer
    /// (`answered`) or the end of trying. Returns it (its bytes go back to the spare
    /// buffers).
    pub(super) fn finish_pending(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        mid: u16,
        answered: bool,
    ) -> Option<PendingCon> {
        let mut p = self.pending.remove(&(peer, mid))?;
        // A burst (a client registering with 10,000 servers at once) leaves the table
        // its room when it has drained: give that back, not at the next housekeeping.
        crate::tables::shrink_when_sparse(&mut self.pending);
        self.spare.give(std::mem::take(&mut p.bytes));
        let places = &mut self.peers.congestion_places();
        if answered {
            self.congestion.answered(now, places, peer, &p.attempt);
        } else {
            self.congestion.abandoned(now, places, peer, &p.attempt);
        }
        Some(p)
    }

    pub(super) fn send_confirmable(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        mid: u16,
        bytes: Vec<u8>,
        owner: Owner,
    ) {
        let places = &mut self.peers.congestion_places();
        let attempt = self.congestion.begin(now, places, peer, &mut self.rng);
        let next_at = now + attempt.timeout;
        let copy = self.spare.copy(&bytes);
        self.transmit(peer, copy);
        self.pending.insert(
            (peer, mid),
            PendingCon {
                bytes,
                owner,
                attempt,
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
        // Never retransmit later than MAX_TRANSMIT_SPAN after the first transmission:
        // the peer's deduplication (EXCHANGE_LIFETIME) must still know the message.
        // Algorithms with long or retained timers give up sooner instead.
        let in_span =
            now.saturating_duration_since(p.attempt.first_sent) <= self.config.max_transmit_span();
        let affordable = p.budget.is_none_or(|b| b >= p.bytes.len());
        if p.attempt.retransmissions < self.config.max_retransmit && in_span && affordable {
            if let Some(b) = &mut p.budget {
                *b -= p.bytes.len();
            }
            let places = &mut self.peers.congestion_places();
            self.congestion.backoff(now, places, peer, &mut p.attempt);
            p.next_at = now + p.attempt.timeout;
            let (next_at, bytes) = (p.next_at, self.spare.copy(&p.bytes));
            self.stats.retransmissions += 1;
            self.timers.arm(next_at, Timer::Retransmit(peer, mid));
            self.transmit(peer, bytes);
            return;
        }
        self.give_up_pending(now, peer, mid);
    }

    /// Ends the confirmable `mid` to `peer` unacknowledged: its client exchange fails
    /// with [`Event::Timeout`], a server's response with [`Event::ResponseFailed`].
    pub(super) fn give_up_pending(&mut self, now: Instant, peer: SocketAddr, mid: u16) {
        let Some(p) = self.finish_pending(now, peer, mid, false) else {
            return;
        };
        match p.owner {
            Owner::Client(id) => self.fail_client(
                now,
                id,
                Event::Timeout {
                    id,
                    peer,
                    retransmissions: p.attempt.retransmissions,
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
        // An RST answers the message: the peer got it, so its RTT is a sample.
        let Some(p) = self.finish_pending(now, peer, mid, true) else {
            // Possibly the answer to a NON notification: the application knows.
            self.stats.unmatched += 1;
            self.events.push_back(Event::UnmatchedReset { peer, mid });
            return;
        };
        // The RST proves that the peer receives at its address.
        self.verified(now, peer);
        match p.owner {
            Owner::Client(id) => self.fail_client(now, id, Event::Reset { id, peer }),
            Owner::Server(id) => self.events.push_back(Event::ResponseFailed {
                id,
                reason: DeliveryFailure::Reset,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::congestion::Algorithm;

    fn endpoint(algorithm: Algorithm, now: Instant, seed: u64) -> Endpoint {
        let config = EndpointConfig {
            congestion_control: algorithm,
            max_retransmit: 20,
            ..EndpointConfig::default()
        };
        Endpoint::with_seed(config, now, seed)
    }

    /// Runs `exchanges` GETs one after another from a client to a server over a path
    /// whose every datagram takes `one_way`; returns the client's retransmissions of
    /// each exchange.
    fn sequential(algorithm: Algorithm, one_way: Duration, exchanges: usize) -> Vec<u64> {
        let t0 = Instant::now();
        let (c, s): (SocketAddr, SocketAddr) = (
            "10.0.0.1:40000".parse().unwrap(),
            "10.0.0.2:5683".parse().unwrap(),
        );
        let mut client = endpoint(algorithm, t0, 1);
        let mut server = endpoint(Algorithm::Default, t0, 2);
        // (arrival, to_server, bytes)
        let mut wire: Vec<(Instant, bool, Vec<u8>)> = Vec::new();
        let mut now = t0;
        let mut per_exchange = Vec::new();
        for _ in 0..exchanges {
            let before = client.stats().retransmissions;
            let mut get = Message::new(MessageType::Confirmable, Code::GET, 0);
            get.options.set_uri_path("/r");
            let id = client.request(now, s, get).unwrap();
            loop {
                // The server answers at once: its answer leaves with what else it sends now.
                while let Some(ev) = server.poll_event() {
                    if let Event::Request { id, .. } = ev {
                        let resp = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
                        server.respond(now, id, resp).unwrap();
                    }
                }
                while let Some(t) = client.poll_transmit() {
                    wire.push((now + one_way, true, t.bytes));
                }
                while let Some(t) = server.poll_transmit() {
                    wire.push((now + one_way, false, t.bytes));
                }
                if let Some(Event::Response { id: got, .. }) = client.poll_event() {
                    assert_eq!(got, id);
                    break;
                }
                let next_wire = wire.iter().map(|w| w.0).min();
                let next = [next_wire, client.poll_timeout(), server.poll_timeout()]
                    .into_iter()
                    .flatten()
                    .min()
                    .expect("something is pending");
                now = next;
                let (due, rest): (Vec<_>, Vec<_>) = wire.drain(..).partition(|w| w.0 <= now);
                wire = rest;
                for (_, to_server, bytes) in due {
                    if to_server {
                        server.handle_datagram(now, c, &bytes);
                    } else {
                        client.handle_datagram(now, s, &bytes);
                    }
                }
                client.handle_timeout(now);
                server.handle_timeout(now);
            }
            per_exchange.push(client.stats().retransmissions - before);
        }
        per_exchange
    }

    #[test]
    fn default_coap_retransmits_every_exchange_when_the_rtt_exceeds_its_rto() {
        // RTT 3.2 s > the 2–3 s initial timeout, which Default CoAP never adapts.
        let r = sequential(Algorithm::Default, Duration::from_millis(1600), 6);
        assert!(r.iter().all(|n| *n >= 1), "{r:?}");
    }

    #[test]
    fn fasor_keeps_the_backed_off_timer_until_an_unambiguous_sample() {
        // FAST (spurious retransmission, SlowRTO 4.8 s) → FAST_SLOW_FAST (FastRTO
        // still too short: spurious again) → SLOW_FAST: the original waits SlowRTO,
        // gets an unambiguous 3.2 s sample, FastRTO becomes 4.8 s, and no exchange
        // retransmits again.
        let r = sequential(Algorithm::Fasor, Duration::from_millis(1600), 6);
        assert_eq!(r, [1, 1, 0, 0, 0, 0]);
    }

    #[test]
    fn cocoa_adapts_its_rto_from_weak_samples() {
        let r = sequential(Algorithm::Cocoa, Duration::from_millis(1600), 10);
        assert!(r[0] >= 1, "{r:?}");
        assert_eq!(r[5..], [0; 5], "{r:?}");
        // CoCoA-strong learns nothing from ambiguous exchanges while every exchange is
        // one: it behaves like Default CoAP.
        let r = sequential(Algorithm::CocoaStrong, Duration::from_millis(1600), 6);
        assert!(r.iter().all(|n| *n >= 1), "{r:?}");
    }

    #[test]
    fn every_algorithm_keeps_to_nstart() {
        for algorithm in Algorithm::ALL {
            for nstart in [1, 2] {
                let t0 = Instant::now();
                let config = EndpointConfig {
                    congestion_control: algorithm,
                    nstart,
                    ..EndpointConfig::default()
                };
                let mut c = Endpoint::with_seed(config, t0, 9);
                let s: SocketAddr = "10.0.0.2:5683".parse().unwrap();
                for _ in 0..5 {
                    let get = Message::new(MessageType::Confirmable, Code::GET, 0);
                    c.request(t0, s, get).unwrap();
                }
                // Nothing answers for 40 s (before any algorithm gives up an
                // exchange): only NSTART exchanges are on the wire, retransmitted,
                // never the queued ones.
                let mut mids = std::collections::HashSet::new();
                let mut now = t0;
                while now < t0 + Duration::from_secs(40) {
                    while let Some(t) = c.poll_transmit() {
                        mids.insert(codec::decode(&t.bytes).unwrap().mid);
                    }
                    now = c.poll_timeout().unwrap();
                    c.handle_timeout(now);
                }
                assert_eq!(mids.len(), nstart, "{algorithm} NSTART {nstart}");
            }
        }
    }

    #[test]
    fn no_algorithm_retransmits_beyond_max_transmit_span() {
        // RFC 7252 defaults: MAX_TRANSMIT_SPAN 45 s. A FASOR-K exchange answered after
        // four retransmissions (FastRTO ≈ 2.4 s doubled: the answer comes while the
        // 38 s timer runs) leaves K ≈ 38 s. The next exchange probes at FastRTO and
        // would then wait 2K ≈ 77 s: a retransmission that late could reach a server
        // that has forgotten the message ID, so the endpoint gives up instead.
        let t0 = Instant::now();
        let config = EndpointConfig {
            congestion_control: Algorithm::FasorK,
            ..EndpointConfig::default()
        };
        let mut c = Endpoint::with_seed(config, t0, 5);
        let s: SocketAddr = "10.0.0.2:5683".parse().unwrap();
        let mut now = t0;
        let mut sends: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
        let mut outcome = Vec::new();
        for (round, sent) in sends.iter_mut().enumerate() {
            let mut get = Message::new(MessageType::Confirmable, Code::GET, 0);
            get.options.set_uri_path("/r");
            c.request(now, s, get).unwrap();
            let start = now;
            let ev = loop {
                while let Some(t) = c.poll_transmit() {
                    sent.push(now.duration_since(start));
                    if round == 0 && sent.len() == 5 {
                        let req = codec::decode(&t.bytes).unwrap();
                        let mut resp =
                            Message::new(MessageType::Acknowledgement, Code::CONTENT, req.mid);
                        resp.token = req.token;
                        c.handle_datagram(now, s, &codec::encode(&resp));
                    }
                }
                if let Some(ev) = c.poll_event() {
                    break ev;
                }
                now = c.poll_timeout().unwrap().max(now);
                c.handle_timeout(now);
            };
            outcome.push((
                matches!(ev, Event::Response { .. }),
                now.duration_since(start),
            ));
        }
        assert_eq!(sends[0].len(), 5);
        assert!(outcome[0].0, "the first exchange is answered");
        assert_eq!(sends[1].len(), 2, "{:?}", sends[1]);
        assert!(sends[1].iter().all(|d| *d <= Duration::from_secs(45)));
        assert!(
            !outcome[1].0 && outcome[1].1 > Duration::from_secs(45),
            "{outcome:?}"
        );
    }

    #[test]
    fn an_address_flood_neither_grows_congestion_state_nor_erases_a_known_peers() {
        let t0 = Instant::now();
        // Without the amplification limit, so that CON notifications go to every
        // address at once (with it, unverified addresses would get none at all).
        let config = EndpointConfig {
            congestion_control: Algorithm::Cocoa,
            max_congestion_peers: 8,
            amplification_factor: 0,
            ..EndpointConfig::default()
        };
        let mut server = Endpoint::with_seed(config, t0, 3);
        let token = Token::new(&[9]).unwrap();
        let legit: SocketAddr = "10.0.0.1:40000".parse().unwrap();
        let notify = |ep: &mut Endpoint, now: Instant, peer: SocketAddr| {
            let m = Message::new(MessageType::Confirmable, Code::CONTENT, 0);
            let (_, mid) = ep.notify(now, peer, token.clone(), m, true, None);
            while ep.poll_transmit().is_some() {}
            mid
        };
        // The legitimate client acknowledges within 200 ms: CoCoA learns from it.
        let mid = notify(&mut server, t0, legit);
        let t1 = t0 + Duration::from_millis(200);
        server.handle_datagram(t1, legit, &codec::encode(&Message::empty_ack(mid)));
        let learnt = server.congestion_rto(t1, legit).unwrap();
        assert!(learnt < Duration::from_secs(2), "{learnt:?}");
        // A thousand spoofed addresses that never answer.
        for i in 0..1000u32 {
            let spoofed = SocketAddr::from(([172, 16, (i >> 8) as u8, i as u8], 5683));
            notify(&mut server, t1, spoofed);
        }
        assert_eq!(server.congestion_peers(), 8);
        assert_eq!(server.congestion_rto(t1, legit), Some(learnt));
        assert!(server.congestion_stats().overflow >= 990);
        // A new legitimate peer is still served: its CON is sent and acknowledged.
        let newcomer: SocketAddr = "10.0.0.2:40000".parse().unwrap();
        let mid = notify(&mut server, t1, newcomer);
        assert!(server.is_unacknowledged(newcomer, mid));
        server.handle_datagram(t1, newcomer, &codec::encode(&Message::empty_ack(mid)));
        assert!(!server.is_unacknowledged(newcomer, mid));
    }

    /// One entry per peer holds its congestion state too: the entry lives as long as
    /// the longer of its two reasons (its own use for EXCHANGE_LIFETIME, 247 s; its
    /// congestion state for 255 s), and both go together.
    #[test]
    fn a_peer_entry_lives_as_long_as_its_congestion_state() {
        let t0 = Instant::now();
        let mut c = Endpoint::with_seed(EndpointConfig::default(), t0, 4);
        let s: SocketAddr = "10.0.0.2:5683".parse().unwrap();
        let get = Message::new(MessageType::Confirmable, Code::GET, 0);
        c.request(t0, s, get).unwrap();
        let req = codec::decode(&c.poll_transmit().unwrap().bytes).unwrap();
        let mut resp = Message::new(MessageType::Acknowledgement, Code::CONTENT, req.mid);
        resp.token = req.token;
        let t1 = t0 + Duration::from_millis(300);
        c.handle_datagram(t1, s, &codec::encode(&resp));
        assert!(matches!(c.poll_event(), Some(Event::Response { .. })));
        let learnt = c.congestion_rto(t1, s);
        assert!(
            learnt.is_some_and(|rto| rto < Duration::from_secs(2)),
            "{learnt:?}"
        );
        assert_eq!((c.state_counts().peers, c.congestion_peers()), (1, 1));
        let mut now = t1;
        let step = |c: &mut Endpoint, now: &mut Instant, until: Duration| {
            while *now < t1 + until {
                *now += Duration::from_secs(1);
                c.handle_timeout(*now);
            }
        };
        // Past the exchange lifetime, the congestion state keeps the entry.
        let life = c.config().exchange_lifetime();
        assert!(life < Duration::from_secs(250));
        step(&mut c, &mut now, Duration::from_secs(250));
        assert_eq!((c.state_counts().peers, c.congestion_peers()), (1, 1));
        assert_eq!(c.congestion_rto(now, s), learnt);
        // Past 255 s both are gone.
        step(&mut c, &mut now, Duration::from_secs(320));
        assert_eq!((c.state_counts().peers, c.congestion_peers()), (0, 0));
        assert_eq!(c.congestion_rto(now, s), None);
    }
}

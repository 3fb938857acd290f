//! A peer whose address changed: its state re-keyed from the old address to the new
//! one ([`Endpoint::move_peer`]).
//!
//! A DTLS session with a Connection ID (RFC 9146) keeps its peer across a NAT
//! rebinding: the transport authenticates a newer record from the new address and
//! moves the session there. The endpoint then moves what it keeps of that peer, so
//! that its requests in progress, the answers it is owed, its deduplication window,
//! its message IDs and congestion state, and the budgets they count against (per
//! peer, and per address key of [`EndpointConfig::max_exchanges_per_ip`]) are the
//! new address's, and the old address holds nothing.
//!
//! A move never creates state: what the old address had is what the new one gets.
//! What the new address had belongs to a peer that is gone (the transport ended the
//! session it had there): it is dropped, and the application is told as if those
//! messages had timed out. Address verification (RFC 9175 §2.4) does not move: a new
//! address is verified on its own, where verification is on.
//!
//! [`EndpointConfig::max_exchanges_per_ip`]: super::EndpointConfig::max_exchanges_per_ip

use super::timers::Timer;
use super::{Endpoint, Event, ExchangeId};
use std::net::SocketAddr;
use std::time::Instant;

impl Endpoint {
    /// Moves everything kept of the peer at `from` to `to`: the peer's address
    /// changed (a DTLS session moved by an authentic record with its Connection ID;
    /// call it only then, never for an address a datagram merely claims). What `to`
    /// held is dropped first: its unanswered requests are forgotten (answering them
    /// fails with [`UnknownExchange`](super::UnknownExchange)), its confirmable
    /// messages end as if unacknowledged ([`Event::ResponseFailed`],
    /// [`Event::Timeout`]). Returns whether `from` had anything to move.
    ///
    /// It takes time in the number of exchanges and confirmable messages the endpoint
    /// holds, so it is for the rare, authenticated address change, not per datagram.
    pub fn move_peer(&mut self, now: Instant, from: SocketAddr, to: SocketAddr) -> bool {
        if from == to || !self.peers.contains_key(&from) {
            return false;
        }
        self.drop_peer(now, to);
        let Some(mut peer) = self.peers.remove(&from) else {
            return false;
        };
        peer.last_used = self.peers.secs(now);
        peer.addr = to;
        for id in peer.in_progress.exchanges() {
            if let Some(ex) = self.server.get_mut(&ExchangeId(id)) {
                ex.peer = to;
            }
        }
        let in_progress = u32::try_from(peer.in_progress.len()).unwrap_or(u32::MAX);
        self.admission.transfer(&self.config, from, to, in_progress);
        let queued = !peer.queue_is_empty();
        // Its congestion state goes with it; held NON notifications are released
        // at the new address.
        let release_held = peer.congestion.as_mut().is_some_and(|c| c.moved());
        self.peers.insert(peer);
        // Confirmable messages on their way: retransmitted to `to`, on the timers
        // they had (the ones armed for `from` find nothing when they fire).
        for mid in self.pending_mids(from) {
            if let Some(p) = self.pending.remove(&(from, mid)) {
                self.timers.arm(p.next_at, Timer::Retransmit(to, mid));
                self.pending.insert((to, mid), p);
            }
        }
        let requests: Vec<_> = self
            .clients
            .iter()
            .filter(|(_, ex)| ex.peer == from)
            .map(|(id, _)| *id)
            .collect();
        for id in requests {
            if let Some(ex) = self.clients.get_mut(&id) {
                self.tokens.remove(id, &from, &ex.token);
                ex.peer = to;
                self.tokens.insert(&self.clients, id);
            }
        }
        self.dedup.move_peer(from, to);
        if release_held {
            self.timers.arm(now, Timer::NonPacer(to));
        }
        if queued {
            self.timers.arm(now, Timer::MidsFree(to));
        }
        true
    }

    /// Drops what is kept of `peer` (whose address now belongs to another), telling
    /// the application of the confirmable messages and queued requests that end.
    fn drop_peer(&mut self, now: Instant, peer: SocketAddr) {
        if let Some(mut gone) = self.peers.remove(&peer) {
            self.congestion.forget(&mut gone.congestion);
            for id in gone.in_progress.take_exchanges() {
                if self.server.remove(&ExchangeId(id)).is_some() {
                    self.admission.release(&self.config, peer);
                }
            }
            while let Some(id) = gone.dequeue() {
                self.fail_client(
                    now,
                    id,
                    Event::Timeout {
                        id,
                        peer,
                        retransmissions: 0,
                    },
                );
            }
        }
        for mid in self.pending_mids(peer) {
            self.give_up_pending(now, peer, mid);
        }
        self.dedup.forget(peer);
    }

    /// The message IDs of the confirmables on their way to `peer` (collected: the
    /// caller changes the table as it goes through them).
    fn pending_mids(&self, peer: SocketAddr) -> Vec<u16> {
        self.pending
            .keys()
            .filter(|(p, _)| *p == peer)
            .map(|(_, mid)| *mid)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::endpoint::{Endpoint, EndpointConfig, Event};
    use crate::message::{Code, Message, MessageType, Token};
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// A confirmable request: a GET (Observe: 0 when `observe`), or a POST (which a
    /// duplicate must not run again) when `post`.
    fn request(mid: u16, token: u8, observe: bool, post: bool) -> Vec<u8> {
        let code = if post { Code::POST } else { Code::GET };
        let mut m = Message::new(MessageType::Confirmable, code, mid);
        m.token = Token::new(&[token]).unwrap();
        if observe {
            m.options.set_uint(crate::message::opt::OBSERVE, 0);
        }
        m.options.set_uri_path("/value");
        crate::message::encode(&m)
    }

    fn get(mid: u16, token: u8, observe: bool) -> Vec<u8> {
        request(mid, token, observe, false)
    }

    fn request_id(ep: &mut Endpoint) -> crate::endpoint::ExchangeId {
        match ep.poll_event() {
            Some(Event::Request { id, .. }) => id,
            other => panic!("expected a request, got {other:?}"),
        }
    }

    #[test]
    fn a_moved_peer_keeps_its_requests_dedup_and_budget_at_its_new_address_only() {
        let now = Instant::now();
        let config = EndpointConfig {
            max_exchanges_per_peer: 2,
            max_exchanges_per_ip: 2,
            amplification_factor: 0,
            ..EndpointConfig::default()
        };
        let mut ep = Endpoint::with_seed(config, now, 7);
        let (old, new) = (addr("10.0.0.1:40000"), addr("10.0.0.2:50000"));
        // One request answered (remembered for duplicates), one in progress.
        ep.handle_datagram(now, old, &request(1, 1, false, true));
        let answered = request_id(&mut ep);
        ep.respond(
            now,
            answered,
            Message::new(MessageType::Acknowledgement, Code::CONTENT, 0),
        )
        .unwrap();
        ep.handle_datagram(now, old, &get(2, 2, false));
        let open = request_id(&mut ep);
        while ep.poll_transmit().is_some() {}

        assert!(ep.move_peer(now, old, new));
        assert!(
            !ep.move_peer(now, old, new),
            "nothing is left at the old address"
        );
        assert_eq!(ep.state_counts().peers, 1, "one entry, at the new address");

        // The duplicate of the answered request, from the new address, gets the
        // remembered answer and is not a new request.
        ep.handle_datagram(now, new, &request(1, 1, false, true));
        assert!(
            ep.poll_event().is_none(),
            "a duplicate is not handled again"
        );
        let again = ep.poll_transmit().expect("the remembered answer");
        assert_eq!(again.peer, new);
        assert_eq!(
            crate::message::decode(&again.bytes).unwrap().code,
            Code::CONTENT
        );

        // The open request counts against the new address's budgets: with it, the
        // peer has one more place (not two, as a fresh address would).
        ep.handle_datagram(now, new, &get(3, 3, false));
        let third = request_id(&mut ep);
        ep.handle_datagram(now, new, &get(4, 4, false));
        assert!(
            ep.poll_event().is_none(),
            "over the budget it brought along"
        );
        let busy = ep.poll_transmit().expect("4.29");
        assert_eq!(
            crate::message::decode(&busy.bytes).unwrap().code,
            Code::TOO_MANY_REQUESTS
        );

        // The open request is answered to the new address; the old one's address
        // key holds nothing: a request from it is admitted.
        ep.respond(
            now,
            open,
            Message::new(MessageType::Acknowledgement, Code::CONTENT, 0),
        )
        .unwrap();
        assert_eq!(ep.poll_transmit().unwrap().peer, new);
        ep.respond(
            now,
            third,
            Message::new(MessageType::Acknowledgement, Code::CONTENT, 0),
        )
        .unwrap();
        ep.handle_datagram(now, addr("10.0.0.1:40001"), &get(9, 9, false));
        assert!(matches!(ep.poll_event(), Some(Event::Request { .. })));
    }

    #[test]
    fn a_confirmable_notification_in_flight_follows_the_move_and_the_new_address_old_state_ends() {
        let now = Instant::now();
        let config = EndpointConfig {
            amplification_factor: 0,
            ..EndpointConfig::default()
        };
        let mut ep = Endpoint::with_seed(config, now, 9);
        let (old, new) = (addr("10.0.0.1:40000"), addr("10.0.0.2:50000"));
        // A stale peer at the new address with a confirmable notification unacknowledged.
        let mut stale = Message::new(MessageType::Confirmable, Code::CONTENT, 0);
        stale.options.set_uint(crate::message::opt::OBSERVE, 7);
        let (stale_id, _) = ep.notify(now, new, Token::new(&[5]).unwrap(), stale, true, None);
        // The mover: a registration answered with a confirmable notification later.
        ep.handle_datagram(now, old, &get(1, 1, true));
        let reg = request_id(&mut ep);
        ep.respond(
            now,
            reg,
            Message::new(MessageType::Acknowledgement, Code::CONTENT, 0),
        )
        .unwrap();
        let mut n = Message::new(MessageType::Confirmable, Code::CONTENT, 0);
        n.options.set_uint(crate::message::opt::OBSERVE, 2);
        ep.notify(now, old, Token::new(&[1]).unwrap(), n, true, None);
        while ep.poll_transmit().is_some() {}
        let pending = ep.state_counts().pending_confirmables;
        assert_eq!(pending, 2);
        assert_eq!(ep.congestion_peers(), 2);

        assert!(ep.move_peer(now, old, new));
        // The mover's congestion state is the new address's; the stale one's is gone.
        assert_eq!(ep.congestion_peers(), 1);
        assert!(ep.congestion_rto(now, old).is_none());
        assert!(ep.congestion_rto(now, new).is_some());
        assert_eq!(
            ep.poll_event(),
            Some(Event::ResponseFailed {
                id: stale_id,
                reason: crate::endpoint::DeliveryFailure::Timeout
            }),
            "the stale peer's confirmable notification ends"
        );
        assert_eq!(ep.state_counts().pending_confirmables, 1);
        // The notification is retransmitted to the new address.
        let later = now + Duration::from_secs(5);
        ep.handle_timeout(later);
        let resent = ep.poll_transmit().expect("a retransmission");
        assert_eq!(resent.peer, new);
        let resent_mid = crate::message::decode(&resent.bytes).unwrap().mid;
        // Its ACK from the new address ends it.
        ep.handle_datagram(
            later,
            new,
            &crate::message::encode(&Message::empty_ack(resent_mid)),
        );
        assert_eq!(ep.state_counts().pending_confirmables, 0);
        assert!(
            ep.poll_transmit().is_none(),
            "nothing goes to the old address"
        );
    }
}

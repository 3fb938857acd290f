//! NON notifications under the peer's congestion control (CoCoA §5, see
//! [`crate::congestion::non`]): sent at once, sent as CON to keep 2 of every 16
//! confirmable, or held until the NON rate (one per RTO) allows them.

use super::*;
use crate::congestion::non::NonDecision;
use crate::congestion::Hold;

impl Endpoint {
    /// Sends an encoded NON notification with `mid` under the NON rules; `id` owns it
    /// if it has to go as CON.
    pub(super) fn send_non_notification(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        token: Token,
        id: ExchangeId,
        mid: u16,
        bytes: Vec<u8>,
    ) {
        let places = &mut self.peers.congestion_places();
        match self.congestion.non_decide(now, places, peer, bytes.len()) {
            NonDecision::Send => {
                self.congestion.non_record(now, places, peer, false);
                self.transmit(peer, bytes);
            }
            NonDecision::Confirmable => self.send_non_as_con(now, peer, id, mid, bytes),
            NonDecision::WaitUntil(at) => {
                match self.congestion.hold(now, places, peer, token, bytes, at) {
                    Hold::Held(Some(at)) => self.timers.arm(at, Timer::NonPacer(peer)),
                    Hold::Held(None) => {}
                    Hold::NoRoom(bytes) => self.send_non_as_con(now, peer, id, mid, bytes),
                }
            }
        }
    }

    /// Sends an encoded NON notification as CON, owned by `id`.
    fn send_non_as_con(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        id: ExchangeId,
        mid: u16,
        mut bytes: Vec<u8>,
    ) {
        // Type is bits 5–4 of the first byte; CON is 0.
        bytes[0] &= !0x30;
        let places = &mut self.peers.congestion_places();
        self.congestion.non_record(now, places, peer, true);
        self.send_confirmable(now, peer, mid, bytes, Owner::Server(id));
    }

    /// The NON rate may allow the next held notification to `peer`.
    pub(super) fn release_held_non(&mut self, now: Instant, peer: SocketAddr) {
        let places = &mut self.peers.congestion_places();
        let (bytes, next) = self.congestion.release_held(now, places, peer);
        if let Some(bytes) = bytes {
            self.transmit(peer, bytes);
        }
        if let Some(at) = next {
            self.timers.arm(at.max(now), Timer::NonPacer(peer));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::congestion::Algorithm;

    fn notification(ep: &mut Endpoint, now: Instant, peer: SocketAddr, i: u8) -> (u16, bool) {
        let token = Token::new(&[1, 2]).unwrap();
        let mut m = Message::new(MessageType::NonConfirmable, Code::CONTENT, 0);
        m.options.set_uint(opt::OBSERVE, u32::from(i));
        m.payload = vec![i; 20];
        let (_, mid) = ep.notify(now, peer, token, m, false, None);
        let sent = ep.poll_transmit().map(|t| codec::decode(&t.bytes).unwrap());
        (
            mid,
            sent.is_some_and(|m| m.mtype == MessageType::Confirmable),
        )
    }

    #[test]
    fn cocoa_paces_non_notifications_and_keeps_two_of_sixteen_confirmable() {
        let t0 = Instant::now();
        // The peer counts as verified (no amplification limit) so that notifications
        // go out at once.
        let config = EndpointConfig {
            congestion_control: Algorithm::Cocoa,
            amplification_factor: 0,
            ..EndpointConfig::default()
        };
        let mut ep = Endpoint::with_seed(config, t0, 7);
        let peer: SocketAddr = "10.0.0.9:40000".parse().unwrap();
        // The first two go as CON (no history yet).
        assert!(notification(&mut ep, t0, peer, 1).1);
        assert!(notification(&mut ep, t0, peer, 2).1);
        // Acknowledge them so they are not retransmitted.
        for mid in ep.pending.keys().map(|k| k.1).collect::<Vec<_>>() {
            ep.handle_datagram(t0, peer, &codec::encode(&Message::empty_ack(mid)));
        }
        // The third goes as NON at once; the fourth must wait one RTO (2 s).
        let (_, con) = notification(&mut ep, t0, peer, 3);
        assert!(!con);
        assert!(ep.poll_transmit().is_none());
        notification(&mut ep, t0, peer, 4);
        assert!(
            ep.poll_transmit().is_none(),
            "sent before the NON rate allows"
        );
        // A newer notification for the same token replaces the held one.
        notification(&mut ep, t0, peer, 5);
        assert_eq!(ep.congestion_stats().non_superseded, 1);
        let rto = ep.congestion_rto(t0, peer).unwrap();
        ep.handle_timeout(t0 + rto - Duration::from_millis(1));
        assert!(ep.poll_transmit().is_none());
        ep.handle_timeout(t0 + rto);
        let m = codec::decode(&ep.poll_transmit().unwrap().bytes).unwrap();
        assert_eq!(m.options.observe(), Some(5));
        assert_eq!(m.mtype, MessageType::NonConfirmable);
        assert!(ep.poll_transmit().is_none());
    }

    #[test]
    fn default_coap_does_not_pace_non_notifications() {
        let t0 = Instant::now();
        let config = EndpointConfig {
            congestion_control: Algorithm::Default,
            amplification_factor: 0,
            ..EndpointConfig::default()
        };
        let mut ep = Endpoint::with_seed(config, t0, 7);
        let peer: SocketAddr = "10.0.0.9:40000".parse().unwrap();
        for i in 0..20 {
            assert!(!notification(&mut ep, t0, peer, i).1);
        }
        assert_eq!(ep.congestion_stats().non_delayed, 0);
    }
}

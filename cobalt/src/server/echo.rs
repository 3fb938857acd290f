//! Amplification mitigation with the Echo option (RFC 9175 §2.4): a server answers an
//! unverified UDP peer with at most `factor` times the bytes of its request; a larger
//! answer to a safe request (GET, FETCH) is replaced by 4.01 Unauthorized carrying an
//! Echo value, and the client repeats the request with it, proving it receives at its
//! address. Echo values are stateless: a timestamp and a keyed hash of peer and
//! timestamp, so the server stores nothing until a peer comes back with a valid one.

use cobalt_proto::message::{opt, Code, Message};
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long an Echo value is accepted.
const ECHO_LIFETIME: u64 = 60;
/// How long a verified peer stays verified.
const VERIFIED_FOR: Duration = Duration::from_secs(300);

/// Per-shard amplification guard.
#[derive(Debug)]
pub(crate) struct EchoGuard {
    factor: usize,
    key: RandomState,
    verified: HashMap<SocketAddr, Instant>,
    max_verified: usize,
}

impl EchoGuard {
    pub(crate) fn new(factor: usize, max_verified: usize) -> EchoGuard {
        EchoGuard {
            factor,
            key: RandomState::new(),
            verified: HashMap::new(),
            max_verified,
        }
    }

    fn now_secs() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    fn mac(&self, peer: SocketAddr, ts: u64) -> u64 {
        self.key.hash_one((peer, ts))
    }

    /// A fresh Echo value for `peer`: 8 bytes of time, 8 of keyed hash.
    pub(crate) fn echo_for(&self, peer: SocketAddr) -> Vec<u8> {
        let ts = EchoGuard::now_secs();
        let mut v = ts.to_be_bytes().to_vec();
        v.extend_from_slice(&self.mac(peer, ts).to_be_bytes());
        v
    }

    /// Notes a request: a valid, fresh Echo verifies its sender.
    pub(crate) fn observe_request(&mut self, now: Instant, peer: SocketAddr, req: &Message) {
        let Some(echo) = req.options.get(opt::ECHO) else {
            return;
        };
        let (Some(ts), Some(mac)) = (
            echo.get(..8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes),
            echo.get(8..16)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes),
        ) else {
            return;
        };
        let fresh = EchoGuard::now_secs().saturating_sub(ts) <= ECHO_LIFETIME;
        if echo.len() == 16 && fresh && mac == self.mac(peer, ts) {
            if self.verified.len() >= self.max_verified {
                self.verified
                    .retain(|_, t| now.duration_since(*t) < VERIFIED_FOR);
            }
            if self.verified.len() < self.max_verified {
                self.verified.insert(peer, now);
            }
        }
    }

    fn is_verified(&self, now: Instant, peer: SocketAddr) -> bool {
        self.verified
            .get(&peer)
            .is_some_and(|t| now.duration_since(*t) < VERIFIED_FOR)
    }

    /// The answer to send: `response` itself, or 4.01 with Echo when it would amplify
    /// too much for an unverified peer and the request is safe to repeat.
    pub(crate) fn check(
        &self,
        now: Instant,
        peer: SocketAddr,
        method: Code,
        request_len: usize,
        response: Message,
    ) -> Message {
        let safe = matches!(method, Code::GET | Code::FETCH);
        let size = cobalt_proto::message::encode(&response).len();
        if !safe || size <= self.factor * request_len.max(1) || self.is_verified(now, peer) {
            return response;
        }
        let mut challenge = Message::new(response.mtype, Code::UNAUTHORIZED, response.mid);
        challenge.options.set(opt::ECHO, self.echo_for(peer));
        challenge
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_proto::message::MessageType;

    fn big() -> Message {
        let mut m = Message::new(MessageType::Acknowledgement, Code::CONTENT, 1);
        m.payload = vec![0; 500];
        m
    }

    #[test]
    fn unverified_peers_get_an_echo_challenge_and_verified_ones_the_answer() {
        let mut g = EchoGuard::new(3, 10);
        let now = Instant::now();
        let peer: SocketAddr = "10.0.0.1:1000".parse().unwrap();
        let small_reply = Message::new(MessageType::Acknowledgement, Code::CONTENT, 1);
        assert_eq!(
            g.check(now, peer, Code::GET, 20, small_reply.clone()),
            small_reply
        );
        let c = g.check(now, peer, Code::GET, 20, big());
        assert_eq!(c.code, Code::UNAUTHORIZED);
        let echo = c.options.get(opt::ECHO).unwrap().to_vec();
        assert!(c.options.get(opt::ECHO).unwrap().len() <= 40);
        // The POST's answer is sent anyway: it has been executed already.
        assert_eq!(
            g.check(now, peer, Code::POST, 20, big()).code,
            Code::CONTENT
        );

        // A forged or foreign Echo verifies nothing.
        let mut req = Message::new(MessageType::Confirmable, Code::GET, 2);
        req.options.set(opt::ECHO, vec![0; 16]);
        g.observe_request(now, peer, &req);
        let other: SocketAddr = "10.0.0.2:1000".parse().unwrap();
        req.options.set(opt::ECHO, echo.clone());
        g.observe_request(now, other, &req);
        assert_eq!(
            g.check(now, other, Code::GET, 20, big()).code,
            Code::UNAUTHORIZED
        );

        g.observe_request(now, peer, &req);
        assert_eq!(g.check(now, peer, Code::GET, 20, big()).code, Code::CONTENT);
    }
}

//! Amplification mitigation (RFC 9175 §2.4): a server answers an unverified UDP peer
//! with at most `factor` times the bytes of its request. A larger answer to a safe
//! request (GET, FETCH) is first sent in smaller Block2 blocks — every client that
//! does block-wise transfer follows that without a round trip — and only when even
//! 16-byte blocks do not fit is it replaced by 4.01 Unauthorized with an Echo value,
//! which the client repeats to prove it receives at its address. Echo values are
//! stateless: a timestamp and a keyed hash of peer and timestamp, so the server stores
//! nothing until a peer comes back with a valid one; such a peer then gets full-size
//! answers for a while.

use cobalt_proto::blockwise::{slice_response, MAX_UDP_SZX};
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

    /// The answer to send for the whole response `full` to a request that asked for
    /// the blocks in `block_req`: sliced at `max_szx` as usual, in smaller blocks when
    /// that would amplify too much for an unverified peer, or 4.01 with Echo when even
    /// the smallest block would.
    ///
    /// `observer` says whether the peer observes a resource here; its requests for the
    /// further blocks of a notification (RFC 7959 §3.4) are answered at full size: the
    /// notification's first block went to it unasked already, and some clients (libcoap
    /// 4.3.1) cannot follow a block size that shrinks in the middle of a notification.
    pub(crate) fn answer(
        &self,
        now: Instant,
        origin: (SocketAddr, Code, usize),
        block_req: &Message,
        full: Message,
        max_szx: u8,
        observer: impl FnOnce() -> bool,
    ) -> Message {
        let (peer, method, request_len) = origin;
        let budget = self.factor * request_len.max(1);
        let fits = |m: &Message| encoded_len(m) <= budget;
        let safe = matches!(method, Code::GET | Code::FETCH);
        if !safe || (fits(&full) && block_req.block2().is_none()) {
            // The common case, without copying the response.
            return slice_response(block_req, full, max_szx);
        }
        let sliced = slice_response(block_req, full.clone(), max_szx);
        if sliced.code == Code::BAD_OPTION {
            // A block past the end (RFC 7959 §2.2): smaller blocks or an Echo round trip
            // change nothing, so the error goes out, its diagnostic only if it fits.
            return if fits(&sliced) {
                sliced
            } else {
                Message::new(sliced.mtype, sliced.code, sliced.mid)
            };
        }
        let follow_up = block_req.block2().is_some_and(|b| b.num > 0);
        if !safe || fits(&sliced) || self.is_verified(now, peer) || (follow_up && observer()) {
            return sliced;
        }
        for szx in (0..max_szx.min(MAX_UDP_SZX)).rev() {
            let smaller = slice_response(block_req, full.clone(), szx);
            if fits(&smaller) {
                return smaller;
            }
        }
        let mut challenge = Message::new(sliced.mtype, Code::UNAUTHORIZED, sliced.mid);
        challenge.options.set(opt::ECHO, self.echo_for(peer));
        challenge
    }
}

fn encoded_len(m: &Message) -> usize {
    4 + m.token.len()
        + cobalt_proto::message::codec::options_and_payload_len(&m.options, &m.payload)
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

    fn get() -> Message {
        Message::new(MessageType::Confirmable, Code::GET, 1)
    }

    #[test]
    fn unverified_peers_get_small_blocks_then_an_echo_challenge_verified_ones_everything() {
        let mut g = EchoGuard::new(3, 10);
        let now = Instant::now();
        let peer: SocketAddr = "10.0.0.1:1000".parse().unwrap();
        let origin = |method| (peer, method, 20usize);
        // 500 bytes to a 20-byte GET: cut into blocks that fit 60 bytes.
        let r = g.answer(now, origin(Code::GET), &get(), big(), 6, || false);
        assert_eq!(r.code, Code::CONTENT);
        assert!(encoded_len(&r) <= 60, "{}", encoded_len(&r));
        assert_eq!(r.block2().unwrap().num, 0);
        assert!(r.block2().unwrap().more);
        // A 2-byte request leaves room for no block at all: Echo challenge.
        let c = g.answer(now, (peer, Code::GET, 2), &get(), big(), 6, || false);
        assert_eq!(c.code, Code::UNAUTHORIZED);
        let echo = c.options.get(opt::ECHO).unwrap().to_vec();
        assert!(echo.len() <= 40);
        // A POST's answer is sent whole: the handler has run already.
        let r = g.answer(now, origin(Code::POST), &get(), big(), 6, || false);
        assert_eq!(r.payload.len(), 500);

        // A forged or foreign Echo verifies nothing.
        let mut req = get();
        req.options.set(opt::ECHO, vec![0; 16]);
        g.observe_request(now, peer, &req);
        let other: SocketAddr = "10.0.0.2:1000".parse().unwrap();
        req.options.set(opt::ECHO, echo.clone());
        g.observe_request(now, other, &req);
        let r = g.answer(now, (other, Code::GET, 20), &get(), big(), 6, || false);
        assert!(encoded_len(&r) <= 60);

        g.observe_request(now, peer, &req);
        let r = g.answer(now, origin(Code::GET), &get(), big(), 6, || false);
        assert_eq!(r.payload.len(), 500, "verified: the whole answer");
    }

    #[test]
    fn a_block_past_the_end_is_4_02_not_an_echo_challenge() {
        let g = EchoGuard::new(3, 10);
        let peer: SocketAddr = "10.0.0.4:1000".parse().unwrap();
        let mut past = get();
        past.options.set_uint(
            opt::BLOCK2,
            cobalt_proto::message::BlockValue::new(40, false, 6)
                .unwrap()
                .encode(),
        );
        for request_len in [2, 20, 200] {
            let r = g.answer(
                Instant::now(),
                (peer, Code::GET, request_len),
                &past,
                big(),
                6,
                || false,
            );
            assert_eq!(r.code, Code::BAD_OPTION, "{request_len}-byte request");
            assert!(encoded_len(&r) <= 3 * request_len.max(4));
        }
    }

    #[test]
    fn observers_get_the_rest_of_a_notification_at_full_block_size() {
        let g = EchoGuard::new(3, 10);
        let now = Instant::now();
        let peer: SocketAddr = "10.0.0.3:1000".parse().unwrap();
        let mut big = big();
        big.payload = vec![0; 3000];
        let mut second = get();
        second.options.set_uint(
            opt::BLOCK2,
            cobalt_proto::message::BlockValue::new(1, false, 6)
                .unwrap()
                .encode(),
        );
        let r = g.answer(now, (peer, Code::GET, 20), &second, big.clone(), 6, || true);
        assert_eq!(r.block2().unwrap().szx, 6);
        assert_eq!(r.payload.len(), 1024);
        let r = g.answer(now, (peer, Code::GET, 20), &second, big.clone(), 6, || {
            false
        });
        assert!(encoded_len(&r) <= 60, "not an observer: small blocks");
        // A first block is limited even for an observer.
        let r = g.answer(now, (peer, Code::GET, 20), &get(), big, 6, || true);
        assert!(encoded_len(&r) <= 60);
    }
}

//! Block-wise transfer (RFC 7959), the parts that are pure functions of messages.

use crate::message::{opt, BlockValue, Code, Message};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Largest block size exponent allowed over UDP (1024-byte blocks).
pub const MAX_UDP_SZX: u8 = 6;

/// Cuts the block a request asks for (its Block2 option, or the first block of
/// `2^(max_szx+4)` bytes) out of a full response, adding Block2 and, on the first
/// block, Size2. A response that fits in one block and was not asked for in blocks is
/// returned unchanged. A block number past the end yields 4.02 Bad Option (§2.2).
pub fn slice_response(request: &Message, mut response: Message, max_szx: u8) -> Message {
    let max_szx = max_szx.min(MAX_UDP_SZX);
    let asked = request.block2();
    let szx = asked.map_or(max_szx, |b| b.szx.min(max_szx));
    let size = 1usize << (szx + 4);
    let total = response.payload.len();
    if asked.is_none() && total <= size {
        return response;
    }
    // The client may ask with a larger size than we use: renumber to our size (§2.4).
    let num = asked.map_or(0, |b| b.offset() / size);
    let start = num * size;
    if start > total || (start == total && total > 0) {
        let mut bad = Message::new(response.mtype, Code::BAD_OPTION, response.mid);
        bad.payload = b"Block2 number past the end of the representation".to_vec();
        return bad;
    }
    let end = (start + size).min(total);
    let more = end < total;
    let Some(block) = BlockValue::new(num as u32, more, szx) else {
        let mut big = Message::new(response.mtype, Code::INTERNAL_SERVER_ERROR, response.mid);
        big.payload = b"representation too large for block-wise transfer".to_vec();
        return big;
    };
    response.payload = response.payload[start..end].to_vec();
    response.options.set_uint(opt::BLOCK2, block.encode());
    if num == 0 {
        response.options.set_uint(opt::SIZE2, total as u32);
    }
    response
}

/// What [`Block1Assembler::offer`] decided about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block1Outcome {
    /// Hand the request to the application: it carries the whole body and no Block1
    /// option. If `ack` is set, the response must carry it as Block1 (§2.3).
    Complete {
        /// The request with the reassembled payload.
        request: Message,
        /// The Block1 value to echo in the final response.
        ack: Option<BlockValue>,
    },
    /// Answer at once without the application: 2.31 Continue for a block that is not
    /// the last, or an error (4.00, 4.08, 4.13, 5.03).
    Answer(Message),
}

/// Server side of Block1 uploads (RFC 7959 §2.5): collects the blocks of a request body
/// per peer and request (method, Uri-Host/Port/Path/Query and Request-Tag) and hands
/// the request on once the last block arrived. Blocks must come in order; an
/// assembly unused for `lifetime` is dropped.
///
/// When the response to an upload needs several Block2 blocks, [`Block1Assembler::finish`]
/// keeps it, and the client's follow-up requests for the later blocks (same request,
/// Block2, no payload; §3.3) are answered from it instead of running the handler again.
#[derive(Debug)]
pub struct Block1Assembler {
    pending: HashMap<AssemblyKey, Assembly>,
    responses: HashMap<AssemblyKey, Kept>,
    max_body: usize,
    max_pending: usize,
    lifetime: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct AssemblyKey {
    peer: SocketAddr,
    code: Code,
    options: Vec<(u16, Vec<u8>)>,
}

#[derive(Debug)]
struct Assembly {
    body: Vec<u8>,
    touched: Instant,
}

#[derive(Debug)]
struct Kept {
    response: Message,
    touched: Instant,
}

/// The options that tell one upload from another (RFC 7959 §2.4, RFC 9175 §3).
pub const KEY_OPTIONS: [u16; 5] = [
    opt::URI_HOST,
    opt::URI_PORT,
    opt::URI_PATH,
    opt::URI_QUERY,
    opt::REQUEST_TAG,
];

impl Block1Assembler {
    /// At most `max_pending` uploads of at most `max_body` bytes each, each forgotten
    /// after `lifetime` without a block.
    pub fn new(max_body: usize, max_pending: usize, lifetime: Duration) -> Block1Assembler {
        Block1Assembler {
            pending: HashMap::new(),
            responses: HashMap::new(),
            max_body,
            max_pending,
            lifetime,
        }
    }

    /// Uploads in progress plus responses kept for Block2 follow-ups.
    pub fn pending(&self) -> usize {
        self.pending.len() + self.responses.len()
    }

    fn key(peer: SocketAddr, request: &Message) -> AssemblyKey {
        AssemblyKey {
            peer,
            code: request.code,
            options: request
                .options
                .iter()
                .filter(|o| KEY_OPTIONS.contains(&o.number))
                .map(|o| (o.number, o.value.clone()))
                .collect(),
        }
    }

    fn expire(&mut self, now: Instant) {
        let lifetime = self.lifetime;
        self.pending
            .retain(|_, a| now.saturating_duration_since(a.touched) < lifetime);
        self.responses
            .retain(|_, k| now.saturating_duration_since(k.touched) < lifetime);
    }

    /// Takes one request from `peer`; see [`Block1Outcome`].
    pub fn offer(&mut self, now: Instant, peer: SocketAddr, mut request: Message) -> Block1Outcome {
        let Some(block) = request.block1() else {
            return self.follow_up(now, peer, request);
        };
        self.expire(now);
        let key = Self::key(peer, &request);
        if block.szx > MAX_UDP_SZX {
            return answer(
                &request,
                Code::BAD_OPTION,
                "Block1 size exponent 7 (BERT) is not for UDP",
            );
        }
        if block.more && request.payload.len() != block.size() {
            self.pending.remove(&key);
            return answer(
                &request,
                Code::BAD_REQUEST,
                "a Block1 block that is not the last must fill the block size",
            );
        }
        if block.num == 0 {
            if !self.pending.contains_key(&key) && self.pending.len() >= self.max_pending {
                return answer(
                    &request,
                    Code::SERVICE_UNAVAILABLE,
                    "too many block-wise uploads in progress",
                );
            }
            self.pending.insert(
                key.clone(),
                Assembly {
                    body: Vec::new(),
                    touched: now,
                },
            );
        }
        let Some(assembly) = self.pending.get_mut(&key) else {
            return answer(
                &request,
                Code::REQUEST_ENTITY_INCOMPLETE,
                "Block1 block without the blocks before it",
            );
        };
        if block.offset() != assembly.body.len() {
            self.pending.remove(&key);
            return answer(
                &request,
                Code::REQUEST_ENTITY_INCOMPLETE,
                "Block1 block out of order",
            );
        }
        if assembly.body.len() + request.payload.len() > self.max_body {
            self.pending.remove(&key);
            let mut too_large =
                Message::new(request.mtype, Code::REQUEST_ENTITY_TOO_LARGE, request.mid);
            too_large
                .options
                .set_uint(opt::SIZE1, u32::try_from(self.max_body).unwrap_or(u32::MAX));
            return Block1Outcome::Answer(too_large);
        }
        assembly.body.extend_from_slice(&request.payload);
        assembly.touched = now;
        if block.more {
            let mut cont = Message::new(request.mtype, Code::CONTINUE, request.mid);
            cont.options.set_uint(opt::BLOCK1, block.encode());
            return Block1Outcome::Answer(cont);
        }
        let body = self
            .pending
            .remove(&key)
            .map(|a| a.body)
            .unwrap_or_default();
        request.payload = body;
        request.options.remove(opt::BLOCK1);
        request.options.remove(opt::SIZE1);
        Block1Outcome::Complete {
            request,
            ack: Some(block),
        }
    }
}

impl Block1Assembler {
    /// A request for a later Block2 block of a kept upload response is answered from it.
    fn follow_up(&mut self, now: Instant, peer: SocketAddr, request: Message) -> Block1Outcome {
        if self.responses.is_empty() || request.block2().is_none_or(|b| b.num == 0) {
            return Block1Outcome::Complete { request, ack: None };
        }
        self.expire(now);
        let key = Self::key(peer, &request);
        let Some(kept) = self.responses.get_mut(&key) else {
            return Block1Outcome::Complete { request, ack: None };
        };
        kept.touched = now;
        let mut block = slice_response(&request, kept.response.clone(), MAX_UDP_SZX);
        block.mtype = request.mtype;
        block.mid = request.mid;
        if !block.block2().is_some_and(|b| b.more) {
            self.responses.remove(&key);
        }
        Block1Outcome::Answer(block)
    }

    /// Cuts `response` for `request` into its first (or asked-for) Block2 block, adds
    /// the Block1 acknowledgement `ack` of an upload, and keeps the whole response of
    /// an upload whose answer needs more blocks. `request` needs only its Block2 and
    /// [`KEY_OPTIONS`] options.
    pub fn finish(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        request: &Message,
        ack: Option<BlockValue>,
        response: Message,
    ) -> Message {
        let Some(ack) = ack else {
            return slice_response(request, response, MAX_UDP_SZX);
        };
        let mut first = slice_response(request, response.clone(), MAX_UDP_SZX);
        if first.block2().is_some_and(|b| b.more) {
            self.expire(now);
            if self.responses.len() < self.max_pending {
                self.responses.insert(
                    Self::key(peer, request),
                    Kept {
                        response,
                        touched: now,
                    },
                );
            }
        }
        first.options.set_uint(opt::BLOCK1, ack.encode());
        first
    }
}

fn answer(request: &Message, code: Code, why: &str) -> Block1Outcome {
    let mut m = Message::new(request.mtype, code, request.mid);
    m.payload = why.as_bytes().to_vec();
    Block1Outcome::Answer(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::MessageType;

    fn big(n: usize) -> Message {
        let mut m = Message::new(MessageType::Acknowledgement, Code::CONTENT, 1);
        m.payload = (0..n).map(|i| (i % 251) as u8).collect();
        m
    }

    fn get(block2: Option<BlockValue>) -> Message {
        let mut m = Message::new(MessageType::Confirmable, Code::GET, 1);
        if let Some(b) = block2 {
            m.options.set_uint(opt::BLOCK2, b.encode());
        }
        m
    }

    #[test]
    fn small_responses_pass_unchanged() {
        let r = slice_response(&get(None), big(100), 6);
        assert_eq!(r, big(100));
    }

    #[test]
    fn reassembling_all_blocks_gives_the_original() {
        let full = big(2500);
        let mut got = Vec::new();
        let mut next = None;
        loop {
            let r = slice_response(&get(next), full.clone(), 4);
            let b = r.block2().unwrap();
            assert_eq!(b.szx, 4);
            if b.num == 0 {
                assert_eq!(r.options.get_uint(opt::SIZE2), Some(2500));
            }
            got.extend_from_slice(&r.payload);
            if !b.more {
                break;
            }
            next = BlockValue::new(b.num + 1, false, b.szx);
        }
        assert_eq!(got, full.payload);
    }

    #[test]
    fn client_chosen_smaller_size_and_past_the_end() {
        let full = big(100);
        let r = slice_response(&get(BlockValue::new(1, false, 1)), full.clone(), 6);
        assert_eq!(r.payload, full.payload[32..64]);
        let r = slice_response(&get(BlockValue::new(9, false, 1)), full, 6);
        assert_eq!(r.code, Code::BAD_OPTION);
    }

    #[test]
    fn larger_client_size_is_renumbered() {
        let full = big(3000);
        // client asks block 1 of 1024; we use 256-byte blocks → our block 4
        let r = slice_response(&get(BlockValue::new(1, false, 6)), full.clone(), 4);
        assert_eq!(r.block2().unwrap().num, 4);
        assert_eq!(r.payload, full.payload[1024..1280]);
    }

    fn put_block(num: u32, more: bool, szx: u8, payload: &[u8]) -> Message {
        let mut m = Message::new(MessageType::Confirmable, Code::PUT, 1);
        m.options.set_uri_path("/echo");
        m.options.set_uint(
            opt::BLOCK1,
            BlockValue::new(num, more, szx).unwrap().encode(),
        );
        m.payload = payload.to_vec();
        m
    }

    fn peer() -> SocketAddr {
        "127.0.0.1:5683".parse().unwrap()
    }

    fn assembler() -> Block1Assembler {
        Block1Assembler::new(1000, 2, Duration::from_secs(60))
    }

    #[test]
    fn block1_blocks_are_reassembled_in_order() {
        let mut a = assembler();
        let now = Instant::now();
        let body: Vec<u8> = (0..150u8).collect();
        for (num, chunk) in body.chunks(64).enumerate() {
            let more = (num + 1) * 64 < body.len();
            match a.offer(now, peer(), put_block(num as u32, more, 2, chunk)) {
                Block1Outcome::Answer(m) => {
                    assert!(more);
                    assert_eq!(m.code, Code::CONTINUE);
                    assert_eq!(m.block1(), BlockValue::new(num as u32, true, 2));
                }
                Block1Outcome::Complete { request, ack } => {
                    assert!(!more);
                    assert_eq!(request.payload, body);
                    assert_eq!(request.block1(), None);
                    assert_eq!(request.options.uri_path_string(), "/echo");
                    assert_eq!(ack, BlockValue::new(2, false, 2));
                }
            }
        }
        assert_eq!(a.pending(), 0);
    }

    #[test]
    fn requests_without_block1_and_single_blocks_pass() {
        let mut a = assembler();
        let now = Instant::now();
        let mut plain = put_block(0, false, 2, b"abc");
        plain.options.remove(opt::BLOCK1);
        assert_eq!(
            a.offer(now, peer(), plain.clone()),
            Block1Outcome::Complete {
                request: plain.clone(),
                ack: None
            }
        );
        match a.offer(now, peer(), put_block(0, false, 6, b"abc")) {
            Block1Outcome::Complete { request, ack } => {
                assert_eq!(request.payload, b"abc");
                assert_eq!(ack, BlockValue::new(0, false, 6));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn block1_errors_missing_out_of_order_short_and_too_large() {
        let mut a = assembler();
        let now = Instant::now();
        let code = |o: Block1Outcome| match o {
            Block1Outcome::Answer(m) => m.code,
            Block1Outcome::Complete { .. } => Code::EMPTY,
        };
        // A later block with no block 0 before it.
        assert_eq!(
            code(a.offer(now, peer(), put_block(1, false, 2, b"x"))),
            Code::REQUEST_ENTITY_INCOMPLETE
        );
        // Block 0, then block 2: out of order.
        assert_eq!(
            code(a.offer(now, peer(), put_block(0, true, 2, &[0; 64]))),
            Code::CONTINUE
        );
        assert_eq!(
            code(a.offer(now, peer(), put_block(2, false, 2, b"x"))),
            Code::REQUEST_ENTITY_INCOMPLETE
        );
        assert_eq!(a.pending(), 0);
        // A non-final block shorter than the block size.
        assert_eq!(
            code(a.offer(now, peer(), put_block(0, true, 2, b"short"))),
            Code::BAD_REQUEST
        );
        // Over max_body (1000 bytes).
        for num in 0..15 {
            assert_eq!(
                code(a.offer(now, peer(), put_block(num, true, 2, &[0; 64]))),
                Code::CONTINUE
            );
        }
        assert_eq!(
            code(a.offer(now, peer(), put_block(15, true, 2, &[0; 64]))),
            Code::REQUEST_ENTITY_TOO_LARGE
        );
        assert_eq!(a.pending(), 0);
    }

    #[test]
    fn block1_assemblies_are_per_peer_limited_and_expire() {
        let mut a = assembler();
        let now = Instant::now();
        let other: SocketAddr = "127.0.0.1:6000".parse().unwrap();
        let third: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        assert!(matches!(
            a.offer(now, peer(), put_block(0, true, 2, &[1; 64])),
            Block1Outcome::Answer(_)
        ));
        assert!(matches!(
            a.offer(now, other, put_block(0, true, 2, &[2; 64])),
            Block1Outcome::Answer(_)
        ));
        match a.offer(now, third, put_block(0, true, 2, &[3; 64])) {
            Block1Outcome::Answer(m) => assert_eq!(m.code, Code::SERVICE_UNAVAILABLE),
            other => panic!("{other:?}"),
        }
        match a.offer(now, other, put_block(1, false, 2, b"end")) {
            Block1Outcome::Complete { request, .. } => {
                assert_eq!(&request.payload[..64], &[2; 64][..]);
                assert_eq!(&request.payload[64..], b"end");
            }
            other => panic!("{other:?}"),
        }
        // The first peer's upload expires.
        let later = now + Duration::from_secs(61);
        match a.offer(later, peer(), put_block(1, false, 2, b"late")) {
            Block1Outcome::Answer(m) => assert_eq!(m.code, Code::REQUEST_ENTITY_INCOMPLETE),
            other => panic!("{other:?}"),
        }
        assert_eq!(a.pending(), 0);
    }

    #[test]
    fn large_response_to_an_upload_is_kept_for_block2_follow_ups() {
        let mut a = assembler();
        let now = Instant::now();
        let Block1Outcome::Complete { request, ack } =
            a.offer(now, peer(), put_block(0, false, 2, b"upload"))
        else {
            panic!("single block upload completes");
        };
        let full = big(2500);
        // The handler's answer is 2500 bytes: block 0 goes out with Block1 and Block2.
        let first = a.finish(now, peer(), &request, ack, full.clone());
        assert_eq!(first.block1(), BlockValue::new(0, false, 2));
        assert_eq!(first.block2(), BlockValue::new(0, true, 6));
        let mut got = first.payload.clone();
        // Follow-ups: same method and path, Block2, no payload, no Block1.
        for num in 1..3 {
            let mut next = Message::new(MessageType::Confirmable, Code::PUT, 7 + num as u16);
            next.options.set_uri_path("/echo");
            next.options.set_uint(
                opt::BLOCK2,
                BlockValue::new(num, false, 6).unwrap().encode(),
            );
            match a.offer(now, peer(), next) {
                Block1Outcome::Answer(m) => {
                    assert_eq!(m.code, Code::CONTENT);
                    assert_eq!(m.block2().unwrap().num, num);
                    got.extend_from_slice(&m.payload);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(got, full.payload);
        // The last block was served: nothing is kept any more.
        assert_eq!(a.pending(), 0);
        // Without an upload, responses are only sliced and nothing is kept.
        let plain = a.finish(now, peer(), &get(None), None, big(2500));
        assert_eq!(plain.block1(), None);
        assert_eq!(a.pending(), 0);
    }
}

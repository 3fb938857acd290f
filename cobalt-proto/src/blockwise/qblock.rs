//! The server's side of Q-Block1 (RFC 9177): a request body sent as a burst of
//! non-confirmable blocks, reassembled whatever order they arrive in, with the blocks
//! that went missing asked for again.
//!
//! Unlike Block1 (RFC 7959, [`super::uploads`]), where every block waits for the
//! answer to the one before, a Q-Block1 client sends up to [`MAX_PAYLOADS`] blocks at
//! once and then waits. [`QBlock1Body`] keeps one body's blocks and tells the server
//! what to answer:
//!
//! - once every block of a set of [`MAX_PAYLOADS`] has arrived, 2.31 (Continue) for the
//!   set's last block, and the client sends the next set;
//! - once the final block (M = 0) and every block before it have arrived, the body;
//! - when blocks are missing and nothing has arrived for [`NON_RECEIVE_TIMEOUT`], 4.08
//!   (Request Entity Incomplete) whose payload lists the missing block numbers as a
//!   CBOR sequence of unsigned integers (Content-Format 272,
//!   application/missing-blocks+cbor-seq), at most as many as fit one answer; the
//!   client sends those again.
//!
//! The server's upload table ([`super::uploads::Uploads::handle_qblock1`]) keeps one
//! [`QBlock1Body`] per upload within the Block1 uploads' budgets, and the server role
//! answers the 4.08 once [`QBlock1Body::missing_due`] has passed. Memory is bounded by
//! the body limit given to [`QBlock1Body::new`] (the blocks' bytes plus one bit per
//! block).
//!
//! Q-Block2 (the response side): a request carrying Q-Block2 asks for its answer in
//! Q-Block2 blocks ([`qblock2_asked`] reads which). A body of more than one block goes
//! out as a burst of up to [`MAX_PAYLOADS`] blocks, the next set [`NON_TIMEOUT`] later
//! (or at once when the client asks for it with the M bit); each block is cut from the
//! kept body by [`qblock2_block`], and an ETag ([`qblock2_etag`]) ties the blocks of
//! one body together. A client that misses blocks asks for them again by number (one
//! request may list several) after [`NON_RECEIVE_TIMEOUT`]; the same
//! [`QBlock1Body`] collects a Q-Block2 body on the client's side.

use crate::message::{opt, BlockValue, Code, Message, MessageType};
use std::time::{Duration, Instant};

/// The Q-Block1 option number (RFC 9177 §4: critical, unsafe, uint like Block1).
pub const Q_BLOCK1: u16 = 19;
/// The Q-Block2 option number (RFC 9177 §4: critical, unsafe, repeatable).
pub const Q_BLOCK2: u16 = 31;
/// Content-Format of the list of missing blocks in a 4.08 answer
/// (application/missing-blocks+cbor-seq, RFC 9177 §12.3).
pub const MISSING_BLOCKS_CBOR_SEQ: u16 = 272;
/// Blocks a client sends before it waits for an answer (RFC 9177 §7.2 default).
pub const MAX_PAYLOADS: u32 = 10;
/// How long a server waits after the last block before it asks for the missing ones
/// (RFC 9177 §7.2 default: twice NON_TIMEOUT).
pub const NON_RECEIVE_TIMEOUT: Duration = Duration::from_secs(4);

/// How long a sender waits after a set of [`MAX_PAYLOADS`] blocks before it sends the
/// next set unasked (RFC 9177 §7.2 default).
pub const NON_TIMEOUT: Duration = Duration::from_secs(2);
/// How many times a client asks for the missing blocks of one body before it gives up
/// (RFC 9177 §7.2: MAX_RETRANSMIT, default 4).
pub const MAX_RETRANSMIT: u32 = 4;
/// At most this many block numbers of one Q-Block2 request are answered (a request
/// listing more gets the first ones; the client asks for the rest in its next round):
/// bounds what one datagram makes the server send.
pub const MAX_ASKED_BLOCKS: usize = MAX_PAYLOADS as usize;

/// The blocks a request asks for with Q-Block2 (RFC 9177 §4.4), in the order given
/// and at most [`MAX_ASKED_BLOCKS`]; values that are no block are skipped. Empty if the
/// request carries no Q-Block2.
pub fn qblock2_asked(request: &Message) -> Vec<BlockValue> {
    request
        .options
        .get_all(Q_BLOCK2)
        .filter_map(|v| crate::message::option::decode_uint(v).and_then(BlockValue::decode))
        .take(MAX_ASKED_BLOCKS)
        .collect()
}

/// Block `num` of `full`'s body in blocks of size exponent `szx`, as it goes out: the
/// response's code and options with Q-Block2 and Size2, and the block's
/// bytes. `None` when the body has no such block.
pub fn qblock2_block(full: &Message, num: u32, szx: u8) -> Option<Message> {
    let size = 16usize << szx.min(6);
    let start = (num as usize).checked_mul(size)?;
    let total = full.payload.len();
    if start >= total && !(start == 0 && total == 0) {
        return None;
    }
    let end = (start + size).min(total);
    let block = BlockValue::new(num, end < total, szx.min(6))?;
    let mut m = Message::new(full.mtype, full.code, full.mid);
    m.token = full.token.clone();
    m.options = full.options.clone();
    m.options.remove(opt::BLOCK2);
    m.options.set_uint(Q_BLOCK2, block.encode());
    // Every block carries the body's size (libcoap drops blocks whose Size2 differs
    // from the first's, an absent one included).
    m.options.set_uint(opt::SIZE2, total as u32);
    m.payload = full.payload[start..end].to_vec();
    Some(m)
}

/// How many blocks of size exponent `szx` a body of `len` bytes takes (at least one).
pub fn qblock2_count(len: usize, szx: u8) -> u32 {
    let size = 16usize << szx.min(6);
    u32::try_from(len.div_ceil(size).max(1)).unwrap_or(u32::MAX)
}

/// An ETag for a body sent in Q-Block2 blocks whose answer has none (RFC 9177 §4.4:
/// the blocks of one body carry the same ETag, so a client never mixes two bodies):
/// 8 bytes derived from the code, Content-Format and payload.
pub fn qblock2_etag(full: &Message) -> [u8; 8] {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    full.code.0.hash(&mut h);
    full.options.content_format().hash(&mut h);
    full.payload.hash(&mut h);
    h.finish().to_be_bytes()
}

/// What the server answers after [`QBlock1Body::receive`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// A block already held: nothing to answer.
    Duplicate,
    /// Held; the set it belongs to is not complete yet: nothing to answer now.
    Held,
    /// Every block of a set of [`MAX_PAYLOADS`] has arrived: answer 2.31 (Continue)
    /// with this Q-Block1 value ([`continue_response`]).
    SetComplete(BlockValue),
    /// The whole body, in order: handle the request with it.
    Complete(Vec<u8>),
}

/// Why a block cannot be part of the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QBlockError {
    /// The body would exceed the limit: answer 4.13 (Request Entity Too Large).
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// A block of another size than the body's first, a short block that is not the
    /// last, a block after the final one, or a second final block: answer 4.00.
    Inconsistent,
}

impl std::fmt::Display for QBlockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QBlockError::TooLarge { limit } => {
                write!(f, "Q-Block1 body larger than the {limit} bytes allowed")
            }
            QBlockError::Inconsistent => f.write_str(
                "Q-Block1 blocks disagree: size changed, short block before the end, or a block past the final one",
            ),
        }
    }
}

impl std::error::Error for QBlockError {}

/// One Q-Block1 body being received (see the [module documentation](self)).
#[derive(Debug, Clone)]
pub struct QBlock1Body {
    limit: usize,
    /// Size exponent of the blocks, fixed by the first one received.
    szx: Option<u8>,
    /// The blocks' bytes at their offsets; holes are zero until filled.
    data: Vec<u8>,
    /// One bit per block number: received.
    have: Vec<u64>,
    /// Blocks received.
    count: u32,
    /// The final block's number and length, once it has arrived.
    last: Option<(u32, usize)>,
    /// When the latest new block arrived.
    last_arrival: Instant,
}

impl QBlock1Body {
    /// An empty body of at most `limit` bytes, its first block arriving at `now`.
    pub fn new(limit: usize, now: Instant) -> QBlock1Body {
        QBlock1Body {
            limit,
            szx: None,
            data: Vec::new(),
            have: Vec::new(),
            count: 0,
            last: None,
            last_arrival: now,
        }
    }

    /// Takes block `block` carrying `payload`, received at `now`.
    pub fn receive(
        &mut self,
        now: Instant,
        block: BlockValue,
        payload: &[u8],
    ) -> Result<Received, QBlockError> {
        // The first block accepted fixes the size.
        let szx = self.szx.unwrap_or(block.szx);
        let size = block.size();
        let consistent = block.szx == szx
            && payload.len() <= size
            && (!block.more || payload.len() == size)
            && self
                .last
                .is_none_or(|(n, _)| block.num < n || (block.num == n && !block.more))
            && (block.more || self.last.is_none_or(|(n, _)| n == block.num))
            && (block.more || self.highest().is_none_or(|h| h <= block.num));
        if !consistent {
            return Err(QBlockError::Inconsistent);
        }
        let end = block.offset() + payload.len();
        if end > self.limit {
            return Err(QBlockError::TooLarge { limit: self.limit });
        }
        let set_end = (block.num / MAX_PAYLOADS + 1) * MAX_PAYLOADS - 1;
        if self.has(block.num) {
            // The set's last block again: the client did not hear the 2.31.
            if block.num == set_end && self.set_complete(set_end) {
                return Ok(Received::SetComplete(block));
            }
            return Ok(Received::Duplicate);
        }
        let was_complete = self.set_complete(set_end);
        if self.data.len() < end {
            self.data.resize(end, 0);
        }
        self.data[block.offset()..end].copy_from_slice(payload);
        self.szx = Some(szx);
        self.mark(block.num);
        self.count += 1;
        self.last_arrival = now;
        if !block.more {
            self.last = Some((block.num, payload.len()));
        }
        if let Some((n, len)) = self.last {
            if self.count == n + 1 {
                let mut body = std::mem::take(&mut self.data);
                body.truncate(n as usize * size + len);
                return Ok(Received::Complete(body));
            }
        }
        if !was_complete && self.set_complete(set_end) {
            // This block completed its set (and every set before it).
            let last = BlockValue::new(set_end, true, szx).unwrap_or(block);
            return Ok(Received::SetComplete(last));
        }
        Ok(Received::Held)
    }

    /// Whether every block from 0 to `set_end` has arrived.
    fn set_complete(&self, set_end: u32) -> bool {
        (0..=set_end).all(|n| self.has(n))
    }

    /// When to ask for the missing blocks if nothing else arrives: [`NON_RECEIVE_TIMEOUT`]
    /// after the latest block; `None` while nothing is missing.
    pub fn missing_due(&self) -> Option<Instant> {
        (!self.missing(1).is_empty()).then_some(self.last_arrival + NON_RECEIVE_TIMEOUT)
    }

    /// Up to `max` numbers of blocks missing below the highest one received (all of
    /// them up to the final block when it has arrived), in ascending order.
    pub fn missing(&self, max: usize) -> Vec<u32> {
        let Some(highest) = self.highest() else {
            return Vec::new();
        };
        (0..highest).filter(|n| !self.has(*n)).take(max).collect()
    }

    /// The highest block number received, if any.
    pub fn highest(&self) -> Option<u32> {
        self.have
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, word)| (*word != 0).then(|| i as u32 * 64 + (63 - word.leading_zeros())))
    }

    /// Whether block `num` has arrived.
    pub fn has(&self, num: u32) -> bool {
        self.have
            .get(num as usize / 64)
            .is_some_and(|w| w & (1 << (num % 64)) != 0)
    }

    fn mark(&mut self, num: u32) {
        let word = num as usize / 64;
        if self.have.len() <= word {
            self.have.resize(word + 1, 0);
        }
        self.have[word] |= 1 << (num % 64);
    }

    /// When the latest new block arrived: a body whose holes never fill is the
    /// caller's to drop after an idle time of its choosing.
    pub fn last_arrival(&self) -> Instant {
        self.last_arrival
    }

    /// Bytes the body's buffer grows by if `block` carrying `payload_len` bytes is
    /// received (what a budget must have room for before [`QBlock1Body::receive`]).
    pub fn growth(&self, block: BlockValue, payload_len: usize) -> usize {
        (block.offset() + payload_len).saturating_sub(self.data.len())
    }

    /// Bytes of the body's buffer (holes included): what a budget counts for it.
    pub fn buffered(&self) -> usize {
        self.data.len()
    }

    /// Bytes this body holds.
    pub fn held_bytes(&self) -> usize {
        self.data.capacity() + self.have.capacity() * 8
    }
}

/// The 2.31 (Continue) answer to the last block of a complete set (NON, as the blocks
/// are; message ID and token are the caller's to set).
pub fn continue_response(block: BlockValue) -> Message {
    let mut m = Message::new(MessageType::NonConfirmable, Code::CONTINUE, 0);
    m.options.set_uint(Q_BLOCK1, block.encode());
    m
}

/// The 4.08 (Request Entity Incomplete) answer listing `missing` block numbers: a CBOR
/// sequence of unsigned integers in at most `max_payload` bytes (numbers that do not
/// fit are left for the next round).
pub fn incomplete_response(missing: &[u32], max_payload: usize) -> Message {
    let mut m = Message::new(
        MessageType::NonConfirmable,
        Code::REQUEST_ENTITY_INCOMPLETE,
        0,
    );
    m.options
        .set_uint(opt::CONTENT_FORMAT, u32::from(MISSING_BLOCKS_CBOR_SEQ));
    for &n in missing {
        let mut item = Vec::with_capacity(5);
        push_cbor_uint(&mut item, n);
        if m.payload.len() + item.len() > max_payload {
            break;
        }
        m.payload.extend_from_slice(&item);
    }
    m
}

/// Reads the block numbers of a 4.08 payload (a CBOR sequence of unsigned integers);
/// `None` if it holds anything else.
pub fn missing_blocks(payload: &[u8]) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    let mut rest = payload;
    while let Some((&first, tail)) = rest.split_first() {
        if first >> 5 != 0 {
            return None; // not major type 0 (unsigned integer)
        }
        let (value, used) = match first & 0x1f {
            n @ 0..=23 => (u32::from(n), 0),
            24 => (u32::from(*tail.first()?), 1),
            25 => (
                u32::from(u16::from_be_bytes(tail.get(..2)?.try_into().ok()?)),
                2,
            ),
            26 => (u32::from_be_bytes(tail.get(..4)?.try_into().ok()?), 4),
            _ => return None,
        };
        out.push(value);
        rest = &tail[used..];
    }
    Some(out)
}

/// Appends `n` as a CBOR unsigned integer in its shortest form (RFC 8949 §3.1).
fn push_cbor_uint(out: &mut Vec<u8>, n: u32) {
    match n {
        0..=23 => out.push(n as u8),
        24..=0xff => out.extend_from_slice(&[24, n as u8]),
        0x100..=0xffff => {
            out.push(25);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        _ => {
            out.push(26);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const SZX: u8 = 2; // 64-byte blocks

    fn block(num: u32, more: bool) -> BlockValue {
        BlockValue::new(num, more, SZX).unwrap()
    }

    fn body_of(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    /// The blocks of `body`: (Q-Block1 value, payload).
    fn blocks(body: &[u8]) -> Vec<(BlockValue, Vec<u8>)> {
        let chunks: Vec<&[u8]> = body.chunks(64).collect();
        let n = chunks.len();
        chunks
            .into_iter()
            .enumerate()
            .map(|(i, c)| (block(i as u32, i + 1 < n), c.to_vec()))
            .collect()
    }

    #[test]
    fn in_order_sets_get_continue_and_the_last_block_the_body() {
        let now = Instant::now();
        let body = body_of(64 * 25 + 10);
        let mut rx = QBlock1Body::new(1 << 16, now);
        let mut answers = Vec::new();
        for (b, p) in blocks(&body) {
            match rx.receive(now, b, &p).unwrap() {
                Received::SetComplete(v) => answers.push(v.num),
                Received::Complete(got) => {
                    assert_eq!(got, body);
                    answers.push(u32::MAX);
                }
                Received::Held => {}
                Received::Duplicate => panic!("no duplicates sent"),
            }
        }
        assert_eq!(answers, [9, 19, u32::MAX]);
        let m = continue_response(block(9, true));
        assert_eq!(
            (m.code, m.options.get_uint(Q_BLOCK1)),
            (Code::CONTINUE, Some(block(9, true).encode()))
        );
    }

    #[test]
    fn holes_are_listed_after_the_receive_timeout_and_filled_in_any_order() {
        let t0 = Instant::now();
        let body = body_of(64 * 12 + 1);
        let all = blocks(&body);
        let mut rx = QBlock1Body::new(1 << 16, t0);
        for (b, p) in all.iter().filter(|(b, _)| ![3, 4, 11].contains(&b.num)) {
            assert_eq!(rx.receive(t0, *b, p), Ok(Received::Held));
        }
        // The final block (12) arrived; 3, 4 and 11 did not.
        assert_eq!(rx.missing(10), [3, 4, 11]);
        assert_eq!(rx.missing_due(), Some(t0 + NON_RECEIVE_TIMEOUT));
        let ask = incomplete_response(&rx.missing(100), 1024);
        assert_eq!(ask.code, Code::REQUEST_ENTITY_INCOMPLETE);
        assert_eq!(
            ask.options.get_uint(opt::CONTENT_FORMAT),
            Some(u32::from(MISSING_BLOCKS_CBOR_SEQ))
        );
        assert_eq!(ask.payload, [3, 4, 11]);
        assert_eq!(missing_blocks(&ask.payload), Some(vec![3, 4, 11]));
        let t1 = t0 + Duration::from_secs(5);
        assert_eq!(rx.receive(t1, all[11].0, &all[11].1), Ok(Received::Held));
        assert_eq!(
            rx.receive(t1, all[11].0, &all[11].1),
            Ok(Received::Duplicate)
        );
        assert_eq!(rx.receive(t1, all[4].0, &all[4].1), Ok(Received::Held));
        assert_eq!(
            rx.receive(t1, all[3].0, &all[3].1),
            Ok(Received::Complete(body))
        );
    }

    #[test]
    fn inconsistent_or_oversized_blocks_are_refused() {
        let now = Instant::now();
        let mut rx = QBlock1Body::new(64 * 4, now);
        rx.receive(now, block(0, true), &[0; 64]).unwrap();
        // Another size, a short block that is not the last.
        let big = BlockValue::new(1, true, 3).unwrap();
        assert_eq!(
            rx.receive(now, big, &[0; 128]),
            Err(QBlockError::Inconsistent)
        );
        assert_eq!(
            rx.receive(now, block(1, true), &[0; 10]),
            Err(QBlockError::Inconsistent)
        );
        // Past the limit.
        assert_eq!(
            rx.receive(now, block(4, true), &[0; 64]),
            Err(QBlockError::TooLarge { limit: 256 })
        );
        // A final block, then a block after it or another final one.
        rx.receive(now, block(2, false), &[0; 5]).unwrap();
        assert_eq!(
            rx.receive(now, block(3, true), &[0; 64]),
            Err(QBlockError::Inconsistent)
        );
        assert_eq!(
            rx.receive(now, block(1, false), &[0; 5]),
            Err(QBlockError::Inconsistent)
        );
        // A block far out is refused before anything is allocated for it.
        let mut rx = QBlock1Body::new(1 << 20, now);
        let far = BlockValue::new(1_000_000, true, 6).unwrap();
        assert_eq!(
            rx.receive(now, far, &[0; 1024]),
            Err(QBlockError::TooLarge { limit: 1 << 20 })
        );
        assert_eq!(rx.held_bytes(), 0);
        // Holes that never fill: the blocks held stay within the limit, the missing
        // list within what is asked, and the caller sees since when nothing came.
        let later = now + Duration::from_secs(60);
        for num in (0..1024).step_by(2) {
            rx.receive(later, block(num, true), &[1; 64]).unwrap();
        }
        assert!(rx.held_bytes() <= (1 << 20) + 1024);
        assert_eq!(rx.missing(3), [1, 3, 5]);
        assert_eq!(rx.last_arrival(), later);
        // A final block below one already received.
        let mut rx = QBlock1Body::new(1 << 16, now);
        rx.receive(now, block(5, true), &[0; 64]).unwrap();
        assert_eq!(
            rx.receive(now, block(2, false), &[0; 5]),
            Err(QBlockError::Inconsistent)
        );
    }

    #[test]
    fn missing_block_lists_are_bounded_and_hostile_payloads_refused() {
        let many: Vec<u32> = (0..1000).map(|n| n * 300).collect();
        let m = incomplete_response(&many, 100);
        assert!(m.payload.len() <= 100);
        let listed = missing_blocks(&m.payload).unwrap();
        assert_eq!(listed, many[..listed.len()]);
        assert!(listed.len() > 20);
        assert_eq!(missing_blocks(&[0x18]), None); // truncated
        assert_eq!(missing_blocks(&[0x61, b'a']), None); // a text string
        assert_eq!(missing_blocks(&[0x1b, 0, 0, 0, 0, 0, 0, 0, 1]), None); // 64-bit
        assert_eq!(missing_blocks(&[]), Some(vec![]));
    }

    /// A client sends a body in sets of MAX_PAYLOADS NON blocks over a network that
    /// loses a quarter of the blocks and of the answers. It sends the next set on 2.31
    /// and the listed blocks again on 4.08; when it hears nothing it sends the set's
    /// last block again. The server's body always ends complete and intact, and the
    /// server holds no more than the body's blocks.
    #[test]
    fn a_body_arrives_whole_through_loss_in_virtual_time() {
        for seed in 0..50 {
            let mut rng = StdRng::seed_from_u64(seed);
            let t0 = Instant::now();
            let body = body_of(64 * 47 + 30);
            let all = blocks(&body);
            let set_of = |first: usize| first..(first + MAX_PAYLOADS as usize).min(all.len());
            let mut rx = QBlock1Body::new(1 << 16, t0);
            let mut now = t0;
            let mut set = set_of(0);
            let mut to_send: Vec<usize> = set.clone().collect();
            let mut sent = 0;
            let done = loop {
                assert!(sent < 1000, "seed {seed}: no end after {sent} blocks");
                let mut next = None;
                for i in to_send.drain(..) {
                    sent += 1;
                    if rng.random_bool(0.25) {
                        continue; // lost on the way to the server
                    }
                    match rx.receive(now, all[i].0, &all[i].1).unwrap() {
                        Received::Complete(got) => next = Some(Err(got)),
                        // The 2.31 may be lost on the way back.
                        Received::SetComplete(b) if !rng.random_bool(0.25) => {
                            next = Some(Ok(b.num as usize + 1))
                        }
                        _ => {}
                    }
                }
                assert!(rx.held_bytes() <= 2 * body.len() + 64);
                match next {
                    Some(Err(got)) => break got,
                    Some(Ok(first)) => {
                        set = set_of(first);
                        to_send = set.clone().collect();
                    }
                    None => {
                        // The server asks for what is missing once it has waited; if
                        // nothing is missing or the 4.08 is lost, the client probes
                        // with the set's last block after its own timeout.
                        now = rx.missing_due().unwrap_or(now + NON_RECEIVE_TIMEOUT);
                        let ask = incomplete_response(&rx.missing(MAX_PAYLOADS as usize), 1024);
                        let missing = missing_blocks(&ask.payload).unwrap();
                        to_send = if !missing.is_empty() && !rng.random_bool(0.25) {
                            missing.iter().map(|n| *n as usize).collect()
                        } else {
                            vec![set.end - 1]
                        };
                    }
                }
            };
            assert_eq!(done, body, "seed {seed}");
        }
    }
}

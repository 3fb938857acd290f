//! Block-wise transfer (RFC 7959) and its BERT extension for reliable transports
//! (RFC 8323 §6): the parts that are pure functions of messages, and the server's
//! Block1 reassembly with its bounds ([`uploads`]).
//!
//! BERT ("Block-wise Extension for Reliable Transport") uses the reserved size
//! exponent 7: a block then carries any multiple of 1024 bytes (the last block any
//! length), and its NUM counts 1024-byte units. Both ends must have announced
//! Block-Wise-Transfer in their CSM; [`BlockSize::fitting`] chooses BERT only then.

use crate::message::{opt, BlockValue, Code, Message};
use std::ops::Range;

/// Largest block size exponent allowed over UDP (1024-byte blocks).
pub const MAX_UDP_SZX: u8 = 6;

/// The size exponent of BERT blocks (RFC 8323 §6).
pub const BERT_SZX: u8 = 7;

/// The unit of BERT blocks: a BERT block carries a multiple of it, and its NUM counts it.
pub const BERT_UNIT: usize = 1024;

/// How large the blocks of a transfer are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockSize {
    /// Blocks of `2^(szx+4)` bytes, SZX 0 to 6 (16 to 1024 bytes).
    Szx(u8),
    /// BERT blocks (SZX 7) of `units` × 1024 bytes; only where both ends announced
    /// Block-Wise-Transfer in their CSM.
    Bert {
        /// 1024-byte units per block (at least 1).
        units: usize,
    },
}

impl BlockSize {
    /// Bytes in one full block.
    pub fn bytes(self) -> usize {
        match self {
            BlockSize::Szx(szx) => 1usize << (szx.min(MAX_UDP_SZX) + 4),
            BlockSize::Bert { units } => units.max(1) * BERT_UNIT,
        }
    }

    /// Bytes one step of the block number stands for.
    pub fn unit(self) -> usize {
        match self {
            BlockSize::Szx(_) => self.bytes(),
            BlockSize::Bert { .. } => BERT_UNIT,
        }
    }

    /// The SZX field of the Block option.
    pub fn szx(self) -> u8 {
        match self {
            BlockSize::Szx(szx) => szx.min(MAX_UDP_SZX),
            BlockSize::Bert { .. } => BERT_SZX,
        }
    }

    /// The largest block size whose payload fits in `room` bytes (what the peer's
    /// Max-Message-Size leaves after the message's framing, token and options): BERT
    /// blocks of up to `max_bert` bytes when `bert` (both ends announced it) and at
    /// least two 1024-byte units fit, else the largest `2^(szx+4)` up to `max_szx`.
    /// `None` when not even 16 bytes fit.
    pub fn fitting(room: usize, bert: bool, max_szx: u8, max_bert: usize) -> Option<BlockSize> {
        let units = room.min(max_bert) / BERT_UNIT;
        if bert && units >= 2 {
            return Some(BlockSize::Bert { units });
        }
        (0..=max_szx.min(MAX_UDP_SZX))
            .rev()
            .find(|szx| 1usize << (szx + 4) <= room)
            .map(BlockSize::Szx)
    }

    /// The block of a body of `len` bytes that starts at `offset`: its Block value
    /// and the byte range it carries. `None` if the offset is not on a block boundary,
    /// is past the end, or its number does not fit in the option.
    pub fn block_at(self, len: usize, offset: usize) -> Option<(BlockValue, Range<usize>)> {
        if !offset.is_multiple_of(self.unit()) || (offset >= len && !(offset == 0 && len == 0)) {
            return None;
        }
        let end = offset.saturating_add(self.bytes()).min(len);
        let num = u32::try_from(offset / self.unit()).ok()?;
        let block = BlockValue::new(num, end < len, self.szx())?;
        Some((block, offset..end))
    }
}

/// How a Block1 upload goes on after the server answered 2.31 Continue to the block
/// `sent` (of `size`, carrying the bytes `range` of the body) with the Block1 option
/// `ack` (RFC 7959 §2.3, §2.5). The block sent counts whole, at the size it was sent,
/// even when the server asks for smaller blocks from now on: in RFC 7959 Figure 6
/// `0/1/128` acknowledged with `0/1/32` goes on with `4/1/32`. A server asking for
/// larger blocks is not followed (§2.3: the same size or smaller). The acknowledgement
/// names the block sent by its number (as in Figure 6) or by its offset at the new
/// size (as Californium does: `3/1/1024` acknowledged with `6/1/512`); a BERT block
/// (RFC 8323 §6) is acknowledged as a whole the same way. Returns the offset of the
/// next block and the size to send it in, or `None` when `ack` names another block.
pub fn upload_continues(
    size: BlockSize,
    sent: BlockValue,
    range: Range<usize>,
    ack: Option<BlockValue>,
) -> Option<(usize, BlockSize)> {
    let Some(ack) = ack else {
        return Some((range.end, size));
    };
    if ack.num != sent.num && ack.offset() != range.start {
        return None;
    }
    let next = if ack.szx < size.szx() {
        BlockSize::Szx(ack.szx)
    } else {
        size
    };
    Some((range.end, next))
}

/// The Block2 option of the request for what follows the `received` bytes of a
/// representation whose latest block was `last`: at that block's size, since a
/// server may answer with smaller blocks than asked for, and the client follows
/// (RFC 7959 §2.4). `None` if the block number does not fit in the option.
pub fn next_block2(received: usize, last: BlockValue) -> Option<BlockValue> {
    let num = u32::try_from(received / last.size()).ok()?;
    BlockValue::new(num, false, last.szx)
}

/// Why a received block cannot continue a body being reassembled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockError {
    /// SZX 7 where BERT was not announced (or over UDP, where 7 is reserved).
    BertNotAnnounced,
    /// The block does not start where the body received so far ends.
    OutOfOrder {
        /// Where the next block should start.
        expected: usize,
        /// Where this one starts.
        got: usize,
    },
    /// A block other than the last is not a full block (for BERT: not a non-zero
    /// multiple of 1024 bytes), or a last block is larger than its size.
    WrongSize,
}

impl std::fmt::Display for BlockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlockError::BertNotAnnounced => write!(f, "BERT block (SZX 7) not allowed here"),
            BlockError::OutOfOrder { expected, got } => {
                write!(f, "block at offset {got} where {expected} was expected")
            }
            BlockError::WrongSize => write!(
                f,
                "a block other than the last is not a whole block (BERT: a multiple of 1024 bytes)"
            ),
        }
    }
}

impl std::error::Error for BlockError {}

/// Checks a received block (Block1 of a request, Block2 of a response) that carries
/// `payload_len` bytes against the `received` bytes reassembled so far: it must start
/// there and, unless it is the last, be whole. A BERT block (SZX 7) is accepted only
/// when `bert` (both ends announced it); its payload must then be a non-zero multiple
/// of 1024 bytes unless it is the last, which may have any length (RFC 8323 §6).
pub fn check_block(
    block: BlockValue,
    payload_len: usize,
    received: usize,
    bert: bool,
) -> Result<(), BlockError> {
    if block.szx == BERT_SZX && !bert {
        return Err(BlockError::BertNotAnnounced);
    }
    if block.offset() != received {
        return Err(BlockError::OutOfOrder {
            expected: received,
            got: block.offset(),
        });
    }
    let whole = match (block.szx == BERT_SZX, block.more) {
        (true, true) => payload_len > 0 && payload_len.is_multiple_of(BERT_UNIT),
        (true, false) => true,
        (false, true) => payload_len == block.size(),
        (false, false) => payload_len <= block.size(),
    };
    if whole {
        Ok(())
    } else {
        Err(BlockError::WrongSize)
    }
}

/// Cuts the block a request asks for (its Block2 option, or the first block of
/// `2^(max_szx+4)` bytes) out of a full response, adding Block2 and, on the first
/// block, Size2. A response that fits in one block and was not asked for in blocks is
/// returned unchanged. A block number past the end yields 4.02 Bad Option (§2.2).
pub fn slice_response(request: &Message, response: Message, max_szx: u8) -> Message {
    slice_response_sized(request, response, BlockSize::Szx(max_szx))
}

/// Like [`slice_response`] with blocks of `size`, BERT included. A request that asks
/// for blocks of SZX 0 to 6 gets blocks of at most that size (as asked); one that asks
/// with SZX 7 gets BERT blocks from its NUM × 1024 on when `size` is BERT, else
/// renumbered blocks of `size`.
pub fn slice_response_sized(request: &Message, response: Message, size: BlockSize) -> Message {
    slice_asked(request.block2(), response, size)
}

/// Like [`slice_response_sized`] for a request whose Block2 option is `asked` (none:
/// the first block, or the whole response where it fits in one).
pub fn slice_asked(asked: Option<BlockValue>, mut response: Message, size: BlockSize) -> Message {
    let size = match (asked, size) {
        (Some(b), BlockSize::Bert { .. }) if b.szx < BERT_SZX => BlockSize::Szx(b.szx),
        (Some(b), BlockSize::Szx(s)) => BlockSize::Szx(b.szx.min(s).min(MAX_UDP_SZX)),
        (_, s) => s,
    };
    let total = response.payload.len();
    if asked.is_none() && total <= size.bytes() {
        return response;
    }
    // The client may ask with a larger size than we use: renumber to our size (§2.4).
    let start = asked.map_or(0, |b| b.offset() / size.unit() * size.unit());
    let Some((block, range)) = size.block_at(total, start) else {
        if start >= total {
            let mut bad = Message::new(response.mtype, Code::BAD_OPTION, response.mid);
            bad.payload = b"Block2 number past the end of the representation".to_vec();
            return bad;
        }
        let mut big = Message::new(response.mtype, Code::INTERNAL_SERVER_ERROR, response.mid);
        big.payload = b"representation too large for block-wise transfer".to_vec();
        return big;
    };
    response.payload = response.payload[range].to_vec();
    response.options.set_uint(opt::BLOCK2, block.encode());
    if block.num == 0 {
        response.options.set_uint(opt::SIZE2, total as u32);
    }
    response
}

pub mod qblock;
pub mod uploads;

#[cfg(test)]
mod sim_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::MessageType;
    use proptest::prelude::*;

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

    fn bert(num: u32) -> Option<BlockValue> {
        BlockValue::new(num, false, BERT_SZX)
    }

    #[test]
    fn bert_blocks_are_multiples_of_1024_numbered_in_units() {
        let full = big(5000);
        let size = BlockSize::Bert { units: 2 };
        let r = slice_response_sized(&get(None), full.clone(), size);
        let b = r.block2().unwrap();
        assert_eq!((b.num, b.more, b.szx), (0, true, 7));
        assert_eq!(r.payload, full.payload[..2048]);
        assert_eq!(r.options.get_uint(opt::SIZE2), Some(5000));
        // The next block starts at NUM 2 (2048 bytes in).
        let r = slice_response_sized(&get(bert(2)), full.clone(), size);
        let b = r.block2().unwrap();
        assert_eq!((b.num, b.more), (2, true));
        assert_eq!(r.payload, full.payload[2048..4096]);
        let r = slice_response_sized(&get(bert(4)), full.clone(), size);
        let b = r.block2().unwrap();
        assert_eq!((b.num, b.more), (4, false));
        assert_eq!(r.payload, full.payload[4096..]);
        assert_eq!(
            slice_response_sized(&get(bert(5)), full.clone(), size).code,
            Code::BAD_OPTION
        );
        // A client asking for small blocks gets small blocks, BERT or not.
        let r = slice_response_sized(&get(BlockValue::new(3, false, 2)), full.clone(), size);
        assert_eq!(r.payload, full.payload[192..256]);
        assert_eq!(r.block2().unwrap().szx, 2);
        // A BERT request to a server not doing BERT is renumbered to its size.
        let r = slice_response_sized(&get(bert(3)), full.clone(), BlockSize::Szx(6));
        assert_eq!(r.block2().unwrap(), BlockValue::new(3, true, 6).unwrap());
        // What fits in one BERT block passes whole.
        let r = slice_response_sized(&get(None), big(2048), size);
        assert_eq!(r, big(2048));
    }

    #[test]
    fn fitting_prefers_bert_only_when_announced_and_two_units_fit() {
        assert_eq!(
            BlockSize::fitting(1 << 20, true, 6, 64 * 1024),
            Some(BlockSize::Bert { units: 64 })
        );
        assert_eq!(
            BlockSize::fitting(5000, true, 6, 1 << 20),
            Some(BlockSize::Bert { units: 4 })
        );
        assert_eq!(
            BlockSize::fitting(1 << 20, false, 6, 1 << 20),
            Some(BlockSize::Szx(6))
        );
        assert_eq!(
            BlockSize::fitting(1100, true, 6, 1 << 20),
            Some(BlockSize::Szx(6))
        );
        assert_eq!(
            BlockSize::fitting(1000, true, 6, 1 << 20),
            Some(BlockSize::Szx(5))
        );
        assert_eq!(
            BlockSize::fitting(5000, false, 4, 1 << 20),
            Some(BlockSize::Szx(4))
        );
        assert_eq!(BlockSize::fitting(15, true, 6, 1 << 20), None);
    }

    #[test]
    fn check_block_rules() {
        let b = |num, more, szx| BlockValue::new(num, more, szx).unwrap();
        assert_eq!(check_block(b(0, true, 7), 3072, 0, true), Ok(()));
        assert_eq!(check_block(b(3, false, 7), 10, 3072, true), Ok(()));
        assert_eq!(check_block(b(3, false, 7), 5000, 3072, true), Ok(()));
        assert_eq!(
            check_block(b(0, true, 7), 3072, 0, false),
            Err(BlockError::BertNotAnnounced)
        );
        assert_eq!(
            check_block(b(0, true, 7), 1000, 0, true),
            Err(BlockError::WrongSize)
        );
        assert_eq!(
            check_block(b(0, true, 7), 0, 0, true),
            Err(BlockError::WrongSize)
        );
        assert_eq!(
            check_block(b(2, true, 7), 1024, 3072, true),
            Err(BlockError::OutOfOrder {
                expected: 3072,
                got: 2048
            })
        );
        assert_eq!(check_block(b(1, true, 4), 256, 256, false), Ok(()));
        assert_eq!(
            check_block(b(1, true, 4), 255, 256, false),
            Err(BlockError::WrongSize)
        );
        assert_eq!(
            check_block(b(1, false, 4), 257, 256, false),
            Err(BlockError::WrongSize)
        );
    }

    #[test]
    fn upload_continues_after_the_whole_block_sent() {
        let b = |num, szx| BlockValue::new(num, true, szx).unwrap();
        let s6 = BlockSize::Szx(6);
        // Acknowledged as sent, or without Block1: the next block at the same size.
        assert_eq!(
            upload_continues(s6, b(2, 6), 2048..3072, Some(b(2, 6))),
            Some((3072, s6))
        );
        assert_eq!(
            upload_continues(s6, b(2, 6), 2048..3072, None),
            Some((3072, s6))
        );
        // Smaller, named by number (RFC 7959 Figure 6) or by offset (Californium).
        let s5 = BlockSize::Szx(5);
        assert_eq!(
            upload_continues(s6, b(2, 6), 2048..3072, Some(b(2, 5))),
            Some((3072, s5))
        );
        assert_eq!(
            upload_continues(s6, b(2, 6), 2048..3072, Some(b(4, 5))),
            Some((3072, s5))
        );
        // A server asking for larger blocks is not followed.
        let s4 = BlockSize::Szx(4);
        assert_eq!(
            upload_continues(s4, b(1, 4), 256..512, Some(b(1, 6))),
            Some((512, s4))
        );
        // BERT: acknowledged whole, then 1024-byte blocks if asked.
        let bert = BlockSize::Bert { units: 3 };
        assert_eq!(
            upload_continues(bert, b(3, 7), 3072..6144, Some(b(3, 7))),
            Some((6144, bert))
        );
        assert_eq!(
            upload_continues(bert, b(3, 7), 3072..6144, Some(b(3, 6))),
            Some((6144, s6))
        );
        // Another block.
        assert_eq!(
            upload_continues(s6, b(2, 6), 2048..3072, Some(b(1, 6))),
            None
        );
        assert_eq!(
            upload_continues(s6, b(2, 6), 2048..3072, Some(b(3, 5))),
            None
        );
    }

    #[test]
    fn next_block2_keeps_the_size_of_the_latest_block() {
        let b = |num, szx| BlockValue::new(num, true, szx).unwrap();
        assert_eq!(next_block2(1024, b(0, 6)), BlockValue::new(1, false, 6));
        assert_eq!(next_block2(1280, b(4, 4)), BlockValue::new(5, false, 4));
        assert_eq!(next_block2(4096, b(0, 7)), BlockValue::new(4, false, 7));
        assert_eq!(next_block2(16 << 20, b(0, 0)), None);
    }

    fn block_sizes() -> impl Strategy<Value = BlockSize> {
        prop_oneof![
            (0u8..=6).prop_map(BlockSize::Szx),
            (1usize..6).prop_map(|units| BlockSize::Bert { units }),
        ]
    }

    proptest! {
        /// Following a response block by block, each block checks out and the
        /// reassembled body is the original, for plain and BERT sizes.
        #[test]
        fn sliced_blocks_reassemble_and_check(len in 0usize..9000, size in block_sizes()) {
            let full = big(len);
            let mut got = Vec::new();
            let mut asked = None;
            loop {
                let r = slice_response_sized(&get(asked), full.clone(), size);
                let Some(b) = r.block2() else {
                    prop_assert!(len <= size.bytes());
                    prop_assert_eq!(&r, &full);
                    got = r.payload;
                    break;
                };
                prop_assert_eq!(check_block(b, r.payload.len(), got.len(), true), Ok(()));
                got.extend_from_slice(&r.payload);
                if !b.more {
                    break;
                }
                asked = BlockValue::new((got.len() / b.size()) as u32, false, b.szx);
            }
            prop_assert_eq!(got, full.payload);
        }

        /// Cutting a body for upload with `block_at` gives blocks that check out and
        /// cover it exactly; a non-final block of another length is refused.
        #[test]
        fn upload_blocks_cover_the_body(len in 1usize..9000, size in block_sizes(), cut in 1usize..1024) {
            let mut offset = 0;
            let mut covered = 0;
            loop {
                let (b, range) = size.block_at(len, offset).unwrap();
                prop_assert_eq!(range.start, covered);
                let n = range.len();
                prop_assert_eq!(check_block(b, n, covered, true), Ok(()));
                if b.more {
                    prop_assert!(check_block(b, n - cut.min(n), covered, true).is_err());
                }
                covered = range.end;
                if !b.more {
                    break;
                }
                offset = range.end;
            }
            prop_assert_eq!(covered, len);
        }
    }
}

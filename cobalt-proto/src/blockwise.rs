//! Block-wise transfer (RFC 7959), the parts that are pure functions of messages.

use crate::message::{opt, BlockValue, Code, Message};

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
}

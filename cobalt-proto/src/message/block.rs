//! The Block1/Block2 option value (RFC 7959 §2.2).

/// A decoded Block1 or Block2 value: block number, more flag and size exponent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockValue {
    /// Block number (20 bits).
    pub num: u32,
    /// More blocks follow.
    pub more: bool,
    /// Size exponent: the block size is `2^(szx + 4)`; 7 is reserved (BERT over TCP).
    pub szx: u8,
}

impl BlockValue {
    /// Largest block number that fits in the option.
    pub const MAX_NUM: u32 = (1 << 20) - 1;

    /// Builds a value; `None` if `num` or `szx` is out of range.
    pub fn new(num: u32, more: bool, szx: u8) -> Option<BlockValue> {
        (num <= Self::MAX_NUM && szx <= 7).then_some(BlockValue { num, more, szx })
    }

    /// The block size in bytes (1024 for the BERT exponent 7).
    pub fn size(self) -> usize {
        1usize << (self.szx.min(6) + 4)
    }

    /// Byte offset of this block.
    pub fn offset(self) -> usize {
        self.num as usize * self.size()
    }

    /// Size exponent for a block size in bytes (16..=1024, a power of two).
    pub fn szx_for_size(size: usize) -> Option<u8> {
        if !(16..=1024).contains(&size) || !size.is_power_of_two() {
            return None;
        }
        Some(size.trailing_zeros() as u8 - 4)
    }

    /// Decodes the uint option value.
    pub fn decode(value: u32) -> Option<BlockValue> {
        BlockValue::new(value >> 4, value & 0x8 != 0, (value & 0x7) as u8)
    }

    /// Encodes as the uint option value.
    pub fn encode(self) -> u32 {
        (self.num << 4) | (u32::from(self.more) << 3) | u32::from(self.szx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_sizes() {
        let b = BlockValue::new(5, true, 6).unwrap();
        assert_eq!(BlockValue::decode(b.encode()), Some(b));
        assert_eq!(b.size(), 1024);
        assert_eq!(b.offset(), 5 * 1024);
        assert_eq!(BlockValue::szx_for_size(64), Some(2));
        assert_eq!(BlockValue::szx_for_size(100), None);
        assert!(BlockValue::new(BlockValue::MAX_NUM + 1, false, 0).is_none());
    }
}

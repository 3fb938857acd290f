//! Which options a request carries, read in one pass over them when it arrives: the
//! server's many checks for options that a typical request lacks (Observe, Block1,
//! Block2, Q-Block1, Q-Block2, Proxy-Uri, Proxy-Scheme) cost a bit test each instead
//! of a scan of the options.

use cobalt_proto::message::{BlockValue, Message, Options};

/// The option numbers a request may carry: each number below 64 is a bit, the higher
/// ones share one. Taking an option out of the request leaves its bit set (the
/// option is then looked for and not found); putting one in must set its bit
/// ([`Carried::add`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Carried {
    low: u64,
    high: bool,
}

impl Carried {
    /// The options `options` carries.
    #[inline]
    pub(crate) fn of(options: &Options) -> Carried {
        let mut carried = Carried {
            low: 0,
            high: false,
        };
        for o in options.iter() {
            carried.add(o.number);
        }
        carried
    }

    /// Notes that option `number` may be carried.
    #[inline]
    pub(crate) fn add(&mut self, number: u16) {
        match 1u64.checked_shl(u32::from(number)) {
            Some(bit) => self.low |= bit,
            None => self.high = true,
        }
    }

    /// Whether option `number` may be carried (false: it is not).
    #[inline]
    pub(crate) fn may_have(self, number: u16) -> bool {
        match 1u64.checked_shl(u32::from(number)) {
            Some(bit) => self.low & bit != 0,
            None => self.high,
        }
    }

    /// The first value of the uint option `number` in `options` (whose options these
    /// are), if carried and at most four bytes long.
    #[inline]
    pub(crate) fn uint(self, options: &Options, number: u16) -> Option<u32> {
        if !self.may_have(number) {
            return None;
        }
        options.get_uint(number)
    }

    /// The block option `number` (Block1, Block2, Q-Block1 or Q-Block2) of `message`
    /// (whose options these are), if carried and well-formed.
    #[inline]
    pub(crate) fn block(self, message: &Message, number: u16) -> Option<BlockValue> {
        self.uint(&message.options, number)
            .and_then(BlockValue::decode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_proto::message::{opt, Code, MessageType};

    #[test]
    fn tells_the_options_present_and_reads_them() {
        let mut m = Message::new(MessageType::Confirmable, Code::GET, 1);
        m.options.set_uri_path("/a/b");
        m.options.set_uint(opt::OBSERVE, 0);
        m.options.set_uint(opt::BLOCK2, 0x16);
        m.options.set(2048, b"x");
        let carried = Carried::of(&m.options);
        for number in [opt::URI_PATH, opt::OBSERVE, opt::BLOCK2, 2048, 65000] {
            assert!(carried.may_have(number), "{number}");
        }
        for number in [opt::BLOCK1, opt::PROXY_URI, opt::PROXY_SCHEME, 63, 0] {
            assert!(!carried.may_have(number), "{number}");
        }
        assert_eq!(carried.uint(&m.options, opt::OBSERVE), Some(0));
        assert_eq!(carried.block(&m, opt::BLOCK2), m.block2());
        assert!(carried.block(&m, opt::BLOCK2).is_some());
        assert_eq!(carried.block(&m, opt::BLOCK1), None);
    }

    #[test]
    fn an_added_option_is_read_and_a_removed_one_is_not_found() {
        let mut m = Message::new(MessageType::Confirmable, Code::GET, 1);
        m.options.set_uint(opt::BLOCK1, 0x16);
        let mut carried = Carried::of(&m.options);
        assert!(!carried.may_have(opt::BLOCK2));
        assert!(!carried.may_have(2048));
        m.options.set_uint(opt::BLOCK2, 0x26);
        carried.add(opt::BLOCK2);
        assert_eq!(carried.block(&m, opt::BLOCK2), m.block2());
        assert!(carried.block(&m, opt::BLOCK2).is_some());
        m.options.remove(opt::BLOCK1);
        assert!(carried.may_have(opt::BLOCK1));
        assert_eq!(carried.block(&m, opt::BLOCK1), None);
    }
}

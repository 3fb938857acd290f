//! Datagram buffers used again: the bytes of a sent [`Transmit`](super::Transmit) given
//! back with [`Endpoint::recycle`](super::Endpoint::recycle) hold a later datagram, so
//! that a shard answering requests encodes its answers without allocating.
//!
//! The pool is bounded: it keeps at most [`MAX_BUFFERS`] buffers of at most
//! [`MAX_CAPACITY`] bytes each, and drops anything beyond.

use crate::message::{codec, Message};

/// Buffers kept at most (a batch of `sendmmsg`).
pub const MAX_BUFFERS: usize = 64;
/// A buffer with more capacity than this is dropped instead of kept (bytes): enough
/// for any datagram of the recommended size (RFC 7252 §4.6).
pub const MAX_CAPACITY: usize = 2048;

/// The pool of spare buffers.
#[derive(Debug, Default)]
pub(super) struct Spare {
    buffers: Vec<Vec<u8>>,
}

impl Spare {
    /// Keeps `buffer` for a later datagram, if the pool has room and it is not too large.
    pub(super) fn give(&mut self, mut buffer: Vec<u8>) {
        if self.buffers.len() < MAX_BUFFERS && buffer.capacity() <= MAX_CAPACITY {
            buffer.clear();
            self.buffers.push(buffer);
        }
    }

    /// An empty buffer: a spare one if there is one.
    pub(super) fn take(&mut self) -> Vec<u8> {
        self.buffers.pop().unwrap_or_default()
    }

    /// `msg` encoded into a spare buffer.
    pub(super) fn encode(&mut self, msg: &Message) -> Vec<u8> {
        let mut out = self.take();
        codec::encode_into(msg, &mut out);
        out
    }

    /// A copy of `bytes` in a spare buffer.
    pub(super) fn copy(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut out = self.take();
        out.extend_from_slice(bytes);
        out
    }

    /// Buffers held (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.buffers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Code, MessageType};

    #[test]
    fn given_buffers_are_used_again_and_the_pool_is_bounded() {
        let mut spare = Spare::default();
        let buffer = Vec::with_capacity(100);
        let at = buffer.as_ptr();
        spare.give(buffer);
        let msg = Message::new(MessageType::Confirmable, Code::GET, 7);
        let bytes = spare.encode(&msg);
        assert_eq!(bytes.as_ptr(), at, "the spare buffer holds the datagram");
        assert_eq!(bytes, codec::encode(&msg));
        spare.give(bytes);
        assert_eq!(spare.copy(b"abc"), b"abc", "a used buffer comes back empty");
        assert_eq!(spare.len(), 0);

        spare.give(Vec::with_capacity(MAX_CAPACITY + 1));
        assert_eq!(spare.len(), 0, "too large to keep");
        for _ in 0..MAX_BUFFERS + 5 {
            spare.give(Vec::with_capacity(16));
        }
        assert_eq!(spare.len(), MAX_BUFFERS);
    }
}

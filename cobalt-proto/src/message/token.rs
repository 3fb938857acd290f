//! The token: opaque bytes chosen by the client to match responses (RFC 7252 §5.3.1),
//! 0 to 8 bytes in RFC 7252 and up to 65,804 bytes with extended token lengths
//! (RFC 8974 §2.1).
//!
//! Almost every token is at most eight bytes long, and those are kept inline: making a
//! token, copying it into an exchange or a deduplication entry and comparing it never
//! allocates. A longer token is one heap allocation, shared by reference count, so that
//! the copies an exchange keeps (request, response, matcher key) hold it once.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Tokens of at most this many bytes are stored inline.
const INLINE_LEN: usize = 8;

/// The longest token the wire format can express: TKL 14 with a 16-bit extension of
/// 65,535, plus 269 (RFC 8974 §2.1).
pub const MAX_TOKEN_LEN: usize = 65_804;

/// The longest token an endpoint accepts unless configured otherwise
/// (`EndpointConfig::max_token_len`, `TcpConfig::max_token_len`): room for what RFC
/// 8974 §3 has a stateless client put in a token — some state, a nonce or timestamp and
/// a message authentication code (e.g. 32 + 8 + 16 bytes) — while a peer's requests in
/// progress, each holding its token, cost at most this much more than with eight-byte
/// tokens.
pub const DEFAULT_MAX_TOKEN_LEN: usize = 64;

/// A token of 0 to [`MAX_TOKEN_LEN`] bytes: up to eight stored inline, longer ones on
/// the heap behind a reference count (cloning one does not copy its bytes).
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Repr);

/// Invariant: `Inline` holds every token of at most [`INLINE_LEN`] bytes, with the
/// unused bytes zero, and `Long` every longer one, so that the derived equality agrees
/// with equality of the bytes.
#[derive(Clone, PartialEq, Eq)]
enum Repr {
    Inline { len: u8, bytes: [u8; INLINE_LEN] },
    Long(Arc<Box<[u8]>>),
}

impl Token {
    /// The zero-length token.
    pub const EMPTY: Token = Token(Repr::Inline {
        len: 0,
        bytes: [0; INLINE_LEN],
    });

    /// A token from bytes; `None` if longer than [`MAX_TOKEN_LEN`].
    #[inline]
    pub fn new(bytes: &[u8]) -> Option<Token> {
        if bytes.len() <= INLINE_LEN {
            let mut inline = [0; INLINE_LEN];
            inline[..bytes.len()].copy_from_slice(bytes);
            return Some(Token(Repr::Inline {
                len: bytes.len() as u8,
                bytes: inline,
            }));
        }
        if bytes.len() > MAX_TOKEN_LEN {
            return None;
        }
        Some(Token(Repr::Long(Arc::new(bytes.into()))))
    }

    /// An eight-byte token from a random source (RFC 7252 §5.3.1: unpredictable).
    pub fn random<R: rand::Rng + ?Sized>(rng: &mut R) -> Token {
        Token(Repr::Inline {
            len: INLINE_LEN as u8,
            bytes: rng.random(),
        })
    }

    /// The token bytes.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Repr::Long(bytes) => bytes,
        }
    }

    /// A token of at most eight bytes as an array, its unused bytes zero, and its
    /// length; `None` for a longer one. An encoder writes all eight bytes with the
    /// message's fixed header and keeps the length: one copy of a known size.
    #[inline]
    pub(crate) fn inline(&self) -> Option<(&[u8; INLINE_LEN], usize)> {
        match &self.0 {
            Repr::Inline { len, bytes } => Some((bytes, usize::from(*len))),
            Repr::Long(_) => None,
        }
    }

    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Inline { len, .. } => usize::from(*len),
            Repr::Long(bytes) => bytes.len(),
        }
    }

    /// True for the zero-length token.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True for a token longer than eight bytes, which only a peer that implements
    /// RFC 8974 can send or accept.
    pub fn is_extended(&self) -> bool {
        matches!(self.0, Repr::Long(_))
    }

    /// Bytes of heap this token holds beyond its own size (0 for up to eight bytes),
    /// for budgets that count what per-peer state costs.
    pub fn heap_bytes(&self) -> usize {
        match &self.0 {
            Repr::Inline { .. } => 0,
            Repr::Long(bytes) => bytes.len(),
        }
    }
}

/// Hashes the bytes only (as a slice: length, then bytes), which is what equality
/// compares and one hasher call fewer than the representation would take.
impl Hash for Token {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl Default for Token {
    fn default() -> Token {
        Token::EMPTY
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("(empty)");
        }
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_tokens_are_inline_and_no_bigger_than_two_words() {
        assert!(std::mem::size_of::<Token>() <= 16);
        let t = Token::new(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        assert!(!t.is_extended());
        assert_eq!(t.heap_bytes(), 0);
        assert_eq!(t.as_bytes(), &[1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn long_tokens_share_their_bytes_and_compare_by_content() {
        let bytes: Vec<u8> = (0..40).collect();
        let t = Token::new(&bytes).unwrap();
        assert!(t.is_extended());
        assert_eq!((t.len(), t.heap_bytes()), (40, 40));
        let copy = t.clone();
        assert_eq!(copy.as_bytes().as_ptr(), t.as_bytes().as_ptr());
        assert_eq!(Token::new(&bytes).unwrap(), t);
        assert_ne!(Token::new(&bytes[..39]).unwrap(), t);
        assert_ne!(Token::new(&bytes[..8]).unwrap(), t);
    }

    #[test]
    fn length_limit_is_the_rfc_8974_maximum() {
        assert!(Token::new(&vec![0; MAX_TOKEN_LEN]).is_some());
        assert!(Token::new(&vec![0; MAX_TOKEN_LEN + 1]).is_none());
    }
}

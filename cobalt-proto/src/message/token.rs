//! The token: 0 to 8 opaque bytes chosen by the client to match responses (RFC 7252 §5.3.1).

use std::fmt;

/// A token of at most eight bytes, stored inline.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Token {
    bytes: [u8; 8],
    len: u8,
}

impl Token {
    /// The zero-length token.
    pub const EMPTY: Token = Token {
        bytes: [0; 8],
        len: 0,
    };

    /// A token from bytes; `None` if longer than eight bytes.
    pub fn new(bytes: &[u8]) -> Option<Token> {
        if bytes.len() > 8 {
            return None;
        }
        let mut t = Token {
            bytes: [0; 8],
            len: bytes.len() as u8,
        };
        t.bytes[..bytes.len()].copy_from_slice(bytes);
        Some(t)
    }

    /// An eight-byte token from a random source (RFC 7252 §5.3.1: unpredictable).
    pub fn random<R: rand::Rng + ?Sized>(rng: &mut R) -> Token {
        Token {
            bytes: rng.random(),
            len: 8,
        }
    }

    /// The token bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True for the zero-length token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
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

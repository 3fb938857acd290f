//! EDHOC (RFC 9528) to set up OSCORE contexts without pre-shared secrets, with the
//! `lakers` crate and its RustCrypto backend: method 3 (both sides authenticate with a
//! static Diffie-Hellman key), cipher suite 2 (AES-CCM-16-64-128, SHA-256, P-256), the
//! credentials CCS with a P-256 key ([`Ccs`], [`EdhocIdentity`]).
//!
//! - [`EdhocResponder`]: a server's side, at `/.well-known/edhoc` (put it in the server's
//!   [`Oscore`](crate::Oscore) layer with [`Oscore::edhoc`](crate::Oscore::edhoc)). It
//!   takes message_1 and message_3 as RFC 9528 Appendix A.2 carries them over CoAP, and
//!   the EDHOC + OSCORE combined request of RFC 9668 (message_3 before the OSCORE
//!   payload, flagged by the [`EDHOC`](crate::option::EDHOC) option). Pending sessions
//!   are bounded per client address and in total, answers stay within 3× the request's
//!   size, and the contexts it made are bounded too (the least recently used goes).
//! - [`establish`]: a client's side: runs the exchange with a server and returns the
//!   OSCORE context, for [`Oscore::protect_edhoc`](crate::Oscore::protect_edhoc);
//!   message_3 goes alone (answered with message_4) or in front of the first OSCORE
//!   request ([`Completion`]).
//!
//! Both derive the OSCORE context as RFC 9528 Appendix A.1 says: Master Secret and
//! Master Salt from the EDHOC-Exporter (labels 0 and 1, 16 and 8 bytes), each side's
//! Recipient ID the connection identifier it chose, no ID Context.

mod backend;
pub mod credential;
pub mod initiator;
pub mod responder;

pub use credential::{Ccs, CredentialStyle, EdhocIdentity};
pub use initiator::{establish, Completion, EdhocContext, EdhocError};
pub use responder::{EdhocLimits, EdhocResponder};

use crate::cbor;
use crate::context::{Material, KEY_LEN};

/// The crypto backend lakers runs on ([`backend`]).
type Crypto = backend::Backend;

fn crypto() -> Crypto {
    Crypto::new()
}

/// Where a server takes EDHOC messages (RFC 9528 Appendix A.2).
pub const WELL_KNOWN_EDHOC: [&str; 2] = [".well-known", "edhoc"];

/// Content-Format application/cid-edhoc+cbor-seq (RFC 9528 §10.9): an EDHOC message
/// with a connection identifier (or `true`) before it, as requests carry them.
pub const CID_EDHOC_CBOR_SEQ: u16 = 65;
/// Content-Format application/edhoc+cbor-seq: an EDHOC message alone (responses,
/// error messages).
pub const EDHOC_CBOR_SEQ: u16 = 64;

/// The length of the OSCORE Master Salt derived from EDHOC (RFC 9528 Appendix A.1).
const SALT_LEN: usize = 8;

/// A completed EDHOC session's EDHOC-Exporter (RFC 9528 §4.2.1), with an empty
/// context: `length` bytes for `label`.
trait Exporter {
    fn export(&mut self, label: u8, length: usize) -> Vec<u8>;
}

impl<C: lakers::CryptoTrait> Exporter for lakers::EdhocResponderDone<C> {
    fn export(&mut self, label: u8, length: usize) -> Vec<u8> {
        self.edhoc_exporter(label, &[], length)[..length].to_vec()
    }
}

impl<C: lakers::CryptoTrait> Exporter for lakers::EdhocInitiatorDone<C> {
    fn export(&mut self, label: u8, length: usize) -> Vec<u8> {
        self.edhoc_exporter(label, &[], length)[..length].to_vec()
    }
}

/// The OSCORE material of a completed EDHOC session (RFC 9528 Appendix A.1): `ours`
/// is the connection identifier this side chose (its Recipient ID), `theirs` the
/// peer's (its Sender ID).
fn oscore_material(done: &mut impl Exporter, ours: &[u8], theirs: &[u8]) -> Material {
    let secret = done.export(0, KEY_LEN);
    let salt = done.export(1, SALT_LEN);
    Material::new(&secret, theirs, ours).with_salt(&salt)
}

/// An EDHOC error message (RFC 9528 §6): ERR_CODE 1 (unspecified) with a text for
/// the peer's log.
fn error_message(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 3);
    cbor::int(&mut out, 1);
    cbor::text(&mut out, text);
    out
}

/// The text of an EDHOC error message, if `payload` is one with ERR_CODE 1.
fn error_text(payload: &[u8]) -> Option<String> {
    let (&first, rest) = payload.split_first()?;
    if first != 0x01 {
        return None;
    }
    let (item, tail) = split_item(rest, 3)?;
    if !tail.is_empty() {
        return None;
    }
    std::str::from_utf8(item).ok().map(str::to_string)
}

/// Splits the first CBOR item of major type `major` (byte or text string, definite
/// length) off `bytes`: its content and what follows. `None` if `bytes` does not start
/// with one.
fn split_item(bytes: &[u8], major: u8) -> Option<(&[u8], &[u8])> {
    let (&first, rest) = bytes.split_first()?;
    if first >> 5 != major {
        return None;
    }
    let (len, rest) = match first & 0x1f {
        n @ 0..=23 => (usize::from(n), rest),
        24 => (usize::from(*rest.first()?), &rest[1..]),
        25 => (
            usize::from(u16::from_be_bytes([*rest.first()?, *rest.get(1)?])),
            &rest[2..],
        ),
        _ => return None,
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}

/// Splits the first CBOR byte string off `bytes`, whole (head and content), as EDHOC
/// message_3 is one: the item and what follows.
fn split_message(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let (content, rest) = split_item(bytes, 2)?;
    let head = bytes.len() - rest.len() - content.len();
    Some(bytes.split_at(head + content.len()))
}

/// Splits a connection identifier (RFC 9528 §3.3.2) off `bytes`: a one-byte integer
/// -24..=23 stands for the byte string of that one byte; other identifiers are byte
/// strings. The identifier's bytes and what follows.
fn split_connection_id(bytes: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let &first = bytes.first()?;
    if is_compact_id(first) {
        return Some((vec![first], &bytes[1..]));
    }
    let (id, rest) = split_item(bytes, 2)?;
    // A one-byte string that could have been an integer is not in preferred encoding.
    if id.len() > crate::context::MAX_ID_LEN || (id.len() == 1 && is_compact_id(id[0])) {
        return None;
    }
    Some((id.to_vec(), rest))
}

/// Whether `byte` is the CBOR encoding of an integer -24..=23.
fn is_compact_id(byte: u8) -> bool {
    byte <= 0x17 || (0x20..=0x37).contains(&byte)
}

/// The CBOR encoding of a connection identifier (the inverse of
/// [`split_connection_id`]).
fn encode_connection_id(id: &[u8]) -> Vec<u8> {
    match id {
        [b] if is_compact_id(*b) => vec![*b],
        _ => {
            let mut out = Vec::with_capacity(id.len() + 1);
            cbor::bytes(&mut out, id);
            out
        }
    }
}

#[cfg(test)]
mod tests;

/// Runs a lakers step on a peer's message (parsing or processing message_1 to
/// message_4): a panic inside lakers becomes a [`lakers::EDHOCError::ParsingError`]
/// instead of ending the process. lakers has panicked on malformed input before (an
/// off-curve key, lakers issue 93; an overflow in its CBOR item skipper in builds with
/// overflow checks), and everything from the network is hostile.
pub(crate) fn guarded<T>(
    step: impl FnOnce() -> Result<T, lakers::EDHOCError>,
) -> Result<T, lakers::EDHOCError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(step))
        .unwrap_or(Err(lakers::EDHOCError::ParsingError))
}

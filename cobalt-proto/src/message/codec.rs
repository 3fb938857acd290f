//! Wire encoding and decoding of UDP CoAP messages (RFC 7252 §3).
//!
//! The decoder treats its input as hostile: every length is checked against the buffer,
//! nothing is allocated beyond the size of the datagram, and every failure is an error
//! value, never a panic.

use super::code::{Code, MessageType};
use super::model::Message;
use super::option::{read_entry, Options, WireError};
use super::token::Token;
use std::fmt;

/// Why a datagram is not a valid CoAP message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than the four-byte header.
    TooShort,
    /// Version other than 1; such messages are silently ignored (§3).
    UnknownVersion(u8),
    /// Token length nibble 15, reserved (RFC 8974 §2.1: a message format error).
    InvalidTokenLength(u8),
    /// The datagram ends inside the token or an option.
    Truncated,
    /// An option delta or length nibble of 15 not part of the payload marker (§3.1).
    ReservedNibble,
    /// A payload marker followed by no payload (§3).
    EmptyPayload,
    /// Option number beyond 65535.
    OptionNumberOverflow,
    /// An empty message (0.00) with a token, options or payload (§4.1).
    NonEmptyEmptyMessage,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::TooShort => write!(f, "datagram shorter than the 4-byte CoAP header"),
            DecodeError::UnknownVersion(v) => write!(f, "unknown CoAP version {v}"),
            DecodeError::InvalidTokenLength(l) => {
                write!(f, "token length nibble {l} is reserved (RFC 8974: 0-14)")
            }
            DecodeError::Truncated => write!(f, "message truncated inside the token or an option"),
            DecodeError::ReservedNibble => write!(f, "reserved option delta/length value 15"),
            DecodeError::EmptyPayload => write!(f, "payload marker without payload"),
            DecodeError::OptionNumberOverflow => write!(f, "option number above 65535"),
            DecodeError::NonEmptyEmptyMessage => {
                write!(
                    f,
                    "empty message (0.00) carrying a token, options or payload"
                )
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// The fixed header fields, readable even from a message whose rest is malformed,
/// so that a CON with a format error can be answered with RST (§4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Message type.
    pub mtype: MessageType,
    /// Code.
    pub code: Code,
    /// Message ID.
    pub mid: u16,
}

/// Reads the fixed header of a version-1 message.
pub fn peek_header(buf: &[u8]) -> Option<Header> {
    if buf.len() < 4 || buf[0] >> 6 != 1 {
        return None;
    }
    Some(Header {
        mtype: MessageType::from_bits(buf[0] >> 4),
        code: Code(buf[1]),
        mid: u16::from_be_bytes([buf[2], buf[3]]),
    })
}

/// Decodes a datagram into a message.
pub fn decode(buf: &[u8]) -> Result<Message, DecodeError> {
    if buf.len() < 4 {
        return Err(DecodeError::TooShort);
    }
    let version = buf[0] >> 6;
    if version != 1 {
        return Err(DecodeError::UnknownVersion(version));
    }
    let mtype = MessageType::from_bits(buf[0] >> 4);
    let code = Code(buf[1]);
    let mid = u16::from_be_bytes([buf[2], buf[3]]);
    let (token, token_end) = read_token(buf)?;
    let (options, payload) = decode_options_and_payload(&buf[token_end..])?;
    if code.is_empty() && buf.len() != 4 {
        return Err(DecodeError::NonEmptyEmptyMessage);
    }
    Ok(Message {
        mtype,
        code,
        mid,
        token,
        options,
        payload: payload.to_vec(),
    })
}

/// Reads the token of a version-1 datagram (its length nibble, the extended token
/// length of RFC 8974 §2.1 after the message ID, and the token itself). Returns the
/// token and the offset of what follows it. Also used to answer a datagram whose
/// options are malformed or cut off.
#[inline]
pub fn read_token(buf: &[u8]) -> Result<(Token, usize), DecodeError> {
    let first = *buf.first().ok_or(DecodeError::TooShort)?;
    let rest = buf.get(4..).ok_or(DecodeError::TooShort)?;
    match token_span(first & 0x0f, rest)? {
        Some((start, len)) if rest.len() >= start + len => {
            let bytes = &rest[start..start + len];
            // `len` is at most MAX_TOKEN_LEN by construction of the wire format.
            let token = Token::new(bytes).ok_or(DecodeError::InvalidTokenLength(first & 0x0f))?;
            Ok((token, 4 + start + len))
        }
        _ => Err(DecodeError::Truncated),
    }
}

/// Offset added to the one-byte extended token length (TKL 13, RFC 8974 §2.1).
const TOKEN_EXT1_OFFSET: usize = 13;
/// Offset added to the two-byte extended token length (TKL 14, RFC 8974 §2.1).
const TOKEN_EXT2_OFFSET: usize = 269;

/// Where the token announced by the length nibble `tkl` lies in `rest` (the bytes
/// starting with its extended length, if any): `(offset, length)`, or `None` while
/// `rest` does not hold the extended length yet; `rest` may end before the token does.
/// Nibble 15 is reserved and an error (RFC 8974 §2.1). Shared with the RFC 8323
/// framing, which puts the extended length after the code, just before the token.
#[inline]
pub(crate) fn token_span(tkl: u8, rest: &[u8]) -> Result<Option<(usize, usize)>, DecodeError> {
    let (start, len) = match tkl {
        0..=12 => (0, usize::from(tkl)),
        13 => match rest.first() {
            Some(&ext) => (1, usize::from(ext) + TOKEN_EXT1_OFFSET),
            None => return Ok(None),
        },
        14 => match rest.get(..2) {
            Some(ext) => (
                2,
                usize::from(u16::from_be_bytes([ext[0], ext[1]])) + TOKEN_EXT2_OFFSET,
            ),
            None => return Ok(None),
        },
        _ => return Err(DecodeError::InvalidTokenLength(tkl)),
    };
    Ok(Some((start, len)))
}

/// The length nibble that announces a token of `len` bytes (RFC 8974 §2.1).
#[inline]
pub(crate) fn token_length_nibble(len: usize) -> u8 {
    if len < TOKEN_EXT1_OFFSET {
        len as u8
    } else if len < TOKEN_EXT2_OFFSET {
        13
    } else {
        14
    }
}

/// Bytes a token of `len` bytes takes on the wire after the fixed header: its extended
/// length, if any, and itself.
#[inline]
pub(crate) fn token_wire_len(len: usize) -> usize {
    len + match token_length_nibble(len) {
        13 => 1,
        14 => 2,
        _ => 0,
    }
}

/// Appends a token's extended length (if any) and its bytes. A token is at most
/// [`super::token::MAX_TOKEN_LEN`] bytes, so the two-byte extension cannot overflow.
#[inline]
pub(crate) fn push_token(token: &Token, out: &mut Vec<u8>) {
    let bytes = token.as_bytes();
    let len = bytes.len();
    if len >= TOKEN_EXT2_OFFSET {
        out.extend_from_slice(&((len - TOKEN_EXT2_OFFSET) as u16).to_be_bytes());
    } else if len >= TOKEN_EXT1_OFFSET {
        out.push((len - TOKEN_EXT1_OFFSET) as u8);
    }
    out.extend_from_slice(bytes);
}

/// Decodes the option sequence and payload that follow the token; shared with the
/// RFC 8323 framing, whose messages carry the same sequence.
pub fn decode_options_and_payload(rest: &[u8]) -> Result<(Options, &[u8]), DecodeError> {
    let (mut at, mut count, mut number) = (0, 0, 0);
    while let Some(&first) = rest.get(at) {
        if first == 0xff {
            if rest.len() == at + 1 {
                return Err(DecodeError::EmptyPayload);
            }
            return Ok((
                Options::from_wire(&rest[..at], count, number),
                &rest[at + 1..],
            ));
        }
        let entry = read_entry(rest, at, number)?;
        (at, count, number) = (entry.end(), count + 1, entry.option.number);
    }
    Ok((Options::from_wire(rest, count, number), &[]))
}

impl From<WireError> for DecodeError {
    fn from(e: WireError) -> DecodeError {
        match e {
            WireError::Truncated => DecodeError::Truncated,
            WireError::ReservedNibble => DecodeError::ReservedNibble,
            WireError::NumberOverflow => DecodeError::OptionNumberOverflow,
        }
    }
}

/// Encodes a message, appending to `out`.
pub fn encode_into(msg: &Message, out: &mut Vec<u8>) {
    let token_len = msg.token.len();
    out.reserve(
        4 + token_wire_len(token_len) + options_and_payload_len(&msg.options, &msg.payload),
    );
    let first = 0x40 | (msg.mtype.bits() << 4) | token_length_nibble(token_len);
    let [mid_high, mid_low] = msg.mid.to_be_bytes();
    match msg.token.inline() {
        Some((token, len)) => {
            // The fixed header and a short token in one copy.
            let [t0, t1, t2, t3, t4, t5, t6, t7] = *token;
            let head = [
                first, msg.code.0, mid_high, mid_low, t0, t1, t2, t3, t4, t5, t6, t7,
            ];
            out.extend_from_slice(&head[..4 + len]);
        }
        None => {
            out.extend_from_slice(&[first, msg.code.0, mid_high, mid_low]);
            push_token(&msg.token, out);
        }
    }
    encode_options_and_payload(&msg.options, &msg.payload, out);
}

/// Encodes a message into a new buffer.
pub fn encode(msg: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(msg, &mut out);
    out
}

/// Encodes the option sequence and payload; shared with the RFC 8323 framing.
pub fn encode_options_and_payload(options: &Options, payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(options.as_wire());
    if !payload.is_empty() {
        out.push(0xff);
        out.extend_from_slice(payload);
    }
}

/// Size in bytes of the encoded option sequence and payload.
pub fn options_and_payload_len(options: &Options, payload: &[u8]) -> usize {
    options.as_wire().len()
        + if payload.is_empty() {
            0
        } else {
            1 + payload.len()
        }
}

#[cfg(test)]
mod tests {
    use super::super::option::number;
    use super::super::token::MAX_TOKEN_LEN;
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rfc7252_example_get_request() {
        // CON GET with MID 0x7d34, Uri-Path "temperature" (RFC 7252 Appendix A, figure 16).
        let bytes = [
            0x40, 0x01, 0x7d, 0x34, 0xbb, b't', b'e', b'm', b'p', b'e', b'r', b'a', b't', b'u',
            b'r', b'e',
        ];
        let m = decode(&bytes).unwrap();
        assert_eq!(m.mtype, MessageType::Confirmable);
        assert_eq!(m.code, Code::GET);
        assert_eq!(m.mid, 0x7d34);
        assert_eq!(m.options.uri_path_string(), "/temperature");
        assert_eq!(encode(&m), bytes);
    }

    #[test]
    fn rfc7252_example_piggybacked_response() {
        let bytes = [
            0x61, 0x45, 0x7d, 0x34, 0x20, 0xff, b'2', b'2', b'.', b'3', b' ', b'C',
        ];
        let m = decode(&bytes).unwrap();
        assert_eq!(m.mtype, MessageType::Acknowledgement);
        assert_eq!(m.code, Code::CONTENT);
        assert_eq!(m.token.as_bytes(), &[0x20]);
        assert_eq!(m.payload, b"22.3 C");
        assert_eq!(encode(&m), bytes);
    }

    #[test]
    fn extended_delta_and_length() {
        let mut m = Message::new(MessageType::NonConfirmable, Code::POST, 1);
        m.options.push(number::URI_PATH, vec![b'a'; 20]); // 1-byte extended length
        m.options.push(number::PROXY_URI, vec![b'b'; 300]); // 2-byte extended length
        m.options.push(number::NO_RESPONSE, vec![2]); // 2-byte extended delta
        m.options.push(2000, vec![]);
        m.payload = b"x".to_vec();
        let bytes = encode(&m);
        assert_eq!(
            bytes.len(),
            options_and_payload_len(&m.options, &m.payload) + 4
        );
        assert_eq!(decode(&bytes).unwrap(), m);
    }

    #[test]
    fn format_errors() {
        assert_eq!(decode(&[0x40, 0x01]), Err(DecodeError::TooShort));
        assert_eq!(
            decode(&[0x80, 0x01, 0, 0]),
            Err(DecodeError::UnknownVersion(2))
        );
        // TKL 15 is reserved (RFC 8974 §2.1), whatever follows.
        assert_eq!(
            decode(&[0x4f, 0x01, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]),
            Err(DecodeError::InvalidTokenLength(15))
        );
        assert_eq!(decode(&[0x44, 0x01, 0, 0, 1]), Err(DecodeError::Truncated));
        // option length past the end
        assert_eq!(
            decode(&[0x40, 0x01, 0, 0, 0xb5, b'a']),
            Err(DecodeError::Truncated)
        );
        // truncated extended delta
        assert_eq!(
            decode(&[0x40, 0x01, 0, 0, 0xd0]),
            Err(DecodeError::Truncated)
        );
        assert_eq!(
            decode(&[0x40, 0x01, 0, 0, 0xf0]),
            Err(DecodeError::ReservedNibble)
        );
        assert_eq!(
            decode(&[0x40, 0x01, 0, 0, 0x0f]),
            Err(DecodeError::ReservedNibble)
        );
        assert_eq!(
            decode(&[0x40, 0x01, 0, 0, 0xff]),
            Err(DecodeError::EmptyPayload)
        );
        assert_eq!(
            decode(&[0x41, 0x00, 0, 0, 7]),
            Err(DecodeError::NonEmptyEmptyMessage)
        );
        assert_eq!(
            decode(&[0x40, 0x01, 0, 0, 0xe0, 0xff, 0xff, 0xe0, 0xff, 0xff]),
            Err(DecodeError::OptionNumberOverflow)
        );
        assert!(peek_header(&[0x40, 0x01, 0x12, 0x34, 0xf0]).is_some());
    }

    /// A GET with `token` and Uri-Path "a", encoded by hand.
    fn get_with_token(tkl: u8, ext: &[u8], token: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0x40 | tkl, 0x01, 0x12, 0x34];
        bytes.extend_from_slice(ext);
        bytes.extend_from_slice(token);
        bytes.extend_from_slice(&[0xb1, b'a']);
        bytes
    }

    #[test]
    fn extended_token_lengths_sit_between_message_id_and_token() {
        // Nibble value, extension bytes and token length at each boundary (RFC 8974 §2.1).
        let cases: [(u8, &[u8], usize); 7] = [
            (8, &[], 8),
            (9, &[], 9),
            (12, &[], 12),
            (13, &[0], 13),
            (13, &[255], 268),
            (14, &[0, 0], 269),
            (14, &[0xff, 0xff], MAX_TOKEN_LEN),
        ];
        for (tkl, ext, len) in cases {
            let token: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let bytes = get_with_token(tkl, ext, &token);
            let m = decode(&bytes).unwrap();
            assert_eq!(m.token.as_bytes(), &token[..], "token of {len} bytes");
            assert_eq!(m.options.uri_path_string(), "/a");
            assert_eq!(
                encode(&m),
                bytes,
                "token of {len} bytes re-encodes the same"
            );
            assert_eq!(read_token(&bytes).unwrap().1, 4 + ext.len() + len);
        }
    }

    #[test]
    fn malformed_extended_token_lengths_are_format_errors() {
        // TKL 13 and 14 with their length bytes cut off.
        assert_eq!(decode(&[0x4d, 0x01, 0, 0]), Err(DecodeError::Truncated));
        assert_eq!(decode(&[0x4e, 0x01, 0, 0, 0]), Err(DecodeError::Truncated));
        // A token announced longer than the datagram.
        assert_eq!(
            decode(&get_with_token(13, &[10], &[7; 20])[..4 + 1 + 20]),
            Err(DecodeError::Truncated)
        );
        assert_eq!(
            decode(&[0x4e, 0x01, 0, 0, 0xff, 0xff, 1, 2, 3]),
            Err(DecodeError::Truncated)
        );
        // An empty message never carries a token, however its length is written.
        assert_eq!(decode(&[0x4d, 0x00, 0, 0, 0]), Err(DecodeError::Truncated));
        let mut empty_with_token = vec![0x4d, 0x00, 0, 0, 0];
        empty_with_token.extend_from_slice(&[1; 13]);
        assert_eq!(
            decode(&empty_with_token),
            Err(DecodeError::NonEmptyEmptyMessage)
        );
        assert_eq!(
            read_token(&[0x4f, 0x01, 0, 0]),
            Err(DecodeError::InvalidTokenLength(15))
        );
        assert_eq!(read_token(&[0x40, 0x01]), Err(DecodeError::TooShort));
    }

    fn arb_message() -> impl Strategy<Value = Message> {
        let opts = proptest::collection::vec(
            (0u16..3000, proptest::collection::vec(any::<u8>(), 0..300)),
            0..8,
        );
        (
            0u8..4,
            1u8..=255,
            any::<u16>(),
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..=8),
                proptest::collection::vec(any::<u8>(), 9..=300),
            ],
            opts,
            proptest::collection::vec(any::<u8>(), 0..100),
        )
            .prop_map(|(t, code, mid, tok, opts, payload)| {
                let mut m = Message::new(MessageType::from_bits(t), Code(code), mid);
                m.token = Token::new(&tok).unwrap();
                for (n, v) in opts {
                    m.options.push(n, v);
                }
                m.payload = payload;
                m
            })
    }

    proptest! {
        #[test]
        fn encode_then_decode_is_identity(m in arb_message()) {
            let bytes = encode(&m);
            prop_assert_eq!(decode(&bytes).unwrap(), m);
        }

        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(m) = decode(&bytes) {
                // What decodes re-encodes to a message that decodes the same.
                prop_assert_eq!(decode(&encode(&m)).unwrap(), m);
            }
        }

        #[test]
        fn decoder_never_panics_on_valid_prefixes(m in arb_message(), cut in 0usize..400) {
            let bytes = encode(&m);
            let _ = decode(&bytes[..cut.min(bytes.len())]);
        }
    }
}

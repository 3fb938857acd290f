//! The CoAP message (RFC 7252 §3).

use super::block::BlockValue;
use super::code::{Code, MessageType};
use super::option::{self, number, Options};
use super::token::Token;
use std::fmt;

/// One CoAP message over UDP: header, token, options and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// CON, NON, ACK or RST.
    pub mtype: MessageType,
    /// Request method, response code or 0.00.
    pub code: Code,
    /// Message ID, for deduplication and matching ACK/RST.
    pub mid: u16,
    /// Token, for matching responses to requests.
    pub token: Token,
    /// Options, kept sorted.
    pub options: Options,
    /// Payload bytes (empty when there is none).
    pub payload: Vec<u8>,
}

impl Message {
    /// A message with no token, options or payload.
    pub fn new(mtype: MessageType, code: Code, mid: u16) -> Message {
        Message {
            mtype,
            code,
            mid,
            token: Token::EMPTY,
            options: Options::new(),
            payload: Vec::new(),
        }
    }

    /// An empty ACK for `mid`.
    pub fn empty_ack(mid: u16) -> Message {
        Message::new(MessageType::Acknowledgement, Code::EMPTY, mid)
    }

    /// An RST for `mid`.
    pub fn reset(mid: u16) -> Message {
        Message::new(MessageType::Reset, Code::EMPTY, mid)
    }

    /// True for a request.
    pub fn is_request(&self) -> bool {
        self.code.is_request()
    }

    /// True for a response.
    pub fn is_response(&self) -> bool {
        self.code.is_response()
    }

    /// True for 0.00.
    pub fn is_empty(&self) -> bool {
        self.code.is_empty()
    }

    /// The Block1 option, if present and well-formed.
    pub fn block1(&self) -> Option<BlockValue> {
        self.options
            .get_uint(number::BLOCK1)
            .and_then(BlockValue::decode)
    }

    /// The Block2 option, if present and well-formed.
    pub fn block2(&self) -> Option<BlockValue> {
        self.options
            .get_uint(number::BLOCK2)
            .and_then(BlockValue::decode)
    }
}

/// A multi-line, human-readable rendering used by `cobalt -v`.
impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} [MID={}] {} token={}",
            self.mtype.short_name(),
            self.mid,
            self.code,
            self.token
        )?;
        fmt_options_and_payload(&self.options, &self.payload, f)
    }
}

/// The option lines and payload line of the `cobalt -v` rendering of a message.
pub(crate) fn fmt_options_and_payload(
    options: &super::Options,
    payload: &[u8],
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
    for o in options.iter() {
        let name = option::option_name(o.number);
        write!(
            f,
            "\n  {name}: {}",
            option::display_value(o.number, o.value)
        )?;
    }
    if !payload.is_empty() {
        match std::str::from_utf8(payload) {
            Ok(text) if text.len() <= 256 => {
                write!(f, "\n  payload ({} bytes): {text}", payload.len())?
            }
            _ => write!(f, "\n  payload: {} bytes", payload.len())?,
        }
    }
    Ok(())
}

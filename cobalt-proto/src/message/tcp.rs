//! Message framing for CoAP over TCP and WebSockets (RFC 8323 §3.2, §4.4) and the
//! signaling messages of RFC 8323 §5.
//!
//! Over a reliable transport a message has no type and no message ID. Over TCP each
//! message starts with a `Len | TKL` byte, where `Len` (with up to four extended length
//! bytes) counts the options and payload that follow the token:
//!
//! ```text
//!  0 1 2 3 4 5 6 7
//! +-+-+-+-+-+-+-+-+--------------+----------+--------+-----------------+
//! |  Len  |  TKL  | Extended Len |   Code   | Token  | Options/Payload |
//! +-+-+-+-+-+-+-+-+--------------+----------+--------+-----------------+
//! ```
//!
//! A token longer than twelve bytes (TKL 13 or 14, RFC 8974 §2.1) has its extended
//! length between the code and the token; `Len` does not count it.
//!
//! Over WebSockets the WebSocket frame carries the length, so `Len` is always 0 and
//! there is no extended length.
//!
//! The decoders treat their input as hostile: a frame whose announced length exceeds the
//! caller's limit is refused as soon as its header is complete, before the body is
//! buffered or anything is allocated for it, and no input makes them panic.

use super::code::Code;
use super::codec::{
    decode_options_and_payload, encode_options_and_payload, options_and_payload_len, push_token,
    token_length_nibble, token_span, token_wire_len, DecodeError,
};
use super::option::{decode_uint, encode_uint, is_critical, Options};
use super::token::Token;
use std::fmt;

/// Offset added to a one-byte extended length (`Len` = 13).
const EXT1_OFFSET: u64 = 13;
/// Offset added to a two-byte extended length (`Len` = 14).
const EXT2_OFFSET: u64 = 269;
/// Offset added to a four-byte extended length (`Len` = 15).
const EXT4_OFFSET: u64 = 65805;

/// The default Max-Message-Size a peer is assumed to accept before its CSM says
/// otherwise (RFC 8323 §5.3.1).
pub const DEFAULT_MAX_MESSAGE_SIZE: u32 = 1152;

/// One CoAP message over a reliable transport: no type and no message ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpMessage {
    /// Request method, response code, signaling code (7.xx) or 0.00.
    pub code: Code,
    /// Token, for matching responses to requests.
    pub token: Token,
    /// Options, kept sorted.
    pub options: Options,
    /// Payload bytes (empty when there is none).
    pub payload: Vec<u8>,
}

/// A message received over TCP or WebSockets as the datagram layer's model: a
/// confirmable message with message ID 0 (neither means anything over a reliable
/// transport, RFC 8323 §3.2), so the same request handling serves both.
impl From<TcpMessage> for super::Message {
    fn from(m: TcpMessage) -> super::Message {
        super::Message {
            mtype: super::MessageType::Confirmable,
            code: m.code,
            mid: 0,
            token: m.token,
            options: m.options,
            payload: m.payload,
        }
    }
}

/// The message to send over TCP or WebSockets: the type and message ID are dropped.
impl From<super::Message> for TcpMessage {
    fn from(m: super::Message) -> TcpMessage {
        TcpMessage {
            code: m.code,
            token: m.token,
            options: m.options,
            payload: m.payload,
        }
    }
}

/// A multi-line, human-readable rendering used by `cobalt -v`: the code (a method,
/// response or signal such as 7.01 CSM), the token, options and payload.
impl fmt::Display for TcpMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.code.is_signaling() {
            // Signaling options have their own numbers (RFC 8323 §5): show the signal.
            let class = format!("{}.{:02}", self.code.class(), self.code.detail());
            return match Signal::from_message(self) {
                Ok(signal) => write!(f, "{class} {signal} token={}", self.token),
                Err(e) => write!(f, "{class} token={} (malformed: {e})", self.token),
            };
        }
        write!(f, "{} token={}", self.code, self.token)?;
        super::model::fmt_options_and_payload(&self.options, &self.payload, f)
    }
}

impl TcpMessage {
    /// A message with this code and no token, options or payload.
    pub fn new(code: Code) -> TcpMessage {
        TcpMessage {
            code,
            token: Token::EMPTY,
            options: Options::new(),
            payload: Vec::new(),
        }
    }

    /// Size in bytes of the TCP frame [`encode_tcp`] produces for this message.
    pub fn tcp_frame_len(&self) -> usize {
        let body = options_and_payload_len(&self.options, &self.payload);
        1 + ext_len_bytes(body as u64) + 1 + token_wire_len(self.token.len()) + body
    }

    /// Size in bytes of the WebSocket message payload [`encode_ws`] produces.
    pub fn ws_frame_len(&self) -> usize {
        2 + token_wire_len(self.token.len()) + options_and_payload_len(&self.options, &self.payload)
    }
}

/// Why bytes received over TCP or WebSockets are not a valid CoAP message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpDecodeError {
    /// The frame announces (TCP) or has (WebSockets) more bytes than the limit allows.
    TooLarge {
        /// Size of the whole frame in bytes, header included.
        size: u64,
        /// The limit it was checked against.
        limit: usize,
    },
    /// Token length nibble 15, reserved (a message format error, RFC 8974 §2.1).
    InvalidTokenLength(u8),
    /// A WebSocket message whose `Len` nibble is not 0 (RFC 8323 §4.4).
    NonZeroWsLength(u8),
    /// A WebSocket message too short to hold its header and token.
    Truncated,
    /// The options or payload after the token are malformed.
    Options(DecodeError),
}

impl fmt::Display for TcpDecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TcpDecodeError::TooLarge { size, limit } => {
                write!(f, "message of {size} bytes exceeds the limit of {limit}")
            }
            TcpDecodeError::InvalidTokenLength(l) => {
                write!(f, "token length nibble {l} is reserved (RFC 8974: 0-14)")
            }
            TcpDecodeError::NonZeroWsLength(l) => {
                write!(f, "WebSocket message with Len nibble {l} (must be 0)")
            }
            TcpDecodeError::Truncated => write!(f, "message truncated inside its header or token"),
            TcpDecodeError::Options(e) => write!(f, "malformed options: {e}"),
        }
    }
}

impl std::error::Error for TcpDecodeError {}

impl From<DecodeError> for TcpDecodeError {
    fn from(e: DecodeError) -> Self {
        TcpDecodeError::Options(e)
    }
}

fn ext_len_bytes(body: u64) -> usize {
    if body < EXT1_OFFSET {
        0
    } else if body < EXT2_OFFSET {
        1
    } else if body < EXT4_OFFSET {
        2
    } else {
        4
    }
}

/// Encodes a message as one RFC 8323 §3.2 TCP frame, appending to `out`.
///
/// Bodies (options and payload) larger than 65805 + 2^32 - 1 bytes cannot be framed;
/// such messages are far beyond any Max-Message-Size and the caller must not send them
/// (this function saturates the length instead of panicking).
pub fn encode_tcp(msg: &TcpMessage, out: &mut Vec<u8>) {
    let body = options_and_payload_len(&msg.options, &msg.payload) as u64;
    let tkl = token_length_nibble(msg.token.len());
    out.reserve(6 + token_wire_len(msg.token.len()) + body as usize);
    if body < EXT1_OFFSET {
        out.push(((body as u8) << 4) | tkl);
    } else if body < EXT2_OFFSET {
        out.push((13 << 4) | tkl);
        out.push((body - EXT1_OFFSET) as u8);
    } else if body < EXT4_OFFSET {
        out.push((14 << 4) | tkl);
        out.extend_from_slice(&((body - EXT2_OFFSET) as u16).to_be_bytes());
    } else {
        out.push((15 << 4) | tkl);
        let ext = u32::try_from(body - EXT4_OFFSET).unwrap_or(u32::MAX);
        out.extend_from_slice(&ext.to_be_bytes());
    }
    out.push(msg.code.0);
    push_token(&msg.token, out);
    encode_options_and_payload(&msg.options, &msg.payload, out);
}

/// Decodes one TCP frame from the front of a byte stream.
///
/// Returns `Ok(None)` when `buf` holds only a prefix of a frame (read more bytes and try
/// again), or the message and the number of bytes it took. A frame whose size, header
/// included, exceeds `max_message_size` is refused with [`TcpDecodeError::TooLarge`] as
/// soon as its length bytes have arrived, without waiting for its body.
pub fn decode_tcp(
    buf: &[u8],
    max_message_size: usize,
) -> Result<Option<(TcpMessage, usize)>, TcpDecodeError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    let len_nibble = first >> 4;
    let tkl = first & 0x0f;
    if tkl == 15 {
        return Err(TcpDecodeError::InvalidTokenLength(tkl));
    }
    let ext = match len_nibble {
        13 => 1,
        14 => 2,
        15 => 4,
        _ => 0,
    };
    let Some(ext_bytes) = buf.get(1..1 + ext) else {
        return Ok(None);
    };
    let body = match len_nibble {
        13 => u64::from(ext_bytes[0]) + EXT1_OFFSET,
        14 => u64::from(u16::from_be_bytes([ext_bytes[0], ext_bytes[1]])) + EXT2_OFFSET,
        15 => {
            u64::from(u32::from_be_bytes([
                ext_bytes[0],
                ext_bytes[1],
                ext_bytes[2],
                ext_bytes[3],
            ])) + EXT4_OFFSET
        }
        n => u64::from(n),
    };
    // The token's extended length follows the code. Until it has arrived only a lower
    // bound of the frame's size is known; that is enough to refuse a frame whose body
    // alone is too large.
    let shortest_token = match tkl {
        13 => 1 + 13,
        14 => 2 + 269,
        n => usize::from(n),
    };
    let too_large = |size: u64| TcpDecodeError::TooLarge {
        size,
        limit: max_message_size,
    };
    let at_least = (1 + ext + 1 + shortest_token) as u64 + body;
    if at_least > max_message_size as u64 {
        return Err(too_large(at_least));
    }
    let after_code = buf.get(2 + ext..).unwrap_or_default();
    let Some((token_start, token_len)) =
        token_span(tkl, after_code).map_err(|_| TcpDecodeError::InvalidTokenLength(tkl))?
    else {
        return Ok(None);
    };
    let header = 1 + ext + 1 + token_start + token_len;
    let size = header as u64 + body;
    if size > max_message_size as u64 {
        return Err(too_large(size));
    }
    // size <= max_message_size, so it fits in usize.
    let size = size as usize;
    let Some(frame) = buf.get(..size) else {
        return Ok(None);
    };
    let code = Code(frame[1 + ext]);
    let token = read_framed_token(tkl, &frame[2 + ext..header])?.0;
    let (options, payload) = decode_options_and_payload(&frame[header..])?;
    Ok(Some((
        TcpMessage {
            code,
            token,
            options,
            payload: payload.to_vec(),
        },
        size,
    )))
}

/// Encodes a message as the payload of one binary WebSocket message (RFC 8323 §4.4),
/// appending to `out`.
pub fn encode_ws(msg: &TcpMessage, out: &mut Vec<u8>) {
    out.reserve(msg.ws_frame_len());
    out.push(token_length_nibble(msg.token.len()));
    out.push(msg.code.0);
    push_token(&msg.token, out);
    encode_options_and_payload(&msg.options, &msg.payload, out);
}

/// Decodes the payload of one binary WebSocket message (RFC 8323 §4.4).
///
/// `buf` must be the whole WebSocket message; its length is checked against
/// `max_message_size` first.
pub fn decode_ws(buf: &[u8], max_message_size: usize) -> Result<TcpMessage, TcpDecodeError> {
    if buf.len() > max_message_size {
        return Err(TcpDecodeError::TooLarge {
            size: buf.len() as u64,
            limit: max_message_size,
        });
    }
    let (&first, rest) = buf.split_first().ok_or(TcpDecodeError::Truncated)?;
    if first >> 4 != 0 {
        return Err(TcpDecodeError::NonZeroWsLength(first >> 4));
    }
    let tkl = first & 0x0f;
    if tkl == 15 {
        return Err(TcpDecodeError::InvalidTokenLength(tkl));
    }
    let (&code, rest) = rest.split_first().ok_or(TcpDecodeError::Truncated)?;
    let (token, token_end) = read_framed_token(tkl, rest)?;
    let (options, payload) = decode_options_and_payload(&rest[token_end..])?;
    Ok(TcpMessage {
        code: Code(code),
        token,
        options,
        payload: payload.to_vec(),
    })
}

/// Reads the token that starts `rest` (its extended length, if any, and its bytes) for
/// the length nibble `tkl`: the token and the offset of what follows it.
fn read_framed_token(tkl: u8, rest: &[u8]) -> Result<(Token, usize), TcpDecodeError> {
    let (start, len) = token_span(tkl, rest)
        .map_err(|_| TcpDecodeError::InvalidTokenLength(tkl))?
        .filter(|(start, len)| rest.len() >= start + len)
        .ok_or(TcpDecodeError::Truncated)?;
    let token =
        Token::new(&rest[start..start + len]).ok_or(TcpDecodeError::InvalidTokenLength(tkl))?;
    Ok((token, start + len))
}

/// Signaling codes (RFC 8323 §5, §11.1).
pub mod signal_code {
    use super::Code;

    /// 7.01 CSM: Capabilities and Settings Message.
    pub const CSM: Code = Code::new(7, 1);
    /// 7.02 Ping.
    pub const PING: Code = Code::new(7, 2);
    /// 7.03 Pong.
    pub const PONG: Code = Code::new(7, 3);
    /// 7.04 Release.
    pub const RELEASE: Code = Code::new(7, 4);
    /// 7.05 Abort.
    pub const ABORT: Code = Code::new(7, 5);
}

/// Signaling option numbers; each is only meaningful with its signaling code
/// (RFC 8323 §5.3–§5.6).
pub mod signal_option {
    /// CSM: Max-Message-Size (uint, elective).
    pub const MAX_MESSAGE_SIZE: u16 = 2;
    /// CSM: Block-Wise-Transfer (empty, elective).
    pub const BLOCK_WISE_TRANSFER: u16 = 4;
    /// CSM: Extended-Token-Length (uint, elective): the longest token the sender
    /// accepts, 8 when absent (RFC 8974 §2.2.1).
    pub const EXTENDED_TOKEN_LENGTH: u16 = 6;
    /// Ping and Pong: Custody (empty, elective).
    pub const CUSTODY: u16 = 2;
    /// Release: Alternative-Address (string, elective, repeatable).
    pub const ALTERNATIVE_ADDRESS: u16 = 2;
    /// Release: Hold-Off (uint seconds, elective).
    pub const HOLD_OFF: u16 = 4;
    /// Abort: Bad-CSM-Option (uint, elective).
    pub const BAD_CSM_OPTION: u16 = 2;
}

/// A signaling message (RFC 8323 §5), typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signal {
    /// 7.01 Capabilities and Settings Message.
    Csm {
        /// Largest message the sender can receive, if announced.
        max_message_size: Option<u32>,
        /// The sender supports BERT (RFC 8323 §6).
        block_wise_transfer: bool,
        /// Longest token the sender accepts, if announced (RFC 8974 §2.2.1; 8 when not).
        extended_token_length: Option<u32>,
    },
    /// 7.02 Ping.
    Ping {
        /// The sender asks for the Pong to be delayed until pending responses are sent.
        custody: bool,
    },
    /// 7.03 Pong.
    Pong {
        /// Echoes the Ping's Custody option.
        custody: bool,
    },
    /// 7.04 Release: the sender wants the connection to close gracefully.
    Release {
        /// Where the peer may reconnect instead.
        alternative_addresses: Vec<String>,
        /// Seconds the peer should wait before reconnecting.
        hold_off: Option<u32>,
        /// Diagnostic text.
        diagnostic: String,
    },
    /// 7.05 Abort: the sender is closing the connection because of an error.
    Abort {
        /// The CSM option that caused the abort.
        bad_csm_option: Option<u16>,
        /// Diagnostic text.
        diagnostic: String,
    },
}

/// Why a 7.xx message is not a usable [`Signal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalError {
    /// The code is not one of 7.01–7.05.
    UnknownCode(Code),
    /// A critical option this implementation does not know for this signal; for a CSM
    /// the connection must be aborted with Bad-CSM-Option (RFC 8323 §5.3).
    UnknownCriticalOption(u16),
    /// A known option with a malformed value.
    MalformedOption(u16),
}

impl fmt::Display for SignalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignalError::UnknownCode(c) => write!(f, "unknown signaling code {c:?}"),
            SignalError::UnknownCriticalOption(n) => {
                write!(f, "unknown critical signaling option {n}")
            }
            SignalError::MalformedOption(n) => write!(f, "malformed signaling option {n}"),
        }
    }
}

impl std::error::Error for SignalError {}

impl fmt::Display for Signal {
    /// The signal's name and its options by name, e.g. `CSM Max-Message-Size: 1152,
    /// Block-Wise-Transfer` (RFC 8323 §5), as `cobalt -v` shows it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut options: Vec<String> = Vec::new();
        let mut value = |name: &str, v: Option<String>| {
            if let Some(v) = v {
                options.push(format!("{name}: {v}"));
            }
        };
        let diagnostic = |d: &String| (!d.is_empty()).then(|| d.clone());
        let (name, flag) = match self {
            Signal::Csm {
                max_message_size,
                block_wise_transfer,
                extended_token_length,
            } => {
                value("Max-Message-Size", max_message_size.map(|n| n.to_string()));
                value(
                    "Extended-Token-Length",
                    extended_token_length.map(|n| n.to_string()),
                );
                ("CSM", block_wise_transfer.then_some("Block-Wise-Transfer"))
            }
            Signal::Ping { custody } => ("Ping", custody.then_some("Custody")),
            Signal::Pong { custody } => ("Pong", custody.then_some("Custody")),
            Signal::Release {
                alternative_addresses,
                hold_off,
                diagnostic: d,
            } => {
                for a in alternative_addresses {
                    value("Alternative-Address", Some(a.clone()));
                }
                value("Hold-Off", hold_off.map(|s| s.to_string()));
                value("diagnostic", diagnostic(d));
                ("Release", None)
            }
            Signal::Abort {
                bad_csm_option,
                diagnostic: d,
            } => {
                value("Bad-CSM-Option", bad_csm_option.map(|n| n.to_string()));
                value("diagnostic", diagnostic(d));
                ("Abort", None)
            }
        };
        options.extend(flag.map(str::to_string));
        f.write_str(name)?;
        if !options.is_empty() {
            write!(f, " {}", options.join(", "))?;
        }
        Ok(())
    }
}

impl Signal {
    /// The signaling code of this signal.
    pub fn code(&self) -> Code {
        match self {
            Signal::Csm { .. } => signal_code::CSM,
            Signal::Ping { .. } => signal_code::PING,
            Signal::Pong { .. } => signal_code::PONG,
            Signal::Release { .. } => signal_code::RELEASE,
            Signal::Abort { .. } => signal_code::ABORT,
        }
    }

    /// The message carrying this signal, with an empty token.
    pub fn to_message(&self) -> TcpMessage {
        let mut m = TcpMessage::new(self.code());
        match self {
            Signal::Csm {
                max_message_size,
                block_wise_transfer,
                extended_token_length,
            } => {
                if let Some(size) = max_message_size {
                    m.options
                        .push(signal_option::MAX_MESSAGE_SIZE, encode_uint(*size));
                }
                if *block_wise_transfer {
                    m.options
                        .push(signal_option::BLOCK_WISE_TRANSFER, Vec::new());
                }
                if let Some(len) = extended_token_length {
                    m.options
                        .push(signal_option::EXTENDED_TOKEN_LENGTH, encode_uint(*len));
                }
            }
            Signal::Ping { custody } | Signal::Pong { custody } => {
                if *custody {
                    m.options.push(signal_option::CUSTODY, Vec::new());
                }
            }
            Signal::Release {
                alternative_addresses,
                hold_off,
                diagnostic,
            } => {
                for a in alternative_addresses {
                    m.options
                        .push(signal_option::ALTERNATIVE_ADDRESS, a.as_bytes());
                }
                if let Some(h) = hold_off {
                    m.options.push(signal_option::HOLD_OFF, encode_uint(*h));
                }
                m.payload = diagnostic.as_bytes().to_vec();
            }
            Signal::Abort {
                bad_csm_option,
                diagnostic,
            } => {
                if let Some(n) = bad_csm_option {
                    m.options
                        .push(signal_option::BAD_CSM_OPTION, encode_uint(u32::from(*n)));
                }
                m.payload = diagnostic.as_bytes().to_vec();
            }
        }
        m
    }

    /// Reads a signal from a 7.xx message. Unknown elective options are ignored; an
    /// unknown critical option is an error (RFC 8323 §5.2).
    pub fn from_message(msg: &TcpMessage) -> Result<Signal, SignalError> {
        let known: &[u16] = match msg.code {
            signal_code::CSM => &[
                signal_option::MAX_MESSAGE_SIZE,
                signal_option::BLOCK_WISE_TRANSFER,
                signal_option::EXTENDED_TOKEN_LENGTH,
            ],
            signal_code::PING | signal_code::PONG => &[signal_option::CUSTODY],
            signal_code::RELEASE => &[signal_option::ALTERNATIVE_ADDRESS, signal_option::HOLD_OFF],
            signal_code::ABORT => &[signal_option::BAD_CSM_OPTION],
            c => return Err(SignalError::UnknownCode(c)),
        };
        if let Some(o) = msg
            .options
            .iter()
            .find(|o| is_critical(o.number) && !known.contains(&o.number))
        {
            return Err(SignalError::UnknownCriticalOption(o.number));
        }
        let uint = |n: u16, max_len: usize| -> Result<Option<u32>, SignalError> {
            match msg.options.get(n) {
                None => Ok(None),
                Some(v) if v.len() <= max_len => decode_uint(v)
                    .map(Some)
                    .ok_or(SignalError::MalformedOption(n)),
                Some(_) => Err(SignalError::MalformedOption(n)),
            }
        };
        let empty_flag = |n: u16| -> Result<bool, SignalError> {
            match msg.options.get(n) {
                None => Ok(false),
                Some([]) => Ok(true),
                Some(_) => Err(SignalError::MalformedOption(n)),
            }
        };
        let diagnostic = || String::from_utf8_lossy(&msg.payload).into_owned();
        Ok(match msg.code {
            signal_code::CSM => Signal::Csm {
                max_message_size: uint(signal_option::MAX_MESSAGE_SIZE, 4)?,
                block_wise_transfer: empty_flag(signal_option::BLOCK_WISE_TRANSFER)?,
                extended_token_length: uint(signal_option::EXTENDED_TOKEN_LENGTH, 3)?,
            },
            signal_code::PING => Signal::Ping {
                custody: empty_flag(signal_option::CUSTODY)?,
            },
            signal_code::PONG => Signal::Pong {
                custody: empty_flag(signal_option::CUSTODY)?,
            },
            signal_code::RELEASE => {
                let mut alternative_addresses = Vec::new();
                for v in msg.options.get_all(signal_option::ALTERNATIVE_ADDRESS) {
                    let s = std::str::from_utf8(v)
                        .ok()
                        .filter(|s| !s.is_empty() && s.len() <= 255)
                        .ok_or(SignalError::MalformedOption(
                            signal_option::ALTERNATIVE_ADDRESS,
                        ))?;
                    alternative_addresses.push(s.to_string());
                }
                Signal::Release {
                    alternative_addresses,
                    hold_off: uint(signal_option::HOLD_OFF, 3)?,
                    diagnostic: diagnostic(),
                }
            }
            _ => {
                let bad = uint(signal_option::BAD_CSM_OPTION, 2)?;
                Signal::Abort {
                    // At most two bytes, so it fits.
                    bad_csm_option: bad.map(|n| n as u16),
                    diagnostic: diagnostic(),
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::option::number;
    use super::*;

    #[test]
    fn converts_to_and_from_the_datagram_model() {
        let mut m = TcpMessage::new(Code::GET);
        m.token = Token::new(&[1, 2]).unwrap();
        m.options.set_uri_path("a/b");
        m.payload = b"x".to_vec();
        let d = super::super::Message::from(m.clone());
        assert_eq!(d.mtype, super::super::MessageType::Confirmable);
        assert_eq!((d.mid, &d.token, &d.payload), (0, &m.token, &m.payload));
        assert_eq!(TcpMessage::from(d), m);
    }

    #[test]
    fn display_shows_signals_by_name() {
        let csm = Signal::Csm {
            extended_token_length: None,
            max_message_size: Some(1152),
            block_wise_transfer: true,
        }
        .to_message();
        assert_eq!(
            csm.to_string(),
            "7.01 CSM Max-Message-Size: 1152, Block-Wise-Transfer token=(empty)"
        );
        let release = Signal::Release {
            alternative_addresses: vec!["coap+tcp://b".into()],
            hold_off: Some(5),
            diagnostic: "bye".into(),
        };
        assert_eq!(
            release.to_string(),
            "Release Alternative-Address: coap+tcp://b, Hold-Off: 5, diagnostic: bye"
        );
        for (signal, text) in [
            (Signal::Ping { custody: true }, "Ping Custody"),
            (Signal::Pong { custody: false }, "Pong"),
            (
                Signal::Abort {
                    bad_csm_option: Some(2),
                    diagnostic: String::new(),
                },
                "Abort Bad-CSM-Option: 2",
            ),
        ] {
            assert_eq!(signal.to_string(), text);
            assert!(
                !signal.to_message().to_string().contains('{'),
                "no Rust debug output"
            );
        }
        let mut get = TcpMessage::new(Code::GET);
        get.options.set_uri_path("a");
        assert!(get.to_string().contains("Uri-Path: a"), "{get}");
    }
    use proptest::prelude::*;

    const BIG: usize = 1 << 20;

    fn roundtrip(m: &TcpMessage) -> Vec<u8> {
        let mut out = Vec::new();
        encode_tcp(m, &mut out);
        assert_eq!(out.len(), m.tcp_frame_len());
        let (d, used) = decode_tcp(&out, BIG).unwrap().unwrap();
        assert_eq!(&d, m);
        assert_eq!(used, out.len());
        out
    }

    #[test]
    fn rfc8323_get_request() {
        // GET /temperature with a one-byte token: body is the 12-byte Uri-Path option.
        let mut m = TcpMessage::new(Code::GET);
        m.token = Token::new(&[0x20]).unwrap();
        m.options.set_uri_path("temperature");
        let bytes = roundtrip(&m);
        let mut expected = vec![0xc1, 0x01, 0x20, 0xbb];
        expected.extend_from_slice(b"temperature");
        assert_eq!(bytes, expected);
    }

    #[test]
    fn empty_message_is_two_bytes() {
        let bytes = roundtrip(&TcpMessage::new(Code::EMPTY));
        assert_eq!(bytes, [0x00, 0x00]);
    }

    /// A message whose body (options + payload) is exactly `body` bytes long.
    fn with_body(body: usize) -> TcpMessage {
        let mut m = TcpMessage::new(Code::CONTENT);
        m.token = Token::new(&[1, 2, 3]).unwrap();
        if body > 0 {
            m.payload = vec![0xab; body - 1];
        }
        m
    }

    #[test]
    fn length_class_boundaries() {
        for (body, nibble, ext) in [
            (0usize, 0u8, 0usize),
            (12, 12, 0),
            (13, 13, 1),
            (268, 13, 1),
            (269, 14, 2),
            (65804, 14, 2),
            (65805, 15, 4),
            (70000, 15, 4),
        ] {
            let m = with_body(body);
            let bytes = roundtrip(&m);
            assert_eq!(bytes[0] >> 4, nibble, "body {body}");
            assert_eq!(bytes[0] & 0x0f, 3);
            assert_eq!(bytes.len(), 1 + ext + 1 + 3 + body, "body {body}");
            match ext {
                1 => assert_eq!(u64::from(bytes[1]), body as u64 - 13),
                2 => assert_eq!(
                    u64::from(u16::from_be_bytes([bytes[1], bytes[2]])),
                    body as u64 - 269
                ),
                4 => assert_eq!(
                    u64::from(u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]])),
                    body as u64 - 65805
                ),
                _ => {}
            }
            // One byte short is a prefix, never an error.
            assert_eq!(decode_tcp(&bytes[..bytes.len() - 1], BIG), Ok(None));
        }
    }

    #[test]
    fn streaming_with_trailing_bytes() {
        let a = with_body(20);
        let b = with_body(300);
        let mut stream = Vec::new();
        encode_tcp(&a, &mut stream);
        encode_tcp(&b, &mut stream);
        let (m1, n1) = decode_tcp(&stream, BIG).unwrap().unwrap();
        assert_eq!(m1, a);
        let (m2, n2) = decode_tcp(&stream[n1..], BIG).unwrap().unwrap();
        assert_eq!(m2, b);
        assert_eq!(n1 + n2, stream.len());
        assert_eq!(decode_tcp(&[], BIG), Ok(None));
    }

    #[test]
    fn too_large_refused_from_header_alone() {
        // Len = 15 with a 4-byte extended length of 0xffffffff: about 4 GiB announced,
        // only the header present.
        let hdr = [0xf0, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(
            decode_tcp(&hdr, 1152),
            Err(TcpDecodeError::TooLarge {
                size: 1 + 4 + 1 + 0xffff_ffff + 65805,
                limit: 1152
            })
        );
        // Exactly at the limit is fine; one byte over is not.
        let m = with_body(100);
        let mut bytes = Vec::new();
        encode_tcp(&m, &mut bytes);
        assert!(decode_tcp(&bytes, bytes.len()).unwrap().is_some());
        assert!(matches!(
            decode_tcp(&bytes[..2], bytes.len() - 1),
            Err(TcpDecodeError::TooLarge { .. })
        ));
        // Incomplete extended length: need more bytes, not an error.
        assert_eq!(decode_tcp(&[0xf0, 0xff], 1152), Ok(None));
    }

    #[test]
    fn format_errors() {
        // TKL 15 is reserved (RFC 8974 §2.1).
        assert_eq!(
            decode_tcp(&[0x0f], BIG),
            Err(TcpDecodeError::InvalidTokenLength(15))
        );
        assert_eq!(
            decode_ws(&[0x0f, 1], BIG),
            Err(TcpDecodeError::InvalidTokenLength(15))
        );
        // WebSockets: the token's extended length or the token itself cut off.
        assert_eq!(decode_ws(&[0x0d, 1], BIG), Err(TcpDecodeError::Truncated));
        assert_eq!(
            decode_ws(&[0x0e, 1, 0], BIG),
            Err(TcpDecodeError::Truncated)
        );
        assert_eq!(
            decode_ws(&[0x0d, 1, 5, 1, 2], BIG),
            Err(TcpDecodeError::Truncated)
        );
        // Option with length running past the frame's body.
        assert_eq!(
            decode_tcp(&[0x20, 0x01, 0xb5, b'a'], BIG),
            Err(TcpDecodeError::Options(DecodeError::Truncated))
        );
        // Payload marker with no payload.
        assert_eq!(
            decode_tcp(&[0x10, 0x45, 0xff], BIG),
            Err(TcpDecodeError::Options(DecodeError::EmptyPayload))
        );
        assert_eq!(
            decode_tcp(&[0x10, 0x45, 0xf0], BIG),
            Err(TcpDecodeError::Options(DecodeError::ReservedNibble))
        );
    }

    #[test]
    fn extended_token_lengths_follow_the_code() {
        // GET, token of 13 bytes (TKL 13, extension 0), no options: Len 0.
        let mut m = TcpMessage::new(Code::GET);
        m.token = Token::new(&[9; 13]).unwrap();
        let mut bytes = Vec::new();
        encode_tcp(&m, &mut bytes);
        let mut expected = vec![0x0d, 0x01, 0x00];
        expected.extend_from_slice(&[9; 13]);
        assert_eq!(bytes, expected);
        assert_eq!(decode_tcp(&bytes, BIG), Ok(Some((m.clone(), bytes.len()))));
        let mut ws = Vec::new();
        encode_ws(&m, &mut ws);
        assert_eq!(ws, expected);
        assert_eq!(decode_ws(&ws, BIG), Ok(m.clone()));
        // Until the extension and the token have arrived the frame is incomplete.
        for cut in 0..bytes.len() {
            assert_eq!(decode_tcp(&bytes[..cut], BIG), Ok(None), "cut at {cut}");
        }
        // TKL 14: 269 + 0x0102 = 527 bytes, counted against the size limit.
        m.token = Token::new(&[3; 527]).unwrap();
        bytes.clear();
        encode_tcp(&m, &mut bytes);
        assert_eq!(&bytes[..4], &[0x0e, 0x01, 0x01, 0x02]);
        assert_eq!(bytes.len(), m.tcp_frame_len());
        assert_eq!(decode_tcp(&bytes, BIG).unwrap().unwrap().0, m);
        assert_eq!(
            decode_tcp(&bytes[..4], 400),
            Err(TcpDecodeError::TooLarge {
                size: 4 + 527,
                limit: 400
            })
        );
        // Before the extension has arrived, the shortest token TKL 14 allows already
        // counts against the limit.
        assert_eq!(
            decode_tcp(&bytes[..2], 100),
            Err(TcpDecodeError::TooLarge {
                size: 2 + 2 + 269,
                limit: 100
            })
        );
        assert_eq!(decode_tcp(&bytes[..3], 400), Ok(None));
    }

    #[test]
    fn websocket_framing() {
        let mut m = TcpMessage::new(Code::GET);
        m.token = Token::new(&[7, 8]).unwrap();
        m.options.set_uri_path("a/b");
        m.payload = vec![1; 500];
        let mut out = Vec::new();
        encode_ws(&m, &mut out);
        assert_eq!(out[0], 0x02);
        assert_eq!(out.len(), m.ws_frame_len());
        assert_eq!(decode_ws(&out, BIG), Ok(m.clone()));
        assert_eq!(
            decode_ws(&out, out.len() - 1),
            Err(TcpDecodeError::TooLarge {
                size: out.len() as u64,
                limit: out.len() - 1
            })
        );
        assert_eq!(decode_ws(&[], BIG), Err(TcpDecodeError::Truncated));
        assert_eq!(decode_ws(&[0x00], BIG), Err(TcpDecodeError::Truncated));
        assert_eq!(
            decode_ws(&[0x02, 0x01, 9], BIG),
            Err(TcpDecodeError::Truncated)
        );
        assert_eq!(
            decode_ws(&[0x10, 0x01, 0x00], BIG),
            Err(TcpDecodeError::NonZeroWsLength(1))
        );
        assert_eq!(
            decode_ws(&[0x00, 0x00], BIG),
            Ok(TcpMessage::new(Code::EMPTY))
        );
    }

    #[test]
    fn signals_round_trip() {
        let signals = [
            Signal::Csm {
                extended_token_length: None,
                max_message_size: Some(8_388_864),
                block_wise_transfer: true,
            },
            Signal::Csm {
                extended_token_length: None,
                max_message_size: None,
                block_wise_transfer: false,
            },
            Signal::Ping { custody: true },
            Signal::Pong { custody: false },
            Signal::Release {
                alternative_addresses: vec!["coap+tcp://other.example".into()],
                hold_off: Some(30),
                diagnostic: "maintenance".into(),
            },
            Signal::Abort {
                bad_csm_option: Some(9),
                diagnostic: "bad CSM".into(),
            },
        ];
        for s in signals {
            let m = s.to_message();
            assert!(m.code.is_signaling());
            let bytes = roundtrip(&m);
            let (d, _) = decode_tcp(&bytes, BIG).unwrap().unwrap();
            assert_eq!(Signal::from_message(&d), Ok(s));
        }
    }

    #[test]
    fn rfc8323_csm_wire_bytes() {
        // CSM with Max-Message-Size 1152 (0x0480) and Block-Wise-Transfer:
        // options 0x22 04 80, 0x20; body 4 bytes.
        let m = Signal::Csm {
            extended_token_length: None,
            max_message_size: Some(1152),
            block_wise_transfer: true,
        }
        .to_message();
        let mut out = Vec::new();
        encode_tcp(&m, &mut out);
        assert_eq!(out, [0x40, 0xe1, 0x22, 0x04, 0x80, 0x20]);
    }

    #[test]
    fn signal_errors() {
        let mut m = TcpMessage::new(signal_code::CSM);
        m.options.push(9, vec![1]);
        assert_eq!(
            Signal::from_message(&m),
            Err(SignalError::UnknownCriticalOption(9))
        );
        // Unknown elective options are ignored.
        let mut m = TcpMessage::new(signal_code::CSM);
        m.options.push(8, vec![1]);
        assert_eq!(
            Signal::from_message(&m),
            Ok(Signal::Csm {
                extended_token_length: None,
                max_message_size: None,
                block_wise_transfer: false
            })
        );
        let mut m = TcpMessage::new(signal_code::CSM);
        m.options.push(signal_option::MAX_MESSAGE_SIZE, vec![1; 5]);
        assert_eq!(
            Signal::from_message(&m),
            Err(SignalError::MalformedOption(2))
        );
        let mut m = TcpMessage::new(signal_code::PING);
        m.options.push(signal_option::CUSTODY, vec![1]);
        assert_eq!(
            Signal::from_message(&m),
            Err(SignalError::MalformedOption(2))
        );
        let m = TcpMessage::new(Code::new(7, 9));
        assert_eq!(
            Signal::from_message(&m),
            Err(SignalError::UnknownCode(Code::new(7, 9)))
        );
        // Uri-Path (11) is critical and meaningless on a signal.
        let mut m = TcpMessage::new(signal_code::PING);
        m.options.push(number::URI_PATH, b"x");
        assert_eq!(
            Signal::from_message(&m),
            Err(SignalError::UnknownCriticalOption(11))
        );
    }

    fn arb_message() -> impl Strategy<Value = TcpMessage> {
        let opts = proptest::collection::vec(
            (0u16..3000, proptest::collection::vec(any::<u8>(), 0..300)),
            0..6,
        );
        (
            any::<u8>(),
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..=8),
                proptest::collection::vec(any::<u8>(), 9..=300),
            ],
            opts,
            proptest::collection::vec(any::<u8>(), 0..400),
        )
            .prop_map(|(code, tok, opts, payload)| {
                let mut m = TcpMessage::new(Code(code));
                m.token = Token::new(&tok).unwrap_or_default();
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
            let mut bytes = Vec::new();
            encode_tcp(&m, &mut bytes);
            prop_assert_eq!(bytes.len(), m.tcp_frame_len());
            let (d, used) = decode_tcp(&bytes, BIG).unwrap().unwrap();
            prop_assert_eq!(used, bytes.len());
            prop_assert_eq!(d, m.clone());
            let mut ws = Vec::new();
            encode_ws(&m, &mut ws);
            prop_assert_eq!(decode_ws(&ws, BIG).unwrap(), m);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(
            bytes in proptest::collection::vec(any::<u8>(), 0..300),
            limit in 0usize..2000,
        ) {
            if let Ok(Some((m, used))) = decode_tcp(&bytes, limit) {
                prop_assert!(used <= bytes.len() && used <= limit);
                let mut re = Vec::new();
                encode_tcp(&m, &mut re);
                prop_assert_eq!(decode_tcp(&re, BIG).unwrap().unwrap().0, m);
            }
            if let Ok(m) = decode_ws(&bytes, limit) {
                let mut re = Vec::new();
                encode_ws(&m, &mut re);
                prop_assert_eq!(decode_ws(&re, BIG).unwrap(), m);
            }
        }

        #[test]
        fn every_prefix_is_incomplete_or_the_message(m in arb_message(), extra in proptest::collection::vec(any::<u8>(), 0..8)) {
            let mut bytes = Vec::new();
            encode_tcp(&m, &mut bytes);
            let frame_len = bytes.len();
            bytes.extend_from_slice(&extra);
            for cut in 0..=bytes.len() {
                match decode_tcp(&bytes[..cut], BIG) {
                    Ok(None) => prop_assert!(cut < frame_len),
                    Ok(Some((d, used))) => {
                        prop_assert!(cut >= frame_len);
                        prop_assert_eq!(used, frame_len);
                        prop_assert_eq!(&d, &m);
                    }
                    Err(e) => prop_assert!(false, "prefix {} of {}: {}", cut, frame_len, e),
                }
            }
        }

        #[test]
        fn oversized_frames_refused_from_any_complete_header(m in arb_message()) {
            let mut bytes = Vec::new();
            encode_tcp(&m, &mut bytes);
            let limit = bytes.len() - 1;
            // As soon as the length is known the frame is refused, whatever follows: after
            // the extended length, or for a long token after the code and the token's
            // extended length.
            let ext = match bytes[0] >> 4 { 13 => 1, 14 => 2, 15 => 4, _ => 0 };
            let token_ext = match bytes[0] & 0x0f { 13 => 1 + 1, 14 => 1 + 2, _ => 0 };
            for cut in 1 + ext + token_ext..=bytes.len() {
                let refused = matches!(
                    decode_tcp(&bytes[..cut], limit),
                    Err(TcpDecodeError::TooLarge { .. })
                );
                prop_assert!(refused);
            }
        }
    }
}

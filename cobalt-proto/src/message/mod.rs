//! The CoAP message model, its UDP wire codec and the RFC 8323 TCP/WebSocket framing.

pub mod block;
pub mod code;
pub mod codec;
pub mod model;
pub mod option;
pub mod tcp;
pub mod token;

pub use block::BlockValue;
pub use code::{Code, MessageType};
pub use codec::{decode, encode, encode_into, DecodeError};
pub use model::Message;
pub use option::{content_format, number as opt, OptionRef, Options};
pub use tcp::{
    decode_tcp, decode_ws, encode_tcp, encode_ws, Signal, SignalError, TcpDecodeError, TcpMessage,
};
pub use token::{Token, DEFAULT_MAX_TOKEN_LEN, MAX_TOKEN_LEN};

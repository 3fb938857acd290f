//! The CoAP message model and its UDP wire codec.

pub mod block;
pub mod code;
pub mod codec;
pub mod model;
pub mod option;
pub mod token;

pub use block::BlockValue;
pub use code::{Code, MessageType};
pub use codec::{decode, encode, encode_into, DecodeError};
pub use model::Message;
pub use option::{content_format, number as opt, CoapOption, Options};
pub use token::Token;

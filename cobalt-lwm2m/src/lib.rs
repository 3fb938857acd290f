//! An LwM2M 1.1 server on Cobalt.
#![warn(missing_docs)]

pub mod codec;
mod model;
mod path;
mod senml;
mod tlv;
mod value;

pub use codec::{decode, encode, DecodeError, DecodeLimits, Format, UnknownFormat};
pub use model::resource_kind;
pub use path::{LwPath, PathError};
pub use value::{Entry, Kind, Value};

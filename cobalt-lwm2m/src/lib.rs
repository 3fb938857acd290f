//! An LwM2M 1.1 server on Cobalt: the registration interface of LwM2M clients, and
//! device management of the registered clients.
//!
//! [`Lwm2mServer`] is built on the resource directory of `cobalt-rd`: LwM2M's
//! registration interface (`POST /rd?ep=..&lt=..&lwm2m=..&b=..` with the client's
//! objects as link-format, update `POST /rd/<id>`, de-registration `DELETE
//! /rd/<id>`) is RFC 9176's, so registrations share the directory's store (they
//! survive a restart), expiry, limits (body size, links, registrations per peer:
//! 4.13 and 5.03) and ownership (only the identity that registered may update or
//! de-register: 4.03). A layer adds LwM2M's rules: a supported `lwm2m` version
//! (4.12), a valid binding `b` and a body that lists objects and object instances
//! (4.00 saying which).
//!
//! [`Device`] manages one registered client: Read, Discover, Write, Execute,
//! Create, Delete and Observe, through the server's own client for the socket the
//! device registered at (over `coaps`, inside its DTLS session); a request to a
//! client in queue mode that has been asleep waits for its next update. Payloads decode
//! into one value model ([`Entry`]: an [`LwPath`] and a typed [`Value`]) from
//! SenML-JSON, SenML-CBOR, TLV, plain text and opaque ([`codec`]), within
//! [`DecodeLimits`]: a device answering garbage gets an error, not a crash or a
//! growing manager.
#![warn(missing_docs)]

pub mod codec;
mod device;
mod limits;
mod model;
mod path;
mod registration;
mod route;
mod service;
mod value;

pub use codec::{decode, encode, DecodeError, DecodeLimits, Format, UnknownFormat};
pub use device::{Device, DeviceObservation, ManageError, WriteMode};
pub use limits::ManagerLimits;
pub use model::resource_kind;
pub use path::{LwPath, PathError};
pub use registration::{check as check_registration, ClientInfo, Refused, SUPPORTED_VERSIONS};
pub use service::Lwm2mServer;
pub use value::{Entry, Kind, Value};

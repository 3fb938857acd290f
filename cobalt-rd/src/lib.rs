//! A CoRE Resource Directory (RFC 9176) on Cobalt.
//!
//! Endpoints register the links to their resources at the directory (`POST /rd`),
//! renew them (`POST /rd/<id>`), and remove them (`DELETE /rd/<id>`); clients find
//! endpoints and resources by attribute (`/rd-lookup/ep`, `/rd-lookup/res`, both
//! observable). The
//! service is [`ResourceDirectory`]; registrations survive restarts in a
//! [`RegistrationStore`] ([`RedbStore`] by default; `RedisStore`, feature `redis`, is
//! one that several directory nodes share, so that any node answers for every
//! registration); [`RdClient`] is the endpoint's side, which registers and keeps its
//! registration alive.
//!
//! Every bound is in [`RdLimits`] and is answered with the RFC's code: 4.13 for a body
//! or link count too large, 4.00 for malformed link-format or attributes (saying
//! which), 5.03 with Max-Age when a peer's or the directory's budget is spent.
//! A registration may be updated, replaced or removed only by the identity that made
//! it: the PSK identity or certificate subject over DTLS/TLS, else the registering
//! address's [`AddressKey`](cobalt_proto::address::AddressKey); others get 4.03.

mod client;
mod directory;
mod error;
mod limits;
mod lookup;
mod redb_store;
#[cfg(feature = "redis")]
mod redis_store;
mod registration;
mod service;
mod store;

pub use client::{find_interface, lookup as lookup_at, renewal_interval, RdClient, RdClientError};
pub use directory::{Directory, Registrant};
pub use error::{RdError, StoreError};
pub use limits::RdLimits;
pub use lookup::{LookupKind, LookupQuery};
pub use redb_store::{RedbStore, DATABASE_FILE};
#[cfg(feature = "redis")]
pub use redis_store::RedisStore;
pub use registration::{Owner, Registration, RegistrationParams, DEFAULT_LIFETIME};
pub use service::{Clock, ResourceDirectory, SystemClock};
pub use store::{MemoryStore, RegistrationStore, StoreChange, StoreFuture, Write, Written};

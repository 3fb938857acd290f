//! The layers that come with Cobalt (see [`Layer`](super::Layer)): an access log, a
//! request timeout, a concurrency limit and authorisation over the peer's identity.
//! Give them to a server ([`Server::layer`](super::Server::layer)) or to one resource
//! ([`MethodRouter::layer`](super::MethodRouter::layer)); [`AccessLog`] serves a
//! client too ([`Client::layer`](crate::Client::layer)).

mod access_log;
mod authorize;
mod concurrency;
mod timeout;

pub use access_log::AccessLog;
pub use authorize::{Authorize, PskAllowList};
pub use concurrency::ConcurrencyLimit;
pub use timeout::Timeout;

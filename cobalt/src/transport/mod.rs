//! Connectors: bytes in, bytes out.

pub mod credentials;
pub mod dtls;
pub mod identity;
pub mod limits;
pub(crate) mod link;
pub mod mmsg;
pub mod per_ip;
pub mod tcp;
pub mod tls;
pub mod udp;
pub mod ws;

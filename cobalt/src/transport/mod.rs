//! Connectors: bytes in, bytes out.

pub mod tcp;
pub mod udp;

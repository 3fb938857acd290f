//! Connectors: bytes in, bytes out.

pub mod udp;

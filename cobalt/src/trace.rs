//! Observers of the messages a client sends and receives, for `cobalt -v` (a leaf:
//! drivers and transports both call them). Public as `cobalt::runtime::{Tracer,
//! StreamTracer}`.

use cobalt_proto::message::TcpMessage;
use std::net::SocketAddr;
use std::sync::Arc;

/// Sees every datagram a driver sends (`true`) or receives (`false`); for `cobalt -v`.
pub type Tracer = Arc<dyn Fn(bool, SocketAddr, &[u8]) + Send + Sync>;

/// Sees every CoAP message a client's TCP, TLS or WebSocket connection sends (`true`)
/// or every response and CSM it receives (`false`); for `cobalt -v`.
pub type StreamTracer = Arc<dyn Fn(bool, SocketAddr, &TcpMessage) + Send + Sync>;

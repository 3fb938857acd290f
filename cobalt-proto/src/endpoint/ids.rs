//! The identifiers under which the endpoint reports exchanges to the application.

/// Identifies a request received by this endpoint (server role) until it is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExchangeId(pub u64);

/// Identifies a request sent by this endpoint (client role).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

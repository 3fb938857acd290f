//! Exit codes of the `cobalt` command (documented in `cobalt --help`).

/// Bad arguments, URI or file.
pub const USAGE: i32 = 2;
/// Timeout, reset, unreachable host or other transport failure.
pub const NETWORK: i32 = 3;
/// The server answered 4.xx.
pub const CLIENT_ERROR: i32 = 4;
/// The server answered 5.xx.
pub const SERVER_ERROR: i32 = 5;
/// The server's answer did not make sense (e.g. unparsable link-format).
pub const PROTOCOL: i32 = 6;

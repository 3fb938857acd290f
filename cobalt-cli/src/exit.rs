//! Exit codes of the `cobalt` command, one table for every subcommand (documented in
//! `cobalt --help` and the README).

/// Success: a 2.xx answer (`bench`: at least one request completed with 2.xx).
pub const OK: i32 = 0;
/// A failure on this machine: a port already in use, no runtime or threads, out of
/// file descriptors, an output file that cannot be written.
pub const FAILURE: i32 = 1;
/// Bad arguments, URI, configuration or payload file.
pub const USAGE: i32 = 2;
/// Timeout, reset, port not open, unreachable or unresolvable host, failed DTLS/TLS
/// handshake, lost observation, or (`bench`) no answer at all.
pub const NETWORK: i32 = 3;
/// The server answered 4.xx (`bench`: nothing completed, mostly 4.xx answers).
pub const CLIENT_ERROR: i32 = 4;
/// The server answered 5.xx (`bench`: nothing completed, mostly 5.xx answers).
pub const SERVER_ERROR: i32 = 5;
/// The server's answer did not make sense (e.g. unparsable link-format).
pub const PROTOCOL: i32 = 6;
/// Interrupted by Ctrl-C (`bench`, whose results are then partial).
pub const INTERRUPTED: i32 = 130;

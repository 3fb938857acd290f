//! `redis-server` (Debian `redis-server`, 7.0) for the resource directory's shared
//! store: one throwaway server per test, on a free loopback port, persisting
//! nothing.

use super::{on_path, require, Listen, PeerServer};
use crate::ports::V4;
use crate::ready::Ready;
use std::process::Command;

/// A `redis-server` on a free port of 127.0.0.1 with no persistence (`--save ""
/// --appendonly no`), killed on drop; `None` (test skipped) if it is not installed,
/// a panic under `COBALT_REQUIRE_PEERS=1`.
pub fn start() -> Option<PeerServer> {
    let bin = require("redis-server", on_path("redis-server"))?;
    Some(PeerServer::start(
        "redis-server",
        Listen {
            ip: V4,
            free: &[0],
            at: 0,
            ready: Ready::TcpListening,
        },
        None,
        |port| {
            let mut c = Command::new(&bin);
            c.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--port", &port.to_string()]);
            c
        },
    ))
}

/// The `redis://` URL of a server started by [`start`].
pub fn url(server: &PeerServer) -> String {
    format!("redis://{}/", server.addr)
}

//! Real CoAP peers: finding their programs (the skip rule: [`require`]), and
//! starting servers on free ports with a readiness check ([`PeerServer`]). One module
//! per peer: [`libcoap`], [`aiocoap`], [`californium`], and [`redis`] (the resource
//! directory's shared store).

pub mod aiocoap;
pub mod californium;
pub mod libcoap;
pub mod redis;

use crate::ports;
use crate::process::ChildGuard;
use crate::ready::Ready;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to get ready (a Python or Java start on a loaded
/// machine included) before it is started again on other ports.
pub const START_LIMIT: Duration = Duration::from_secs(20);

/// Upper bound for any single peer command; the tools have their own, shorter limits.
pub const COMMAND_LIMIT: Duration = Duration::from_secs(30);

/// The workspace root (where `scripts/` and `tests/peers/` live).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cobalt-test-support lives inside the workspace")
        .to_path_buf()
}

/// Decides what happens when a peer is missing: a failure under
/// `COBALT_REQUIRE_PEERS=1`, otherwise a `SKIPPED:` note on stderr and `None` (the
/// test returns).
pub fn require<T>(what: &str, found: Option<T>) -> Option<T> {
    if found.is_some() {
        return found;
    }
    let hint = "run scripts/install-test-deps.sh to install the interop peers";
    if std::env::var("COBALT_REQUIRE_PEERS").is_ok_and(|v| v == "1") {
        panic!("{what} is not installed and COBALT_REQUIRE_PEERS=1: {hint}");
    }
    eprintln!(
        "SKIPPED: {what} not found ({hint}; set COBALT_REQUIRE_PEERS=1 to make this a failure)"
    );
    None
}

/// Unwraps a peer or returns from the test (after [`require`] printed the skip note,
/// or panics under `COBALT_REQUIRE_PEERS=1`): `let bin = need!("what", found);`.
#[macro_export]
macro_rules! need {
    ($what:expr, $found:expr) => {
        match $crate::peers::require($what, $found) {
            Some(p) => p,
            None => return,
        }
    };
}

/// `name` in a directory of `PATH`, if it is an executable file there.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

/// Whether `p` is an executable file.
pub fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Where a server listens: on `ip`, at `port + at` of a port `port` chosen such that
/// `port + o` is free for every `o` in `free`; ready once `ready` holds there.
#[derive(Debug, Clone, Copy)]
pub struct Listen<'a> {
    /// The address.
    pub ip: IpAddr,
    /// Offsets from the chosen port that must be free (every port the server binds).
    pub free: &'a [u16],
    /// The offset of the port the test talks to.
    pub at: u16,
    /// The readiness check there.
    pub ready: Ready,
}

/// A running server peer, killed on drop.
#[derive(Debug)]
pub struct PeerServer {
    /// Where the test talks to it.
    pub addr: SocketAddr,
    /// The port it was given on its command line (`addr` less [`Listen::at`]).
    pub port: u16,
    _child: ChildGuard,
}

impl PeerServer {
    /// Starts `make(port)` (stdin and stderr closed, stdout to `log` or closed) and
    /// waits until it is ready as `listen` says. A server that exits or is not ready
    /// within [`START_LIMIT`] (its port taken meanwhile) is tried again on another port,
    /// three times in all.
    pub fn start(
        what: &str,
        listen: Listen<'_>,
        log: Option<&Path>,
        make: impl Fn(u16) -> Command,
    ) -> PeerServer {
        for _attempt in 0..3 {
            let port = ports::free_ports(listen.ip, listen.free);
            let stdout = match log {
                Some(file) => Stdio::from(std::fs::File::create(file).expect("create the log")),
                None => Stdio::null(),
            };
            let mut cmd = make(port);
            cmd.stdin(Stdio::null())
                .stdout(stdout)
                .stderr(Stdio::null());
            let mut child = ChildGuard::spawn(what, &mut cmd);
            let addr = SocketAddr::new(listen.ip, port + listen.at);
            let deadline = Instant::now() + START_LIMIT;
            while child.exited().is_none() && Instant::now() < deadline {
                if listen.ready.check(addr) {
                    return PeerServer {
                        addr,
                        port,
                        _child: child,
                    };
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            eprintln!("note: {what} was not ready on {addr}; trying other ports");
        }
        panic!("{what} did not get ready on {} (3 attempts)", listen.ip);
    }

    /// `coap://addr/path` (IPv6 literals in brackets); `path` starts with `/`.
    pub fn uri(&self, path: &str) -> String {
        self.scheme_uri("coap", path)
    }

    /// `SCHEME://addr/path`.
    pub fn scheme_uri(&self, scheme: &str, path: &str) -> String {
        format!("{scheme}://{}{path}", self.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::V4;

    #[test]
    fn a_missing_peer_is_skipped_or_required() {
        assert_eq!(require("present", Some(1)), Some(1));
        if std::env::var("COBALT_REQUIRE_PEERS").is_ok_and(|v| v == "1") {
            let r = std::panic::catch_unwind(|| require::<PathBuf>("absent", None));
            assert!(r.is_err());
        } else {
            assert_eq!(require::<PathBuf>("absent", None), None);
        }
    }

    #[test]
    fn a_server_is_ready_once_its_port_is_taken() {
        // python3 (which the scripts need anyway) binds the UDP port it is given.
        let server = PeerServer::start(
            "python3 UDP socket",
            Listen {
                ip: V4,
                free: &[0],
                at: 0,
                ready: Ready::UdpBound,
            },
            None,
            |port| {
                let mut c = Command::new("python3");
                c.args(["-c", "import socket,sys,time; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('127.0.0.1', int(sys.argv[1]))); time.sleep(60)"])
                    .arg(port.to_string());
                c
            },
        );
        assert_eq!(server.addr, SocketAddr::new(V4, server.port));
        assert_eq!(
            server.uri("/x"),
            format!("coap://127.0.0.1:{}/x", server.port)
        );
        let addr = server.addr;
        drop(server);
        assert!(!Ready::UdpBound.check(addr), "the server is gone");
    }
}

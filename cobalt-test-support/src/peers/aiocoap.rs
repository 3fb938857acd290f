//! aiocoap (PyPI, with its `ws` extra) in the virtual environment
//! `scripts/install-test-deps.sh` makes (`.venv-peers/`, or `$COBALT_AIOCOAP_BIN`):
//! `aiocoap-client`, `aiocoap-fileserver`, and the scripts in `tests/peers/`.

use super::{is_executable, repo_root, require, Listen, PeerServer};
use crate::ports::V4;
use crate::ready::Ready;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The directory holding aiocoap's programs: `$COBALT_AIOCOAP_BIN` or
/// `<repo>/.venv-peers/bin`.
pub fn bin_dir() -> PathBuf {
    match std::env::var_os("COBALT_AIOCOAP_BIN") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => repo_root().join(".venv-peers").join("bin"),
    }
}

/// The program `name` of aiocoap's environment (`aiocoap-client`,
/// `aiocoap-fileserver`), if installed.
pub fn program(name: &str) -> Option<PathBuf> {
    Some(bin_dir().join(name)).filter(|p| is_executable(p))
}

/// `aiocoap-client`.
pub fn client() -> Option<PathBuf> {
    program("aiocoap-client")
}

/// The Python interpreter that has aiocoap installed (next to `aiocoap-client`).
pub fn python() -> Option<PathBuf> {
    client()?;
    ["python3", "python"]
        .iter()
        .map(|n| bin_dir().join(n))
        .find(|p| is_executable(p))
}

/// [`python`] if it can also run aiocoap's WebSocket transport (the `websockets`
/// package); otherwise `None` after [`require`]'s note (or its panic under
/// `COBALT_REQUIRE_PEERS=1`).
pub fn ws_python() -> Option<PathBuf> {
    let python = require("aiocoap", python())?;
    let ok = Command::new(&python)
        .args(["-c", "import aiocoap, websockets"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    require(
        "aiocoap's ws extra (the websockets package)",
        ok.then_some(python),
    )
}

/// A script of `tests/peers/` (e.g. `aiocoap_observe.py`).
pub fn script(name: &str) -> PathBuf {
    let path = repo_root().join("tests/peers").join(name);
    assert!(path.is_file(), "missing {}", path.display());
    path
}

/// What `tests/peers/aiocoap_server.py` serves, and which of its ports the test
/// talks to: given `--port N`, UDP on N, TLS on N + 1, WebSockets on N + 3000
/// and secure ones on N + 3001.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serve {
    /// coap (its `udp6` transport), on N.
    Udp,
    /// coaps+tcp, on N + 1 (needs a certificate).
    Tls,
    /// coap+ws, on N + 3000.
    Ws,
    /// coaps+ws, on N + 3001 (needs a certificate).
    Wss,
}

impl Serve {
    fn transport(self) -> &'static str {
        match self {
            Serve::Udp => "udp6",
            Serve::Tls => "tlsserver",
            Serve::Ws | Serve::Wss => "ws",
        }
    }

    fn listen(self) -> Listen<'static> {
        let (at, ready) = match self {
            Serve::Udp => (0, Ready::CoapPing),
            Serve::Tls => (1, Ready::TcpListening),
            Serve::Ws => (3000, Ready::TcpListening),
            Serve::Wss => (3001, Ready::TcpListening),
        };
        Listen {
            ip: V4,
            free: &[0, 1, 3000, 3001],
            at,
            ready,
        }
    }
}

/// `tests/peers/aiocoap_server.py` run by `python` on 127.0.0.1, serving `serve`,
/// with a certificate and key (PEM files) for TLS.
pub fn server(python: &Path, serve: Serve, tls: Option<(&str, &str)>) -> PeerServer {
    let script = script("aiocoap_server.py");
    PeerServer::start("aiocoap_server.py", serve.listen(), None, |port| {
        let mut c = Command::new(python);
        c.arg(&script)
            .args(["--bind", "127.0.0.1", "--port"])
            .arg(port.to_string())
            .args(["--transports", serve.transport()]);
        if let Some((cert, key)) = tls {
            c.args(["--tls-cert", cert, "--tls-key", key]);
        }
        c
    })
}

/// `aiocoap-fileserver` (the program `bin`) serving the files in `dir` on 127.0.0.1,
/// talked to over coap+tcp.
pub fn fileserver(bin: &Path, dir: &Path) -> PeerServer {
    let listen = Listen {
        ip: V4,
        free: &[0],
        at: 0,
        ready: Ready::TcpListening,
    };
    PeerServer::start("aiocoap-fileserver", listen, None, |port| {
        let mut c = Command::new(bin);
        c.arg("--bind").arg(format!("127.0.0.1:{port}")).arg(dir);
        c
    })
}

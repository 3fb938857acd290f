//! libcoap's command-line tools (Debian's `libcoap3-bin`): `coap-client-*` and
//! `coap-server-*`, built without TLS (`-notls`) or on OpenSSL (`-openssl`), looked
//! up on `PATH`; and libcoap 4.3.4, the first with Q-Block (RFC 9177), from the
//! wrappers `scripts/install-test-deps.sh` writes to `.cache/libcoap-4.3.4/bin/`
//! ([`qblock_tool`]).

use super::{on_path, Listen, PeerServer};
use crate::ready::Ready;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The client without (D)TLS.
pub const CLIENT: &str = "coap-client-notls";
/// The server without (D)TLS.
pub const SERVER: &str = "coap-server-notls";
/// The client on OpenSSL (DTLS and TLS).
pub const CLIENT_OPENSSL: &str = "coap-client-openssl";
/// The server on OpenSSL (DTLS and TLS).
pub const SERVER_OPENSSL: &str = "coap-server-openssl";

/// The tool `name` (one of the constants), if installed.
pub fn tool(name: &str) -> Option<PathBuf> {
    on_path(name)
}

/// The tool `name` (one of the constants) of libcoap 4.3.4, which has Q-Block
/// (RFC 9177; Debian bookworm's 4.3.1 has none), if `scripts/install-test-deps.sh`
/// installed it (it runs Debian trixie's binaries with their own loader).
pub fn qblock_tool(name: &str) -> Option<PathBuf> {
    let p = super::repo_root()
        .join(".cache/libcoap-4.3.4/bin")
        .join(name);
    super::is_executable(&p).then_some(p)
}

/// The value of libcoap's `-L` (a sum of COAP_BLOCK_* flags) that makes a tool use
/// Q-Block: COAP_BLOCK_USE_LIBCOAP (1) + COAP_BLOCK_TRY_Q_BLOCK (4).
pub const Q_BLOCK_MODE: &str = "5";

/// Which of a libcoap server's ports the test talks to: given `-p N`, it serves
/// coap (UDP) and coap+tcp on N, coaps (DTLS) and coaps+tcp (TLS) on N + 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// coap on N, ready once it answers a CoAP ping.
    Coap,
    /// coap on N, ready once the port is bound: nothing is sent to it first (so that
    /// e.g. `-l 1`, drop the first datagram, applies to the test's own first exchange).
    CoapQuiet,
    /// coap+tcp on N, ready once it accepts connections.
    CoapTcp,
    /// coaps on N + 1, ready once the port is bound.
    Coaps,
    /// coaps+tcp on N + 1, ready once it accepts connections.
    CoapsTcp,
}

/// Starts the server program `bin` with `args` and `-A IP -p N`, on free ports;
/// ready (and [`PeerServer::addr`]) as `port` says; its log (stdout, e.g. with
/// `-v 7`) to `log` if given.
pub fn server(bin: &Path, ip: IpAddr, args: &[&str], port: Port, log: Option<&Path>) -> PeerServer {
    let (at, ready) = match port {
        Port::Coap => (0, Ready::CoapPing),
        Port::CoapQuiet => (0, Ready::UdpBound),
        Port::CoapTcp => (0, Ready::TcpListening),
        Port::Coaps => (1, Ready::UdpBound),
        Port::CoapsTcp => (1, Ready::TcpListening),
    };
    let listen = Listen {
        ip,
        free: &[0, 1],
        at,
        ready,
    };
    let what = bin
        .file_name()
        .map_or("libcoap server".into(), |n| n.to_string_lossy());
    PeerServer::start(&what, listen, log, |n| {
        let mut c = Command::new(bin);
        c.args(args)
            .arg("-A")
            .arg(ip.to_string())
            .arg("-p")
            .arg(n.to_string());
        c
    })
}

/// The options that give a libcoap tool `files`' certificate and key of `who`
/// (`"server"` or `"client"`) and make it trust (`-C`) and require (`-R`) the CA.
#[cfg(feature = "pki")]
pub fn pki_args(files: &crate::pki::PkiFiles, who: &str) -> Vec<String> {
    let (cert, key, ca) = (
        files.path(&format!("{who}.pem")),
        files.path(&format!("{who}.key")),
        files.path("ca.pem"),
    );
    ["-c", &cert, "-j", &key, "-C", &ca, "-R", &ca]
        .map(String::from)
        .to_vec()
}

//! Running the real `cobalt` binary from integration tests.
#![allow(dead_code)] // each test file uses a part

use cobalt_test_support::peers::{Listen, PeerServer};
use cobalt_test_support::ready::Ready;
use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::process::{Child, Command, Stdio};

/// Kills the process (a server) when the test ends, passed or failed.
pub use cobalt_test_support::process::ChildGuard;

/// A command running the `cobalt` binary under test, without the caller's RUST_LOG.
pub fn cobalt() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cobalt"));
    c.env_remove("RUST_LOG");
    c
}

/// `cobalt serve` on 127.0.0.1, a free port, one shard; add flags with `.args(..)`.
pub fn local_serve() -> Command {
    local_serve_shards(1)
}

/// `cobalt serve` on 127.0.0.1, a free port, `shards` shards.
pub fn local_serve_shards(shards: usize) -> Command {
    let mut c = cobalt();
    c.args(["serve", "--bind", "127.0.0.1", "--port", "0", "--shards"])
        .arg(shards.to_string());
    c
}

/// Stderr lines of a started server.
pub type Lines = Box<dyn Iterator<Item = String> + Send>;

/// Starts a server with its stderr piped (stdout discarded).
pub fn spawn_server(mut command: Command) -> (ChildGuard, Lines) {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let lines = BufReader::new(stderr).lines().map_while(Result::ok);
    (ChildGuard::new(child), Box::new(lines))
}

/// Starts a server (`command`, e.g. `cobalt().args(["serve", ...])`) and waits until it
/// prints a line containing `ready` on stderr; its stderr is drained from then on, so
/// that it never blocks on a full pipe.
pub fn serve_until(command: Command, ready: &str) -> ChildGuard {
    let (server, mut lines) = spawn_server(command);
    let up = lines.by_ref().any(|l| l.contains(ready));
    assert!(up, "the server never printed {ready:?}");
    std::thread::spawn(move || lines.for_each(drop));
    server
}

/// Starts a server (`command`) and waits until it has printed a stderr line starting
/// with each of `prefixes` (e.g. `"cobalt: serving CoAP on "`); returns it and, for
/// each prefix, the first word after it (the address). Its stderr is drained from then on.
pub fn serve_printing(command: Command, prefixes: &[&str]) -> (ChildGuard, Vec<String>) {
    let (server, mut lines) = spawn_server(command);
    let mut found: Vec<Option<String>> = vec![None; prefixes.len()];
    for line in lines.by_ref() {
        for (i, prefix) in prefixes.iter().enumerate() {
            if let Some(rest) = line.trim().strip_prefix(prefix) {
                found[i] = rest.split(' ').next().map(str::to_string);
            }
        }
        if found.iter().all(Option::is_some) {
            break;
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    let found = found
        .into_iter()
        .zip(prefixes)
        .map(|(f, p)| f.unwrap_or_else(|| panic!("the server never printed {p:?}")))
        .collect();
    (server, found)
}

/// Reads what is left of a child's stderr.
pub fn rest_of_stderr(child: &mut Child) -> String {
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    err
}

/// `cobalt serve --plugtest` on `ip` (both the demo and the plugtest resources).
pub fn start_cobalt(ip: IpAddr) -> PeerServer {
    start_cobalt_with(ip, &[])
}

/// `cobalt serve --plugtest ARGS` on `ip`, ready once it answers a CoAP ping.
pub fn start_cobalt_with(ip: IpAddr, args: &[&str]) -> PeerServer {
    let listen = Listen {
        ip,
        free: &[0],
        at: 0,
        ready: Ready::CoapPing,
    };
    PeerServer::start("cobalt serve", listen, None, |port| {
        let mut c = cobalt();
        c.args(["serve", "--plugtest", "--bind"])
            .arg(ip.to_string())
            .arg("--port")
            .arg(port.to_string())
            .args(args);
        c
    })
}

/// The sum of the series of `name` in the /metrics page a server serves at `metrics`
/// (host:port).
pub fn metric(metrics: &str, name: &str) -> f64 {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(metrics).unwrap();
    conn.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).unwrap();
    body.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `cobalt serve` with `serve_args` and certificates both ways (`--dtls-cert`,
/// `--dtls-key`, `--dtls-ca`, so a client certificate is required), then `cobalt get
/// coaps://…/benchmark` with `get_args`: with a client certificate it gets "hello
/// world"; without one (the CA only) its DTLS handshake fails.
#[cfg(feature = "openssl")]
pub fn assert_client_certificates_required(ca_name: &str, serve_args: &[&str], get_args: &[&str]) {
    use cobalt_test_support::pki::PkiFiles;
    use cobalt_test_support::ports::{free_udp_port, V4};
    let pki = PkiFiles::new(ca_name);
    let (port, dtls_port) = (free_udp_port(V4), free_udp_port(V4));
    let mut serve = cobalt();
    serve
        .args(["serve", "--bind", "127.0.0.1"])
        .args(serve_args)
        .args(["--port", &port.to_string()])
        .args(["--dtls-port", &dtls_port.to_string(), "--dtls-cert"])
        .arg(pki.path("server.pem"))
        .arg("--dtls-key")
        .arg(pki.path("server.key"))
        .arg("--dtls-ca")
        .arg(pki.path("ca.pem"));
    let _server = serve_until(serve, "serving CoAP over DTLS on");
    let uri = format!("coaps://127.0.0.1:{dtls_port}/benchmark");
    let ok = cobalt()
        .args(["get", &uri])
        .args(get_args)
        .arg("--dtls-ca")
        .arg(pki.path("ca.pem"))
        .arg("--dtls-cert")
        .arg(pki.path("client.pem"))
        .arg("--dtls-key")
        .arg(pki.path("client.key"))
        .output()
        .unwrap();
    assert!(ok.status.success(), "{ok:?}");
    assert_eq!(String::from_utf8_lossy(&ok.stdout), "hello world");
    let anonymous = cobalt()
        .args(["get", &uri])
        .args(get_args)
        .arg("--dtls-ca")
        .arg(pki.path("ca.pem"))
        .output()
        .unwrap();
    assert!(!anonymous.status.success());
    let err = String::from_utf8_lossy(&anonymous.stderr);
    assert!(err.contains("DTLS handshake"), "{err}");
}

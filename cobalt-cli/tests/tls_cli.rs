//! `cobalt serve --cert --key --tls --ws` and `cobalt get coaps+tcp://...` /
//! `coaps+ws://...` through the real binary.

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

#[path = "common/binary.rs"]
mod binary;

use binary::{cobalt, KillOnDrop};

fn free_tcp_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn free_udp_port() -> u16 {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap().port()
}

/// A CA with server and client certificates, written to `dir`.
fn write_pki(dir: &Path, cn: &str) {
    let pki = cobalt::transport::dtls::test_pki::generate(cn).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    for (name, pem) in [
        ("ca.pem", &pki.ca_pem),
        ("server.pem", &pki.server.cert_chain_pem),
        ("server.key", &pki.server.key_pem),
    ] {
        std::fs::write(dir.join(name), pem).unwrap();
    }
}

fn get(uri: &str, ca: &Path) -> Output {
    cobalt()
        .args(["get", uri, "--ca"])
        .arg(ca)
        .output()
        .unwrap()
}

#[test]
fn serve_and_get_over_tls_and_secure_websockets() {
    let dir = std::env::temp_dir().join(format!("cobalt-tls-cli-{}", std::process::id()));
    write_pki(&dir, "Cobalt TLS CLI CA");
    let other: PathBuf = dir.join("other");
    write_pki(&other, "Another CA");
    let (tls, ws, wss) = (free_tcp_port(), free_tcp_port(), free_tcp_port());
    let mut child = cobalt()
        .args(["serve", "--bind", "127.0.0.1", "--shards", "1"])
        .args(["--port", &free_udp_port().to_string()])
        .args(["--dtls-port", &free_udp_port().to_string()])
        .arg("--cert")
        .arg(dir.join("server.pem"))
        .arg("--key")
        .arg(dir.join("server.key"))
        .args(["--tls", &tls.to_string()])
        .args(["--ws-port", &ws.to_string(), "--wss-port", &wss.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let _server = KillOnDrop(child);
    // Kept open until the end: a closed pipe would fail the server's later writes.
    let mut lines = BufReader::new(stderr).lines();
    let up = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.contains("serving CoAP over secure WebSockets on"));
    assert!(up, "the server did not report its coaps+ws address");

    let ca = dir.join("ca.pem");
    for uri in [
        format!("coaps+tcp://127.0.0.1:{tls}/benchmark"),
        format!("coaps+tcp://localhost:{tls}/benchmark"),
        format!("coaps+ws://127.0.0.1:{wss}/benchmark"),
    ] {
        let ok = get(&uri, &ca);
        assert!(ok.status.success(), "{uri}: {ok:?}");
        assert_eq!(String::from_utf8_lossy(&ok.stdout), "hello world");
    }
    // Plain WebSockets next to the secure ones.
    let plain = cobalt()
        .args(["get", &format!("coap+ws://127.0.0.1:{ws}/benchmark")])
        .output()
        .unwrap();
    assert!(plain.status.success(), "{plain:?}");

    // A server certificate from a CA the client does not trust: exit 3, one clear line.
    let untrusted = get(
        &format!("coaps+tcp://127.0.0.1:{tls}/benchmark"),
        &other.join("ca.pem"),
    );
    assert_eq!(untrusted.status.code(), Some(3), "{untrusted:?}");
    let err = String::from_utf8_lossy(&untrusted.stderr);
    assert!(err.contains("TLS handshake"), "{err}");
    assert!(err.contains("trusted CA"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn tls_without_credentials_is_a_usage_error() {
    let out = cobalt()
        .args(["serve", "--port", "0", "--tls"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--cert"), "{err}");
}

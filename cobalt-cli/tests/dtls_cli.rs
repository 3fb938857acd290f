//! `cobalt serve --dtls-psk-file` and `cobalt get coaps://... --psk-identity --psk-key`,
//! through the real binary.
#![cfg(feature = "openssl")]

use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::process::Stdio;

#[path = "common/binary.rs"]
mod binary;

use binary::{cobalt, serve_until, write_test_pki, KillOnDrop};

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn serve_and_get_over_dtls_with_a_key_file() {
    let dir = std::env::temp_dir().join(format!("cobalt-dtls-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys.txt");
    std::fs::write(
        &keys,
        "# test keys\nalice:secretPSK\nbob:0x00112233445566778899aabbccddeeff\n",
    )
    .unwrap();
    let (port, dtls_port) = (free_port(), free_port());
    let mut child = cobalt()
        .args(["serve", "--bind", "127.0.0.1", "--shards", "1"])
        .args(["--port", &port.to_string()])
        .args(["--dtls-port", &dtls_port.to_string(), "--dtls-psk-file"])
        .arg(&keys)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let _server = KillOnDrop(child);
    let mut lines = BufReader::new(stderr).lines();
    let mut up = false;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line.contains("serving CoAP over DTLS on") {
            up = true;
            break;
        }
    }
    assert!(up, "the server did not report its DTLS address");

    let uri = format!("coaps://127.0.0.1:{dtls_port}/benchmark");
    let ok = cobalt()
        .args([
            "get",
            &uri,
            "--psk-identity",
            "alice",
            "--psk-key",
            "secretPSK",
        ])
        .output()
        .unwrap();
    assert!(ok.status.success(), "{ok:?}");
    assert_eq!(String::from_utf8_lossy(&ok.stdout), "hello world");

    let hex = cobalt()
        .args(["get", &uri, "--psk-identity", "bob"])
        .args(["--psk-key", "0x00112233445566778899aabbccddeeff"])
        .output()
        .unwrap();
    assert!(hex.status.success(), "{hex:?}");

    let wrong = cobalt()
        .args(["get", &uri, "--psk-identity", "alice", "--psk-key", "nope"])
        .output()
        .unwrap();
    assert!(!wrong.status.success());
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(err.contains("DTLS handshake"), "{err}");

    // Without credentials: the flags to use, not library calls.
    let nokey = cobalt().args(["get", &uri]).output().unwrap();
    assert_eq!(nokey.status.code(), Some(2));
    let err = String::from_utf8_lossy(&nokey.stderr);
    assert!(err.contains("--psk-identity ID --psk-key KEY"), "{err}");

    // Plain CoAP still on the UDP port.
    let plain = cobalt()
        .args(["get", &format!("coap://127.0.0.1:{port}/benchmark")])
        .output()
        .unwrap();
    assert!(plain.status.success(), "{plain:?}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_bad_key_file_is_a_usage_error() {
    let path = std::env::temp_dir().join(format!("cobalt-dtls-bad-{}.txt", std::process::id()));
    std::fs::write(&path, "alice:0xnothex\n").unwrap();
    let out = cobalt()
        .args(["serve", "--port", "0", "--dtls-psk-file"])
        .arg(&path)
        .output()
        .unwrap();
    std::fs::remove_file(&path).ok();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 1"), "{err}");
}

#[test]
fn serve_and_get_over_dtls_with_certificates() {
    let dir = std::env::temp_dir().join(format!("cobalt-dtls-x509-{}", std::process::id()));
    write_test_pki(&dir, "Cobalt CLI test CA");
    let (port, dtls_port) = (free_port(), free_port());
    let mut serve = cobalt();
    serve
        .args(["serve", "--bind", "127.0.0.1", "--shards", "1"])
        .args([
            "--port",
            &port.to_string(),
            "--dtls-port",
            &dtls_port.to_string(),
        ])
        .arg("--dtls-cert")
        .arg(dir.join("server.pem"))
        .arg("--dtls-key")
        .arg(dir.join("server.key"))
        .arg("--dtls-ca")
        .arg(dir.join("ca.pem"));
    let _server = serve_until(serve, "serving CoAP over DTLS on");
    let uri = format!("coaps://127.0.0.1:{dtls_port}/benchmark");
    let ok = cobalt()
        .args(["get", &uri, "--dtls-ca"])
        .arg(dir.join("ca.pem"))
        .arg("--dtls-cert")
        .arg(dir.join("client.pem"))
        .arg("--dtls-key")
        .arg(dir.join("client.key"))
        .output()
        .unwrap();
    assert!(ok.status.success(), "{ok:?}");
    assert_eq!(String::from_utf8_lossy(&ok.stdout), "hello world");
    // This server requires a client certificate.
    let anonymous = cobalt()
        .args(["get", &uri, "--dtls-ca"])
        .arg(dir.join("ca.pem"))
        .output()
        .unwrap();
    assert!(!anonymous.status.success());
    let err = String::from_utf8_lossy(&anonymous.stderr);
    assert!(err.contains("DTLS handshake"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

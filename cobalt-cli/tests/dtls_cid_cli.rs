//! `cobalt serve --cid` (the Mbed TLS backend with a DTLS Connection ID) and
//! `cobalt get coaps://... --cid`, through the real binary.
#![cfg(feature = "mbedtls")]

#[path = "common/binary.rs"]
mod binary;

use binary::{cobalt, serve_until};
use cobalt_test_support::ports::{free_udp_port, V4};
use cobalt_test_support::temp::TempDir;

#[test]
fn serve_with_a_cid_and_get_with_and_without_one() {
    let dir = TempDir::new("dtls-cid-cli");
    let keys = dir.write("keys.txt", "alice:secretPSK\n");
    let (port, dtls_port) = (free_udp_port(V4), free_udp_port(V4));
    let mut serve = cobalt();
    serve
        .args([
            "serve",
            "--bind",
            "127.0.0.1",
            "--shards",
            "2",
            "--cid",
            "6",
        ])
        .args(["--port", &port.to_string()])
        .args(["--dtls-port", &dtls_port.to_string(), "--dtls-psk-file"])
        .arg(&keys);
    let _server = serve_until(serve, "serving CoAP over DTLS on");
    let uri = format!("coaps://127.0.0.1:{dtls_port}/benchmark");
    let psk = ["--psk-identity", "alice", "--psk-key", "secretPSK"];
    for cid in [true, false] {
        let mut get = cobalt();
        get.args(["get", &uri]).args(psk);
        if cid {
            get.arg("--cid");
        }
        let out = get.output().unwrap();
        assert!(out.status.success(), "--cid {cid}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hello world");
    }
    let wrong = cobalt()
        .args([
            "get",
            &uri,
            "--cid",
            "--psk-identity",
            "alice",
            "--psk-key",
            "nope",
        ])
        .output()
        .unwrap();
    assert!(!wrong.status.success());
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(err.contains("DTLS handshake"), "{err}");
}

/// Certificates both ways on the Mbed TLS backend: `serve --cid` with `--dtls-ca`
/// requires a client certificate, which `get --cid` presents.
#[test]
fn serve_with_a_cid_and_client_certificates() {
    binary::assert_client_certificates_required(
        "Cobalt CID CLI test CA",
        &["--cid", "6"],
        &["--cid"],
    );
}

#[test]
fn a_cid_with_the_openssl_backend_is_refused() {
    let dir = TempDir::new("dtls-cid-openssl");
    let keys = dir.write("keys.txt", "alice:secretPSK\n");
    let out = cobalt()
        .args([
            "serve",
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--dtls-port",
            "0",
        ])
        .args(["--cid", "6", "--dtls-backend", "openssl", "--dtls-psk-file"])
        .arg(&keys)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("mbedtls"), "{err}");
}

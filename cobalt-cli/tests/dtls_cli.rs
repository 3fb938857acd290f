//! `cobalt serve --dtls-psk-file` and `cobalt get coaps://... --psk-identity --psk-key`,
//! through the real binary.
#![cfg(feature = "openssl")]

#[path = "common/binary.rs"]
mod binary;

use binary::{cobalt, metric, serve_until};
use cobalt_test_support::ports::{free_udp_port, V4};
use cobalt_test_support::temp::TempDir;

#[test]
fn serve_and_get_over_dtls_with_a_key_file() {
    let dir = TempDir::new("dtls-cli");
    let keys = dir.write(
        "keys.txt",
        "# test keys\nalice:secretPSK\nbob:0x00112233445566778899aabbccddeeff\n",
    );
    let (port, dtls_port) = (free_udp_port(V4), free_udp_port(V4));
    let mut serve = cobalt();
    serve
        .args(["serve", "--bind", "127.0.0.1", "--shards", "1"])
        .args(["--port", &port.to_string()])
        .args(["--dtls-port", &dtls_port.to_string(), "--dtls-psk-file"])
        .arg(&keys);
    let _server = serve_until(serve, "serving CoAP over DTLS on");

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
}

#[test]
fn a_bad_key_file_is_a_usage_error() {
    let dir = TempDir::new("dtls-bad");
    let path = dir.write("keys.txt", "alice:0xnothex\n");
    let out = cobalt()
        .args(["serve", "--port", "0", "--dtls-psk-file"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 1"), "{err}");
}

#[test]
fn serve_and_get_over_dtls_with_certificates() {
    // This server requires a client certificate.
    binary::assert_client_certificates_required("Cobalt CLI test CA", &["--shards", "1"], &[]);
}

/// Issue 28 item 4: each `cobalt get coaps://...` ends its DTLS session (close_notify)
/// before it exits, so that runs in a row leave no session on the server until its
/// idle timeout (an hour by default).
#[test]
fn get_over_dtls_leaves_no_session_on_the_server() {
    let dir = TempDir::new("dtls-cli-close");
    let keys = dir.write("keys.txt", "alice:secretPSK\n");
    let mut serve = binary::local_serve();
    serve
        .args(["--dtls-port", "0", "--dtls-psk-file"])
        .arg(&keys)
        .args(["--metrics", "127.0.0.1:0"]);
    let (_server, found) = binary::serve_printing(
        serve,
        &[
            "cobalt: serving CoAP over DTLS on ",
            "cobalt: metrics on http://",
        ],
    );
    let metrics = found[1].trim_end_matches("/metrics").to_string();
    let uri = format!("coaps://{}/benchmark", found[0]);
    let runs = 10;
    for _ in 0..runs {
        let ok = cobalt()
            .args(["get", &uri, "--psk-identity", "alice"])
            .args(["--psk-key", "secretPSK"])
            .output()
            .unwrap();
        assert!(ok.status.success(), "{ok:?}");
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while metric(&metrics, "cobalt_dtls_sessions") != 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} DTLS sessions left on the server",
            metric(&metrics, "cobalt_dtls_sessions")
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let handshakes = metric(&metrics, "cobalt_dtls_handshakes_total");
    assert_eq!(handshakes, f64::from(runs), "one session per run");
}

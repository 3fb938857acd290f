//! `cobalt serve --cert --key --tls --ws` and `cobalt get coaps+tcp://...` /
//! `coaps+ws://...` through the real binary.
#![cfg(feature = "openssl")]

use std::process::Output;

#[path = "common/binary.rs"]
mod binary;

use binary::{cobalt, serve_until};
use cobalt_test_support::pki::PkiFiles;
use cobalt_test_support::ports::{free_tcp_port, free_udp_port, V4};
use cobalt_test_support::psk;
use cobalt_test_support::temp::TempDir;

fn get(uri: &str, ca: &str) -> Output {
    cobalt()
        .args(["get", uri, "--ca"])
        .arg(ca)
        .output()
        .unwrap()
}

#[test]
fn serve_and_get_over_tls_and_secure_websockets() {
    let pki = PkiFiles::new("Cobalt TLS CLI CA");
    let other = PkiFiles::new("Another CA");
    let (tls, ws, wss) = (free_tcp_port(V4), free_tcp_port(V4), free_tcp_port(V4));
    let mut serve = cobalt();
    serve
        .args(["serve", "--bind", "127.0.0.1", "--shards", "1"])
        .args(["--port", &free_udp_port(V4).to_string()])
        .args(["--dtls-port", &free_udp_port(V4).to_string()])
        .arg("--cert")
        .arg(pki.path("server.pem"))
        .arg("--key")
        .arg(pki.path("server.key"))
        .args(["--tls", &tls.to_string()])
        .args(["--ws-port", &ws.to_string(), "--wss-port", &wss.to_string()]);
    let _server = serve_until(serve, "serving CoAP over secure WebSockets on");

    let ca = pki.path("ca.pem");
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
        &other.path("ca.pem"),
    );
    assert_eq!(untrusted.status.code(), Some(3), "{untrusted:?}");
    let err = String::from_utf8_lossy(&untrusted.stderr);
    assert!(err.contains("TLS handshake"), "{err}");
    assert!(err.contains("trusted CA"), "{err}");
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

/// The mistakes a user makes with TLS get the hint DTLS gives: a wrong PSK says the
/// keys differ, TLS to a plain port and plain TCP to a TLS port say which is which.
#[test]
fn tls_mistakes_name_the_fix() {
    let dir = TempDir::new("tls-mistakes");
    let keys = psk::keys_file(&dir);
    let mut serve = binary::local_serve();
    serve
        .args([
            "--tcp",
            "0",
            "--tls",
            "0",
            "--dtls-port",
            "0",
            "--dtls-psk-file",
        ])
        .arg(&keys);
    let (_server, at) = binary::serve_printing(
        serve,
        &[
            "cobalt: serving CoAP over TCP on ",
            "cobalt: serving CoAP over TLS on ",
        ],
    );
    let (tcp, tls) = (&at[0], &at[1]);
    let run = |uri: String, key: &str| {
        let out = cobalt()
            .args(["get", &uri, "--psk-identity", "alice", "--psk-key", key])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3), "{uri}: {out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let wrong = run(format!("coaps+tcp://{tls}/benchmark"), "not-the-key");
    assert!(
        wrong.contains("TLS handshake") && wrong.contains("the keys differ: wrong PSK?"),
        "{wrong}"
    );
    let plain_port = run(format!("coaps+tcp://{tcp}/benchmark"), "secretPSK");
    assert!(
        plain_port.contains("does not speak TLS on this port"),
        "{plain_port}"
    );
    let out = cobalt()
        .args(["get", &format!("coap+tcp://{tls}/benchmark")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is it a TLS port? then use coaps+tcp://"),
        "{err}"
    );
}

//! The exit-code table (`cobalt --help`, README) through the real binary: `bench`
//! counts only 2.xx answers as completed and fails a run in which nothing completed,
//! with the code of what it got instead.

use cobalt::proto::message::{decode, encode, Code, Message, MessageType};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[path = "common/binary.rs"]
mod binary;

use binary::cobalt;

/// A UDP server answering every request with `code`, piggybacked, until `stop`.
fn answering(code: Code, stop: Arc<AtomicBool>) -> SocketAddr {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while !stop.load(Ordering::Relaxed) {
            let Ok((n, from)) = sock.recv_from(&mut buf) else {
                continue;
            };
            let Ok(req) = decode(&buf[..n]) else {
                continue;
            };
            let mut resp = Message::new(MessageType::Acknowledgement, code, req.mid);
            resp.token = req.token;
            let _ = sock.send_to(&encode(&resp), from);
        }
    });
    addr
}

/// `cobalt bench URI` for a short step, with `extra` flags.
fn bench(uri: &str, extra: &[&str]) -> std::process::Output {
    cobalt()
        .args(["bench", uri, "-c", "2", "-d", "0.5", "--warmup", "0"])
        .args(["--timeout", "0.3", "-q"])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn bench_of_a_refusing_server_fails_with_its_code() {
    let stop = Arc::new(AtomicBool::new(false));
    let addr = answering(Code::SERVICE_UNAVAILABLE, stop.clone());
    let uri = format!("coap://{addr}/benchmark");
    let out = bench(&uri, &["--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    assert!(
        err.contains("warning") && err.contains("5.03") && err.contains("no request completed"),
        "{err}"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let step = &report["steps"][0];
    assert_eq!(step["completed"], 0, "{report}");
    assert!(step["non_2xx"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(step["non_2xx_codes"]["5.03"], step["non_2xx"], "{report}");

    // The table lists the codes too, and 4.xx answers exit 4.
    let addr = answering(Code::NOT_FOUND, stop.clone());
    let out = bench(&format!("coap://{addr}/nothing"), &[]);
    stop.store(true, Ordering::Relaxed);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("non-2xx") && table.contains("[4.04: "),
        "{table}"
    );
}

#[test]
fn bench_with_no_answer_at_all_exits_3() {
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let uri = format!("coap://{}/benchmark", silent.local_addr().unwrap());
    let out = bench(&uri, &[]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no request completed"), "{err}");
}

/// A second server on a port another one serves is refused, for UDP and DTLS, however
/// many shards share the port (SO_REUSEPORT would otherwise let it take half the peers).
#[cfg(feature = "openssl")]
#[test]
fn serve_refuses_a_port_another_server_serves() {
    use binary::{local_serve_shards, serve_printing};
    use cobalt_test_support::psk;
    use cobalt_test_support::temp::TempDir;
    let dir = TempDir::new("port-in-use");
    let keys = psk::keys_file(&dir);
    let mut first = local_serve_shards(2);
    first
        .args(["--dtls-port", "0", "--dtls-psk-file"])
        .arg(&keys);
    let (_first, at) = serve_printing(
        first,
        &[
            "cobalt: serving CoAP on ",
            "cobalt: serving CoAP over DTLS on ",
        ],
    );
    let port = |a: &str| a.rsplit(':').next().unwrap().to_string();
    for (udp, dtls) in [(port(&at[0]), "0".to_string()), ("0".into(), port(&at[1]))] {
        let second = cobalt()
            .args(["serve", "--bind", "127.0.0.1", "--shards", "2"])
            .args(["--port", &udp, "--dtls-port", &dtls, "--dtls-psk-file"])
            .arg(&keys)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&second.stderr);
        assert_eq!(
            second.status.code(),
            Some(1),
            "udp {udp}, dtls {dtls}: {err}"
        );
        assert!(err.contains("in use"), "{err}");
    }
}

/// A request to a port where nothing listens fails at once with "port not open" (the
/// kernel's ICMP error), exit code 3, not after the 30 s timeout.
#[test]
fn get_to_a_closed_port_says_port_not_open() {
    let closed = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let out = cobalt()
        .args(["get", &format!("coap://{closed}/x"), "--timeout", "60"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("port not open"), "{err}");
}

/// A build without the `openssl` feature refuses `coaps://` with a usage error that
/// says how to get DTLS, instead of failing obscurely.
#[cfg(not(feature = "openssl"))]
#[test]
fn coaps_without_openssl_says_which_feature_is_missing() {
    let out = cobalt()
        .args(["get", "coaps://127.0.0.1:9/x", "--psk-identity", "a"])
        .args(["--psk-key", "b"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`openssl` feature"), "{err}");
}

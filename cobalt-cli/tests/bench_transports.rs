//! `cobalt bench` over coap+tcp://, coap+ws://, coaps:// (PSK) and coaps+tcp:// /
//! coaps+ws:// (TLS with the same PSK) against a real `cobalt serve --tcp --ws --tls
//! --dtls-psk-file`, through the binary, checking the JSON report; and a wrong PSK,
//! which must fail with the reason.
#![cfg(feature = "openssl")]

use std::io::{BufRead, BufReader};
use std::process::Stdio;

#[path = "common/binary.rs"]
mod binary;

use binary::{cobalt, ChildGuard};
use cobalt_test_support::psk;
use cobalt_test_support::temp::TempDir;

/// The server's addresses, as it prints them.
struct Addresses {
    tcp: String,
    dtls: String,
    ws: String,
    tls: String,
    wss: String,
}

fn start_server(keys: &std::path::Path) -> (ChildGuard, Addresses) {
    let mut child = cobalt()
        .arg("serve")
        .args(["--bind", "127.0.0.1", "--shards", "1", "--port", "0"])
        .args(["--tcp", "0", "--ws-port", "0", "--dtls-port", "0"])
        .args(["--tls", "0", "--wss-port", "0"])
        .arg("--dtls-psk-file")
        .arg(keys)
        .args(["--log-level", "warn"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let server = ChildGuard::new(child);
    let (mut tcp, mut dtls, mut ws, mut tls, mut wss) = (None, None, None, None, None);
    let mut lines = BufReader::new(stderr).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let line = line.trim();
        if let Some(a) = line.strip_prefix("cobalt: serving CoAP over TCP on ") {
            tcp = Some(a.to_string());
        } else if let Some(a) = line.strip_prefix("cobalt: serving CoAP over DTLS on ") {
            dtls = Some(a.to_string());
        } else if let Some(a) = line.strip_prefix("cobalt: serving CoAP over WebSockets on ws://") {
            ws = a.strip_suffix("/.well-known/coap").map(str::to_string);
        } else if let Some(a) = line.strip_prefix("cobalt: serving CoAP over TLS on ") {
            tls = Some(a.to_string());
        } else if let Some(a) =
            line.strip_prefix("cobalt: serving CoAP over secure WebSockets on wss://")
        {
            wss = a.strip_suffix("/.well-known/coap").map(str::to_string);
        }
        if tcp.is_some() && dtls.is_some() && ws.is_some() && tls.is_some() && wss.is_some() {
            break;
        }
    }
    // Keep reading, so that a chatty server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    let addresses = Addresses {
        tcp: tcp.expect("the server prints its TCP address"),
        dtls: dtls.expect("the server prints its DTLS address"),
        ws: ws.expect("the server prints its WebSocket address"),
        tls: tls.expect("the server prints its TLS address"),
        wss: wss.expect("the server prints its secure WebSocket address"),
    };
    (server, addresses)
}

/// Runs a one-second `cobalt bench --json` step; returns the parsed report.
fn bench(uri: &str, extra: &[&str]) -> serde_json::Value {
    let out = cobalt()
        .args([
            "bench", uri, "-c", "3", "-d", "1", "--warmup", "0.2", "--json", "-q",
        ])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{uri} {extra:?}: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{uri}: {e}: {out:?}"))
}

fn check(report: &serde_json::Value, scheme: &str, new_session: bool) {
    assert_eq!(report["scheme"], scheme, "{report}");
    assert_eq!(report["new_session"], new_session, "{report}");
    assert_eq!(report["interrupted"], false, "{report}");
    let step = &report["steps"][0];
    assert_eq!(step["clients"], 3, "{report}");
    assert!(step["completed"].as_u64().unwrap() > 0, "{report}");
    assert!(step["requests_per_s"].as_f64().unwrap() > 0.0, "{report}");
    for zero in ["lost", "errors", "resets", "non_2xx"] {
        assert_eq!(step[zero], 0, "{zero}: {report}");
    }
    let (p50, p99) = (
        step["p50_us"].as_f64().unwrap(),
        step["p99_us"].as_f64().unwrap(),
    );
    assert!(p50 > 0.0 && p50 <= p99, "{report}");
}

#[test]
fn bench_over_tcp_websockets_dtls_and_tls() {
    let dir = TempDir::new("bench-transports");
    let keys = psk::keys_file(&dir);
    let (_server, at) = start_server(&keys);
    let psk = ["--psk-identity", "alice", "--psk-key", "secretPSK"];

    let tcp = format!("coap+tcp://{}/benchmark", at.tcp);
    check(&bench(&tcp, &[]), "coap+tcp", false);
    check(&bench(&tcp, &["--new-session"]), "coap+tcp", true);
    let ws = format!("coap+ws://{}/benchmark", at.ws);
    check(&bench(&ws, &[]), "coap+ws", false);
    let coaps = format!("coaps://{}/benchmark", at.dtls);
    check(&bench(&coaps, &psk), "coaps", false);
    let handshakes = bench(&coaps, &[&psk[..], &["--new-session"]].concat());
    check(&handshakes, "coaps", true);
    let tls = format!("coaps+tcp://{}/benchmark", at.tls);
    check(&bench(&tls, &psk), "coaps+tcp", false);
    check(
        &bench(&tls, &[&psk[..], &["--new-session"]].concat()),
        "coaps+tcp",
        true,
    );
    let wss = format!("coaps+ws://{}/benchmark", at.wss);
    check(&bench(&wss, &psk), "coaps+ws", false);

    // A wrong key: the reason, and one exit-code table — a failed handshake is 3 for
    // `bench` as for `get`, over DTLS and TLS.
    let wrong_key = ["--psk-identity", "alice", "--psk-key", "not-the-key"];
    let wrong_bench = |uri: &str| {
        cobalt()
            .args(["bench", uri, "-c", "2", "-d", "1", "-q"])
            .args(wrong_key)
            .output()
            .unwrap()
    };
    let wrong = wrong_bench(&coaps);
    assert_eq!(wrong.status.code(), Some(3), "{wrong:?}");
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        err.contains("DTLS handshake") && err.contains("wrong PSK"),
        "{err}"
    );
    let tls_wrong = wrong_bench(&tls);
    assert_eq!(tls_wrong.status.code(), Some(3), "{tls_wrong:?}");
    let get = cobalt()
        .args(["get", &coaps])
        .args(wrong_key)
        .output()
        .unwrap();
    assert_eq!(get.status.code(), Some(3), "{get:?}");
}

/// A hundred clients from one address set up their sessions within the server's
/// default budget of 32 handshakes in flight per address: the bench paces them.
#[test]
fn a_hundred_sessions_from_one_address_fit_the_default_handshake_budget() {
    let dir = TempDir::new("bench-handshake-budget");
    let keys = psk::keys_file(&dir);
    let (_server, at) = start_server(&keys);
    let psk = ["--psk-identity", psk::IDENTITY, "--psk-key", psk::KEY];
    for (uri, extra) in [
        (format!("coaps://{}/benchmark", at.dtls), &psk[..]),
        (format!("coap+ws://{}/benchmark", at.ws), &[][..]),
    ] {
        let out = cobalt()
            .args(["bench", &uri, "-c", "100", "-d", "1", "--warmup", "0.2"])
            .args(["--json", "-q"])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{uri}: {out:?}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let step = &report["steps"][0];
        assert_eq!(step["clients"], 100, "{report}");
        assert!(step["completed"].as_u64().unwrap() > 0, "{report}");
        assert_eq!(step["errors"], 0, "{report}");
    }
}

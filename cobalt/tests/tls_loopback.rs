//! CoAP over TLS (`coaps+tcp://`) and secure WebSockets (`coaps+ws://`) between a
//! Cobalt server and client on loopback: certificates, client certificates, PSK, and
//! the failures a user must see clearly (untrusted, expired, wrong key), plus peers
//! that do not speak TLS or never finish the handshake.
#![cfg(feature = "openssl")]

mod common;

use cobalt::server::{get, post, Observable, Request};
use cobalt::transport::credentials::{PskStore, X509Credentials};
use cobalt::transport::limits::TcpServerLimits;
use cobalt::transport::tls::{negotiated, Alpn, TlsConnector};
use cobalt::Scheme;
use cobalt::{Client, Code, Error, Server, ServerHandle};
use common::TestCredentials;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn resources() -> Server {
    Server::new()
        .route("/hello", get(|| async { "hello over tls" }))
        .route("/big", get(|| async { "x".repeat(300_000) }))
        .route(
            "/echo",
            post(|req: Request| async move { (Code::CHANGED, req.payload().to_vec()) }),
        )
}

/// Server credentials without a CA: client certificates are not asked for.
fn server_only(pki: &TestCredentials) -> X509Credentials {
    X509Credentials {
        ca_pem: None,
        ..pki.server.clone()
    }
}

/// Client credentials that verify the server and present no certificate.
fn verify_only(pki: &TestCredentials) -> X509Credentials {
    X509Credentials {
        ca_pem: Some(pki.ca_pem.clone()),
        ..X509Credentials::default()
    }
}

/// `server`'s resources over UDP, and over TLS and secure WebSockets with
/// certificate-only credentials from `pki`.
async fn over_tls_and_wss(server: Server, pki: &TestCredentials) -> ServerHandle {
    let any = "127.0.0.1:0";
    server
        .x509(server_only(pki))
        .listen(Scheme::CoapsTcp, any)
        .listen(Scheme::CoapsWs, any)
        .shards(1)
        .bind(any)
        .await
        .unwrap()
}

fn handshake_failures(server: &cobalt::server::ServerHandle, transport: &str) -> u64 {
    let text = server.metrics().render_prometheus();
    let key = format!("cobalt_connections_handshake_failures_total{{transport=\"{transport}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in\n{text}"))
}

/// Waits (up to 10 s) until the server has counted at least `n` failed handshakes on
/// `transport`: it counts a failure when its side of the handshake ends, which may be
/// after the client has seen its error.
async fn handshake_failures_reach(server: &cobalt::server::ServerHandle, transport: &str, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = handshake_failures(server, transport);
        if now >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{now} handshake failures counted on {transport}, expected {n}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_verified_request_over_tls_and_wss() {
    let pki = TestCredentials::generate("tls loopback");
    let server = over_tls_and_wss(resources(), &pki).await;
    let tls = server.local_addr(Scheme::CoapsTcp).unwrap();
    let wss = server.local_addr(Scheme::CoapsWs).unwrap();
    let client = Client::new().with_x509(verify_only(&pki));
    for uri in [
        format!("coaps+tcp://{tls}"),
        format!("coaps+ws://{wss}"),
        // The certificate names localhost too.
        format!("coaps+tcp://localhost:{}", tls.port()),
    ] {
        let r = client.get(&format!("{uri}/hello")).await.unwrap();
        assert_eq!(
            (r.code, r.text_payload().as_str()),
            (Code::CONTENT, "hello over tls")
        );
        let body: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let echoed = client
            .post(&format!("{uri}/echo"), body.clone())
            .await
            .unwrap();
        assert_eq!(echoed.payload, body, "{uri}");
        let big = client.get(&format!("{uri}/big")).await.unwrap();
        assert_eq!(big.payload.len(), 300_000, "{uri}");
    }
    assert_eq!(handshake_failures(&server, "tls"), 0);
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_over_tls_and_wss() {
    let pki = TestCredentials::generate("tls observe");
    let state = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let temp = Observable::new();
    let read = state.clone();
    let resources = Server::new().route(
        "/temp",
        get(move || {
            let v = read.load(std::sync::atomic::Ordering::SeqCst);
            async move { format!("t={v}") }
        })
        .observable(&temp),
    );
    let server = over_tls_and_wss(resources, &pki).await;
    let client = Client::new().with_x509(verify_only(&pki));
    for (uri, label) in [
        (
            format!(
                "coaps+tcp://{}/temp",
                server.local_addr(Scheme::CoapsTcp).unwrap()
            ),
            "tls",
        ),
        (
            format!(
                "coaps+ws://{}/temp",
                server.local_addr(Scheme::CoapsWs).unwrap()
            ),
            "wss",
        ),
    ] {
        let mut obs = client.observe(&uri).await.unwrap();
        let first = obs.next().await.unwrap().unwrap();
        assert!(first.text_payload().starts_with("t="), "{uri}");
        assert_eq!(temp.observer_count(), 1, "{uri}");
        let metrics = server.metrics().render_prometheus();
        let gauge = format!("cobalt_connection_observers{{transport=\"{label}\"}} 1");
        assert!(metrics.contains(&gauge), "{gauge} not in\n{metrics}");
        let n = state.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        temp.changed();
        let next = obs.next().await.unwrap().unwrap();
        assert_eq!(next.text_payload(), format!("t={n}"), "{uri}");
        obs.cancel().await.unwrap();
        for _ in 0..200 {
            if temp.observer_count() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(temp.observer_count(), 0, "{uri}: cancel ends the relation");
    }
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alpn_coap_is_negotiated() {
    let pki = TestCredentials::generate("alpn");
    let server = resources()
        .x509(server_only(&pki))
        .listen(Scheme::CoapsTcp, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::CoapsTcp).unwrap();
    let auth = cobalt::transport::credentials::ClientCredentials::X509(verify_only(&pki));
    let connector = TlsConnector::new(Some(&auth), Alpn::Coap).unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = connector.connect(tcp, "127.0.0.1", addr).await.unwrap();
    let (cipher, alpn) = negotiated(&tls);
    assert_eq!(alpn.as_deref(), Some(&b"coap"[..]));
    assert!(
        cipher.is_some_and(|c| c.contains("GCM") || c.contains("CHACHA")),
        "{cipher:?}"
    );
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_required_when_the_server_has_a_ca() {
    let pki = TestCredentials::generate("mutual");
    let server = resources()
        .x509(pki.server.clone())
        .listen(Scheme::CoapsTcp, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let uri = format!(
        "coaps+tcp://{}/hello",
        server.local_addr(Scheme::CoapsTcp).unwrap()
    );
    let r = Client::new()
        .with_x509(pki.client.clone())
        .get(&uri)
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "hello over tls");
    // Without a client certificate the server ends the handshake.
    let err = Client::new()
        .with_x509(verify_only(&pki))
        .get(&uri)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Tls { .. } | Error::Connection(_)),
        "expected a TLS failure, got {err:?}"
    );
    handshake_failures_reach(&server, "tls", 1).await;
    server.shutdown(Duration::ZERO).await;
}

/// The reason of the TLS error a client with `client` credentials gets from a server
/// with `server` credentials.
async fn tls_failure(server: X509Credentials, client: X509Credentials) -> String {
    let server = resources()
        .x509(server)
        .listen(Scheme::CoapsTcp, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let uri = format!(
        "coaps+tcp://{}/hello",
        server.local_addr(Scheme::CoapsTcp).unwrap()
    );
    let err = Client::new().with_x509(client).get(&uri).await.unwrap_err();
    server.shutdown(Duration::ZERO).await;
    let text = err.to_string();
    let Error::Tls { reason, .. } = err else {
        panic!("expected a TLS error, got {err:?}");
    };
    assert!(text.starts_with("TLS handshake with 127.0.0.1:"), "{text}");
    reason
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_expired_and_misnamed_certificates_are_clear_errors() {
    let pki = TestCredentials::generate("real");
    let other = TestCredentials::generate("other");
    let expired = TestCredentials::generate_expired("old");
    let untrusted = tls_failure(server_only(&pki), verify_only(&other)).await;
    assert!(
        untrusted.contains("certificate verify failed"),
        "{untrusted}"
    );
    assert!(
        untrusted.contains("does not chain to a trusted CA"),
        "{untrusted}"
    );
    assert!(
        untrusted.contains("unable to get local issuer"),
        "{untrusted}"
    );
    let old = tls_failure(server_only(&expired), verify_only(&expired)).await;
    assert!(old.contains("certificate has expired"), "{old}");
    // The certificate names localhost, 127.0.0.1 and ::1, not the name asked for.
    let named = X509Credentials {
        server_name: Some("coap.example.org".into()),
        ..verify_only(&pki)
    };
    let misnamed = tls_failure(server_only(&pki), named).await;
    assert!(misnamed.contains("mismatch"), "{misnamed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_shared_keys_over_tls() {
    let keys = PskStore::new().with("alice", "secretPSK");
    let server = resources()
        .psk(keys)
        .listen(Scheme::CoapsTcp, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let uri = format!(
        "coaps+tcp://{}/hello",
        server.local_addr(Scheme::CoapsTcp).unwrap()
    );
    let r = Client::new()
        .with_psk("alice", "secretPSK")
        .get(&uri)
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "hello over tls");
    for (id, key) in [("alice", "wrong"), ("mallory", "secretPSK")] {
        let err = Client::new().with_psk(id, key).get(&uri).await.unwrap_err();
        assert!(matches!(err, Error::Tls { .. }), "{id}: {err:?}");
    }
    // A certificate-only client gets no answer from a PSK-only server.
    let pki = TestCredentials::generate("psk");
    let err = Client::new()
        .with_x509(verify_only(&pki))
        .get(&uri)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    handshake_failures_reach(&server, "tls", 3).await;
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_that_do_not_finish_the_handshake_are_closed() {
    let pki = TestCredentials::generate("slow");
    let limits = TcpServerLimits {
        handshake_timeout: Duration::from_millis(300),
        ..TcpServerLimits::default()
    };
    let server = resources()
        .x509(server_only(&pki))
        .tcp_limits(limits)
        .listen(Scheme::CoapsTcp, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::CoapsTcp).unwrap();
    // Silent: connects and sends nothing; the server closes it.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(20), silent.read(&mut buf))
        .await
        .expect("the server keeps a silent connection open")
        .unwrap_or(0);
    assert_eq!(n, 0, "the server wrote to a peer that sent nothing");
    // Plain CoAP bytes on the TLS port: refused, counted.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"\x00\xe1\x30\x01coap not tls")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), plain.read_to_end(&mut rest)).await;
    handshake_failures_reach(&server, "tls", 1).await;
    let timeouts = "cobalt_connections_timeouts_total{transport=\"tls\"} 1";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !server.metrics().render_prometheus().contains(timeouts) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            server.metrics().render_prometheus()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // And it still serves others.
    let client = Client::new().with_x509(verify_only(&pki));
    let r = client
        .get(&format!("coaps+tcp://{addr}/hello"))
        .await
        .unwrap();
    assert_eq!(r.code, Code::CONTENT);
    server.shutdown(Duration::ZERO).await;
}

//! CoAP over DTLS on the Mbed TLS backend (the one with the DTLS Connection ID, RFC
//! 9146) against real peers: libcoap's `coap-client-openssl` (4.3.1: no CID, so a
//! plain PSK session with a server that offers one), the Cobalt client asking
//! `coap-server-openssl` for a CID it does not grant, and Californium's Scandium
//! client with a CID through a loopback "NAT" that gives it a new source port after
//! each pause (`tests/peers/californium`, `CidClient`).

use crate::{fetch, gets_posts_and_gets_big, our_server, run, start_on, Tool};
use cobalt::transport::credentials::PskStore;
use cobalt::transport::dtls::{DtlsBackendKind, DtlsConfig};
use cobalt::{Client, Code, Scheme, Server};
use cobalt_test_support::need;
use cobalt_test_support::peers::libcoap::{self, Port, CLIENT_OPENSSL, SERVER_OPENSSL};
use cobalt_test_support::ports::V4;
use cobalt_test_support::psk::{IDENTITY, KEY};
use std::time::Duration;

/// The Mbed TLS backend granting 6-byte CIDs that start with node id `c0ba`.
pub(crate) fn with_cid() -> DtlsConfig {
    DtlsConfig {
        backend: DtlsBackendKind::Mbedtls,
        cid_len: 6,
        cid_node_id: "c0ba".into(),
        ..DtlsConfig::default()
    }
}

fn mbedtls_server(hello: &'static str, config: DtlsConfig) -> Server {
    our_server(hello)
        .psk(PskStore::new().with(IDENTITY, KEY))
        .dtls_config(config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_against_our_mbedtls_server_with_and_without_a_cid() {
    let client = need!(CLIENT_OPENSSL, libcoap::tool(CLIENT_OPENSSL));
    let plain = DtlsConfig {
        backend: DtlsBackendKind::Mbedtls,
        ..DtlsConfig::default()
    };
    for config in [plain, with_cid()] {
        let (server, base) =
            start_on(mbedtls_server("hello over mbedtls", config), Scheme::Coaps).await;
        let psk = ["-u", IDENTITY, "-k", KEY];
        gets_posts_and_gets_big(Tool::Libcoap, &client, &psk, &base, "hello over mbedtls").await;
        // The wrong key gets nothing.
        let uri = format!("{base}/hello");
        let out = run(&client, &["-u", IDENTITY, "-k", "wrong", "-B", "5", &uri]).await;
        assert!(!out.stdout.contains("hello over mbedtls"), "{out}");
        server.shutdown(Duration::ZERO).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_cid_client_against_libcoap_server_that_grants_none() {
    let program = need!(SERVER_OPENSSL, libcoap::tool(SERVER_OPENSSL));
    let args = ["-k", KEY, "-h", IDENTITY];
    let server = libcoap::server(&program, V4, &args, Port::Coaps, None);
    let client = Client::new()
        .with_dtls_cid()
        .unwrap()
        .with_psk(IDENTITY, KEY);
    let r = fetch(&client, &server.scheme_uri("coaps", "/")).await;
    assert_eq!(r.code, Code::CONTENT);
    assert!(r.text_payload().contains("libcoap"), "{}", r.text_payload());
}

/// A loopback "NAT" in front of a server: the client sends to [`Nat::front`]; the
/// NAT forwards from an upstream socket of its own, and takes a new one (a new
/// source port towards the server) when the client speaks after a pause of
/// `idle`, as a NAT does whose mapping expired.
struct Nat {
    front: std::net::SocketAddr,
    rebinds: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Nat {
    fn new(server: std::net::SocketAddr, idle: Duration) -> Nat {
        use std::net::UdpSocket;
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Arc;
        use std::time::Instant;
        let front = UdpSocket::bind("127.0.0.1:0").unwrap();
        front.set_nonblocking(true).unwrap();
        let addr = front.local_addr().unwrap();
        let rebinds = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (counted, stopped) = (rebinds.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let fresh = || {
                let s = UdpSocket::bind("127.0.0.1:0").unwrap();
                s.set_nonblocking(true).unwrap();
                s
            };
            let mut upstream = fresh();
            let mut client = None;
            let mut last_from_client: Option<Instant> = None;
            let mut buf = [0u8; 2048];
            while !stopped.load(Ordering::Relaxed) {
                let mut busy = false;
                if let Ok((n, from)) = front.recv_from(&mut buf) {
                    busy = true;
                    if last_from_client.is_some_and(|t| t.elapsed() >= idle) {
                        upstream = fresh();
                        counted.fetch_add(1, Ordering::SeqCst);
                    }
                    last_from_client = Some(Instant::now());
                    client = Some(from);
                    let _ = upstream.send_to(&buf[..n], server);
                }
                if let Ok((n, _)) = upstream.recv_from(&mut buf) {
                    busy = true;
                    if let Some(c) = client {
                        let _ = front.send_to(&buf[..n], c);
                    }
                }
                if !busy {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        Nat {
            front: addr,
            rebinds,
            stop,
            thread: Some(thread),
        }
    }

    fn rebinds(&self) -> usize {
        self.rebinds.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Nat {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scandium_cid_client_keeps_its_session_through_a_rebinding_nat() {
    let Some(cf) = cobalt_test_support::peers::californium::need() else {
        return;
    };
    let (server, _) = start_on(
        mbedtls_server("hello with a cid", with_cid()),
        Scheme::Coaps,
    )
    .await;
    let nat = Nat::new(
        server.local_addr(Scheme::Coaps).unwrap(),
        Duration::from_millis(300),
    );
    let uri = format!("coaps://{}/hello", nat.front);
    let lines = tokio::task::spawn_blocking(move || {
        cf.run_program("CidClient", &[&uri, IDENTITY, KEY, "3", "700"])
    })
    .await
    .unwrap();
    let answered = lines
        .iter()
        .filter(|l| l.starts_with("RESPONSE") && l.contains("payload=hello with a cid"))
        .count();
    assert_eq!(answered, 3, "{lines:?}");
    assert!(lines.iter().any(|l| l == "DONE ok=3"), "{lines:?}");
    assert_eq!(nat.rebinds(), 2, "the NAT gave the client two new ports");
    let totals = server.metrics().total();
    assert_eq!(totals.dtls_handshakes, 1, "one handshake for three ports");
    assert_eq!(totals.dtls_address_updates, 2);
    server.shutdown(Duration::ZERO).await;
}

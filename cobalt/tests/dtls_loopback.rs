//! CoAP over DTLS (`coaps://`) between a Cobalt server and client on loopback.
#![cfg(feature = "openssl")]

mod common;
mod stream;

use cobalt::server::{get, post, Request};
use cobalt::transport::credentials::PskStore;
use cobalt::transport::dtls::DtlsConfig;
use cobalt::Scheme;
use cobalt::{Client, Code, Error, Server};
use std::time::{Duration, Instant};

fn keys() -> PskStore {
    PskStore::new().with("alice", "secretPSK").with(
        "bob",
        vec![0u8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
    )
}

fn server() -> Server {
    Server::new()
        .route("/hello", get(|| async { "hello over dtls" }))
        .route("/big", get(|| async { "x".repeat(3000) }))
        .route(
            "/echo",
            post(|req: Request| async move { (Code::CHANGED, req.payload().to_vec()) }),
        )
        .psk(keys())
        .shards(2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psk_request_over_dtls() {
    let server = server()
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::Coaps).unwrap();
    assert_eq!(server.local_addr(Scheme::Coaps), Some(addr));
    let client = Client::new().with_psk("alice", "secretPSK");
    let r = client.get(&format!("coaps://{addr}/hello")).await.unwrap();
    assert_eq!(r.code, Code::CONTENT);
    assert_eq!(r.text_payload(), "hello over dtls");
    // The session is reused; block-wise and uploads work over it.
    let big = client.get(&format!("coaps://{addr}/big")).await.unwrap();
    assert_eq!(big.payload.len(), 3000);
    let body = vec![7u8; 2500];
    let echoed = client
        .post(&format!("coaps://{addr}/echo"), body.clone())
        .await
        .unwrap();
    assert_eq!(echoed.payload, body);
    // A binary key given per request.
    let r = Client::new()
        .request(Code::GET, &format!("coaps://{addr}/hello"))
        .psk("bob", (0u8..16).collect::<Vec<_>>())
        .send()
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "hello over dtls");
    server.shutdown(Duration::ZERO).await;
}

/// The client ends what it opened (issue 28 item 4): 20 client lifetimes of one
/// request each leave no DTLS session on the server, long before its idle timeout —
/// `Client::close` sends close_notify at once (the client stays usable), and so does
/// dropping the last clone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_lifetimes_leave_no_dtls_session_on_the_server() {
    let server = server()
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let uri = format!(
        "coaps://{}/hello",
        server.local_addr(Scheme::Coaps).unwrap()
    );
    let dtls = {
        let m = server.metrics();
        move || m.total()
    };
    for lifetime in 0..20 {
        let client = Client::new().with_psk("alice", "secretPSK");
        assert_eq!(client.get(&uri).await.unwrap().code, Code::CONTENT);
        if lifetime % 2 == 0 {
            client.close().await;
            stream::eventually("the closed client's session ends", || {
                dtls().dtls_sessions == 0
            })
            .await;
        }
        drop(client);
        stream::eventually("the dropped client's session ends", || {
            dtls().dtls_sessions == 0
        })
        .await;
    }
    assert_eq!(dtls().dtls_handshakes, 20, "{:?}", dtls());
    // A closed client opens a new session for its next request.
    let client = Client::new().with_psk("alice", "secretPSK");
    client.close().await;
    assert_eq!(client.get(&uri).await.unwrap().code, Code::CONTENT);
    assert_eq!(dtls().dtls_handshakes, 21);
    client.close().await;
    stream::eventually("the session ends", || dtls().dtls_sessions == 0).await;
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_key_is_a_clear_error_not_a_timeout() {
    let server = server()
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::Coaps).unwrap();
    let start = Instant::now();
    let err = Client::new()
        .with_psk("alice", "wrong")
        .get(&format!("coaps://{addr}/hello"))
        .await
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let Error::Dtls { peer, kind, reason } = &err else {
        panic!("expected a DTLS error, got {err:?}");
    };
    assert_eq!(*peer, addr);
    assert_eq!(*kind, cobalt::HandshakeFailure::KeysDiffer, "{err}");
    assert!(reason.contains("decrypt error"), "{err}");
    assert!(err.to_string().contains("DTLS handshake"), "{err}");

    let err = Client::new()
        .with_psk("mallory", "secretPSK")
        .get(&format!("coaps://{addr}/hello"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown psk identity"), "{err}");
    assert!(
        matches!(
            err,
            Error::Dtls {
                kind: cobalt::HandshakeFailure::UnknownIdentity,
                ..
            }
        ),
        "{err:?}"
    );
    // Both failures are counted for the metrics exporter.
    let mut failures = 0;
    for _ in 0..50 {
        failures = server.metrics().total().dtls_handshake_failures;
        if failures >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(failures >= 2, "{:?}", server.metrics().total());
    assert!(server
        .metrics()
        .render_prometheus()
        .contains("cobalt_dtls_handshake_failures_total"));
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coaps_without_a_key_is_refused() {
    let err = Client::new()
        .get("coaps://127.0.0.1:5684/hello")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("pre-shared key"), "{err}");
    let err = Server::new()
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Server::psk"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_dtls_side_by_side() {
    let server = server()
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let plain = server.local_addr(Scheme::Coap).unwrap();
    let secure = server.local_addr(Scheme::Coaps).unwrap();
    assert_ne!(plain, secure);
    let client = Client::new().with_psk("alice", "secretPSK");
    let a = client.get(&format!("coap://{plain}/hello")).await.unwrap();
    let b = client
        .get(&format!("coaps://{secure}/hello"))
        .await
        .unwrap();
    assert_eq!(a.text_payload(), b.text_payload());
    // The DTLS shards publish into their own metrics slots, after the plain ones.
    let mut handshakes = 0;
    for _ in 0..50 {
        handshakes = server.metrics().total().dtls_handshakes;
        if handshakes >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(handshakes >= 1, "{:?}", server.metrics().total());
    // Plain CoAP sent to the DTLS port is not served.
    let err = client
        .request(Code::GET, &format!("coap://{secure}/hello"))
        .timeout(Duration::from_millis(500))
        .send()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Deadline(_)), "{err:?}");
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_hello_flood_from_many_ports_does_not_stop_service() {
    let server = server()
        .dtls_config(DtlsConfig {
            max_sessions: 64,
            ..DtlsConfig::default()
        })
        .shards(1)
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::Coaps).unwrap();
    // A minimal DTLS 1.2 ClientHello record without a cookie (PSK-AES128-CCM8).
    let hello = client_hello();
    let mut sockets = Vec::new();
    for _ in 0..300 {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.send_to(&hello, addr).unwrap();
        sockets.push(s);
    }
    // Each got a HelloVerifyRequest (type 22, handshake type 3) and nothing else.
    let mut verified = 0;
    for s in &sockets {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 512];
        if let Ok(n) = s.recv(&mut buf) {
            if n > 13 && buf[0] == 22 && buf[13] == 3 {
                verified += 1;
            }
        }
    }
    assert!(verified > 250, "{verified} HelloVerifyRequests");
    // More flood than the session cap: a real client still gets through.
    let r = Client::new()
        .with_psk("alice", "secretPSK")
        .get(&format!("coaps://{addr}/hello"))
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "hello over dtls");
    server.shutdown(Duration::ZERO).await;
}

/// A DTLS 1.2 ClientHello (record + handshake headers) with an empty cookie.
fn client_hello() -> Vec<u8> {
    let mut body = vec![0xfe, 0xfd]; // client_version
    body.extend_from_slice(&[0x42; 32]); // random
    body.push(0); // session id
    body.push(0); // cookie
    body.extend_from_slice(&[0, 2, 0xc0, 0xa8]); // cipher suites: PSK_WITH_AES_128_CCM_8
    body.extend_from_slice(&[1, 0]); // compression: null
    let len = body.len() as u32;
    let mut hs = vec![1]; // client_hello
    hs.extend_from_slice(&len.to_be_bytes()[1..]);
    hs.extend_from_slice(&[0, 0]); // message_seq
    hs.extend_from_slice(&[0, 0, 0]); // fragment_offset
    hs.extend_from_slice(&len.to_be_bytes()[1..]); // fragment_length
    hs.extend_from_slice(&body);
    let mut rec = vec![22, 0xfe, 0xff, 0, 0, 0, 0, 0, 0, 0, 0];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_with_a_ca_and_psk_on_one_port() {
    use common::TestCredentials;
    let pki = TestCredentials::generate("Cobalt loopback CA");
    let server = server()
        .x509(pki.server.clone())
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::Coaps).unwrap();
    let uri = format!("coaps://{addr}/hello");
    let r = Client::new()
        .with_x509(pki.client.clone())
        .get(&uri)
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "hello over dtls");
    // The same port still takes PSK clients.
    let r = Client::new()
        .with_psk("alice", "secretPSK")
        .get(&uri)
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "hello over dtls");
    // A client that trusts another CA refuses the server, and says why.
    let other = TestCredentials::generate("Another CA");
    let err = Client::new()
        .with_x509(other.client)
        .get(&uri)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("certificate verify failed"),
        "{err}"
    );
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_is_reached_again_at_the_first_retransmission() {
    let first = server()
        .shards(1)
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let addr = first.local_addr(Scheme::Coaps).unwrap();
    let config = cobalt::EndpointConfig {
        ack_timeout: Duration::from_millis(500), // the new handshake gets 1 s
        ack_random_factor: 1.0,
        max_retransmit: 1,
        ..cobalt::EndpointConfig::default()
    };
    let client = Client::with_config(config)
        .unwrap()
        .with_psk("alice", "secretPSK");
    let uri = format!("coaps://{addr}/hello");
    client.get(&uri).await.unwrap();
    first.shutdown(Duration::ZERO).await;
    // The new server knows nothing of the old session.
    let second = server()
        .shards(1)
        .listen(Scheme::Coaps, addr)
        .start()
        .await
        .unwrap();
    // The request goes over the old session and is dropped; its only
    // retransmission (max_retransmit 1) finds no answer since and goes over a new
    // handshake, within the request's exchange.
    let r = client.get(&uri).await.unwrap();
    assert_eq!(r.text_payload(), "hello over dtls");
    second.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_over_dtls() {
    let value = stream::Value::new(b"v0");
    let server = Server::new()
        .route("/value", value.resource())
        .psk(keys())
        .shards(1)
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let client = Client::new().with_psk("alice", "secretPSK");
    let mut o = client
        .observe(&format!(
            "coaps://{}/value",
            server.local_addr(Scheme::Coaps).unwrap()
        ))
        .await
        .unwrap();
    assert_eq!(o.next().await.unwrap().unwrap().text_payload(), "v0");
    for i in 1..=3 {
        value.set(format!("v{i}").as_bytes());
        let n = o.next().await.unwrap().unwrap();
        assert_eq!(n.text_payload(), format!("v{i}"));
    }
    let last = o.cancel().await.unwrap();
    assert!(last.options.observe().is_none());
    assert_eq!(value.observable.observer_count(), 0);
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dtls_in_single_socket_mode() {
    let server = server()
        .single_socket(cobalt::runtime::Stages {
            receivers: 1,
            senders: 1,
            workers: 2,
            queue: 64,
        })
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let uri = format!(
        "coaps://{}/hello",
        server.local_addr(Scheme::Coaps).unwrap()
    );
    for (id, key) in [("alice", "secretPSK"), ("alice", "secretPSK")] {
        let r = Client::new().with_psk(id, key).get(&uri).await.unwrap();
        assert_eq!(r.text_payload(), "hello over dtls");
    }
    server.shutdown(Duration::ZERO).await;
}

/// PSK handshakes per second a one-shard server completes over loopback, each from a
/// new port, one at a time (cookie exchange, handshake, a CoAP ping answered with RST).
/// Reported, not asserted:
/// `cargo test --release -p cobalt --test dtls_loopback handshake_rate -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn server_handshake_rate() {
    use cobalt::transport::credentials::ClientPsk;
    use cobalt::transport::dtls::{DtlsBackend, OpensslDtls};
    let server = server()
        .shards(1)
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::Coaps).unwrap();
    let n = 2000u32;
    let elapsed = tokio::task::spawn_blocking(move || {
        let psk = ClientPsk::new("alice", "secretPSK");
        let mut c = OpensslDtls::client(psk, DtlsConfig::default()).unwrap();
        let start = Instant::now();
        for i in 0..n {
            let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let ping = [0x40, 0, (i >> 8) as u8, i as u8];
            c.encrypt(Instant::now(), addr, &ping);
            loop {
                while let Some(t) = c.poll_transmit() {
                    sock.send_to(&t.bytes, addr).unwrap();
                }
                let mut buf = [0u8; 2048];
                let (len, _) = sock.recv_from(&mut buf).unwrap();
                if !c
                    .handle_datagram(Instant::now(), addr, &buf[..len])
                    .is_empty()
                {
                    break;
                }
            }
            c.forget(addr);
        }
        start.elapsed()
    })
    .await
    .unwrap();
    println!(
        "{:.0} PSK handshakes/s against a one-shard server over loopback (sequential, client on the same machine)",
        f64::from(n) / elapsed.as_secs_f64()
    );
    server.shutdown(Duration::ZERO).await;
}

/// Half-open handshakes against `server` from the source addresses `from`, one
/// socket (port) each: a ClientHello, the cookie sent back, the server's flight
/// received and never answered. Returns how many reached the server's flight.
fn half_open_flood(server: std::net::SocketAddr, from: &[std::net::IpAddr], each: usize) -> usize {
    use cobalt::transport::credentials::ClientPsk;
    use cobalt::transport::dtls::{DtlsBackend, OpensslDtls};
    let mut reached = 0;
    let mut sockets = Vec::new();
    for ip in from {
        for _ in 0..each {
            let socket = std::net::UdpSocket::bind((*ip, 0)).unwrap();
            socket
                .set_read_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            let mut c =
                OpensslDtls::client(ClientPsk::new("attacker", "no key"), DtlsConfig::default())
                    .unwrap();
            c.connect(Instant::now(), server);
            let mut buf = [0u8; 2048];
            // ClientHello, HelloVerifyRequest, ClientHello with the cookie, server flight.
            for step in 0..2 {
                while let Some(t) = c.poll_transmit() {
                    socket.send_to(&t.bytes, server).unwrap();
                }
                let Ok(n) = socket.recv(&mut buf) else { break };
                if step == 0 {
                    c.handle_datagram(Instant::now(), server, &buf[..n]);
                } else {
                    reached += 1;
                }
            }
            sockets.push(socket); // keep the port: no ICMP, the handshake stays half-open
        }
    }
    reached
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_handshake_flood_beside_an_authenticated_observer() {
    use std::net::IpAddr;
    let value = stream::Value::new(b"v0");
    let limits = DtlsConfig {
        max_handshakes: 16,
        max_handshakes_per_ip: 4,
        handshake_timeout: Duration::from_secs(2),
        ..DtlsConfig::default()
    };
    let server = server()
        .route("/value", value.resource())
        .dtls_config(limits)
        .shards(1)
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::Coaps).unwrap();
    let dtls = {
        let m = server.metrics();
        move || m.total()
    };
    let client = Client::new().with_psk("alice", "secretPSK");
    let mut o = client
        .observe(&format!("coaps://{addr}/value"))
        .await
        .unwrap();
    assert_eq!(o.next().await.unwrap().unwrap().text_payload(), "v0");
    // The attacker: 40 half-open handshakes from one address, 3 each from 20 others.
    let one: Vec<IpAddr> = vec!["127.0.0.2".parse().unwrap()];
    let many: Vec<IpAddr> = (10..30)
        .map(|i| format!("127.0.1.{i}").parse().unwrap())
        .collect();
    let flood = tokio::task::spawn_blocking(move || {
        half_open_flood(addr, &one, 40) + half_open_flood(addr, &many, 3)
    });
    // Beside it, the observer is notified of every change and GETs are answered.
    let mut served = 0;
    let mut round = 0;
    while !flood.is_finished() || round < 3 {
        round += 1;
        value.set(format!("v{round}").as_bytes());
        let n = tokio::time::timeout(Duration::from_secs(5), o.next())
            .await
            .expect("a notification during the flood")
            .unwrap()
            .unwrap();
        assert_eq!(n.text_payload(), format!("v{round}"));
        let r = client.get(&format!("coaps://{addr}/hello")).await.unwrap();
        assert_eq!(r.code, Code::CONTENT);
        served += 1;
        let st = dtls();
        assert!(
            st.dtls_handshaking <= 16,
            "{} handshakes",
            st.dtls_handshaking
        );
        assert_eq!(st.dtls_sessions, 1, "the observer's session stays");
    }
    let reached = flood.await.unwrap();
    assert!(
        reached >= 90,
        "the flood reached the server: {reached} half-open handshakes"
    );
    assert!(served >= 3);
    // A new client still gets a session during and after the flood.
    let fresh = Client::new().with_psk("alice", "secretPSK");
    assert_eq!(
        fresh
            .get(&format!("coaps://{addr}/hello"))
            .await
            .unwrap()
            .code,
        Code::CONTENT
    );
    assert!(dtls().dtls_handshakes_displaced >= 80);
    // The half-open handshakes time out and give their places back.
    stream::eventually("half-open handshakes expire", || {
        dtls().dtls_handshaking == 0
    })
    .await;
    assert_eq!(dtls().dtls_sessions, 2);
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observation_over_coaps_recovers_after_a_server_restart() {
    use cobalt::server::Observable;
    let serve = |obs: &Observable, value: &'static str| {
        server().shards(1).route(
            "/value",
            get(move || async move { cobalt::Response::text(value).with_max_age(1) })
                .observable(obs),
        )
    };
    let first_obs = Observable::new();
    let first = serve(&first_obs, "first")
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let addr = first.local_addr(Scheme::Coaps).unwrap();
    let config = cobalt::EndpointConfig {
        ack_timeout: Duration::from_millis(300),
        ack_random_factor: 1.0,
        ..cobalt::EndpointConfig::default()
    };
    let client = Client::with_config(config)
        .unwrap()
        .with_psk("alice", "secretPSK");
    let mut o = client
        .observe(&format!("coaps://{addr}/value"))
        .await
        .unwrap();
    assert_eq!(o.next().await.unwrap().unwrap().text_payload(), "first");
    first.shutdown(Duration::ZERO).await;
    // A new server on the same port knows nothing of the session or the relation.
    let second_obs = Observable::new();
    let second = serve(&second_obs, "second")
        .listen(Scheme::Coaps, addr)
        .start()
        .await
        .unwrap();
    // Max-Age passes without a notification: the client registers again; its
    // retransmissions go unanswered, so it handshakes again and is served.
    let n = tokio::time::timeout(Duration::from_secs(30), o.next())
        .await
        .expect("the observation recovers")
        .unwrap()
        .unwrap();
    assert_eq!(n.text_payload(), "second");
    assert_eq!(second_obs.observer_count(), 1);
    second_obs.changed();
    let n = tokio::time::timeout(Duration::from_secs(10), o.next())
        .await
        .expect("notifications from the new server")
        .unwrap()
        .unwrap();
    assert_eq!(n.text_payload(), "second");
    second.shutdown(Duration::ZERO).await;
}

//! The DTLS Connection ID (RFC 9146) end to end: a Cobalt server on the Mbed TLS
//! backend, and a device (the library's `MbedtlsDtls` client table over a UDP socket
//! of its own) whose source port changes between requests, as behind a NAT that
//! rebinds. Its session, and its observation, survive without a new handshake, and
//! what the server keeps of it (observe relations, budgets) moves to its new address.
#![cfg(feature = "mbedtls")]

use cobalt::proto::message::{decode, encode, opt, Code, Message, MessageType, Token};
use cobalt::server::{get, Observable, Request, ServerLimits};
use cobalt::transport::credentials::{ClientPsk, PskStore};
use cobalt::transport::dtls::{DtlsBackend, DtlsConfig, MbedtlsDtls};
use cobalt::{Client, Scheme, Server};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn cid_settings() -> DtlsConfig {
    DtlsConfig {
        cid_len: 6,
        cid_node_id: "c0ba".into(),
        ..DtlsConfig::default()
    }
}

/// A device: a client session table over a socket that can be replaced (a new
/// source port, as after a NAT rebinding).
struct Device {
    dtls: MbedtlsDtls,
    socket: UdpSocket,
    server: SocketAddr,
    mid: u16,
}

impl Device {
    fn new(server: SocketAddr) -> Device {
        Device::at(server, "127.0.0.1")
    }

    /// A device whose socket is on the loopback address `ip` (any of 127.0.0.0/8).
    fn at(server: SocketAddr, ip: &str) -> Device {
        let psk = ClientPsk::new("device-1", "secretPSK");
        Device {
            dtls: MbedtlsDtls::client(&psk, true, DtlsConfig::default()).unwrap(),
            socket: UdpSocket::bind((ip, 0)).unwrap(),
            server,
            mid: 1,
        }
    }

    fn port(&self) -> u16 {
        self.socket.local_addr().unwrap().port()
    }

    fn addr(&self) -> SocketAddr {
        self.socket.local_addr().unwrap()
    }

    fn rebind(&mut self) {
        let ip = self.addr().ip().to_string();
        self.rebind_to(&ip);
    }

    /// A new source address: a new port on `ip`.
    fn rebind_to(&mut self, ip: &str) {
        let old = self.addr();
        self.socket = UdpSocket::bind((ip, 0)).unwrap();
        assert_ne!(self.addr(), old);
    }

    fn flush(&mut self) {
        while let Some(t) = self.dtls.poll_transmit() {
            self.socket.send_to(&t.bytes, t.peer).unwrap();
        }
    }

    fn send(&mut self, m: &Message) {
        self.dtls.encrypt(Instant::now(), self.server, &encode(m));
        self.flush();
    }

    /// A GET for `path` (with Observe: 0 when `observe`), confirmable.
    fn get(&mut self, path: &str, observe: bool) -> Token {
        self.mid += 1;
        let token = Token::new(&self.mid.to_be_bytes()).unwrap();
        let mut m = Message::new(MessageType::Confirmable, Code::GET, self.mid);
        m.token = token.clone();
        if observe {
            m.options.push(opt::OBSERVE, []);
        }
        m.options.set_uri_path(path);
        self.send(&m);
        token
    }

    /// The next CoAP message with `token` (acknowledging confirmable ones), running
    /// the handshake's timers meanwhile.
    fn next(&mut self, token: &Token) -> Message {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut buf = [0u8; 2048];
        loop {
            let now = Instant::now();
            assert!(now < deadline, "no answer from the server");
            let wait = self
                .dtls
                .poll_timeout()
                .map_or(deadline, |t| t.min(deadline))
                .saturating_duration_since(now)
                .max(Duration::from_millis(5));
            self.socket.set_read_timeout(Some(wait)).unwrap();
            match self.socket.recv_from(&mut buf) {
                Ok((n, from)) => {
                    assert_eq!(from, self.server);
                    for plain in self.dtls.handle_datagram(Instant::now(), from, &buf[..n]) {
                        let m = decode(&plain).unwrap();
                        if m.mtype == MessageType::Confirmable {
                            let ack =
                                Message::new(MessageType::Acknowledgement, Code::EMPTY, m.mid);
                            self.send(&ack);
                        }
                        if &m.token == token {
                            self.flush();
                            return m;
                        }
                    }
                }
                Err(_) => self.dtls.handle_timeout(Instant::now()),
            }
            self.flush();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebinding_device_keeps_its_session_and_its_observation() {
    let obs = Observable::new();
    let value = Arc::new(AtomicU32::new(0));
    let current = value.clone();
    let server = Server::new()
        .route(
            "/who",
            get(|req: Request| async move { req.peer().port().to_string() }),
        )
        .route(
            "/value",
            get(move || {
                let v = current.load(Ordering::SeqCst);
                async move { v.to_string() }
            })
            .observable(&obs),
        )
        .psk(PskStore::new().with("device-1", "secretPSK"))
        .dtls_config(cid_settings())
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::Coaps).unwrap();
    let mut device = tokio::task::spawn_blocking(move || Device::new(addr))
        .await
        .unwrap();
    let first_port = device.port();
    let (mut device, observe_token) = tokio::task::spawn_blocking(move || {
        let t = device.get("who", false);
        let r = device.next(&t);
        assert_eq!(r.code, Code::CONTENT);
        assert_eq!(r.payload, first_port.to_string().as_bytes());
        let t = device.get("value", true);
        let n = device.next(&t);
        assert_eq!(n.payload, b"0");
        assert!(n.options.observe().is_some(), "registered");
        (device, t)
    })
    .await
    .unwrap();
    assert_eq!(obs.observer_count(), 1);

    for round in 1..=2u32 {
        // A new source port; the next request carries the CID from there.
        device = tokio::task::spawn_blocking(move || {
            device.rebind();
            let t = device.get("who", false);
            let r = device.next(&t);
            // The server knows the session by its new address.
            assert_eq!(r.payload, device.port().to_string().as_bytes());
            assert_ne!(device.port(), first_port);
            device
        })
        .await
        .unwrap();
        value.store(round, Ordering::SeqCst);
        obs.changed();
        let token = observe_token.clone();
        device = tokio::task::spawn_blocking(move || {
            let n = device.next(&token);
            assert_eq!(
                n.payload,
                round.to_string().as_bytes(),
                "the notification reaches the new port"
            );
            device
        })
        .await
        .unwrap();
    }
    assert_eq!(obs.observer_count(), 1, "still one relation");
    // The shard publishes its counters after it sent the answer: wait for them.
    let mut totals = server.metrics().total();
    for _ in 0..5000 {
        if totals.dtls_address_updates >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        totals = server.metrics().total();
    }
    assert_eq!(totals.dtls_handshakes, 1, "no new handshake");
    assert_eq!(totals.dtls_address_updates, 2);
    assert_eq!(device.dtls.stats().handshakes, 1);
    server.shutdown(Duration::ZERO).await;
}

/// With several shards, each grants CIDs with its index after the node id, and the
/// listener's sockets steer a record with a CID to that shard: from a new port
/// (which the kernel's hash would give to any shard) the device still reaches the
/// shard that holds its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebinding_device_keeps_its_session_on_a_server_with_several_shards() {
    const REBINDS: u64 = 12;
    let server = Server::new()
        .route(
            "/who",
            get(|req: Request| async move { req.peer().port().to_string() }),
        )
        .psk(PskStore::new().with("device-1", "secretPSK"))
        .dtls_config(cid_settings())
        .shards(4)
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::Coaps).unwrap();
    let device = tokio::task::spawn_blocking(move || {
        let mut device = Device::new(addr);
        for _ in 0..=REBINDS {
            let t = device.get("who", false);
            let r = device.next(&t);
            assert_eq!(r.payload, device.port().to_string().as_bytes());
            device.rebind();
        }
        device
    })
    .await
    .unwrap();
    let mut totals = server.metrics().total();
    for _ in 0..5000 {
        if totals.dtls_address_updates >= REBINDS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        totals = server.metrics().total();
    }
    assert_eq!(totals.dtls_handshakes, 1, "no new handshake");
    assert_eq!(totals.dtls_address_updates, REBINDS);
    assert_eq!(device.dtls.stats().handshakes, 1);
    server.shutdown(Duration::ZERO).await;
}

/// A device that moves to another IP address takes its observation and its place in
/// the per-address observer budget along: at the new address it cannot register
/// more than the budget allows there (moving does not double its budget), the
/// notifications keep arriving, and the old address holds nothing of it (another
/// device there may register).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_moves_is_served_under_the_budget_it_had() {
    let obs = Observable::new();
    let other = Observable::new();
    let value = Arc::new(AtomicU32::new(0));
    let current = value.clone();
    let server = Server::new()
        .route(
            "/who",
            get(|req: Request| async move { req.peer().to_string() }),
        )
        .route(
            "/value",
            get(move || {
                let v = current.load(Ordering::SeqCst);
                async move { v.to_string() }
            })
            .observable(&obs),
        )
        .route("/other", get(|| async { "other" }).observable(&other))
        .limits(ServerLimits {
            max_observers_per_ip: 1,
            ..ServerLimits::default()
        })
        .psk(PskStore::new().with("device-1", "secretPSK"))
        .dtls_config(cid_settings())
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::Coaps).unwrap();
    let (mut device, token) = tokio::task::spawn_blocking(move || {
        let mut device = Device::at(addr, "127.0.0.2");
        let t = device.get("value", true);
        let n = device.next(&t);
        assert!(n.options.observe().is_some(), "registered from 127.0.0.2");
        (device, t)
    })
    .await
    .unwrap();
    device = tokio::task::spawn_blocking(move || {
        device.rebind_to("127.0.0.3");
        let t = device.get("who", false);
        let r = device.next(&t);
        assert_eq!(
            r.payload,
            device.addr().to_string().as_bytes(),
            "known by its new address"
        );
        // Its relation counts for 127.0.0.3 now: a second one is over the budget.
        let t = device.get("other", true);
        let r = device.next(&t);
        assert_eq!(
            r.code,
            Code::TOO_MANY_REQUESTS,
            "no second relation by moving"
        );
        device
    })
    .await
    .unwrap();
    value.store(1, Ordering::SeqCst);
    obs.changed();
    let (device, neighbour) = tokio::task::spawn_blocking(move || {
        let n = device.next(&token);
        assert_eq!(n.payload, b"1", "the notification reaches the new address");
        // The old address holds nothing: a device there may observe.
        let mut neighbour = Device::at(addr, "127.0.0.2");
        let t = neighbour.get("other", true);
        let r = neighbour.next(&t);
        assert_eq!(r.code, Code::CONTENT);
        assert!(
            r.options.observe().is_some(),
            "registered from the old address"
        );
        (device, neighbour)
    })
    .await
    .unwrap();
    assert_eq!(obs.observer_count(), 1);
    assert_eq!(other.observer_count(), 1);
    assert_eq!(
        device.dtls.stats().handshakes,
        1,
        "the device kept its session"
    );
    assert_eq!(neighbour.dtls.stats().handshakes, 1);
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_client_asks_for_a_cid_and_an_openssl_client_is_served_without() {
    let server = Server::new()
        .route("/hello", get(|| async { "hello" }))
        .psk(PskStore::new().with("device-1", "secretPSK"))
        .dtls_config(cid_settings())
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let uri = format!(
        "coaps://{}/hello",
        server.local_addr(Scheme::Coaps).unwrap()
    );
    let with_cid = Client::new()
        .with_dtls_cid()
        .unwrap()
        .with_psk("device-1", "secretPSK");
    assert_eq!(with_cid.get(&uri).await.unwrap().text_payload(), "hello");
    #[cfg(feature = "openssl")]
    {
        let openssl = Client::new().with_psk("device-1", "secretPSK");
        assert_eq!(openssl.get(&uri).await.unwrap().text_payload(), "hello");
    }
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn a_cid_on_the_openssl_backend_is_refused_with_a_reason() {
    let result = Server::new()
        .psk(PskStore::new().with("device-1", "secretPSK"))
        .dtls_config(DtlsConfig {
            backend: cobalt::transport::dtls::DtlsBackendKind::Openssl,
            ..cid_settings()
        })
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await;
    let Err(e) = result else {
        panic!("a CID on the OpenSSL backend must be refused");
    };
    let message = e.to_string();
    assert!(message.contains("mbedtls"), "{message}");
}

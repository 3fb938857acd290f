//! Observe fan-out and per-peer budgets over UDP on loopback, each defence with a
//! legitimate client beside the attacker: the attacker is limited, the legitimate
//! client is served, and the state is bounded and comes back.
//!
//! Attackers send from other loopback addresses (127.0.0.2, ...) than the legitimate
//! client (127.0.0.1), so that per-address budgets tell them apart. Every wait is for
//! a condition with a deadline.

use cobalt::server::{get, put, Observable, Request, ServerLimits, UploadLimits};
use cobalt::Scheme;
use cobalt::{Client, Code, Response, Server, ServerHandle};
use cobalt_proto::message::{codec, opt, Message, MessageType, Token};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;

/// A raw CoAP endpoint for one loopback address and port.
struct Raw {
    socket: UdpSocket,
    mid: u16,
}

impl Raw {
    async fn bind(ip: [u8; 4], server: SocketAddr) -> Raw {
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
        // Room for every notification of a burst while the test is busy elsewhere
        // (a NON notification dropped here would be lost for good).
        let _ = socket.set_recv_buffer_size(4 << 20);
        socket.set_nonblocking(true).unwrap();
        socket.bind(&SocketAddr::from((ip, 0)).into()).unwrap();
        let socket = UdpSocket::from_std(socket.into()).unwrap();
        socket.connect(server).await.unwrap();
        Raw { socket, mid: 0 }
    }

    async fn send(
        &mut self,
        code: Code,
        token: &Token,
        path: &str,
        edit: impl FnOnce(&mut Message),
    ) {
        self.mid = self.mid.wrapping_add(1);
        let mut m = Message::new(MessageType::Confirmable, code, self.mid);
        m.token = token.clone();
        m.options.set_uri_path(path);
        edit(&mut m);
        self.socket.send(&codec::encode(&m)).await.unwrap();
    }

    /// The next message within `wait`; a CoAP ping (the server verifying this
    /// address, RFC 9175 §2.4) is answered with RST on the way, as every client does.
    async fn recv(&self, wait: Duration) -> Option<Message> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut buf = [0u8; 2048];
        loop {
            let n = tokio::time::timeout_at(deadline, self.socket.recv(&mut buf))
                .await
                .ok()?
                .ok()?;
            let m = codec::decode(&buf[..n]).ok()?;
            if m.mtype == MessageType::Confirmable && m.code == Code::EMPTY {
                let rst = codec::encode(&Message::reset(m.mid));
                self.socket.send(&rst).await.ok()?;
                continue;
            }
            return Some(m);
        }
    }

    /// Registers `tokens` as observers of `path`: one first (its answer waits for the
    /// server to verify this address), then 16 at a time (within the requests one peer
    /// may have in progress, and the socket's buffer); the answer to each.
    async fn register(&mut self, tokens: &[Token], path: &str) -> HashMap<Token, Message> {
        let mut answers = HashMap::new();
        let (first, rest) = tokens.split_at(tokens.len().min(1));
        for chunk in std::iter::once(first).chain(rest.chunks(16)) {
            for t in chunk {
                self.send(Code::GET, t, path, |m| m.options.set_uint(opt::OBSERVE, 0))
                    .await;
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while chunk.iter().any(|t| !answers.contains_key(t)) {
                assert!(Instant::now() < deadline, "registrations unanswered");
                if let Some(m) = self.recv(Duration::from_millis(200)).await {
                    if m.code.is_response() {
                        answers.insert(m.token.clone(), m);
                    }
                }
            }
        }
        answers
    }
}

fn tokens(n: u32) -> Vec<Token> {
    (0..n)
        .map(|i| Token::new(&i.to_be_bytes()).unwrap())
        .collect()
}

fn codes(answers: &HashMap<Token, Message>) -> HashMap<Code, usize> {
    let mut c = HashMap::new();
    for m in answers.values() {
        *c.entry(m.code).or_default() += 1;
    }
    c
}

/// Waits for `what` to hold, up to 60 s: a check that it happens, not of how fast (a
/// debug build on a loaded machine sends a 20,000-observer fan-out at ~2,000/s).
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A one-shard server with an observable `/obs` (its GET answers the value, and reads
/// the peer when `per_peer`), `/hello` and `/upload`.
async fn server(
    limits: ServerLimits,
    obs: &Observable,
    value: &Arc<Mutex<u32>>,
    per_peer: bool,
) -> ServerHandle {
    let read = value.clone();
    Server::new()
        .route(
            "/obs",
            get(move |req: Request| {
                if per_peer {
                    let _ = req.peer();
                }
                let v = *read.lock().unwrap();
                async move { Response::content(v.to_string()) }
            })
            .observable(obs),
        )
        .route("/hello", get(|| async { "hello world" }))
        .route(
            "/upload",
            put(|req: Request| async move { (Code::CHANGED, req.payload().len().to_string()) }),
        )
        .limits(limits)
        .shards(1)
        .bind("127.0.0.1:0")
        .await
        .unwrap()
}

#[tokio::test]
async fn a_shard_answers_other_clients_while_a_large_fan_out_is_under_way() {
    let (obs, value) = (Observable::new(), Arc::new(Mutex::new(0)));
    let limits = ServerLimits {
        max_observers_per_ip: 100_000,
        observe_batch: 1,
        ..ServerLimits::default()
    };
    // The GET handler reads the peer: it runs for every observer, one per turn.
    let srv = server(limits, &obs, &value, true).await;
    let mut observers = Raw::bind([127, 0, 0, 3], srv.local_addr(Scheme::Coap).unwrap()).await;
    let answers = observers.register(&tokens(20_000), "/obs").await;
    assert_eq!(codes(&answers)[&Code::CONTENT], 20_000);
    let client = Client::new();
    let hello = format!("coap://{}/hello", srv.local_addr(Scheme::Coap).unwrap());
    assert_eq!(client.get(&hello).await.unwrap().code, Code::CONTENT);

    *value.lock().unwrap() = 1;
    obs.changed();
    let backlog = || srv.metrics().total().notify_backlog;
    eventually("the fan-out has begun", || backlog() > 0).await;
    let r = client.get(&hello).await.unwrap();
    assert_eq!(r.code, Code::CONTENT);
    assert!(
        backlog() > 0,
        "answered while 20,000 notifications were still being sent"
    );
    eventually("the fan-out ends", || backlog() == 0).await;
    srv.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn a_burst_of_changes_skips_states_and_every_observer_ends_with_the_latest() {
    let (obs, value) = (Observable::new(), Arc::new(Mutex::new(0)));
    let srv = server(ServerLimits::default(), &obs, &value, false).await;
    let mut observers = Raw::bind([127, 0, 0, 4], srv.local_addr(Scheme::Coap).unwrap()).await;
    let ts = tokens(100);
    let answers = observers.register(&ts, "/obs").await;
    assert_eq!(codes(&answers)[&Code::CONTENT], 100);
    for v in 1..=10_000 {
        *value.lock().unwrap() = v;
        obs.changed();
    }
    // Collect until every observer shows the latest state.
    let mut latest: HashMap<Token, String> = HashMap::new();
    let mut received = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while latest.values().filter(|v| *v == "10000").count() < 100 {
        if Instant::now() > deadline {
            let mut held: HashMap<&String, usize> = HashMap::new();
            for v in latest.values() {
                *held.entry(v).or_default() += 1;
            }
            panic!("not every observer got the latest state: {held:?} after {received}");
        }
        let Some(m) = observers.recv(Duration::from_millis(200)).await else {
            continue;
        };
        if m.mtype == MessageType::Confirmable {
            let ack = codec::encode(&Message::empty_ack(m.mid));
            observers.socket.send(&ack).await.unwrap();
        }
        received += 1;
        latest.insert(m.token, String::from_utf8_lossy(&m.payload).into_owned());
    }
    // 100 observers × 10,000 states: nearly all of them skipped.
    assert!(received < 100 * 100, "{received} notifications");
    let productions = srv.metrics().total().notify_productions;
    assert!(
        productions < 100,
        "{productions} GET handler runs for 10,000 changes"
    );
    srv.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn one_address_cannot_take_the_observe_relations_of_everyone() {
    let (obs, value) = (Observable::new(), Arc::new(Mutex::new(0)));
    let limits = ServerLimits {
        max_observers_per_ip: 50,
        max_observers: 120,
        ..ServerLimits::default()
    };
    let srv = server(limits, &obs, &value, false).await;
    // One address: 50 relations, then 4.29 with Max-Age.
    let mut a = Raw::bind([127, 0, 0, 2], srv.local_addr(Scheme::Coap).unwrap()).await;
    let answers = a.register(&tokens(500), "/obs").await;
    let c = codes(&answers);
    assert_eq!(
        (c[&Code::CONTENT], c[&Code::TOO_MANY_REQUESTS]),
        (50, 450),
        "{c:?}"
    );
    assert!(answers
        .values()
        .filter(|m| m.code == Code::TOO_MANY_REQUESTS)
        .all(|m| m.options.max_age() == 10 && m.options.observe().is_none()));
    // A second one, near the server-wide bound: 5.03 once it holds its share.
    let mut b = Raw::bind([127, 0, 0, 5], srv.local_addr(Scheme::Coap).unwrap()).await;
    let c = codes(&b.register(&tokens(500), "/obs").await);
    assert_eq!(c[&Code::CONTENT], 35, "{c:?}");
    assert_eq!(c[&Code::SERVICE_UNAVAILABLE], 465, "{c:?}");
    // The legitimate client still registers and is notified.
    let client = Client::new();
    let mut o = client
        .observe(&format!(
            "coap://{}/obs",
            srv.local_addr(Scheme::Coap).unwrap()
        ))
        .await
        .unwrap();
    assert!(o.next().await.unwrap().unwrap().options.observe().is_some());
    assert_eq!(obs.observer_count(), 86);
    *value.lock().unwrap() = 7;
    obs.changed();
    assert_eq!(o.next().await.unwrap().unwrap().payload, b"7");
    // The attackers reject their notifications: their relations end, the budget
    // comes back.
    let deadline = Instant::now() + Duration::from_secs(10);
    while obs.observer_count() > 1 {
        assert!(
            Instant::now() < deadline,
            "{} observers left",
            obs.observer_count()
        );
        for raw in [&a, &b] {
            while let Some(m) = raw.recv(Duration::from_millis(20)).await {
                raw.socket
                    .send(&codec::encode(&Message::reset(m.mid)))
                    .await
                    .unwrap();
            }
        }
    }
    assert_eq!(srv.metrics().total().observers, 1);
    let limits = srv.metrics();
    let counters = limits.limits().unwrap();
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(counters.observe_refused_peer.load(Relaxed), 450);
    assert_eq!(counters.observe_refused_server.load(Relaxed), 465);
    let c = codes(&a.register(&tokens(10), "/obs").await);
    assert_eq!(c[&Code::CONTENT], 10, "room again: {c:?}");
    srv.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn one_address_cannot_block_uploads_for_everyone() {
    let (obs, value) = (Observable::new(), Arc::new(Mutex::new(0)));
    let limits = ServerLimits {
        uploads: UploadLimits {
            max_uploads_per_peer: 4,
            max_uploads_per_ip: 32,
            upload_idle_timeout: Duration::from_secs(1),
            ..UploadLimits::default()
        },
        block_szx: 2,
        ..ServerLimits::default()
    };
    let srv = server(limits, &obs, &value, false).await;
    // 2,000 one-block uploads from 50 ports of one address. The address never holds
    // more than 32 at once; an upload that idles out (on a slow machine the flood can
    // outlast the idle timeout) makes room for one more.
    let mut codes: HashMap<Code, usize> = HashMap::new();
    for port in 0..50u16 {
        let mut raw = Raw::bind([127, 0, 0, 2], srv.local_addr(Scheme::Coap).unwrap()).await;
        for tag in 0..40u16 {
            let token = Token::new(&tag.to_be_bytes()).unwrap();
            raw.send(Code::PUT, &token, "/upload", |m| {
                m.options.set_uint(opt::BLOCK1, 0x0a); // NUM 0, more, 64 bytes
                m.options.set(opt::REQUEST_TAG, [port as u8, tag as u8]);
                m.payload = vec![b'x'; 64];
            })
            .await;
            let answer = raw.recv(Duration::from_secs(5)).await.expect("an answer");
            *codes.entry(answer.code).or_default() += 1;
            let held = srv.metrics().total().uploads;
            assert!(held <= 32, "{held} uploads held for one address");
        }
    }
    let started = codes[&Code::CONTINUE];
    assert!(started >= 32, "{codes:?}");
    assert_eq!(started + codes[&Code::TOO_MANY_REQUESTS], 2000, "{codes:?}");
    let m = srv.metrics().total();
    assert!(m.uploads <= 32 && m.upload_bytes == m.uploads * 64, "{m:?}");
    // The legitimate client uploads 5,000 bytes block by block meanwhile.
    let client = Client::new();
    let r = client
        .put(
            &format!("coap://{}/upload", srv.local_addr(Scheme::Coap).unwrap()),
            vec![b'y'; 5000],
        )
        .await
        .unwrap();
    assert_eq!((r.code, r.text_payload().as_str()), (Code::CHANGED, "5000"));
    // The attacker's uploads expire on their own timer; the memory comes back.
    eventually("the idle uploads expire", || {
        let m = srv.metrics().total();
        (m.uploads, m.upload_bytes) == (0, 0)
    })
    .await;
    let limits = srv.metrics();
    let expired = limits
        .limits()
        .unwrap()
        .uploads_expired
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(expired as usize, started);
    srv.shutdown(Duration::ZERO).await;
}

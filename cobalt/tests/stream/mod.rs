//! Cases that must hold the same over `coap+tcp` and `coap+ws`: observe (RFC 7641 over
//! RFC 8323 §7), Block1 uploads and BERT (RFC 8323 §6), run by `tcp_loopback.rs` and
//! `ws_loopback.rs` against a Cobalt server with Cobalt's client.
#![allow(dead_code, unused_macros)]

/// Declares one `#[tokio::test]` per shared loopback case, run over transport `$t`
/// (`tcp_loopback.rs` and `ws_loopback.rs` each expand it once).
macro_rules! shared_cases {
    ($t:expr) => {
        shared_cases!($t =>
            observe_in_order_then_cancel: observe_in_order_then_cancel();
            dropping_an_observation_deregisters: dropping_an_observation_deregisters();
            deleted_sends_4_04_and_max_observers_holds: deleted_sends_4_04_and_max_observers_holds();
            an_address_is_held_to_its_observer_budget: an_address_is_held_to_its_observer_budget();
            large_notifications_are_completed_with_bert: large_notifications_are_completed(true);
            large_notifications_are_completed_without_bert: large_notifications_are_completed(false);
            uploads_larger_than_the_server_accepts: uploads_larger_than_the_server_accepts();
            downloads_larger_than_the_client_accepts: downloads_larger_than_the_client_accepts();
            too_large_uploads_get_4_13: too_large_uploads_get_4_13();
            the_client_releases_its_connections: the_client_releases_its_connections();
        );
    };
    ($t:expr => $($name:ident: $case:ident($($arg:expr),*);)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            super::stream::$case($t $(, $arg)*).await;
        }
    )*};
}

use cobalt::proto::message::opt;
use cobalt::proto::tcp_connection::TcpConfig;
use cobalt::server::ServerLimits;
use cobalt::server::{get, put, MethodRouter, Observable, Request, Response, UploadChunk};
use cobalt::transport::limits::TcpServerLimits;
use cobalt::Scheme;
use cobalt::{Client, Code, Server, ServerHandle};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The transport under test.
#[derive(Debug, Clone, Copy)]
pub enum Transport {
    Tcp,
    Ws,
}

impl Transport {
    pub fn scheme(self) -> &'static str {
        match self {
            Transport::Tcp => "coap+tcp",
            Transport::Ws => "coap+ws",
        }
    }

    pub async fn bind(self, server: Server, limits: TcpServerLimits) -> ServerHandle {
        match self {
            Transport::Tcp => {
                server
                    .tcp_limits(limits)
                    .listen(Scheme::CoapTcp, "127.0.0.1:0")
                    .start()
                    .await
            }
            Transport::Ws => {
                server
                    .ws_limits(limits)
                    .listen(Scheme::CoapWs, "127.0.0.1:0")
                    .start()
                    .await
            }
        }
        .unwrap()
    }

    pub fn uri(self, server: &ServerHandle, path: &str) -> String {
        format!(
            "{}://{}{path}",
            self.scheme(),
            server.local_addr(self.scheme().parse().unwrap()).unwrap()
        )
    }
}

/// Waits (up to 10 s, a guard against hanging, not a performance bound) until `f`.
pub async fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Connections open on the server's listener of `t`, from its metrics.
pub fn open_connections(t: Transport, server: &ServerHandle) -> u64 {
    let label = match t {
        Transport::Tcp => "tcp",
        Transport::Ws => "ws",
    };
    let key = format!("cobalt_connections_open{{transport=\"{label}\"}} ");
    let text = server.metrics().render_prometheus();
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in\n{text}"))
}

/// The client ends what it opened: `Client::close` releases and closes its
/// connection (an observation in flight ends with `Error::Shutdown`), the client
/// stays usable, and dropping the last clone releases the connection it opened next.
pub async fn the_client_releases_its_connections(t: Transport) {
    let value = Value::new(b"v0");
    let server = t
        .bind(
            Server::new()
                .route("/hello", get(|| async { "hello" }))
                .route("/obs", value.resource()),
            TcpServerLimits::default(),
        )
        .await;
    let client = Client::new();
    let mut observation = client.observe(&t.uri(&server, "/obs")).await.unwrap();
    assert_eq!(
        observation.next().await.unwrap().unwrap().text_payload(),
        "v0"
    );
    assert_eq!(open_connections(t, &server), 1);
    client.close().await;
    eventually("the closed client's connection is gone", || {
        open_connections(t, &server) == 0
    })
    .await;
    assert!(matches!(
        observation.next().await,
        Some(Err(cobalt::Error::Shutdown))
    ));
    let again = client.get(&t.uri(&server, "/hello")).await.unwrap();
    assert_eq!(again.text_payload(), "hello");
    assert_eq!(open_connections(t, &server), 1);
    drop((client, observation));
    eventually("the dropped client's connection is gone", || {
        open_connections(t, &server) == 0
    })
    .await;
    server.shutdown(Duration::ZERO).await;
}

/// The bytes of a body of `n` bytes that differ from block to block.
pub fn body(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 251) as u8).collect()
}

/// An observable value: GET reads it, [`Value::set`] changes it and notifies.
#[derive(Clone)]
pub struct Value {
    pub observable: Observable,
    value: Arc<Mutex<Vec<u8>>>,
}

impl Value {
    pub fn new(initial: &[u8]) -> Value {
        Value {
            observable: Observable::new(),
            value: Arc::new(Mutex::new(initial.to_vec())),
        }
    }

    pub fn set(&self, v: &[u8]) {
        *self.value.lock().unwrap() = v.to_vec();
        self.observable.changed();
    }

    pub fn resource(&self) -> MethodRouter {
        let read = self.value.clone();
        get(move || {
            let v = read.lock().unwrap().clone();
            async move { Response::content(v) }
        })
        .observable(&self.observable)
    }

    /// A server with this value at `/obs`, over `t`.
    pub async fn serve(&self, t: Transport) -> ServerHandle {
        t.bind(
            Server::new().route("/obs", self.resource()),
            TcpServerLimits::default(),
        )
        .await
    }
}

/// Notifications arrive in order with growing sequence numbers; `cancel` ends the
/// relation with the server's answer and the observer count returns to 0.
pub async fn observe_in_order_then_cancel(t: Transport) {
    let value = Value::new(b"v0");
    let server = value.serve(t).await;
    let client = Client::new();
    let mut obs = client.observe(&t.uri(&server, "/obs")).await.unwrap();
    let first = obs.next().await.unwrap().unwrap();
    assert_eq!(first.payload, b"v0");
    let mut seq = first.options.observe().expect("registered");
    assert_eq!(value.observable.observer_count(), 1);
    for i in 1..=5 {
        value.set(format!("v{i}").as_bytes());
        let n = obs.next().await.unwrap().unwrap();
        assert_eq!(n.code, Code::CONTENT);
        assert_eq!(n.text_payload(), format!("v{i}"));
        let s = n.options.observe().unwrap();
        assert!(s > seq, "sequence {s} after {seq}");
        seq = s;
    }
    let answer = obs.cancel().await.unwrap();
    assert_eq!(answer.code, Code::CONTENT);
    assert!(answer.options.observe().is_none(), "deregistered");
    assert_eq!(value.observable.observer_count(), 0);
    // The connection still serves requests.
    let r = client.get(&t.uri(&server, "/obs")).await.unwrap();
    assert_eq!(r.payload, b"v5");
    server.shutdown(Duration::ZERO).await;
}

/// Dropping an observation deregisters it at the server.
pub async fn dropping_an_observation_deregisters(t: Transport) {
    let value = Value::new(b"x");
    let server = value.serve(t).await;
    let client = Client::new();
    let mut a = client.observe(&t.uri(&server, "/obs")).await.unwrap();
    let mut b = client.observe(&t.uri(&server, "/obs")).await.unwrap();
    a.next().await.unwrap().unwrap();
    b.next().await.unwrap().unwrap();
    assert_eq!(value.observable.observer_count(), 2);
    drop(a);
    let o = value.observable.clone();
    eventually("the dropped observation is deregistered", || {
        o.observer_count() == 1
    })
    .await;
    // The other one still gets notifications.
    value.set(b"y");
    assert_eq!(b.next().await.unwrap().unwrap().payload, b"y");
    drop(b);
    eventually("both are deregistered", || o.observer_count() == 0).await;
    server.shutdown(Duration::ZERO).await;
}

/// `deleted()` sends 4.04 and ends the relation; at `max_observers` a GET with
/// Observe=0 is answered 5.03 with Max-Age and registers nothing.
pub async fn deleted_sends_4_04_and_max_observers_holds(t: Transport) {
    let value = Value::new(b"here");
    let server = t
        .bind(
            Server::new()
                .route("/obs", value.resource())
                .limits(ServerLimits {
                    max_observers: 1,
                    ..ServerLimits::default()
                }),
            TcpServerLimits::default(),
        )
        .await;
    let client = Client::new();
    let mut obs = client.observe(&t.uri(&server, "/obs")).await.unwrap();
    assert!(obs
        .next()
        .await
        .unwrap()
        .unwrap()
        .options
        .observe()
        .is_some());
    let mut second = client.observe(&t.uri(&server, "/obs")).await.unwrap();
    let r = second.next().await.unwrap().unwrap();
    assert_eq!(r.code, Code::SERVICE_UNAVAILABLE, "at max_observers");
    assert_eq!(r.options.max_age(), limits_max_age());
    assert!(r.options.observe().is_none());
    assert!(second.next().await.is_none(), "not registered");
    assert_eq!(value.observable.observer_count(), 1);
    value.observable.deleted();
    let gone = obs.next().await.unwrap().unwrap();
    assert_eq!(gone.code, Code::NOT_FOUND);
    assert!(obs.next().await.is_none());
    assert_eq!(value.observable.observer_count(), 0);
    server.shutdown(Duration::ZERO).await;
}

/// Beyond `max_observers_per_ip` a registration gets 4.29 with Max-Age; the relations
/// the address holds go on, and a relation that ends makes room again.
pub async fn an_address_is_held_to_its_observer_budget(t: Transport) {
    let value = Value::new(b"a");
    let limits = ServerLimits {
        max_observers_per_ip: 2,
        ..ServerLimits::default()
    };
    let server = t
        .bind(
            Server::new().route("/obs", value.resource()).limits(limits),
            TcpServerLimits::default(),
        )
        .await;
    let client = Client::new();
    let uri = t.uri(&server, "/obs");
    let mut a = client.observe(&uri).await.unwrap();
    let mut b = client.observe(&uri).await.unwrap();
    for o in [&mut a, &mut b] {
        assert!(o.next().await.unwrap().unwrap().options.observe().is_some());
    }
    let mut c = client.observe(&uri).await.unwrap();
    let refused = c.next().await.unwrap().unwrap();
    assert_eq!(refused.code, Code::TOO_MANY_REQUESTS);
    assert_eq!(refused.options.max_age(), limits_max_age());
    assert!(refused.options.observe().is_none());
    assert_eq!(value.observable.observer_count(), 2);
    value.set(b"b");
    assert_eq!(a.next().await.unwrap().unwrap().payload, b"b");
    drop(a);
    let o = value.observable.clone();
    eventually("the dropped relation ends", || o.observer_count() == 1).await;
    let mut d = client.observe(&uri).await.unwrap();
    assert!(d.next().await.unwrap().unwrap().options.observe().is_some());
    server.shutdown(Duration::ZERO).await;
}

fn limits_max_age() -> u32 {
    ServerLimits::default().uploads.refusal_max_age
}

/// A notification larger than the client's Max-Message-Size comes as a first block
/// (BERT when both announced it, else 1024 bytes); the client fetches the rest.
pub async fn large_notifications_are_completed(t: Transport, bert: bool) {
    let value = Value::new(&body(5000));
    let server = value.serve(t).await;
    let client = Client::new();
    client.set_tcp_config(TcpConfig {
        max_message_size: 2500,
        block_wise_transfer: bert,
        ..TcpConfig::default()
    });
    let mut obs = client.observe(&t.uri(&server, "/obs")).await.unwrap();
    assert_eq!(obs.next().await.unwrap().unwrap().payload, body(5000));
    let bigger = body(9000);
    value.set(&bigger);
    let n = obs.next().await.unwrap().unwrap();
    assert_eq!(n.payload, bigger);
    assert!(n.options.get(opt::BLOCK2).is_none());
    server.shutdown(Duration::ZERO).await;
}

/// A resource that stores a body and returns it, counting handler runs.
fn store(runs: Arc<AtomicUsize>) -> MethodRouter {
    let stored = Arc::new(Mutex::new(Vec::<u8>::new()));
    let (read, write) = (stored.clone(), stored);
    get(move || {
        let v = read.lock().unwrap().clone();
        async move { Response::content(v) }
    })
    .put(move |req: Request| {
        runs.fetch_add(1, Ordering::Relaxed);
        *write.lock().unwrap() = req.payload().to_vec();
        // Echo the body: a large answer to a Block1 upload is fetched with Block2.
        let echo = req.payload().to_vec();
        async move { (Code::CHANGED, echo) }
    })
}

/// A streaming upload resource recording the (offset, length) of every chunk.
fn chunk_log(log: Arc<Mutex<Vec<(usize, usize)>>>, data: Arc<Mutex<Vec<u8>>>) -> MethodRouter {
    MethodRouter::default().stream_upload(Code::PUT, move |chunk: UploadChunk| {
        log.lock().unwrap().push((chunk.offset, chunk.data().len()));
        data.lock().unwrap().extend_from_slice(chunk.data());
        let last = chunk.last;
        async move {
            if last {
                Response::new(Code::CHANGED)
            } else {
                Response::new(Code::CONTINUE)
            }
        }
    })
}

/// Bodies larger than the server's Max-Message-Size go up in Block1 blocks, BERT
/// blocks when both ends announced BERT, `block_size` blocks when the caller asks;
/// the large answer comes back with Block2 and the handler runs once per upload.
pub async fn uploads_larger_than_the_server_accepts(t: Transport) {
    let runs = Arc::new(AtomicUsize::new(0));
    let log = Arc::new(Mutex::new(Vec::new()));
    let streamed = Arc::new(Mutex::new(Vec::new()));
    let limits = TcpServerLimits {
        connection: TcpConfig {
            max_message_size: 8192,
            ..TcpConfig::default()
        },
        ..TcpServerLimits::default()
    };
    let server = t
        .bind(
            Server::new()
                .route("/store", store(runs.clone()))
                .route("/stream", chunk_log(log.clone(), streamed.clone())),
            limits,
        )
        .await;
    let data = body(100_000);
    // Our client, BERT on (the default): the answer (100 kB) fits our limit whole.
    let client = Client::new();
    let r = client
        .put(&t.uri(&server, "/store"), data.clone())
        .await
        .unwrap();
    assert_eq!(r.code, Code::CHANGED);
    assert_eq!(r.payload, data, "byte-exact echo");
    assert_eq!(runs.load(Ordering::Relaxed), 1);
    let r = client.get(&t.uri(&server, "/store")).await.unwrap();
    assert_eq!(r.payload, data, "stored byte-exact");
    // The streaming handler shows the blocks: BERT, multiples of 1024, under 8192.
    let r = client
        .put(&t.uri(&server, "/stream"), data.clone())
        .await
        .unwrap();
    assert_eq!(r.code, Code::CHANGED);
    assert_eq!(*streamed.lock().unwrap(), data);
    {
        let log = log.lock().unwrap();
        let (_, first) = log[0];
        assert!(first > 1024 && first % 1024 == 0 && first < 8192, "{log:?}");
        let mut at = 0;
        for &(offset, len) in log.iter() {
            assert_eq!(offset, at);
            at += len;
        }
    }
    // Asked for 256-byte blocks, it gets 256-byte blocks.
    log.lock().unwrap().clear();
    streamed.lock().unwrap().clear();
    let r = client
        .request(Code::PUT, &t.uri(&server, "/stream"))
        .payload(data[..3000].to_vec())
        .block_size(256)
        .unwrap()
        .send()
        .await
        .unwrap();
    assert_eq!(r.code, Code::CHANGED);
    assert_eq!(*streamed.lock().unwrap(), data[..3000]);
    assert!(log.lock().unwrap().iter().all(|&(_, len)| len <= 256));
    // A client that announces no BERT and accepts small messages: 1024-byte Block1
    // blocks up, the 20 kB answer in Block2 blocks down, from the kept answer.
    let plain = Client::new();
    plain.set_tcp_config(TcpConfig {
        max_message_size: 2000,
        block_wise_transfer: false,
        ..TcpConfig::default()
    });
    log.lock().unwrap().clear();
    let r = plain
        .put(&t.uri(&server, "/stream"), data[..20_000].to_vec())
        .await
        .unwrap();
    assert_eq!(r.code, Code::CHANGED);
    {
        let log = log.lock().unwrap();
        assert!(
            log.len() >= 20 && log.iter().all(|&(_, len)| len <= 1024),
            "{log:?}"
        );
    }
    let runs_before = runs.load(Ordering::Relaxed);
    let r = plain
        .put(&t.uri(&server, "/store"), data[..20_000].to_vec())
        .await
        .unwrap();
    assert_eq!(r.payload, data[..20_000]);
    assert_eq!(
        runs.load(Ordering::Relaxed),
        runs_before + 1,
        "handler ran once"
    );
    server.shutdown(Duration::ZERO).await;
}

/// A representation larger than the client's Max-Message-Size is downloaded in
/// blocks (BERT or not) and reassembled byte-exact.
pub async fn downloads_larger_than_the_client_accepts(t: Transport) {
    let data = body(50_000);
    let served = data.clone();
    let server = t
        .bind(
            Server::new().route(
                "/big",
                get(move || {
                    let d = served.clone();
                    async move { d }
                }),
            ),
            TcpServerLimits::default(),
        )
        .await;
    for bert in [true, false] {
        let client = Client::new();
        client.set_tcp_config(TcpConfig {
            max_message_size: 6000,
            block_wise_transfer: bert,
            ..TcpConfig::default()
        });
        let r = client.get(&t.uri(&server, "/big")).await.unwrap();
        assert_eq!(r.code, Code::CONTENT);
        assert_eq!(r.payload, data, "bert {bert}");
    }
    server.shutdown(Duration::ZERO).await;
}

/// Uploads beyond `max_body` get 4.13 with Size1, over BERT too.
pub async fn too_large_uploads_get_4_13(t: Transport) {
    let server = t
        .bind(
            Server::new()
                .route("/store", store(Arc::default()))
                .limits(ServerLimits {
                    uploads: cobalt::server::UploadLimits {
                        max_body: 10_000,
                        ..Default::default()
                    },
                    ..ServerLimits::default()
                }),
            TcpServerLimits {
                connection: TcpConfig {
                    max_message_size: 4096,
                    ..TcpConfig::default()
                },
                ..TcpServerLimits::default()
            },
        )
        .await;
    let r = Client::new()
        .put(&t.uri(&server, "/store"), body(20_000))
        .await
        .unwrap();
    assert_eq!(r.code, Code::REQUEST_ENTITY_TOO_LARGE);
    assert_eq!(r.options.get_uint(opt::SIZE1), Some(10_000));
    server.shutdown(Duration::ZERO).await;
}

/// A `put` route, for the raw tests' servers.
pub fn put_store() -> MethodRouter {
    put(|req: Request| {
        let n = req.payload().len();
        async move { (Code::CHANGED, format!("{n}")) }
    })
}

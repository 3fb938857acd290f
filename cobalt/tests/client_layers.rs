//! Layers on the client role, over UDP and TCP loopback against a Cobalt server: a
//! request rewritten and refused, a response rewritten and refused, the order of
//! several layers, every notification of an observation seen by the layer, each
//! block of a block-wise transfer passing the layer, and per-exchange state kept
//! between send and receive (the shape an OSCORE layer needs).

use cobalt::proto::message::Message;
use cobalt::server::{get, post, Exchange, Layer, Observable, Refusal, Request, Response, Server};
use cobalt::{Client, Code, Error, Scheme, ServerHandle};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A private elective option (even number) the test layers stamp and the server
/// echoes.
const STAMP: u16 = 65000;

/// Bytes of the large resource: several blocks of 256 bytes.
const BIG: usize = 3000;

fn big_body() -> String {
    (0..BIG)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect()
}

/// A server over UDP and TCP: `/echo` answers a GET with the request's payload and
/// path as the server got them and echoes [`STAMP`]; `/big` is [`BIG`] bytes;
/// `/upload` answers with the length of what was posted; `/count` is observable
/// (`obs`); `/hits` counts the requests that reached the server (`hits`).
async fn start(obs: &Observable, value: Arc<AtomicU32>, hits: Arc<AtomicUsize>) -> ServerHandle {
    Server::new()
        .route(
            "/echo",
            post(move |req: Request| {
                hits.fetch_add(1, Ordering::Relaxed);
                let mut answer = Response::text(format!("{} {}", req.path(), req.text()));
                if let Some(stamp) = req.options().get(STAMP) {
                    answer = answer.with_option(STAMP, stamp);
                }
                async move { answer }
            }),
        )
        .route("/big", get(|| async { big_body() }))
        .route(
            "/upload",
            post(|req: Request| {
                let len = req.payload().len();
                async move { format!("{len} bytes") }
            }),
        )
        .route(
            "/count",
            get(move || {
                let v = value.load(Ordering::Relaxed);
                async move { format!("v{v}") }
            })
            .observable(obs),
        )
        .listen(Scheme::Coap, "127.0.0.1:0")
        .listen(Scheme::CoapTcp, "127.0.0.1:0")
        .shards(1)
        .start()
        .await
        .unwrap()
}

/// The URI of `path` on `server` over `scheme`.
fn uri(server: &ServerHandle, scheme: Scheme, path: &str) -> String {
    format!("{scheme}://{}{path}", server.local_addr(scheme).unwrap())
}

/// Appends `tag` to every request's payload and to every response's payload.
struct Tag(&'static str);

impl Layer for Tag {
    fn on_send(&self, _: &mut Exchange, request: &mut Message) -> Result<(), Refusal> {
        request.payload.extend_from_slice(self.0.as_bytes());
        Ok(())
    }

    fn on_receive(
        &self,
        _: &mut Exchange,
        _: &Message,
        response: &mut Message,
    ) -> Result<(), Refusal> {
        response.payload.extend_from_slice(self.0.as_bytes());
        Ok(())
    }
}

/// Refuses requests to a path starting with `/echo` whose payload says "secret", and
/// responses with a payload that says "leak".
struct Guard;

impl Layer for Guard {
    fn on_send(&self, _: &mut Exchange, request: &mut Message) -> Result<(), Refusal> {
        if request.payload == b"secret" {
            return Err(Refusal::new("will not send a secret"));
        }
        Ok(())
    }

    fn on_receive(
        &self,
        _: &mut Exchange,
        _: &Message,
        response: &mut Message,
    ) -> Result<(), Refusal> {
        if response.payload.ends_with(b"leak") {
            return Err(Refusal::new("the answer leaks"));
        }
        Ok(())
    }
}

#[tokio::test]
async fn layers_rewrite_requests_and_responses_in_order() {
    let hits = Arc::new(AtomicUsize::new(0));
    let server = start(&Observable::new(), Arc::default(), hits.clone()).await;
    let client = Client::new().layer(Tag("<a>")).layer(Tag("<b>"));
    for scheme in [Scheme::Coap, Scheme::CoapTcp] {
        let r = client
            .post(&uri(&server, scheme, "/echo"), "x")
            .await
            .unwrap();
        // Requests pass the layers first to last, responses last to first.
        assert_eq!(r.text_payload(), "/echo x<a><b><b><a>", "{scheme}");
    }
    // The handle the layers were added to is unchanged; clones share them.
    let plain = Client::new();
    let r = plain
        .post(&uri(&server, Scheme::Coap, "/echo"), "x")
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "/echo x");
    let r = client
        .clone()
        .post(&uri(&server, Scheme::Coap, "/echo"), "y")
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "/echo y<a><b><b><a>");
    assert_eq!(hits.load(Ordering::Relaxed), 4);
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn a_layer_refuses_a_request_before_it_is_sent_and_a_response_before_the_caller_sees_it() {
    let hits = Arc::new(AtomicUsize::new(0));
    let server = start(&Observable::new(), Arc::default(), hits.clone()).await;
    let client = Client::new().layer(Guard);
    for scheme in [Scheme::Coap, Scheme::CoapTcp] {
        let echo = uri(&server, scheme, "/echo");
        match client.post(&echo, "secret").await {
            Err(Error::LayerRefused { layer, reason }) => {
                assert!(layer.ends_with("Guard"), "{layer}");
                assert_eq!(reason, "will not send a secret");
            }
            other => panic!("{scheme}: {other:?}"),
        }
        let err = client.post(&echo, "a leak").await.unwrap_err();
        assert!(
            err.to_string().contains("Guard: the answer leaks"),
            "{scheme}: {err}"
        );
        let r = client.post(&echo, "fine").await.unwrap();
        assert_eq!(r.text_payload(), "/echo fine", "{scheme}");
    }
    // The refused requests never reached the server; the others did.
    assert_eq!(hits.load(Ordering::Relaxed), 4);
    server.shutdown(Duration::ZERO).await;
}

/// Records what passes: the Block1 and Block2 numbers of the requests it lets out
/// and of the responses it sees, and appends " seen" to every notification, which
/// must find the mark the layer left on its registration's exchange.
#[derive(Default)]
struct Recorder {
    sent_block1: Mutex<Vec<u32>>,
    sent_block2: Mutex<Vec<u32>>,
    received_block2: Mutex<Vec<u32>>,
    notifications: AtomicUsize,
}

struct Record(Arc<Recorder>);

/// What [`Record`] leaves on the exchange of a registration.
#[derive(Debug, Clone, Copy)]
struct Registered;

impl Layer for Record {
    fn on_send(&self, exchange: &mut Exchange, request: &mut Message) -> Result<(), Refusal> {
        if request.options.observe() == Some(0) {
            exchange.extensions_mut().insert(Registered);
        }
        if let Some(b) = request.block1() {
            self.0.sent_block1.lock().unwrap().push(b.num);
        }
        if let Some(b) = request.block2() {
            self.0.sent_block2.lock().unwrap().push(b.num);
        }
        Ok(())
    }

    fn on_receive(
        &self,
        exchange: &mut Exchange,
        _: &Message,
        response: &mut Message,
    ) -> Result<(), Refusal> {
        if let Some(b) = response.block2() {
            self.0.received_block2.lock().unwrap().push(b.num);
        }
        if response.options.observe().is_some() {
            if exchange.extensions().get::<Registered>().is_none() {
                return Err(Refusal::new(
                    "a notification outside its registration's exchange",
                ));
            }
            self.0.notifications.fetch_add(1, Ordering::Relaxed);
            response.payload.extend_from_slice(b" seen");
        }
        Ok(())
    }
}

#[tokio::test]
async fn every_block_of_a_block_wise_transfer_passes_the_layer() {
    let server = start(&Observable::new(), Arc::default(), Arc::default()).await;
    let blocks = BIG.div_ceil(256) as u32;
    for scheme in [Scheme::Coap, Scheme::CoapTcp] {
        let recorder = Arc::new(Recorder::default());
        let client = Client::new().layer(Record(recorder.clone()));
        let r = client
            .request(Code::GET, &uri(&server, scheme, "/big"))
            .block_size(256)
            .unwrap()
            .send()
            .await
            .unwrap();
        assert_eq!(r.text_payload(), big_body(), "{scheme}");
        let all: Vec<u32> = (0..blocks).collect();
        assert_eq!(*recorder.sent_block2.lock().unwrap(), all, "{scheme}");
        assert_eq!(*recorder.received_block2.lock().unwrap(), all, "{scheme}");

        let r = client
            .request(Code::POST, &uri(&server, scheme, "/upload"))
            .payload(big_body())
            .block_size(256)
            .unwrap()
            .send()
            .await
            .unwrap();
        assert_eq!(r.text_payload(), format!("{BIG} bytes"), "{scheme}");
        assert_eq!(*recorder.sent_block1.lock().unwrap(), all, "{scheme}");
    }
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn every_notification_of_an_observation_passes_the_layer() {
    let obs = Observable::new();
    let value = Arc::new(AtomicU32::new(0));
    let server = start(&obs, value.clone(), Arc::default()).await;
    let recorder = Arc::new(Recorder::default());
    let client = Client::new().layer(Record(recorder.clone()));
    let mut observations = Vec::new();
    for scheme in [Scheme::Coap, Scheme::CoapTcp] {
        let mut o = client
            .observe(&uri(&server, scheme, "/count"))
            .await
            .unwrap();
        let first = o.next().await.unwrap().unwrap();
        assert_eq!(first.text_payload(), "v0 seen", "{scheme}");
        observations.push(o);
    }
    for i in 1..=3u32 {
        value.store(i, Ordering::Relaxed);
        obs.changed();
        for o in &mut observations {
            let n = o.next().await.unwrap().unwrap();
            assert_eq!(n.text_payload(), format!("v{i} seen"));
        }
    }
    // Two registration answers and three notifications on each.
    assert_eq!(recorder.notifications.load(Ordering::Relaxed), 8);
    server.shutdown(Duration::ZERO).await;
}

/// What [`Stamp`] keeps between sending a request and receiving its answer.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sequence(u64);

/// Numbers every request it sends (like OSCORE's Partial IV): the number goes out in
/// [`STAMP`] and stays in the exchange's extensions; the answer must echo it, and
/// must come from the server and over the transport the request went to.
struct Stamp {
    next: AtomicU64,
    server: std::net::SocketAddr,
    scheme: Scheme,
    checked: Arc<AtomicUsize>,
}

impl Layer for Stamp {
    fn on_send(&self, exchange: &mut Exchange, request: &mut Message) -> Result<(), Refusal> {
        assert!(exchange.token().is_none(), "no token before it goes out");
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        exchange.extensions_mut().insert(Sequence(seq));
        request.options.set(STAMP, seq.to_be_bytes());
        Ok(())
    }

    fn on_receive(
        &self,
        exchange: &mut Exchange,
        request: &Message,
        response: &mut Message,
    ) -> Result<(), Refusal> {
        let Some(Sequence(seq)) = exchange.extensions().get::<Sequence>().copied() else {
            return Err(Refusal::new("no sequence number kept for this exchange"));
        };
        if request.options.get(STAMP) != Some(&seq.to_be_bytes()[..]) {
            return Err(Refusal::new("the request went out without its number"));
        }
        if response.options.get(STAMP) != Some(&seq.to_be_bytes()[..]) {
            return Err(Refusal::new(format!("the answer does not echo {seq}")));
        }
        if exchange.token() != Some(&response.token)
            || exchange.peer() != self.server
            || exchange.scheme() != self.scheme
        {
            return Err(Refusal::new("the answer belongs to another exchange"));
        }
        response.options.remove(STAMP);
        self.checked.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[tokio::test]
async fn a_layer_keeps_per_exchange_state_between_send_and_receive() {
    let server = start(&Observable::new(), Arc::default(), Arc::default()).await;
    for scheme in [Scheme::Coap, Scheme::CoapTcp] {
        let checked = Arc::new(AtomicUsize::new(0));
        let client = Client::new().layer(Stamp {
            next: AtomicU64::new(1),
            server: server.local_addr(scheme).unwrap(),
            scheme,
            checked: checked.clone(),
        });
        let echo = uri(&server, scheme, "/echo");
        // Concurrent exchanges each keep their own number.
        let answers =
            futures_util::future::join_all((0..5).map(|i| client.post(&echo, format!("n{i}"))))
                .await;
        for (i, r) in answers.into_iter().enumerate() {
            let r = r.unwrap();
            assert_eq!(r.text_payload(), format!("/echo n{i}"), "{scheme}");
            assert!(
                !r.options.contains(STAMP),
                "{scheme}: the layer took it off"
            );
        }
        assert_eq!(checked.load(Ordering::Relaxed), 5, "{scheme}");
    }
    server.shutdown(Duration::ZERO).await;
}

#[test]
fn the_blocking_client_takes_layers() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(start(&Observable::new(), Arc::default(), Arc::default()));
    let client = cobalt::client::blocking::Client::new()
        .layer(Guard)
        .layer(Tag("!"));
    let echo = uri(&server, Scheme::Coap, "/echo");
    assert_eq!(
        client.post(&echo, "hi").unwrap().text_payload(),
        "/echo hi!!"
    );
    assert!(matches!(
        client.post(&echo, "secret"),
        Err(Error::LayerRefused { .. })
    ));
    rt.block_on(server.shutdown(Duration::ZERO));
}

/// A private critical option (odd number) the protocol does not know.
const PRIVATE_CRITICAL: u16 = 65001;

/// A server layer that marks every answer with [`PRIVATE_CRITICAL`].
struct Mark;

impl Layer for Mark {
    fn on_response(&self, _: &Request, response: &mut Response) {
        response.options.push(PRIVATE_CRITICAL, b"m");
    }
}

/// A client layer that handles [`PRIVATE_CRITICAL`]: declares it, and takes it off
/// the answers it sees.
struct Unmark(Arc<AtomicUsize>);

impl Layer for Unmark {
    fn options(&self) -> &[u16] {
        &[PRIVATE_CRITICAL]
    }

    fn on_receive(
        &self,
        _: &mut Exchange,
        _: &Message,
        response: &mut Message,
    ) -> Result<(), Refusal> {
        if response.options.get(PRIVATE_CRITICAL) == Some(b"m") {
            response.options.remove(PRIVATE_CRITICAL);
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

#[tokio::test]
async fn an_option_declared_by_a_client_layer_passes_and_others_are_rejected() {
    let server = Server::new()
        .route("/marked", get(|| async { "marked" }))
        .layer(Mark)
        .listen(Scheme::Coap, "127.0.0.1:0")
        .listen(Scheme::CoapTcp, "127.0.0.1:0")
        .shards(1)
        .start()
        .await
        .unwrap();
    let unmarked = Arc::new(AtomicUsize::new(0));
    for scheme in [Scheme::Coap, Scheme::CoapTcp] {
        let marked = uri(&server, scheme, "/marked");
        match Client::new().get(&marked).await {
            Err(Error::BadResponseOption { peer, number }) => {
                assert_eq!(number, PRIVATE_CRITICAL, "{scheme}");
                assert_eq!(peer, server.local_addr(scheme).unwrap(), "{scheme}");
            }
            other => panic!("{scheme}: {other:?}"),
        }
        let client = Client::new().layer(Unmark(unmarked.clone()));
        let r = client.get(&marked).await.unwrap();
        assert_eq!(r.text_payload(), "marked", "{scheme}");
        assert!(!r.options.contains(PRIVATE_CRITICAL), "{scheme}");
    }
    assert_eq!(unmarked.load(Ordering::Relaxed), 2);
    server.shutdown(Duration::ZERO).await;
}

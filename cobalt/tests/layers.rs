//! Layers on a running server, over the transports: authorisation by PSK identity
//! over coaps and coaps+tcp (and by certificate subject), a layer that rewrites
//! answers, one that sees every notification once per observer, options declared by a
//! layer passing both protocol machines, proxy requests reaching a layer that declares
//! Proxy-Uri, and a concurrency limit with handlers that wait on a channel.

use cobalt::server::layers::ConcurrencyLimit;
#[cfg(feature = "openssl")]
use cobalt::server::layers::{Authorize, PskAllowList};
use cobalt::server::{get, Layer, Observable, Observer, Request, Response, Server};
use cobalt::{Client, Code, Scheme, ServerHandle};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A resource that says which PSK identity or certificate subject asked.
#[cfg(feature = "openssl")]
fn whoami() -> cobalt::server::MethodRouter {
    get(|req: Request| async move {
        let id = req.identity();
        match (id.psk_identity(), id.certificate_subject()) {
            (Some(psk), _) => format!("psk {}", String::from_utf8_lossy(psk)),
            (_, Some(subject)) => format!("cert {subject}"),
            _ => format!("anonymous over {}", id.scheme()),
        }
    })
}

#[cfg(feature = "openssl")]
mod common;

#[cfg(feature = "openssl")]
mod secure {
    use super::*;
    use cobalt::transport::credentials::PskStore;

    fn keys() -> PskStore {
        PskStore::new()
            .with("operator", "operator-key")
            .with("device", "device-key")
    }

    /// /admin for the PSK identity "operator" only; /open for everyone.
    async fn start() -> ServerHandle {
        Server::new()
            .route("/admin/whoami", whoami())
            .route("/open/whoami", whoami())
            .layer(Authorize::psk(
                PskAllowList::new().allow("/admin", ["operator"]),
            ))
            .psk(keys())
            .shards(1)
            .listen(Scheme::Coaps, "127.0.0.1:0")
            .listen(Scheme::CoapsTcp, "127.0.0.1:0")
            .listen(Scheme::Coap, "127.0.0.1:0")
            .start()
            .await
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_layer_rejects_by_psk_identity_over_coaps_and_coaps_tcp() {
        let server = start().await;
        for scheme in [Scheme::Coaps, Scheme::CoapsTcp] {
            let addr = server.local_addr(scheme).unwrap();
            let uri = |path: &str| format!("{scheme}://{addr}{path}");
            let operator = Client::new().with_psk("operator", "operator-key");
            let r = operator.get(&uri("/admin/whoami")).await.unwrap();
            assert_eq!(r.code, Code::CONTENT, "{scheme}");
            assert_eq!(r.text_payload(), "psk operator", "{scheme}");

            let device = Client::new().with_psk("device", "device-key");
            let r = device.get(&uri("/admin/whoami")).await.unwrap();
            assert_eq!(r.code, Code::FORBIDDEN, "{scheme}");
            let r = device.get(&uri("/open/whoami")).await.unwrap();
            assert_eq!(r.text_payload(), "psk device", "{scheme}");
        }
        // Without a credential: 4.01 (come back with one).
        let plain = server.local_addr(Scheme::Coap).unwrap();
        let r = Client::new()
            .get(&format!("coap://{plain}/admin/whoami"))
            .await
            .unwrap();
        assert_eq!(r.code, Code::UNAUTHORIZED);
        let r = Client::new()
            .get(&format!("coap://{plain}/open/whoami"))
            .await
            .unwrap();
        assert_eq!(r.text_payload(), "anonymous over coap");
        server.shutdown(Duration::ZERO).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_verified_client_certificate_is_the_identity_over_coaps_tcp() {
        let pki = common::TestCredentials::generate("Layers CA");
        let server = Server::new()
            .route("/whoami", whoami())
            .x509(pki.server.clone())
            .listen(Scheme::CoapsTcp, "127.0.0.1:0")
            .start()
            .await
            .unwrap();
        let addr = server.local_addr(Scheme::CoapsTcp).unwrap();
        let r = Client::new()
            .with_x509(pki.client.clone())
            .get(&format!("coaps+tcp://{addr}/whoami"))
            .await
            .unwrap();
        assert_eq!(r.text_payload(), "cert CN=Layers CA client");
        server.shutdown(Duration::ZERO).await;
    }
}

/// Rewrites every answer: a header in the payload and the option 65000 (elective).
struct Stamp;

impl Layer for Stamp {
    fn on_response(&self, request: &Request, response: &mut Response) {
        let mut payload = format!("[{} {}] ", request.path(), response.code).into_bytes();
        payload.extend_from_slice(&response.payload);
        response.payload = payload;
        response.options.set(65000, b"stamped".as_slice());
    }
}

#[tokio::test]
async fn a_layer_rewrites_answers_including_routing_errors_over_udp_and_tcp() {
    let server = Server::new()
        .route("/hello", get(|| async { "hello" }))
        .layer(Stamp)
        .listen(Scheme::Coap, "127.0.0.1:0")
        .listen(Scheme::CoapTcp, "127.0.0.1:0")
        .shards(1)
        .start()
        .await
        .unwrap();
    for scheme in [Scheme::Coap, Scheme::CoapTcp] {
        let addr = server.local_addr(scheme).unwrap();
        let r = Client::new()
            .get(&format!("{scheme}://{addr}/hello"))
            .await
            .unwrap();
        assert_eq!(r.text_payload(), "[/hello 2.05 Content] hello", "{scheme}");
        assert_eq!(r.options.get(65000), Some(&b"stamped"[..]));
        let r = Client::new()
            .get(&format!("{scheme}://{addr}/missing"))
            .await
            .unwrap();
        assert_eq!(r.code, Code::NOT_FOUND);
        assert!(
            r.text_payload().starts_with("[/missing 4.04 Not Found]"),
            "{scheme}"
        );
    }
    server.shutdown(Duration::ZERO).await;
}

/// Numbers each observer's notifications itself: the payload gets `#n` where n counts
/// the notifications this observer (address and token) got from the layer.
type Counts = Arc<Mutex<HashMap<(std::net::SocketAddr, Vec<u8>), u32>>>;

struct PerObserver(Counts);

impl Layer for PerObserver {
    fn on_notification(&self, observer: &Observer<'_>, notification: &mut Response) {
        let mut seen = self.0.lock().unwrap();
        let n = seen
            .entry((observer.peer(), observer.token().as_bytes().to_vec()))
            .or_default();
        *n += 1;
        notification
            .payload
            .extend_from_slice(format!(" #{n}").as_bytes());
    }
}

#[tokio::test]
async fn a_layer_sees_every_notification_once_per_observer() {
    let obs = Observable::new();
    let value = Arc::new(Mutex::new(0u32));
    let read = value.clone();
    let counts = Counts::default();
    let server = Server::new()
        .route(
            "/count",
            get(move || {
                let v = *read.lock().unwrap();
                async move { format!("v{v}") }
            })
            .observable(&obs),
        )
        .layer(PerObserver(counts.clone()))
        .listen(Scheme::Coap, "127.0.0.1:0")
        .listen(Scheme::CoapTcp, "127.0.0.1:0")
        .shards(1)
        .start()
        .await
        .unwrap();
    let udp = server.local_addr(Scheme::Coap).unwrap();
    let tcp = server.local_addr(Scheme::CoapTcp).unwrap();
    let mut observations = Vec::new();
    for uri in [
        format!("coap://{udp}/count"),
        format!("coap://{udp}/count"),
        format!("coap+tcp://{tcp}/count"),
    ] {
        let mut o = Client::new().observe(&uri).await.unwrap();
        let first = o.next().await.unwrap().unwrap();
        assert_eq!(first.text_payload(), "v0"); // the registration's answer
        observations.push(o);
    }
    for i in 1..=3u32 {
        *value.lock().unwrap() = i;
        obs.changed();
        for o in &mut observations {
            let n = o.next().await.unwrap().unwrap();
            assert_eq!(n.text_payload(), format!("v{i} #{i}"));
        }
    }
    let seen = counts.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "three observers: {seen:?}");
    assert!(seen.values().all(|n| *n == 3), "{seen:?}");
    server.shutdown(Duration::ZERO).await;
}

/// Handles the OSCORE option (9) and a private critical option (65001): answers with
/// the values it found, and takes them off the request.
struct Unwrap;

impl Layer for Unwrap {
    fn options(&self) -> &[u16] {
        &[9, 65001]
    }

    fn on_request(&self, request: &mut Request) -> Result<(), Response> {
        let found: Vec<String> = [9u16, 65001]
            .into_iter()
            .filter(|n| request.options().contains(*n))
            .map(|n| n.to_string())
            .collect();
        for n in [9, 65001] {
            request.message_mut().options.remove(n);
        }
        request.extensions_mut().insert(found);
        Ok(())
    }
}

#[tokio::test]
async fn options_declared_by_a_layer_pass_both_machines_and_others_get_4_02() {
    let server = Server::new()
        .route(
            "/opt",
            get(|req: Request| async move {
                let found = req.extensions().get::<Vec<String>>().cloned();
                format!("handled {}", found.unwrap_or_default().join(","))
            }),
        )
        .layer(Unwrap)
        .listen(Scheme::Coap, "127.0.0.1:0")
        .listen(Scheme::CoapTcp, "127.0.0.1:0")
        .shards(1)
        .start()
        .await
        .unwrap();
    for scheme in [Scheme::Coap, Scheme::CoapTcp] {
        let uri = format!("{scheme}://{}/opt", server.local_addr(scheme).unwrap());
        let client = Client::new();
        let r = client
            .request(Code::GET, &uri)
            .option(9, [0x09])
            .option(65001, b"x")
            .send()
            .await
            .unwrap();
        assert_eq!(r.code, Code::CONTENT, "{scheme}");
        assert_eq!(r.text_payload(), "handled 9,65001", "{scheme}");
        let r = client
            .request(Code::GET, &uri)
            .option(65003, b"x")
            .send()
            .await
            .unwrap();
        assert_eq!(r.code, Code::BAD_OPTION, "{scheme}");
    }
    server.shutdown(Duration::ZERO).await;
}

/// A stand-in for a forward proxy: declares Proxy-Uri and answers proxy requests.
struct Forward;

impl Layer for Forward {
    fn options(&self) -> &[u16] {
        &[cobalt::proto::message::opt::PROXY_URI]
    }

    fn on_request(&self, request: &mut Request) -> Result<(), Response> {
        let Some(target) = request
            .options()
            .get(cobalt::proto::message::opt::PROXY_URI)
        else {
            return Ok(());
        };
        let target = String::from_utf8_lossy(target).into_owned();
        Err(Response::text(format!("would forward to {target}")))
    }
}

#[tokio::test]
async fn proxy_requests_reach_a_layer_that_declares_proxy_uri() {
    let with = Server::new()
        .route("/local", get(|| async { "local" }))
        .layer(Forward)
        .shards(1)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let without = Server::new()
        .route("/local", get(|| async { "local" }))
        .shards(1)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let proxied = |server: &ServerHandle| {
        let addr = server.local_addr(Scheme::Coap).unwrap();
        Client::new()
            .request(Code::GET, &format!("coap://{addr}/"))
            .option(
                cobalt::proto::message::opt::PROXY_URI,
                b"coap://origin.example/x",
            )
            .send()
    };
    let r = proxied(&with).await.unwrap();
    assert_eq!(r.text_payload(), "would forward to coap://origin.example/x");
    let r = proxied(&without).await.unwrap();
    assert_eq!(r.code, Code::PROXYING_NOT_SUPPORTED);
    with.shutdown(Duration::ZERO).await;
    without.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_limit_answers_5_03_while_handlers_wait() {
    let (release_tx, release_rx) = tokio::sync::watch::channel(false);
    let (entered_tx, mut entered_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let server = Server::new()
        .route(
            "/slow",
            get(move || {
                let mut release = release_rx.clone();
                let entered = entered_tx.clone();
                async move {
                    let _ = entered.send(());
                    let _ = release.wait_for(|r| *r).await;
                    "done"
                }
            }),
        )
        .layer(ConcurrencyLimit::new(1).max_age(7))
        .shards(1)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let uri = format!("coap://{}/slow", server.local_addr(Scheme::Coap).unwrap());
    let first = tokio::spawn({
        let uri = uri.clone();
        async move { Client::new().get(&uri).await }
    });
    entered_rx.recv().await.unwrap(); // the first handler runs and waits
    let refused = Client::new().get(&uri).await.unwrap();
    assert_eq!(refused.code, Code::SERVICE_UNAVAILABLE);
    assert_eq!(
        refused
            .options
            .get_uint(cobalt::proto::message::opt::MAX_AGE),
        Some(7)
    );
    release_tx.send(true).unwrap();
    assert_eq!(first.await.unwrap().unwrap().text_payload(), "done");
    // Its place is free again.
    assert_eq!(
        Client::new().get(&uri).await.unwrap().text_payload(),
        "done"
    );
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn a_timeout_layer_answers_5_03_for_a_handler_that_does_not_answer() {
    let (_never_tx, never_rx) = tokio::sync::watch::channel(false);
    let server = Server::new()
        .route(
            "/stuck",
            get(move || {
                let mut never = never_rx.clone();
                async move {
                    let _ = never.wait_for(|v| *v).await;
                    "unreachable"
                }
            }),
        )
        .route("/quick", get(|| async { "quick" }))
        .layer(cobalt::server::layers::Timeout::new(Duration::from_millis(
            50,
        )))
        .shards(1)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::Coap).unwrap();
    let r = Client::new()
        .get(&format!("coap://{addr}/stuck"))
        .await
        .unwrap();
    assert_eq!(r.code, Code::SERVICE_UNAVAILABLE);
    assert!(
        r.text_payload().contains("did not answer within"),
        "{}",
        r.text_payload()
    );
    let r = Client::new()
        .get(&format!("coap://{addr}/quick"))
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "quick");
    server.shutdown(Duration::ZERO).await;
}

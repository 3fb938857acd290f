//! The CoAP front end to end over loopback: a counting origin behind the proxy.

mod common;

use cobalt::proto::message::opt;
use cobalt::{Client, Code, Scheme, Server, ServerHandle};
use cobalt_proxy::{
    AllowList, CoapFront, HttpsTrust, ManualClock, Proxy, ProxyConfig, ReverseRoute,
    HOP_LIMIT_REACHED,
};
use common::{https_origin, origin, IMPATIENT, PATIENT};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

async fn start_proxy(
    config: ProxyConfig,
    clock: Option<ManualClock>,
) -> (ServerHandle, SocketAddr, Proxy) {
    let proxy = match clock {
        Some(c) => {
            let client = Client::with_config(cobalt::EndpointConfig {
                nstart: config.upstream_nstart * config.upstream_endpoints,
                ..cobalt::EndpointConfig::default()
            })
            .unwrap();
            Proxy::with_parts(config, Arc::new(c), client)
        }
        None => Proxy::new(config),
    };
    let front = CoapFront::new(proxy.clone());
    let server = front
        .install(Server::new())
        .shards(1)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::Coap).unwrap();
    (server, addr, proxy)
}

fn loopback() -> ProxyConfig {
    ProxyConfig {
        allow: AllowList::parse(["127.0.0.0/8"]).unwrap(),
        upstream_timeout: PATIENT,
        ..ProxyConfig::default()
    }
}

async fn via(client: &Client, proxy: SocketAddr, target: &str) -> cobalt::Response {
    client
        .request(Code::GET, &format!("coap://{proxy}/"))
        .option(opt::PROXY_URI, target)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_origin_sees_one_request_per_freshness_period_and_revalidations() {
    let origin = origin().await;
    let clock = ManualClock::new();
    let (server, proxy_addr, proxy) = start_proxy(loopback(), Some(clock.clone())).await;
    let client = Client::new();
    let target = format!("coap://{}/count", origin.addr);
    for _ in 0..5 {
        let r = via(&client, proxy_addr, &target).await;
        assert_eq!(
            (r.code, r.text_payload().as_str()),
            (Code::CONTENT, "counted")
        );
    }
    assert_eq!(
        origin.counts.requests.load(Ordering::SeqCst),
        1,
        "4 of 5 from the cache"
    );
    assert_eq!(
        origin.counts.with_hop_limit.load(Ordering::SeqCst),
        1,
        "Hop-Limit was added"
    );
    let m = proxy.metrics();
    assert_eq!(
        (
            m.cache_hits.load(Ordering::SeqCst),
            m.cache_misses.load(Ordering::SeqCst)
        ),
        (4, 1)
    );

    // A client that holds the ETag is answered 2.03 from the cache.
    let r = client
        .request(Code::GET, &format!("coap://{proxy_addr}/"))
        .option(opt::PROXY_URI, &target)
        .option(opt::ETAG, b"v1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.code, Code::VALID);
    assert_eq!(origin.counts.requests.load(Ordering::SeqCst), 1);

    // Past Max-Age: one revalidation (2.03 upstream), then fresh again.
    clock.advance(Duration::from_secs(11));
    for _ in 0..3 {
        let r = via(&client, proxy_addr, &target).await;
        assert_eq!(
            (r.code, r.text_payload().as_str()),
            (Code::CONTENT, "counted")
        );
    }
    assert_eq!(origin.counts.requests.load(Ordering::SeqCst), 2);
    assert_eq!(m.revalidated.load(Ordering::SeqCst), 1);
    clock.advance(Duration::from_secs(11));
    via(&client, proxy_addr, &target).await;
    assert_eq!(origin.counts.requests.load(Ordering::SeqCst), 3);
    server.shutdown(Duration::ZERO).await;
    origin.server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn proxy_scheme_with_uri_options_reaches_the_same_cached_answer() {
    let origin = origin().await;
    let (server, proxy_addr, _) = start_proxy(loopback(), None).await;
    let client = Client::new();
    via(
        &client,
        proxy_addr,
        &format!("coap://{}/count", origin.addr),
    )
    .await;
    let r = client
        .request(Code::GET, &format!("coap://{proxy_addr}/count"))
        .option(opt::PROXY_SCHEME, "coap")
        .option(opt::URI_HOST, "127.0.0.1")
        .option(
            opt::URI_PORT,
            cobalt::proto::message::option::encode_uint(u32::from(origin.addr.port())),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "counted");
    assert_eq!(origin.counts.requests.load(Ordering::SeqCst), 1);
    server.shutdown(Duration::ZERO).await;
    origin.server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn block_wise_both_ways_through_the_proxy() {
    let origin = origin().await;
    let (server, proxy_addr, _) = start_proxy(loopback(), None).await;
    let client = Client::new();
    let r = via(
        &client,
        proxy_addr,
        &format!("coap://{}/large", origin.addr),
    )
    .await;
    assert_eq!(r.payload.len(), 5000);
    assert!(r
        .payload
        .iter()
        .enumerate()
        .all(|(i, b)| *b == (i % 251) as u8));
    let body: Vec<u8> = (0..3000u32).map(|i| (i % 7) as u8).collect();
    let r = client
        .request(Code::POST, &format!("coap://{proxy_addr}/"))
        .option(opt::PROXY_URI, format!("coap://{}/echo", origin.addr))
        .payload(body.clone())
        .block_size(256)
        .unwrap()
        .send()
        .await
        .unwrap();
    assert_eq!((r.code, r.payload), (Code::CHANGED, body));
    server.shutdown(Duration::ZERO).await;
    origin.server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn origin_down_is_5_02_and_silent_is_5_04() {
    let origin = origin().await;
    let (server, proxy_addr, _) = start_proxy(loopback(), None).await;
    let client = Client::new();
    let closed = cobalt_test_support::ports::free_udp_port("127.0.0.1".parse().unwrap());
    let r = via(&client, proxy_addr, &format!("coap://127.0.0.1:{closed}/x")).await;
    assert_eq!(r.code, Code::BAD_GATEWAY, "{}", r.text_payload());
    // While one request waits for a silent origin, others are served.
    let silent = format!("coap://{}/silent", origin.addr);
    let waiting = tokio::spawn({
        let (client, silent) = (client.clone(), silent.clone());
        async move { via(&client, proxy_addr, &silent).await }
    });
    let r = via(
        &client,
        proxy_addr,
        &format!("coap://{}/count", origin.addr),
    )
    .await;
    assert_eq!(r.code, Code::CONTENT);
    assert!(!waiting.is_finished());
    waiting.abort();
    // A proxy asked only for the silent origin, so that its short wait can end
    // nothing else (on a loaded machine a short wait also ends slow answers).
    let (impatient, impatient_addr, proxy) = start_proxy(
        ProxyConfig {
            upstream_timeout: IMPATIENT,
            ..loopback()
        },
        None,
    )
    .await;
    let r = via(&client, impatient_addr, &silent).await;
    assert_eq!(r.code, Code::GATEWAY_TIMEOUT, "{}", r.text_payload());
    assert_eq!(proxy.metrics().upstream_timeouts.load(Ordering::SeqCst), 1);
    impatient.shutdown(Duration::ZERO).await;
    server.shutdown(Duration::ZERO).await;
    origin.server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn forbidden_malformed_and_oversized_targets_are_refused() {
    let origin = origin().await;
    let config = ProxyConfig {
        allow: AllowList::parse([format!("127.0.0.1:{}", origin.addr.port()).as_str()]).unwrap(),
        ..loopback()
    };
    let (server, proxy_addr, _) = start_proxy(config, None).await;
    let client = Client::new();
    let r = via(&client, proxy_addr, "coap://127.0.0.1:9/x").await;
    assert_eq!(r.code, Code::PROXYING_NOT_SUPPORTED);
    assert!(
        r.text_payload().contains("allow-list"),
        "{}",
        r.text_payload()
    );
    let r = via(&client, proxy_addr, "coap://localhost.invalid/x").await;
    assert_eq!(
        r.code,
        Code::PROXYING_NOT_SUPPORTED,
        "a name that is not allowed"
    );
    let r = via(&client, proxy_addr, "http://example.org/").await;
    assert_eq!(r.code, Code::PROXYING_NOT_SUPPORTED);
    let r = via(&client, proxy_addr, "coap://[::1/x").await;
    assert_eq!(r.code, Code::BAD_REQUEST, "{}", r.text_payload());
    let long = format!("coap://{}/{}", origin.addr, "a".repeat(1100));
    let r = via(&client, proxy_addr, &long).await;
    assert_eq!(r.code, Code::BAD_OPTION, "{}", r.text_payload());
    // Not a proxy request and no reverse route: 4.04.
    let r = client
        .get(&format!("coap://{proxy_addr}/anything"))
        .await
        .unwrap();
    assert_eq!(r.code, Code::NOT_FOUND);
    // The allowed origin is served.
    let r = via(
        &client,
        proxy_addr,
        &format!("coap://{}/count", origin.addr),
    )
    .await;
    assert_eq!(r.code, Code::CONTENT);
    server.shutdown(Duration::ZERO).await;
    origin.server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn an_open_proxy_is_off_unless_configured() {
    let origin = origin().await;
    let config = ProxyConfig {
        allow: AllowList::new(),
        ..loopback()
    };
    let (server, proxy_addr, _) = start_proxy(config, None).await;
    let r = via(
        &Client::new(),
        proxy_addr,
        &format!("coap://{}/count", origin.addr),
    )
    .await;
    assert_eq!(r.code, Code::PROXYING_NOT_SUPPORTED);
    assert_eq!(origin.counts.requests.load(Ordering::SeqCst), 0);
    server.shutdown(Duration::ZERO).await;
    origin.server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn a_reverse_route_to_itself_ends_in_5_08_with_the_proxy_identity() {
    let port = cobalt_test_support::ports::free_udp_port("127.0.0.1".parse().unwrap());
    let config = ProxyConfig {
        identity: "loop-proxy".into(),
        reverse: vec![format!("/loop=coap://127.0.0.1:{port}/loop")
            .parse::<ReverseRoute>()
            .unwrap()],
        upstream_timeout: Duration::from_secs(30),
        ..ProxyConfig::default()
    };
    let proxy = Proxy::new(config);
    let server = CoapFront::new(proxy)
        .install(Server::new())
        .shards(1)
        .bind(format!("127.0.0.1:{port}"))
        .await
        .unwrap();
    let r = Client::new()
        .get(&format!("coap://127.0.0.1:{port}/loop/x"))
        .await
        .unwrap();
    assert_eq!(r.code, HOP_LIMIT_REACHED);
    assert_eq!(r.text_payload(), "loop-proxy");
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn a_reverse_route_maps_its_prefix_to_the_origin() {
    let origin = origin().await;
    let config = ProxyConfig {
        reverse: vec![format!("/o=coap://{}/", origin.addr).parse().unwrap()],
        ..ProxyConfig::default() // no allow-list needed for a reverse route
    };
    let (server, proxy_addr, _) = start_proxy(config, None).await;
    let r = Client::new()
        .get(&format!("coap://{proxy_addr}/o/count"))
        .await
        .unwrap();
    assert_eq!(
        (r.code, r.text_payload().as_str()),
        (Code::CONTENT, "counted")
    );
    server.shutdown(Duration::ZERO).await;
    origin.server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn one_upstream_observation_serves_100_downstream_observers() {
    let origin = origin().await;
    let (server, proxy_addr, proxy) = start_proxy(loopback(), None).await;
    let target = format!("coap://{}/temp", origin.addr);
    let clients: Vec<Client> = (0..10).map(|_| Client::new()).collect();
    let mut registering = Vec::new();
    for client in &clients {
        for _ in 0..10 {
            let (client, target) = (client.clone(), target.clone());
            registering.push(tokio::spawn(async move {
                let mut o = client
                    .request(Code::GET, &format!("coap://{proxy_addr}/"))
                    .option(opt::PROXY_URI, &target)
                    .observe()
                    .await
                    .unwrap();
                let first = o.next().await.unwrap().unwrap();
                assert_eq!(first.text_payload(), "t1");
                o
            }));
        }
    }
    let mut observations = Vec::new();
    for r in registering {
        observations.push(r.await.unwrap());
    }
    let registrations = || origin.counts.registrations.lock().unwrap().len();
    assert_eq!(registrations(), 1, "one upstream registration");
    assert_eq!(proxy.observations(), 1);
    origin.temp.changed();
    for o in &mut observations {
        let n = tokio::time::timeout(Duration::from_secs(20), o.next())
            .await
            .expect("a notification")
            .unwrap()
            .unwrap();
        assert_eq!(n.text_payload(), "t1");
        assert!(n.options.observe().is_some());
    }
    assert_eq!(registrations(), 1);
    server.shutdown(Duration::ZERO).await;
    origin.server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn coap_to_http_reaches_an_http_origin_and_maps_its_answer() {
    let origin = cobalt_proxy::serve_metrics(
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(|| "up 1\n".to_string()),
    )
    .await
    .unwrap();
    let (server, proxy_addr, _) = start_proxy(loopback(), None).await;
    let client = Client::new();
    let base = format!("http://{}", origin.local_addr());
    let r = via(&client, proxy_addr, &format!("{base}/metrics")).await;
    assert_eq!(
        (r.code, r.text_payload().as_str()),
        (Code::CONTENT, "up 1\n")
    );
    let r = via(&client, proxy_addr, &format!("{base}/elsewhere")).await;
    assert_eq!(r.code, Code::NOT_FOUND);
    let r = client
        .request(Code::GET, &format!("coap://{proxy_addr}/metrics"))
        .option(opt::PROXY_SCHEME, "http")
        .option(opt::URI_HOST, "127.0.0.1")
        .option(
            opt::URI_PORT,
            cobalt::proto::message::option::encode_uint(u32::from(origin.local_addr().port())),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "up 1\n");
    let r = via(&client, proxy_addr, "http://192.0.2.1/").await;
    assert_eq!(
        r.code,
        Code::PROXYING_NOT_SUPPORTED,
        "not in the allow-list"
    );
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn coap_to_https_reaches_an_origin_whose_ca_was_added() {
    let origin = https_origin("127.0.0.1").await;
    let config = ProxyConfig {
        https_trust: HttpsTrust::default()
            .with_pem(origin.ca_pem.as_bytes(), "the test CA")
            .unwrap(),
        ..loopback()
    };
    let (server, proxy_addr, _) = start_proxy(config, None).await;
    let client = Client::new();
    let r = via(&client, proxy_addr, &format!("https://{}/x", origin.addr)).await;
    assert_eq!(
        (r.code, r.text_payload().as_str()),
        (Code::CONTENT, "over TLS")
    );
    assert_eq!(r.options.content_format(), Some(0), "text/plain");
    let r = client
        .request(Code::GET, &format!("coap://{proxy_addr}/x"))
        .option(opt::PROXY_SCHEME, "https")
        .option(opt::URI_HOST, "127.0.0.1")
        .option(
            opt::URI_PORT,
            cobalt::proto::message::option::encode_uint(u32::from(origin.addr.port())),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        (r.code, r.text_payload().as_str()),
        (Code::CONTENT, "over TLS")
    );
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn an_https_origin_that_does_not_verify_is_5_02_saying_why() {
    let untrusted = https_origin("127.0.0.1").await;
    let misnamed = https_origin("other.example").await;
    let config = ProxyConfig {
        https_trust: HttpsTrust::default()
            .with_pem(misnamed.ca_pem.as_bytes(), "the misnamed origin's CA")
            .unwrap(),
        ..loopback()
    };
    let (server, proxy_addr, proxy) = start_proxy(config, None).await;
    let client = Client::new();
    for origin in [&untrusted, &misnamed] {
        let r = via(&client, proxy_addr, &format!("https://{}/", origin.addr)).await;
        assert_eq!(r.code, Code::BAD_GATEWAY, "{}", r.text_payload());
    }
    assert_eq!(
        proxy.metrics().upstream_unreachable.load(Ordering::SeqCst),
        2
    );
    // What the 5.02 says (a CoAP client whose address the proxy has not verified yet
    // gets no diagnostic longer than three times its request: RFC 9175 §2.4).
    let why = |origin: &common::HttpsOrigin| {
        let mut options = cobalt::proto::message::Options::new();
        options.set(
            opt::PROXY_URI,
            format!("https://{}/", origin.addr).as_bytes(),
        );
        let target = cobalt_proxy::http_target(&options).unwrap().unwrap();
        let proxy = proxy.clone();
        async move {
            let e = proxy
                .forward_http(Code::GET, &target, &options, Vec::new())
                .await
                .unwrap_err();
            assert_eq!(e.to_response().code, Code::BAD_GATEWAY);
            e.to_string()
        }
    };
    let text = why(&untrusted).await;
    assert!(text.contains("UnknownIssuer"), "{text}");
    assert!(text.contains("--http-ca"), "{text}");
    let text = why(&misnamed).await;
    assert!(text.contains("not valid for name"), "{text}");
    assert!(!text.contains("--http-ca"), "a CA does not help: {text}");
    // Plain http to a TLS port is no TLS failure but no answer either.
    let r = via(&client, proxy_addr, &format!("http://{}/", untrusted.addr)).await;
    assert_eq!(r.code, Code::BAD_GATEWAY, "{}", r.text_payload());
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn concurrent_misses_for_one_resource_ask_the_origin_once() {
    let origin = origin().await;
    let (server, proxy_addr, proxy) = start_proxy(loopback(), None).await;
    let target = format!("coap://{}/slow-count", origin.addr);
    let asking: Vec<_> = (0..20)
        .map(|_| {
            let target = target.clone();
            tokio::spawn(async move { via(&Client::new(), proxy_addr, &target).await })
        })
        .collect();
    for a in asking {
        assert_eq!(a.await.unwrap().text_payload(), "slowly counted");
    }
    assert_eq!(origin.counts.slow_requests.load(Ordering::SeqCst), 1);
    let m = proxy.metrics();
    let coalesced = m.coalesced.load(Ordering::SeqCst);
    let hits = m.cache_hits.load(Ordering::SeqCst);
    assert_eq!(coalesced + hits, 19, "the other 19 waited or came later");
    server.shutdown(Duration::ZERO).await;
    origin.server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn a_change_through_the_proxy_makes_the_stored_answer_stale() {
    let origin = origin().await;
    let (server, proxy_addr, proxy) = start_proxy(loopback(), None).await;
    let client = Client::new();
    let target = format!("coap://{}/echo", origin.addr);
    // /echo answers GET 4.05, which is cacheable (RFC 7252 §5.9.2).
    for _ in 0..2 {
        assert_eq!(
            via(&client, proxy_addr, &target).await.code,
            Code::METHOD_NOT_ALLOWED
        );
    }
    let m = proxy.metrics();
    assert_eq!(
        (
            m.cache_misses.load(Ordering::SeqCst),
            m.cache_hits.load(Ordering::SeqCst)
        ),
        (1, 1)
    );
    let r = client
        .request(Code::POST, &format!("coap://{proxy_addr}/"))
        .option(opt::PROXY_URI, &target)
        .payload("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.code, Code::CHANGED);
    via(&client, proxy_addr, &target).await;
    assert_eq!(
        m.cache_misses.load(Ordering::SeqCst),
        2,
        "2.04 made the stored 4.05 stale"
    );
    server.shutdown(Duration::ZERO).await;
    origin.server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn a_coaps_origin_is_reached_with_the_configured_psk() {
    use cobalt::server::get;
    use cobalt::transport::credentials::{ClientCredentials, ClientPsk, PskStore};
    let origin = Server::new()
        .route("/hello", get(|| async { "hello over DTLS" }))
        .psk(PskStore::new().with("proxy", b"secret-key".to_vec()))
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .shards(1)
        .start()
        .await
        .unwrap();
    let at = origin.local_addr(Scheme::Coaps).unwrap();
    let target = format!("coaps://{at}/hello");
    let (without, proxy_addr, _) = start_proxy(loopback(), None).await;
    let r = via(&Client::new(), proxy_addr, &target).await;
    assert_eq!(
        r.code,
        Code::BAD_GATEWAY,
        "no credentials: {}",
        r.text_payload()
    );
    without.shutdown(Duration::ZERO).await;
    let config = ProxyConfig {
        upstream_credentials: Some(ClientCredentials::Psk(ClientPsk::new(
            "proxy",
            "secret-key",
        ))),
        ..loopback()
    };
    let proxy = Proxy::new(config);
    let server = CoapFront::new(proxy)
        .install(Server::new())
        .shards(1)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let proxy_addr = server.local_addr(Scheme::Coap).unwrap();
    let r = via(&Client::new(), proxy_addr, &target).await;
    assert_eq!(
        (r.code, r.text_payload().as_str()),
        (Code::CONTENT, "hello over DTLS")
    );
    server.shutdown(Duration::ZERO).await;
    origin.shutdown(Duration::ZERO).await;
}

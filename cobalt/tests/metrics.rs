//! End to end: a server configured from TOML serves CoAP and its Prometheus metrics.

use cobalt::config::Config;
use cobalt::metrics::serve_metrics;
use cobalt::server::{get, Observable};
use cobalt::Scheme;
use cobalt::{Client, Code, Server};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn fetch(addr: SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// Sums every series of each metric over its `shard` label: `name` or
/// `name{class="2xx"}` → value.
fn totals(body: &str) -> HashMap<String, u64> {
    let mut sums = HashMap::new();
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let rest: Vec<&str> = labels
            .trim_end_matches('}')
            .split(',')
            .filter(|l| !l.is_empty() && !l.starts_with("shard="))
            .collect();
        let key = if rest.is_empty() {
            name.to_string()
        } else {
            format!("{name}{{{}}}", rest.join(","))
        };
        *sums.entry(key).or_insert(0) += value.parse::<u64>().unwrap();
    }
    sums
}

#[tokio::test]
async fn counters_rise_with_traffic_and_are_served_over_http() {
    let config = Config::loader()
        .toml(
            "[server]\nbind = \"127.0.0.1\"\nport = 0\nmetrics_addr = \"127.0.0.1:0\"\n\
             [runtime]\nshards = 2\nrecv_batch = 8\n",
            "test.toml",
        )
        .unwrap()
        .build()
        .unwrap();
    let obs = Observable::new();
    let server = Server::new()
        .route("/hello", get(|| async { "hello world" }))
        .route("/obs", get(|| async { "v" }).observable(&obs))
        .route(
            "/panic",
            get(|| async { panic!("handler bug") as &'static str }),
        )
        .with_config(&config.server_settings())
        .bind(config.server.socket_addr())
        .await
        .unwrap();
    let exporter = serve_metrics(config.server.metrics_addr.unwrap(), server.metrics())
        .await
        .unwrap();
    let http = exporter.local_addr();
    assert_ne!(http.port(), 0);

    let before = totals(
        fetch(http, "/metrics")
            .await
            .split_once("\r\n\r\n")
            .unwrap()
            .1,
    );
    assert_eq!(before["cobalt_requests_total"], 0);
    assert_eq!(before.len(), 50, "{before:?}");

    let base = format!("coap://{}", server.local_addr(Scheme::Coap).unwrap());
    let client = Client::new();
    for _ in 0..5 {
        let r = client.get(&format!("{base}/hello")).await.unwrap();
        assert_eq!(r.code, Code::CONTENT);
    }
    let r = client.get(&format!("{base}/nope")).await.unwrap();
    assert_eq!(r.code, Code::NOT_FOUND);
    let r = client.get(&format!("{base}/panic")).await.unwrap();
    assert_eq!(r.code.class(), 5);
    let mut observation = client.observe(&format!("{base}/obs")).await.unwrap();
    let first = observation.next().await.unwrap().unwrap();
    assert!(first.options.observe().is_some(), "registered");
    // A malformed NON (token length 9): dropped and counted.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.send_to(
        &[0x59, 0x01, 0, 1],
        server.local_addr(Scheme::Coap).unwrap(),
    )
    .unwrap();

    let deadline = Instant::now() + Duration::from_secs(5);
    let t = loop {
        let response = fetch(http, "/metrics").await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        let t = totals(response.split_once("\r\n\r\n").unwrap().1);
        let done = t["cobalt_requests_total"] >= 8
            && t["cobalt_responses_total{class=\"2xx\"}"] >= 6
            && t["cobalt_observers"] >= 1
            && t["cobalt_responses_total{class=\"4xx\"}"] >= 1
            && t["cobalt_responses_total{class=\"5xx\"}"] >= 1
            && t["cobalt_format_errors_total"] >= 1;
        if done || Instant::now() > deadline {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(t["cobalt_requests_total"], 8, "{t:?}");
    assert_eq!(t["cobalt_responses_total{class=\"2xx\"}"], 6, "{t:?}");
    assert_eq!(t["cobalt_observers"], 1, "{t:?}");
    assert_eq!(t["cobalt_responses_total{class=\"4xx\"}"], 1, "{t:?}");
    assert_eq!(t["cobalt_responses_total{class=\"5xx\"}"], 1, "{t:?}");
    assert_eq!(t["cobalt_format_errors_total"], 1, "{t:?}");
    assert!(t["cobalt_datagrams_received_total"] >= 9, "{t:?}");
    // Answers to GETs are not kept for duplicates (endpoint.dedup_rerun_safe).
    assert_eq!(t["cobalt_dedup_entries"], 0, "{t:?}");
    // The observe registration waited for one verification of the client's address.
    assert_eq!(
        t["cobalt_address_validation_total{event=\"verified\"}"], 1,
        "{t:?}"
    );
    assert_eq!(t["cobalt_verified_peers"], 1, "{t:?}");
    assert_eq!(server.metrics().total().requests, 8);

    let nf = fetch(http, "/other").await;
    assert!(nf.starts_with("HTTP/1.1 404 "), "{nf}");
    server.shutdown(Duration::from_millis(100)).await;
}

/// Shards publish their counters when a reader asks, not after every turn: a scrape
/// taken the moment the last answer arrives still counts every answer.
#[tokio::test]
async fn a_scrape_right_after_n_answers_reports_n() {
    let server = Server::new()
        .route("/hello", get(|| async { "hello world" }))
        .shards(2)
        .bind("127.0.0.1:0".parse::<SocketAddr>().unwrap())
        .await
        .unwrap();
    let metrics = server.metrics();
    let exporter = serve_metrics("127.0.0.1:0".parse().unwrap(), metrics.clone())
        .await
        .unwrap();
    let base = format!("coap://{}", server.local_addr(Scheme::Coap).unwrap());
    let client = Client::new();
    for n in 1..=3u64 {
        for _ in 0..10 {
            let r = client.get(&format!("{base}/hello")).await.unwrap();
            assert_eq!(r.code, Code::CONTENT);
        }
        let scrape = fetch(exporter.local_addr(), "/metrics").await;
        let t = totals(scrape.split_once("\r\n\r\n").unwrap().1);
        assert_eq!(t["cobalt_responses_total{class=\"2xx\"}"], 10 * n, "{t:?}");
        assert_eq!(t["cobalt_requests_total"], 10 * n, "{t:?}");
        assert_eq!(metrics.total().responses_2xx, 10 * n);
    }
    server.shutdown(Duration::from_millis(100)).await;
    // A server that has stopped is read as its shards last published.
    assert_eq!(metrics.total().responses_2xx, 30);
}

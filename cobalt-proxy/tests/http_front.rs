//! The HTTP front end to end: raw HTTP/1.1 over TCP (to control framing), HTTP/2 with
//! hyper's client, a counting CoAP origin behind, the cache shared with the CoAP front.

mod common;

use bytes::Bytes;
use cobalt::proto::message::opt;
use cobalt::{Client, Code, Scheme, Server, ServerHandle};
use cobalt_proxy::{AllowList, CoapFront, HttpConfig, HttpFront, HttpServer, Proxy, ProxyConfig};
use common::{origin, Origin, IMPATIENT, PATIENT};
use http_body_util::{BodyExt, Empty};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Fronts {
    coap: ServerHandle,
    coap_addr: SocketAddr,
    http: HttpServer,
    proxy: Proxy,
}

async fn fronts(http: HttpConfig) -> Fronts {
    fronts_waiting(http, PATIENT).await
}

/// The fronts of a proxy that waits `upstream_timeout` for origins.
async fn fronts_waiting(http: HttpConfig, upstream_timeout: Duration) -> Fronts {
    let proxy = Proxy::new(ProxyConfig {
        allow: AllowList::parse(["127.0.0.0/8"]).unwrap(),
        upstream_timeout,
        ..ProxyConfig::default()
    });
    let coap = CoapFront::new(proxy.clone())
        .install(Server::new())
        .shards(1)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let coap_addr = coap.local_addr(Scheme::Coap).unwrap();
    let http = HttpFront::new(proxy.clone(), http)
        .bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    Fronts {
        coap,
        coap_addr,
        http,
        proxy,
    }
}

/// Sends `request` as is on a new connection and reads until the server closes it.
async fn raw(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

async fn http_get(addr: SocketAddr, path: &str, headers: &str) -> String {
    raw(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: p\r\nConnection: close\r\n{headers}\r\n"),
    )
    .await
}

fn status(response: &str) -> u16 {
    response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn body(response: &str) -> &str {
    response.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

async fn stop(f: Fronts, o: Origin) {
    stop_fronts(f).await;
    o.server.shutdown(Duration::ZERO).await;
}

async fn stop_fronts(f: Fronts) {
    drop(f.http);
    f.coap.shutdown(Duration::ZERO).await;
}

/// What a proxy that waits [`IMPATIENT`] for origins (and is asked nothing else)
/// answers to `GET /hc/coap://ORIGIN/silent` with `headers`.
async fn silent_origin_status(o: &Origin, headers: &str) -> u16 {
    let f = fronts_waiting(HttpConfig::default(), IMPATIENT).await;
    let h = http_get(
        f.http.local_addr(),
        &format!("/hc/coap://{}/silent", o.addr),
        headers,
    )
    .await;
    stop_fronts(f).await;
    status(&h)
}

#[tokio::test]
async fn get_maps_headers_and_shares_the_cache_with_the_coap_front() {
    let o = origin().await;
    let f = fronts(HttpConfig::default()).await;
    let target = format!("coap://{}/count", o.addr);
    let r = Client::new()
        .request(Code::GET, &format!("coap://{}/", f.coap_addr))
        .option(opt::PROXY_URI, &target)
        .send()
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "counted");
    let h = http_get(f.http.local_addr(), &format!("/hc/{target}"), "").await;
    assert_eq!(status(&h), 200, "{h}");
    assert_eq!(body(&h), "counted");
    assert!(
        h.contains("content-type: text/plain; charset=utf-8\r\n"),
        "{h}"
    );
    assert!(h.contains("etag: \"7631\"\r\n"), "{h}");
    assert!(h.contains("cache-control: max-age="), "{h}");
    assert_eq!(
        o.counts.requests.load(Ordering::SeqCst),
        1,
        "the HTTP answer came from the cache"
    );

    let h = http_get(
        f.http.local_addr(),
        &format!("/hc/{target}"),
        "If-None-Match: \"7631\"\r\n",
    )
    .await;
    assert_eq!(status(&h), 304, "{h}");
    let encoded = target.replace(':', "%3A").replace('/', "%2F");
    let h = http_get(
        f.http.local_addr(),
        &format!("/hc?target_uri={encoded}"),
        "",
    )
    .await;
    assert_eq!((status(&h), body(&h)), (200, "counted"), "{h}");
    assert_eq!(f.proxy.metrics().http_requests.load(Ordering::SeqCst), 3);
    stop(f, o).await;
}

#[tokio::test]
async fn bodies_are_whole_both_ways() {
    let o = origin().await;
    let f = fronts(HttpConfig::default()).await;
    let h = http_get(
        f.http.local_addr(),
        &format!("/hc/coap://{}/large", o.addr),
        "",
    )
    .await;
    assert_eq!(status(&h), 200);
    assert!(h.contains("content-length: 5000\r\n"), "{h}");
    let payload = "x".repeat(3000);
    let h = raw(
        f.http.local_addr(),
        &format!(
            "POST /hc/coap://{}/echo HTTP/1.1\r\nHost: p\r\nConnection: close\r\nContent-Type: application/octet-stream\r\nContent-Length: 3000\r\n\r\n{payload}",
            o.addr
        ),
    )
    .await;
    assert_eq!(status(&h), 200, "{h}");
    assert_eq!(body(&h), payload);
    stop(f, o).await;
}

#[tokio::test]
async fn failures_map_to_403_502_504_and_bad_input_to_4xx() {
    let o = origin().await;
    let f = fronts(HttpConfig {
        max_body: 100,
        ..HttpConfig::default()
    })
    .await;
    let a = f.http.local_addr();
    let closed = cobalt_test_support::ports::free_udp_port("127.0.0.1".parse().unwrap());
    assert_eq!(
        status(&http_get(a, &format!("/hc/coap://127.0.0.1:{closed}/x"), "").await),
        502
    );
    assert_eq!(silent_origin_status(&o, "").await, 504);
    assert_eq!(
        status(&http_get(a, "/hc/coap://192.0.2.1/x", "").await),
        403
    );
    assert_eq!(
        status(&http_get(a, "/hc/http://example.org/", "").await),
        400
    );
    assert_eq!(status(&http_get(a, "/elsewhere", "").await), 404);
    assert_eq!(status(&http_get(a, "/hc", "").await), 400);
    let h = raw(
        a,
        &format!(
            "OPTIONS /hc/coap://{}/count HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n",
            o.addr
        ),
    )
    .await;
    assert_eq!(status(&h), 501);
    let h = raw(a, &format!("POST /hc/coap://{}/echo HTTP/1.1\r\nHost: p\r\nConnection: close\r\nContent-Length: 101\r\n\r\n{}", o.addr, "y".repeat(101))).await;
    assert_eq!(status(&h), 413);
    let h = raw(a, &format!("PUT /hc/coap://{}/echo HTTP/1.1\r\nHost: p\r\nConnection: close\r\nContent-Type: image/png\r\nContent-Length: 1\r\n\r\nz", o.addr)).await;
    assert_eq!(status(&h), 415);
    stop(f, o).await;
}

#[tokio::test]
async fn smuggling_attempts_are_refused() {
    let o = origin().await;
    // Kept-alive connections end soon after their last request.
    let f = fronts(HttpConfig {
        header_timeout: Duration::from_millis(500),
        ..HttpConfig::default()
    })
    .await;
    let a = f.http.local_addr();
    // Two different lengths: refused before anything reaches the origin.
    let h = raw(
        a,
        &format!("POST /hc/coap://{}/echo HTTP/1.1\r\nHost: p\r\nContent-Length: 5\r\nContent-Length: 40\r\n\r\nhello", o.addr),
    )
    .await;
    assert_eq!(status(&h), 400, "{h}");
    // Content-Length with Transfer-Encoding: the chunked framing wins (or the request
    // is refused); the smuggled GET hidden behind the declared length never runs.
    let smuggled = format!(
        "GET /hc/coap://{}/count HTTP/1.1\r\nHost: p\r\n\r\n",
        o.addr
    );
    let h = raw(
        a,
        &format!(
            "POST /hc/coap://{}/echo HTTP/1.1\r\nHost: p\r\nContent-Length: {}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}",
            o.addr,
            5 + smuggled.len()
        ),
    )
    .await;
    assert!(matches!(status(&h), 200 | 204 | 400), "{h}");
    assert_eq!(h.matches("HTTP/1.1 ").count(), 1, "one answer only: {h}");
    assert_eq!(
        o.counts.requests.load(Ordering::SeqCst),
        0,
        "the smuggled GET did not run"
    );
    stop(f, o).await;
}

#[tokio::test]
async fn a_slow_client_loses_its_connection_and_others_are_served() {
    let o = origin().await;
    let f = fronts(HttpConfig {
        header_timeout: Duration::from_millis(300),
        ..HttpConfig::default()
    })
    .await;
    let a = f.http.local_addr();
    let mut slow = TcpStream::connect(a).await.unwrap();
    slow.write_all(b"GET /hc/coap://127.0.0.1/x HTTP/1.1\r\nHost: p\r\nX-Slow: ")
        .await
        .unwrap();
    let h = http_get(a, &format!("/hc/coap://{}/count", o.addr), "").await;
    assert_eq!(status(&h), 200);
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), slow.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the server closed the slow connection");
    assert!(
        !String::from_utf8_lossy(&rest).contains(" 200 "),
        "and did not serve it"
    );
    stop(f, o).await;
}

#[tokio::test]
async fn http2_with_prior_knowledge() {
    let o = origin().await;
    let f = fronts(HttpConfig::default()).await;
    let tcp = TcpStream::connect(f.http.local_addr()).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get(format!("http://p/hc/coap://{}/large", o.addr))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let r = sender.send_request(req).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.version(), hyper::Version::HTTP_2);
    let body = r.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 5000);
    stop(f, o).await;
}

#[tokio::test]
async fn an_observation_streams_as_server_sent_events() {
    let o = origin().await;
    let f = fronts(HttpConfig::default()).await;
    let mut s = TcpStream::connect(f.http.local_addr()).await.unwrap();
    s.write_all(
        format!(
            "GET /hc/coap://{}/temp HTTP/1.1\r\nHost: p\r\nAccept: text/event-stream\r\n\r\n",
            o.addr
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    for n in 1..=3 {
        let want = format!("data: t{n}\n\n");
        while !seen.contains(&want) {
            let read = tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf))
                .await
                .expect("an event")
                .unwrap();
            assert!(read > 0, "stream ended early: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..read]));
        }
        o.value.store(n + 1, Ordering::SeqCst);
        o.temp.changed();
    }
    assert!(seen.contains("content-type: text/event-stream"), "{seen}");
    assert_eq!(f.proxy.observations(), 1);
    drop(s);
    // A failing observation is answered with a status, not a stream.
    assert_eq!(
        silent_origin_status(&o, "Accept: text/event-stream\r\n").await,
        504
    );
    stop(f, o).await;
}

#[tokio::test]
async fn an_origin_that_notifies_without_end_and_a_reader_that_never_reads_starve_nobody() {
    let o = origin().await;
    let f = fronts(HttpConfig::default()).await;
    // The origin notifies as fast as it can for the whole test.
    let temp = o.temp.clone();
    let value = o.value.clone();
    let flood = tokio::spawn(async move {
        loop {
            value.fetch_add(1, Ordering::SeqCst);
            temp.changed();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    // Event streams that are never read: the proxy keeps at most the latest state and
    // a few events per stream, however long the origin goes on.
    let mut idle = Vec::new();
    for _ in 0..5 {
        let mut s = TcpStream::connect(f.http.local_addr()).await.unwrap();
        let request = format!(
            "GET /hc/coap://{}/temp HTTP/1.1\r\nHost: p\r\nAccept: text/event-stream\r\n\r\n",
            o.addr
        );
        s.write_all(request.as_bytes()).await.unwrap();
        idle.push(s);
    }
    for _ in 0..20 {
        let h = http_get(
            f.http.local_addr(),
            &format!("/hc/coap://{}/large", o.addr),
            "",
        )
        .await;
        assert_eq!(status(&h), 200);
        let r = Client::new()
            .request(Code::GET, &format!("coap://{}/", f.coap_addr))
            .option(opt::PROXY_URI, format!("coap://{}/count", o.addr))
            .send()
            .await
            .unwrap();
        assert_eq!(r.code, Code::CONTENT);
    }
    assert_eq!(
        f.proxy.observations(),
        1,
        "the five streams share one observation"
    );
    flood.abort();
    drop(idle);
    stop(f, o).await;
}

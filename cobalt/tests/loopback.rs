//! Server and client talking over real UDP sockets on loopback.

use cobalt::server::{get, post, Request};
use cobalt::{Client, Code, Error, Server};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

async fn demo_server() -> cobalt::ServerHandle {
    let counter = Arc::new(AtomicU32::new(0));
    Server::new()
        .route("/hello", get(|| async { "hello world" }).rt("greeting"))
        .route(
            "/echo",
            post(|req: Request| async move { (Code::CHANGED, req.payload().to_vec()) }),
        )
        .route(
            "/count",
            post(move || {
                let c = counter.clone();
                async move { c.fetch_add(1, Ordering::SeqCst).to_string() }
            }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                "finally"
            }),
        )
        .route(
            "/panic",
            get(|| async { panic!("handler bug") as &'static str }),
        )
        .shards(2)
        .bind("127.0.0.1:0")
        .await
        .unwrap()
}

#[tokio::test]
async fn get_post_not_found_method_not_allowed() {
    let server = demo_server().await;
    let base = format!("coap://{}", server.local_addr());
    let client = Client::new();

    let r = client.get(&format!("{base}/hello")).await.unwrap();
    assert_eq!(r.code, Code::CONTENT);
    assert_eq!(r.text_payload(), "hello world");

    let r = client.post(&format!("{base}/echo"), "ping").await.unwrap();
    assert_eq!((r.code, r.text_payload().as_str()), (Code::CHANGED, "ping"));

    let r = client.get(&format!("{base}/nope")).await.unwrap();
    assert_eq!(r.code, Code::NOT_FOUND);
    let r = client.delete(&format!("{base}/hello")).await.unwrap();
    assert_eq!(r.code, Code::METHOD_NOT_ALLOWED);

    let r = client
        .get(&format!("{base}/.well-known/core"))
        .await
        .unwrap();
    assert_eq!(r.options.content_format(), Some(40));
    let text = r.text_payload();
    assert!(text.contains("</hello>;rt=\"greeting\""), "{text}");
    assert!(text.contains("</echo>"), "{text}");
    let r = client
        .get(&format!("{base}/.well-known/core?rt=greeting"))
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "</hello>;rt=\"greeting\"");

    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn large_post_goes_up_in_block1_and_comes_back_in_block2() {
    let server = demo_server().await;
    let sizes = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = sizes.clone();
    let tracer: cobalt::runtime::Tracer = Arc::new(move |sent, _peer, bytes| {
        if sent {
            seen.lock().unwrap().push(bytes.len());
        }
    });
    let client = Client::with_tracer(cobalt::EndpointConfig::default(), tracer).unwrap();
    let body: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let r = client
        .post(
            &format!("coap://{}/echo", server.local_addr()),
            body.clone(),
        )
        .await
        .unwrap();
    assert_eq!(r.code, Code::CHANGED);
    assert_eq!(r.payload, body);
    assert!(r.options.get(cobalt::proto::message::opt::BLOCK1).is_none());
    let sizes = sizes.lock().unwrap().clone();
    // 5 Block1 blocks up, then 4 requests for the rest of the echo; none oversized.
    assert!(sizes.len() >= 9, "{sizes:?}");
    assert!(sizes.iter().all(|&n| n <= 1024 + 64), "{sizes:?}");
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn slow_handler_is_answered_separately() {
    let server = demo_server().await;
    let client = Client::new();
    let r = client
        .get(&format!("coap://{}/slow", server.local_addr()))
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "finally");
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn panicking_handler_answers_5_00_and_server_keeps_serving() {
    let server = demo_server().await;
    let client = Client::new();
    let base = format!("coap://{}", server.local_addr());
    let r = client.get(&format!("{base}/panic")).await.unwrap();
    assert_eq!(r.code, Code::INTERNAL_SERVER_ERROR);
    let r = client.get(&format!("{base}/hello")).await.unwrap();
    assert_eq!(r.code, Code::CONTENT);
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn many_concurrent_requests_each_run_once() {
    let server = demo_server().await;
    let client = Client::new();
    let uri = format!("coap://{}/count", server.local_addr());
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (c, u) = (client.clone(), uri.clone());
        tasks.push(tokio::spawn(async move {
            c.post(&u, "").await.unwrap().text_payload()
        }));
    }
    let mut seen = Vec::new();
    for t in tasks {
        seen.push(t.await.unwrap().parse::<u32>().unwrap());
    }
    seen.sort();
    assert_eq!(seen, (0..20).collect::<Vec<_>>());
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn deadline_and_bad_uri_errors() {
    // Nothing listens on this port: the caller's deadline fires.
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = sock.local_addr().unwrap().port();
    let client = Client::new();
    let err = client
        .request(Code::GET, &format!("coap://127.0.0.1:{port}/x"))
        .timeout(Duration::from_millis(300))
        .send()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Deadline(_)), "{err}");
    let err = client.get("http://127.0.0.1/").await.unwrap_err();
    assert!(err.to_string().contains("unsupported scheme"), "{err}");
    let err = client.get("coaps://127.0.0.1/").await.unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err}");
}

#[test]
fn blocking_client_works_outside_async() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(demo_server());
    let client = cobalt::client::blocking::Client::new().unwrap();
    let r = client
        .get(&format!("coap://{}/hello", server.local_addr()))
        .unwrap();
    assert_eq!(r.text_payload(), "hello world");
    rt.block_on(server.shutdown(Duration::from_secs(1)));
}

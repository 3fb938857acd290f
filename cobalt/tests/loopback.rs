//! Server and client talking over real UDP sockets on loopback.

use cobalt::server::{get, post, Request};
use cobalt::Scheme;
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
async fn start_says_what_is_wrong_with_the_listeners_and_leaves_nothing_bound() {
    let err = Server::new().start().await.unwrap_err();
    assert!(err.to_string().contains("Server::listen"), "{err}");
    let err = Server::new()
        .listen(Scheme::CoapTcp, "127.0.0.1:0")
        .listen(Scheme::CoapTcp, "127.0.0.1:0")
        .start()
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("coap+tcp is listed twice"),
        "{err}"
    );
    let err = Server::new().bind("127.0.0.1").await.unwrap_err();
    assert!(matches!(err, Error::Resolve { .. }), "{err:?}");
    assert!(err.to_string().contains("coap address"), "{err}");
    // A secure listener without credentials fails before the UDP port is bound.
    let addr = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let err = Server::new()
        .listen(Scheme::CoapsTcp, "127.0.0.1:0")
        .bind(addr)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("coaps+tcp"), "{err}");
    let server = Server::new()
        .bind(addr)
        .await
        .expect("the port is still free");
    assert_eq!(server.local_addr(Scheme::Coap), Some(addr));
    assert_eq!(server.local_addr(Scheme::CoapTcp), None);
    assert_eq!(
        server.listeners().collect::<Vec<_>>(),
        [(Scheme::Coap, addr)]
    );
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn get_post_not_found_method_not_allowed() {
    let server = demo_server().await;
    let base = format!("coap://{}", server.local_addr(Scheme::Coap).unwrap());
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
            &format!("coap://{}/echo", server.local_addr(Scheme::Coap).unwrap()),
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
        .get(&format!(
            "coap://{}/slow",
            server.local_addr(Scheme::Coap).unwrap()
        ))
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "finally");
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn panicking_handler_answers_5_00_and_server_keeps_serving() {
    let server = demo_server().await;
    let client = Client::new();
    let base = format!("coap://{}", server.local_addr(Scheme::Coap).unwrap());
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
    let uri = format!("coap://{}/count", server.local_addr(Scheme::Coap).unwrap());
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
    let client = cobalt::client::blocking::Client::new();
    let r = client
        .get(&format!(
            "coap://{}/hello",
            server.local_addr(Scheme::Coap).unwrap()
        ))
        .unwrap();
    assert_eq!(r.text_payload(), "hello world");
    rt.block_on(server.shutdown(Duration::from_secs(1)));
}

mod observe_and_blocks {
    use cobalt::server::{get, put, Observable, Request, ServerLimits};
    use cobalt::Scheme;
    use cobalt::{Client, Code, Response, Server};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    fn big(n: usize) -> Vec<u8> {
        (0..n).map(|i| b'a' + (i % 26) as u8).collect()
    }

    async fn server(obs: &Observable, value: Arc<Mutex<String>>) -> cobalt::ServerHandle {
        let read = value.clone();
        let stored = Arc::new(Mutex::new(Vec::new()));
        let stored_read = stored.clone();
        Server::new()
            .route(
                "/value",
                get(move || {
                    let v = read.lock().unwrap().clone();
                    async move { v }
                })
                .observable(obs),
            )
            .route("/big", get(|| async { big(5000) }))
            .route(
                "/store",
                put(move |req: Request| {
                    *stored.lock().unwrap() = req.payload().to_vec();
                    async { Code::CHANGED }
                })
                .get(move || {
                    let v = stored_read.lock().unwrap().clone();
                    async move { v }
                }),
            )
            .limits(ServerLimits {
                uploads: cobalt::server::UploadLimits {
                    max_body: 10_000,
                    ..Default::default()
                },
                ..Default::default()
            })
            .shards(1)
            .bind("127.0.0.1:0")
            .await
            .unwrap()
    }

    /// An observation of a `q_block()` request: the registration's answer and each
    /// notification, 47 blocks of 64 bytes, come as Q-Block2 sets (with the ETag the
    /// server adds to a Q-Block2 body) and are yielded whole, in order, also when
    /// the resource changes faster than they are collected.
    #[tokio::test]
    async fn a_q_block_observation_yields_whole_notifications() {
        let obs = Observable::new();
        let text = |i: usize| -> String {
            let mut s: String = (0..3000)
                .map(|j| (b'a' + ((i + j) % 26) as u8) as char)
                .collect();
            s.replace_range(0..2, &format!("{i:02}"));
            s
        };
        let value = Arc::new(Mutex::new(text(0)));
        let srv = server(&obs, value.clone()).await;
        let client = Client::new();
        let uri = format!("coap://{}/value", srv.local_addr(Scheme::Coap).unwrap());
        let mut o = client
            .request(Code::GET, &uri)
            .q_block()
            .block_size(64)
            .unwrap()
            .observe()
            .await
            .unwrap();
        let first = tokio::time::timeout(Duration::from_secs(20), o.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(first.text_payload(), text(0));
        assert!(
            first
                .options
                .get(cobalt::proto::message::opt::ETAG)
                .is_some(),
            "a Q-Block2 body"
        );
        let mut seq = first.options.observe().expect("registered");
        for i in 1..=3 {
            *value.lock().unwrap() = text(i);
            obs.changed();
            let n = tokio::time::timeout(Duration::from_secs(20), o.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert_eq!(n.text_payload(), text(i));
            assert!(
                n.options.get(cobalt::proto::message::opt::ETAG).is_some(),
                "a Q-Block2 body"
            );
            assert!(n.options.observe().unwrap() > seq);
            seq = n.options.observe().unwrap();
        }
        // Changes faster than the client collects: a newer notification overtakes
        // the one being collected, and what comes is whole, up to the latest.
        for i in 4..=6 {
            *value.lock().unwrap() = text(i);
            obs.changed();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let mut got = Vec::new();
        while got.last() != Some(&text(6)) && got.len() < 3 {
            let n = tokio::time::timeout(Duration::from_secs(20), o.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert!(n.options.observe().unwrap() > seq);
            seq = n.options.observe().unwrap();
            got.push(n.text_payload());
        }
        assert_eq!(got.last(), Some(&text(6)));
        assert!(got.iter().all(|t| (4..=6).any(|i| *t == text(i))));
        drop(o);
        srv.shutdown(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn notifications_arrive_in_order_and_cancel_ends_the_relation() {
        let obs = Observable::new();
        let value = Arc::new(Mutex::new("v0".to_string()));
        let srv = server(&obs, value.clone()).await;
        let client = Client::new();
        let mut o = client
            .observe(&format!(
                "coap://{}/value",
                srv.local_addr(Scheme::Coap).unwrap()
            ))
            .await
            .unwrap();
        let first = o.next().await.unwrap().unwrap();
        assert_eq!(first.text_payload(), "v0");
        let seq0 = first.options.observe().expect("registered");
        assert_eq!(obs.observer_count(), 1);
        for i in 1..=3 {
            *value.lock().unwrap() = format!("v{i}");
            obs.changed();
            let n = o.next().await.unwrap().unwrap();
            assert_eq!(n.text_payload(), format!("v{i}"));
            assert!(n.options.observe().unwrap() > seq0);
        }
        let last = o.cancel().await.unwrap();
        assert_eq!(last.code, Code::CONTENT);
        assert!(
            last.options.observe().is_none(),
            "deregistration answer has no Observe"
        );
        assert_eq!(obs.observer_count(), 0);
        srv.shutdown(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn dropped_observation_is_removed_by_rst_and_deleted_resource_ends_observers() {
        let obs = Observable::new();
        let value = Arc::new(Mutex::new("x".to_string()));
        let srv = server(&obs, value).await;
        let client = Client::new();
        let uri = format!("coap://{}/value", srv.local_addr(Scheme::Coap).unwrap());
        let mut o = client.observe(&uri).await.unwrap();
        o.next().await.unwrap().unwrap();
        drop(o);
        // The client answers the next NON notification after the drop with RST (the
        // first may still race with the drop, so keep changing).
        for _ in 0..50 {
            obs.changed();
            tokio::time::sleep(Duration::from_millis(20)).await;
            if obs.observer_count() == 0 {
                break;
            }
        }
        assert_eq!(obs.observer_count(), 0, "RST removed the observer");

        let mut o = client.observe(&uri).await.unwrap();
        o.next().await.unwrap().unwrap();
        obs.deleted();
        let gone = o.next().await.unwrap().unwrap();
        assert_eq!(gone.code, Code::NOT_FOUND);
        assert!(o.next().await.is_none(), "the relation ended");
        srv.shutdown(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn block2_download_and_block1_upload_are_byte_exact() {
        let obs = Observable::new();
        let srv = server(&obs, Arc::new(Mutex::new(String::new()))).await;
        let client = Client::new();
        let base = format!("coap://{}", srv.local_addr(Scheme::Coap).unwrap());
        let r = client.get(&format!("{base}/big")).await.unwrap();
        assert_eq!(r.payload, big(5000));
        let r = client
            .request(Code::GET, &format!("{base}/big"))
            .block_size(64)
            .unwrap()
            .send()
            .await
            .unwrap();
        assert_eq!(r.payload, big(5000));

        let body = big(7000);
        let r = client
            .request(Code::PUT, &format!("{base}/store"))
            .payload(body.clone())
            .block_size(256)
            .unwrap()
            .send()
            .await
            .unwrap();
        assert_eq!(r.code, Code::CHANGED);
        let back = client.get(&format!("{base}/store")).await.unwrap();
        assert_eq!(back.payload, body);

        let r: Response = client
            .put(&format!("{base}/store"), big(20_000))
            .await
            .unwrap();
        assert_eq!(r.code, Code::REQUEST_ENTITY_TOO_LARGE);
        assert_eq!(
            r.options.get_uint(cobalt::proto::message::opt::SIZE1),
            Some(10_000)
        );
        srv.shutdown(Duration::from_secs(1)).await;
    }
}

mod executors_and_shard_clients {
    use cobalt::server::{get, Executor, Request};
    use cobalt::Scheme;
    use cobalt::{Client, Code, Server};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    fn thread_name() -> String {
        std::thread::current().name().unwrap_or("?").to_string()
    }

    #[tokio::test]
    async fn resources_run_on_their_executor_and_children_inherit() {
        let pool = Executor::blocking(2).unwrap();
        let server = Server::new()
            .route("/inline", get(|| async { thread_name() }))
            .route("/api/a", get(|| async { thread_name() }))
            .route(
                "/api/own",
                get(|| async { thread_name() }).executor(Executor::pool(1).unwrap()),
            )
            .executor("/api", pool)
            .shards(1)
            .listen(Scheme::CoapTcp, "127.0.0.1:0")
            .bind("127.0.0.1:0")
            .await
            .unwrap();
        let c = Client::new();
        let udp = format!("coap://{}", server.local_addr(Scheme::Coap).unwrap());
        let tcp = format!("coap+tcp://{}", server.local_addr(Scheme::CoapTcp).unwrap());
        for base in [udp, tcp] {
            let name = |p: &'static str| {
                let (c, base) = (c.clone(), base.clone());
                async move { c.get(&format!("{base}{p}")).await.unwrap().text_payload() }
            };
            // Inline handlers run where the request arrived: a shard's thread for UDP,
            // the connection's task for TCP.
            let inline = name("/inline").await;
            if base.starts_with("coap://") {
                assert!(inline.starts_with("cobalt-shard"), "{inline}");
            } else {
                assert!(!inline.starts_with("cobalt-"), "{inline}");
            }
            assert!(
                name("/api/a").await.starts_with("cobalt-exec"),
                "{base}: inherited from /api"
            );
            assert!(
                name("/api/own").await.starts_with("cobalt-pool"),
                "{base}: own choice wins"
            );
        }
        server.shutdown(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn exclusive_executor_never_overlaps_blocking_handlers() {
        let running = Arc::new(AtomicUsize::new(0));
        let max_seen = Arc::new(AtomicUsize::new(0));
        let (r, m) = (running.clone(), max_seen.clone());
        let server = Server::new()
            .route(
                "/locked",
                get(move || {
                    let (r, m) = (r.clone(), m.clone());
                    async move {
                        let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                        m.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(20)); // blocks: allowed here
                        r.fetch_sub(1, Ordering::SeqCst);
                        "done"
                    }
                })
                .executor(Executor::exclusive().unwrap()),
            )
            .bind("127.0.0.1:0")
            .await
            .unwrap();
        let uri = format!("coap://{}/locked", server.local_addr(Scheme::Coap).unwrap());
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (c, u) = (Client::new(), uri.clone());
            tasks.push(tokio::spawn(async move { c.get(&u).await.unwrap().code }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap(), Code::CONTENT);
        }
        assert_eq!(max_seen.load(Ordering::SeqCst), 1, "handlers overlapped");
        server.shutdown(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn a_resource_asks_another_server_through_its_shard_and_answers_late() {
        // One shard: the request goes out on the shard's socket. Four: the answer could
        // reach another shard, so the handlers share a client of their own.
        for shards in [1, 4] {
            resource_asks_another_server(shards).await;
        }
    }

    async fn resource_asks_another_server(shards: usize) {
        let backend = Server::new()
            .route("/value", get(|| async { "42" }))
            .bind("127.0.0.1:0")
            .await
            .unwrap();
        let backend_uri = format!("coap://{}/value", backend.local_addr(Scheme::Coap).unwrap());
        let front = Server::new()
            .route(
                "/proxy",
                get(move |req: Request| {
                    let uri = backend_uri.clone();
                    async move {
                        match req.client().get(&uri).await {
                            Ok(r) => format!("backend says {}", r.text_payload()),
                            Err(e) => format!("backend failed: {e}"),
                        }
                    }
                }),
            )
            .shards(shards)
            .bind("[::]:0")
            .await
            .unwrap();
        let r = Client::new()
            .get(&format!(
                "coap://127.0.0.1:{}/proxy",
                front.local_addr(Scheme::Coap).unwrap().port()
            ))
            .await
            .unwrap();
        assert_eq!(r.text_payload(), "backend says 42", "{shards} shards");
        front.shutdown(Duration::from_secs(1)).await;
        backend.shutdown(Duration::from_secs(1)).await;
    }
}

mod single_socket_mode {
    use cobalt::runtime::Stages;
    use cobalt::server::{get, post, Request};
    use cobalt::Scheme;
    use cobalt::{Client, Code, Server};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn stages_serve_like_shards_and_keep_at_most_once() {
        let counter = Arc::new(AtomicU32::new(0));
        let c = counter.clone();
        let server = Server::new()
            .route("/hello", get(|| async { "staged hello" }))
            .route(
                "/count",
                post(move |_req: Request| {
                    let n = c.fetch_add(1, Ordering::SeqCst);
                    async move { n.to_string() }
                }),
            )
            .single_socket(Stages {
                receivers: 2,
                senders: 2,
                workers: 3,
                queue: 1024,
            })
            .bind("127.0.0.1:0")
            .await
            .unwrap();
        let base = format!("coap://{}", server.local_addr(Scheme::Coap).unwrap());
        let mut tasks = Vec::new();
        for _ in 0..30 {
            let uri = format!("{base}/count");
            tasks.push(tokio::spawn(async move {
                Client::new().post(&uri, "").await.unwrap()
            }));
        }
        let mut seen: Vec<u32> = Vec::new();
        for t in tasks {
            seen.push(t.await.unwrap().text_payload().parse().unwrap());
        }
        seen.sort();
        assert_eq!(seen, (0..30).collect::<Vec<_>>());
        let r = Client::new().get(&format!("{base}/hello")).await.unwrap();
        assert_eq!(r.text_payload(), "staged hello");
        server.shutdown(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn a_full_worker_queue_answers_5_03_with_max_age() {
        let server = Server::new()
            .route(
                "/stall",
                get(|| async {
                    // Blocks the worker thread on purpose so its queue fills up.
                    std::thread::sleep(Duration::from_millis(300));
                    "late"
                }),
            )
            .single_socket(Stages {
                receivers: 1,
                senders: 1,
                workers: 1,
                queue: 1,
            })
            .bind("127.0.0.1:0")
            .await
            .unwrap();
        let uri = format!("coap://{}/stall", server.local_addr(Scheme::Coap).unwrap());
        let mut tasks = Vec::new();
        for _ in 0..6 {
            let u = uri.clone();
            tasks.push(tokio::spawn(
                async move { Client::new().get(&u).await.unwrap() },
            ));
        }
        let mut unavailable = 0;
        for t in tasks {
            let r = t.await.unwrap();
            if r.code == Code::SERVICE_UNAVAILABLE {
                assert!(r
                    .options
                    .get_uint(cobalt::proto::message::opt::MAX_AGE)
                    .is_some());
                unavailable += 1;
            } else {
                assert_eq!(r.text_payload(), "late");
            }
        }
        assert!(unavailable > 0, "some requests found the queue full");
        let text = server.metrics().render_prometheus();
        let refused = text
            .lines()
            .find_map(|l| l.strip_prefix("cobalt_stage_overload_total "))
            .and_then(|n| n.parse::<u64>().ok());
        assert!(refused.is_some_and(|n| n >= unavailable), "{text}");
        server.shutdown(Duration::from_secs(2)).await;
    }
}

mod hostile_input {
    use cobalt::server::get;
    use cobalt::Scheme;
    use cobalt::{Client, Code, Server};
    use std::time::Duration;

    /// xorshift: deterministic pseudo-random bytes without a dependency.
    fn noise(seed: &mut u64) -> u8 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed as u8
    }

    #[tokio::test]
    async fn garbage_datagrams_leave_no_state_and_the_server_keeps_serving() {
        let server = Server::new()
            .route("/ok", get(|| async { "still here" }))
            .shards(1)
            .bind("127.0.0.1:0")
            .await
            .unwrap();
        let to = server.local_addr(Scheme::Coap).unwrap();
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut sent = 0u64;
        for i in 0..3000usize {
            let len = match i % 5 {
                0 => 0,
                1 => 3,
                2 => 4 + (i % 12),
                3 => 9000, // larger than the receive slot: 4.13 or dropped
                _ => 1 + (i % 300),
            };
            let mut d: Vec<u8> = (0..len).map(|_| noise(&mut seed)).collect();
            if i % 7 == 0 && !d.is_empty() {
                d[0] = 0x49; // CON with token length 9: a format error to reject with RST
            }
            if sock.send_to(&d, to).is_ok() {
                sent += 1;
            }
            if i % 200 == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let r = Client::new().get(&format!("coap://{to}/ok")).await.unwrap();
        assert_eq!(
            (r.code, r.text_payload().as_str()),
            (Code::CONTENT, "still here")
        );
        // Each shard publishes its counters after a batch: wait for them.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut total = server.metrics().total();
        while total.format_errors == 0 || total.datagrams_in <= sent / 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "most garbage was read: {total:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
            total = server.metrics().total();
        }
        assert_eq!(
            total.server_exchanges, 0,
            "nothing left half-done: {total:?}"
        );
        // Only datagrams that happened to be well-formed messages may be remembered
        // (requests, and stray confirmable responses answered with RST).
        let remembered = total.requests + total.bad_options + total.unmatched;
        assert!(total.dedup_entries <= remembered, "{total:?}");
        server.shutdown(Duration::from_secs(1)).await;
    }
}

mod streaming_uploads {
    use cobalt::server::{MethodRouter, UploadChunk};
    use cobalt::Scheme;
    use cobalt::{Client, Code, Response, Server};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    #[tokio::test]
    async fn a_streaming_handler_sees_each_block_in_order_and_answers_at_the_end() {
        let seen: Arc<Mutex<Vec<(usize, usize, bool)>>> = Arc::default();
        let log = seen.clone();
        let server = Server::new()
            .route(
                "/sink",
                MethodRouter::default().stream_upload(Code::PUT, move |chunk: UploadChunk| {
                    let mut log = log.lock().unwrap();
                    log.push((chunk.offset, chunk.data().len(), chunk.last));
                    let total: usize = log.iter().map(|(_, n, _)| n).sum();
                    let last = chunk.last;
                    async move {
                        if last {
                            Response::new(Code::CHANGED)
                                .with_payload(format!("received {total} bytes"))
                        } else {
                            Response::new(Code::CONTINUE)
                        }
                    }
                }),
            )
            .bind("127.0.0.1:0")
            .await
            .unwrap();
        let body = vec![7u8; 5000];
        let r = Client::new()
            .request(
                Code::PUT,
                &format!("coap://{}/sink", server.local_addr(Scheme::Coap).unwrap()),
            )
            .payload(body)
            .block_size(256)
            .unwrap()
            .send()
            .await
            .unwrap();
        assert_eq!(
            (r.code, r.text_payload().as_str()),
            (Code::CHANGED, "received 5000 bytes")
        );
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 20, "one call per 256-byte block: {seen:?}");
        for (i, (offset, len, last)) in seen.iter().enumerate() {
            assert_eq!(*offset, i * 256);
            assert!(*len <= 256);
            assert_eq!(*last, i == 19);
        }
        server.shutdown(Duration::from_secs(1)).await;
    }
}

mod observe_reregistration {
    use cobalt::proto::message::{decode, encode, opt, Code, Message, MessageType};
    use cobalt::Client;
    use std::time::{Duration, Instant};

    /// A server that answers every observe registration once (Max-Age 1 s) and then
    /// falls silent: the client must register again after Max-Age (plus its grace).
    #[tokio::test]
    async fn a_silent_relation_is_registered_again_after_max_age() {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        let addr = sock.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let mut registrations = Vec::new();
            let mut buf = [0u8; 1500];
            while registrations.len() < 2 {
                let Ok((n, from)) = sock.recv_from(&mut buf) else {
                    break;
                };
                let Ok(req) = decode(&buf[..n]) else { continue };
                if req.code != Code::GET || req.options.observe() != Some(0) {
                    continue;
                }
                registrations.push(Instant::now());
                let mut resp = Message::new(MessageType::Acknowledgement, Code::CONTENT, req.mid);
                resp.token = req.token;
                resp.options
                    .set_uint(opt::OBSERVE, registrations.len() as u32);
                resp.options.set_uint(opt::MAX_AGE, 1);
                resp.payload = format!("registration {}", registrations.len()).into_bytes();
                sock.send_to(&encode(&resp), from).unwrap();
            }
            registrations
        });
        let client = Client::new();
        let mut obs = client.observe(&format!("coap://{addr}/x")).await.unwrap();
        let first = obs.next().await.unwrap().unwrap();
        assert_eq!(first.text_payload(), "registration 1");
        let second = tokio::time::timeout(Duration::from_secs(12), obs.next())
            .await
            .expect("re-registered within Max-Age + grace")
            .unwrap()
            .unwrap();
        assert_eq!(second.text_payload(), "registration 2");
        let regs = server.join().unwrap();
        assert_eq!(regs.len(), 2);
        assert!(
            regs[1] - regs[0] >= Duration::from_secs(1),
            "not before Max-Age"
        );
    }
}

mod amplification {
    use cobalt::proto::message::{Code, Message, MessageType};
    use cobalt::server::get;
    use cobalt::Scheme;
    use cobalt::{Client, EndpointConfig, Server};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// The client's address is verified with one ping round trip, then every block is
    /// full size; the client (Cobalt's) answers the ping with RST as RFC 7252 §4.3 asks.
    #[tokio::test]
    async fn an_unverified_client_answers_the_ping_and_gets_full_blocks() {
        let body: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        let served = body.clone();
        let server = Server::new()
            .route(
                "/big",
                get(move || {
                    let b = served.clone();
                    async move { b }
                }),
            )
            .bind("127.0.0.1:0")
            .await
            .unwrap();
        let seen: Arc<Mutex<Vec<(bool, Message)>>> = Arc::default();
        let log = seen.clone();
        let tracer: cobalt::runtime::Tracer = Arc::new(move |sent, _peer, bytes| {
            if let Ok(m) = cobalt::proto::message::decode(bytes) {
                log.lock().unwrap().push((sent, m));
            }
        });
        let client = Client::with_tracer(EndpointConfig::default(), tracer).unwrap();
        let r = client
            .get(&format!(
                "coap://{}/big",
                server.local_addr(Scheme::Coap).unwrap()
            ))
            .await
            .unwrap();
        assert_eq!(
            r.payload, body,
            "byte-exact after the verification round trip"
        );
        let seen = seen.lock().unwrap().clone();
        let ping = seen
            .iter()
            .find(|(sent, m)| !sent && m.mtype == MessageType::Confirmable && m.code == Code::EMPTY)
            .map(|(_, m)| m.mid)
            .expect("the server pinged the client");
        assert!(
            seen.iter()
                .any(|(sent, m)| *sent && m.mtype == MessageType::Reset && m.mid == ping),
            "the client answered the ping with RST"
        );
        let received: Vec<&Message> = seen.iter().filter(|(s, _)| !s).map(|(_, m)| m).collect();
        assert!(
            received.iter().all(|m| m.code != Code::UNAUTHORIZED),
            "no Echo needed"
        );
        let blocks: Vec<usize> = received
            .iter()
            .filter(|m| m.code == Code::CONTENT)
            .map(|m| m.payload.len())
            .collect();
        assert_eq!(
            blocks,
            [1024, 1024, 952],
            "full-size blocks from the first one"
        );
        let total = server.metrics().total();
        assert_eq!((total.probes_sent, total.addresses_verified), (1, 1));
        server.shutdown(Duration::from_secs(1)).await;
    }
}

/// Timers run on a saturated socket: a slow handler's request still gets its empty ACK
/// after the separate-ACK delay (1 s) while flooders keep the server's socket readable
/// all the time. Before, the driver ran timers only when its sleep won the race with
/// the socket, so under full load no separate ACK, retransmission or housekeeping ran
/// and the timer queue grew by every confirmable request (940 MB in 90 s).
#[test]
fn timers_run_while_the_socket_is_saturated() {
    use std::net::UdpSocket;
    use std::sync::atomic::AtomicBool;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(async {
        Server::new()
            .route("/hello", get(|| async { "hello world" }))
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(6)).await;
                    "finally"
                }),
            )
            .shards(1)
            .bind("127.0.0.1:0")
            .await
            .unwrap()
    });
    let addr = server.local_addr(Scheme::Coap).unwrap();
    // The request goes in first (a flooded socket drops datagrams), the flood after it.
    let legit = UdpSocket::bind("127.0.0.1:0").unwrap();
    legit
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    // CON GET /slow, MID 0x1234, no token
    legit
        .send_to(
            &[0x40, 0x01, 0x12, 0x34, 0xb4, b's', b'l', b'o', b'w'],
            addr,
        )
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flooders: Vec<_> = (0..3u16)
        .map(|n| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let s = UdpSocket::bind("127.0.0.1:0").unwrap();
                let mut mid = n.wrapping_mul(20_000);
                while !stop.load(Ordering::Relaxed) {
                    mid = mid.wrapping_add(1);
                    // NON GET /hello
                    let [hi, lo] = mid.to_be_bytes();
                    let hello = [0x50, 0x01, hi, lo, 0xb5, b'h', b'e', b'l', b'l', b'o'];
                    let _ = s.send_to(&hello, addr);
                }
            })
        })
        .collect();
    let sent = std::time::Instant::now();
    let mut buf = [0u8; 1500];
    let mut acked = None;
    while sent.elapsed() < Duration::from_secs(5) && acked.is_none() {
        if let Ok((n, _)) = legit.recv_from(&mut buf) {
            if buf[..n] == [0x60, 0x00, 0x12, 0x34] {
                acked = Some(sent.elapsed());
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        f.join().unwrap();
    }
    rt.block_on(server.shutdown(Duration::from_secs(1)));
    let acked = acked.expect("no empty ACK within 5 s while the socket was saturated");
    assert!(
        acked >= Duration::from_millis(900),
        "ACK came early: {acked:?}"
    );
}

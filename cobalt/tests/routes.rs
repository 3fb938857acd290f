//! Routes with parameters, a fallback and routes added and removed while the server
//! serves, over real sockets on loopback (UDP with two shards, and CoAP over TCP).

use cobalt::server::extract::{Path, Text};
use cobalt::server::{get, post, Observable, Request, Routes, State};
use cobalt::{Client, Code, Response, Scheme, Server};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The values of the things created so far, with their observables.
#[derive(Clone, Default)]
struct Things {
    next: Arc<AtomicU32>,
    values: Arc<Mutex<HashMap<u32, (String, Observable)>>>,
}

impl Things {
    fn value(&self, n: u32) -> Option<String> {
        self.values.lock().unwrap().get(&n).map(|(v, _)| v.clone())
    }
}

/// `/things/{n}` as created by POST: GET (observable), PUT, DELETE (removing itself).
fn thing(things: &Things, n: u32, obs: &Observable) -> cobalt::server::MethodRouter {
    let read = things.clone();
    get(move || {
        let value = read.value(n);
        async move { value.map_or(Response::new(Code::NOT_FOUND), Response::text) }
    })
    .put(
        move |State(things): State<Things>, Text(value): Text| async move {
            let mut values = things.values.lock().unwrap();
            let Some((stored, obs)) = values.get_mut(&n) else {
                return Code::NOT_FOUND;
            };
            *stored = value;
            obs.changed();
            Code::CHANGED
        },
    )
    .delete(move |routes: Routes, req: Request| async move {
        if routes.remove(&req.path()) {
            Code::DELETED
        } else {
            Code::NOT_FOUND
        }
    })
    .observable(obs)
    .rt("thing")
}

async fn server() -> cobalt::ServerHandle {
    Server::new()
        .with_state(Things::default())
        .route(
            "/things",
            post(
                |State(things): State<Things>, routes: Routes, Text(value): Text| async move {
                    let n = things.next.fetch_add(1, Ordering::Relaxed);
                    let obs = Observable::new();
                    let resource = thing(&things, n, &obs);
                    things.values.lock().unwrap().insert(n, (value, obs));
                    let path = format!("/things/{n}");
                    match routes.insert(&path, resource) {
                        Ok(()) => Response::created(&path),
                        Err(e) => {
                            Response::new(Code::INTERNAL_SERVER_ERROR).with_payload(e.to_string())
                        }
                    }
                },
            ),
        )
        .route(
            "/sum/{a}/{b}",
            get(|Path((a, b)): Path<(u32, u32)>| async move { (a + b).to_string() }),
        )
        .route(
            "/files/{*rest}",
            get(|req: Request| async move { format!("file {:?}", req.param("rest")) }),
        )
        .fallback(get(|req: Request| async move {
            format!("fallback {}", req.path())
        }))
        .listen(Scheme::CoapTcp, "127.0.0.1:0")
        .shards(2)
        .bind("127.0.0.1:0")
        .await
        .unwrap()
}

#[tokio::test]
async fn parameters_wildcards_and_the_fallback_answer() {
    let server = server().await;
    let base = format!("coap://{}", server.local_addr(Scheme::Coap).unwrap());
    let client = Client::new();
    let r = client.get(&format!("{base}/sum/2/40")).await.unwrap();
    assert_eq!((r.code, r.text_payload().as_str()), (Code::CONTENT, "42"));
    let r = client.get(&format!("{base}/sum/2/x")).await.unwrap();
    assert_eq!(r.code, Code::BAD_REQUEST);
    // Over UDP an unverified peer may get no diagnostic payload (amplification
    // limit); over TCP it does.
    let tcp = format!("coap+tcp://{}", server.local_addr(Scheme::CoapTcp).unwrap());
    let r = client.get(&format!("{tcp}/sum/2/x")).await.unwrap();
    assert_eq!(r.code, Code::BAD_REQUEST);
    assert!(r.text_payload().contains("`b`"), "{r:?}");
    let r = client.get(&format!("{base}/files/a/b.txt")).await.unwrap();
    assert_eq!(r.text_payload(), r#"file Some("a/b.txt")"#);
    let r = client.get(&format!("{base}/elsewhere")).await.unwrap();
    assert_eq!(r.text_payload(), "fallback /elsewhere");
    let r = client.post(&format!("{base}/elsewhere"), "").await.unwrap();
    assert_eq!(r.code, Code::METHOD_NOT_ALLOWED);
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn a_resource_created_at_run_time_is_served_listed_and_removed() {
    let server = server().await;
    let base = format!("coap://{}", server.local_addr(Scheme::Coap).unwrap());
    let client = Client::new();
    let r = client.post(&format!("{base}/things"), "v0").await.unwrap();
    assert_eq!(r.code, Code::CREATED, "{r:?}");
    assert_eq!(
        r.options.location_path_string().as_deref(),
        Some("/things/0")
    );
    let thing = format!("{base}/things/0");
    // Clients on other ports reach the other shard as well.
    for _ in 0..4 {
        let r = Client::new().get(&thing).await.unwrap();
        assert_eq!((r.code, r.text_payload().as_str()), (Code::CONTENT, "v0"));
    }
    let core = client
        .get(&format!("{base}/.well-known/core"))
        .await
        .unwrap();
    let listed = core.text_payload();
    assert!(listed.contains("</things/0>;obs;rt=\"thing\""), "{listed}");
    assert!(
        !listed.contains("{"),
        "pattern routes are not listed: {listed}"
    );

    let r = client.delete(&thing).await.unwrap();
    assert_eq!(r.code, Code::DELETED);
    for _ in 0..4 {
        let r = Client::new().get(&thing).await.unwrap();
        assert_eq!(
            (r.code, r.text_payload().as_str()),
            (Code::CONTENT, "fallback /things/0"),
            "gone: the fallback answers"
        );
    }
    let core = client
        .get(&format!("{base}/.well-known/core"))
        .await
        .unwrap();
    assert!(!core.text_payload().contains("/things/0"), "{core:?}");
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn a_resource_removed_from_outside_answers_4_04_without_a_fallback() {
    let server = Server::new()
        .route("/keep", get(|| async { "kept" }))
        .shards(2)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let base = format!("coap://{}", server.local_addr(Scheme::Coap).unwrap());
    let routes = server.routes();
    routes.insert("/added", get(|| async { "added" })).unwrap();
    let r = Client::new().get(&format!("{base}/added")).await.unwrap();
    assert_eq!(r.text_payload(), "added");
    assert!(routes.remove("/added"));
    let r = Client::new().get(&format!("{base}/added")).await.unwrap();
    assert_eq!(r.code, Code::NOT_FOUND);
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn observers_of_a_resource_created_at_run_time_are_notified() {
    let server = server().await;
    let client = Client::new();
    for (scheme, base) in [(Scheme::Coap, "coap"), (Scheme::CoapTcp, "coap+tcp")] {
        let base = format!("{base}://{}", server.local_addr(scheme).unwrap());
        let r = client.post(&format!("{base}/things"), "a").await.unwrap();
        let path = r.options.location_path_string().unwrap();
        let uri = format!("{base}{path}");
        let mut observation = client.observe(&uri).await.unwrap();
        let first = observation.next().await.unwrap().unwrap();
        assert_eq!(first.text_payload(), "a", "{scheme}");
        let r = client.put(&uri, "b").await.unwrap();
        assert_eq!(r.code, Code::CHANGED);
        let next = tokio::time::timeout(Duration::from_secs(5), observation.next())
            .await
            .expect("a notification within 5 s")
            .unwrap()
            .unwrap();
        assert_eq!(next.text_payload(), "b", "{scheme}");
        assert!(next.options.observe() > first.options.observe());
        let r = client.delete(&uri).await.unwrap();
        assert_eq!(r.code, Code::DELETED);
        let last = tokio::time::timeout(Duration::from_secs(5), observation.next())
            .await
            .expect("told within 5 s that the resource is gone")
            .unwrap()
            .unwrap();
        assert_eq!(last.code, Code::NOT_FOUND, "{scheme}");
    }
    server.shutdown(Duration::ZERO).await;
}

//! Directory nodes sharing one Redis store (a cluster without its balancer): what is
//! registered through one node is found, renewed and removed through another, and an
//! observed lookup on another node notifies it; two nodes racing for one endpoint name
//! make one registration; a node started later continues the stored lifetimes. Needs
//! `redis-server` (skipped without it, failed under `COBALT_REQUIRE_PEERS=1`).
#![cfg(feature = "redis")]

use cobalt::{content_format, Client, Code, Scheme, Server, ServerHandle};
use cobalt_rd::{
    lookup_at, Clock, RdClient, RdLimits, RedisStore, RegistrationStore, ResourceDirectory,
    SystemClock,
};
use cobalt_test_support::peers::{self, PeerServer};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// One node: its directory, its server, `coap://127.0.0.1:PORT`, and the sync task.
struct Node {
    rd: ResourceDirectory,
    server: ServerHandle,
    origin: String,
    _sync: tokio::task::JoinHandle<()>,
}

async fn node(redis: &PeerServer, clock: Arc<dyn Clock>) -> Node {
    let store = RedisStore::connect(&peers::redis::url(redis))
        .await
        .unwrap();
    let rd = ResourceDirectory::open_with_clock(Arc::new(store), RdLimits::default(), clock)
        .await
        .unwrap();
    let sync = rd.spawn_sync().expect("a shared store has a change feed");
    let server = rd.install(Server::new()).bind("127.0.0.1:0").await.unwrap();
    let origin = format!("coap://{}", server.local_addr(Scheme::Coap).unwrap());
    Node {
        rd,
        server,
        origin,
        _sync: sync,
    }
}

/// Waits until `holds` (the change feed is asynchronous), failing after 10 s.
async fn until<F: Future<Output = bool>>(what: &str, holds: impl Fn() -> F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !holds().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// (ep, expiry) of every registration in the store, by name.
async fn stored_expiries(redis: &PeerServer) -> Vec<(String, u64)> {
    let store = RedisStore::connect(&peers::redis::url(redis))
        .await
        .unwrap();
    let mut all: Vec<_> = store
        .load()
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.ep, r.expires_at))
        .collect();
    all.sort();
    all
}

/// The system clock shifted by `offset` seconds.
struct Shifted(u64);

impl Clock for Shifted {
    fn now(&self) -> u64 {
        SystemClock.now() + self.0
    }
}

#[tokio::test]
async fn a_registration_made_through_one_node_is_found_renewed_and_removed_through_another() {
    let Some(redis) = peers::redis::start() else {
        return;
    };
    let (a, b) = (
        node(&redis, Arc::new(SystemClock)).await,
        node(&redis, Arc::new(SystemClock)).await,
    );
    let client = Client::new();
    let mut registration = RdClient::new(client.clone(), &format!("{}/rd", a.origin), "sensor-1")
        .lifetime(600)
        .links("</temp>;rt=\"temperature\"");
    let location = registration.register().await.unwrap().to_string();
    until("node b holds the registration", || async {
        b.rd.len().await == 1
    })
    .await;
    let found = lookup_at(
        &client,
        &format!("{}/rd-lookup/ep", b.origin),
        &[("ep", "sensor-1")],
    )
    .await
    .unwrap();
    assert_eq!(found.len(), 1);
    let path = location.strip_prefix(&a.origin).unwrap();
    // Renewed through b by the same client (its owner): a's view follows.
    let r = client
        .post(&format!("{}{path}?lt=1200&et=x", b.origin), Vec::new())
        .await
        .unwrap();
    assert_eq!(r.code, Code::CHANGED, "{}", r.text_payload());
    let found_by_et = || async {
        let lookup = format!("{}/rd-lookup/ep", a.origin);
        lookup_at(&client, &lookup, &[("et", "x")])
            .await
            .unwrap()
            .len()
            == 1
    };
    until("node a sees the renewal", found_by_et).await;
    assert_eq!(
        client
            .delete(&format!("{}{path}", b.origin))
            .await
            .unwrap()
            .code,
        Code::DELETED
    );
    until("node a sees the removal", || async {
        a.rd.is_empty().await
    })
    .await;
    a.server.shutdown(Duration::ZERO).await;
    b.server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn two_nodes_registering_one_endpoint_at_once_make_one_registration() {
    let Some(redis) = peers::redis::start() else {
        return;
    };
    let (a, b) = (
        node(&redis, Arc::new(SystemClock)).await,
        node(&redis, Arc::new(SystemClock)).await,
    );
    let client = Client::new();
    let register = |origin: &str| {
        client
            .request(Code::POST, &format!("{origin}/rd?ep=twin&lt=300"))
            .content_format(content_format::LINK_FORMAT)
            .payload("</a>")
            .send()
    };
    for round in 0..5 {
        let (ra, rb) = tokio::join!(register(&a.origin), register(&b.origin));
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        assert_eq!(
            (ra.code, rb.code),
            (Code::CREATED, Code::CREATED),
            "round {round}"
        );
        // Whichever came second replaced the first: one name, one id.
        assert_eq!(
            ra.options.location_path_string(),
            rb.options.location_path_string()
        );
    }
    let store = RedisStore::connect(&peers::redis::url(&redis))
        .await
        .unwrap();
    assert_eq!(store.load().await.unwrap().len(), 1);
    a.server.shutdown(Duration::ZERO).await;
    b.server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn a_node_started_later_continues_the_stored_lifetimes() {
    let Some(redis) = peers::redis::start() else {
        return;
    };
    let a = node(&redis, Arc::new(SystemClock)).await;
    let client = Client::new();
    let mut short =
        RdClient::new(client.clone(), &format!("{}/rd", a.origin), "short").lifetime(100);
    short.register().await.unwrap();
    let mut long = RdClient::new(Client::new(), &format!("{}/rd", a.origin), "long").lifetime(1000);
    long.register().await.unwrap();
    let before = stored_expiries(&redis).await;
    // 500 s later by its clock: `short` ran out while no node looked, `long` goes on
    // to the same absolute expiry.
    let later = node(&redis, Arc::new(Shifted(500))).await;
    assert_eq!(later.rd.len().await, 1);
    let after = stored_expiries(&redis).await;
    assert_eq!(
        after,
        vec![before.iter().find(|(ep, _)| ep == "long").unwrap().clone()]
    );
    until("node a sees the expiry", || async { a.rd.len().await == 1 }).await;
    a.server.shutdown(Duration::ZERO).await;
    later.server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn an_observer_of_one_node_is_notified_of_registrations_made_through_another() {
    let Some(redis) = peers::redis::start() else {
        return;
    };
    let (a, b) = (
        node(&redis, Arc::new(SystemClock)).await,
        node(&redis, Arc::new(SystemClock)).await,
    );
    let observer = Client::new();
    let mut lookup = observer
        .observe(&format!("{}/rd-lookup/res?rt=temperature", b.origin))
        .await
        .unwrap();
    assert_eq!(lookup.next().await.unwrap().unwrap().text_payload(), "");
    let mut device = RdClient::new(Client::new(), &format!("{}/rd", a.origin), "far")
        .links("</t>;rt=\"temperature\"");
    device.register().await.unwrap();
    let notified = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let text = lookup.next().await.unwrap().unwrap().text_payload();
            if text.contains("/t>") {
                return text;
            }
        }
    })
    .await
    .expect("node b notifies its observer of node a's registration");
    assert!(notified.contains("rt=\"temperature\""), "{notified}");
    device.remove().await.unwrap();
    let emptied = tokio::time::timeout(Duration::from_secs(10), async {
        while !lookup
            .next()
            .await
            .unwrap()
            .unwrap()
            .text_payload()
            .is_empty()
        {}
    })
    .await;
    assert!(emptied.is_ok(), "node b notifies the removal too");
    lookup.cancel().await.unwrap();
    a.server.shutdown(Duration::ZERO).await;
    b.server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn a_node_that_loses_the_store_is_not_ready_until_it_has_loaded_it_again() {
    let Some(redis) = peers::redis::start() else {
        return;
    };
    let (url, port) = (peers::redis::url(&redis), redis.port);
    let store = RedisStore::connect(&url).await.unwrap();
    let rd = ResourceDirectory::open_with_clock(
        Arc::new(store),
        RdLimits::default(),
        Arc::new(SystemClock),
    )
    .await
    .unwrap();
    let readiness = cobalt::metrics::Readiness::default();
    let _sync = rd.spawn_sync_reporting(readiness.clone()).unwrap();
    until("ready", || async { readiness.why_not().is_none() }).await;

    // The store goes away (a crash, or this node cut off from it).
    drop(redis);
    until("not ready", || async { readiness.why_not().is_some() }).await;
    let why = readiness.why_not().unwrap();
    assert!(why.contains("redis"), "{why}");

    // It comes back on the same address: the node loads it again and is ready.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let bin = cobalt_test_support::peers::on_path("redis-server").unwrap();
    let _again = Killed(
        std::process::Command::new(bin)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--port", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    until("ready again", || async { readiness.why_not().is_none() }).await;
}

//! The mashup against a real resource directory and simulated devices: it finds the
//! devices, its aggregate follows their readings and is observable, a device that
//! de-registers drops out, and the bound on observations holds.
//!
//! The devices change every 50 ms; the test waits for conditions (with a generous
//! deadline that only fails a test that is broken), never for a time.

use cobalt::server::ServerHandle;
use cobalt::{Client, Scheme, Server};
use cobalt_fleet::content::Profile;
use cobalt_fleet::device::DeviceSettings;
use cobalt_fleet::fleet::{Fleet, FleetConfig};
use cobalt_fleet::mashup::{Mashup, MashupConfig};
use cobalt_fleet::registration::DirectoryTarget;
use cobalt_rd::{MemoryStore, RdLimits, ResourceDirectory};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Polls `$cond` (an expression, may `.await`) until it holds; panics naming `$what`
/// after 20 s.
macro_rules! wait_until {
    ($what:expr, $cond:expr) => {{
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if $cond {
                break;
            }
            assert!(Instant::now() < deadline, "gave up waiting until {}", $what);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }};
}

async fn directory() -> (ServerHandle, ResourceDirectory, SocketAddr) {
    let rd = ResourceDirectory::open(Arc::new(MemoryStore::new()), RdLimits::default())
        .await
        .unwrap();
    let server = rd
        .install(Server::new())
        .shards(1)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::Coap).unwrap();
    (server, rd, addr)
}

async fn fleet(rd: SocketAddr, devices: u32, prefix: &str) -> Fleet {
    let mut settings = DeviceSettings::new(Profile::Rd);
    settings.directory = Some(DirectoryTarget {
        profile: Profile::Rd,
        server: rd,
        path: Vec::new(),
    });
    settings.change_every = Some(Duration::from_millis(50));
    let mut config = FleetConfig::new(devices, settings);
    config.ep_prefix = prefix.into();
    Fleet::start(config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mashup_follows_the_devices_of_the_directory() {
    let (rd_server, rd, rd_addr) = directory().await;
    let staying = fleet(rd_addr, 3, "stay-").await;
    let leaving = fleet(rd_addr, 1, "leave-").await;
    wait_until!("4 devices registered", rd.len().await == 4);

    let client = Client::new();
    let mut config = MashupConfig::new(&format!("coap://{rd_addr}"));
    config.max_observed = 10;
    let mashup = Mashup::new(client.clone(), config);
    let server = Server::new()
        .route("/aggregate", mashup.resource())
        .shards(1)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let aggregate_uri = format!(
        "coap://{}/aggregate",
        server.local_addr(Scheme::Coap).unwrap()
    );

    mashup.follow().await.unwrap();
    assert_eq!(mashup.observed(), 4);
    wait_until!("a reading from each device", mashup.aggregate().count == 4);
    let agg = mashup.aggregate();
    assert!(agg.mean.unwrap() <= agg.max.unwrap());
    assert!((10.0..40.0).contains(&agg.max.unwrap()), "{agg:?}");

    // The aggregate is observable and changes as the devices' readings do.
    let mut obs = client.observe(&aggregate_uri).await.unwrap();
    let first = obs.next().await.unwrap().unwrap().text_payload();
    let json: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(json["count"], 4, "{first}");
    let next = obs.next().await.unwrap().unwrap().text_payload();
    assert_ne!(first, next, "a notification shows a new aggregate");
    assert!(mashup.notifications() >= 4, "one per device at least");

    // A device that de-registers drops out at the next lookup.
    let gone = leaving.shutdown().await;
    assert_eq!(gone.deregistrations, 1, "{gone}");
    mashup.follow().await.unwrap();
    assert_eq!(mashup.observed(), 3);
    assert_eq!(mashup.aggregate().count, 3, "its reading left with it");
    wait_until!(
        "a notification of the smaller aggregate",
        serde_json::from_str::<serde_json::Value>(
            &obs.next().await.unwrap().unwrap().text_payload()
        )
        .unwrap()["count"]
            == 3
    );

    // At most max_observed at once; the rest is counted.
    let mut bounded = MashupConfig::new(&format!("coap://{rd_addr}"));
    bounded.max_observed = 2;
    let small = Mashup::new(client.clone(), bounded);
    small.follow().await.unwrap();
    assert_eq!(small.observed(), 2);
    wait_until!("readings of the two observed", small.aggregate().count == 2);
    assert_eq!(small.aggregate().unobserved, 1);

    let summary = staying.shutdown().await;
    assert_eq!(summary.deregistrations, 3, "{summary}");
    assert!(summary.notifications > 0, "{summary}");
    assert_eq!(rd.len().await, 0);
    server.shutdown(Duration::ZERO).await;
    rd_server.shutdown(Duration::ZERO).await;
}

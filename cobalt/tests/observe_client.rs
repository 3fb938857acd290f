//! The client side of an observation against a server that goes away: bounded
//! re-registrations that are reported, then [`Error::ObservationLost`].

use cobalt::Scheme;
use cobalt::{Client, Error};
use std::sync::{Arc, Mutex};

/// A server that never answers (its socket is open, so no ICMP error comes back): the
/// observation registers again [`cobalt::client::MAX_REREGISTRATIONS`] times, telling
/// the hook each time, and then ends with `ObservationLost`. The test runtime's clock
/// is paused, so Max-Age and the grace pass without waiting.
#[tokio::test(start_paused = true)]
async fn a_silent_server_is_given_up_after_bounded_reregistrations() {
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let mut obs = Client::new()
        .observe(&format!("coap://{addr}/obs"))
        .await
        .unwrap()
        .on_reregister(move |r| log.lock().unwrap().push(r.clone()));
    match obs.next().await {
        Some(Err(Error::ObservationLost { peer, attempts })) => {
            assert_eq!(peer, addr);
            assert_eq!(attempts, cobalt::client::MAX_REREGISTRATIONS);
        }
        other => panic!("expected ObservationLost, got {other:?}"),
    }
    assert!(obs.next().await.is_none(), "the observation has ended");
    let seen = seen.lock().unwrap();
    let attempts: Vec<(u32, u32)> = seen.iter().map(|r| (r.attempt, r.max)).collect();
    assert_eq!(attempts, [(1, 3), (2, 3), (3, 3)]);
    assert!(seen[0].reason.contains(&addr.to_string()), "{:?}", seen[0]);
    // The message says what happened and what it means, readable from `main`.
    let e = Error::ObservationLost {
        peer: addr,
        attempts: 3,
    }
    .to_string();
    assert!(e.contains("went away"), "{e}");

    // The server saw every registration (the first and three more).
    silent
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 1500];
    let mut registrations = std::collections::HashSet::new();
    while registrations.len() < 4 {
        let (n, _) = silent.recv_from(&mut buf).expect("a registration");
        let m = cobalt::proto::message::decode(&buf[..n]).unwrap();
        assert_eq!(m.options.observe(), Some(0));
        registrations.insert(m.token);
    }
}

/// The blocking client observes too: an iterator of notifications, then `cancel`.
#[test]
fn the_blocking_client_observes_with_an_iterator() {
    use cobalt::server::{get, Observable};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let temp = Observable::new();
    let value = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let read = value.clone();
    let server = rt
        .block_on(
            cobalt::Server::new()
                .route(
                    "/temp",
                    get(move || {
                        let v = read.load(std::sync::atomic::Ordering::SeqCst);
                        async move { format!("t={v}") }
                    })
                    .observable(&temp),
                )
                .bind("127.0.0.1:0"),
        )
        .unwrap();
    let client = cobalt::client::blocking::Client::new();
    let uri = format!("coap://{}/temp", server.local_addr(Scheme::Coap).unwrap());
    let mut obs = client.observe(&uri).unwrap();
    let first = obs.next().unwrap().unwrap();
    assert_eq!(first.text_payload(), "t=0");
    for i in 1..=2 {
        value.store(i, std::sync::atomic::Ordering::SeqCst);
        temp.changed();
        let n = obs
            .next_timeout(std::time::Duration::from_secs(10))
            .unwrap()
            .unwrap();
        assert_eq!(n.text_payload(), format!("t={i}"));
    }
    assert_eq!(temp.observer_count(), 1);
    let last = obs.cancel().unwrap();
    assert!(last.options.observe().is_none(), "deregistered");
    assert_eq!(temp.observer_count(), 0);
    rt.block_on(server.shutdown(std::time::Duration::ZERO));
}

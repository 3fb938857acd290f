//! Observe (RFC 7641) interoperability with real peers on loopback, both directions,
//! including observation of a resource larger than one block (RFC 7959 §3.4):
//!
//! * libcoap's `coap-client-notls -s` and aiocoap (`tests/peers/aiocoap_observe.py`)
//!   observing a Cobalt server (in this process, so the observer count can be checked);
//! * Cobalt's client observing aiocoap's observable resources.

use crate::{aiocoap_server, coap_client, notifications};
use cobalt::server::{get, Observable, ServerLimits};
use cobalt::Scheme;
use cobalt::{Client, Code, EndpointConfig, Server, ServerHandle};
use cobalt_test_support::need;
use cobalt_test_support::peers::libcoap::{self, Port};
use cobalt_test_support::peers::{aiocoap, repo_root, COMMAND_LIMIT};
use cobalt_test_support::ports::V4;
use cobalt_test_support::process;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A Cobalt server with `/obs` ("tick N") and `/big` (2000 bytes starting "tick N"),
/// both changing every 300 ms while the runtime runs.
struct ObservedServer {
    rt: tokio::runtime::Runtime,
    handle: Option<ServerHandle>,
    obs: Observable,
}

fn big_body(n: u64) -> Vec<u8> {
    let mut b = format!("tick {n} ").into_bytes();
    b.resize(2000, b'x');
    b
}

impl ObservedServer {
    fn start() -> ObservedServer {
        ObservedServer::start_with(ServerLimits::default(), EndpointConfig::default())
    }

    fn start_with(limits: ServerLimits, config: EndpointConfig) -> ObservedServer {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let (obs, big) = (Observable::new(), Observable::new());
        let ticks = Arc::new(AtomicU64::new(0));
        let (t1, t2) = (ticks.clone(), ticks.clone());
        let handle = rt.block_on(
            Server::new()
                .route(
                    "/obs",
                    get(move || {
                        let n = t1.load(Ordering::SeqCst);
                        async move { format!("tick {n}") }
                    })
                    .observable(&obs),
                )
                .route(
                    "/big",
                    get(move || {
                        let n = t2.load(Ordering::SeqCst);
                        async move { big_body(n) }
                    })
                    .observable(&big),
                )
                .limits(limits)
                .config(config)
                .bind("127.0.0.1:0"),
        );
        let handle = handle.expect("bind");
        let (o, b) = (obs.clone(), big.clone());
        rt.spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(300)).await;
                ticks.fetch_add(1, Ordering::SeqCst);
                o.changed();
                b.changed();
            }
        });
        ObservedServer {
            rt,
            handle: Some(handle),
            obs,
        }
    }

    fn uri(&self, path: &str) -> String {
        let addr = self
            .handle
            .as_ref()
            .map(|h| h.local_addr(Scheme::Coap).unwrap())
            .expect("running");
        format!("coap://{addr}{path}")
    }

    /// Waits (bounded) until `o` has no observers left.
    fn wait_unobserved(&self, o: &Observable) -> usize {
        for _ in 0..100 {
            if o.observer_count() == 0 {
                return 0;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        o.observer_count()
    }
}

impl Drop for ObservedServer {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            self.rt.block_on(h.shutdown(Duration::from_millis(100)));
        }
    }
}

/// The numbers after "tick " in the order they appear.
fn ticks(text: &str) -> Vec<u64> {
    text.split("tick ")
        .skip(1)
        .filter_map(|s| s.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .collect()
}

fn increasing(v: &[u64]) -> bool {
    v.windows(2).all(|w| w[0] < w[1])
}

#[test]
fn libcoap_client_observes_cobalt_and_the_relation_ends_with_it() {
    let bin = need!(libcoap::CLIENT, libcoap::tool(libcoap::CLIENT));
    let server = ObservedServer::start();
    let r = coap_client(&bin, &["-s", "2", &server.uri("/obs")]);
    let seen = ticks(&r.stdout);
    assert!(seen.len() >= 3, "notifications printed: {r:#?}");
    assert!(increasing(&seen), "{seen:?}");
    assert_eq!(
        server.wait_unobserved(&server.obs),
        0,
        "observer removed after libcoap left"
    );
}

#[test]
fn libcoap_client_observes_a_large_cobalt_resource_whole() {
    let bin = need!(libcoap::CLIENT, libcoap::tool(libcoap::CLIENT));
    let server = ObservedServer::start();
    let r = coap_client(&bin, &["-s", "2", &server.uri("/big")]);
    let seen = ticks(&r.stdout);
    assert!(seen.len() >= 2, "{r:#?}");
    // Every notification is printed whole: 2000 bytes each.
    let x_runs: Vec<usize> = r
        .stdout
        .split("tick ")
        .skip(1)
        .map(|s| s.chars().filter(|c| *c == 'x').count())
        .collect();
    assert!(
        x_runs.iter().all(|n| *n > 1900),
        "truncated notifications: {x_runs:?}"
    );
}

/// aiocoap 0.4.17's `observation.cancel()` sends nothing and its client does not
/// reject later NON notifications with RST (seen on the wire), so the relation can
/// only end the way RFC 7641 §4.5 provides for silent observers: a confirmable
/// notification that is not acknowledged. Here every second notification is
/// confirmable and retransmission gives up quickly, so the observer goes in seconds.
#[test]
fn aiocoap_observes_cobalt_and_the_silent_observer_is_dropped() {
    let python = need!("aiocoap", aiocoap::python());
    let limits = ServerLimits {
        con: cobalt::server::ConPolicy {
            every: 2,
            ..Default::default()
        },
        ..Default::default()
    };
    let config = EndpointConfig {
        ack_timeout: Duration::from_millis(200),
        max_retransmit: 2,
        ..Default::default()
    };
    let server = ObservedServer::start_with(limits, config);
    let script = repo_root().join("tests/peers/aiocoap_observe.py");
    let r = process::run(
        Command::new(&python)
            .arg(&script)
            .arg(server.uri("/obs"))
            .arg("4"),
        COMMAND_LIMIT,
    )
    .ok();
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{r:#?}");
    let observe_numbers: Vec<u64> = lines
        .iter()
        .map(|l| {
            l.split('\t')
                .next()
                .unwrap_or("")
                .parse()
                .expect("Observe number")
        })
        .collect();
    assert!(increasing(&observe_numbers), "{observe_numbers:?}");
    assert!(increasing(&ticks(&r.stdout)), "{r:#?}");
    assert_eq!(
        server.wait_unobserved(&server.obs),
        0,
        "the unacknowledged CON notification removed the observer"
    );
}

fn counts(text: &str) -> Option<u64> {
    text.strip_prefix("count ")?.split(' ').next()?.parse().ok()
}

#[test]
fn cobalt_observes_aiocoap_in_order_and_cancels() {
    let Some(server) = aiocoap_server() else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let client = Client::new();
        let mut obs = client
            .observe(&server.uri("/counter"))
            .await
            .expect("register");
        let mut values = Vec::new();
        for n in notifications(&mut obs, 4).await {
            assert_eq!(n.code, Code::CONTENT);
            assert!(n.options.observe().is_some(), "registered");
            values.push(counts(&n.text_payload()).expect("count N"));
        }
        assert!(increasing(&values), "{values:?}");
        let last = obs.cancel().await.expect("deregistration answered");
        assert_eq!(last.code, Code::CONTENT);
        assert!(last.options.observe().is_none(), "deregistered");
    });
}

#[test]
fn cobalt_observes_a_large_aiocoap_resource_whole() {
    let Some(server) = aiocoap_server() else {
        return;
    };
    let r = process::run(
        crate::binary::cobalt()
            .args(["observe", "-n", "3", "--timeout", "20"])
            .arg(server.uri("/big-counter")),
        COMMAND_LIMIT,
    )
    .ok();
    // Each notification is 2000 bytes; the CLI puts each on its own line.
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{r:#?}");
    assert!(lines.iter().all(|l| l.len() == 2000), "whole notifications");
    let values: Vec<u64> = lines.iter().filter_map(|l| counts(l)).collect();
    assert_eq!(values.len(), 3);
    assert!(
        increasing(&values) || values.windows(2).all(|w| w[0] <= w[1]),
        "{values:?}"
    );
}

/// Waits (up to 10 s) until `done` holds, re-evaluating it every 100 ms.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `cobalt observe --count 2` against libcoap's server ends the relation with a GET
/// carrying Observe=1, which libcoap logs (`-v 7`) as removing the subscription.
#[test]
fn cobalt_observe_cancels_its_relation_with_libcoap() {
    let bin = need!(libcoap::SERVER, libcoap::tool(libcoap::SERVER));
    let log = std::env::temp_dir().join(format!("cobalt-libcoap-obs-{}.log", std::process::id()));
    let server = libcoap::server(&bin, V4, &["-v", "7"], Port::CoapQuiet, Some(&log));
    let r = process::run(
        crate::binary::cobalt()
            .args(["observe", "--count", "2"])
            .arg(server.uri("/time")),
        COMMAND_LIMIT,
    )
    .ok();
    assert_eq!(r.stdout.lines().count(), 2, "{r:#?}");
    eventually("libcoap removed the subscription", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("Observe:1, Uri-Path:time") && text.contains("removed subscription")
    });
    drop(server);
    std::fs::remove_file(&log).ok();
}

/// The same against aiocoap's server, whose `/observers` tells how many observers
/// `/counter` has. (aiocoap also drops an observer on an ICMP error, so `-v` shows
/// that the GET with Observe=1 went out and was answered without Observe.)
#[test]
fn cobalt_observe_cancels_its_relation_with_aiocoap() {
    let Some(server) = aiocoap_server() else {
        return;
    };
    let observers = || {
        cobalt::client::blocking::Client::new()
            .get(&server.uri("/observers"))
            .map(|r| r.text_payload())
            .unwrap_or_default()
    };
    eventually("no observer at first", || observers() == "0");
    let r = process::run(
        crate::binary::cobalt()
            .args(["observe", "-v", "--count", "2"])
            .arg(server.uri("/counter")),
        COMMAND_LIMIT,
    )
    .ok();
    assert_eq!(r.stdout.lines().count(), 2, "{r:#?}");
    // -v prints each message as a head line and indented option lines.
    let mut messages: Vec<String> = Vec::new();
    for line in r.stderr.lines() {
        if line.starts_with(">   ") || line.starts_with("<   ") {
            if let Some(m) = messages.last_mut() {
                m.push_str(line);
                m.push('\n');
            }
        } else {
            messages.push(format!("{line}\n"));
        }
    }
    let cancel = messages
        .iter()
        .position(|m| m.starts_with("> ") && m.contains("Observe: 1"))
        .unwrap_or_else(|| panic!("no deregistration sent: {r:#?}"));
    let answer = messages[cancel..]
        .iter()
        .find(|m| m.starts_with("< ") && m.contains(" ACK "))
        .unwrap_or_else(|| panic!("the deregistration was not answered: {r:#?}"));
    assert!(answer.contains("2.05 Content"), "{answer}");
    assert!(
        !answer.contains("Observe:"),
        "answered without Observe: {answer}"
    );
    eventually("aiocoap dropped the observer", || observers() == "0");
}

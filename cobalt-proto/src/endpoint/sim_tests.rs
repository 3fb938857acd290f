//! Deterministic simulation: many clients and one server over a simulated network that
//! loses, duplicates, delays and reorders datagrams, driven by a virtual clock.
//!
//! Properties checked for every seed:
//! - a non-idempotent request's handler runs at most once;
//! - every request ends exactly once, with a response or a timeout;
//! - a response carries what the handler produced for that very request;
//! - once the lifetimes have passed, no state is left in any endpoint.

use super::*;
use crate::message::{Code, Message, MessageType};
use crate::sim::net::{LossyConfig, LossyNet};
use crate::sim::Sim;

#[derive(Default)]
struct Outcome {
    executions: HashMap<Vec<u8>, u32>,
    ended: HashMap<(usize, RequestId), u32>,
    responses: u32,
    timeouts: u32,
}

fn run(
    seed: u64,
    net: LossyConfig,
    clients: usize,
    requests_each: usize,
) -> (Outcome, Sim<LossyNet>, Vec<Vec<RequestId>>) {
    let mut sim = Sim::new(LossyNet::new(net, seed), seed);
    sim.add_nodes(clients + 1, &EndpointConfig::default());
    let start = sim.now();
    let mut out = Outcome::default();
    let mut ids: Vec<Vec<RequestId>> = vec![Vec::new(); clients + 1];
    let mut expected: HashMap<(usize, RequestId), Vec<u8>> = HashMap::new();
    #[allow(clippy::needless_range_loop)]
    for c in 1..=clients {
        for r in 0..requests_each {
            let mut m = Message::new(MessageType::Confirmable, Code::POST, 0);
            if r % 3 == 2 {
                m.mtype = MessageType::NonConfirmable;
            }
            m.options.set_uri_path("/counter");
            m.payload = format!("c{c}-r{r}").into_bytes();
            let server = sim.addr(0);
            let id = sim.endpoint(c).request(start, server, m.clone()).unwrap();
            expected.insert((c, id), m.payload);
            ids[c].push(id);
        }
    }
    // The server answers some requests late: (due, exchange, payload).
    let mut late: Vec<(Instant, ExchangeId, Vec<u8>)> = Vec::new();
    let horizon = start + Duration::from_secs(2000);
    while let Some(now) = sim.step(horizon) {
        // Server application.
        while let Some(ev) = sim.endpoint(0).poll_event() {
            if let Event::Request { id, request, .. } = ev {
                *out.executions.entry(request.payload.clone()).or_default() += 1;
                if sim.rng().random_bool(0.3) {
                    let delay = Duration::from_millis(sim.rng().random_range(500..4000));
                    late.push((now + delay, id, request.payload));
                } else {
                    let mut resp = Message::new(MessageType::Acknowledgement, Code::CHANGED, 0);
                    resp.payload = request.payload;
                    sim.endpoint(0).respond(now, id, resp).unwrap();
                }
            }
        }
        late.retain(|(due, id, payload)| {
            if *due <= now {
                let mut resp = Message::new(MessageType::Acknowledgement, Code::CHANGED, 0);
                resp.payload = payload.clone();
                sim.endpoint(0).respond(now, *id, resp).unwrap();
                false
            } else {
                true
            }
        });
        if let Some(due) = late.iter().map(|l| l.0).min() {
            sim.wake(0, due);
        }
        // Client applications.
        for c in 1..sim.len() {
            while let Some(ev) = sim.endpoint(c).poll_event() {
                match ev {
                    Event::Response { id, response } => {
                        assert_eq!(
                            Some(&response.payload),
                            expected.get(&(c, id)),
                            "response matched to the wrong request"
                        );
                        *out.ended.entry((c, id)).or_default() += 1;
                        out.responses += 1;
                    }
                    Event::Timeout { id, .. } | Event::Reset { id, .. } => {
                        *out.ended.entry((c, id)).or_default() += 1;
                        out.timeouts += 1;
                    }
                    other => panic!("unexpected client event {other:?}"),
                }
            }
        }
    }
    (out, sim, ids)
}

fn check(out: &Outcome, sim: &Sim<LossyNet>, ids: &[Vec<RequestId>]) {
    for (payload, n) in &out.executions {
        assert!(
            *n <= 1,
            "{} executed {n} times",
            String::from_utf8_lossy(payload)
        );
    }
    for (c, client_ids) in ids.iter().enumerate() {
        for id in client_ids {
            let ended = out.ended.get(&(c, *id));
            assert_eq!(
                ended,
                Some(&1),
                "client {c} request {id:?} must end exactly once"
            );
        }
    }
    for i in 0..sim.len() {
        assert_eq!(
            sim.endpoint_ref(i).state_counts(),
            StateCounts::default(),
            "node {i} leaked state"
        );
    }
}

#[test]
fn perfect_network_completes_everything() {
    let net = LossyConfig {
        loss: 0.0,
        duplicate: 0.0,
        max_delay_ms: 20,
    };
    let (out, sim, ids) = run(1, net, 5, 6);
    check(&out, &sim, &ids);
    assert_eq!(out.responses, 30);
    assert_eq!(out.timeouts, 0);
}

#[test]
fn lossy_duplicating_reordering_network_keeps_the_invariants() {
    for seed in 0..25 {
        let net = LossyConfig {
            loss: 0.25,
            duplicate: 0.2,
            max_delay_ms: 1500,
        };
        let (out, sim, ids) = run(seed, net, 4, 5);
        check(&out, &sim, &ids);
        assert!(out.responses > 0, "seed {seed}: something must get through");
    }
}

#[test]
fn heavy_duplication_never_reruns_handlers() {
    for seed in 100..110 {
        let net = LossyConfig {
            loss: 0.0,
            duplicate: 0.9,
            max_delay_ms: 3000,
        };
        let (out, sim, ids) = run(seed, net, 3, 4);
        check(&out, &sim, &ids);
        // Duplication alone loses nothing, but NON requests carry no retransmission,
        // so all of them must be answered as well.
        assert_eq!(out.timeouts, 0, "seed {seed}");
    }
}

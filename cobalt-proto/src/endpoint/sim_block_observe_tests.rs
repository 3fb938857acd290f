//! Simulated block-wise transfers and observations over a hostile network:
//! - a Block2 download either completes byte-exact or fails with a timeout (the
//!   client's address is verified on the way; where the pings are lost, the client
//!   repeats the Echo value of the 4.01 it gets, RFC 9175);
//! - the notifications a client surfaces (after the RFC 7641 §3.4 freshness rule)
//!   are in increasing sequence order;
//! - nothing is left in any endpoint afterwards.

use super::*;
use crate::blockwise::slice_response;
use crate::message::{opt, BlockValue, Code, Message, MessageType};
use crate::observe::{is_fresh, SEQ_MASK};
use crate::sim::net::{LossyConfig, LossyNet};
use crate::sim::Sim;

fn body() -> Vec<u8> {
    (0..5000u32).map(|i| (i * 7 % 251) as u8).collect()
}

fn get_block(num: u32) -> Message {
    let mut m = Message::new(MessageType::Confirmable, Code::GET, 0);
    m.options.set_uri_path("/big");
    if num > 0 {
        m.options.set_uint(
            opt::BLOCK2,
            BlockValue::new(num, false, 4).unwrap().encode(),
        );
    }
    m
}

#[test]
fn block2_downloads_are_byte_exact_or_fail_cleanly() {
    let full = body();
    let (mut completed, mut failed, mut echoed) = (0, 0, 0);
    for seed in 0..20 {
        let net = LossyConfig {
            loss: 0.15,
            duplicate: 0.1,
            max_delay_ms: 800,
        };
        let mut sim = Sim::new(LossyNet::new(net, seed), seed);
        sim.add_nodes(3, &EndpointConfig::default());
        let server = sim.addr(0);
        let horizon = sim.now() + Duration::from_secs(3000);
        let mut got: Vec<Vec<u8>> = vec![Vec::new(); 3];
        let mut done = [false; 3];
        for c in 1..3 {
            let now = sim.now();
            sim.endpoint(c).request(now, server, get_block(0)).unwrap();
        }
        while let Some(now) = sim.step(horizon) {
            while let Some(ev) = sim.endpoint(0).poll_event() {
                if let Event::Request { id, request, .. } = ev {
                    let mut resp = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
                    resp.payload = full.clone();
                    let sliced = slice_response(&request, resp, 4);
                    sim.endpoint(0).respond(now, id, sliced).unwrap();
                }
            }
            for c in 1..3 {
                while let Some(ev) = sim.endpoint(c).poll_event() {
                    match ev {
                        Event::Response { response, .. } if response.code == Code::UNAUTHORIZED => {
                            // Address verification failed (lost pings): ask again with
                            // the Echo value (RFC 9175), for the block we are at.
                            let echo = response.options.get(opt::ECHO).expect("Echo");
                            let mut again = get_block(got[c].len() as u32 / 256);
                            again.options.set(opt::ECHO, echo);
                            sim.endpoint(c).request(now, server, again).unwrap();
                            echoed += 1;
                        }
                        Event::Response { response, .. } => {
                            let b = response.block2().expect("every answer is a block");
                            assert_eq!(b.offset(), got[c].len(), "blocks arrive in order");
                            got[c].extend_from_slice(&response.payload);
                            if b.more {
                                sim.endpoint(c)
                                    .request(now, server, get_block(b.num + 1))
                                    .unwrap();
                            } else {
                                assert_eq!(got[c], full, "seed {seed}: byte-exact");
                                done[c] = true;
                                completed += 1;
                            }
                        }
                        Event::Timeout { .. } => {
                            assert!(!done[c]);
                            done[c] = true;
                            failed += 1;
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                }
            }
        }
        assert!(done[1] && done[2], "seed {seed}: every transfer ends");
        for n in 0..sim.len() {
            assert_eq!(sim.endpoint_ref(n).state_counts(), StateCounts::default());
        }
    }
    assert!(
        completed > 0,
        "some transfers complete ({completed} ok, {failed} failed, {echoed} Echo retries)"
    );
}

#[test]
fn surfaced_notifications_are_monotonic() {
    for seed in 0..20 {
        let net = LossyConfig {
            loss: 0.2,
            duplicate: 0.2,
            max_delay_ms: 2500,
        };
        let mut sim = Sim::new(LossyNet::new(net, seed), seed);
        sim.add_nodes(2, &EndpointConfig::default());
        let server = sim.addr(0);
        let start = sim.now();
        let horizon = start + Duration::from_secs(2000);
        let mut reg = Message::new(MessageType::Confirmable, Code::GET, 0);
        reg.options.set_uri_path("/obs");
        reg.options.set_uint(opt::OBSERVE, 0);
        let rid = sim.endpoint(1).request(start, server, reg).unwrap();
        // Server: the relation (peer, token) once registered; changes 300 ms apart, at
        // least 60 and on until a few have surfaced (the first ones may wait for the
        // client's address to be verified, which takes a while when pings are lost).
        let mut relation = None;
        let mut seq: u32 = SEQ_MASK - 10; // crosses the 24-bit wrap
        let mut next_change = start + Duration::from_millis(300);
        let mut changes = 0;
        let mut last_sent = None;
        let mut surfaced: Vec<u32> = Vec::new();
        let mut last: Option<(u32, Instant)> = None;
        let mut cancelled = false;
        let more = |changes: i32, surfaced: usize| changes < 60 || (surfaced < 3 && changes < 400);
        sim.wake(0, next_change);
        while let Some(now) = sim.step(horizon) {
            while let Some(ev) = sim.endpoint(0).poll_event() {
                match ev {
                    Event::Request { id, peer, request } => {
                        let mut resp = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
                        resp.options.set_uint(opt::OBSERVE, seq);
                        relation = Some((peer, request.token));
                        sim.endpoint(0).respond(now, id, resp).unwrap();
                    }
                    Event::ResponseFailed { .. }
                    | Event::UnmatchedReset { .. }
                    | Event::Verified { .. } => {}
                    other => panic!("server got {other:?}"),
                }
            }
            if more(changes, surfaced.len()) && now >= next_change {
                changes += 1;
                next_change = now + Duration::from_millis(300);
                if more(changes, surfaced.len()) {
                    sim.wake(0, next_change);
                }
                seq = (seq + 1) & SEQ_MASK;
                if let Some((peer, ref token)) = relation {
                    let mut n = Message::new(MessageType::NonConfirmable, Code::CONTENT, 0);
                    n.options.set_uint(opt::OBSERVE, seq);
                    n.payload = seq.to_be_bytes().to_vec();
                    let con = changes % 5 == 0;
                    last_sent =
                        Some(
                            sim.endpoint(0)
                                .notify(now, peer, token.clone(), n, con, last_sent),
                        );
                }
            }
            while let Some(ev) = sim.endpoint(1).poll_event() {
                match ev {
                    Event::Response { id, response } => {
                        assert_eq!(id, rid);
                        let v = response.options.observe().expect("observe");
                        if last.is_none_or(|(v1, t1)| is_fresh(v1, t1, v, now)) {
                            surfaced.push(v);
                            last = Some((v, now));
                        }
                    }
                    Event::Timeout { .. } | Event::Reset { .. } => {}
                    other => panic!("client got {other:?}"),
                }
            }
            if !more(changes, surfaced.len()) && !cancelled {
                sim.endpoint(1).cancel(now, rid);
                cancelled = true;
            }
        }
        assert!(
            surfaced.len() > 1,
            "seed {seed}: notifications got through: {surfaced:?}"
        );
        for w in surfaced.windows(2) {
            let newer = (w[1].wrapping_sub(w[0]) & SEQ_MASK) < (1 << 23) && w[0] != w[1];
            assert!(newer, "seed {seed}: surfaced out of order: {surfaced:?}");
        }
        for n in 0..sim.len() {
            let counts = sim.endpoint_ref(n).state_counts();
            assert_eq!(counts.client_exchanges, 0);
            assert_eq!(counts.pending_confirmables, 0);
            assert_eq!(counts.server_exchanges, 0);
        }
    }
}

//! Block size renegotiation (RFC 7959 §2.4, §2.5) over a lossy, duplicating,
//! reordering simulated network, in both directions:
//! - Block1: a Californium-style server asks for smaller blocks after the first one;
//!   the client ([`upload_continues`]) counts the first block whole and goes on at
//!   the smaller size, and the server reassembles the body byte-exact;
//! - Block2: the server shrinks its blocks in the middle of a download and the client
//!   ([`next_block2`]) follows, or the client asks for smaller blocks in the middle and
//!   the server ([`slice_response`]) follows.
//!
//! Every transfer completes byte-exact or ends with a timeout, and no endpoint keeps
//! any state afterwards.

use super::*;
use crate::endpoint::{EndpointConfig, Event, StateCounts};
use crate::message::MessageType;
use crate::sim::net::{LossyConfig, LossyNet};
use crate::sim::Sim;
use std::time::Duration;

fn body(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

fn hostile() -> LossyConfig {
    LossyConfig {
        loss: 0.15,
        duplicate: 0.1,
        max_delay_ms: 800,
    }
}

/// Runs one block-wise transfer over the simulated network: the client sends
/// `first`, then whatever `client` makes of each response until it returns `None`
/// (the transfer is over); the server answers every request with `server`. When the
/// server's address validation failed (its pings were lost) and it answered 4.01 with
/// Echo, the client asks again with the Echo value (RFC 9175 §2.4). Returns whether
/// the transfer got to its end (false: a request timed out).
fn transfer(
    seed: u64,
    first: Message,
    mut server: impl FnMut(&Message) -> Message,
    mut client: impl FnMut(&Message) -> Option<Message>,
) -> bool {
    let mut sim = Sim::new(LossyNet::new(hostile(), seed), seed);
    sim.add_nodes(2, &EndpointConfig::default());
    let to = sim.addr(0);
    let horizon = sim.now() + Duration::from_secs(3000);
    let now = sim.now();
    let mut last = first.clone();
    sim.endpoint(1).request(now, to, first).unwrap();
    let mut outcome = None;
    while let Some(now) = sim.step(horizon) {
        while let Some(ev) = sim.endpoint(0).poll_event() {
            match ev {
                Event::Request { id, request, .. } => {
                    let answer = server(&request);
                    sim.endpoint(0).respond(now, id, answer).unwrap();
                }
                // Duplicated RSTs to the validation pings; answers never verified.
                Event::UnmatchedReset { .. } | Event::Unverified { .. } => {}
                other => panic!("server got {other:?}"),
            }
        }
        while let Some(ev) = sim.endpoint(1).poll_event() {
            match ev {
                Event::Response { response, .. } if response.code == Code::UNAUTHORIZED => {
                    let echo = response.options.get(opt::ECHO).expect("Echo");
                    last.options.set(opt::ECHO, echo);
                    sim.endpoint(1).request(now, to, last.clone()).unwrap();
                }
                Event::Response { response, .. } => match client(&response) {
                    Some(next) => {
                        last = next.clone();
                        sim.endpoint(1).request(now, to, next).unwrap();
                    }
                    None => outcome = Some(true),
                },
                Event::Timeout { .. } => outcome = Some(false),
                other => panic!("client got {other:?}"),
            }
        }
    }
    for n in 0..sim.len() {
        assert_eq!(
            sim.endpoint_ref(n).state_counts(),
            StateCounts::default(),
            "seed {seed}"
        );
    }
    outcome.expect("every transfer ends")
}

#[test]
fn block1_follows_a_server_asking_for_smaller_blocks() {
    let (mut completed, mut failed) = (0, 0);
    for seed in 0..24 {
        let data = body(5000);
        // The server prefers 2^(pref+4)-byte blocks and says so in its first
        // acknowledgement; half the seeds number it Californium's way.
        let pref = 2 + (seed % 4) as u8;
        let rescaled = seed % 2 == 0;
        let mut received = Vec::new();
        let mut seen = Vec::new();
        let server = |req: &Message| {
            let b = req.block1().expect("every request carries Block1");
            seen.push((b.num, b.szx));
            assert_eq!(
                check_block(b, req.payload.len(), received.len(), false),
                Ok(()),
                "seed {seed}: block {b:?} after {} bytes",
                received.len()
            );
            received.extend_from_slice(&req.payload);
            let szx = b.szx.min(pref);
            let num = if rescaled {
                (b.offset() / (16 << szx)) as u32
            } else {
                b.num
            };
            let code = if b.more {
                Code::CONTINUE
            } else {
                Code::CHANGED
            };
            let mut resp = Message::new(MessageType::Acknowledgement, code, 0);
            let ack = BlockValue::new(num, b.more, szx).unwrap();
            resp.options.set_uint(opt::BLOCK1, ack.encode());
            resp
        };
        let mut size = BlockSize::Szx(6);
        let put = |size: BlockSize, offset| {
            let (block, range) = size.block_at(data.len(), offset).unwrap();
            let mut m = Message::new(MessageType::Confirmable, Code::PUT, 0);
            m.options.set_uri_path("/large-update");
            m.options.set_uint(opt::BLOCK1, block.encode());
            m.payload = data[range.clone()].to_vec();
            (m, block, range)
        };
        let (first, mut sent, mut range) = put(size, 0);
        let client = |resp: &Message| {
            if resp.code == Code::CHANGED {
                return None;
            }
            assert_eq!(resp.code, Code::CONTINUE, "seed {seed}");
            let (offset, next) = upload_continues(size, sent, range.clone(), resp.block1())
                .expect("the acknowledgement names the block sent");
            size = next;
            let (m, b, r) = put(size, offset);
            (sent, range) = (b, r);
            Some(m)
        };
        if transfer(seed, first, server, client) {
            assert_eq!(received, data, "seed {seed}: byte-exact");
            // The first block went at 1024 bytes and counted whole.
            let step = 1024 / (16 << pref) as u32;
            assert_eq!(seen[..2], [(0, 6), (step, pref)], "seed {seed}");
            completed += 1;
        } else {
            failed += 1;
        }
    }
    assert!(
        completed > failed,
        "most uploads complete ({completed} ok, {failed} failed)"
    );
}

#[test]
fn block2_renegotiation_by_either_side_is_followed() {
    let (mut completed, mut failed) = (0, 0);
    for seed in 0..24 {
        let full = body(5000);
        // Even seeds: the server answers the first block at 1024 bytes, then in
        // 256-byte ones. Odd seeds: the client asks for 128-byte blocks after the
        // first, and the server follows.
        let server_shrinks = seed % 2 == 0;
        // The server may run a GET again for a duplicate, so what it answers depends on
        // the request only: the first block at 1024 bytes, the later ones smaller.
        let server = |req: &Message| {
            let mut resp = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
            resp.payload = full.clone();
            let later = req.block2().is_some_and(|b| b.num > 0);
            let szx = if server_shrinks && later { 4 } else { 6 };
            slice_response(req, resp, szx)
        };
        let mut got = Vec::new();
        let mut asked = Vec::new();
        let get = |block: Option<BlockValue>| {
            let mut m = Message::new(MessageType::Confirmable, Code::GET, 0);
            m.options.set_uri_path("/large");
            if let Some(b) = block {
                m.options.set_uint(opt::BLOCK2, b.encode());
            }
            m
        };
        let client = |resp: &Message| {
            assert_eq!(resp.code, Code::CONTENT, "seed {seed}");
            let b = resp.block2().expect("a block");
            assert_eq!(
                check_block(b, resp.payload.len(), got.len(), false),
                Ok(()),
                "seed {seed}"
            );
            got.extend_from_slice(&resp.payload);
            if !b.more {
                return None;
            }
            let mut next = next_block2(got.len(), b).unwrap();
            if !server_shrinks && next.szx > 3 {
                next = BlockValue::new((got.len() / 128) as u32, false, 3).unwrap();
            }
            asked.push((next.num, next.szx));
            Some(get(Some(next)))
        };
        if transfer(seed, get(None), server, client) {
            assert_eq!(got, full, "seed {seed}: byte-exact");
            let expected = if server_shrinks {
                [(1, 6), (5, 4)]
            } else {
                [(8, 3), (9, 3)]
            };
            assert_eq!(asked[..2], expected, "seed {seed}");
            completed += 1;
        } else {
            failed += 1;
        }
    }
    assert!(
        completed > failed,
        "most downloads complete ({completed} ok, {failed} failed)"
    );
}

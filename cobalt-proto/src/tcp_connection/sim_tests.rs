//! Connection pairs in the simulator: two stream nodes (the server is node 0, the
//! client node 1) whose bytes are cut into random chunks, delayed and coalesced by
//! the harness's stream link, under virtual time.

use super::*;
use crate::message::{Message, MessageType};
use crate::session::{Failure, Inbound, Observation, Outbound, SessionError, SessionEvent};
use crate::sim::net::{LossyConfig, LossyNet};
use crate::sim::stream::StreamConfig;
use crate::sim::{node_addr, Sim};

/// Server (node 0) and client (node 1) stream nodes with `config`; writes are cut
/// into chunks of up to `max_chunk` bytes.
fn pair(seed: u64, config: TcpConfig, max_chunk: usize) -> Sim<LossyNet> {
    pair_with(seed, config.clone(), config, max_chunk)
}

/// [`pair`] with node 0 (the server) and node 1 (the client) configured apart.
fn pair_with(seed: u64, server: TcpConfig, client: TcpConfig, max_chunk: usize) -> Sim<LossyNet> {
    let quiet = LossyConfig {
        loss: 0.0,
        duplicate: 0.0,
        max_delay_ms: 1,
    };
    let mut sim = Sim::new(LossyNet::new(quiet, seed), seed);
    sim.streams().set_config(StreamConfig {
        max_chunk,
        min_delay_ms: 1,
        max_delay_ms: 30,
    });
    sim.add_stream_node(node_addr(0), server);
    sim.add_stream_node(node_addr(1), client);
    sim
}

fn get(path: &str) -> Message {
    let mut m = Message::new(MessageType::Confirmable, Code::GET, 0);
    m.options.set_uri_path(path);
    m
}

/// Steps until node `i` has an event other than the peer's settings; `None` once
/// nothing is left before `horizon`.
fn next(sim: &mut Sim<LossyNet>, i: usize, horizon: Instant) -> Option<SessionEvent> {
    loop {
        match sim.session(i).poll_event() {
            Some(SessionEvent::Connection {
                event: TcpEvent::PeerSettings { .. },
                ..
            }) => {}
            Some(event) => return Some(event),
            None => {
                sim.step(horizon)?;
            }
        }
    }
}

/// The client sends GET `path`; steps until the server has it. Returns the request's
/// ids at the client and at the server.
fn one_request(sim: &mut Sim<LossyNet>, path: &str, horizon: Instant) -> (Outbound, Inbound) {
    let (server, now) = (sim.addr(0), sim.now());
    let id = sim.session(1).request(now, server, get(path)).unwrap();
    match next(sim, 0, horizon) {
        Some(SessionEvent::Request { id: sid, .. }) => (id, sid),
        other => panic!("no request but {other:?}"),
    }
}

fn all(sim: &mut Sim<LossyNet>, i: usize) -> Vec<SessionEvent> {
    std::iter::from_fn(|| sim.session(i).poll_event())
        .filter(|e| {
            !matches!(
                e,
                SessionEvent::Connection {
                    event: TcpEvent::PeerSettings { .. },
                    ..
                }
            )
        })
        .collect()
}

#[test]
fn requests_and_responses_matched_by_token_in_any_split() {
    // One byte per chunk, then whole writes coalesced.
    for (seed, max_chunk) in [(1, 1), (2, 7), (3, 4096)] {
        let mut sim = pair(seed, TcpConfig::default(), max_chunk);
        let (server, now) = (sim.addr(0), sim.now());
        let horizon = now + Duration::from_secs(60);
        // Requests may follow the CSM at once, before the peer's CSM arrives.
        let a = sim.session(1).request(now, server, get("a")).unwrap();
        let b = sim.session(1).request(now, server, get("b")).unwrap();
        assert_ne!(a, b);
        let mut reqs: Vec<(Inbound, String)> = Vec::new();
        while reqs.len() < 2 {
            match next(&mut sim, 0, horizon) {
                Some(SessionEvent::Request { id, request, .. }) => {
                    reqs.push((id, request.options.uri_path_string()))
                }
                other => panic!("{other:?}"),
            }
        }
        let paths: Vec<&str> = reqs.iter().map(|r| r.1.as_str()).collect();
        assert_eq!(paths, ["/a", "/b"], "max_chunk {max_chunk}");
        // Answer out of order.
        let now = sim.now();
        for (id, path) in reqs.iter().rev() {
            let mut r = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
            r.payload = path.as_bytes().to_vec();
            sim.session(0).respond(now, id.clone(), r).unwrap();
        }
        let (id, _) = &reqs[0];
        let Inbound::Stream { ref token, .. } = id else {
            panic!("a stream id")
        };
        let again = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
        assert_eq!(
            sim.session(0).respond(now, id.clone(), again),
            Err(SessionError::Send(SendError::UnknownToken(token.clone())))
        );
        let mut resps: Vec<(Outbound, Vec<u8>)> = Vec::new();
        while resps.len() < 2 {
            match next(&mut sim, 1, horizon) {
                Some(SessionEvent::Response { id, response }) => resps.push((id, response.payload)),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(resps, [(b, b"/b".to_vec()), (a, b"/a".to_vec())]);
        let conn = sim.stream_ref(1).connection(server).unwrap();
        assert_eq!(conn.outstanding_requests(), 0);
    }
}

#[test]
fn release_closes_both_sides_and_leaves_nothing() {
    let mut sim = pair(4, TcpConfig::default(), 5);
    let (server, client) = (sim.addr(0), sim.addr(1));
    let horizon = sim.now() + Duration::from_secs(60);
    let (id, sid) = one_request(&mut sim, "x", horizon);
    let now = sim.now();
    let ok = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
    sim.session(0).respond(now, sid, ok).unwrap();
    assert!(matches!(
        next(&mut sim, 1, horizon),
        Some(SessionEvent::Response { id: r, .. }) if r == id
    ));
    sim.stream(1).connection_mut(server).unwrap().release();
    sim.run(horizon);
    assert!(matches!(
        all(&mut sim, 1)[..],
        [SessionEvent::Connection {
            event: TcpEvent::Closed {
                reason: CloseReason::LocalRelease,
                ..
            },
            ..
        }]
    ));
    let seen = all(&mut sim, 0);
    assert!(
        matches!(
            &seen[..],
            [
                SessionEvent::Connection { peer: p1, event: TcpEvent::ReleaseReceived { .. } },
                SessionEvent::Connection {
                    peer: p2,
                    event: TcpEvent::Closed { reason: CloseReason::PeerRelease { .. }, .. },
                },
            ] if *p1 == client && *p2 == client
        ),
        "{seen:?}"
    );
    assert_eq!(sim.stream_ref(0).connections(), 0);
    assert_eq!(sim.stream_ref(1).connections(), 0);
    assert!(sim.streams().is_empty(), "both streams closed");
}

#[test]
fn a_peer_abort_fails_the_outstanding_requests() {
    let mut sim = pair(5, TcpConfig::default(), 3);
    let (client, horizon) = (sim.addr(1), sim.now() + Duration::from_secs(60));
    let (id, _) = one_request(&mut sim, "x", horizon);
    sim.stream(0)
        .connection_mut(client)
        .unwrap()
        .abort(None, "going away");
    let reason = CloseReason::PeerAbort {
        bad_csm_option: None,
        diagnostic: "going away".into(),
    };
    assert_eq!(
        next(&mut sim, 1, horizon),
        Some(SessionEvent::Failed {
            id,
            peer: sim.addr(0),
            reason: Failure::Closed(reason.clone())
        })
    );
    sim.run(horizon);
    assert_eq!(sim.stream_ref(1).connections(), 0);
    assert!(sim.streams().is_empty());
}

#[test]
fn a_reset_stream_fails_the_outstanding_requests_at_once() {
    let mut sim = pair(8, TcpConfig::default(), 3);
    let horizon = sim.now() + Duration::from_secs(60);
    let (id, sid) = one_request(&mut sim, "x", horizon);
    // The answer is written as the stream is reset: it never arrives.
    let at = sim.now();
    let ok = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
    sim.session(0).respond(at, sid, ok).unwrap();
    sim.reset_stream(0, 1);
    assert_eq!(
        next(&mut sim, 1, horizon),
        Some(SessionEvent::Failed {
            id,
            peer: sim.addr(0),
            reason: Failure::Closed(CloseReason::PeerClosed)
        })
    );
    sim.run(horizon);
    assert_eq!(sim.stream_ref(0).connections(), 0);
    assert_eq!(sim.stream_ref(1).connections(), 0);
    assert!(sim.streams().is_empty());
}

#[test]
fn an_idle_connection_is_released_but_not_while_a_request_is_handled() {
    let no_pings = TcpConfig {
        keepalive: None,
        ..TcpConfig::default()
    };
    // The client waits a little longer than the server before it releases an idle
    // connection, so that it is the server's Release that ends it, whatever the
    // delays of the last messages.
    let patient = TcpConfig {
        idle_timeout: Some(Duration::from_secs(301)),
        ..no_pings.clone()
    };
    let mut sim = pair_with(6, no_pings, patient, 9);
    // The server takes 400 s, longer than the idle timeout, to answer.
    let answer_at = sim.now() + Duration::from_secs(400);
    let (_, id) = one_request(&mut sim, "x", answer_at);
    sim.wake(0, answer_at);
    assert_eq!(sim.run(answer_at), answer_at);
    assert_eq!(sim.stream_ref(0).connections(), 1, "closed while handling");
    let ok = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
    sim.session(0).respond(answer_at, id, ok).unwrap();
    // 300 s after its response, the server releases the idle connection (the client
    // would a second later).
    let horizon = answer_at + Duration::from_secs(1000);
    let client = sim.addr(1);
    let closed = sim.run_until(horizon, |sim| {
        sim.stream_ref(0)
            .connection(client)
            .is_none_or(TcpConnection::is_closed)
    });
    assert!(closed);
    assert_eq!(
        sim.now().duration_since(answer_at),
        Duration::from_secs(300)
    );
    assert!(matches!(
        all(&mut sim, 0).last(),
        Some(SessionEvent::Connection {
            event: TcpEvent::Closed {
                reason: CloseReason::IdleTimeout,
                ..
            },
            ..
        })
    ));
    sim.run(horizon);
    assert!(matches!(
        all(&mut sim, 1).last(),
        Some(SessionEvent::Connection {
            event: TcpEvent::Closed {
                reason: CloseReason::PeerRelease { .. },
                ..
            },
            ..
        })
    ));
    assert_eq!(sim.stream_ref(1).connections(), 0);
    assert!(sim.streams().is_empty());
}

#[test]
fn keepalive_pings_keep_a_slow_answer_alive() {
    let mut sim = pair(7, TcpConfig::default(), 16);
    // The server takes 100 s; the client pings every 30 s of silence.
    let answer_at = sim.now() + Duration::from_secs(100);
    let (id, sid) = one_request(&mut sim, "slow", answer_at);
    sim.wake(0, answer_at);
    assert_eq!(sim.run(answer_at), answer_at);
    let pongs = all(&mut sim, 1)
        .iter()
        .filter(|e| {
            matches!(
                e,
                SessionEvent::Connection {
                    event: TcpEvent::Pong { .. },
                    ..
                }
            )
        })
        .count();
    assert_eq!(pongs, 3, "pings at 30, 60 and 90 s, each answered");
    let ok = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
    sim.session(0).respond(answer_at, sid, ok).unwrap();
    let horizon = answer_at + Duration::from_secs(10);
    assert!(matches!(
        next(&mut sim, 1, horizon),
        Some(SessionEvent::Response { id: r, .. }) if r == id
    ));
}

fn notification(seq: u32, payload: &[u8]) -> Message {
    let mut n = Message::new(MessageType::NonConfirmable, Code::CONTENT, 0);
    n.options.set_uint(number::OBSERVE, seq);
    n.payload = payload.to_vec();
    n
}

#[test]
fn a_served_observation_notifies_until_an_error() {
    let mut sim = pair(9, TcpConfig::default(), 4);
    let (server, client, now) = (sim.addr(0), sim.addr(1), sim.now());
    let horizon = now + Duration::from_secs(60);
    let mut reg = get("obs");
    reg.options.set_uint(number::OBSERVE, 0);
    let id = sim.session(1).request(now, server, reg).unwrap();
    let Some(SessionEvent::Request {
        id: sid, request, ..
    }) = next(&mut sim, 0, horizon)
    else {
        panic!("no request")
    };
    let mut obs = Observation::new(client, &request);
    // Without a registering response there is nothing to notify.
    let token = request.token;
    assert_eq!(
        sim.session(0)
            .notify(now, &mut obs, notification(2, b"x"), false),
        Err(SessionError::Send(SendError::UnknownToken(token.clone())))
    );
    let mut first = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
    first.options.set_uint(number::OBSERVE, 1);
    let now = sim.now();
    sim.session(0).respond(now, sid, first).unwrap();
    let served = |sim: &Sim<LossyNet>| {
        let conn = sim.stream_ref(0).connection(client).unwrap();
        conn.served_observations()
    };
    assert_eq!(served(&sim), 1);
    for seq in 2..5u32 {
        let n = notification(seq, &[seq as u8]);
        sim.session(0).notify(now, &mut obs, n, false).unwrap();
    }
    let get_again = Message::new(MessageType::NonConfirmable, Code::GET, 0);
    assert_eq!(
        sim.session(0).notify(now, &mut obs, get_again, false),
        Err(SessionError::Send(SendError::WrongCode(Code::GET)))
    );
    // An error notification is the last one, at both ends.
    let gone = Message::new(MessageType::NonConfirmable, Code::NOT_FOUND, 0);
    sim.session(0).notify(now, &mut obs, gone, false).unwrap();
    assert_eq!(served(&sim), 0);
    assert_eq!(
        sim.session(0)
            .notify(now, &mut obs, notification(6, b"late"), false),
        Err(SessionError::Send(SendError::UnknownToken(token)))
    );
    let mut got = Vec::new();
    while got.len() < 5 {
        match next(&mut sim, 1, horizon) {
            Some(SessionEvent::Response { id: r, response }) if r == id => got.push((
                response.code,
                response.options.get_uint(number::OBSERVE),
                response.payload,
            )),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        got,
        [
            (Code::CONTENT, Some(1), vec![]),
            (Code::CONTENT, Some(2), vec![2]),
            (Code::CONTENT, Some(3), vec![3]),
            (Code::CONTENT, Some(4), vec![4]),
            (Code::NOT_FOUND, None, vec![]),
        ]
    );
    let conn = sim.stream_ref(1).connection(server).unwrap();
    assert_eq!(conn.outstanding_requests(), 0);
}

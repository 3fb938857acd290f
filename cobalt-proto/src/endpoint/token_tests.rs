//! Extended tokens (RFC 8974) at the endpoint: long tokens echoed on every response
//! path and matched by the client, tokens beyond `max_token_len` answered 4.00 without
//! state, malformed token lengths rejected, and peers sending maximum-size tokens
//! holding no more than their budgets while a legitimate client is served.

use super::*;
use crate::message::{codec, opt, Code, Message, MessageType};
use crate::sim::net::{LossyConfig, LossyNet};
use crate::sim::Sim;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn token(len: usize, seed: u8) -> Token {
    let bytes: Vec<u8> = (0..len).map(|i| seed.wrapping_add(i as u8)).collect();
    Token::new(&bytes).unwrap()
}

fn get(mtype: MessageType, mid: u16, token: Token, path: &str) -> Message {
    let mut m = Message::new(mtype, Code::GET, mid);
    m.token = token;
    m.options.set_uri_path(path);
    m
}

fn content() -> Message {
    let mut m = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
    m.payload = b"22.5 C".to_vec();
    m
}

fn sent(ep: &mut Endpoint) -> Vec<Message> {
    std::iter::from_fn(|| ep.poll_transmit())
        .map(|t| codec::decode(&t.bytes).unwrap())
        .collect()
}

/// Bytes of heap the tokens of requests in progress hold.
fn held_token_bytes(ep: &Endpoint) -> usize {
    ep.server.values().map(|ex| ex.token.heap_bytes()).sum()
}

#[test]
fn long_tokens_are_echoed_piggybacked_separately_and_in_non_answers() {
    let now = Instant::now();
    let mut server = Endpoint::with_seed(EndpointConfig::default(), now, 1);
    let client = addr("10.0.0.1:40000");
    for (mid, len) in [(1, 9), (2, 13), (3, 40), (4, DEFAULT_MAX_TOKEN_LEN)] {
        let t = token(len, mid as u8);
        let req = get(MessageType::Confirmable, mid, t.clone(), "temp");
        server.handle_datagram(now, client, &codec::encode(&req));
        let Some(Event::Request { id, request, .. }) = server.poll_event() else {
            panic!("a {len}-byte token must reach the application");
        };
        assert_eq!(request.token, t);
        server.respond(now, id, content()).unwrap();
        let answer = sent(&mut server);
        assert_eq!(answer.len(), 1);
        assert_eq!(
            (answer[0].mtype, answer[0].mid, &answer[0].token),
            (MessageType::Acknowledgement, mid, &t)
        );
    }
    // Separate: the handler is slow, the empty ACK goes first, then a CON response.
    let t = token(50, 0x80);
    let req = get(MessageType::Confirmable, 9, t.clone(), "slow");
    server.handle_datagram(now, client, &codec::encode(&req));
    let Some(Event::Request { id, .. }) = server.poll_event() else {
        panic!("request expected");
    };
    let later = now + server.config().separate_ack_delay;
    server.handle_timeout(later);
    let ack = sent(&mut server);
    assert_eq!((ack[0].code, ack[0].mid), (Code::EMPTY, 9));
    server.respond(later, id, content()).unwrap();
    let separate = sent(&mut server);
    assert_eq!(
        (separate[0].mtype, &separate[0].token),
        (MessageType::Confirmable, &t)
    );
    // NON request, NON answer.
    let t = token(33, 0x40);
    let req = get(MessageType::NonConfirmable, 10, t.clone(), "temp");
    server.handle_datagram(later, client, &codec::encode(&req));
    let Some(Event::Request { id, .. }) = server.poll_event() else {
        panic!("request expected");
    };
    server.respond(later, id, content()).unwrap();
    let non = sent(&mut server);
    assert_eq!(
        (non[0].mtype, &non[0].token),
        (MessageType::NonConfirmable, &t)
    );
}

#[test]
fn a_token_beyond_the_maximum_gets_4_00_and_leaves_no_state() {
    let now = Instant::now();
    let config = EndpointConfig {
        max_token_len: 16,
        ..EndpointConfig::default()
    };
    let mut server = Endpoint::with_seed(config, now, 1);
    let client = addr("10.0.0.1:40000");
    let t = token(17, 3);
    let mut req = get(MessageType::Confirmable, 7, t.clone(), "temp");
    req.code = Code::POST;
    for _ in 0..2 {
        // The retransmission is answered the same way: nothing was remembered.
        server.handle_datagram(now, client, &codec::encode(&req));
        let answer = sent(&mut server);
        assert_eq!(answer.len(), 1);
        assert_eq!(
            (
                answer[0].mtype,
                answer[0].code,
                answer[0].mid,
                &answer[0].token
            ),
            (MessageType::Acknowledgement, Code::BAD_REQUEST, 7, &t)
        );
        assert_eq!(
            String::from_utf8_lossy(&answer[0].payload),
            "Token of 17 bytes is longer than the 16 this server accepts"
        );
    }
    assert_eq!(server.poll_event(), None);
    assert_eq!(server.stats().long_tokens, 2);
    let held = server.state_counts();
    assert_eq!((held.server_exchanges, held.dedup_entries), (0, 0));
    // At the maximum it is handled.
    let req = get(MessageType::Confirmable, 8, token(16, 3), "temp");
    server.handle_datagram(now, client, &codec::encode(&req));
    assert!(matches!(server.poll_event(), Some(Event::Request { .. })));
}

#[test]
fn malformed_token_lengths_get_rst_when_confirmable_and_silence_otherwise() {
    let now = Instant::now();
    let mut server = Endpoint::with_seed(EndpointConfig::default(), now, 1);
    let client = addr("10.0.0.1:40000");
    let reserved = [0x4f, 0x01, 0x00, 0x05, 1, 2, 3];
    let cut_extension = [0x4e, 0x01, 0x00, 0x06, 0];
    let past_the_end = [0x4d, 0x01, 0x00, 0x07, 200, 1, 2, 3];
    for bytes in [&reserved[..], &cut_extension, &past_the_end] {
        server.handle_datagram(now, client, bytes);
        let rst = sent(&mut server);
        assert_eq!(rst.len(), 1);
        assert_eq!(
            (rst[0].mtype, rst[0].mid),
            (MessageType::Reset, u16::from(bytes[3]))
        );
        let mut non = bytes.to_vec();
        non[0] |= 0x10;
        server.handle_datagram(now, client, &non);
        assert!(sent(&mut server).is_empty());
    }
    assert_eq!(server.stats().format_errors, 6);
    assert_eq!(server.poll_event(), None);
    assert_eq!(server.state_counts(), StateCounts::default());
}

#[test]
fn the_client_sends_long_tokens_and_matches_answers_by_them() {
    let now = Instant::now();
    let mut client = Endpoint::with_seed(EndpointConfig::default(), now, 1);
    let server = addr("10.0.0.2:5683");
    let t = token(48, 9);
    let id = client
        .request(
            now,
            server,
            get(MessageType::Confirmable, 0, t.clone(), "x"),
        )
        .unwrap();
    assert_eq!(client.request_token(id), Some(t.clone()));
    let req = sent(&mut client).remove(0);
    assert_eq!(req.token, t);
    // An answer with another token of the same length is not ours.
    let mut wrong = content();
    wrong.mtype = MessageType::NonConfirmable;
    wrong.mid = 100;
    wrong.token = token(48, 10);
    client.handle_datagram(now, server, &codec::encode(&wrong));
    assert_eq!(sent(&mut client)[0].mtype, MessageType::Reset);
    let mut answer = content();
    answer.mid = req.mid;
    answer.token = t;
    client.handle_datagram(now, server, &codec::encode(&answer));
    match client.poll_event() {
        Some(Event::Response { id: got, response }) => {
            assert_eq!(got, id);
            assert_eq!(response.payload, b"22.5 C");
        }
        other => panic!("expected the response, got {other:?}"),
    }
    let too_long = get(MessageType::Confirmable, 0, token(65, 1), "x");
    assert_eq!(
        client.request(now, server, too_long),
        Err(RequestError::TokenTooLong { len: 65, max: 64 })
    );
}

#[test]
fn maximum_size_tokens_from_many_peers_stay_within_budgets_and_others_are_served() {
    let now = Instant::now();
    let config = EndpointConfig {
        max_exchanges_per_peer: 4,
        max_server_exchanges: 1000,
        ..EndpointConfig::default()
    };
    let max_token = config.max_token_len;
    let mut server = Endpoint::with_seed(config, now, 5);
    // 200 peers each send 20 requests to a handler that never answers, half of them
    // with tokens of the maximum size and half with longer ones.
    for peer in 0..200u32 {
        let from = SocketAddr::from(([198, 18, (peer / 200) as u8, (peer % 200) as u8], 7000));
        for mid in 0..20u16 {
            let len = if mid % 2 == 0 { max_token } else { 1000 };
            let req = get(
                MessageType::Confirmable,
                mid,
                token(len, mid as u8),
                "separate",
            );
            server.handle_datagram(now, from, &codec::encode(&req));
        }
    }
    let mut held = 0;
    while let Some(Event::Request { .. }) = server.poll_event() {
        held += 1;
    }
    let counts = server.state_counts();
    // Four per peer; the others got 4.29 or, with a token too long, 4.00.
    assert_eq!(held, 200 * 4);
    assert_eq!(counts.server_exchanges, held);
    // What the tokens cost is bounded by the exchanges held times the maximum length,
    // and nothing at all for the tokens that were too long.
    assert_eq!(held_token_bytes(&server), held * max_token);
    assert_eq!(server.stats().long_tokens, 200 * 10);
    assert_eq!(server.stats().busy_rejections, 200 * 6);
    assert!(counts.dedup_bytes <= 200 * 8 * (dedup::ENTRY_OVERHEAD + 2 * max_token));
    // A legitimate client is served meanwhile, with a long token of its own.
    let client = addr("192.0.2.1:5000");
    let t = token(24, 77);
    server.handle_datagram(
        now,
        client,
        &codec::encode(&get(MessageType::Confirmable, 1, t.clone(), "x")),
    );
    let id = loop {
        match server.poll_event() {
            Some(Event::Request { id, peer, .. }) if peer == client => break id,
            Some(_) => continue,
            None => panic!("the legitimate client's request must get through"),
        }
    };
    let _ = sent(&mut server);
    server.respond(now, id, content()).unwrap();
    let answer = sent(&mut server);
    assert_eq!((answer[0].code, &answer[0].token), (Code::CONTENT, &t));
}

#[test]
fn long_tokens_over_a_lossy_network_end_every_request_exactly_once() {
    for seed in 1..=4 {
        let net = LossyConfig {
            loss: 0.2,
            duplicate: 0.1,
            max_delay_ms: 50,
        };
        let mut sim = Sim::new(LossyNet::new(net, seed), seed);
        sim.add_nodes(4, &EndpointConfig::default());
        let start = sim.now();
        let server = sim.addr(0);
        let mut expected: HashMap<(usize, RequestId), Token> = HashMap::new();
        for c in 1..4 {
            for r in 0..10usize {
                let len = [9, 12, 13, 30, DEFAULT_MAX_TOKEN_LEN][r % 5];
                let t = token(len, (c * 16 + r) as u8);
                let mut m = get(MessageType::Confirmable, 0, t.clone(), "echo");
                if r % 3 == 2 {
                    m.mtype = MessageType::NonConfirmable;
                }
                let id = sim.endpoint(c).request(start, server, m).unwrap();
                expected.insert((c, id), t);
            }
        }
        let mut ended: HashMap<(usize, RequestId), u32> = HashMap::new();
        let horizon = start + Duration::from_secs(2000);
        while sim.step(horizon).is_some() {
            let now = sim.now();
            while let Some(ev) = sim.endpoint(0).poll_event() {
                if let Event::Request { id, request, .. } = ev {
                    // The answer names the token it was asked with.
                    let mut resp = content();
                    resp.payload = request.token.as_bytes().to_vec();
                    sim.endpoint(0).respond(now, id, resp).unwrap();
                }
            }
            for c in 1..4 {
                while let Some(ev) = sim.endpoint(c).poll_event() {
                    let id = match ev {
                        Event::Response { id, response } => {
                            assert_eq!(response.payload, expected[&(c, id)].as_bytes());
                            assert_eq!(&response.token, &expected[&(c, id)]);
                            id
                        }
                        Event::Timeout { id, .. } | Event::Reset { id, .. } => id,
                        other => panic!("unexpected client event {other:?}"),
                    };
                    *ended.entry((c, id)).or_default() += 1;
                }
            }
        }
        assert_eq!(
            ended.len(),
            expected.len(),
            "seed {seed}: every request ends"
        );
        assert!(ended.values().all(|n| *n == 1), "seed {seed}: exactly once");
        for i in 0..sim.len() {
            assert_eq!(
                sim.endpoint_ref(i).state_counts(),
                StateCounts::default(),
                "seed {seed}: node {i} leaked state"
            );
        }
    }
}

#[test]
fn an_oversized_datagram_or_overload_answer_echoes_an_extended_token() {
    let t = token(20, 1);
    let mut req = get(MessageType::Confirmable, 0x0102, t.clone(), "x");
    req.payload = vec![0; 100];
    let bytes = codec::encode(&req);
    let reply = codec::decode(&overload_reply(&bytes, 5).unwrap()).unwrap();
    assert_eq!(
        (reply.code, reply.mid, &reply.token),
        (Code::SERVICE_UNAVAILABLE, 0x0102, &t)
    );
    assert_eq!(reply.options.get_uint(opt::MAX_AGE), Some(5));
    let now = Instant::now();
    let mut server = Endpoint::with_seed(EndpointConfig::default(), now, 1);
    server.handle_oversized(addr("10.0.0.1:1"), &bytes[..60], 64);
    let reply = sent(&mut server).remove(0);
    assert_eq!(
        (reply.code, &reply.token),
        (Code::REQUEST_ENTITY_TOO_LARGE, &t)
    );
    // A prefix that ends inside the token is answered without one.
    server.handle_oversized(addr("10.0.0.1:1"), &bytes[..10], 64);
    assert_eq!(sent(&mut server).remove(0).token, Token::EMPTY);
}

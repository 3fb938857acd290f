//! Unit tests of the endpoint's protocol rules, one exchange at a time.

use super::*;
use crate::message::{codec, opt, Code, Message, MessageType};

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

struct Pair {
    now: Instant,
    client: Endpoint,
    server: Endpoint,
    c: SocketAddr,
    s: SocketAddr,
}

impl Pair {
    fn new() -> Pair {
        let now = Instant::now();
        Pair {
            now,
            client: Endpoint::with_seed(EndpointConfig::default(), now, 1),
            server: Endpoint::with_seed(EndpointConfig::default(), now, 2),
            c: addr("10.0.0.1:40000"),
            s: addr("10.0.0.2:5683"),
        }
    }

    fn client_sends(&mut self) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| self.client.poll_transmit())
            .map(|t| t.bytes)
            .collect()
    }

    fn server_sends(&mut self) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| self.server.poll_transmit())
            .map(|t| t.bytes)
            .collect()
    }

    fn deliver_to_server(&mut self, bytes: &[u8]) {
        self.server.handle_datagram(self.now, self.c, bytes);
    }

    fn deliver_to_client(&mut self, bytes: &[u8]) {
        self.client.handle_datagram(self.now, self.s, bytes);
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.client.handle_timeout(self.now);
        self.server.handle_timeout(self.now);
    }
}

fn get(path: &str) -> Message {
    let mut m = Message::new(MessageType::Confirmable, Code::GET, 0);
    m.options.set_uri_path(path);
    m
}

fn content(payload: &str) -> Message {
    let mut m = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
    m.payload = payload.as_bytes().to_vec();
    m
}

fn server_request(p: &mut Pair) -> ExchangeId {
    match p.server.poll_event() {
        Some(Event::Request { id, .. }) => id,
        other => panic!("expected a request, got {other:?}"),
    }
}

fn post(path: &str) -> Message {
    let mut m = get(path);
    m.code = Code::POST;
    m
}

#[test]
fn duplicate_con_gets_same_response_without_running_the_handler_again() {
    let mut p = Pair::new();
    p.client.request(p.now, p.s, post("/x")).unwrap();
    let req = p.client_sends().remove(0);
    p.deliver_to_server(&req);
    let id = server_request(&mut p);
    p.server.respond(p.now, id, content("one")).unwrap();
    let first = p.server_sends();
    p.deliver_to_server(&req);
    assert_eq!(p.server.poll_event(), None, "handler must not run twice");
    assert_eq!(p.server_sends(), first, "same piggybacked response again");
    assert_eq!(p.server.stats().duplicates, 1);
}

#[test]
fn a_duplicate_of_an_answered_safe_request_runs_again_unless_configured_otherwise() {
    for rerun in [true, false] {
        let mut p = Pair::new();
        p.server = Endpoint::with_seed(
            EndpointConfig {
                dedup_rerun_safe: rerun,
                ..Default::default()
            },
            p.now,
            2,
        );
        p.client.request(p.now, p.s, get("/x")).unwrap();
        let req = p.client_sends().remove(0);
        p.deliver_to_server(&req);
        let id = server_request(&mut p);
        // While the handler runs, a duplicate is recognised either way (empty ACK).
        p.deliver_to_server(&req);
        assert_eq!(p.server.poll_event(), None);
        let ack = p.server_sends();
        assert_eq!(codec::decode(&ack[0]).unwrap().code, Code::EMPTY);
        p.server.respond(p.now, id, content("one")).unwrap();
        assert_eq!(p.server_sends().len(), 1, "the separate response");
        p.deliver_to_server(&req);
        if rerun {
            let id = server_request(&mut p);
            p.server.respond(p.now, id, content("two")).unwrap();
            let again = codec::decode(&p.server_sends()[0]).unwrap();
            assert_eq!(
                (again.code, &again.payload[..]),
                (Code::CONTENT, &b"two"[..])
            );
            assert_eq!(p.server.state_counts().dedup_entries, 0, "nothing kept");
        } else {
            assert_eq!(p.server.poll_event(), None);
            assert_eq!(p.server_sends(), ack, "the empty ACK again");
            assert_eq!(p.server.state_counts().dedup_entries, 1);
        }
    }
}

#[test]
fn duplicate_non_is_dropped() {
    let mut p = Pair::new();
    let mut m = post("/x");
    m.mtype = MessageType::NonConfirmable;
    p.client.request(p.now, p.s, m).unwrap();
    let req = p.client_sends().remove(0);
    p.deliver_to_server(&req);
    let id = server_request(&mut p);
    p.server.respond(p.now, id, content("a")).unwrap();
    let resp = p.server_sends();
    assert_eq!(
        codec::decode(&resp[0]).unwrap().mtype,
        MessageType::NonConfirmable
    );
    p.deliver_to_server(&req);
    assert_eq!(p.server.poll_event(), None);
    assert!(p.server_sends().is_empty());
    p.deliver_to_client(&resp[0]);
    assert!(matches!(
        p.client.poll_event(),
        Some(Event::Response { .. })
    ));
}

#[test]
fn slow_handler_gets_empty_ack_then_separate_con_response() {
    let mut p = Pair::new();
    let rid = p.client.request(p.now, p.s, get("/slow")).unwrap();
    let req = p.client_sends().remove(0);
    p.deliver_to_server(&req);
    let id = server_request(&mut p);
    p.advance(p.server.config().separate_ack_delay);
    let ack = p.server_sends();
    assert_eq!(ack.len(), 1);
    let ack_msg = codec::decode(&ack[0]).unwrap();
    assert_eq!(
        (ack_msg.mtype, ack_msg.code),
        (MessageType::Acknowledgement, Code::EMPTY)
    );
    p.deliver_to_client(&ack[0]);
    assert_eq!(p.client_sends().len(), 0);
    // A retransmitted request now gets the empty ACK again, not a second handler run.
    p.deliver_to_server(&req);
    assert_eq!(p.server_sends(), ack);
    assert_eq!(p.server.poll_event(), None);

    p.advance(Duration::from_secs(5));
    assert!(
        p.client_sends().is_empty(),
        "no retransmission after the ACK"
    );
    p.server.respond(p.now, id, content("late")).unwrap();
    let sep = p.server_sends().remove(0);
    let sep_msg = codec::decode(&sep).unwrap();
    assert_eq!(sep_msg.mtype, MessageType::Confirmable);
    p.deliver_to_client(&sep);
    let client_ack = p.client_sends();
    assert_eq!(codec::decode(&client_ack[0]).unwrap().mid, sep_msg.mid);
    match p.client.poll_event() {
        Some(Event::Response { id, response }) => {
            assert_eq!(id, rid);
            assert_eq!(response.payload, b"late");
        }
        other => panic!("{other:?}"),
    }
    // A duplicate separate response is acknowledged again but not delivered twice.
    p.deliver_to_client(&sep);
    assert_eq!(p.client_sends(), client_ack);
    assert_eq!(p.client.poll_event(), None);
    p.deliver_to_server(&client_ack[0]);
    assert_eq!(p.server.state_counts().pending_confirmables, 0);
}

#[test]
fn every_unanswered_request_can_be_answered_at_once() {
    let mut p = Pair::new();
    let slow = p.client.request(p.now, p.s, get("/slow")).unwrap();
    let req = p.client_sends().remove(0);
    p.deliver_to_server(&req);
    let _slow_id = server_request(&mut p);
    p.advance(p.server.config().separate_ack_delay);
    let ack = p.server_sends().remove(0);
    p.deliver_to_client(&ack);
    let quick = p.client.request(p.now, p.s, get("/other")).unwrap();
    for bytes in p.client_sends() {
        p.deliver_to_server(&bytes);
    }
    let answered = server_request(&mut p);
    p.server.respond(p.now, answered, content("ok")).unwrap();
    for bytes in p.server_sends() {
        p.deliver_to_client(&bytes);
    }
    // Only the slow request is still held: it gets the answer given.
    let mut busy = Message::new(MessageType::Acknowledgement, Code::SERVICE_UNAVAILABLE, 0);
    busy.payload = b"bye".to_vec();
    assert_eq!(p.server.respond_to_unanswered(p.now, &busy), 1);
    assert_eq!(p.server.state_counts().server_exchanges, 0);
    for bytes in p.server_sends() {
        p.deliver_to_client(&bytes);
    }
    let mut got = std::iter::from_fn(|| p.client.poll_event())
        .filter_map(|e| match e {
            Event::Response { id, response } => Some((id, response.code)),
            _ => None,
        })
        .collect::<Vec<_>>();
    got.sort_by_key(|(id, _)| *id);
    let mut want = vec![(slow, Code::SERVICE_UNAVAILABLE), (quick, Code::CONTENT)];
    want.sort_by_key(|(id, _)| *id);
    assert_eq!(got, want);
    assert_eq!(p.server.respond_to_unanswered(p.now, &busy), 0, "none left");
}

#[test]
fn retransmission_uses_binary_backoff_and_times_out() {
    let mut p = Pair::new();
    let rid = p.client.request(p.now, p.s, get("/x")).unwrap();
    let start = p.now;
    let mut sends = vec![(Duration::ZERO, p.client_sends().len())];
    let timeout = loop {
        let next = p.client.poll_timeout().expect("a timer is armed");
        p.now = next;
        p.client.handle_timeout(next);
        let n = p.client_sends().len();
        if n > 0 {
            sends.push((p.now - start, n));
        }
        if let Some(ev) = p.client.poll_event() {
            break (p.now - start, ev);
        }
    };
    assert_eq!(
        sends.len(),
        5,
        "initial send plus MAX_RETRANSMIT=4: {sends:?}"
    );
    let first = sends[1].0;
    assert!(first >= Duration::from_secs(2) && first <= Duration::from_secs(3));
    let gaps: Vec<Duration> = sends.windows(2).map(|w| w[1].0 - w[0].0).collect();
    for g in gaps.windows(2) {
        assert_eq!(g[1], g[0] * 2, "binary backoff: {sends:?}");
    }
    assert_eq!(
        timeout.1,
        Event::Timeout {
            id: rid,
            peer: p.s,
            retransmissions: 4
        }
    );
    assert!(timeout.0 <= p.client.config().max_transmit_wait());
    assert_eq!(p.client.state_counts().client_exchanges, 0);
}

#[test]
fn nstart_queues_further_requests_to_the_same_peer() {
    let mut p = Pair::new();
    let a = p.client.request(p.now, p.s, get("/a")).unwrap();
    let b = p.client.request(p.now, p.s, get("/b")).unwrap();
    let sent = p.client_sends();
    assert_eq!(sent.len(), 1, "NSTART=1");
    p.deliver_to_server(&sent[0]);
    let id = server_request(&mut p);
    p.server.respond(p.now, id, content("a")).unwrap();
    let resp = p.server_sends().remove(0);
    p.deliver_to_client(&resp);
    assert!(matches!(p.client.poll_event(), Some(Event::Response { id, .. }) if id == a));
    let sent = p.client_sends();
    assert_eq!(sent.len(), 1, "the queued request goes out now");
    assert_eq!(
        codec::decode(&sent[0]).unwrap().options.uri_path_string(),
        "/b"
    );
    let _ = b;
    // A request to another peer is not held back.
    p.client
        .request(p.now, addr("10.0.0.3:5683"), get("/c"))
        .unwrap();
    assert_eq!(p.client_sends().len(), 1);
}

/// A client that registers with thousands of servers at once has a confirmable
/// message in flight to each; once they are answered, the table of messages awaiting
/// an ACK gives its room back.
#[test]
fn the_retransmission_table_shrinks_after_a_burst() {
    let mut p = Pair::new();
    let servers: Vec<SocketAddr> = (0..3000u32)
        .map(|i| SocketAddr::from(([10, 1, (i / 256) as u8, (i % 256) as u8], 5683)))
        .collect();
    for s in &servers {
        p.client.request(p.now, *s, get("/t")).unwrap();
    }
    let sent = p.client_sends();
    assert_eq!(sent.len(), 3000);
    assert!(p.client.pending.capacity() >= 3000);
    for (s, bytes) in servers.iter().zip(&sent) {
        let req = codec::decode(bytes).unwrap();
        let mut ack = Message::new(MessageType::Acknowledgement, Code::CONTENT, req.mid);
        ack.token = req.token;
        p.client.handle_datagram(p.now, *s, &codec::encode(&ack));
    }
    assert_eq!(p.client.state_counts().pending_confirmables, 0);
    assert!(
        p.client.pending.capacity() <= 1024,
        "{}",
        p.client.pending.capacity()
    );
}

#[test]
fn non_qblock1_blocks_go_out_as_a_set_past_nstart() {
    use crate::blockwise::qblock::Q_BLOCK1;
    use crate::message::BlockValue;
    let mut p = Pair::new();
    let block = |num: u32, mtype: MessageType| {
        let mut m = get("/upload");
        m.code = Code::PUT;
        m.mtype = mtype;
        let value = BlockValue::new(num, num < 9, 2).unwrap();
        m.options.set_uint(Q_BLOCK1, value.encode());
        m.payload = vec![7; 64];
        m
    };
    // Ten NON blocks with NSTART=1: all on the wire at once.
    let ids: Vec<_> = (0..10)
        .map(|n| {
            p.client
                .request(p.now, p.s, block(n, MessageType::NonConfirmable))
                .unwrap()
        })
        .collect();
    let sent = p.client_sends();
    assert_eq!(sent.len(), 10, "a set is not held back by NSTART");
    // The blocks still take their answers (the server answers the set's last one).
    let last = codec::decode(&sent[9]).unwrap();
    let mut answer = Message::new(MessageType::NonConfirmable, Code::CHANGED, 900);
    answer.token = last.token;
    p.deliver_to_client(&codec::encode(&answer));
    assert!(matches!(p.client.poll_event(), Some(Event::Response { id, .. }) if id == ids[9]));
    // CON blocks keep to NSTART; a block with the M bit ends at its empty ACK,
    // handed over as its answer, and the next goes.
    let first = p
        .client
        .request(p.now, p.s, block(0, MessageType::Confirmable))
        .unwrap();
    p.client
        .request(p.now, p.s, block(1, MessageType::Confirmable))
        .unwrap();
    let sent = p.client_sends();
    assert_eq!(sent.len(), 1, "NSTART=1 for CON blocks");
    let mid = codec::decode(&sent[0]).unwrap().mid;
    p.deliver_to_client(&codec::encode(&Message::empty_ack(mid)));
    assert!(matches!(
        p.client.poll_event(),
        Some(Event::Response { id, response }) if id == first && response.code == Code::EMPTY
    ));
    assert!(!p.client.is_request_active(first));
    assert_eq!(p.client_sends().len(), 1, "the next block goes at the ACK");
}

#[test]
fn unknown_critical_option_gets_4_02() {
    let mut p = Pair::new();
    let mut m = get("/x");
    m.mid = 77;
    m.options.push(9, vec![1]);
    p.deliver_to_server(&codec::encode(&m));
    assert_eq!(p.server.poll_event(), None);
    let resp = codec::decode(&p.server_sends()[0]).unwrap();
    assert_eq!(resp.code, Code::BAD_OPTION);
    assert_eq!(resp.mtype, MessageType::Acknowledgement);
    assert_eq!(resp.mid, 77);
    // An unknown elective option is ignored.
    let mut m = get("/x");
    m.mid = 78;
    m.options.push(100, vec![1]);
    p.deliver_to_server(&codec::encode(&m));
    assert!(matches!(p.server.poll_event(), Some(Event::Request { .. })));
}

#[test]
fn a_handled_critical_option_reaches_the_application_and_others_still_get_4_02() {
    let mut p = Pair::new();
    let config = EndpointConfig {
        handled_options: crate::message::option::HandledOptions::new([9, 65001]),
        ..EndpointConfig::default()
    };
    p.server = Endpoint::with_seed(config, p.now, 2);
    let mut m = get("/x");
    m.mid = 80;
    m.options.push(9, vec![1]);
    m.options.push(65001, vec![]);
    p.deliver_to_server(&codec::encode(&m));
    assert!(matches!(p.server.poll_event(), Some(Event::Request { .. })));
    let mut m = get("/x");
    m.mid = 81;
    m.options.push(65003, vec![]);
    p.deliver_to_server(&codec::encode(&m));
    assert_eq!(p.server.poll_event(), None);
    let resp = codec::decode(&p.server_sends()[0]).unwrap();
    assert_eq!(resp.code, Code::BAD_OPTION);
}

#[test]
fn format_errors_get_rst_for_con_and_silence_otherwise() {
    let mut p = Pair::new();
    // token length nibble 15 (reserved, RFC 8974 §2.1) in a CON
    p.deliver_to_server(&[0x4f, 0x01, 0x12, 0x34, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    let rst = codec::decode(&p.server_sends()[0]).unwrap();
    assert_eq!((rst.mtype, rst.mid), (MessageType::Reset, 0x1234));
    // truncated option in a NON: silently dropped
    p.deliver_to_server(&[0x50, 0x01, 0, 1, 0xb5, b'a']);
    assert!(p.server_sends().is_empty());
    // random short garbage
    p.deliver_to_server(&[0xff]);
    assert!(p.server_sends().is_empty());
    assert_eq!(p.server.stats().format_errors, 3);
    assert_eq!(p.server.state_counts().dedup_entries, 0);
}

#[test]
fn ping_gets_rst() {
    let mut p = Pair::new();
    p.deliver_to_server(&codec::encode(&Message::new(
        MessageType::Confirmable,
        Code::EMPTY,
        5,
    )));
    let rst = codec::decode(&p.server_sends()[0]).unwrap();
    assert_eq!((rst.mtype, rst.mid), (MessageType::Reset, 5));
}

#[test]
fn rst_to_a_request_reports_reset() {
    let mut p = Pair::new();
    let rid = p.client.request(p.now, p.s, get("/x")).unwrap();
    let req = codec::decode(&p.client_sends()[0]).unwrap();
    p.deliver_to_client(&codec::encode(&Message::reset(req.mid)));
    assert_eq!(
        p.client.poll_event(),
        Some(Event::Reset { id: rid, peer: p.s })
    );
    p.advance(Duration::from_secs(10));
    assert!(p.client_sends().is_empty(), "no retransmission after RST");
}

#[test]
fn response_for_unknown_token_is_reset() {
    let mut p = Pair::new();
    let mut m = content("stray");
    m.mtype = MessageType::Confirmable;
    m.mid = 9;
    m.token = Token::new(&[1, 2, 3]).unwrap();
    p.deliver_to_client(&codec::encode(&m));
    let rst = codec::decode(&p.client_sends()[0]).unwrap();
    assert_eq!((rst.mtype, rst.mid), (MessageType::Reset, 9));
    assert_eq!(p.client.poll_event(), None);
}

#[test]
fn overload_answers_5_03_with_max_age() {
    let now = Instant::now();
    let cfg = EndpointConfig {
        max_server_exchanges: 1,
        ..Default::default()
    };
    let mut server = Endpoint::with_seed(cfg, now, 3);
    let c = addr("10.0.0.1:1");
    let mut m = get("/x");
    m.mid = 1;
    server.handle_datagram(now, c, &codec::encode(&m));
    m.mid = 2;
    server.handle_datagram(now, c, &codec::encode(&m));
    assert!(matches!(server.poll_event(), Some(Event::Request { .. })));
    assert_eq!(server.poll_event(), None);
    let resp = codec::decode(&server.poll_transmit().unwrap().bytes).unwrap();
    assert_eq!(resp.code, Code::SERVICE_UNAVAILABLE);
    assert_eq!(resp.options.get_uint(opt::MAX_AGE), Some(2));
    assert_eq!(server.stats().overload_rejections, 1);
}

#[test]
fn observe_request_keeps_receiving_notifications_until_cancelled() {
    let mut p = Pair::new();
    let mut m = get("/obs");
    m.options.set_uint(opt::OBSERVE, 0);
    let rid = p.client.request(p.now, p.s, m).unwrap();
    let req = codec::decode(&p.client_sends()[0]).unwrap();
    for seq in 1..=3u32 {
        let mut n = content(&format!("n{seq}"));
        n.options.set_uint(opt::OBSERVE, seq);
        n.token = req.token.clone();
        if seq == 1 {
            n.mid = req.mid;
        } else {
            n.mtype = MessageType::NonConfirmable;
            n.mid = 100 + seq as u16;
        }
        p.deliver_to_client(&codec::encode(&n));
        assert!(matches!(p.client.poll_event(), Some(Event::Response { id, .. }) if id == rid));
    }
    p.client.cancel(p.now, rid);
    let mut n = content("after");
    n.options.set_uint(opt::OBSERVE, 9);
    n.token = req.token;
    n.mtype = MessageType::NonConfirmable;
    n.mid = 200;
    p.deliver_to_client(&codec::encode(&n));
    assert_eq!(p.client.poll_event(), None);
    let rst = codec::decode(&p.client_sends()[0]).unwrap();
    assert_eq!(rst.mtype, MessageType::Reset, "reactive cancel");
}

/// An observing client keeps no dedup entries for its notifications: a duplicate CON
/// notification is acknowledged again and handed over again (the observation drops
/// it by its Observe number), so a client of thousands of servers keeps nothing per
/// server for them.
#[test]
fn notifications_are_acknowledged_again_but_not_remembered() {
    let mut p = Pair::new();
    let mut m = get("/obs");
    m.options.set_uint(opt::OBSERVE, 0);
    let rid = p.client.request(p.now, p.s, m).unwrap();
    let req = codec::decode(&p.client_sends()[0]).unwrap();
    let mut first = content("n1");
    first.options.set_uint(opt::OBSERVE, 1);
    first.token = req.token.clone();
    first.mid = req.mid;
    p.deliver_to_client(&codec::encode(&first));
    assert!(matches!(p.client.poll_event(), Some(Event::Response { id, .. }) if id == rid));
    let mut note = content("n2");
    note.options.set_uint(opt::OBSERVE, 2);
    note.token = req.token.clone();
    note.mtype = MessageType::Confirmable;
    note.mid = 500;
    for _ in 0..2 {
        p.deliver_to_client(&codec::encode(&note));
        let ack = codec::decode(&p.client_sends()[0]).unwrap();
        assert_eq!((ack.mtype, ack.mid), (MessageType::Acknowledgement, 500));
        assert!(
            matches!(p.client.poll_event(), Some(Event::Response { id, ref response }) if id == rid && response.payload == b"n2")
        );
    }
    let mut non = note.clone();
    non.mtype = MessageType::NonConfirmable;
    non.mid = 501;
    p.deliver_to_client(&codec::encode(&non));
    assert!(p.client.poll_event().is_some());
    assert_eq!(p.client.state_counts().dedup_entries, 0);
    // A response to a plain request is still remembered: its duplicate gets the ACK
    // again and is not handed over twice (the exchange has ended).
    let rid = p.client.request(p.now, p.s, get("/once")).unwrap();
    let req = codec::decode(&p.client_sends()[0]).unwrap();
    p.deliver_to_client(&codec::encode(&Message::empty_ack(req.mid)));
    let mut answer = content("once");
    answer.mtype = MessageType::Confirmable;
    answer.token = req.token;
    answer.mid = 600;
    p.deliver_to_client(&codec::encode(&answer));
    assert!(matches!(p.client.poll_event(), Some(Event::Response { id, .. }) if id == rid));
    assert_eq!(p.client.state_counts().dedup_entries, 1);
}

/// A request that nothing waits before goes out at once, and its peer's entry stays
/// small: no NSTART queue, no record of message ID blocks (the rarely used part, an
/// allocation per peer); one beyond NSTART waits in the queue, made for it.
#[test]
fn a_request_with_room_skips_the_nstart_queue() {
    let mut p = Pair::new();
    p.client.request(p.now, p.s, get("/a")).unwrap();
    assert_eq!(p.client_sends().len(), 1);
    assert!(p.client.peers.get(&p.s).unwrap().rare.is_none());
    // The table's whole entry: the peer's address (its key) and its congestion
    // state are part of it.
    assert!(
        std::mem::size_of::<Peer>() <= 136,
        "the per-peer entry grew to {} bytes",
        std::mem::size_of::<Peer>()
    );
    p.client.request(p.now, p.s, get("/b")).unwrap();
    assert!(p.client_sends().is_empty(), "NSTART = 1: the second waits");
    let queued = p
        .client
        .peers
        .get(&p.s)
        .unwrap()
        .rare
        .as_ref()
        .map(|r| r.queue.len());
    assert_eq!(queued, Some(1));
}

#[test]
fn state_is_released_after_the_lifetimes() {
    let mut p = Pair::new();
    for i in 0..10 {
        p.client
            .request(p.now, p.s, post(&format!("/{i}")))
            .unwrap();
        let req = p.client_sends().remove(0);
        p.deliver_to_server(&req);
        let id = server_request(&mut p);
        p.server.respond(p.now, id, content("x")).unwrap();
        let resp = p.server_sends().remove(0);
        p.deliver_to_client(&resp);
        assert!(p.client.poll_event().is_some());
    }
    // The server remembers the client's last `dedup_per_peer` (8) messages.
    assert_eq!(p.server.state_counts().dedup_entries, 8);
    let life = p.server.config().exchange_lifetime();
    for _ in 0..10 {
        p.advance(life / 4);
    }
    assert_eq!(p.server.state_counts(), StateCounts::default());
    assert_eq!(p.client.state_counts(), StateCounts::default());
    assert_eq!(p.server.poll_timeout(), None, "no timer left once idle");
}

#[test]
fn the_tables_give_their_memory_back_after_a_burst() {
    let mut p = Pair::new();
    // 5,000 requests to as many silent servers: exchanges, tokens, peers, timers.
    for i in 0..5_000u32 {
        let to = SocketAddr::from(([10, 1, (i >> 8) as u8, i as u8], 5683));
        p.client.request(p.now, to, get("/x")).unwrap();
    }
    p.client_sends();
    let peak = p.client.table_capacity();
    assert!(peak >= 5 * 5_000, "capacity {peak} at the peak");
    // They are retransmitted, then given up; the lifetimes pass.
    let life = p.client.config().exchange_lifetime();
    for _ in 0..40 {
        p.advance(life / 4);
        p.client_sends();
        while p.client.poll_event().is_some() {}
    }
    assert_eq!(p.client.state_counts(), StateCounts::default());
    let after = p.client.table_capacity();
    assert!(
        after <= 1024,
        "capacity {after} after the burst (peak {peak})"
    );
}

#[test]
fn responses_are_counted_by_code_class() {
    let mut p = Pair::new();
    // 2.05 via respond
    let mut m = get("/a");
    m.mid = 1;
    p.deliver_to_server(&codec::encode(&m));
    let id = server_request(&mut p);
    p.server.respond(p.now, id, content("ok")).unwrap();
    // 4.04 via respond
    m.mid = 2;
    p.deliver_to_server(&codec::encode(&m));
    let id = server_request(&mut p);
    let not_found = Message::new(MessageType::Acknowledgement, Code::NOT_FOUND, 0);
    p.server.respond(p.now, id, not_found).unwrap();
    // 4.02 answered without a handler
    m.mid = 3;
    m.code = Code::POST;
    m.options.push(9, vec![1]);
    p.deliver_to_server(&codec::encode(&m));
    // a duplicate is not a new response
    p.deliver_to_server(&codec::encode(&m));
    // 2.05 notification, to a verified peer (the CoAP ping's RST verifies it)
    let token = Token::new(&[7]).unwrap();
    p.server
        .notify(p.now, p.c, token, content("n"), false, None);
    assert_eq!(p.server.stats().responses_2xx, 1, "not before verification");
    let ping = p.server_sends().pop().unwrap();
    p.deliver_to_client(&ping);
    let rst = p.client_sends().remove(0);
    p.deliver_to_server(&rst);
    let s = p.server.stats();
    assert_eq!(
        (s.responses_2xx, s.responses_4xx, s.responses_5xx),
        (2, 2, 0)
    );

    // 5.03 under overload
    let cfg = EndpointConfig {
        max_server_exchanges: 1,
        ..Default::default()
    };
    let mut server = Endpoint::with_seed(cfg, p.now, 3);
    let mut m = get("/x");
    for mid in 1..=3 {
        m.mid = mid;
        server.handle_datagram(p.now, p.c, &codec::encode(&m));
    }
    let s = server.stats();
    assert_eq!(
        (s.responses_2xx, s.responses_4xx, s.responses_5xx),
        (0, 0, 2)
    );
    assert_eq!(s.overload_rejections, 2);
}

#[test]
fn oversized_con_request_gets_4_13_with_size1() {
    let mut p = Pair::new();
    let mut m = get("/x");
    m.mid = 42;
    m.token = Token::new(&[9, 9]).unwrap();
    m.payload = vec![0; 100];
    let bytes = codec::encode(&m);
    p.server.handle_oversized(p.c, &bytes[..20], 4096);
    let resp = codec::decode(&p.server_sends()[0]).unwrap();
    assert_eq!(resp.code, Code::REQUEST_ENTITY_TOO_LARGE);
    assert_eq!((resp.mid, resp.token), (42, m.token));
    assert_eq!(resp.options.get_uint(opt::SIZE1), Some(4096));
    assert_eq!(p.server.poll_event(), None);
    assert_eq!(p.server.stats().responses_4xx, 1);
}

#[test]
fn no_response_suppresses_the_chosen_classes_but_still_acks() {
    let mut p = Pair::new();
    // NON POST with No-Response: 2 (not interested in 2.xx): nothing comes back.
    let mut m = get("/x");
    m.code = Code::POST;
    m.mtype = MessageType::NonConfirmable;
    m.mid = 1;
    m.options.set_uint(opt::NO_RESPONSE, 2);
    p.deliver_to_server(&codec::encode(&m));
    let id = server_request(&mut p);
    p.server.respond(p.now, id, content("ok")).unwrap();
    assert!(p.server_sends().is_empty());
    // ...but an error is still reported.
    m.mid = 2;
    p.deliver_to_server(&codec::encode(&m));
    let id = server_request(&mut p);
    let mut err = content("bad");
    err.code = Code::BAD_REQUEST;
    p.server.respond(p.now, id, err).unwrap();
    assert_eq!(
        codec::decode(&p.server_sends()[0]).unwrap().code,
        Code::BAD_REQUEST
    );
    // A CON request with No-Response: 26 (all classes) gets an empty ACK only.
    let mut c = get("/x");
    c.mid = 3;
    c.options.set_uint(opt::NO_RESPONSE, 26);
    p.deliver_to_server(&codec::encode(&c));
    let id = server_request(&mut p);
    p.server.respond(p.now, id, content("ok")).unwrap();
    let sent = p.server_sends();
    let ack = codec::decode(&sent[0]).unwrap();
    assert_eq!(
        (sent.len(), ack.mtype, ack.code, ack.mid),
        (1, MessageType::Acknowledgement, Code::EMPTY, 3)
    );
}

#[test]
fn message_ids_are_not_reused_within_the_exchange_lifetime() {
    let mut p = Pair::new();
    let mut used = std::collections::HashSet::new();
    let mut sent = 0u32;
    // 70,000 requests, one every millisecond, each answered at once: more than 65,536
    // message IDs would be needed within EXCHANGE_LIFETIME (247 s).
    for _ in 0..70_000 {
        p.now += Duration::from_millis(1);
        p.client.handle_timeout(p.now);
        p.client.request(p.now, p.s, get("/x")).unwrap();
        for bytes in p.client_sends() {
            let m = codec::decode(&bytes).unwrap();
            assert!(
                used.insert(m.mid),
                "MID {} reused within the lifetime",
                m.mid
            );
            sent += 1;
            let mut ack = content("ok");
            ack.mid = m.mid;
            ack.token = m.token;
            p.deliver_to_client(&codec::encode(&ack));
        }
        while p.client.poll_event().is_some() {}
    }
    assert!((61_440..=65_536).contains(&sent), "sent {sent}");
    assert!(p.client.stats().mid_waits > 0);
    // Once the lifetime has passed, the queued requests go out.
    p.advance(p.client.config().exchange_lifetime());
    assert!(
        !p.client_sends().is_empty(),
        "queue resumes after the lifetime"
    );
}

/// The answer to a request finds its peer's entry where the request's lookup left it
/// (its exchange keeps the slot); when the table moved meanwhile (it grew, or the
/// peer's session moved to a new address) the slot is stale and the address is looked
/// up instead: either way the request leaves the peer's requests in progress, and an
/// answer that is kept marks the peer's entry for deduplication.
#[test]
fn an_answer_finds_its_peers_entry_after_the_table_grew_or_the_peer_moved() {
    let mut p = Pair::new();
    let mut post_request = post("/a");
    post_request.mid = 1;
    p.deliver_to_server(&codec::encode(&post_request));
    let posted = server_request(&mut p);
    let mut get_request = get("/b");
    get_request.mid = 2;
    p.deliver_to_server(&codec::encode(&get_request));
    let got = server_request(&mut p);
    let moved = addr("10.0.0.9:40000");
    let mut moved_request = get("/c");
    moved_request.mid = 3;
    p.server.handle_datagram(
        p.now,
        addr("10.0.0.8:40000"),
        &codec::encode(&moved_request),
    );
    let of_moved = server_request(&mut p);
    for port in 1..2000u16 {
        let other = SocketAddr::from(([10, 1, 0, 1], port));
        p.server
            .handle_datagram(p.now, other, &codec::encode(&get("/x")));
    }
    assert!(p.server.move_peer(p.now, addr("10.0.0.8:40000"), moved));
    assert_eq!(p.server.peers.get(&p.c).unwrap().in_progress.len(), 2);
    p.server.respond(p.now, posted, content("a")).unwrap();
    p.server.respond(p.now, got, content("b")).unwrap();
    p.server.respond(p.now, of_moved, content("c")).unwrap();
    let c = p.server.peers.get(&p.c).unwrap();
    assert!(c.in_progress.is_empty(), "both answered: none in progress");
    assert!(c.stored, "the POST's answer is kept for its duplicates");
    assert!(p.server.peers.get(&moved).unwrap().in_progress.is_empty());
    assert!(!p.server.peers.contains_key(&addr("10.0.0.8:40000")));
    let sent = p.server_sends();
    assert_eq!(sent.len(), 3, "the three answers went out");
    p.deliver_to_server(&codec::encode(&post_request));
    assert_eq!(
        p.server_sends().first(),
        sent.iter().find(|b| codec::decode(b).unwrap().mid == 1),
        "a duplicate of the POST gets the kept answer"
    );
}

use super::*;
use crate::message::tcp::{decode_tcp, decode_ws, encode_ws, signal_option};
use crate::message::Options;
use proptest::prelude::*;

fn t0() -> Instant {
    Instant::now()
}

fn pair(now: Instant) -> (TcpConnection, TcpConnection) {
    (
        TcpConnection::with_token_seed(TcpConfig::default(), now, 1),
        TcpConnection::with_token_seed(TcpConfig::default(), now, 1000),
    )
}

/// Moves bytes both ways until neither side has anything to send.
fn pump(now: Instant, a: &mut TcpConnection, b: &mut TcpConnection) {
    loop {
        let mut moved = false;
        if let Some(bytes) = a.poll_transmit() {
            b.handle_bytes(now, &bytes);
            moved = true;
        }
        if let Some(bytes) = b.poll_transmit() {
            a.handle_bytes(now, &bytes);
            moved = true;
        }
        if !moved {
            return;
        }
    }
}

fn events(c: &mut TcpConnection) -> Vec<TcpEvent> {
    std::iter::from_fn(|| c.poll_event()).collect()
}

/// Decodes every frame in `bytes`.
fn frames(mut bytes: &[u8]) -> Vec<TcpMessage> {
    let mut out = Vec::new();
    while let Some((m, used)) = decode_tcp(bytes, usize::MAX).unwrap() {
        out.push(m);
        bytes = &bytes[used..];
    }
    assert!(bytes.is_empty());
    out
}

fn get(path: &str) -> TcpMessage {
    let mut m = TcpMessage::new(Code::GET);
    m.options.set_uri_path(path);
    m
}

fn established(now: Instant) -> (TcpConnection, TcpConnection) {
    let (mut a, mut b) = pair(now);
    pump(now, &mut a, &mut b);
    assert!(a.is_established() && b.is_established());
    events(&mut a);
    events(&mut b);
    (a, b)
}

#[test]
fn csm_is_sent_first_and_exchanged() {
    let now = t0();
    let (mut a, mut b) = pair(now);
    let first = frames(&a.poll_transmit().unwrap());
    assert_eq!(first.len(), 1);
    assert_eq!(
        Signal::from_message(&first[0]),
        Ok(Signal::Csm {
            extended_token_length: Some(TcpConfig::default().max_token_len as u32),
            max_message_size: Some(TcpConfig::default().max_message_size),
            block_wise_transfer: true
        })
    );
    b.handle_bytes(now, &{
        let mut v = Vec::new();
        encode_tcp(&first[0], &mut v);
        v
    });
    assert_eq!(
        b.peer_max_message_size(),
        TcpConfig::default().max_message_size
    );
    assert!(b.is_established());
    assert!(!a.is_established());
    pump(now, &mut a, &mut b);
    assert!(a.is_established());
    assert_eq!(
        events(&mut a),
        [TcpEvent::PeerSettings {
            max_message_size: TcpConfig::default().max_message_size,
            block_wise_transfer: true,
            max_token_len: DEFAULT_MAX_TOKEN_LEN,
        }]
    );
}

#[test]
fn split_and_coalesced_delivery() {
    let now = t0();
    let (mut a, mut b) = pair(now);
    for i in 0..5 {
        a.request(now, get(&format!("r{i}"))).unwrap();
    }
    // CSM and five requests, delivered one byte at a time.
    let bytes = a.poll_transmit().unwrap();
    for byte in &bytes {
        b.handle_bytes(now, std::slice::from_ref(byte));
    }
    let n = events(&mut b)
        .iter()
        .filter(|e| matches!(e, TcpEvent::Request { .. }))
        .count();
    assert_eq!(n, 5);
    assert!(!b.is_closed());
    // A second instance gets them all in one read.
    let mut c = TcpConnection::new(TcpConfig::default(), now);
    c.handle_bytes(now, &bytes);
    assert_eq!(events(&mut c).len(), 6);
}

#[test]
fn first_message_must_be_csm() {
    let now = t0();
    let mut server = TcpConnection::new(TcpConfig::default(), now);
    server.poll_transmit();
    let mut bytes = Vec::new();
    encode_tcp(&get("x"), &mut bytes);
    server.handle_bytes(now, &bytes);
    assert!(server.is_closed());
    let out = frames(&server.poll_transmit().unwrap());
    assert!(matches!(
        Signal::from_message(&out[0]),
        Ok(Signal::Abort { .. })
    ));
    assert!(matches!(
        events(&mut server)[..],
        [TcpEvent::Closed {
            reason: CloseReason::LocalAbort(_),
            ..
        }]
    ));
    // Nothing more is processed once closed.
    server.handle_bytes(now, &bytes);
    assert!(server.poll_event().is_none());
}

#[test]
fn peer_sees_abort() {
    let now = t0();
    let (mut a, mut b) = established(now);
    let t = a.request(now, get("x")).unwrap();
    b.abort(None, "going away");
    pump(now, &mut a, &mut b);
    assert_eq!(
        events(&mut a),
        [TcpEvent::Closed {
            reason: CloseReason::PeerAbort {
                bad_csm_option: None,
                diagnostic: "going away".into()
            },
            outstanding: vec![t]
        }]
    );
    assert_eq!(a.request(now, get("y")), Err(SendError::Closed));
}

fn frame(m: &TcpMessage) -> Vec<u8> {
    let mut v = Vec::new();
    encode_tcp(m, &mut v);
    v
}

#[test]
fn peer_release_lets_outstanding_responses_arrive() {
    let now = t0();
    let (mut a, mut b) = established(now);
    let t = a.request(now, get("x")).unwrap();
    pump(now, &mut a, &mut b);
    let Some(TcpEvent::Request { token, .. }) = b.poll_event() else {
        panic!("no request")
    };
    // b announces Release but still answers what it has.
    a.handle_bytes(
        now,
        &frame(
            &Signal::Release {
                alternative_addresses: vec![],
                hold_off: Some(5),
                diagnostic: "shutting down".into(),
            }
            .to_message(),
        ),
    );
    assert_eq!(
        events(&mut a),
        [TcpEvent::ReleaseReceived {
            alternative_addresses: vec![],
            hold_off: Some(5)
        }]
    );
    assert!(a.is_releasing() && !a.is_closed());
    assert_eq!(a.request(now, get("y")), Err(SendError::Closed));
    b.respond(now, token, TcpMessage::new(Code::CONTENT))
        .unwrap();
    pump(now, &mut a, &mut b);
    let ev = events(&mut a);
    assert!(matches!(&ev[0], TcpEvent::Response { token: r, .. } if *r == t));
    assert!(matches!(
        &ev[1],
        TcpEvent::Closed {
            reason: CloseReason::PeerRelease {
                hold_off: Some(5),
                ..
            },
            ..
        }
    ));
    assert!(a.is_closed());
}

#[test]
fn custody_pong_waits_for_earlier_requests() {
    let now = t0();
    let (mut a, mut b) = established(now);
    a.request(now, get("first")).unwrap();
    let ping = a.ping(true).unwrap();
    let plain = a.ping(false).unwrap();
    pump(now, &mut a, &mut b);
    // The plain Ping is answered at once; the Custody one waits for "first".
    assert_eq!(events(&mut a), [TcpEvent::Pong { token: plain }]);
    let token = events(&mut b)
        .into_iter()
        .find_map(|e| match e {
            TcpEvent::Request { token, .. } => Some(token),
            _ => None,
        })
        .unwrap();
    // A request after the Ping does not hold the Pong back.
    a.request(now, get("later")).unwrap();
    pump(now, &mut a, &mut b);
    assert_eq!(a.poll_event(), None);
    b.respond(now, token, TcpMessage::new(Code::CONTENT))
        .unwrap();
    let out = frames(&b.poll_transmit().unwrap());
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].code, Code::CONTENT);
    assert_eq!(out[1].token, ping);
    assert_eq!(
        Signal::from_message(&out[1]),
        Ok(Signal::Pong { custody: true })
    );
}

#[test]
fn csm_timeout_aborts_silent_peer() {
    let now = t0();
    let mut server = TcpConnection::new(TcpConfig::default(), now);
    server.poll_transmit();
    let deadline = server.poll_timeout().unwrap();
    assert_eq!(deadline, now + Duration::from_secs(10));
    server.handle_timeout(deadline - Duration::from_millis(1));
    assert!(!server.is_closed());
    server.handle_timeout(deadline);
    assert!(server.is_closed());
    assert!(matches!(
        events(&mut server)[..],
        [TcpEvent::Closed {
            reason: CloseReason::CsmTimeout,
            ..
        }]
    ));
    let out = frames(&server.poll_transmit().unwrap());
    assert_eq!(out[0].code, signal_code::ABORT);
    assert_eq!(server.poll_timeout(), None);
}

#[test]
fn slowloris_trickle_is_aborted() {
    let now = t0();
    let (_a, mut server) = established(now);
    let mut frame = Vec::new();
    let mut m = get("slow");
    m.payload = vec![0; 100];
    encode_tcp(&m, &mut frame);
    // One byte per second: the frame would take over 100 s.
    let mut t = now;
    for byte in &frame {
        t += Duration::from_secs(1);
        if let Some(deadline) = server.poll_timeout() {
            if deadline <= t {
                server.handle_timeout(t);
            }
        }
        if server.is_closed() {
            break;
        }
        server.handle_bytes(t, std::slice::from_ref(byte));
    }
    assert!(server.is_closed());
    assert!(t <= now + Duration::from_secs(32), "closed only at {t:?}");
    assert!(events(&mut server).iter().any(|e| matches!(
        e,
        TcpEvent::Closed {
            reason: CloseReason::FrameTimeout,
            ..
        }
    )));
    // Sending the CSM slowly does not escape the CSM timeout either.
    let mut slow = TcpConnection::new(TcpConfig::default(), now);
    let mut bytes = Vec::new();
    encode_tcp(
        &Signal::Csm {
            extended_token_length: None,
            max_message_size: Some(1152),
            block_wise_transfer: false,
        }
        .to_message(),
        &mut bytes,
    );
    slow.handle_bytes(now, &bytes[..1]);
    slow.handle_timeout(now + Duration::from_secs(10));
    assert!(slow.is_closed());
}

#[test]
fn steady_complete_messages_are_not_slowloris() {
    let now = t0();
    let (mut a, mut b) = established(now);
    let mut t = now;
    for _ in 0..100 {
        t += Duration::from_secs(20);
        let token = a.ping(false).unwrap();
        pump(t, &mut a, &mut b);
        b.handle_timeout(t);
        a.handle_timeout(t);
        assert_eq!(events(&mut a), [TcpEvent::Pong { token }]);
    }
    assert!(!a.is_closed() && !b.is_closed());
}

/// Two connected connections with `config`, their CSMs exchanged.
fn established_with(now: Instant, config: TcpConfig) -> (TcpConnection, TcpConnection) {
    let mut a = TcpConnection::with_token_seed(config.clone(), now, 1);
    let mut b = TcpConnection::with_token_seed(config, now, 1000);
    pump(now, &mut a, &mut b);
    assert!(a.is_established() && b.is_established());
    events(&mut a);
    events(&mut b);
    (a, b)
}

#[test]
fn ping_pong_echoes_custody_and_token() {
    let now = t0();
    let (mut a, mut b) = established(now);
    let token = a.ping(true).unwrap();
    let bytes = a.poll_transmit().unwrap();
    b.handle_bytes(now, &bytes);
    let pong = frames(&b.poll_transmit().unwrap());
    assert_eq!(pong[0].token, token);
    assert_eq!(
        Signal::from_message(&pong[0]),
        Ok(Signal::Pong { custody: true })
    );
    let mut v = Vec::new();
    encode_tcp(&pong[0], &mut v);
    a.handle_bytes(now, &v);
    assert_eq!(events(&mut a), [TcpEvent::Pong { token }]);
    // An unsolicited Pong is ignored.
    a.handle_bytes(now, &v);
    assert_eq!(a.poll_event(), None);
}

#[test]
fn oversized_frame_aborts_before_body() {
    let now = t0();
    let config = TcpConfig {
        max_message_size: 2000,
        ..TcpConfig::default()
    };
    let (mut a, _) = established(now);
    let mut b = TcpConnection::new(config, now);
    pump(now, &mut a, &mut b);
    events(&mut b);
    // Header announcing a 1 GiB body; no body follows.
    b.handle_bytes(now, &[0xf0, 0x40, 0x00, 0x00, 0x00]);
    assert!(b.is_closed());
    let out = frames(&b.poll_transmit().unwrap());
    assert_eq!(out[0].code, signal_code::ABORT);
    // The peer learned the limit from the CSM and refuses to send more itself.
    assert_eq!(a.peer_max_message_size(), 2000);
    let mut big = get("x");
    big.payload = vec![0; 2000];
    assert!(matches!(
        a.request(now, big),
        Err(SendError::TooLarge { limit: 2000, .. })
    ));
}

#[test]
fn default_peer_limit_before_csm() {
    let now = t0();
    let mut a = TcpConnection::new(TcpConfig::default(), now);
    let mut big = get("x");
    big.payload = vec![0; 1200];
    assert!(matches!(
        a.request(now, big),
        Err(SendError::TooLarge { limit: 1152, .. })
    ));
}

#[test]
fn unknown_critical_csm_option_aborts_with_bad_csm_option() {
    let now = t0();
    let mut server = TcpConnection::new(TcpConfig::default(), now);
    server.poll_transmit();
    let mut csm = TcpMessage::new(signal_code::CSM);
    csm.options.push(7, vec![1]);
    let mut bytes = Vec::new();
    encode_tcp(&csm, &mut bytes);
    server.handle_bytes(now, &bytes);
    let out = frames(&server.poll_transmit().unwrap());
    assert!(matches!(
        Signal::from_message(&out[0]),
        Ok(Signal::Abort {
            bad_csm_option: Some(7),
            ..
        })
    ));
}

#[test]
fn later_csm_updates_settings() {
    let now = t0();
    let (mut a, mut b) = established(now);
    let mut bytes = Vec::new();
    encode_tcp(
        &Signal::Csm {
            extended_token_length: None,
            max_message_size: Some(5000),
            block_wise_transfer: true,
        }
        .to_message(),
        &mut bytes,
    );
    b.handle_bytes(now, &bytes);
    assert_eq!(b.peer_max_message_size(), 5000);
    assert!(b.peer_block_wise_transfer());
    let _ = a.poll_transmit();
}

#[test]
fn bad_critical_option_gets_4_02_and_overload_gets_5_03() {
    let now = t0();
    let config = TcpConfig {
        max_inbound_requests: 2,
        ..TcpConfig::default()
    };
    let mut a = TcpConnection::new(TcpConfig::default(), now);
    let mut b = TcpConnection::new(config, now);
    pump(now, &mut a, &mut b);
    let mut bad = get("x");
    bad.options.push(9999, vec![1]);
    let tb = a.request(now, bad).unwrap();
    let tokens: Vec<Token> = (0..3).map(|_| a.request(now, get("y")).unwrap()).collect();
    pump(now, &mut a, &mut b);
    let got: Vec<(Token, Code)> = events(&mut a)
        .into_iter()
        .filter_map(|e| match e {
            TcpEvent::Response { token, message } => Some((token, message.code)),
            _ => None,
        })
        .collect();
    assert_eq!(
        got,
        [
            (tb, Code::BAD_OPTION),
            (tokens[2].clone(), Code::SERVICE_UNAVAILABLE)
        ]
    );
    let n = events(&mut b)
        .iter()
        .filter(|e| matches!(e, TcpEvent::Request { .. }))
        .count();
    assert_eq!(n, 2);
}

#[test]
fn a_handled_critical_option_reaches_the_application() {
    let now = t0();
    let config = TcpConfig {
        handled_options: crate::message::option::HandledOptions::new([9]),
        ..TcpConfig::default()
    };
    let mut a = TcpConnection::new(TcpConfig::default(), now);
    let mut b = TcpConnection::new(config, now);
    pump(now, &mut a, &mut b);
    let mut oscore = get("x");
    oscore.options.push(9, vec![0x09]);
    a.request(now, oscore).unwrap();
    let mut other = get("x");
    other.options.push(65003, vec![]);
    let refused = a.request(now, other).unwrap();
    pump(now, &mut a, &mut b);
    let requests: Vec<TcpMessage> = events(&mut b)
        .into_iter()
        .filter_map(|e| match e {
            TcpEvent::Request { message, .. } => Some(message),
            _ => None,
        })
        .collect();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].options.get(9), Some(&[0x09][..]));
    let answers: Vec<(Token, Code)> = events(&mut a)
        .into_iter()
        .filter_map(|e| match e {
            TcpEvent::Response { token, message } => Some((token, message.code)),
            _ => None,
        })
        .collect();
    assert_eq!(answers, [(refused, Code::BAD_OPTION)]);
}

#[test]
fn observation_keeps_its_token_until_cancelled() {
    let now = t0();
    let (mut a, mut b) = established(now);
    let mut req = get("obs");
    req.options.set_uint(number::OBSERVE, 0);
    let token = a.request(now, req).unwrap();
    pump(now, &mut a, &mut b);
    let Some(TcpEvent::Request { token: st, .. }) = b.poll_event() else {
        panic!()
    };
    let mut first = TcpMessage::new(Code::CONTENT);
    first.options.set_uint(number::OBSERVE, 1);
    b.respond(now, st.clone(), first).unwrap();
    // Further notifications are written directly with the same token.
    let mut n2 = TcpMessage::new(Code::CONTENT);
    n2.token = st;
    n2.options.set_uint(number::OBSERVE, 2);
    let mut bytes = b.poll_transmit().unwrap();
    encode_tcp(&n2, &mut bytes);
    a.handle_bytes(now, &bytes);
    assert_eq!(events(&mut a).len(), 2);
    assert_eq!(a.outstanding_requests(), 1);
    a.cancel(token);
    a.handle_bytes(now, &bytes);
    assert_eq!(a.poll_event(), None);
}

/// Registers an observation of `a` at `b`: returns (a's token, b's token).
fn observed(now: Instant, a: &mut TcpConnection, b: &mut TcpConnection) -> (Token, Token) {
    let mut req = get("obs");
    req.options.set_uint(number::OBSERVE, 0);
    let token = a.request(now, req).unwrap();
    pump(now, a, b);
    let Some(TcpEvent::Request { token: st, .. }) = b.poll_event() else {
        panic!("no request")
    };
    let mut first = TcpMessage::new(Code::CONTENT);
    first.options.set_uint(number::OBSERVE, 1);
    b.respond(now, st.clone(), first).unwrap();
    pump(now, a, b);
    assert!(matches!(a.poll_event(), Some(TcpEvent::Response { .. })));
    (token, st)
}

fn notification(seq: u32, payload: &[u8]) -> TcpMessage {
    let mut n = TcpMessage::new(Code::CONTENT);
    n.options.set_uint(number::OBSERVE, seq);
    n.payload = payload.to_vec();
    n
}

#[test]
fn a_response_without_observe_registers_nothing() {
    let now = t0();
    let (mut a, mut b) = established(now);
    let mut req = get("obs");
    req.options.set_uint(number::OBSERVE, 0);
    a.request(now, req).unwrap();
    pump(now, &mut a, &mut b);
    let Some(TcpEvent::Request { token: st, .. }) = b.poll_event() else {
        panic!()
    };
    // Beyond max_observers the server answers without Observe (RFC 7641 §4.1).
    b.respond(now, st.clone(), TcpMessage::new(Code::CONTENT))
        .unwrap();
    assert_eq!(b.served_observations(), 0);
    assert_eq!(
        b.notify(now, st.clone(), notification(2, b"")),
        Err(SendError::UnknownToken(st))
    );
    pump(now, &mut a, &mut b);
    events(&mut a);
    assert_eq!(a.outstanding_requests(), 0, "client forgot the token");
}

#[test]
fn deregistration_reuses_the_token_and_drops_stale_notifications() {
    let now = t0();
    let (mut a, mut b) = established(now);
    let (token, st) = observed(now, &mut a, &mut b);
    // A notification is on its way when the client deregisters.
    b.notify(now, st.clone(), notification(2, b"stale"))
        .unwrap();
    let mut dereg = get("obs");
    dereg.token = token.clone();
    dereg.options.set_uint(number::OBSERVE, 1);
    assert_eq!(a.request(now, dereg).unwrap(), token, "same token");
    assert_eq!(a.outstanding_requests(), 1);
    pump(now, &mut a, &mut b);
    assert_eq!(a.poll_event(), None, "the stale notification is dropped");
    // The server sees a new request with the observation's token: the observation ends.
    let Some(TcpEvent::Request { token: t2, message }) = b.poll_event() else {
        panic!()
    };
    assert_eq!(
        (t2, message.options.get_uint(number::OBSERVE)),
        (st.clone(), Some(1))
    );
    assert_eq!(b.served_observations(), 0);
    assert_eq!(
        b.notify(now, st.clone(), notification(3, b"")),
        Err(SendError::UnknownToken(st.clone()))
    );
    b.respond(now, st, TcpMessage::new(Code::CONTENT)).unwrap();
    pump(now, &mut a, &mut b);
    assert!(matches!(
        a.poll_event(),
        Some(TcpEvent::Response { token: t, message }) if t == token && !message.options.contains(number::OBSERVE)
    ));
    assert_eq!(a.outstanding_requests(), 0);
    // A plain request with a token in use still gets a fresh one.
    let (token, _) = observed(now, &mut a, &mut b);
    let mut other = get("x");
    other.token = token.clone();
    assert_ne!(a.request(now, other).unwrap(), token);
}

#[test]
fn notifications_do_not_hold_back_custody_pongs_and_keep_the_connection() {
    let now = t0();
    let (mut a, mut b) = established(now);
    let (_, st) = observed(now, &mut a, &mut b);
    let mut ping = Signal::Ping { custody: true }.to_message();
    ping.token = Token::new(&[5]).unwrap();
    b.handle_bytes(now, &frame(&ping));
    b.notify(now, st.clone(), notification(2, b"n")).unwrap();
    let out = frames(&b.poll_transmit().unwrap());
    assert_eq!(out[0].code, signal_code::PONG, "no request was pending");
    assert_eq!(out[1].code, Code::CONTENT);
    // A served observation is not idleness: no Release however long it is quiet.
    let later = now + Duration::from_secs(3600);
    b.handle_timeout(later);
    assert!(!b.is_closed());
    // Closing forgets it.
    b.handle_eof();
    assert_eq!(b.served_observations(), 0);
    assert_eq!(
        b.notify(later, st, notification(3, b"")),
        Err(SendError::Closed)
    );
}

#[test]
fn block_room_leaves_space_for_block_options_within_the_limit() {
    use crate::message::option::number::{BLOCK1, SIZE1};
    let mut put = TcpMessage::new(Code::PUT);
    put.token = Token::new(&[1, 2, 3, 4]).unwrap();
    put.options.set_uri_path("upload/here");
    for framing in [Framing::Stream, Framing::WebSocket] {
        for limit in [100u32, 1152, 5000, 70_000, 1 << 20] {
            let room = framing.block_room(limit, &put, BLOCK1, SIZE1);
            let mut block = put.clone();
            block.options.set_uint(BLOCK1, (1 << 24) - 1);
            block.options.set_uint(SIZE1, u32::MAX);
            block.payload = vec![0; room];
            assert!(
                framing.frame_len(&block) <= limit as usize,
                "{framing:?} {limit}"
            );
            assert!(
                framing.frame_len(&block) + 8 > limit as usize,
                "room not wasted"
            );
        }
    }
    assert_eq!(Framing::Stream.block_room(10, &put, BLOCK1, SIZE1), 0);
}

#[test]
fn eof_reports_outstanding() {
    let now = t0();
    let (mut a, _b) = established(now);
    let t = a.request(now, get("x")).unwrap();
    a.handle_eof();
    assert_eq!(
        events(&mut a),
        [TcpEvent::Closed {
            reason: CloseReason::PeerClosed,
            outstanding: vec![t]
        }]
    );
}

#[test]
fn signal_option_numbers() {
    let mut o = Options::new();
    o.push(signal_option::CUSTODY, Vec::new());
    assert!(o.contains(2));
}

proptest! {
    /// However the stream is cut into reads, the receiver sees the same events.
    #[test]
    fn any_split_gives_the_same_events(
        paths in proptest::collection::vec("[a-z]{0,40}", 1..8),
        payload_len in 0usize..600,
        cuts in proptest::collection::vec(1usize..64, 0..40),
    ) {
        let now = t0();
        let mut a = TcpConnection::with_token_seed(TcpConfig::default(), now, 7);
        for p in &paths {
            let mut m = get(p);
            m.payload = vec![b'x'; payload_len];
            a.request(now, m).unwrap();
        }
        a.ping(true).unwrap();
        let bytes = a.poll_transmit().unwrap();

        let mut whole = TcpConnection::with_token_seed(TcpConfig::default(), now, 9);
        whole.handle_bytes(now, &bytes);
        let expected = events(&mut whole);

        let mut split = TcpConnection::with_token_seed(TcpConfig::default(), now, 9);
        let mut rest = &bytes[..];
        let mut cuts = cuts.into_iter();
        while !rest.is_empty() {
            let n = cuts.next().unwrap_or(rest.len()).min(rest.len());
            split.handle_bytes(now, &rest[..n]);
            rest = &rest[n..];
        }
        prop_assert_eq!(events(&mut split), expected);
        prop_assert_eq!(split.poll_transmit(), whole.poll_transmit());
    }

    /// Arbitrary bytes after a valid CSM never panic, and leave the connection either
    /// open or closed with an Abort.
    #[test]
    fn arbitrary_input_never_panics(junk in proptest::collection::vec(any::<u8>(), 0..400)) {
        let now = t0();
        let mut c = TcpConnection::new(TcpConfig { max_message_size: 300, ..TcpConfig::default() }, now);
        let mut bytes = Vec::new();
        encode_tcp(&Signal::Csm { extended_token_length: None, max_message_size: None, block_wise_transfer: false }.to_message(), &mut bytes);
        bytes.extend_from_slice(&junk);
        c.handle_bytes(now, &bytes);
        c.handle_timeout(now + Duration::from_secs(1000));
        let _ = events(&mut c);
        prop_assert!(c.inbuf.len() <= 300 + MAX_FRAME_HEADER);
    }
}

// ---------------------------------------------------------------------------------
// WebSocket framing (RFC 8323 §4)

fn ws_pair(now: Instant) -> (TcpConnection, TcpConnection) {
    (
        TcpConnection::with_framing(TcpConfig::default(), Framing::WebSocket, now, 1),
        TcpConnection::with_framing(TcpConfig::default(), Framing::WebSocket, now, 1000),
    )
}

/// Moves whole WebSocket messages both ways until neither side has anything to send;
/// returns how many moved.
fn ws_pump(now: Instant, a: &mut TcpConnection, b: &mut TcpConnection) -> usize {
    let mut n = 0;
    loop {
        let mut moved = false;
        if let Some(m) = a.poll_transmit() {
            b.handle_ws_message(now, &m);
            moved = true;
            n += 1;
        }
        if let Some(m) = b.poll_transmit() {
            a.handle_ws_message(now, &m);
            moved = true;
            n += 1;
        }
        if !moved {
            return n;
        }
    }
}

#[test]
fn ws_messages_are_whole_and_unframed() {
    let now = t0();
    let (mut a, mut b) = ws_pair(now);
    assert_eq!(a.framing(), Framing::WebSocket);
    let token = a.request(now, get("hello")).unwrap();
    // CSM and request come out as two separate WebSocket messages, Len nibble 0.
    let csm = a.poll_transmit().unwrap();
    let req = a.poll_transmit().unwrap();
    assert_eq!(a.poll_transmit(), None);
    assert_eq!(csm[0] >> 4, 0);
    assert_eq!(req[0] >> 4, 0);
    assert_eq!(
        Signal::from_message(&decode_ws(&csm, usize::MAX).unwrap()),
        Ok(Signal::Csm {
            extended_token_length: Some(TcpConfig::default().max_token_len as u32),
            max_message_size: Some(TcpConfig::default().max_message_size),
            block_wise_transfer: true
        })
    );
    let m = decode_ws(&req, usize::MAX).unwrap();
    assert_eq!(m.token, token);
    assert_eq!(req.len(), a.frame_len(&m));
    b.handle_ws_message(now, &csm);
    b.handle_ws_message(now, &req);
    assert!(b.is_established());
    let ev = events(&mut b);
    assert!(matches!(ev[0], TcpEvent::PeerSettings { .. }));
    let TcpEvent::Request { token: t, message } = &ev[1] else {
        panic!("{ev:?}")
    };
    assert_eq!(
        message
            .options
            .get(crate::message::option::number::URI_PATH)
            .map(|v| v.to_vec()),
        Some(b"hello".to_vec())
    );
    let mut reply = TcpMessage::new(Code::CONTENT);
    reply.payload = b"hi".to_vec();
    b.respond(now, t.clone(), reply).unwrap();
    ws_pump(now, &mut a, &mut b);
    let ev = events(&mut a);
    assert!(
        matches!(&ev[1], TcpEvent::Response { token: r, message } if *r == token && message.payload == b"hi")
    );
}

#[test]
fn ws_ping_release_and_abort() {
    let now = t0();
    let (mut a, mut b) = ws_pair(now);
    ws_pump(now, &mut a, &mut b);
    events(&mut a);
    events(&mut b);
    let p = a.ping(false).unwrap();
    ws_pump(now, &mut a, &mut b);
    assert_eq!(events(&mut a), [TcpEvent::Pong { token: p }]);
    a.release();
    assert_eq!(ws_pump(now, &mut a, &mut b), 1);
    assert!(a.is_closed() && b.is_closed());
    assert!(matches!(
        events(&mut b).last(),
        Some(TcpEvent::Closed {
            reason: CloseReason::PeerRelease { .. },
            ..
        })
    ));
}

#[test]
fn ws_first_message_must_be_csm_and_garbage_aborts() {
    let now = t0();
    let (mut a, mut b) = ws_pair(now);
    let _csm = a.poll_transmit();
    a.request(now, get("x")).unwrap();
    let req = a.poll_transmit().unwrap();
    b.handle_ws_message(now, &req);
    assert!(b.is_closed());
    let _ = b.poll_transmit(); // b's CSM
    let abort = decode_ws(&b.poll_transmit().unwrap(), usize::MAX).unwrap();
    assert_eq!(abort.code, signal_code::ABORT);

    // A stream-framed message (Len nibble set) is malformed on a WebSocket.
    let (mut a, mut b) = ws_pair(now);
    ws_pump(now, &mut a, &mut b);
    let mut framed = Vec::new();
    encode_tcp(&get("x"), &mut framed);
    framed[0] |= 0x10;
    b.handle_ws_message(now, &framed);
    assert!(b.is_closed());
    // Empty message: malformed too.
    let (mut a, mut b) = ws_pair(now);
    ws_pump(now, &mut a, &mut b);
    b.handle_bytes(now, &[]);
    assert!(b.is_closed());
}

#[test]
fn ws_oversized_message_aborts_and_peer_limit_counts_ws_size() {
    let now = t0();
    let config = TcpConfig {
        max_message_size: 500,
        ..TcpConfig::default()
    };
    let mut a = TcpConnection::with_framing(TcpConfig::default(), Framing::WebSocket, now, 1);
    let mut b = TcpConnection::with_framing(config, Framing::WebSocket, now, 2);
    ws_pump(now, &mut a, &mut b);
    events(&mut b);
    assert_eq!(a.peer_max_message_size(), 500);
    // 500 bytes on the wire, WebSocket size counted: accepted.
    let mut ok = get("x");
    ok.token = Token::new(&[1, 2, 3, 4]).unwrap();
    ok.payload = vec![0; 500 - ok.ws_frame_len() - 1];
    assert_eq!(a.frame_len(&ok), 500); // payload marker included
    a.request(now, ok).unwrap();
    let mut big = get("x");
    big.payload = vec![0; 600];
    assert!(matches!(
        a.request(now, big.clone()),
        Err(SendError::TooLarge { limit: 500, .. })
    ));
    ws_pump(now, &mut a, &mut b);
    assert!(matches!(events(&mut b)[..], [TcpEvent::Request { .. }]));
    // A peer ignoring the limit gets aborted.
    let mut raw = Vec::new();
    encode_ws(&big, &mut raw);
    b.handle_ws_message(now, &raw);
    assert!(b.is_closed());
    assert!(matches!(
        events(&mut b)[..],
        [TcpEvent::Closed {
            reason: CloseReason::LocalAbort(_),
            ..
        }]
    ));
}

#[test]
fn ws_csm_and_idle_timeouts_apply() {
    let now = t0();
    let mut c = TcpConnection::with_framing(TcpConfig::default(), Framing::WebSocket, now, 1);
    let _ = c.poll_transmit();
    let deadline = c.poll_timeout().unwrap();
    assert_eq!(deadline, now + TcpConfig::default().csm_timeout);
    c.handle_timeout(deadline);
    assert!(c.is_closed());
    let (mut a, mut b) = ws_pair(now);
    ws_pump(now, &mut a, &mut b);
    let idle = TcpConfig::default().idle_timeout.unwrap();
    assert_eq!(b.poll_timeout(), Some(now + idle));
    b.handle_timeout(now + idle);
    assert!(b.is_closed());
    let release = decode_ws(&b.poll_transmit().unwrap(), usize::MAX).unwrap();
    assert_eq!(release.code, signal_code::RELEASE);
}

proptest! {
    /// Arbitrary WebSocket payloads never panic and never leave buffered state behind.
    #[test]
    fn ws_arbitrary_messages_never_panic(
        msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..8)
    ) {
        let now = t0();
        let mut c = TcpConnection::with_framing(
            TcpConfig { max_message_size: 100, ..TcpConfig::default() }, Framing::WebSocket, now, 3);
        let mut csm = Vec::new();
        encode_ws(&Signal::Csm { extended_token_length: None, max_message_size: None, block_wise_transfer: false }.to_message(), &mut csm);
        c.handle_ws_message(now, &csm);
        for m in &msgs {
            c.handle_ws_message(now, m);
        }
        c.handle_timeout(now + Duration::from_secs(1000));
        let _ = events(&mut c);
        prop_assert!(c.inbuf.is_empty());
        while let Some(out) = c.poll_transmit() {
            prop_assert!(decode_ws(&out, usize::MAX).is_ok());
        }
    }
}

#[test]
fn keepalive_gives_up_on_a_peer_that_answers_nothing() {
    let now = t0();
    let (mut a, mut b) = established(now);
    let token = a.request(now, get("x")).unwrap();
    pump(now, &mut a, &mut b);
    let t = now + Duration::from_secs(30);
    a.handle_timeout(t);
    assert!(a.poll_transmit().is_some(), "Ping sent");
    // The peer is gone: nothing comes back.
    a.handle_timeout(t + Duration::from_secs(30));
    assert!(a.is_closed());
    assert_eq!(
        events(&mut a).last(),
        Some(&TcpEvent::Closed {
            reason: CloseReason::KeepaliveTimeout,
            outstanding: vec![token],
        })
    );
    // Without keep-alive the same connection waits forever.
    let quiet = TcpConfig {
        keepalive: None,
        idle_timeout: None,
        ..TcpConfig::default()
    };
    let (mut a, mut b) = established_with(now, quiet);
    a.request(now, get("x")).unwrap();
    pump(now, &mut a, &mut b);
    assert_eq!(a.poll_timeout(), None);
}

#[test]
fn requests_carry_tokens_of_the_configured_length() {
    let now = t0();
    for len in [1usize, 3, 8] {
        let config = TcpConfig {
            token_len: len,
            max_outbound_requests: 1000,
            ..TcpConfig::default()
        };
        let (mut a, mut b) = established_with(now, config);
        let tokens: Vec<Token> = (0..300)
            .map_while(|i| a.request(now, get(&format!("r{i}"))).ok())
            .collect();
        // One byte leaves 255 tokens to have outstanding at once.
        assert_eq!(tokens.len(), if len == 1 { 255 } else { 300 });
        assert!(tokens.iter().all(|t| t.as_bytes().len() == len), "{len}");
        let mut unique = tokens.clone();
        unique.sort_by_key(|t| t.as_bytes().to_vec());
        unique.dedup();
        assert_eq!(unique.len(), tokens.len(), "tokens in use are never reused");
        pump(now, &mut a, &mut b);
    }
}

/// A token of `len` bytes counting up from `seed`.
fn long_token(len: usize, seed: u8) -> Token {
    let bytes: Vec<u8> = (0..len).map(|i| seed.wrapping_add(i as u8)).collect();
    Token::new(&bytes).unwrap()
}

#[test]
fn extended_token_length_is_announced_and_bounds_what_is_sent() {
    let now = t0();
    let (mut a, b) = established(now);
    // Both announced the default maximum, so each may send tokens that long.
    assert_eq!(a.peer_max_token_len(), DEFAULT_MAX_TOKEN_LEN);
    assert_eq!(b.peer_max_token_len(), DEFAULT_MAX_TOKEN_LEN);
    let mut req = get("x");
    req.token = long_token(DEFAULT_MAX_TOKEN_LEN + 1, 0);
    assert_eq!(
        a.request(now, req),
        Err(SendError::TokenTooLong {
            len: DEFAULT_MAX_TOKEN_LEN + 1,
            limit: DEFAULT_MAX_TOKEN_LEN
        })
    );
    // A peer that announces nothing is held to RFC 7252's eight bytes; one that
    // announces 4 still gets 8.
    for (announced, expected) in [(None, 8), (Some(4), 8), (Some(300), 300)] {
        let mut c = TcpConnection::new(TcpConfig::default(), now);
        let mut csm = Vec::new();
        let signal = Signal::Csm {
            max_message_size: None,
            block_wise_transfer: false,
            extended_token_length: announced,
        };
        encode_tcp(&signal.to_message(), &mut csm);
        c.handle_bytes(now, &csm);
        assert_eq!(c.peer_max_token_len(), expected, "announced {announced:?}");
        let mut req = get("x");
        req.token = long_token(9, 0);
        assert_eq!(c.request(now, req).is_ok(), expected >= 9);
    }
    // Eight bytes or fewer: no Extended-Token-Length in the CSM.
    let short = TcpConfig {
        max_token_len: 8,
        ..TcpConfig::default()
    };
    let mut d = TcpConnection::new(short, now);
    let csm = frames(&d.poll_transmit().unwrap()).remove(0);
    assert!(!csm.options.contains(signal_option::EXTENDED_TOKEN_LENGTH));
}

#[test]
fn long_tokens_are_answered_and_too_long_ones_refused_with_4_00() {
    let now = t0();
    let (mut a, mut b) = established(now);
    let t = long_token(40, 1);
    let mut req = get("x");
    req.token = t.clone();
    assert_eq!(a.request(now, req).unwrap(), t);
    pump(now, &mut a, &mut b);
    let Some(TcpEvent::Request { token, .. }) = b.poll_event() else {
        panic!("request expected");
    };
    assert_eq!(token, t);
    b.respond(now, token, TcpMessage::new(Code::CONTENT))
        .unwrap();
    pump(now, &mut a, &mut b);
    assert!(matches!(a.poll_event(), Some(TcpEvent::Response { token, .. }) if token == t));
    // A peer that ignores our Extended-Token-Length gets 4.00; nothing is held.
    let mut rogue = get("y");
    rogue.token = long_token(DEFAULT_MAX_TOKEN_LEN + 1, 2);
    let mut bytes = Vec::new();
    encode_tcp(&rogue, &mut bytes);
    b.handle_bytes(now, &bytes);
    assert_eq!(b.poll_event(), None);
    let answer = frames(&b.poll_transmit().unwrap()).remove(0);
    assert_eq!(
        (answer.code, &answer.token),
        (Code::BAD_REQUEST, &rogue.token)
    );
    assert!(!b.is_closed());
    // TKL 15 is a format error that ends the connection.
    b.handle_bytes(now, &[0x0f, 0x01]);
    assert!(b.is_closed());
}

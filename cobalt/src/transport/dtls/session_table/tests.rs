use super::*;
use crate::transport::credentials::test_credentials::TestCredentials;
use std::net::IpAddr;

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

const SERVER: u16 = 5684;
const CLIENT: u16 = 40000;

fn server(config: DtlsConfig) -> OpensslDtls {
    let keys = PskStore::new().with("alice", "secretPSK");
    OpensslDtls::server(Arc::new(keys), config).unwrap()
}

fn client(identity: &str, key: &str, config: DtlsConfig) -> OpensslDtls {
    OpensslDtls::client(ClientPsk::new(identity, key), config).unwrap()
}

/// Moves records both ways until nothing is left; returns what each side decrypted.
fn pump(c: &mut OpensslDtls, s: &mut OpensslDtls) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    pump_at(c, s, addr(CLIENT), Instant::now())
}

/// [`pump`] for a client at `from`, at `now`.
fn pump_at(
    c: &mut OpensslDtls,
    s: &mut OpensslDtls,
    from: SocketAddr,
    now: Instant,
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let (mut at_server, mut at_client) = (Vec::new(), Vec::new());
    for _ in 0..50 {
        let mut moved = false;
        while let Some(t) = c.poll_transmit() {
            assert_eq!(t.peer, addr(SERVER));
            at_server.extend(s.handle_datagram(now, from, &t.bytes));
            moved = true;
        }
        while let Some(t) = s.poll_transmit() {
            // Others' records (an evicted session's close_notify) are not this
            // client's to read.
            if t.peer == from {
                at_client.extend(c.handle_datagram(now, addr(SERVER), &t.bytes));
            }
            moved = true;
        }
        if !moved {
            break;
        }
    }
    (at_server, at_client)
}

fn events(t: &mut OpensslDtls) -> Vec<DtlsEvent> {
    std::iter::from_fn(|| t.poll_event()).collect()
}

fn handshake_with(cipher: &str) {
    let config = DtlsConfig {
        ciphers: cipher.into(),
        ..DtlsConfig::default()
    };
    let mut s = server(DtlsConfig::default());
    let mut c = client("alice", "secretPSK", config);
    c.encrypt(Instant::now(), addr(SERVER), b"first");
    let (at_server, _) = pump(&mut c, &mut s);
    assert_eq!(at_server, vec![b"first".to_vec()]);
    assert_eq!(c.cipher(addr(SERVER)), Some(cipher));
    assert_eq!(s.cipher(addr(CLIENT)), Some(cipher));
    s.encrypt(Instant::now(), addr(CLIENT), b"answer");
    let (_, at_client) = pump(&mut c, &mut s);
    assert_eq!(at_client, vec![b"answer".to_vec()]);
    assert_eq!(
        events(&mut c),
        vec![DtlsEvent::Connected { peer: addr(SERVER) }]
    );
    assert_eq!(
        events(&mut s),
        vec![DtlsEvent::Connected { peer: addr(CLIENT) }]
    );
    assert_eq!(s.stats().hello_verify_sent, 1, "cookie exchange happened");
    assert_eq!(s.stats().handshakes, 1);
}

#[test]
fn psk_handshake_ccm8() {
    handshake_with("PSK-AES128-CCM8");
}

#[test]
fn psk_handshake_gcm() {
    handshake_with("PSK-AES128-GCM-SHA256");
}

/// Whether the server's session with `peer` runs without its `SSL`.
fn records_took_over(s: &OpensslDtls, peer: SocketAddr) -> bool {
    matches!(s.sessions[&peer].link, Link::Records(_))
}

#[test]
fn an_established_ccm_8_server_session_drops_its_ssl_and_still_talks_to_openssl() {
    for (cipher, took_over) in [("PSK-AES128-CCM8", true), ("PSK-AES128-GCM-SHA256", false)] {
        let config = DtlsConfig {
            ciphers: cipher.into(),
            ..DtlsConfig::default()
        };
        let mut s = server(DtlsConfig::default());
        let mut c = client("alice", "secretPSK", config);
        let now = Instant::now();
        assert_eq!(
            send_from(&mut c, &mut s, addr(CLIENT), now, b"one"),
            [b"one"]
        );
        assert_eq!(records_took_over(&s, addr(CLIENT)), took_over, "{cipher}");
        assert_eq!(s.cipher(addr(CLIENT)), Some(cipher));
        assert_eq!(
            s.credential(addr(CLIENT)).as_deref(),
            Some(&Credential::PskIdentity(b"alice".to_vec()))
        );
        for i in 0..100u8 {
            s.encrypt(now, addr(CLIENT), &[i; 300]);
            let (at_server, at_client) = pump(&mut c, &mut s);
            assert_eq!(at_client, vec![vec![i; 300]], "{cipher}");
            assert!(at_server.is_empty());
            assert_eq!(send_from(&mut c, &mut s, addr(CLIENT), now, &[i]), [[i]]);
        }
    }
}

#[test]
fn a_replayed_record_is_dropped_after_the_take_over() {
    let mut s = server(DtlsConfig::default());
    let mut c = client("alice", "secretPSK", DtlsConfig::default());
    let now = Instant::now();
    send_from(&mut c, &mut s, addr(CLIENT), now, b"one");
    assert!(records_took_over(&s, addr(CLIENT)));
    c.encrypt(now, addr(SERVER), b"two");
    let record = c.poll_transmit().unwrap().bytes;
    assert_eq!(s.handle_datagram(now, addr(CLIENT), &record), [b"two"]);
    let dropped = s.stats().dropped;
    assert!(s.handle_datagram(now, addr(CLIENT), &record).is_empty());
    let mut forged = record.clone();
    *forged.last_mut().unwrap() ^= 1;
    forged[10] += 1; // a new sequence number, so that only the tag is wrong
    assert!(s.handle_datagram(now, addr(CLIENT), &forged).is_empty());
    assert_eq!(s.stats().dropped, dropped + 2);
    assert_eq!(
        send_from(&mut c, &mut s, addr(CLIENT), now, b"three"),
        [b"three"]
    );
}

/// With an Mbed TLS client, whose timers run on the `now` it is given (OpenSSL's
/// run on the wall clock).
#[cfg(feature = "mbedtls")]
#[test]
fn the_server_sends_its_last_flight_again_when_it_was_lost() {
    use crate::transport::dtls::MbedtlsDtls;
    let mut s = server(DtlsConfig::default());
    let psk = ClientPsk::new("alice", "secretPSK");
    let mut c = MbedtlsDtls::client(&psk, false, DtlsConfig::default()).unwrap();
    let carry = |c: &mut MbedtlsDtls, s: &mut OpensslDtls, now: Instant, keep_answers: bool| {
        let mut at_server = Vec::new();
        for _ in 0..10 {
            while let Some(t) = c.poll_transmit() {
                at_server.extend(s.handle_datagram(now, addr(CLIENT), &t.bytes));
            }
            if !keep_answers && s.stats().handshakes == 1 {
                break;
            }
            while let Some(t) = s.poll_transmit() {
                c.handle_datagram(now, addr(SERVER), &t.bytes);
            }
        }
        at_server
    };
    let t0 = Instant::now();
    c.encrypt(t0, addr(SERVER), b"first");
    carry(&mut c, &mut s, t0, false);
    assert!(records_took_over(&s, addr(CLIENT)));
    let lost: Vec<Transmit> = std::iter::from_fn(|| s.poll_transmit()).collect();
    assert!(
        !lost.is_empty(),
        "the server's ChangeCipherSpec and Finished"
    );
    // The client's timer runs out: it sends its flight again, and the server its own.
    let t1 = c.poll_timeout().unwrap();
    c.handle_timeout(t1);
    let at_server = carry(&mut c, &mut s, t1, true);
    assert_eq!(at_server, vec![b"first".to_vec()]);
    assert_eq!((c.stats().handshakes, s.stats().handshakes), (1, 1));
    assert_eq!(s.cipher(addr(CLIENT)), Some("PSK-AES128-CCM8"));
    s.encrypt(t1, addr(CLIENT), b"answer");
    let answer = s.poll_transmit().unwrap();
    assert_eq!(
        c.handle_datagram(t1, addr(SERVER), &answer.bytes),
        [b"answer"]
    );
}

#[test]
fn close_notify_ends_a_taken_over_session_both_ways() {
    let now = Instant::now();
    let mut s = server(DtlsConfig::default());
    let mut c = client("alice", "secretPSK", DtlsConfig::default());
    send_from(&mut c, &mut s, addr(CLIENT), now, b"one");
    events(&mut s);
    events(&mut c);
    c.close_all();
    pump(&mut c, &mut s);
    assert_eq!(s.stats().sessions, 0);
    assert!(
        matches!(&events(&mut s)[..], [DtlsEvent::Closed { reason, .. }] if reason.contains("closed")),
    );
    let mut c = client("alice", "secretPSK", DtlsConfig::default());
    send_from(&mut c, &mut s, addr(CLIENT), now, b"two");
    assert!(records_took_over(&s, addr(CLIENT)));
    events(&mut c);
    s.close_all();
    pump(&mut c, &mut s);
    assert_eq!(c.stats().sessions, 0);
    assert!(
        matches!(&events(&mut c)[..], [DtlsEvent::Closed { reason, .. }] if reason.contains("closed")),
        "the client read the server's close_notify"
    );
}

#[test]
fn wrong_key_fails_fast_on_both_sides() {
    let mut s = server(DtlsConfig::default());
    let mut c = client("alice", "not-the-key", DtlsConfig::default());
    c.encrypt(Instant::now(), addr(SERVER), b"x");
    let (at_server, _) = pump(&mut c, &mut s);
    assert!(at_server.is_empty());
    assert_eq!(s.session_count(), 0);
    assert_eq!(c.session_count(), 0);
    let ev = events(&mut c);
    let [DtlsEvent::HandshakeFailed { reason, .. }] = ev.as_slice() else {
        panic!("expected a failure, got {ev:?}");
    };
    assert!(reason.contains("decrypt error"), "{reason}");
    assert!(matches!(
        events(&mut s).as_slice(),
        [DtlsEvent::HandshakeFailed { .. }]
    ));
}

#[test]
fn unknown_identity_is_named() {
    let mut s = server(DtlsConfig::default());
    let mut c = client("mallory", "secretPSK", DtlsConfig::default());
    c.encrypt(Instant::now(), addr(SERVER), b"x");
    pump(&mut c, &mut s);
    let ev = events(&mut c);
    let [DtlsEvent::HandshakeFailed { reason, .. }] = ev.as_slice() else {
        panic!("expected a failure, got {ev:?}");
    };
    assert!(reason.contains("unknown psk identity"), "{reason}");
    assert_eq!(s.session_count(), 0);
}

#[test]
fn client_hello_flood_keeps_no_state() {
    let mut s = server(DtlsConfig::default());
    let mut c = client("alice", "secretPSK", DtlsConfig::default());
    c.encrypt(Instant::now(), addr(SERVER), b"x");
    let hello = c.poll_transmit().unwrap().bytes;
    assert!(is_client_hello(&hello));
    for port in 1000..3000u16 {
        let out = s.handle_datagram(Instant::now(), addr(port), &hello);
        assert!(out.is_empty());
    }
    assert_eq!(s.session_count(), 0, "no per-peer state before the cookie");
    assert_eq!(s.stats().hello_verify_sent, 2000);
    let hvr: Vec<_> = std::iter::from_fn(|| s.poll_transmit()).collect();
    assert_eq!(hvr.len(), 2000);
    // Garbage is dropped without state or answer.
    s.handle_datagram(Instant::now(), addr(7), &[22; 40]);
    s.handle_datagram(Instant::now(), addr(7), &[0; 5]);
    assert_eq!(s.session_count(), 0);
    assert!(s.poll_transmit().is_none());
    // The real client completes the cookie round trip: one session.
    c.handle_timeout(Instant::now());
    let mut c2 = client("alice", "secretPSK", DtlsConfig::default());
    c2.encrypt(Instant::now(), addr(SERVER), b"hello");
    let (at_server, _) = pump(&mut c2, &mut s);
    assert_eq!(at_server, vec![b"hello".to_vec()]);
    assert_eq!(s.session_count(), 1);
}

#[test]
fn a_cookie_from_another_address_is_refused() {
    let mut s = server(DtlsConfig::default());
    let mut c = client("alice", "secretPSK", DtlsConfig::default());
    c.encrypt(Instant::now(), addr(SERVER), b"x");
    let hello = c.poll_transmit().unwrap().bytes;
    let hvr = s.handle_datagram(Instant::now(), addr(CLIENT), &hello);
    assert!(hvr.is_empty());
    let hvr = s.poll_transmit().unwrap().bytes;
    c.handle_datagram(Instant::now(), addr(SERVER), &hvr);
    let hello2 = c.poll_transmit().unwrap().bytes;
    // The cookie was made for CLIENT; from another port it starts over.
    s.handle_datagram(Instant::now(), addr(CLIENT + 1), &hello2);
    assert_eq!(s.session_count(), 0);
    s.handle_datagram(Instant::now(), addr(CLIENT), &hello2);
    assert_eq!(s.session_count(), 1);
}

fn at(ip: [u8; 4], port: u16) -> SocketAddr {
    SocketAddr::from((ip, port))
}

/// Takes a handshake from `from` as far as a flood does: a ClientHello, the cookie
/// sent back, the server's flight never answered.
fn half_open(s: &mut OpensslDtls, from: SocketAddr, now: Instant) {
    let mut c = client("alice", "secretPSK", DtlsConfig::default());
    c.connect(now, addr(SERVER));
    let hello = c.poll_transmit().unwrap().bytes;
    s.handle_datagram(now, from, &hello);
    let hvr = s.poll_transmit().expect("a HelloVerifyRequest").bytes;
    c.handle_datagram(now, addr(SERVER), &hvr);
    let hello2 = c.poll_transmit().unwrap().bytes;
    s.handle_datagram(now, from, &hello2);
    while s.poll_transmit().is_some() {}
}

/// A PSK client at `from` sends `data` at `now` (handshaking first if needed);
/// returns what the server decrypted.
fn send_from(
    c: &mut OpensslDtls,
    s: &mut OpensslDtls,
    from: SocketAddr,
    now: Instant,
    data: &[u8],
) -> Vec<Vec<u8>> {
    c.encrypt(now, addr(SERVER), data);
    pump_at(c, s, from, now).0
}

#[test]
fn half_open_flood_never_displaces_established_sessions() {
    let config = DtlsConfig {
        max_handshakes: 8,
        max_handshakes_per_ip: 4,
        ..DtlsConfig::default()
    };
    let mut s = server(config.clone());
    let t0 = Instant::now();
    let mut legit = client("alice", "secretPSK", DtlsConfig::default());
    assert_eq!(
        send_from(&mut legit, &mut s, addr(CLIENT), t0, b"before"),
        [b"before"]
    );
    // 100 half-open handshakes from one address: it keeps its budget, no more.
    for port in 0..100 {
        half_open(&mut s, at([127, 0, 0, 2], 20_000 + port), t0);
    }
    assert_eq!(s.stats().handshaking, 4);
    // 200 more from 50 addresses: the table keeps its budget, no address more than 4.
    for i in 0..200u16 {
        half_open(&mut s, at([127, 0, 1, (i % 50) as u8], 20_000 + i), t0);
    }
    let st = s.stats();
    assert_eq!((st.handshaking, st.sessions), (8, 1));
    assert_eq!(st.handshakes_displaced, 300 - 8);
    assert!(s.handshakes_per_ip.busiest().is_some_and(|(_, n)| n <= 4));
    // The established session was never touched and carries data both ways.
    assert_eq!(
        send_from(&mut legit, &mut s, addr(CLIENT), t0, b"during"),
        [b"during"]
    );
    s.encrypt(t0, addr(CLIENT), b"answer");
    assert_eq!(pump_at(&mut legit, &mut s, addr(CLIENT), t0).1, [b"answer"]);
    // A new client (another address) completes its handshake during the flood.
    let mut newcomer = client("alice", "secretPSK", DtlsConfig::default());
    let from = at([127, 0, 0, 9], 30_000);
    assert_eq!(send_from(&mut newcomer, &mut s, from, t0, b"new"), [b"new"]);
    assert_eq!(s.stats().sessions, 2);
    // The half-open handshakes expire and give their places back.
    s.handle_timeout(t0 + config.handshake_timeout);
    assert_eq!((s.stats().handshaking, s.stats().sessions), (0, 2));
    assert!(s.handshakes_per_ip.is_empty());
    assert!(events(&mut legit)
        .iter()
        .all(|e| matches!(e, DtlsEvent::Connected { .. })));
}

#[test]
fn a_new_client_hello_replaces_a_half_open_handshake() {
    let mut s = server(DtlsConfig::default());
    let t0 = Instant::now();
    half_open(&mut s, addr(CLIENT), t0);
    assert_eq!(s.stats().handshaking, 1);
    // The client restarted (same address, a new ClientHello): served at once instead
    // of waiting for the abandoned handshake to time out (RFC 6347 §4.2.8).
    let mut c = client("alice", "secretPSK", DtlsConfig::default());
    let got = send_from(&mut c, &mut s, addr(CLIENT), t0, b"after restart");
    assert_eq!(got, [b"after restart"]);
    let st = s.stats();
    assert_eq!(
        (st.sessions, st.handshaking, st.handshakes_displaced),
        (1, 0, 1)
    );

    // A retransmitted ClientHello (same random) continues the handshake instead.
    let mut s = server(DtlsConfig::default());
    let mut c = client("alice", "secretPSK", DtlsConfig::default());
    c.encrypt(t0, addr(SERVER), b"once");
    let hello = c.poll_transmit().unwrap().bytes;
    s.handle_datagram(t0, addr(CLIENT), &hello);
    let hvr = s.poll_transmit().unwrap().bytes;
    c.handle_datagram(t0, addr(SERVER), &hvr);
    let hello2 = c.poll_transmit().unwrap().bytes;
    s.handle_datagram(t0, addr(CLIENT), &hello2);
    s.handle_datagram(t0, addr(CLIENT), &hello2);
    assert_eq!(s.stats().handshakes_displaced, 0);
    assert_eq!(pump_at(&mut c, &mut s, addr(CLIENT), t0).0, [b"once"]);
    // A late duplicate of it after the handshake is dropped: the session goes on.
    s.handle_datagram(t0, addr(CLIENT), &hello2);
    assert!(s.poll_transmit().is_none());
    assert_eq!(
        send_from(&mut c, &mut s, addr(CLIENT), t0, b"still"),
        [b"still"]
    );
    assert_eq!(
        (s.stats().handshakes, s.stats().handshakes_displaced),
        (1, 0)
    );
    assert!(events(&mut c)
        .iter()
        .all(|e| matches!(e, DtlsEvent::Connected { .. })));
}

#[test]
fn a_full_table_refuses_newcomers_until_a_session_is_stale() {
    let config = DtlsConfig {
        max_sessions: 2,
        stale_after: Duration::from_secs(60),
        ..DtlsConfig::default()
    };
    let mut s = server(config);
    let t0 = Instant::now();
    let mut first = client("alice", "secretPSK", DtlsConfig::default());
    let mut second = client("alice", "secretPSK", DtlsConfig::default());
    assert_eq!(
        send_from(&mut first, &mut s, addr(CLIENT), t0, b"1").len(),
        1
    );
    assert_eq!(
        send_from(&mut second, &mut s, addr(CLIENT + 1), t0, b"2").len(),
        1
    );
    // Both are active: a third is refused with an alert, nobody is evicted.
    let t1 = t0 + Duration::from_secs(1);
    let mut third = client("alice", "secretPSK", DtlsConfig::default());
    assert!(send_from(&mut third, &mut s, addr(CLIENT + 2), t1, b"3").is_empty());
    let st = s.stats();
    assert_eq!((st.sessions, st.refused, st.evicted), (2, 1, 0));
    let ev = events(&mut third);
    let [DtlsEvent::HandshakeFailed { reason, .. }] = ev.as_slice() else {
        panic!("expected a failure, got {ev:?}");
    };
    assert!(reason.contains("refused a new session"), "{reason}");
    // The first keeps talking, the second falls silent past stale_after: a newcomer
    // takes the silent one's place.
    let t2 = t0 + Duration::from_secs(30);
    assert_eq!(
        send_from(&mut first, &mut s, addr(CLIENT), t2, b"1").len(),
        1
    );
    let t3 = t0 + Duration::from_secs(61);
    let mut fourth = client("alice", "secretPSK", DtlsConfig::default());
    assert_eq!(
        send_from(&mut fourth, &mut s, addr(CLIENT + 3), t3, b"4"),
        [b"4"]
    );
    assert_eq!(s.stats().evicted, 1);
    assert!(s.cipher(addr(CLIENT)).is_some(), "the active one stays");
    assert!(s.cipher(addr(CLIENT + 1)).is_none(), "the stale one went");
}

#[test]
fn anonymous_sessions_give_way_to_authenticated_ones() {
    // A certificate without a CA: clients need no credential (anonymous); PSK
    // clients authenticate.
    let pki = TestCredentials::generate("Cobalt test CA");
    let server_creds = X509Credentials {
        ca_pem: None,
        ..pki.server.clone()
    };
    let keys = Arc::new(PskStore::new().with("alice", "secretPSK"));
    let config = DtlsConfig {
        max_sessions: 2,
        ..DtlsConfig::default()
    };
    let mut s = OpensslDtls::server_with(Some(keys), Some(&server_creds), config).unwrap();
    let anonymous = || {
        let creds = X509Credentials {
            ca_pem: Some(pki.ca_pem.clone()),
            ..X509Credentials::default()
        };
        OpensslDtls::client_with(&ClientCredentials::X509(creds), DtlsConfig::default()).unwrap()
    };
    let t0 = Instant::now();
    let mut psk = client("alice", "secretPSK", DtlsConfig::default());
    assert_eq!(
        send_from(&mut psk, &mut s, addr(CLIENT), t0, b"psk").len(),
        1
    );
    let mut anon = anonymous();
    assert_eq!(
        send_from(&mut anon, &mut s, addr(CLIENT + 1), t0, b"anon").len(),
        1
    );
    // Another anonymous client may not push anyone out...
    let mut anon2 = anonymous();
    assert!(send_from(&mut anon2, &mut s, addr(CLIENT + 2), t0, b"anon2").is_empty());
    assert_eq!(s.stats().refused, 1);
    // ...an authenticated one takes the anonymous one's place, never the PSK peer's.
    let mut psk2 = client("alice", "secretPSK", DtlsConfig::default());
    assert_eq!(
        send_from(&mut psk2, &mut s, addr(CLIENT + 3), t0, b"psk2").len(),
        1
    );
    assert!(s.cipher(addr(CLIENT)).is_some());
    assert!(s.cipher(addr(CLIENT + 1)).is_none());
    assert!(s.cipher(addr(CLIENT + 3)).is_some());
    // Two authenticated, active peers: a third authenticated one is refused.
    let mut psk3 = client("alice", "secretPSK", DtlsConfig::default());
    assert!(send_from(&mut psk3, &mut s, addr(CLIENT + 4), t0, b"psk3").is_empty());
    assert_eq!((s.stats().sessions, s.stats().refused), (2, 2));
}

#[test]
fn a_client_handshakes_again_when_the_server_lost_the_session() {
    let mut c = client("alice", "secretPSK", DtlsConfig::default());
    let mut s = server(DtlsConfig::default());
    let t0 = Instant::now();
    assert_eq!(
        send_from(&mut c, &mut s, addr(CLIENT), t0, b"hello"),
        [b"hello"]
    );
    // Datagrams that expect no answer (ACKs), then silence: no new handshake.
    for ack in [&b"ack 1"[..], b"ack 2", b"ack 3"] {
        assert_eq!(send_from(&mut c, &mut s, addr(CLIENT), t0, ack).len(), 1);
    }
    let t1 = t0 + Duration::from_secs(60);
    assert_eq!(
        send_from(&mut c, &mut s, addr(CLIENT), t1, b"req 1"),
        [b"req 1"]
    );
    s.encrypt(t1, addr(CLIENT), b"answer 1");
    pump_at(&mut c, &mut s, addr(CLIENT), t1);
    assert_eq!(s.stats().handshakes, 1);
    // The server restarts: the request gets no answer...
    let mut s = server(DtlsConfig::default());
    let t2 = t1 + Duration::from_secs(10);
    assert!(send_from(&mut c, &mut s, addr(CLIENT), t2, b"req 2").is_empty());
    // ...its first retransmission goes over a new handshake.
    let t3 = t2 + Duration::from_secs(3);
    assert_eq!(
        send_from(&mut c, &mut s, addr(CLIENT), t3, b"req 2"),
        [b"req 2"]
    );
    assert_eq!(s.stats().handshakes, 1);
    let ev = events(&mut c);
    assert!(
        matches!(ev.last(), Some(DtlsEvent::Connected { .. })),
        "{ev:?}"
    );
    assert!(
        ev.iter().any(
            |e| matches!(e, DtlsEvent::Closed { reason, .. } if reason.contains("lost the session"))
        ),
        "{ev:?}"
    );
}

#[test]
fn handshake_to_nowhere_retransmits_then_fails() {
    let config = DtlsConfig {
        handshake_timeout: Duration::from_millis(1500),
        ..DtlsConfig::default()
    };
    let mut c = client("alice", "secretPSK", config);
    let start = Instant::now();
    c.encrypt(start, addr(SERVER), b"x");
    assert!(c.poll_transmit().is_some());
    let first = c.poll_timeout().unwrap();
    assert!(first > start && first <= start + Duration::from_millis(1500));
    let mut sent = 0;
    while c.session_count() > 0 {
        let Some(at) = c.poll_timeout() else { break };
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        c.handle_timeout(Instant::now());
        sent += std::iter::from_fn(|| c.poll_transmit()).count();
    }
    assert!(sent >= 1, "the ClientHello was retransmitted");
    let ev = events(&mut c);
    let [DtlsEvent::HandshakeFailed { reason, .. }] = ev.as_slice() else {
        panic!("expected a failure, got {ev:?}");
    };
    assert!(reason.contains("handshake"), "{reason}");
}

fn x509_pair(
    server_creds: &X509Credentials,
    client_creds: &X509Credentials,
    cipher: &str,
) -> (OpensslDtls, OpensslDtls) {
    let s = OpensslDtls::server_with(None, Some(server_creds), DtlsConfig::default()).unwrap();
    let config = DtlsConfig {
        ciphers: cipher.into(),
        ..DtlsConfig::default()
    };
    let c =
        OpensslDtls::client_with(&ClientCredentials::X509(client_creds.clone()), config).unwrap();
    (s, c)
}

#[test]
fn certificates_with_a_ca_both_suites() {
    let pki = TestCredentials::generate("Cobalt test CA");
    for cipher in ["ECDHE-ECDSA-AES128-CCM8", "ECDHE-ECDSA-AES128-GCM-SHA256"] {
        let (mut s, mut c) = x509_pair(&pki.server, &pki.client, cipher);
        c.encrypt(Instant::now(), addr(SERVER), b"over x509");
        let (at_server, _) = pump(&mut c, &mut s);
        assert_eq!(at_server, vec![b"over x509".to_vec()], "{cipher}");
        assert_eq!(c.cipher(addr(SERVER)), Some(cipher));
    }
    // A server name that is in the certificate.
    let mut named = pki.client.clone();
    named.server_name = Some("localhost".into());
    let (mut s, mut c) = x509_pair(&pki.server, &named, "ECDHE-ECDSA-AES128-CCM8");
    c.encrypt(Instant::now(), addr(SERVER), b"x");
    assert_eq!(pump(&mut c, &mut s).0.len(), 1);
}

#[test]
fn certificate_failures_are_explained() {
    let pki = TestCredentials::generate("Cobalt test CA");
    let other = TestCredentials::generate("Another CA");
    // The client does not trust the server's CA.
    let (mut s, mut c) = x509_pair(&pki.server, &other.client, "ECDHE-ECDSA-AES128-CCM8");
    c.encrypt(Instant::now(), addr(SERVER), b"x");
    pump(&mut c, &mut s);
    let ev = events(&mut c);
    let [DtlsEvent::HandshakeFailed { reason, .. }] = ev.as_slice() else {
        panic!("expected a failure, got {ev:?}");
    };
    assert!(reason.contains("certificate verify failed"), "{reason}");
    // The server's certificate has expired.
    let expired = TestCredentials::generate_expired("Old CA");
    let (mut s, mut c) = x509_pair(&expired.server, &expired.client, "ECDHE-ECDSA-AES128-CCM8");
    c.encrypt(Instant::now(), addr(SERVER), b"x");
    pump(&mut c, &mut s);
    let ev = events(&mut c);
    let [DtlsEvent::HandshakeFailed { reason, .. }] = ev.as_slice() else {
        panic!("expected a failure with an expired certificate, got {ev:?}");
    };
    assert!(reason.contains("certificate verify failed"), "{reason}");
    // The server's certificate does not name this host.
    let mut named = pki.client.clone();
    named.server_name = Some("coap.example.org".into());
    let (mut s, mut c) = x509_pair(&pki.server, &named, "ECDHE-ECDSA-AES128-CCM8");
    c.encrypt(Instant::now(), addr(SERVER), b"x");
    pump(&mut c, &mut s);
    assert!(matches!(
        events(&mut c).as_slice(),
        [DtlsEvent::HandshakeFailed { .. }]
    ));
    // No client certificate, but the server requires one.
    let anonymous = X509Credentials {
        ca_pem: Some(pki.ca_pem.clone()),
        ..X509Credentials::default()
    };
    let (mut s, mut c) = x509_pair(&pki.server, &anonymous, "ECDHE-ECDSA-AES128-CCM8");
    c.encrypt(Instant::now(), addr(SERVER), b"x");
    pump(&mut c, &mut s);
    assert_eq!(s.session_count(), 0);
    assert!(matches!(
        events(&mut s).as_slice(),
        [DtlsEvent::HandshakeFailed { .. }]
    ));
}

#[test]
fn garbage_never_panics_nor_keeps_state() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut s = server(DtlsConfig::default());
    let mut c = client("alice", "secretPSK", DtlsConfig::default());
    c.encrypt(Instant::now(), addr(SERVER), b"x");
    pump(&mut c, &mut s);
    assert_eq!(s.session_count(), 1);
    for i in 0..5000u32 {
        let len = rng.random_range(0..200);
        let mut d: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        if i % 2 == 0 && d.len() > 13 {
            // Look like a DTLS 1.2 record of a plausible type.
            d[0] = 20 + (i % 4) as u8;
            d[1] = 0xfe;
            d[2] = 0xfd;
        }
        let port = if i % 3 == 0 {
            CLIENT
        } else {
            1000 + (i % 500) as u16
        };
        assert!(s.handle_datagram(Instant::now(), addr(port), &d).is_empty());
        assert!(c
            .handle_datagram(Instant::now(), addr(SERVER), &d)
            .is_empty());
    }
    assert_eq!(s.session_count(), 1, "only the real session");
    // It still works.
    c.encrypt(Instant::now(), addr(SERVER), b"still here");
    let (at_server, _) = pump(&mut c, &mut s);
    assert_eq!(at_server, vec![b"still here".to_vec()]);
}

#[test]
fn idle_sessions_are_dropped_after_the_idle_timeout() {
    let config = DtlsConfig {
        idle_timeout: Duration::from_secs(60),
        ..DtlsConfig::default()
    };
    let mut s = server(config);
    let mut c = client("alice", "secretPSK", DtlsConfig::default());
    c.encrypt(Instant::now(), addr(SERVER), b"hello");
    let (at_server, _) = pump(&mut c, &mut s);
    assert_eq!(at_server, vec![b"hello".to_vec()]);
    assert_eq!(s.session_count(), 1);
    let now = Instant::now();
    s.handle_timeout(now);
    assert_eq!(s.session_count(), 1, "not idle yet");
    let later = now + Duration::from_secs(61);
    assert!(
        s.poll_timeout().is_some_and(|t| t <= later),
        "a sweep is scheduled"
    );
    s.handle_timeout(later);
    assert_eq!(s.session_count(), 0, "idle session dropped");
    assert_eq!(s.stats().evicted, 1);
    assert_eq!(s.poll_timeout(), None, "nothing left to wake up for");
}

#[test]
fn connect_handshakes_without_data_and_only_once() {
    let mut s = server(DtlsConfig::default());
    let mut c = client("alice", "secretPSK", DtlsConfig::default());
    c.connect(Instant::now(), addr(SERVER));
    let (at_server, at_client) = pump(&mut c, &mut s);
    assert!(at_server.is_empty() && at_client.is_empty());
    assert_eq!(
        events(&mut c),
        vec![DtlsEvent::Connected { peer: addr(SERVER) }]
    );
    // A second connect keeps the established session: no new handshake.
    c.connect(Instant::now(), addr(SERVER));
    assert!(c.poll_transmit().is_none());
    c.encrypt(Instant::now(), addr(SERVER), b"after");
    let (at_server, _) = pump(&mut c, &mut s);
    assert_eq!(at_server, vec![b"after".to_vec()]);
    assert_eq!(s.stats().handshakes, 1);
    // A server does not start handshakes.
    s.connect(Instant::now(), addr(41000));
    assert!(s.poll_transmit().is_none());
    assert_eq!(s.session_count(), 1);
}

#[test]
fn a_new_client_at_the_address_of_an_established_session_replaces_it() {
    let mut s = server(DtlsConfig::default());
    let t0 = Instant::now();
    let mut old = client("alice", "secretPSK", DtlsConfig::default());
    assert_eq!(
        send_from(&mut old, &mut s, addr(CLIENT), t0, b"old"),
        [b"old"]
    );
    let mut new = client("alice", "secretPSK", DtlsConfig::default());
    assert_eq!(
        send_from(&mut new, &mut s, addr(CLIENT), t0, b"new"),
        [b"new"]
    );
    assert_eq!((s.stats().sessions, s.stats().handshakes), (1, 2));
}

#[test]
fn tables_give_their_memory_back_when_a_flood_expires() {
    let config = DtlsConfig {
        max_handshakes: 1000,
        max_handshakes_per_ip: 1000,
        ..DtlsConfig::default()
    };
    let mut s = server(config.clone());
    let t0 = Instant::now();
    for i in 0..600u16 {
        half_open(&mut s, at([127, 0, 2, (i % 200) as u8], 20_000 + i), t0);
    }
    assert_eq!(s.stats().handshaking, 600);
    let grown = (s.sessions.capacity(), s.handshaking.capacity());
    s.handle_timeout(t0 + config.handshake_timeout);
    assert_eq!(s.stats().handshaking, 0);
    assert!(s.handshakes_per_ip.is_empty());
    let now = (s.sessions.capacity(), s.handshaking.capacity());
    assert!(
        now.0 < grown.0 && now.0 <= 256,
        "sessions: {grown:?} -> {now:?}"
    );
    assert!(
        now.1 < grown.1 && now.1 <= 256,
        "handshakes: {grown:?} -> {now:?}"
    );
}

#[test]
fn addresses_rotating_inside_one_ipv6_prefix_share_one_handshake_budget() {
    let config = DtlsConfig {
        max_handshakes_per_ip: 4,
        ..DtlsConfig::default()
    };
    let mut s = server(config);
    s.count_ipv6_by(AddressPrefix::SUBNET);
    let t0 = Instant::now();
    let v6 = |s: &str| SocketAddr::new(s.parse().unwrap(), 20_000);
    for host in 1..=4 {
        half_open(&mut s, v6(&format!("2001:db8::{host}")), t0);
    }
    assert_eq!(s.stats().handshaking, 4);
    // The next address of the same /64 takes the place of its prefix's oldest.
    half_open(&mut s, v6("2001:db8::ffff:5"), t0);
    let st = s.stats();
    assert_eq!((st.handshaking, st.handshakes_displaced), (4, 1));
    // The next /64 has its own budget.
    half_open(&mut s, v6("2001:db8:0:1::1"), t0);
    let st = s.stats();
    assert_eq!((st.handshaking, st.handshakes_displaced), (5, 1));
    assert_eq!(s.handshakes_per_ip.get(v6("2001:db8::9").ip()), 4);
}

/// A server with a certificate and no client CA (anonymous clients allowed, PSK
/// clients authenticate), and a maker of anonymous clients that trust it.
fn certificate_server(config: DtlsConfig) -> (OpensslDtls, impl Fn() -> OpensslDtls) {
    let pki = TestCredentials::generate("Cobalt test CA");
    let server_creds = X509Credentials {
        ca_pem: None,
        ..pki.server.clone()
    };
    let keys = Arc::new(PskStore::new().with("alice", "secretPSK"));
    let s = OpensslDtls::server_with(Some(keys), Some(&server_creds), config).unwrap();
    let trust = X509Credentials {
        ca_pem: Some(pki.ca_pem.clone()),
        ..X509Credentials::default()
    };
    let anonymous = move || {
        let creds = ClientCredentials::X509(trust.clone());
        OpensslDtls::client_with(&creds, DtlsConfig::default()).unwrap()
    };
    (s, anonymous)
}

#[test]
fn one_address_holds_its_budget_of_anonymous_sessions_and_no_more() {
    let config = DtlsConfig {
        max_sessions: 100,
        max_sessions_per_ip: 4,
        ..DtlsConfig::default()
    };
    let (mut s, anonymous) = certificate_server(config);
    let t0 = Instant::now();
    // Issue 28's attack, scaled down: one address opens 20 anonymous sessions (each
    // a second after the last) and leaves them idle.
    let mut attacker = Vec::new();
    for i in 0..20u16 {
        let mut c = anonymous();
        let now = t0 + Duration::from_secs(u64::from(i));
        let got = send_from(&mut c, &mut s, at([127, 0, 0, 2], 20_000 + i), now, b"a");
        assert_eq!(got, [b"a"], "session {i} is served");
        attacker.push(c);
    }
    let st = s.stats();
    assert_eq!((st.sessions, st.evicted), (4, 16));
    assert_eq!(s.sessions_per_ip.get(IpAddr::from([127, 0, 0, 2])), 4);
    // The address's newest sessions are those kept: its idlest gave way each time.
    for port in 20_016..20_020 {
        assert!(s.cipher(at([127, 0, 0, 2], port)).is_some(), "{port}");
    }
    // Another address is served beside it.
    let mut legit = anonymous();
    let from = at([127, 0, 0, 9], 30_000);
    assert_eq!(
        send_from(&mut legit, &mut s, from, t0, b"legit"),
        [b"legit"]
    );
    assert_eq!(s.stats().sessions, 5);
}

#[test]
fn a_new_address_takes_the_place_of_the_busiest_address_in_a_full_table() {
    let config = DtlsConfig {
        max_sessions: 7,
        max_sessions_per_ip: 4,
        stale_after: Duration::from_secs(3600),
        ..DtlsConfig::default()
    };
    let (mut s, anonymous) = certificate_server(config);
    let t0 = Instant::now();
    // Two attacker addresses fill the table with idle anonymous sessions: .2 holds
    // four (the first, at t0, heard from least recently), .3 three.
    let mut attackers = Vec::new();
    let mut now = t0;
    for (ip, n) in [([127, 0, 0, 2], 4u16), ([127, 0, 0, 3], 3)] {
        for port in 0..n {
            let mut c = anonymous();
            now += Duration::from_secs(1);
            let got = send_from(&mut c, &mut s, at(ip, 20_000 + port), now, b"a");
            assert_eq!(got.len(), 1);
            attackers.push(c);
        }
    }
    assert_eq!(s.stats().sessions, 7);
    // A legitimate anonymous client from a new address is served: it takes the place
    // of the idlest session of the address holding the most.
    let t1 = t0 + Duration::from_secs(60);
    let mut legit = anonymous();
    let from = at([127, 0, 0, 9], 30_000);
    assert_eq!(
        send_from(&mut legit, &mut s, from, t1, b"legit"),
        [b"legit"]
    );
    assert!(
        s.cipher(at([127, 0, 0, 2], 20_000)).is_none(),
        "the idlest gave way"
    );
    let st = s.stats();
    assert_eq!((st.sessions, st.evicted, st.refused), (7, 1, 0));
    // It goes on carrying data both ways.
    assert_eq!(
        send_from(&mut legit, &mut s, from, t1, b"again"),
        [b"again"]
    );
    s.encrypt(t1, from, b"answer");
    assert_eq!(pump_at(&mut legit, &mut s, from, t1).1, [b"answer"]);
    // More new addresses get in the same way, until every address holds about as
    // many as the others: then nobody is displaced for a newcomer.
    for d in 10..15u8 {
        let mut c = anonymous();
        let from = at([127, 0, 0, d], 30_000);
        let got = send_from(&mut c, &mut s, from, t1, b"new");
        let held = |d: u8| s.sessions_per_ip.get(IpAddr::from([127, 0, 0, d]));
        if d < 14 {
            assert_eq!(got, [b"new"], "127.0.0.{d} served");
        } else {
            assert!(got.is_empty(), "127.0.0.{d} refused");
            assert_eq!((held(2), held(3)), (1, 1), "the attackers kept one each");
        }
    }
    let st = s.stats();
    assert_eq!((st.sessions, st.evicted, st.refused), (7, 5, 1));
    assert!(
        s.cipher(from).is_some(),
        "the first legitimate client stays"
    );
}

#[test]
fn an_anonymous_newcomer_never_displaces_authenticated_sessions() {
    let config = DtlsConfig {
        max_sessions: 4,
        max_sessions_per_ip: 4,
        ..DtlsConfig::default()
    };
    let (mut s, anonymous) = certificate_server(config);
    let t0 = Instant::now();
    let mut psk = Vec::new();
    for port in 0..4u16 {
        let mut c = client("alice", "secretPSK", DtlsConfig::default());
        let from = at([127, 0, 0, 5], 20_000 + port);
        assert_eq!(send_from(&mut c, &mut s, from, t0, b"psk").len(), 1);
        psk.push(c);
    }
    // A new address, but every session of the busiest address authenticated.
    let mut anon = anonymous();
    let from = at([127, 0, 0, 9], 30_000);
    assert!(send_from(&mut anon, &mut s, from, t0, b"anon").is_empty());
    let st = s.stats();
    assert_eq!((st.sessions, st.refused, st.evicted), (4, 1, 0));
    // Nor does an authenticated newcomer: none of them is anonymous or stale.
    let mut newcomer = client("alice", "secretPSK", DtlsConfig::default());
    assert!(send_from(&mut newcomer, &mut s, from, t0, b"psk").is_empty());
}

#[test]
fn the_per_address_session_budget_is_split_between_shards() {
    let config = DtlsConfig {
        max_sessions_per_ip: 256,
        ..DtlsConfig::default()
    };
    assert_eq!(config.for_shard(1).max_sessions_per_ip, 256);
    assert_eq!(config.for_shard(2).max_sessions_per_ip, 128);
    assert_eq!(config.for_shard(3).max_sessions_per_ip, 86);
    assert_eq!(
        config.for_shard(1000).max_sessions_per_ip,
        1,
        "at least one"
    );
    assert_eq!(config.for_shard(0).max_sessions_per_ip, 256);
    assert_eq!(config.for_shard(2).max_sessions, config.max_sessions);
}

#[test]
fn sessions_never_used_are_dropped_after_the_unused_timeout() {
    let config = DtlsConfig {
        unused_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(3600),
        ..DtlsConfig::default()
    };
    let mut s = server(config);
    let t0 = Instant::now();
    // One client handshakes and says nothing; another sends a CoAP message.
    let mut silent = client("alice", "secretPSK", DtlsConfig::default());
    silent.connect(t0, addr(SERVER));
    pump_at(&mut silent, &mut s, addr(CLIENT), t0);
    let mut talker = client("alice", "secretPSK", DtlsConfig::default());
    assert_eq!(
        send_from(&mut talker, &mut s, addr(CLIENT + 1), t0, b"hi").len(),
        1
    );
    assert_eq!(s.stats().sessions, 2);
    s.handle_timeout(t0 + Duration::from_secs(30));
    assert_eq!(s.stats().sessions, 2, "not silent for long enough yet");
    let later = t0 + Duration::from_secs(61);
    assert!(
        s.poll_timeout().is_some_and(|t| t <= later),
        "a sweep is due within the unused timeout"
    );
    s.handle_timeout(later);
    assert!(s.cipher(addr(CLIENT)).is_none(), "the unused session went");
    assert!(s.cipher(addr(CLIENT + 1)).is_some(), "the used one stays");
    assert_eq!(s.stats().evicted, 1);
}

// Not bound by openssl-sys (OpenSSL 1.1.1+).
extern "C" {
    fn DTLS_set_timer_cb(
        s: *mut openssl_sys::SSL,
        cb: Option<unsafe extern "C" fn(*mut openssl_sys::SSL, libc::c_uint) -> libc::c_uint>,
    );
}

thread_local! {
    static TIMERS_STARTED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// OpenSSL's retransmission timer (it runs on the wall clock, inside `SSL_do_handshake`)
/// set to 1 µs for the first flight and to the usual second after: the ClientHello is
/// sent again at the client's next read, as after a second without an answer.
unsafe extern "C" fn first_flight_times_out_at_once(
    _: *mut openssl_sys::SSL,
    _previous_us: libc::c_uint,
) -> libc::c_uint {
    match TIMERS_STARTED.with(|n| n.replace(n.get() + 1)) {
        0 => 1,
        _ => 1_000_000,
    }
}

#[test]
fn a_server_hello_after_a_repeated_client_hello_is_not_taken_for_a_replay() {
    let (mut s, anonymous) = certificate_server(DtlsConfig::default());
    let now = Instant::now();
    let from = at([127, 0, 0, 2], 20_000);
    let mut c = anonymous();
    // What `encrypt` does for a new peer, with the timer set before the first flight.
    TIMERS_STARTED.with(|n| n.set(0));
    let stream = c.new_stream(Some(addr(SERVER))).unwrap();
    // SAFETY: a live SSL, and a callback of the signature OpenSSL expects.
    unsafe { DTLS_set_timer_cb(stream.ssl().as_ptr(), Some(first_flight_times_out_at_once)) };
    c.open_session(now, addr(SERVER), stream);
    c.sessions
        .get_mut(&addr(SERVER))
        .unwrap()
        .pending
        .push(b"a", 1);
    c.advance(now, addr(SERVER), None);
    // The client reads the HelloVerifyRequest after its timer ran out: it sends its
    // first ClientHello again (record 1), then the one with the cookie (record 2); the
    // server answers the copy with a second HelloVerifyRequest (record 1).
    let (at_server, _) = pump_at(&mut c, &mut s, from, now);
    assert_eq!(
        s.stats().hello_verify_sent,
        2,
        "the ClientHello was sent again"
    );
    assert_eq!(
        at_server,
        [b"a"],
        "served without waiting for a retransmission"
    );
    assert_eq!(
        events(&mut c),
        vec![DtlsEvent::Connected { peer: addr(SERVER) }]
    );
}

#[test]
fn epoch_0_record_numbers_are_shifted_and_protected_ones_left_alone() {
    let record = |epoch: u8, seq: u8, body: &[u8]| {
        let mut r = vec![
            22,
            0xfe,
            0xfd,
            0,
            epoch,
            0,
            0,
            0,
            0,
            0,
            seq,
            0,
            body.len() as u8,
        ];
        r.extend_from_slice(body);
        r
    };
    let mut datagram = [
        record(0, 1, b"hello"),
        record(1, 1, b"x"),
        record(0, 2, b""),
    ]
    .concat();
    shift_epoch0_seqs(&mut datagram, 4);
    let expected = [
        record(0, 5, b"hello"),
        record(1, 1, b"x"),
        record(0, 6, b""),
    ]
    .concat();
    assert_eq!(datagram, expected);
    assert_eq!(record_seq(&expected), Some(5));
    // A number past the largest is left as it is; a truncated header is not read.
    let mut last = record(0, 1, b"");
    last[5..11].copy_from_slice(&MAX_RECORD_SEQ.to_be_bytes()[2..]);
    let mut shifted = last.clone();
    shift_epoch0_seqs(&mut shifted, 1);
    assert_eq!(shifted, last);
    let mut short = vec![22, 0xfe, 0xfd, 0, 0, 0, 0];
    shift_epoch0_seqs(&mut short, 1);
    assert_eq!(short, [22, 0xfe, 0xfd, 0, 0, 0, 0]);
}

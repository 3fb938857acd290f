//! The endpoint under attack, each time with a legitimate peer beside the attacker:
//! - amplification: for every response path, what an unverified address is sent stays
//!   within three times what was sent from it, while an honest client that answers the
//!   verification ping gets everything in full after one extra round trip;
//! - floods of requests in progress: the flooding peer (or address) is refused with
//!   4.29, at the total bound only busy addresses get 5.03, others are served;
//! - deduplication at full rate: memory bounded per peer and in bytes, nobody refused,
//!   and a legitimate peer's duplicates still recognised.

use super::*;
use crate::message::{codec, opt, Code, Message, MessageType};

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A request as an attacker would forge it: small, with a token.
fn request(code: Code, mtype: MessageType, mid: u16, path: &str) -> Message {
    let mut m = Message::new(mtype, code, mid);
    m.token = Token::new(&mid.to_be_bytes()).unwrap();
    m.options.set_uri_path(path);
    m
}

fn content(len: usize) -> Message {
    let mut m = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
    m.payload = vec![b'x'; len];
    m
}

/// Bytes exchanged with one address, as the network sees them.
#[derive(Default, Debug)]
struct Ledger {
    to_server: usize,
    from_server: usize,
}

struct Bench {
    now: Instant,
    server: Endpoint,
    ledger: HashMap<SocketAddr, Ledger>,
}

impl Bench {
    fn new(config: EndpointConfig) -> Bench {
        let now = Instant::now();
        Bench {
            now,
            server: Endpoint::with_seed(config, now, 7),
            ledger: HashMap::new(),
        }
    }

    fn send(&mut self, from: SocketAddr, m: &Message) {
        let bytes = codec::encode(m);
        self.ledger.entry(from).or_default().to_server += bytes.len();
        self.server.handle_datagram(self.now, from, &bytes);
    }

    /// What the server sent, per destination, accounted in the ledger.
    fn drain(&mut self) -> Vec<(SocketAddr, Message)> {
        let mut out = Vec::new();
        while let Some(t) = self.server.poll_transmit() {
            self.ledger.entry(t.peer).or_default().from_server += t.bytes.len();
            out.push((t.peer, codec::decode(&t.bytes).unwrap()));
        }
        out
    }

    fn advance(&mut self, d: Duration) {
        let until = self.now + d;
        while let Some(at) = self.server.poll_timeout().filter(|at| *at <= until) {
            self.now = at.max(self.now);
            self.server.handle_timeout(self.now);
        }
        self.now = until;
        self.server.handle_timeout(self.now);
    }

    /// Answers every request event with `answer(request)`.
    fn serve(&mut self, answer: impl Fn(&Message) -> Message) -> usize {
        let mut n = 0;
        while let Some(ev) = self.server.poll_event() {
            if let Event::Request { id, request, .. } = ev {
                n += 1;
                let resp = answer(&request);
                self.server.respond(self.now, id, resp).unwrap();
            }
        }
        n
    }

    fn ratio(&self, peer: SocketAddr) -> f64 {
        let l = &self.ledger[&peer];
        l.from_server as f64 / l.to_server as f64
    }
}

/// The victim never answers anything: every path must stay within 3×.
#[test]
fn an_unverified_address_never_gets_more_than_three_times_what_it_sent() {
    let victim = addr("192.0.2.1:5683");
    let mut b = Bench::new(EndpointConfig::default());
    let mut mid = 0u16;
    let mut next = || {
        mid += 1;
        mid
    };
    // 1. A large answer to a small CON GET (piggybacked path).
    b.send(
        victim,
        &request(Code::GET, MessageType::Confirmable, next(), "large"),
    );
    b.serve(|_| content(1024));
    // 2. The same as NON.
    b.send(
        victim,
        &request(Code::GET, MessageType::NonConfirmable, next(), "large"),
    );
    b.serve(|_| content(1024));
    // 3. A non-safe request with a large answer.
    b.send(
        victim,
        &request(Code::POST, MessageType::Confirmable, next(), "large-post"),
    );
    b.serve(|_| content(600));
    // 4. An error answer with a long diagnostic payload (bad critical option).
    let mut bad = request(Code::GET, MessageType::Confirmable, next(), "x");
    bad.options.push(9, vec![1]);
    b.send(victim, &bad);
    // 5. An application error with a diagnostic payload (e.g. 4.08 from an upload).
    b.send(
        victim,
        &request(Code::PUT, MessageType::Confirmable, next(), "upload"),
    );
    b.serve(|_| {
        let mut m = Message::new(
            MessageType::Acknowledgement,
            Code::REQUEST_ENTITY_INCOMPLETE,
            0,
        );
        m.payload = b"no upload in progress for this block; start with block 0".to_vec();
        m
    });
    // 6. An observe registration with a small answer, then notifications.
    let mut reg = request(Code::GET, MessageType::NonConfirmable, next(), "state");
    reg.options.set_uint(opt::OBSERVE, 0);
    let reg_token = reg.token.clone();
    b.send(victim, &reg);
    b.serve(|_| content(20));
    for i in 0..50 {
        let mut n = content(200);
        n.options.set_uint(opt::OBSERVE, i);
        b.server
            .notify(b.now, victim, reg_token.clone(), n, i % 5 == 0, None);
    }
    // 7. A slow handler: empty ACK, then a separate confirmable response, retransmitted.
    b.send(
        victim,
        &request(Code::POST, MessageType::Confirmable, next(), "separate"),
    );
    b.advance(Duration::from_secs(2));
    b.serve(|_| content(30));
    // 8. Duplicates of a request whose large answer is stored.
    let dup = request(Code::POST, MessageType::Confirmable, next(), "echo");
    b.send(victim, &dup);
    b.serve(|_| content(40));
    for _ in 0..5 {
        b.send(victim, &dup);
    }
    // Let every timer run out: pings, retransmissions, the fallbacks.
    for _ in 0..100 {
        b.advance(Duration::from_secs(5));
    }
    let sent = b.drain();
    let l = &b.ledger[&victim];
    assert!(
        l.from_server <= 3 * l.to_server,
        "amplification {:.2}: {l:?}",
        b.ratio(victim)
    );
    // Some answers did go out: small ones, 4.01 with Echo for the safe requests, the
    // non-safe answer without its payload.
    let codes: Vec<Code> = sent.iter().map(|(_, m)| m.code).collect();
    assert!(codes.contains(&Code::UNAUTHORIZED), "{codes:?}");
    assert!(
        sent.iter().all(|(_, m)| m.payload.len() <= 60),
        "no large payload"
    );
    let s = b.server.stats();
    assert!(s.probes_failed >= 1 && s.unverified >= 1, "{s:?}");
    assert_eq!(b.server.state_counts().address_probes, 0);
}

/// An honest client answers the ping (RST) and then gets everything in full.
#[test]
fn an_honest_client_pays_one_round_trip_then_gets_full_answers() {
    let client = addr("198.51.100.7:40000");
    let mut b = Bench::new(EndpointConfig::default());
    b.send(
        client,
        &request(Code::GET, MessageType::Confirmable, 1, "large"),
    );
    b.serve(|_| content(1024));
    let out = b.drain();
    // A ping, nothing else yet: the request is not acknowledged while it waits.
    let kinds: Vec<(MessageType, Code)> = out.iter().map(|(_, m)| (m.mtype, m.code)).collect();
    assert_eq!(kinds, [(MessageType::Confirmable, Code::EMPTY)]);
    b.send(client, &Message::reset(out[0].1.mid));
    let out = b.drain();
    assert_eq!(out.len(), 1);
    let (_, resp) = &out[0];
    assert_eq!(
        (resp.mtype, resp.code, resp.mid),
        (MessageType::Acknowledgement, Code::CONTENT, 1),
        "piggybacked after all"
    );
    assert_eq!(resp.payload.len(), 1024, "in full");
    assert_eq!(resp.token, Token::new(&1u16.to_be_bytes()).unwrap());
    // From now on: piggybacked, full size, no ping.
    b.send(
        client,
        &request(Code::GET, MessageType::Confirmable, 2, "large"),
    );
    b.serve(|_| content(1024));
    let out = b.drain();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].1.mtype, MessageType::Acknowledgement);
    assert_eq!(out[0].1.payload.len(), 1024);
    assert_eq!(b.server.stats().addresses_verified, 1);
    // Notifications go straight out too.
    let token = Token::new(&[9]).unwrap();
    b.server
        .notify(b.now, client, token, content(500), false, None);
    assert_eq!(b.drain()[0].1.payload.len(), 500);
}

/// A client far away (its RST arrives after it retransmitted its request) still gets
/// the answer piggybacked: the request is not acknowledged while the answer waits, so
/// that clients that cannot take a block-wise answer as a separate response get it.
#[test]
fn a_slow_verification_still_ends_in_a_piggybacked_answer() {
    let client = addr("198.51.100.6:40000");
    let mut b = Bench::new(EndpointConfig::default());
    let get = request(Code::GET, MessageType::Confirmable, 1, "large");
    b.send(client, &get);
    b.serve(|_| content(1024));
    let ping = b.drain().remove(0).1;
    b.advance(Duration::from_millis(2500));
    // The ping again; a retransmission of the request runs nothing and gets nothing.
    let out = b.drain();
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].1.mtype, out[0].1.mid),
        (MessageType::Confirmable, ping.mid)
    );
    b.send(client, &get);
    assert_eq!(b.serve(|_| content(1024)), 0, "no second handler run");
    assert!(b.drain().is_empty());
    b.send(client, &Message::reset(ping.mid));
    let out = b.drain();
    assert_eq!(out.len(), 1);
    let resp = &out[0].1;
    assert_eq!((resp.mtype, resp.mid), (MessageType::Acknowledgement, 1));
    assert_eq!(resp.payload.len(), 1024);
}

/// A notification produced while the registration's answer waits for verification
/// goes out as that answer: one message with the newer state, not two at once.
#[test]
fn a_registration_answer_waiting_for_verification_carries_the_latest_state() {
    let client = addr("198.51.100.5:40000");
    let mut b = Bench::new(EndpointConfig::default());
    let mut reg = request(Code::GET, MessageType::Confirmable, 1, "obs");
    reg.options.set_uint(opt::OBSERVE, 0);
    b.send(client, &reg);
    b.serve(|_| {
        let mut m = content(5);
        m.options.set_uint(opt::OBSERVE, 2);
        m
    });
    let ping = b.drain().remove(0).1;
    let mut newer = content(7);
    newer.options.set_uint(opt::OBSERVE, 3);
    b.server
        .notify(b.now, client, reg.token.clone(), newer, false, None);
    assert!(b.drain().is_empty(), "nothing before verification");
    b.send(client, &Message::reset(ping.mid));
    let out = b.drain();
    assert_eq!(out.len(), 1, "{out:?}");
    let m = &out[0].1;
    assert_eq!(
        (m.mtype, m.mid, m.token.clone()),
        (MessageType::Acknowledgement, 1, reg.token)
    );
    assert_eq!((m.options.observe(), m.payload.len()), (Some(3), 7));
}

/// A client that does not answer pings but repeats the Echo value of a 4.01 (RFC 9175).
#[test]
fn an_echo_round_trip_verifies_too() {
    let client = addr("198.51.100.8:40000");
    let mut b = Bench::new(EndpointConfig::default());
    b.send(
        client,
        &request(Code::GET, MessageType::Confirmable, 1, "large"),
    );
    b.serve(|_| content(1024));
    // It ignores the pings; after the last one the answer becomes 4.01 with Echo.
    let challenge = (0..20)
        .find_map(|_| {
            b.advance(Duration::from_secs(5));
            b.drain()
                .into_iter()
                .map(|(_, m)| m)
                .find(|m| m.code == Code::UNAUTHORIZED)
        })
        .expect("4.01 with Echo");
    let echo = challenge.options.get(opt::ECHO).expect("Echo").to_vec();
    let mut retry = request(Code::GET, MessageType::Confirmable, 2, "large");
    retry.options.set(opt::ECHO, echo.clone());
    b.send(client, &retry);
    b.serve(|_| content(1024));
    let out = b.drain();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].1.payload.len(), 1024);
    // A forged or foreign Echo verifies nothing.
    let other = addr("198.51.100.9:40000");
    let mut forged = request(Code::GET, MessageType::Confirmable, 3, "large");
    forged.options.set(opt::ECHO, echo);
    b.send(other, &forged);
    b.serve(|_| content(1024));
    let out = b.drain();
    assert!(out.iter().all(|(_, m)| m.payload.is_empty()), "{out:?}");
}

/// Guessing the ping's message ID is cut short.
#[test]
fn a_forger_gets_a_few_guesses_per_ping() {
    let victim = addr("192.0.2.2:5683");
    let mut b = Bench::new(EndpointConfig::default());
    b.send(
        victim,
        &request(Code::GET, MessageType::Confirmable, 1, "large"),
    );
    b.serve(|_| content(1024));
    let ping_mid = b.drain()[0].1.mid;
    for guess in 0..=u16::MAX {
        if guess != ping_mid {
            b.send(victim, &Message::reset(guess));
        }
    }
    b.send(victim, &Message::reset(ping_mid));
    b.advance(Duration::from_secs(1));
    let out = b.drain();
    assert!(
        out.iter().all(|(_, m)| m.payload.is_empty()),
        "never verified"
    );
    assert!(!b.server.is_verified(b.now, victim));
    assert_eq!(b.server.stats().probes_failed, 1);
}

#[test]
fn a_peer_with_too_many_requests_in_progress_gets_4_29_and_others_are_served() {
    let cfg = EndpointConfig {
        max_exchanges_per_peer: 4,
        max_exchanges_per_ip: 8,
        ..Default::default()
    };
    let mut b = Bench::new(cfg);
    let attacker = addr("203.0.113.5:1000");
    // A /separate flood from one port: the handlers never answer within the test.
    for mid in 0..100 {
        b.send(
            attacker,
            &request(Code::GET, MessageType::Confirmable, mid, "separate"),
        );
    }
    // ... and from many ports of the same address.
    for port in 2000..2100 {
        let from = SocketAddr::from(([203, 0, 113, 5], port));
        b.send(
            from,
            &request(Code::GET, MessageType::Confirmable, 1, "separate"),
        );
    }
    let mut held = Vec::new();
    while let Some(Event::Request { id, .. }) = b.server.poll_event() {
        held.push(id);
    }
    assert_eq!(
        held.len(),
        8,
        "four from the port, four more from the address"
    );
    let refused = b.drain();
    assert_eq!(refused.len(), 192);
    assert!(refused
        .iter()
        .all(|(_, m)| m.code == Code::TOO_MANY_REQUESTS
            && m.options.get_uint(opt::MAX_AGE) == Some(2)));
    // A legitimate client is served meanwhile.
    let client = addr("198.51.100.1:5000");
    b.send(
        client,
        &request(Code::GET, MessageType::Confirmable, 1, "benchmark"),
    );
    assert_eq!(b.serve(|_| content(11)), 1);
    assert_eq!(b.drain()[0].1.code, Code::CONTENT);
    assert_eq!(b.server.stats().busy_rejections, 192);
    // Answering the held requests frees the attacker's budget.
    for id in held {
        b.server.respond(b.now, id, content(1)).unwrap();
    }
    b.send(
        attacker,
        &request(Code::GET, MessageType::Confirmable, 500, "separate"),
    );
    assert_eq!(b.serve(|_| content(1)), 1);
}

#[test]
fn at_the_total_bound_newcomers_are_still_served() {
    let cfg = EndpointConfig {
        max_server_exchanges: 64,
        ..Default::default()
    };
    let mut b = Bench::new(cfg);
    // Spread over many addresses, as a botnet would.
    for i in 0..200u16 {
        let from = SocketAddr::from(([203, 0, 113, (i % 50) as u8], 1000 + i));
        b.send(
            from,
            &request(Code::GET, MessageType::Confirmable, i, "separate"),
        );
    }
    let mut held = 0;
    while let Some(Event::Request { .. }) = b.server.poll_event() {
        held += 1;
    }
    assert!((64..=72).contains(&held), "{held}");
    let refused = b.drain();
    assert!(refused
        .iter()
        .all(|(_, m)| m.code == Code::SERVICE_UNAVAILABLE));
    assert!(b.server.stats().overload_rejections > 100);
    // A client from an address with nothing in progress gets in.
    let client = addr("198.51.100.2:5000");
    b.send(
        client,
        &request(Code::GET, MessageType::Confirmable, 1, "benchmark"),
    );
    assert_eq!(b.serve(|_| content(11)), 1);
}

#[test]
fn deduplication_at_full_rate_stays_bounded_and_refuses_nobody() {
    let cfg = EndpointConfig {
        max_dedup_bytes: 1 << 20,
        ..Default::default()
    };
    let mut b = Bench::new(cfg);
    let honest = addr("198.51.100.3:5000");
    let post = request(Code::POST, MessageType::Confirmable, 42, "echo");
    b.send(honest, &post);
    b.serve(|_| content(10));
    let first = b.drain();
    // 400,000 requests from 1,000 peers, GETs and POSTs, over two minutes.
    let mut served = 0;
    for round in 0..400u32 {
        for p in 0..1000u16 {
            let from = SocketAddr::from(([10, 1, (p / 250) as u8, (p % 250) as u8], 6000));
            let code = if round % 2 == 0 {
                Code::GET
            } else {
                Code::POST
            };
            let mid = round as u16;
            b.send(from, &request(code, MessageType::Confirmable, mid, "x"));
        }
        // Small answers: within what an unverified peer may get, so no verification.
        served += b.serve(|_| content(4));
        b.drain();
        b.now += Duration::from_millis(300);
        if round == 200 {
            // The honest peer's retransmission within its window is still recognised.
            b.send(honest, &post);
            assert_eq!(b.server.poll_event(), None);
            assert_eq!(b.drain(), first);
        }
    }
    assert_eq!(served, 400_000, "nobody refused");
    let counts = b.server.state_counts();
    assert!(counts.dedup_bytes <= 1 << 20, "{counts:?}");
    assert!(counts.dedup_entries <= 8 * 1001, "{counts:?}");
    let s = b.server.stats();
    assert_eq!(s.overload_rejections + s.busy_rejections, 0);
    assert!(s.dedup_evictions > 0);
    // Once the lifetime has passed, everything is gone.
    b.advance(b.server.config().exchange_lifetime() * 2);
    assert_eq!(b.server.state_counts().dedup_entries, 0);
    assert_eq!(b.server.state_counts().dedup_bytes, 0);
}

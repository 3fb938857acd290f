//! The amplification limit (RFC 9175 §2.4) of `cobalt serve`, measured on the wire for
//! every response path: a "victim" socket that sends small requests and never answers
//! anything (as a forged source address would not) receives at most three times the
//! bytes it sent, while an honest client beside it gets full-size answers; and real
//! clients (libcoap, aiocoap) fetch a 4 KiB resource in a handful of round trips.

#[path = "common/binary.rs"]
mod binary;

use binary::{start_cobalt, start_cobalt_with};
use cobalt::proto::message::{encode, opt, BlockValue, Code, Message, MessageType, Token};
use cobalt_test_support::need;
use cobalt_test_support::peers::{aiocoap, libcoap, COMMAND_LIMIT};
use cobalt_test_support::ports::V4;
use cobalt_test_support::process;
use std::net::UdpSocket;
use std::process::Command;
use std::time::{Duration, Instant};

/// A small request with a 4-byte token, as an attacker would forge it.
fn request(code: Code, mtype: MessageType, mid: u16, path: &str) -> Message {
    let mut m = Message::new(mtype, code, mid);
    m.token = Token::new(&u32::from(mid).to_be_bytes()).unwrap();
    m.options.set_uri_path(path);
    m
}

fn block(m: &mut Message, option: u16, num: u32, more: bool, szx: u8) {
    let v = BlockValue::new(num, more, szx).unwrap();
    m.options.set_uint(option, v.encode());
}

/// Every response path of the demo and plugtest resources, as small requests.
fn forged_requests() -> Vec<Message> {
    use MessageType::{Confirmable as Con, NonConfirmable as Non};
    let mut out = Vec::new();
    let mut mid = 100;
    let mut next = |code, mtype, path: &str| {
        mid += 1;
        request(code, mtype, mid, path)
    };
    // Large answers to GET, CON and NON, first block and a later one.
    out.push(next(Code::GET, Con, "large"));
    out.push(next(Code::GET, Non, "large"));
    let mut later = next(Code::GET, Con, "large");
    block(&mut later, opt::BLOCK2, 2, false, 6);
    out.push(later);
    out.push(next(Code::GET, Con, ".well-known/core"));
    // Observe registrations (CON and NON), then a change that notifies them.
    for mtype in [Con, Non] {
        let mut reg = next(Code::GET, mtype, "state");
        reg.options.set_uint(opt::OBSERVE, 0);
        out.push(reg);
    }
    let mut put = next(Code::PUT, Con, "state");
    put.payload = b"x".to_vec();
    out.push(put);
    // An unknown critical option (4.02 with a diagnostic payload).
    let mut bad = next(Code::GET, Con, "benchmark");
    bad.options.push(9, vec![1]);
    out.push(bad);
    // A Block1 block out of order (4.08 with a diagnostic payload).
    let mut stray = next(Code::PUT, Con, "upload");
    block(&mut stray, opt::BLOCK1, 3, true, 4);
    stray.payload = vec![0; 16];
    out.push(stray);
    // A slow handler: empty ACK, then a separate response (retransmitted if not acked).
    let mut slow = next(Code::GET, Con, "separate");
    slow.options.push(opt::URI_QUERY, b"delay=200");
    out.push(slow);
    // A POST and its duplicates.
    let mut post = next(Code::POST, Con, "echo");
    post.payload = b"hi".to_vec();
    out.push(post.clone());
    out.push(post.clone());
    out.push(post);
    out
}

#[test]
fn a_silent_victim_gets_at_most_three_times_what_it_sent_while_an_honest_client_is_served() {
    // Short timers so that the verification gives up within the test.
    let server = start_cobalt_with(V4, &["--set", "endpoint.ack_timeout=100ms"]);
    let victim = UdpSocket::bind("127.0.0.1:0").unwrap();
    victim
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let honest = cobalt::client::blocking::Client::new();
    let mut sent = 0;
    let mut received = 0;
    let mut answers: Vec<Message> = Vec::new();
    let recv = |until: Instant, received: &mut usize, answers: &mut Vec<Message>| {
        let mut buf = [0u8; 2048];
        while Instant::now() < until {
            if let Ok(n) = victim.recv(&mut buf) {
                *received += n;
                if let Ok(m) = cobalt::proto::message::decode(&buf[..n]) {
                    answers.push(m);
                }
            }
        }
    };
    for m in forged_requests() {
        let bytes = encode(&m);
        sent += victim.send_to(&bytes, server.addr).unwrap();
        recv(
            Instant::now() + Duration::from_millis(20),
            &mut received,
            &mut answers,
        );
        // The honest client is served in full meanwhile.
        let r = honest.get(&server.uri("/large")).unwrap();
        assert_eq!((r.code, r.payload.len()), (Code::CONTENT, 4096));
    }
    // Pings (5 with a 100 ms ACK_TIMEOUT: about 3 s), retransmissions, fallbacks.
    recv(
        Instant::now() + Duration::from_secs(5),
        &mut received,
        &mut answers,
    );
    assert!(
        received <= 3 * sent,
        "victim sent {sent} bytes and received {received}: {answers:#?}"
    );
    // It was answered where that fits, and pinged.
    let pings = answers
        .iter()
        .filter(|m| m.mtype == MessageType::Confirmable && m.code == Code::EMPTY)
        .count();
    assert!(pings >= 1, "{answers:#?}");
    assert!(
        answers.iter().all(|m| m.payload.len() <= 64),
        "{answers:#?}"
    );
    assert!(
        answers.iter().any(|m| m.code == Code::UNAUTHORIZED),
        "a safe request's answer became 4.01 with Echo: {answers:#?}"
    );
}

/// libcoap's and aiocoap's clients answer the ping, then get full-size blocks: the
/// 4 KiB resource arrives in four requests and one extra round trip.
#[test]
fn real_clients_fetch_four_kibibytes_in_a_handful_of_round_trips() {
    let server = start_cobalt(V4);
    let libcoap = need!(libcoap::CLIENT, libcoap::tool(libcoap::CLIENT));
    let r = process::run(
        Command::new(&libcoap).args(["-B", "5", "-v", "7", &server.uri("/large")]),
        COMMAND_LIMIT,
    )
    .ok();
    let log = r.stdout.clone() + &r.stderr;
    // Distinct requests: a retransmission (a loaded machine) keeps its message ID.
    let mut mids: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("t:CON c:GET"))
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("i:")))
        .collect();
    mids.dedup();
    let requests = mids.len();
    let pings_answered = log.lines().filter(|l| l.contains("t:RST")).count();
    assert!(log.contains("line 0072:"), "the whole body: {log}");
    assert_eq!(requests, 4, "four 1 KiB blocks: {log}");
    assert!(
        (1..=2).contains(&pings_answered),
        "one verification round trip (its ping maybe retransmitted): {log}"
    );

    let aiocoap = need!("aiocoap-client", aiocoap::client());
    let before = std::time::Instant::now();
    let r = process::run(
        Command::new(&aiocoap).arg(server.uri("/large")),
        COMMAND_LIMIT,
    )
    .ok();
    assert_eq!(r.stdout.trim_end().len(), 4096, "{r:#?}");
    assert!(before.elapsed() < Duration::from_secs(10), "{r:#?}");
}

//! OSCORE interop with Californium's cf-oscore 3.13 (`OscorePeer` in
//! `tests/peers/californium`, built by `scripts/install-test-deps.sh`), both ways, with
//! one context given to both sides: GET, POST, observe and Block2; a wrong key; a
//! replayed request. Skipped when the peer (or its cf-oscore jar) is missing, failed
//! under `COBALT_REQUIRE_PEERS=1`.

use cobalt::proto::message::codec::{decode, encode};
use cobalt::proto::message::{Code, Message, MessageType, Token};
use cobalt::{Client, Scheme};
use cobalt_oscore::{Material, Oscore, SecurityContext, SenderSequence, UriPattern, OSCORE};
use cobalt_test_support::need;
use cobalt_test_support::peers::californium::{self, field, letters, payload_of, Californium};
use cobalt_test_support::peers::require;
use cobalt_test_support::ports::V4;
use std::net::UdpSocket;
use std::time::Duration;

mod common;

const SECRET: &str = "0102030405060708090a0b0c0d0e0f10";
const SALT: &str = "9e7ca92223786340";
/// The server's Sender ID; the client's is empty.
const SERVER_ID: &str = "01";

/// The Californium peer, if it was built with cf-oscore.
fn californium_oscore() -> Option<Californium> {
    let cf = californium::need()?;
    require(
        "Californium peer with cf-oscore (tests/peers/californium rebuilt by scripts/install-test-deps.sh)",
        cf.has_artifact("cf-oscore").then_some(cf),
    )
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// `OscorePeer`'s context arguments for the side whose Sender ID is `sender`.
fn context_args<'a>(secret: &'a str, sender: &'a str, recipient: &'a str) -> Vec<&'a str> {
    vec![
        "--secret",
        secret,
        "--salt",
        SALT,
        "--sender",
        sender,
        "--recipient",
        recipient,
    ]
}

/// The client's side of the context, in memory.
fn client_material() -> Material {
    Material::new(&unhex(SECRET), &[], &unhex(SERVER_ID)).with_salt(&unhex(SALT))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cobalt_client_against_a_californium_oscore_server() {
    let cf = need!("Californium with cf-oscore", californium_oscore());
    let server = cf.program_server("OscorePeer", &context_args(SECRET, SERVER_ID, ""));
    let uri = |p: &str| server.uri(p);
    let context = SecurityContext::new(client_material()).unwrap();
    let client = Client::new().layer(Oscore::new().protect(UriPattern::any(), context));

    let r = client.get(&uri("/hello")).await.unwrap();
    assert_eq!(
        (r.code, r.text_payload().as_str()),
        (Code::CONTENT, "hello from californium")
    );
    let r = client.post(&uri("/echo"), "ping").await.unwrap();
    assert_eq!(
        (r.code, r.payload.as_slice()),
        (Code::CHANGED, &b"ping"[..])
    );
    let r = client.get(&uri("/large")).await.unwrap();
    assert_eq!(r.payload, letters(3000), "Block2 through OSCORE");
    let mut observation = client.observe(&uri("/counter")).await.unwrap();
    let mut counts = Vec::new();
    while counts.len() < 3 {
        let n = tokio::time::timeout(Duration::from_secs(10), observation.next())
            .await
            .expect("a notification within 10 s")
            .unwrap()
            .unwrap();
        counts.push(n.text_payload());
    }
    assert!(counts.iter().all(|c| c.starts_with("count ")), "{counts:?}");
    assert_ne!(counts[0], counts[2], "the counter moved: {counts:?}");
    drop(observation);
    // Every request Californium saw came protected.
    let requests: Vec<String> = server
        .events
        .lines()
        .into_iter()
        .filter(|l| l.starts_with("REQUEST "))
        .collect();
    assert!(!requests.is_empty());
    assert!(
        requests.iter().all(|l| field(l, "oscore") == Some("1")),
        "{requests:#?}"
    );

    // A wrong key: Californium cannot decrypt and answers 4.00 unprotected. (It checks
    // the sequence number first, so this client starts past the numbers used above.)
    let mut wrong = client_material();
    wrong.master_secret[0] ^= 1;
    let wrong = SecurityContext::with_sequence(wrong, SenderSequence::in_memory(1000), false);
    let client = Client::new().layer(Oscore::new().protect(UriPattern::any(), wrong.unwrap()));
    let r = client.get(&uri("/hello")).await.unwrap();
    assert_eq!(r.code, Code::BAD_REQUEST, "{}", r.text_payload());
    assert_eq!(r.text_payload(), "Decryption failed");
}

fn exchange(socket: &UdpSocket, message: &Message) -> Message {
    socket.send(&encode(message)).unwrap();
    let mut buf = [0u8; 1500];
    let n = socket.recv(&mut buf).unwrap();
    decode(&buf[..n]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn californium_answers_a_replayed_request_4_01() {
    let cf = need!("Californium with cf-oscore", californium_oscore());
    let server = cf.program_server("OscorePeer", &context_args(SECRET, SERVER_ID, ""));
    let client = SecurityContext::new(client_material()).unwrap();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(server.addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut request = Message::new(MessageType::Confirmable, Code::GET, 0x4000);
    request.token = Token::new(&[9, 9]).unwrap();
    request.options.set_uri_path("/hello");
    let binding = client.protect_request(&mut request).unwrap();
    let mut answer = exchange(&socket, &request);
    client.unprotect_response(&mut answer, &binding).unwrap();
    assert_eq!(answer.payload, b"hello from californium");
    // The same protected request in a new CoAP message.
    request.mid = 0x4001;
    request.token = Token::new(&[7]).unwrap();
    let replayed = exchange(&socket, &request);
    assert_eq!(replayed.code, Code::UNAUTHORIZED, "{replayed:?}");
    assert!(!replayed.options.contains(OSCORE));
    assert_eq!(replayed.payload, b"Replay detected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn californium_client_against_a_cobalt_oscore_server() {
    let cf = need!("Californium with cf-oscore", californium_oscore());
    let material = client_material().reversed();
    let context = SecurityContext::new(material).unwrap().named("californium");
    let port = cobalt_test_support::ports::free_udp_port(V4);
    let server = common::cobalt_server(Oscore::new().accept(context), port).await;
    let addr = server.local_addr(Scheme::Coap).unwrap();
    let uri = |p: &str| format!("coap://{addr}{p}");
    // Californium does not keep its sequence number between runs: each run starts
    // past the numbers the runs before it used.
    let request = |secret: &str, first_seq: &str, method: &str, path: &str, extra: &[&str]| {
        let target = uri(path);
        let mut args = vec!["request", method, target.as_str()];
        args.extend(context_args(secret, "", SERVER_ID));
        args.extend(["--first-seq", first_seq]);
        args.extend(extra);
        let lines = cf.run_program("OscorePeer", &args);
        let response = lines
            .iter()
            .find(|l| l.starts_with("RESPONSE "))
            .unwrap_or_else(|| panic!("no response: {lines:#?}"))
            .clone();
        let payload = lines
            .iter()
            .find_map(|l| l.strip_prefix("PAYLOAD "))
            .map(californium::unescape)
            .unwrap_or_default();
        (field(&response, "code").unwrap().to_string(), payload)
    };

    assert_eq!(
        request(SECRET, "0", "GET", "/hello", &[]),
        ("2.05".into(), "hello from cobalt".into())
    );
    assert_eq!(
        request(SECRET, "100", "POST", "/echo", &["--payload", "ping"]),
        ("2.05".into(), "ping".into())
    );
    let (code, big) = request(SECRET, "200", "GET", "/big", &[]);
    assert_eq!(code, "2.05");
    assert_eq!(big.as_bytes(), letters(2000), "Block2 through OSCORE");

    let target = uri("/temp");
    let mut args = vec!["observe", target.as_str(), "--count", "3"];
    args.extend(context_args(SECRET, "", SERVER_ID));
    args.extend(["--first-seq", "300"]);
    let lines = cf.run_program("OscorePeer", &args);
    let notes: Vec<String> = lines
        .iter()
        .filter(|l| l.starts_with("NOTIFY "))
        .map(|l| payload_of(l).unwrap())
        .collect();
    assert_eq!(notes.len(), 3, "{lines:#?}");
    assert!(notes.iter().all(|n| n.starts_with('t')), "{notes:?}");
    assert_ne!(notes[0], notes[2], "the resource changed: {notes:?}");
    assert_eq!(lines.last().map(String::as_str), Some("DONE"), "{lines:#?}");

    // A replayed request (sequence number 0 again): 4.01, unprotected.
    let (code, why) = request(SECRET, "0", "GET", "/hello", &[]);
    assert_eq!(code, "4.01", "{why}");
    assert!(why.contains("Replay"), "{why}");

    // A wrong key: Cobalt cannot decrypt and answers 4.00.
    let wrong = format!("ff{}", &SECRET[2..]);
    let (code, why) = request(&wrong, "400", "GET", "/hello", &[]);
    assert_eq!(code, "4.00", "{why}");
    assert_ne!(why, "hello from cobalt");
    server.shutdown(Duration::ZERO).await;
}

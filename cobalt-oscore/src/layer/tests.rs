//! The layer on a running server and client over UDP on loopback: GET, POST, observe
//! and Block2 through OSCORE, resources that require it, a wrong key, a replayed
//! request and a server restart.

use super::*;
use crate::context::Material;
use crate::sequence::SenderSequence;
use cobalt::proto::message::codec::{decode, encode};
use cobalt::proto::message::{opt, MessageType, Token};
use cobalt::server::{get, post, Observable, Server};
use cobalt::{Client, Scheme, ServerHandle};
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

fn material() -> Material {
    Material::new(b"0123456789abcdef", b"S", b"C").with_salt(b"salt")
}

/// A 2000-byte answer: four inner blocks of 512.
fn big() -> String {
    (0..2000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect()
}

async fn start(server_context: SecurityContext, temp: &Observable) -> ServerHandle {
    Server::new()
        .route("/hello", get(|| async { "hello" }))
        .route(
            "/echo",
            post(|req: Request| async move { req.payload().to_vec() }),
        )
        .route("/big", get(|| async { big() }))
        .route(
            "/count",
            post(|req: Request| async move {
                Response::new(Code::CHANGED).with_payload(format!("{} bytes", req.payload().len()))
            }),
        )
        .route(
            "/secret",
            get(|| async { "42" }).layer(RequireOscore::any()),
        )
        .route("/temp", get(|| async { "t" }).observable(temp))
        .layer(Oscore::new().accept(server_context.named("client-c")))
        .shards(1)
        .bind("127.0.0.1:0")
        .await
        .unwrap()
}

fn client_for(addr: SocketAddr, context: SecurityContext) -> Client {
    let target = UriPattern::parse(&format!("coap://{addr}/*")).unwrap();
    Client::new().layer(Oscore::new().protect(target, context))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_post_observe_and_block2_through_oscore() {
    let temp = Observable::new();
    let server = start(SecurityContext::new(material()).unwrap(), &temp).await;
    let addr = server.local_addr(Scheme::Coap).unwrap();
    let client_context = Arc::new(SecurityContext::new(material().reversed()).unwrap());
    let client = Client::new().layer(Oscore::new().protect(
        UriPattern::parse(&format!("coap://{addr}/*")).unwrap(),
        client_context.clone(),
    ));
    let uri = |p: &str| format!("coap://{addr}{p}");

    let r = client.get(&uri("/hello")).await.unwrap();
    assert_eq!(
        (r.code, r.text_payload().as_str()),
        (Code::CONTENT, "hello")
    );
    assert!(
        !r.options.contains(OSCORE),
        "the application sees the inner answer"
    );
    let r = client.post(&uri("/echo"), "ping").await.unwrap();
    assert_eq!(r.payload, b"ping");
    let r = client.get(&uri("/secret")).await.unwrap();
    assert_eq!(r.text_payload(), "42");
    let r = client.get(&uri("/big")).await.unwrap();
    assert_eq!(r.text_payload(), big(), "Block2 inside OSCORE reassembled");
    let r = client
        .request(Code::POST, &uri("/count"))
        .payload(big())
        .block_size(256)
        .unwrap()
        .send()
        .await
        .unwrap();
    assert_eq!(r.code, Code::CHANGED);
    assert_eq!(
        r.text_payload(),
        "2000 bytes",
        "Block1 inside OSCORE put together"
    );
    let used = client_context.next_sequence_number();
    assert!(
        used >= 7,
        "each request and block used its own sequence number: {used}"
    );

    let mut observation = client.observe(&uri("/temp")).await.unwrap();
    let first = observation.next().await.unwrap().unwrap();
    assert_eq!(first.text_payload(), "t");
    for _ in 0..2 {
        temp.changed();
        let n = tokio::time::timeout(Duration::from_secs(10), observation.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!((n.code, n.text_payload().as_str()), (Code::CONTENT, "t"));
    }
    assert_eq!(temp.observer_count(), 1);

    // Without OSCORE: /hello is open, /secret is not.
    let plain = Client::new();
    assert_eq!(
        plain.get(&uri("/hello")).await.unwrap().text_payload(),
        "hello"
    );
    let r = plain.get(&uri("/secret")).await.unwrap();
    assert_eq!(r.code, Code::UNAUTHORIZED);
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_is_answered_4_00_and_an_unknown_kid_4_01() {
    let temp = Observable::new();
    let server = start(SecurityContext::new(material()).unwrap(), &temp).await;
    let addr = server.local_addr(Scheme::Coap).unwrap();
    let mut wrong = material().reversed();
    wrong.master_secret = b"not-the-secret".to_vec();
    let client = client_for(addr, SecurityContext::new(wrong).unwrap());
    let r = client.get(&format!("coap://{addr}/hello")).await.unwrap();
    assert_eq!(r.code, Code::BAD_REQUEST);
    assert_eq!(r.text_payload(), "Decryption failed");

    let stranger = Material::new(b"0123456789abcdef", b"X", b"Y");
    let client = client_for(addr, SecurityContext::new(stranger).unwrap());
    let r = client.get(&format!("coap://{addr}/hello")).await.unwrap();
    assert_eq!(r.code, Code::UNAUTHORIZED);
    assert_eq!(r.text_payload(), "Security context not found");
    server.shutdown(Duration::ZERO).await;
}

/// Sends `message` from `socket` and reads the answer.
fn exchange(socket: &UdpSocket, message: &Message) -> Message {
    socket.send(&encode(message)).unwrap();
    let mut buf = [0u8; 1500];
    let n = socket.recv(&mut buf).unwrap();
    decode(&buf[..n]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_request_is_answered_replay_detected() {
    let temp = Observable::new();
    let server = start(SecurityContext::new(material()).unwrap(), &temp).await;
    let addr = server.local_addr(Scheme::Coap).unwrap();
    let client = SecurityContext::new(material().reversed()).unwrap();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();

    let mut request = Message::new(MessageType::Confirmable, Code::GET, 0x1234);
    request.token = Token::new(&[1, 2]).unwrap();
    request.options.set_uri_path("/hello");
    let binding = client.protect_request(&mut request).unwrap();
    let mut first = exchange(&socket, &request);
    assert!(first.options.contains(OSCORE));
    client.unprotect_response(&mut first, &binding).unwrap();
    assert_eq!(first.payload, b"hello");

    // A critical option inside that the server does not know: 4.02, protected.
    let mut odd = Message::new(MessageType::Confirmable, Code::GET, 0x1236);
    odd.token = Token::new(&[4]).unwrap();
    odd.options.set_uri_path("/hello");
    odd.options.set(65001, b"x");
    let odd_binding = client.protect_request(&mut odd).unwrap();
    let mut refused = exchange(&socket, &odd);
    assert!(refused.options.contains(OSCORE));
    client
        .unprotect_response(&mut refused, &odd_binding)
        .unwrap();
    assert_eq!(refused.code, Code::BAD_OPTION);

    // The same OSCORE request in a new CoAP message (new MID and token).
    let mut replay = request.clone();
    replay.mid = 0x1235;
    replay.token = Token::new(&[3]).unwrap();
    let answer = exchange(&socket, &replay);
    assert_eq!(answer.code, Code::UNAUTHORIZED);
    assert_eq!(answer.payload, b"Replay detected");
    assert!(!answer.options.contains(OSCORE));
    assert_eq!(answer.options.get_uint(opt::MAX_AGE), Some(0));
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_recovers_its_replay_window_with_an_echo() {
    let dir = std::env::temp_dir().join(format!("cobalt-oscore-layer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let client_context = Arc::new(SecurityContext::new(material().reversed()).unwrap());
    let mut seen = Vec::new();
    for run in 0..2 {
        let temp = Observable::new();
        let (sequence, restarted) = SenderSequence::load(&dir, 4).unwrap();
        assert_eq!(restarted, run == 1);
        let context = SecurityContext::with_sequence(material(), sequence, restarted).unwrap();
        let server = start(context, &temp).await;
        let addr = server.local_addr(Scheme::Coap).unwrap();
        let client =
            Client::new().layer(Oscore::new().protect(UriPattern::any(), client_context.clone()));
        // Notifications use the server's own sequence numbers.
        let mut observation = client
            .observe(&format!("coap://{addr}/temp"))
            .await
            .unwrap();
        observation.next().await.unwrap().unwrap();
        temp.changed();
        tokio::time::timeout(Duration::from_secs(10), observation.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let r = client.get(&format!("coap://{addr}/hello")).await.unwrap();
        assert_eq!(r.text_payload(), "hello", "run {run}");
        drop(observation);
        server.shutdown(Duration::ZERO).await;
        let text = std::fs::read_to_string(dir.join("sequence.json")).unwrap();
        seen.push(text);
    }
    // The restarted server started past what the first one reserved.
    assert_ne!(seen[0], seen[1]);
    std::fs::remove_dir_all(dir).unwrap();
}

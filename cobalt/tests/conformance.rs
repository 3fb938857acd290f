//! Requests the server must refuse or route exactly the same over every transport
//! (`coap`, `coaps`, `coap+tcp`, `coaps+tcp`, `coap+ws`, `coaps+ws`), from issue 10:
//! - Proxy-Uri or Proxy-Scheme: 5.05 Proxying Not Supported (RFC 7252 §5.7.2), not a
//!   local answer;
//! - one Uri-Path segment `.well-known/core` is not discovery (4.04);
//! - a Block2 number past the end of the representation: 4.02 Bad Option, also for
//!   an unverified UDP peer that answers no ping (no 4.01 Echo challenge);
//! - Block2 with SZX 7 over UDP and DTLS: 4.00 Bad Request (reserved; BERT only over
//!   connections that announced it).

use cobalt::proto::message::{opt, BlockValue};
use cobalt::server::get;
use cobalt::transport::credentials::PskStore;
use cobalt::Scheme;
use cobalt::{Client, Code, Response, Server, ServerHandle};
use std::time::Duration;

async fn server() -> ServerHandle {
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    Server::new()
        .route("/hello", get(|| async { "hello" }))
        .route("/big", get(|| async { "x".repeat(3000) }))
        .psk(PskStore::new().with("alice", "secretPSK"))
        .listen(Scheme::Coaps, any)
        .listen(Scheme::CoapTcp, any)
        .listen(Scheme::CoapsTcp, any)
        .listen(Scheme::CoapWs, any)
        .listen(Scheme::CoapsWs, any)
        .shards(1)
        .bind(any)
        .await
        .unwrap()
}

/// Every transport's base URI.
fn bases(s: &ServerHandle) -> Vec<String> {
    vec![
        format!("coap://{}", s.local_addr(Scheme::Coap).unwrap()),
        format!("coaps://{}", s.local_addr(Scheme::Coaps).unwrap()),
        format!("coap+tcp://{}", s.local_addr(Scheme::CoapTcp).unwrap()),
        format!("coaps+tcp://{}", s.local_addr(Scheme::CoapsTcp).unwrap()),
        format!("coap+ws://{}", s.local_addr(Scheme::CoapWs).unwrap()),
        format!("coaps+ws://{}", s.local_addr(Scheme::CoapsWs).unwrap()),
    ]
}

async fn send(client: &Client, uri: &str, options: &[(u16, &[u8])]) -> Response {
    let mut b = client
        .request(Code::GET, uri)
        .timeout(Duration::from_secs(10));
    for (number, value) in options {
        b = b.option(*number, *value);
    }
    b.send().await.unwrap_or_else(|e| panic!("GET {uri}: {e}"))
}

fn block2(num: u32, szx: u8) -> Vec<u8> {
    let v = BlockValue::new(num, false, szx).unwrap().encode();
    cobalt::proto::message::option::encode_uint(v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transport_refuses_and_routes_alike() {
    let server = server().await;
    let client = Client::new().with_psk("alice", "secretPSK");
    for base in bases(&server) {
        let hello = format!("{base}/hello");
        let r = send(&client, &hello, &[]).await;
        assert_eq!(
            (r.code, r.text_payload().as_str()),
            (Code::CONTENT, "hello"),
            "{base}"
        );

        let proxied = send(
            &client,
            &hello,
            &[(opt::PROXY_URI, b"coap://example.org/hello")],
        )
        .await;
        assert_eq!(
            proxied.code,
            Code::PROXYING_NOT_SUPPORTED,
            "{base}: Proxy-Uri"
        );
        let proxied = send(&client, &hello, &[(opt::PROXY_SCHEME, b"http")]).await;
        assert_eq!(
            proxied.code,
            Code::PROXYING_NOT_SUPPORTED,
            "{base}: Proxy-Scheme"
        );

        // RFC 7252 §6.4: "%2F" stays inside its segment.
        let r = send(&client, &format!("{base}/.well-known%2Fcore"), &[]).await;
        assert_eq!(
            r.code,
            Code::NOT_FOUND,
            "{base}: one segment '.well-known/core'"
        );
        let r = send(&client, &format!("{base}/.well-known/core"), &[]).await;
        assert_eq!(r.code, Code::CONTENT, "{base}: discovery");
        assert!(r.text_payload().contains("</big>"), "{base}");

        let r = send(
            &client,
            &format!("{base}/big"),
            &[(opt::BLOCK2, &block2(9, 6))],
        )
        .await;
        assert_eq!(r.code, Code::BAD_OPTION, "{base}: Block2 past the end");
    }
    for base in &bases(&server)[..2] {
        let r = send(
            &client,
            &format!("{base}/big"),
            &[(opt::BLOCK2, &block2(0, 7))],
        )
        .await;
        assert_eq!(
            r.code,
            Code::BAD_REQUEST,
            "{base}: Block2 SZX 7 is reserved here"
        );
    }
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_past_the_end_is_4_02_for_a_peer_that_never_proved_its_address() {
    // A bare socket that answers nothing (no RST to a ping of the server's address
    // validation, RFC 9175 §2.4): the error comes at once, not as 4.01 with Echo.
    use cobalt::proto::message::{decode, encode, Message, MessageType, Token};
    let server = server().await;
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut get = Message::new(MessageType::Confirmable, Code::GET, 0x1234);
    get.token = Token::new(&[7]).unwrap();
    get.options.set_uri_path("/big");
    get.options
        .set_uint(opt::BLOCK2, BlockValue::new(9, false, 6).unwrap().encode());
    sock.send_to(&encode(&get), server.local_addr(Scheme::Coap).unwrap())
        .await
        .unwrap();
    let mut buf = [0u8; 1500];
    let answer = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let n = sock.recv(&mut buf).await.unwrap();
            let m = decode(&buf[..n]).unwrap();
            if m.token == get.token {
                return m;
            }
        }
    })
    .await
    .expect("an answer within 5 s");
    assert_eq!(
        (answer.mtype, answer.code, answer.mid),
        (MessageType::Acknowledgement, Code::BAD_OPTION, 0x1234),
        "{answer:?}"
    );
    server.shutdown(Duration::ZERO).await;
}

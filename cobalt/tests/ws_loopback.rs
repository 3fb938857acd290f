//! CoAP over WebSockets (RFC 8323 §4) end to end on loopback: the same resource tree
//! served over UDP, TCP and WebSockets, the pooled client, bad upgrade requests and
//! WebSocket peers that misbehave; observe, Block1 uploads and BERT (the cases shared
//! with TCP are in `stream/`).

#[macro_use]
mod stream;

use cobalt::proto::message::tcp::{decode_ws, encode_ws, signal_code, Signal};
use cobalt::proto::message::{TcpMessage, Token};
use cobalt::proto::tcp_connection::TcpConfig;
use cobalt::server::{get, post, Request};
use cobalt::transport::limits::TcpServerLimits;
use cobalt::Scheme;
use cobalt::{Client, Code, Server, ServerHandle};
use futures_util::{SinkExt, StreamExt};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

fn demo() -> Server {
    Server::new()
        .route("/hello", get(|| async { "hello world" }).rt("greeting"))
        .route(
            "/echo",
            post(|req: Request| async move { (Code::CHANGED, req.payload().to_vec()) }),
        )
        .route("/big", get(|| async { vec![b'z'; 3000] }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                "finally"
            }),
        )
}

async fn ws_server(limits: TcpServerLimits) -> ServerHandle {
    demo()
        .ws_limits(limits)
        .listen(Scheme::CoapWs, "127.0.0.1:0")
        .start()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_tree_over_udp_tcp_and_ws() {
    let server = demo()
        .shards(1)
        .listen(Scheme::CoapTcp, "127.0.0.1:0")
        .listen(Scheme::CoapWs, "127.0.0.1:0")
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let ws = server.local_addr(Scheme::CoapWs).unwrap();
    let tcp = server.local_addr(Scheme::CoapTcp).unwrap();
    let client = Client::new();
    let r = client.get(&format!("coap+ws://{ws}/hello")).await.unwrap();
    assert_eq!(
        (r.code, r.text_payload().as_str()),
        (Code::CONTENT, "hello world")
    );
    let r = client
        .get(&format!("coap+tcp://{tcp}/hello"))
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "hello world");
    let r = client
        .get(&format!("coap+ws://{ws}/.well-known/core"))
        .await
        .unwrap();
    assert!(r.text_payload().contains("</hello>;rt=\"greeting\""));
    let r = client.get(&format!("coap+ws://{ws}/nope")).await.unwrap();
    assert_eq!(r.code, Code::NOT_FOUND);
    let r = client
        .post(&format!("coap+ws://{ws}/echo"), vec![7u8; 20_000])
        .await
        .unwrap();
    assert_eq!((r.code, r.payload.len()), (Code::CHANGED, 20_000));
    let r = client.get(&format!("coap+ws://{ws}/big")).await.unwrap();
    assert_eq!(r.payload, vec![b'z'; 3000]);
    // Concurrent requests share the pooled WebSocket.
    let mut tasks = Vec::new();
    for i in 0..20 {
        let client = client.clone();
        let uri = format!(
            "coap+ws://{ws}/{}",
            if i % 2 == 0 { "slow" } else { "hello" }
        );
        tasks.push(tokio::spawn(async move { client.get(&uri).await }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap().code, Code::CONTENT);
    }
    // The host name goes into the upgrade's Host header and Uri-Host.
    let r = client
        .get(&format!("coap+ws://localhost:{}/hello", ws.port()))
        .await;
    // localhost may resolve to ::1 first where the server only listens on 127.0.0.1.
    if let Ok(r) = r {
        assert_eq!(r.text_payload(), "hello world");
    }
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn client_reports_refused_connection() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let err = Client::new()
        .get(&format!("coap+ws://127.0.0.1:{port}/x"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("connect"), "{err}");
}

/// Sends `request` on a fresh connection and returns what the server answered
/// before closing.
async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("server did not close")
        .ok();
    String::from_utf8_lossy(&out).into_owned()
}

const UPGRADE: &str = "GET /.well-known/coap HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: coap\r\n\r\n";

#[tokio::test]
async fn bad_upgrade_requests_are_refused() {
    let server = ws_server(TcpServerLimits {
        handshake_timeout: Duration::from_millis(300),
        ..TcpServerLimits::default()
    })
    .await;
    let addr = server.local_addr(Scheme::CoapWs).unwrap();
    let r = raw_exchange(
        addr,
        UPGRADE.replace("/.well-known/coap", "/chat").as_bytes(),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 404 "), "{r}");
    let r = raw_exchange(
        addr,
        UPGRADE
            .replace("Sec-WebSocket-Protocol: coap\r\n", "")
            .as_bytes(),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 400 "), "{r}");
    assert!(r.contains("subprotocol coap"), "{r}");
    let r = raw_exchange(addr, UPGRADE.replace(": coap", ": mqtt").as_bytes()).await;
    assert!(r.starts_with("HTTP/1.1 400 "), "{r}");
    let r = raw_exchange(
        addr,
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n",
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 400 "), "{r}");
    let r = raw_exchange(addr, b"GET /.well-known/coap HTTP/1.1\r\nHost: h\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 426 "), "{r}");
    let r = raw_exchange(addr, UPGRADE.replace("GET", "PUT").as_bytes()).await;
    assert!(r.starts_with("HTTP/1.1 405 "), "{r}");
    // A request head that never ends is cut off at 8 KiB.
    let mut huge = b"GET /.well-known/coap HTTP/1.1\r\n".to_vec();
    for i in 0..400 {
        huge.extend_from_slice(format!("X-Filler-{i}: aaaaaaaaaaaaaaaa\r\n").as_bytes());
    }
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(&huge).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 431 "));
    // Slowloris: half a request head, then nothing; closed after the handshake timeout.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&UPGRADE.as_bytes()[..40]).await.unwrap();
    let started = std::time::Instant::now();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut out))
        .await
        .expect("slowloris connection not closed")
        .ok();
    assert!(out.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(250));
    // The good request still works after all that (and the connection stays open).
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(UPGRADE.as_bytes()).await.unwrap();
    let mut out = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut out))
        .await
        .unwrap()
        .unwrap();
    let r = String::from_utf8_lossy(&out[..n]).into_owned();
    assert!(r.starts_with("HTTP/1.1 101 "), "{r}");
    assert!(
        r.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        "{r}"
    );
    assert!(r.contains("Sec-WebSocket-Protocol: coap"), "{r}");
    server.shutdown(Duration::ZERO).await;
}

type Ws = WebSocketStream<TcpStream>;

/// A raw WebSocket client with subprotocol `coap`.
async fn raw_ws(addr: SocketAddr) -> Ws {
    let stream = TcpStream::connect(addr).await.unwrap();
    let mut req = format!("ws://{addr}/.well-known/coap")
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", HeaderValue::from_static("coap"));
    let (ws, resp) = tokio_tungstenite::client_async(req, stream).await.unwrap();
    assert_eq!(resp.headers()["Sec-WebSocket-Protocol"], "coap");
    ws
}

fn ws_bytes(m: &TcpMessage) -> Vec<u8> {
    let mut v = Vec::new();
    encode_ws(m, &mut v);
    v
}

fn csm() -> Vec<u8> {
    ws_bytes(
        &Signal::Csm {
            extended_token_length: None,
            max_message_size: Some(100_000),
            block_wise_transfer: false,
        }
        .to_message(),
    )
}

/// Reads CoAP messages until the WebSocket closes; returns them and the close code.
async fn read_until_close(ws: &mut Ws) -> (Vec<TcpMessage>, Option<u16>) {
    let mut msgs = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => panic!("not closed; got {msgs:?}"),
            Ok(Some(Ok(Message::Binary(b)))) => msgs.push(decode_ws(&b, usize::MAX).unwrap()),
            Ok(Some(Ok(Message::Close(c)))) => return (msgs, c.map(|c| c.code.into())),
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(_)) | None) => return (msgs, None),
        }
    }
}

#[tokio::test]
async fn raw_ws_exchange_ping_and_release() {
    let server = ws_server(TcpServerLimits::default()).await;
    let mut ws = raw_ws(server.local_addr(Scheme::CoapWs).unwrap()).await;
    ws.send(Message::Binary(csm().into())).await.unwrap();
    let mut get = TcpMessage::new(Code::GET);
    get.token = Token::new(&[9, 9]).unwrap();
    get.options.set_uri_path("hello");
    ws.send(Message::Binary(ws_bytes(&get).into()))
        .await
        .unwrap();
    let mut ping = Signal::Ping { custody: false }.to_message();
    ping.token = Token::new(&[5]).unwrap();
    ws.send(Message::Binary(ws_bytes(&ping).into()))
        .await
        .unwrap();
    // A WebSocket-level ping is answered too.
    ws.send(Message::Ping(b"p".to_vec().into())).await.unwrap();
    let mut got = Vec::new();
    while got.len() < 3 {
        match tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .unwrap()
        {
            Some(Ok(Message::Binary(b))) => got.push(decode_ws(&b, usize::MAX).unwrap()),
            Some(Ok(_)) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got[0].code, signal_code::CSM);
    let resp = got.iter().find(|m| m.code == Code::CONTENT).unwrap();
    assert_eq!(
        (resp.token.clone(), &resp.payload[..]),
        (get.token, &b"hello world"[..])
    );
    let pong = got.iter().find(|m| m.code == signal_code::PONG).unwrap();
    assert_eq!(pong.token, ping.token);
    let release = Signal::Release {
        alternative_addresses: Vec::new(),
        hold_off: None,
        diagnostic: String::new(),
    };
    ws.send(Message::Binary(ws_bytes(&release.to_message()).into()))
        .await
        .unwrap();
    let (_, code) = read_until_close(&mut ws).await;
    assert_eq!(code, Some(1000));
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn oversized_frame_is_refused() {
    let server = ws_server(TcpServerLimits {
        connection: TcpConfig {
            max_message_size: 2000,
            ..TcpConfig::default()
        },
        ..TcpServerLimits::default()
    })
    .await;
    let mut ws = raw_ws(server.local_addr(Scheme::CoapWs).unwrap()).await;
    ws.send(Message::Binary(csm().into())).await.unwrap();
    let mut big = TcpMessage::new(Code::POST);
    big.options.set_uri_path("echo");
    big.payload = vec![1; 50_000];
    let _ = ws.send(Message::Binary(ws_bytes(&big).into())).await;
    let (msgs, code) = read_until_close(&mut ws).await;
    // The server's CSM announced the limit; then Abort and close status 1009.
    assert_eq!(
        Signal::from_message(&msgs[0]),
        Ok(Signal::Csm {
            extended_token_length: Some(64),
            max_message_size: Some(2000),
            block_wise_transfer: true
        })
    );
    assert!(
        msgs.iter().any(|m| m.code == signal_code::ABORT),
        "{msgs:?}"
    );
    assert_eq!(code, Some(1009));
    // Below the limit all is well.
    let client = Client::new();
    let r = client
        .post(
            &format!(
                "coap+ws://{}/echo",
                server.local_addr(Scheme::CoapWs).unwrap()
            ),
            vec![3u8; 1500],
        )
        .await
        .unwrap();
    assert_eq!(r.payload.len(), 1500);
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn text_messages_and_bad_first_message_close_the_connection() {
    let server = ws_server(TcpServerLimits::default()).await;
    let mut ws = raw_ws(server.local_addr(Scheme::CoapWs).unwrap()).await;
    ws.send(Message::Binary(csm().into())).await.unwrap();
    ws.send(Message::Text("GET /hello".into())).await.unwrap();
    let (_, code) = read_until_close(&mut ws).await;
    assert_eq!(code, Some(1003));

    // First message not a CSM: Abort.
    let mut ws = raw_ws(server.local_addr(Scheme::CoapWs).unwrap()).await;
    let mut get = TcpMessage::new(Code::GET);
    get.options.set_uri_path("hello");
    ws.send(Message::Binary(ws_bytes(&get).into()))
        .await
        .unwrap();
    let (msgs, _) = read_until_close(&mut ws).await;
    assert!(
        msgs.iter().any(|m| m.code == signal_code::ABORT),
        "{msgs:?}"
    );
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn connection_limit_answers_503() {
    let server = ws_server(TcpServerLimits {
        max_connections: 1,
        ..TcpServerLimits::default()
    })
    .await;
    let addr = server.local_addr(Scheme::CoapWs).unwrap();
    let mut first = raw_ws(addr).await;
    first.send(Message::Binary(csm().into())).await.unwrap();
    let r = raw_exchange(addr, UPGRADE.as_bytes()).await;
    assert!(r.starts_with("HTTP/1.1 503 "), "{r}");
    drop(first);
    // The slot frees once the first connection is gone.
    let client = Client::new();
    let mut ok = false;
    for _ in 0..50 {
        if client.get(&format!("coap+ws://{addr}/hello")).await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok);
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn shutdown_releases_ws_connections() {
    let server = ws_server(TcpServerLimits::default()).await;
    let mut ws = raw_ws(server.local_addr(Scheme::CoapWs).unwrap()).await;
    ws.send(Message::Binary(csm().into())).await.unwrap();
    let stop = tokio::spawn(server.shutdown(Duration::from_millis(100)));
    let (msgs, _) = read_until_close(&mut ws).await;
    assert!(
        msgs.iter().any(|m| m.code == signal_code::RELEASE),
        "{msgs:?}"
    );
    stop.await.unwrap();
}

/// Upgrades a raw TCP connection by hand, for peers that write WebSocket frames
/// byte by byte.
async fn raw_upgraded(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(UPGRADE.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
        head.push(b[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101 "));
    s
}

/// A masked binary WebSocket frame (client to server) carrying `payload`.
fn client_frame(payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mask = [1u8, 2, 3, 4];
    let mut f = vec![0x82, 0x80 | payload.len() as u8];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// Reads until the server closes the TCP connection; false if it did not in time.
async fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    let mut sink = Vec::new();
    tokio::time::timeout(limit, s.read_to_end(&mut sink))
        .await
        .is_ok()
}

#[tokio::test]
async fn slow_websocket_messages_are_cut_off() {
    let server = ws_server(TcpServerLimits {
        connection: TcpConfig {
            frame_timeout: Duration::from_millis(400),
            ..TcpConfig::default()
        },
        ..TcpServerLimits::default()
    })
    .await;
    let addr = server.local_addr(Scheme::CoapWs).unwrap();
    // Complete messages, however spaced, are fine: CSM then a GET 600 ms later.
    let mut s = raw_upgraded(addr).await;
    s.write_all(&client_frame(&csm())).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut get = TcpMessage::new(Code::GET);
    get.options.set_uri_path("hello");
    s.write_all(&client_frame(&ws_bytes(&get))).await.unwrap();
    let mut buf = vec![0u8; 256];
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("hello world") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed early");
        got.extend_from_slice(&buf[..n]);
    }
    // A message trickled one byte every 150 ms is cut off after 400 ms.
    let frame = client_frame(&ws_bytes(&get));
    let started = std::time::Instant::now();
    let trickle = async {
        for b in &frame {
            if s.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), trickle).await;
    assert!(closed_within(&mut s, Duration::from_secs(3)).await);
    assert!(started.elapsed() < Duration::from_secs(3));
    // Half a message, then silence: cut off too.
    let mut s = raw_upgraded(addr).await;
    s.write_all(&client_frame(&csm())).await.unwrap();
    s.write_all(&frame[..4]).await.unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(3)).await);
    server.shutdown(Duration::ZERO).await;
}

mod shared {
    shared_cases!(super::stream::Transport::Ws);
}

#[tokio::test]
async fn closing_a_websocket_ends_its_relations() {
    let value = stream::Value::new(b"a");
    let server = value.serve(stream::Transport::Ws).await;
    let mut ws = raw_ws(server.local_addr(Scheme::CoapWs).unwrap()).await;
    ws.send(Message::Binary(csm().into())).await.unwrap();
    for token in 1..=2u8 {
        let mut get = TcpMessage::new(Code::GET);
        get.token = Token::new(&[token]).unwrap();
        get.options.set_uri_path("obs");
        get.options
            .set_uint(cobalt::proto::message::opt::OBSERVE, 0);
        ws.send(Message::Binary(ws_bytes(&get).into()))
            .await
            .unwrap();
    }
    let mut registered = 0;
    while registered < 2 {
        let Some(Ok(Message::Binary(b))) = ws.next().await else {
            panic!("closed")
        };
        let m = decode_ws(&b, usize::MAX).unwrap();
        if m.code == Code::CONTENT {
            assert!(m.options.contains(cobalt::proto::message::opt::OBSERVE));
            registered += 1;
        }
    }
    assert_eq!(value.observable.observer_count(), 2);
    value.set(b"b");
    for _ in 0..2 {
        let Some(Ok(Message::Binary(b))) = ws.next().await else {
            panic!("closed")
        };
        assert_eq!(decode_ws(&b, usize::MAX).unwrap().payload, b"b");
    }
    drop(ws);
    let o = value.observable.clone();
    stream::eventually("relations end with the WebSocket", || {
        o.observer_count() == 0
    })
    .await;
    server.shutdown(Duration::ZERO).await;
}

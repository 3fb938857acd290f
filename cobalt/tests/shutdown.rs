//! Graceful shutdown over real UDP: a request whose handler has not answered when the
//! grace period ends gets 5.03, one answered within it gets its answer; in both cases
//! after the empty ACK that promised a separate response, so never silence.

use cobalt::proto::message::{codec, Message, MessageType, Token};
use cobalt::server::get;
use cobalt::{Code, EndpointConfig, Scheme, Server, ServerHandle};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, Notify};

/// A server whose `/wait` handler says it started, then waits for `release`.
async fn waiting_server(release: Arc<Notify>) -> (ServerHandle, mpsc::UnboundedReceiver<()>) {
    let (started, started_rx) = mpsc::unbounded_channel();
    let handler = get(move || {
        let (release, started) = (release.clone(), started.clone());
        async move {
            let _ = started.send(());
            release.notified().await;
            "done at last"
        }
    });
    let config = EndpointConfig {
        separate_ack_delay: Duration::from_millis(5),
        ..EndpointConfig::default()
    };
    let server = Server::new()
        .config(config)
        .route("/wait", handler)
        .shards(1)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    (server, started_rx)
}

/// The next message the socket receives (a generous bound keeps a failing test
/// from hanging; nothing depends on how long it takes).
async fn receive(sock: &UdpSocket) -> Message {
    let mut buf = [0u8; 1500];
    let n = tokio::time::timeout(Duration::from_secs(20), sock.recv(&mut buf))
        .await
        .expect("an answer, not silence")
        .unwrap();
    codec::decode(&buf[..n]).unwrap()
}

/// Sends a confirmable GET of `/wait`, waits until its handler runs and its empty
/// ACK has come; returns the client's socket.
async fn ask_and_get_empty_ack(
    server: &ServerHandle,
    started: &mut mpsc::UnboundedReceiver<()>,
) -> UdpSocket {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.connect(server.local_addr(Scheme::Coap).unwrap())
        .await
        .unwrap();
    let mut request = Message::new(MessageType::Confirmable, Code::GET, 0x1234);
    request.token = Token::new(&[7, 7]).unwrap();
    request.options.set_uri_path("/wait");
    sock.send(&codec::encode(&request)).await.unwrap();
    started.recv().await.expect("the handler runs");
    let ack = receive(&sock).await;
    assert_eq!(
        (ack.mtype, ack.code, ack.mid),
        (MessageType::Acknowledgement, Code::EMPTY, 0x1234),
        "an empty ACK promising a separate response"
    );
    sock
}

#[tokio::test]
async fn unanswered_requests_get_5_03_when_the_grace_period_ends() {
    let release = Arc::new(Notify::new());
    let (server, mut started) = waiting_server(release.clone()).await;
    let sock = ask_and_get_empty_ack(&server, &mut started).await;
    // The handler never answers: the grace period ends at once.
    let stopped = tokio::spawn(server.shutdown(Duration::ZERO));
    let last = receive(&sock).await;
    assert_eq!(last.code, Code::SERVICE_UNAVAILABLE);
    assert_eq!(last.token, Token::new(&[7, 7]).unwrap());
    assert_eq!(last.mtype, MessageType::Confirmable, "a separate response");
    assert_eq!(last.payload, b"shutting down");
    stopped.await.unwrap();
}

#[tokio::test]
async fn requests_answered_within_the_grace_period_get_their_answer() {
    let release = Arc::new(Notify::new());
    let (server, mut started) = waiting_server(release.clone()).await;
    let sock = ask_and_get_empty_ack(&server, &mut started).await;
    let stopped = tokio::spawn(server.shutdown(Duration::from_secs(60)));
    release.notify_one();
    let last = receive(&sock).await;
    assert_eq!(last.code, Code::CONTENT);
    assert_eq!(last.payload, b"done at last");
    // Nothing is left to wait for: the shutdown ends without the 60 s.
    tokio::time::timeout(Duration::from_secs(20), stopped)
        .await
        .expect("the shutdown ends once every request is answered")
        .unwrap();
}

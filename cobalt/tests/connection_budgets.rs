//! Per-address budgets of the TCP and TLS listeners: one address that opens more
//! connections (or TLS handshakes) than its budget is refused, while clients from
//! other addresses keep connecting and being served; the places come back when the
//! attacker's connections close. Loopback has all of 127/8: the attacker is 127.0.0.2
//! (and the addresses after it), the legitimate clients 127.0.0.1.

mod stream;

use cobalt::proto::message::tcp::{signal_code, Signal};
use cobalt::proto::message::{decode_tcp, encode_tcp};
use cobalt::server::get;
use cobalt::transport::credentials::{ClientCredentials, ClientPsk, PskStore};
use cobalt::transport::limits::TcpServerLimits;
use cobalt::transport::tls::{Alpn, TlsConnector};
use cobalt::Scheme;
use cobalt::{Client, Code, Server, ServerHandle};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const ATTACKER: [u8; 4] = [127, 0, 0, 2];

/// A TCP connection to `server` from `source` (port chosen by the system).
async fn connect_from(source: [u8; 4], server: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((source, 0))).unwrap();
    socket.connect(server).await.unwrap()
}

/// A connection counter of the `transport` listener, from the metrics.
fn counter(server: &ServerHandle, name: &str, transport: &str) -> u64 {
    let text = server.metrics().render_prometheus();
    let key = format!("{name}{{transport=\"{transport}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in\n{text}"))
}

fn hello() -> Server {
    Server::new().route("/hello", get(|| async { "hello" }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_over_its_connection_budget_is_refused_while_others_connect() {
    let limits = TcpServerLimits {
        max_connections: 64,
        max_connections_per_ip: 4,
        ..TcpServerLimits::default()
    };
    let server = hello()
        .tcp_limits(limits)
        .listen(Scheme::CoapTcp, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::CoapTcp).unwrap();
    let open = || counter(&server, "cobalt_connections_open", "tcp");
    let refused = || counter(&server, "cobalt_connections_refused_per_ip_total", "tcp");
    // The attacker opens 10 silent connections: 4 are kept, 6 refused.
    let mut attacker = Vec::new();
    for _ in 0..10 {
        attacker.push(connect_from(ATTACKER, addr).await);
    }
    stream::eventually("6 refused, 4 kept", || refused() == 6 && open() == 4).await;
    // Other addresses still connect, each on a new connection, and are served.
    for _ in 0..5 {
        let r = Client::new()
            .get(&format!("coap+tcp://{addr}/hello"))
            .await
            .unwrap();
        assert_eq!(
            (r.code, r.text_payload().as_str()),
            (Code::CONTENT, "hello")
        );
    }
    assert_eq!(refused(), 6, "nobody else was refused");
    assert_eq!(
        counter(&server, "cobalt_connections_refused_total", "tcp"),
        0
    );
    // The attacker's places come back when its connections close.
    drop(attacker);
    stream::eventually("every connection closed", || open() == 0).await;
    let mut again = Vec::new();
    for _ in 0..4 {
        again.push(connect_from(ATTACKER, addr).await);
    }
    stream::eventually("4 new connections kept", || open() == 4).await;
    assert_eq!(refused(), 6);
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_hold_every_tls_handshake() {
    let limits = TcpServerLimits {
        max_handshakes_per_ip: 3,
        ..TcpServerLimits::default()
    };
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = hello()
        .psk(PskStore::new().with("alice", "secretPSK"))
        .tcp_limits(limits)
        .listen(Scheme::CoapsTcp, any)
        .shards(1)
        .bind(any)
        .await
        .unwrap();
    let tls = server.local_addr(Scheme::CoapsTcp).unwrap();
    let open = || counter(&server, "cobalt_connections_open", "tls");
    let refused = || counter(&server, "cobalt_connections_refused_per_ip_total", "tls");
    // Eight connections that never send a ClientHello: three handshakes wait, the
    // rest are closed at once.
    let mut stalled = Vec::new();
    for _ in 0..8 {
        stalled.push(connect_from(ATTACKER, tls).await);
    }
    stream::eventually("5 refused, 3 waiting", || refused() == 5 && open() == 3).await;
    // Clients from another address complete their handshakes and are served.
    for _ in 0..3 {
        let r = Client::new()
            .with_psk("alice", "secretPSK")
            .get(&format!("coaps+tcp://{tls}/hello"))
            .await
            .unwrap();
        assert_eq!(r.code, Code::CONTENT);
    }
    // A finished handshake gives its place back: with its three stalled handshakes
    // gone, the attacker's address completes more TLS connections than that budget.
    drop(stalled);
    stream::eventually("the stalled handshakes closed", || open() == 0).await;
    let auth = ClientCredentials::Psk(ClientPsk::new("alice", "secretPSK"));
    let connector = TlsConnector::new(Some(&auth), Alpn::Coap).unwrap();
    let mut done = Vec::new();
    for _ in 0..5 {
        let stream = connect_from(ATTACKER, tls).await;
        done.push(connector.connect(stream, "127.0.0.1", tls).await.unwrap());
    }
    assert_eq!(refused(), 5);
    server.shutdown(Duration::ZERO).await;
}

/// Sends a CSM on `stream` (which then says nothing).
async fn send_csm<S: AsyncWrite + Unpin>(stream: &mut S) {
    let csm = Signal::Csm {
        extended_token_length: None,
        max_message_size: Some(1152),
        block_wise_transfer: false,
    };
    let mut bytes = Vec::new();
    encode_tcp(&csm.to_message(), &mut bytes);
    stream.write_all(&bytes).await.unwrap();
}

/// A connection from `source` that sends its CSM and then says nothing.
async fn idle_after_csm(source: [u8; 4], server: SocketAddr) -> TcpStream {
    let mut stream = connect_from(source, server).await;
    send_csm(&mut stream).await;
    stream
}

/// The signal that ends what the server sent on `stream` (after its CSM), if any;
/// waits at most a second for the server to close it.
async fn last_signal<S: AsyncRead + Unpin>(stream: &mut S) -> Option<Signal> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while let Ok(Ok(n @ 1..)) =
        tokio::time::timeout(Duration::from_secs(1), stream.read(&mut chunk)).await
    {
        buf.extend_from_slice(&chunk[..n]);
    }
    let mut last = None;
    let mut rest = &buf[..];
    while let Ok(Some((m, used))) = decode_tcp(rest, usize::MAX) {
        if m.code != signal_code::CSM {
            last = Signal::from_message(&m).ok();
        }
        rest = &rest[used..];
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_of_a_few_addresses_give_way_to_a_new_address() {
    // Issue 28's attack, scaled down: four addresses open their budget each of
    // connections that complete CSM and stay silent, filling the listener.
    let limits = TcpServerLimits {
        max_connections: 16,
        max_connections_per_ip: 4,
        ..TcpServerLimits::default()
    };
    let server = hello()
        .tcp_limits(limits)
        .listen(Scheme::CoapTcp, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::CoapTcp).unwrap();
    let open = || counter(&server, "cobalt_connections_open", "tcp");
    let evicted = || counter(&server, "cobalt_connections_evicted_total", "tcp");
    let mut attackers = Vec::new();
    for a in 2..6u8 {
        for _ in 0..4 {
            attackers.push(idle_after_csm([127, 0, 0, a], addr).await);
        }
    }
    stream::eventually("the listener full", || open() == 16).await;
    // A fifth attacker address is no better off than a legitimate one, but the
    // attackers already there cannot hold more than their budget.
    let mut extra = connect_from(ATTACKER, addr).await;
    assert!(
        matches!(last_signal(&mut extra).await, Some(Signal::Abort { .. })),
        "over its budget, the address is refused with an Abort"
    );
    // Clients from another address, each on a new connection, are served: each takes
    // the place of an idle attacker connection.
    for _ in 0..5 {
        let r = Client::new()
            .get(&format!("coap+tcp://{addr}/hello"))
            .await
            .unwrap();
        assert_eq!(
            (r.code, r.text_payload().as_str()),
            (Code::CONTENT, "hello")
        );
    }
    assert!(evicted() >= 1, "{} evicted", evicted());
    assert!(open() <= 16, "{} open: the listener never grows", open());
    // The evicted connections were told why with an Abort, then closed.
    let mut reads = tokio::task::JoinSet::new();
    for mut stream in attackers {
        reads.spawn(async move { last_signal(&mut stream).await });
    }
    let mut told = 0;
    while let Some(signal) = reads.join_next().await {
        if let Some(Signal::Abort { diagnostic, .. }) = signal.unwrap() {
            assert!(diagnostic.contains("evicted"), "{diagnostic}");
            told += 1;
        }
    }
    assert_eq!(told, evicted(), "every evicted connection got an Abort");
    assert_eq!(
        counter(&server, "cobalt_connections_refused_total", "tcp"),
        0,
        "no legitimate connection was refused"
    );
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tls_connections_give_way_to_a_new_address_with_an_abort() {
    // The same over TLS: the attackers complete the handshake and their CSM, then idle.
    let limits = TcpServerLimits {
        max_connections: 6,
        max_connections_per_ip: 3,
        ..TcpServerLimits::default()
    };
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = hello()
        .psk(PskStore::new().with("alice", "secretPSK"))
        .tcp_limits(limits)
        .listen(Scheme::CoapsTcp, any)
        .shards(1)
        .bind(any)
        .await
        .unwrap();
    let tls = server.local_addr(Scheme::CoapsTcp).unwrap();
    let open = || counter(&server, "cobalt_connections_open", "tls");
    let auth = ClientCredentials::Psk(ClientPsk::new("alice", "secretPSK"));
    let connector = TlsConnector::new(Some(&auth), Alpn::Coap).unwrap();
    let mut attackers = Vec::new();
    for a in [2u8, 3] {
        for _ in 0..3 {
            let stream = connect_from([127, 0, 0, a], tls).await;
            let mut stream = connector.connect(stream, "127.0.0.1", tls).await.unwrap();
            send_csm(&mut stream).await;
            attackers.push(stream);
        }
    }
    stream::eventually("the listener full", || open() == 6).await;
    for _ in 0..2 {
        let r = Client::new()
            .with_psk("alice", "secretPSK")
            .get(&format!("coaps+tcp://{tls}/hello"))
            .await
            .unwrap();
        assert_eq!(r.code, Code::CONTENT);
    }
    let evicted = counter(&server, "cobalt_connections_evicted_total", "tls");
    assert!(evicted >= 1, "{evicted} evicted");
    let mut reads = tokio::task::JoinSet::new();
    for mut stream in attackers {
        reads.spawn(async move { last_signal(&mut stream).await });
    }
    let mut told = 0;
    while let Some(signal) = reads.join_next().await {
        if let Some(Signal::Abort { diagnostic, .. }) = signal.unwrap() {
            assert!(diagnostic.contains("evicted"), "{diagnostic}");
            told += 1;
        }
    }
    assert_eq!(
        told, evicted,
        "every evicted connection got an Abort over TLS"
    );
    assert_eq!(
        counter(&server, "cobalt_connections_refused_total", "tls"),
        0
    );
    server.shutdown(Duration::ZERO).await;
}

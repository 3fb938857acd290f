use super::*;
use cobalt_proto::endpoint::{Endpoint, EndpointConfig, Event};
use cobalt_proto::message::{decode, encode, Code, MessageType, TcpMessage};
use cobalt_proto::session::stream::Connection;
use cobalt_proto::tcp_connection::{TcpConfig, TcpConnection, TcpEvent};
use tokio::sync::{mpsc, oneshot};

/// Words errors as the datagram driver does, and closed connections as a shutdown.
struct Plain;

impl ExchangeErrors for Plain {
    fn refused(&self, _peer: SocketAddr, _what: &str, _error: SessionError) -> Error {
        Error::TooManyRequests
    }

    fn closed(&self, _peer: SocketAddr, _reason: CloseReason) -> Error {
        Error::Shutdown
    }
}

fn server_addr() -> SocketAddr {
    "192.0.2.7:5683".parse().unwrap()
}

fn client_addr() -> SocketAddr {
    "192.0.2.1:40000".parse().unwrap()
}

fn get(observe: Option<u32>) -> Message {
    let mut m = Message::new(MessageType::Confirmable, Code::GET, 0);
    m.options.set_uri_path("temp");
    if let Some(o) = observe {
        m.options.set_uint(opt::OBSERVE, o);
    }
    m
}

fn content(observe: Option<u32>) -> Message {
    let mut m = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
    if let Some(o) = observe {
        m.options.set_uint(opt::OBSERVE, o);
    }
    m.payload = b"21.5".to_vec();
    m
}

/// Moves the client endpoint's datagrams to the server and returns the requests the
/// server saw.
fn to_server(client: &mut Endpoint, server: &mut Endpoint, now: Instant) -> Vec<Event> {
    while let Some(t) = client.poll_transmit() {
        server.handle_datagram(now, client_addr(), &t.bytes);
    }
    std::iter::from_fn(|| server.poll_event()).collect()
}

/// Moves the server endpoint's datagrams to the client and hands the client's events
/// to `exchanges`; returns the events it gave back.
fn to_client(
    server: &mut Endpoint,
    client: &mut Endpoint,
    exchanges: &mut Exchanges<Plain>,
    now: Instant,
) -> Vec<SessionEvent> {
    while let Some(t) = server.poll_transmit() {
        client.handle_datagram(now, server_addr(), &t.bytes);
    }
    let events: Vec<SessionEvent> = std::iter::from_fn(|| Session::poll_event(client)).collect();
    events
        .into_iter()
        .filter_map(|e| exchanges.on_event(client, now, e))
        .collect()
}

#[test]
fn a_datagram_response_goes_to_its_caller_and_a_timeout_fails_the_request() {
    let now = Instant::now();
    let (mut client, mut server) = (
        Endpoint::new(EndpointConfig::default(), now),
        Endpoint::new(EndpointConfig::default(), now),
    );
    let mut exchanges = Exchanges::new(Plain);
    let (tx, mut rx) = oneshot::channel();
    let request = Command::Request {
        key: 1,
        peer: server_addr(),
        message: get(None),
        reply: ReplyTo::Once(tx),
    };
    assert!(exchanges.command(&mut client, now, request).is_none());
    let Some(Event::Request { id, .. }) = to_server(&mut client, &mut server, now).pop() else {
        panic!("the server saw no request");
    };
    server.respond(now, id, content(None)).unwrap();
    assert!(to_client(&mut server, &mut client, &mut exchanges, now).is_empty());
    let answer = rx.try_recv().unwrap().unwrap();
    assert_eq!(
        (answer.code, answer.payload.as_slice()),
        (Code::CONTENT, &b"21.5"[..])
    );
    assert!(exchanges.is_empty());

    // Unanswered: the endpoint gives up after its retransmissions, in virtual time.
    let (tx, mut rx) = oneshot::channel();
    let request = Command::Request {
        key: 2,
        peer: server_addr(),
        message: get(None),
        reply: ReplyTo::Once(tx),
    };
    exchanges.command(&mut client, now, request);
    let mut at = now;
    while let Some(t) = client.poll_timeout().filter(|_| !exchanges.is_empty()) {
        at = t;
        client.handle_timeout(at);
        while client.poll_transmit().is_some() {}
        let events: Vec<SessionEvent> =
            std::iter::from_fn(|| Session::poll_event(&mut client)).collect();
        for e in events {
            exchanges.on_event(&mut client, at, e);
        }
    }
    assert!(at > now, "the request must have been retransmitted first");
    assert!(matches!(
        rx.try_recv().unwrap(),
        Err(Error::Timeout { peer, .. }) if peer == server_addr()
    ));
}

/// The request the client endpoint sent last.
fn sent(client: &mut Endpoint) -> Message {
    let t = std::iter::from_fn(|| client.poll_transmit())
        .last()
        .expect("a datagram was sent");
    decode(&t.bytes).unwrap()
}

#[test]
fn a_datagram_observation_is_deregistered_with_its_token_and_a_plain_get_once_it_ended() {
    let now = Instant::now();
    let mut client = Endpoint::new(EndpointConfig::default(), now);
    let mut exchanges = Exchanges::new(Plain);
    let (tx, mut notifications) = mpsc::channel(4);
    let register = Command::Request {
        key: 7,
        peer: server_addr(),
        message: get(Some(0)),
        reply: ReplyTo::Stream(tx),
    };
    exchanges.command(&mut client, now, register);
    let request = sent(&mut client);
    let mut notification = content(Some(1));
    (notification.mid, notification.token) = (request.mid, request.token);
    client.handle_datagram(now, server_addr(), &encode(&notification));
    let events: Vec<SessionEvent> =
        std::iter::from_fn(|| Session::poll_event(&mut client)).collect();
    for e in events {
        exchanges.on_event(&mut client, now, e);
    }
    let first = notifications.try_recv().unwrap().unwrap();
    assert_eq!(first.options.observe(), Some(1));
    assert!(!exchanges.is_empty(), "the relation stays registered");

    let (tx, mut answer) = oneshot::channel();
    let deregister = Command::Deregister {
        key: 7,
        peer: server_addr(),
        message: get(Some(1)),
        reply: ReplyTo::Once(tx),
    };
    exchanges.command(&mut client, now, deregister);
    let deregistration = sent(&mut client);
    assert_eq!(deregistration.token, request.token);
    assert_eq!(deregistration.options.observe(), Some(1));

    let mut last = content(None);
    (last.mid, last.token) = (deregistration.mid, deregistration.token);
    client.handle_datagram(now, server_addr(), &encode(&last));
    let events: Vec<SessionEvent> =
        std::iter::from_fn(|| Session::poll_event(&mut client)).collect();
    for e in events {
        exchanges.on_event(&mut client, now, e);
    }
    assert_eq!(answer.try_recv().unwrap().unwrap().code, Code::CONTENT);
    assert!(exchanges.is_empty());

    // Deregistering a relation that is gone sends the GET under a token of its own.
    let (tx, _answer) = oneshot::channel();
    let late = Command::Deregister {
        key: 99,
        peer: server_addr(),
        message: get(Some(1)),
        reply: ReplyTo::Once(tx),
    };
    exchanges.command(&mut client, now, late);
    assert_ne!(sent(&mut client).token, request.token);
}

/// Moves bytes between a client session and a server connection until both are quiet;
/// returns the server's events.
fn pump(client: &mut Connection, server: &mut TcpConnection, now: Instant) -> Vec<TcpEvent> {
    let mut seen = Vec::new();
    loop {
        let mut moved = false;
        while let Some(b) = client.connection_mut().poll_transmit() {
            server.handle_bytes(now, &b);
            moved = true;
        }
        while let Some(b) = server.poll_transmit() {
            client.connection_mut().handle_bytes(now, &b);
            moved = true;
        }
        seen.extend(std::iter::from_fn(|| server.poll_event()));
        if !moved {
            return seen;
        }
    }
}

#[test]
fn a_stream_observation_whose_observer_is_gone_is_deregistered_at_the_server() {
    let now = Instant::now();
    let mut client = Connection::new(server_addr(), TcpConnection::new(TcpConfig::default(), now));
    let mut server = TcpConnection::new(TcpConfig::default(), now);
    let mut exchanges = Exchanges::new(Plain);
    let (tx, notifications) = mpsc::channel(4);
    let register = Command::Request {
        key: 3,
        peer: server_addr(),
        message: get(Some(0)),
        reply: ReplyTo::Stream(tx),
    };
    exchanges.command(&mut client, now, register);
    let token = pump(&mut client, &mut server, now)
        .into_iter()
        .find_map(|e| match e {
            TcpEvent::Request { token, .. } => Some(token),
            _ => None,
        })
        .expect("the server saw the registration");
    // The observer goes away before the first notification arrives.
    drop(notifications);
    server
        .respond(now, token, TcpMessage::from(content(Some(1))))
        .unwrap();
    pump(&mut client, &mut server, now);
    let events: Vec<SessionEvent> = std::iter::from_fn(|| client.poll_event()).collect();
    for e in events {
        exchanges.on_event(&mut client, now, e);
    }
    assert!(exchanges.is_empty());
    let deregistration = pump(&mut client, &mut server, now)
        .into_iter()
        .find_map(|e| match e {
            TcpEvent::Request { token, message } => Some((token, message)),
            _ => None,
        })
        .expect("a stream has no RST: the client must deregister");
    assert_eq!(deregistration.0, token);
    assert_eq!(deregistration.1.options.get_uint(opt::OBSERVE), Some(1));
}

#[test]
fn a_closed_transport_fails_every_request_and_observation() {
    let now = Instant::now();
    let mut client = Endpoint::new(EndpointConfig::default(), now);
    let mut exchanges = Exchanges::new(Plain);
    let (once, mut answer) = oneshot::channel();
    let (stream, mut notifications) = mpsc::channel(4);
    for (key, message, reply) in [
        (1, get(None), ReplyTo::Once(once)),
        (2, get(Some(0)), ReplyTo::Stream(stream)),
    ] {
        let request = Command::Request {
            key,
            peer: server_addr(),
            message,
            reply,
        };
        exchanges.command(&mut client, now, request);
    }
    exchanges.fail_all(&mut client, now, |_| Error::Shutdown);
    assert!(exchanges.is_empty());
    assert!(matches!(answer.try_recv(), Ok(Err(Error::Shutdown))));
    assert!(matches!(notifications.try_recv(), Ok(Err(Error::Shutdown))));
}

use super::*;
use crate::runtime::notifications;
use cobalt_proto::endpoint::{Endpoint, EndpointConfig, Event};
use cobalt_proto::message::{decode, encode, Code, MessageType, TcpMessage};
use cobalt_proto::session::stream::Connection;
use cobalt_proto::tcp_connection::{TcpConfig, TcpConnection, TcpEvent};
use tokio::sync::oneshot;

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

/// A request command for the server under `key`.
fn request(key: u64, message: Message, reply: ReplyTo) -> Command {
    Command::Request {
        key,
        peer: server_addr(),
        message,
        reply,
    }
}

/// The deregistration (a GET with Observe=1) of observation `key`.
fn deregister(key: u64, reply: ReplyTo) -> Command {
    Command::Deregister {
        key,
        peer: server_addr(),
        message: get(Some(1)),
        reply,
    }
}

/// Hands every event of `session` to `exchanges`; returns those it gave back.
fn hand_over<S: Session>(
    session: &mut S,
    exchanges: &mut Exchanges<Plain>,
    now: Instant,
) -> Vec<SessionEvent> {
    let events: Vec<SessionEvent> = std::iter::from_fn(|| session.poll_event()).collect();
    events
        .into_iter()
        .filter_map(|e| exchanges.on_event(session, now, e))
        .collect()
}

/// The server answers `request` (sent by `client`) with `response`.
fn answer(client: &mut Endpoint, request: &Message, mut response: Message, now: Instant) {
    (response.mid, response.token) = (request.mid, request.token.clone());
    client.handle_datagram(now, server_addr(), &encode(&response));
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
    hand_over(client, exchanges, now)
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
    let get_temp = request(1, get(None), ReplyTo::Once(tx));
    assert!(exchanges.command(&mut client, now, get_temp).is_none());
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
    let unanswered = request(2, get(None), ReplyTo::Once(tx));
    exchanges.command(&mut client, now, unanswered);
    let mut at = now;
    while let Some(t) = client.poll_timeout().filter(|_| !exchanges.is_empty()) {
        at = t;
        client.handle_timeout(at);
        while client.poll_transmit().is_some() {}
        hand_over(&mut client, &mut exchanges, at);
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
    let (tx, mut notifications) = notifications::queue(4);
    let register = request(7, get(Some(0)), ReplyTo::Stream(tx));
    exchanges.command(&mut client, now, register);
    let registration = sent(&mut client);
    answer(&mut client, &registration, content(Some(1)), now);
    hand_over(&mut client, &mut exchanges, now);
    let first = notifications.try_recv().unwrap().unwrap();
    assert_eq!(first.options.observe(), Some(1));
    assert!(!exchanges.is_empty(), "the relation stays registered");

    let (tx, mut answered) = oneshot::channel();
    exchanges.command(&mut client, now, deregister(7, ReplyTo::Once(tx)));
    let deregistration = sent(&mut client);
    assert_eq!(deregistration.token, registration.token);
    assert_eq!(deregistration.options.observe(), Some(1));

    answer(&mut client, &deregistration, content(None), now);
    hand_over(&mut client, &mut exchanges, now);
    assert_eq!(answered.try_recv().unwrap().unwrap().code, Code::CONTENT);
    assert!(exchanges.is_empty());

    // Deregistering a relation that is gone sends the GET under a token of its own.
    let (tx, _answer) = oneshot::channel();
    exchanges.command(&mut client, now, deregister(99, ReplyTo::Once(tx)));
    assert_ne!(sent(&mut client).token, registration.token);
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
    let (tx, notifications) = notifications::queue(4);
    let register = request(3, get(Some(0)), ReplyTo::Stream(tx));
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
        .respond(now, token.clone(), TcpMessage::from(content(Some(1))))
        .unwrap();
    pump(&mut client, &mut server, now);
    hand_over(&mut client, &mut exchanges, now);
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
    let (stream, mut notifications) = notifications::queue(4);
    for (key, message, reply) in [
        (1, get(None), ReplyTo::Once(once)),
        (2, get(Some(0)), ReplyTo::Stream(stream)),
    ] {
        exchanges.command(&mut client, now, request(key, message, reply));
    }
    exchanges.fail_all(&mut client, now, |_| Error::Shutdown);
    assert!(exchanges.is_empty());
    assert!(matches!(answer.try_recv(), Ok(Err(Error::Shutdown))));
    assert!(matches!(
        notifications.try_recv(),
        Some(Err(Error::Shutdown))
    ));
}

/// Requests are found by the caller's key and by the session's id alike while many
/// come and go (the id index holds only keys).
#[test]
fn requests_are_found_by_key_and_by_id_while_many_come_and_go() {
    let now = Instant::now();
    let config = EndpointConfig {
        max_client_exchanges: 1000,
        ..EndpointConfig::default()
    };
    let mut client = Endpoint::new(config, now);
    let mut exchanges = Exchanges::new(Plain);
    let mut queues = Vec::new();
    for key in 1..=200 {
        let (tx, rx) = notifications::queue(1);
        queues.push(rx);
        exchanges.command(
            &mut client,
            now,
            request(key, get(Some(0)), ReplyTo::Stream(tx)),
        );
    }
    for key in (1..=200).step_by(2) {
        exchanges.command(&mut client, now, Command::Cancel { key });
    }
    assert_eq!((exchanges.pending.len(), exchanges.by_id.len()), (100, 100));
    for (key, pending) in &exchanges.pending {
        assert_eq!(key % 2, 0);
        assert_eq!(exchanges.key_of(&pending.outbound()), Some(*key));
        assert_eq!(client.peer_of(&pending.outbound()), Some(server_addr()));
    }
    exchanges.fail_all(&mut client, now, |_| Error::Shutdown);
    assert!(exchanges.is_empty() && exchanges.by_id.is_empty());
}

/// A client may hold an observation per server for thousands of servers: each one's
/// record here stays small (the session's id and where the answers go: no copy of
/// the peer, what ends a stream's observation kept with its token).
#[test]
fn a_request_record_is_small() {
    let size = std::mem::size_of::<Pending>();
    assert!(size <= 32, "a request's record grew to {size} bytes");
}

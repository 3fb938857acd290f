//! One role over both sessions, sans-IO: the same resource tree answered, sliced and
//! observed over the datagram endpoint and over a stream connection. What differs
//! (block sizes, BERT, confirmable notifications) is the session's.

use super::*;
use crate::server::layer::Front;
use crate::server::{get, observe::Observable, ResourceTree, Routes};
use cobalt_proto::endpoint::{Endpoint, EndpointConfig};
use cobalt_proto::message::{codec, MessageType, TcpMessage, Token};
use cobalt_proto::session::stream::Connection;
use cobalt_proto::tcp_connection::{TcpConfig, TcpConnection, TcpEvent};
use std::collections::HashMap;

/// Bytes of `/big`: three 1024-byte blocks, the last one short.
const BIG: usize = 3000;

fn peer() -> SocketAddr {
    "10.0.0.1:5683".parse().unwrap()
}

/// `/big`, observable through `obs`, answering `BIG` bytes of the state's digit.
fn tree(obs: &Observable, state: &Arc<AtomicU64>) -> ResourceTree {
    let mut tree = ResourceTree::new();
    let state = state.clone();
    let big = get(move || {
        let digit = b'0' + (state.load(Ordering::Relaxed) % 10) as u8;
        async move { vec![digit; BIG] }
    })
    .observable(obs);
    tree.insert("/big", big);
    tree
}

/// A GET of `/big`: registering with Observe=0 when `observe`, asking for block `num`
/// of 1024 bytes when given.
fn get_big(token: u8, observe: bool, num: Option<u32>) -> Message {
    let mut m = Message::new(MessageType::Confirmable, Code::GET, u16::from(token));
    m.token = Token::new(&[token]).unwrap();
    m.options.set_uri_path("/big");
    if observe {
        m.options.set_uint(opt::OBSERVE, 0);
    }
    if let Some(num) = num {
        let block = BlockValue {
            num,
            more: false,
            szx: 6,
        };
        m.options.set_uint(opt::BLOCK2, block.encode());
    }
    m
}

/// The Block2 option of `m` as (num, more, size in bytes).
fn block2(m: &Message) -> Option<(u32, bool, usize)> {
    m.block2().map(|b| (b.num, b.more, b.size()))
}

#[test]
fn a_shard_role_answers_slices_and_notifies_over_the_endpoint() {
    let now = Instant::now();
    let (obs, state) = (Observable::new(), Arc::new(AtomicU64::new(1)));
    let inbox = Arc::new(ChangeInbox::default());
    obs.attach(vec![inbox.clone()]);
    let (done, _back) = mpsc::unbounded_channel();
    let mut role = ShardRole::for_shard(
        Routes::new(tree(&obs, &state), None).serve(),
        ServerLimits::default(),
        inbox,
        done,
        None,
        Front::plain(Scheme::Coap),
    );
    let config = EndpointConfig {
        amplification_factor: 0,
        ..EndpointConfig::default()
    };
    let mut ep = Endpoint::new(config, now);
    let exchange = |ep: &mut Endpoint, role: &mut ShardRole, request: Message| {
        ep.handle_datagram(now, peer(), &codec::encode(&request));
        while let Some(event) = Session::poll_event(ep) {
            if let SessionEvent::Request { id, peer, request } = event {
                role.on_request(ep, now, id, peer, None, request);
            }
        }
        let sent = ep.poll_transmit().expect("an answer");
        codec::decode(&sent.bytes).unwrap()
    };
    // The first block of 1024 bytes, with the observation registered.
    let first = exchange(&mut ep, &mut role, get_big(1, true, None));
    assert_eq!(first.code, Code::CONTENT);
    assert_eq!(block2(&first), Some((0, true, 1024)));
    assert_eq!(first.payload, vec![b'1'; 1024]);
    assert!(first.options.observe().is_some());
    assert_eq!(Service::<Endpoint>::observer_count(&role), 1);
    // The last block, asked for without Observe under another token.
    let last = exchange(&mut ep, &mut role, get_big(2, false, Some(2)));
    assert_eq!(block2(&last), Some((2, false, 1024)));
    assert_eq!(last.payload.len(), BIG - 2048);
    // A change: the notification carries the new state's first block.
    state.store(2, Ordering::Relaxed);
    obs.changed();
    Service::<Endpoint>::take_changes(&mut role);
    while Service::<Endpoint>::has_work(&role) {
        role.step(&mut ep, now);
    }
    let note = codec::decode(&ep.poll_transmit().expect("a notification").bytes).unwrap();
    assert_eq!(note.token, first.token);
    assert!(note.options.observe() > first.options.observe());
    assert_eq!(block2(&note), Some((0, true, 1024)));
    assert_eq!(note.payload, vec![b'2'; 1024]);
    drop(role);
    assert_eq!(obs.observer_count(), 0, "the relation ends with the role");
}

/// Moves the bytes between a server `Connection` and a client until both are quiet.
fn pump(now: Instant, server: &mut Connection, client: &mut TcpConnection) {
    loop {
        let mut moved = false;
        while let Some(bytes) = server.connection_mut().poll_transmit() {
            client.handle_bytes(now, &bytes);
            moved = true;
        }
        while let Some(bytes) = client.poll_transmit() {
            server.connection_mut().handle_bytes(now, &bytes);
            moved = true;
        }
        if !moved {
            return;
        }
    }
}

/// The client's next response, skipping the server's CSM.
fn response(client: &mut TcpConnection) -> Message {
    loop {
        match client.poll_event().expect("a response") {
            TcpEvent::Response { message, .. } => return Message::from(message),
            TcpEvent::PeerSettings { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// The role of one connection whose ends announce `config`, and the two ends.
fn connection(
    config: &TcpConfig,
    obs: &Observable,
    state: &Arc<AtomicU64>,
) -> (ConnectionRole, Connection, TcpConnection) {
    let now = Instant::now();
    let shared = StreamShared::new(
        Routes::new(tree(obs, state), None),
        ServerLimits::default(),
        config.block_wise_transfer,
        8192,
        Front::plain(Scheme::CoapTcp),
    );
    let (done, _back) = mpsc::unbounded_channel();
    let role = ConnectionRole::for_connection(&shared, peer(), done);
    let server = Connection::new(peer(), TcpConnection::new(config.clone(), now));
    let client = TcpConnection::new(config.clone(), now);
    (role, server, client)
}

/// Sends `request` from the client and runs the role on what the server receives;
/// returns the client's response.
fn ask(
    role: &mut ConnectionRole,
    server: &mut Connection,
    client: &mut TcpConnection,
    request: Message,
) -> Message {
    let now = Instant::now();
    client.request(now, TcpMessage::from(request)).unwrap();
    pump(now, server, client);
    while let Some(event) = server.poll_event() {
        if let SessionEvent::Request { id, peer, request } = event {
            role.on_request(server, now, id, peer, None, request);
        }
    }
    pump(now, server, client);
    response(client)
}

#[test]
fn a_connection_role_answers_slices_and_notifies_over_the_stream() {
    let (obs, state) = (Observable::new(), Arc::new(AtomicU64::new(1)));
    // RFC 8323's base Max-Message-Size (1152 bytes), no BERT: blocks of 1024.
    let small = TcpConfig {
        max_message_size: 1152,
        block_wise_transfer: false,
        ..TcpConfig::default()
    };
    let (mut role, mut server, mut client) = connection(&small, &obs, &state);
    let first = ask(&mut role, &mut server, &mut client, get_big(1, true, None));
    assert_eq!(first.code, Code::CONTENT);
    assert_eq!(block2(&first), Some((0, true, 1024)));
    assert!(first.options.observe().is_some());
    assert_eq!(
        obs.subscribers(),
        1,
        "the connection subscribes while it observes"
    );
    let last = ask(
        &mut role,
        &mut server,
        &mut client,
        get_big(2, false, Some(2)),
    );
    assert_eq!(last.payload.len(), BIG - 2048);
    // A change reaches the connection's inbox; the notification is its first block.
    state.store(2, Ordering::Relaxed);
    obs.changed();
    let now = Instant::now();
    Service::<Connection>::take_changes(&mut role);
    while Service::<Connection>::has_work(&role) {
        role.step(&mut server, now);
    }
    pump(now, &mut server, &mut client);
    let note = response(&mut client);
    assert!(note.options.observe() > first.options.observe());
    assert_eq!(block2(&note), Some((0, true, 1024)));
    assert_eq!(note.payload, vec![b'2'; 1024]);
    drop(role);
    assert_eq!((obs.observer_count(), obs.subscribers()), (0, 0));

    // Both ends announce a large Max-Message-Size (and BERT): the whole body at once.
    let large = TcpConfig::default();
    let (mut role, mut server, mut client) = connection(&large, &obs, &state);
    let whole = ask(&mut role, &mut server, &mut client, get_big(3, false, None));
    assert_eq!((block2(&whole), whole.payload.len()), (None, BIG));

    // Both ends announce BERT, the body does not fit: a BERT block of two units.
    let bert = TcpConfig {
        max_message_size: 2200,
        block_wise_transfer: true,
        ..TcpConfig::default()
    };
    let (mut role, mut server, mut client) = connection(&bert, &obs, &state);
    let block = ask(&mut role, &mut server, &mut client, get_big(4, false, None));
    assert_eq!(block.block2().map(|b| (b.szx, b.more)), Some((7, true)));
    assert_eq!(block.payload.len(), 2048);
}

/// A registration of `/big` under `token` from a datagram peer.
fn register_big(token: u16) -> Message {
    let mut m = Message::new(MessageType::Confirmable, Code::GET, token);
    m.token = Token::new(&token.to_be_bytes()).unwrap();
    m.options.set_uri_path("/big");
    m.options.set_uint(opt::OBSERVE, 0);
    m
}

/// Feeds the endpoint's events to the role.
fn serve(ep: &mut Endpoint, role: &mut ShardRole, now: Instant) {
    while let Some(event) = Session::poll_event(ep) {
        match event {
            SessionEvent::Request { id, peer, request } => {
                role.on_request(ep, now, id, peer, None, request)
            }
            other => Service::<Endpoint>::on_event(role, other),
        }
    }
}

/// What the endpoint sent to `to` (everything else is dropped: forged addresses).
fn sent_to(ep: &mut Endpoint, to: SocketAddr) -> Vec<Message> {
    std::iter::from_fn(|| ep.poll_transmit())
        .filter(|t| t.peer == to)
        .map(|t| codec::decode(&t.bytes).unwrap())
        .collect()
}

/// A client at `from` registers with `token` and answers the address check (a ping
/// it rejects with RST, RFC 9175 §2.4); returns the answer it gets.
fn register_verified(
    ep: &mut Endpoint,
    role: &mut ShardRole,
    now: Instant,
    from: SocketAddr,
    token: u16,
) -> Message {
    ep.handle_datagram(now, from, &codec::encode(&register_big(token)));
    serve(ep, role, now);
    let ping = sent_to(ep, from).pop().expect("a ping");
    assert_eq!(
        (ping.mtype, ping.code),
        (MessageType::Confirmable, Code::EMPTY)
    );
    ep.handle_datagram(now, from, &codec::encode(&Message::reset(ping.mid)));
    serve(ep, role, now);
    sent_to(ep, from).pop().expect("the registration's answer")
}

#[test]
fn registrations_from_unverified_addresses_hold_no_observer_slot() {
    let now = Instant::now();
    let (obs, state) = (Observable::new(), Arc::new(AtomicU64::new(1)));
    let inbox = Arc::new(ChangeInbox::default());
    obs.attach(vec![inbox.clone()]);
    let (done, _back) = mpsc::unbounded_channel();
    let tree = tree(&obs, &state);
    let limits = ServerLimits {
        max_observers: 8,
        max_observers_per_ip: 2,
        ..ServerLimits::default()
    };
    let mut role = ShardRole::for_shard(
        Routes::new(tree.clone(), None).serve(),
        limits,
        inbox,
        done,
        None,
        Front::plain(Scheme::Coap),
    );
    let mut ep = Endpoint::new(EndpointConfig::default(), now);
    // A legitimate observer proves its address and is registered.
    let first = register_verified(&mut ep, &mut role, now, peer(), 1);
    assert_eq!(first.code, Code::CONTENT);
    assert!(first.options.observe().is_some());
    assert_eq!(Service::<Endpoint>::observer_count(&role), 1);
    // A burst of registrations from 500 forged addresses (nobody answers the pings),
    // two per address: none takes a relation or a place in the budget.
    for i in 0..500u16 {
        let forged = SocketAddr::from(([10, 9, (i >> 8) as u8, i as u8], 5683));
        for token in [100, 101] {
            ep.handle_datagram(now, forged, &codec::encode(&register_big(token)));
        }
    }
    serve(&mut ep, &mut role, now);
    let _ = sent_to(&mut ep, peer());
    assert_eq!(Service::<Endpoint>::observer_count(&role), 1);
    assert_eq!(tree.budgets().observers.total(), 1);
    assert!(role.observers.awaiting() > 0);
    // Another client registers during the burst and is served.
    let other: SocketAddr = "10.0.0.2:5683".parse().unwrap();
    let second = register_verified(&mut ep, &mut role, now, other, 2);
    assert_eq!(second.code, Code::CONTENT, "{second:?}");
    assert!(second.options.observe().is_some());
    assert_eq!(Service::<Endpoint>::observer_count(&role), 2);
    assert_eq!(tree.budgets().observers.total(), 2);
    // The address checks fail: nothing of the burst is left.
    let later = now + std::time::Duration::from_secs(120);
    let mut t = now;
    while let Some(next) = ep.poll_timeout().filter(|t| *t <= later) {
        t = next.max(t);
        ep.handle_timeout(t);
        serve(&mut ep, &mut role, t);
        while ep.poll_transmit().is_some() {}
    }
    assert_eq!(role.observers.awaiting(), 0);
    assert_eq!(Service::<Endpoint>::observer_count(&role), 2);
    assert_eq!(tree.budgets().observers.total(), 2);
}

/// One change of `/big` observed `observations` times by each of `peers` clients
/// (verified addresses): of the notifications the shard sends, how many go out
/// confirmable, and how many in all (each counted once, whatever its retransmissions
/// or the time the NON pacing holds it).
fn confirmable_notifications(
    congestion: cobalt_proto::congestion::Algorithm,
    peers: u16,
    observations: u16,
) -> (usize, usize) {
    let t0 = Instant::now();
    let (obs, state) = (Observable::new(), Arc::new(AtomicU64::new(1)));
    let inbox = Arc::new(ChangeInbox::default());
    obs.attach(vec![inbox.clone()]);
    let (done, _back) = mpsc::unbounded_channel();
    let mut role = ShardRole::for_shard(
        Routes::new(tree(&obs, &state), None).serve(),
        ServerLimits::default(),
        inbox,
        done,
        None,
        Front::plain(Scheme::Coap),
    );
    let config = EndpointConfig {
        amplification_factor: 0,
        congestion_control: congestion,
        ..EndpointConfig::default()
    };
    let mut ep = Endpoint::new(config, t0);
    let clients: Vec<SocketAddr> = (0..peers)
        .map(|p| SocketAddr::from(([10, 0, 1, p as u8], 5683)))
        .collect();
    for from in &clients {
        for token in 0..observations {
            ep.handle_datagram(t0, *from, &codec::encode(&register_big(token)));
            serve(&mut ep, &mut role, t0);
        }
    }
    while ep.poll_transmit().is_some() {}
    assert_eq!(
        Service::<Endpoint>::observer_count(&role),
        usize::from(peers * observations)
    );
    state.store(2, Ordering::Relaxed);
    obs.changed();
    Service::<Endpoint>::take_changes(&mut role);
    while Service::<Endpoint>::has_work(&role) {
        role.step(&mut ep, t0);
    }
    // Each notification as first seen (held NONs leave later, at the pacing's rate).
    let mut first_seen: HashMap<(SocketAddr, Token), MessageType> = HashMap::new();
    let mut now = t0;
    loop {
        for t in std::iter::from_fn(|| ep.poll_transmit()) {
            let m = codec::decode(&t.bytes).unwrap();
            first_seen.entry((t.peer, m.token)).or_insert(m.mtype);
        }
        match ep.poll_timeout() {
            Some(next) if next <= t0 + std::time::Duration::from_secs(120) => {
                now = next.max(now);
                ep.handle_timeout(now);
            }
            _ => break,
        }
    }
    let con = first_seen
        .values()
        .filter(|t| **t == MessageType::Confirmable)
        .count();
    (con, first_seen.len())
}

#[test]
fn many_observations_of_one_peer_are_paced_by_confirmable_notifications() {
    use cobalt_proto::congestion::Algorithm;
    // Not paced (RFC 7252 timers, no RTO estimate): the policy alone decides, and
    // no notification is the 20th of its relation yet.
    assert_eq!(
        confirmable_notifications(Algorithm::Default, 1, 100),
        (0, 100)
    );
    // Paced (the endpoint's default, FASOR, as every algorithm with an RTO estimate;
    // CoCoA §5): NON notifications to one peer leave at most one per RTO, a few more
    // wait their turn (latest state per observation), and the rest go confirmable so
    // that the peer's ACKs pace them: 100 observations of one peer changing at once
    // give 91 confirmable notifications of 100.
    let paced = EndpointConfig::default().congestion_control;
    assert_eq!(paced, Algorithm::Fasor);
    assert_eq!(confirmable_notifications(paced, 1, 100), (91, 100));
    // The same 100 observations spread over 100 peers: only the first two messages to
    // each new peer are confirmable (at least 2 of every 16, CoCoA §5 rule 1).
    let (con, all) = confirmable_notifications(paced, 100, 1);
    assert_eq!((con, all), (100, 100), "the first message to a new peer");
}

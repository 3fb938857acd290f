//! One role over both sessions, sans-IO: the same resource tree answered, sliced and
//! observed over the datagram endpoint and over a stream connection. What differs
//! (block sizes, BERT, confirmable notifications) is the session's.

use super::*;
use crate::server::{get, observe::Observable, ResourceTree, Routes};
use cobalt_proto::endpoint::{Endpoint, EndpointConfig};
use cobalt_proto::message::{codec, MessageType, TcpMessage, Token};
use cobalt_proto::session::stream::Connection;
use cobalt_proto::tcp_connection::{TcpConfig, TcpConnection, TcpEvent};

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
                role.on_request(ep, now, id, peer, request);
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
            role.on_request(server, now, id, peer, request);
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

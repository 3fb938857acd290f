//! Q-Block1 uploads (RFC 9177) through a shard's role over the datagram endpoint, in
//! virtual time: bursts of NON blocks lost and reordered both ways, 2.31 per set,
//! 4.08 listing the missing blocks, the body handed to the handler once, and nothing
//! left behind (uploads, unanswered exchanges) when it is over or abandoned.

use super::*;
use crate::server::layer::Front;
use crate::server::{put, Request, ResourceTree, Routes};
use cobalt_proto::blockwise::qblock::{
    missing_blocks, MAX_PAYLOADS, NON_RECEIVE_TIMEOUT, Q_BLOCK1, Q_BLOCK2,
};
use cobalt_proto::endpoint::{Endpoint, EndpointConfig};
use cobalt_proto::message::{codec, MessageType, Token};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::sync::Mutex;
use std::time::Duration;

/// 64-byte blocks.
const SZX: u8 = 2;

fn client() -> SocketAddr {
    "10.0.0.7:40000".parse().unwrap()
}

/// `/up`: a PUT stores its body in `bodies` and answers 2.04; a GET answers the
/// last body stored.
fn role(bodies: &Arc<Mutex<Vec<Vec<u8>>>>, limits: ServerLimits) -> ShardRole {
    let mut tree = ResourceTree::new();
    let (stored, read) = (bodies.clone(), bodies.clone());
    tree.insert(
        "/up",
        put(move |req: Request| {
            stored.lock().unwrap().push(req.payload().to_vec());
            async { Response::new(Code::CHANGED) }
        })
        .get(move || {
            let last = read.lock().unwrap().last().cloned().unwrap_or_default();
            async move { last }
        }),
    );
    let (done, _back) = mpsc::unbounded_channel();
    ShardRole::for_shard(
        Routes::new(tree, None).serve(),
        limits,
        Arc::new(ChangeInbox::default()),
        done,
        None,
        Front::plain(Scheme::Coap),
    )
}

/// The endpoint of a shard, Q-Block1 and Q-Block2 declared handled as `Server`
/// does; the client's address counts as verified (answers larger than requests go
/// out at once).
fn endpoint(now: Instant) -> Endpoint {
    let mut config = EndpointConfig {
        amplification_factor: 0,
        ..EndpointConfig::default()
    };
    config.handled_options = config.handled_options.with(Q_BLOCK1).with(Q_BLOCK2);
    Endpoint::new(config, now)
}

/// Block `num` of `body` as a NON PUT of `/up` with Q-Block1, Request-Tag `tag`, a
/// token and message ID of its own.
fn block(body: &[u8], num: u32, tag: u8, mid: u16) -> Message {
    let size = 1usize << (SZX + 4);
    let start = num as usize * size;
    let end = (start + size).min(body.len());
    let mut m = Message::new(MessageType::NonConfirmable, Code::PUT, mid);
    m.token = Token::new(&mid.to_be_bytes()).unwrap();
    m.options.set_uri_path("/up");
    let more = end < body.len();
    m.options
        .set_uint(Q_BLOCK1, BlockValue::new(num, more, SZX).unwrap().encode());
    m.options.set(opt::REQUEST_TAG, vec![tag]);
    m.payload = body[start..end].to_vec();
    m
}

/// Feeds the endpoint's events to the role, runs its steps, and returns what went out.
fn serve(ep: &mut Endpoint, role: &mut ShardRole, now: Instant) -> Vec<Message> {
    while let Some(event) = Session::poll_event(ep) {
        match event {
            SessionEvent::Request { id, peer, request } => {
                role.on_request(ep, now, id, peer, None, request)
            }
            other => Service::<Endpoint>::on_event(role, other),
        }
    }
    while Service::<Endpoint>::has_work(role) {
        role.step(ep, now);
    }
    std::iter::from_fn(|| ep.poll_transmit())
        .map(|t| codec::decode(&t.bytes).unwrap())
        .collect()
}

/// Lets virtual time pass to `now`: the endpoint's and the role's timers fire.
fn tick(ep: &mut Endpoint, role: &mut ShardRole, now: Instant) -> Vec<Message> {
    ep.handle_timeout(now);
    Service::<Endpoint>::handle_timeout(role, now);
    serve(ep, role, now)
}

/// A client sends a body in sets of MAX_PAYLOADS NON blocks, each set shuffled, over
/// a network that loses 20% of the datagrams both ways. It goes on with the next set
/// on 2.31, sends again what a 4.08 lists, and when it hears nothing for twice
/// NON_RECEIVE_TIMEOUT sends its set's last block again (which the server answers
/// with 2.31 once the set is complete). The handler runs once with the whole body;
/// afterwards the server holds no upload and no unanswered request.
#[test]
fn a_q_block1_body_arrives_whole_through_loss_and_reordering() {
    for seed in 0..30 {
        let mut rng = StdRng::seed_from_u64(seed);
        let t0 = Instant::now();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let mut role = role(&bodies, ServerLimits::default());
        let mut ep = endpoint(t0);
        let body: Vec<u8> = (0..64 * 37 + 20).map(|i| (i % 253) as u8).collect();
        let blocks = body.len().div_ceil(64) as u32;
        let set_of = |first: u32| first..(first + MAX_PAYLOADS).min(blocks);
        let (mut now, mut mid, mut heard_at) = (t0, 0u16, t0);
        let mut set = set_of(0);
        let mut to_send: Vec<u32> = set.clone().collect();
        let (mut asked, mut done) = (0, None);
        for _round in 0..400 {
            to_send.shuffle(&mut rng);
            let mut burst = std::mem::take(&mut to_send).into_iter();
            // The answers to each datagram are heard before the next one goes (the
            // client stops once the body is taken: no block of it is left in flight).
            while done.is_none() {
                let out = match burst.next() {
                    Some(num) => {
                        mid = mid.wrapping_add(1);
                        if rng.random_bool(0.2) {
                            continue; // lost on the way
                        }
                        let bytes = codec::encode(&block(&body, num, 9, mid));
                        ep.handle_datagram(now, client(), &bytes);
                        serve(&mut ep, &mut role, now)
                    }
                    None if to_send.is_empty() => {
                        now += Duration::from_secs(1);
                        tick(&mut ep, &mut role, now)
                    }
                    None => break,
                };
                for answer in out {
                    // Answers are lost on the way back too, but for the final one:
                    // a client that missed it would send the body again.
                    if answer.code != Code::CHANGED && rng.random_bool(0.2) {
                        continue;
                    }
                    heard_at = now;
                    match answer.code {
                        Code::CONTINUE => {
                            let b = answer.options.get_uint(Q_BLOCK1).map(BlockValue::decode);
                            let next = b.flatten().unwrap().num + 1;
                            if next >= set.start {
                                set = set_of(next);
                                to_send = set.clone().collect();
                            }
                        }
                        Code::REQUEST_ENTITY_INCOMPLETE => {
                            asked += 1;
                            let missing = missing_blocks(&answer.payload).expect("a CBOR list");
                            assert!(!missing.is_empty() && missing.len() <= MAX_PAYLOADS as usize);
                            to_send.extend(missing);
                        }
                        Code::CHANGED => {
                            let echoed = answer.options.get_uint(Q_BLOCK1).map(BlockValue::decode);
                            assert_eq!(echoed.flatten().map(|b| b.more), Some(false));
                            done = Some(now);
                        }
                        other => panic!("seed {seed}: unexpected {other}"),
                    }
                }
                if to_send.is_empty()
                    && burst.len() == 0
                    && now >= heard_at + 2 * NON_RECEIVE_TIMEOUT
                {
                    to_send.push(set.end - 1);
                    heard_at = now;
                }
                if burst.len() == 0 && !to_send.is_empty() {
                    break;
                }
            }
            if done.is_some() {
                break;
            }
        }
        assert!(done.is_some(), "seed {seed}: the body never completed");
        assert_eq!(*bodies.lock().unwrap(), vec![body], "seed {seed}");
        let held = role.uploads.stats();
        assert_eq!((held.uploads, held.bytes), (0, 0), "seed {seed}");
        // Whatever 4.08 was due has gone; no request is left unanswered.
        tick(&mut ep, &mut role, now + NON_RECEIVE_TIMEOUT);
        assert_eq!(ep.state_counts().server_exchanges, 0, "seed {seed}");
        if seed == 0 {
            assert!(asked > 0, "the loss made the server ask for blocks");
        }
    }
}

/// A body whose holes never fill: the server asks once per block it kept waiting,
/// never more, and after the idle timeout it forgets the upload and withholds the
/// request it kept; other clients are served meanwhile and the handler never runs.
#[test]
fn a_q_block1_body_with_holes_that_never_fill_is_forgotten() {
    let t0 = Instant::now();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let mut role = role(&bodies, ServerLimits::default());
    let mut ep = endpoint(t0);
    let body = vec![7u8; 64 * 6 + 3];
    for (mid, num) in [(1, 0), (2, 2), (3, 6)] {
        let bytes = codec::encode(&block(&body, num, 1, mid));
        ep.handle_datagram(t0, client(), &bytes);
        assert!(
            serve(&mut ep, &mut role, t0).is_empty(),
            "held, not answered"
        );
    }
    let due = Service::<Endpoint>::poll_timeout(&role).expect("a 4.08 due");
    assert!(due <= t0 + NON_RECEIVE_TIMEOUT);
    assert!(tick(&mut ep, &mut role, due - Duration::from_millis(1)).is_empty());
    let asks = tick(&mut ep, &mut role, due);
    assert_eq!(asks.len(), 1);
    assert_eq!(asks[0].code, Code::REQUEST_ENTITY_INCOMPLETE);
    assert_eq!(asks[0].token, Token::new(&3u16.to_be_bytes()).unwrap());
    assert_eq!(missing_blocks(&asks[0].payload), Some(vec![1, 3, 4, 5]));
    // Nothing more is asked for without a new block; the others were withheld.
    assert_eq!(ep.state_counts().server_exchanges, 0);
    let mut now = due;
    for _ in 0..10 {
        now += Duration::from_secs(2);
        assert!(tick(&mut ep, &mut role, now).is_empty());
    }
    // One block more is held and asked about again.
    ep.handle_datagram(now, client(), &codec::encode(&block(&body, 1, 1, 4)));
    assert!(serve(&mut ep, &mut role, now).is_empty());
    let asks = tick(&mut ep, &mut role, now + NON_RECEIVE_TIMEOUT);
    assert_eq!(missing_blocks(&asks[0].payload), Some(vec![3, 4, 5]));
    now += NON_RECEIVE_TIMEOUT;
    // Another client's upload completes meanwhile.
    let other: SocketAddr = "10.0.0.8:1".parse().unwrap();
    let small = vec![1u8; 64 + 1];
    for (mid, num) in [(1, 1), (2, 0)] {
        ep.handle_datagram(now, other, &codec::encode(&block(&small, num, 1, mid)));
    }
    let answers = serve(&mut ep, &mut role, now);
    assert_eq!(answers.last().map(|m| m.code), Some(Code::CHANGED));
    assert_eq!(*bodies.lock().unwrap(), vec![small]);
    // Past the idle timeout the upload is gone, and nothing is left waiting.
    let idle = ServerLimits::default().uploads.upload_idle_timeout;
    let later = now + idle + idle / 2;
    tick(&mut ep, &mut role, later);
    assert_eq!(role.uploads.stats().uploads, 0);
    assert_eq!(role.uploads.stats().bytes, 0);
    assert_eq!(ep.state_counts().server_exchanges, 0);
    assert_eq!(bodies.lock().unwrap().len(), 1);
}

/// Q-Block1 uploads count in the Block1 budgets: past the uploads one address and
/// port may hold, 4.29; a body past the size limit, 4.13; Q-Block1 with Block1, or a
/// value that is no block, 4.00 — each answered, nothing kept.
#[test]
fn q_block1_uploads_are_bounded_like_block1_uploads() {
    let now = Instant::now();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let mut limits = ServerLimits::default();
    limits.uploads.max_uploads_per_peer = 2;
    limits.uploads.max_body = 64 * 4;
    let mut role = role(&bodies, limits);
    let mut ep = endpoint(now);
    let body = vec![0u8; 64 * 3];
    let mut codes = Vec::new();
    for tag in 0..3u8 {
        let mid = u16::from(tag) + 1;
        ep.handle_datagram(now, client(), &codec::encode(&block(&body, 0, tag, mid)));
        codes.extend(serve(&mut ep, &mut role, now).iter().map(|m| m.code));
    }
    assert_eq!(codes, [Code::TOO_MANY_REQUESTS]);
    assert_eq!(role.uploads.stats().uploads, 2);
    // Too large: block 5 of 64 bytes ends past the 256 bytes allowed.
    let big = vec![0u8; 64 * 6];
    ep.handle_datagram(now, client(), &codec::encode(&block(&big, 5, 0, 10)));
    let answers = serve(&mut ep, &mut role, now);
    assert_eq!(answers[0].code, Code::REQUEST_ENTITY_TOO_LARGE);
    assert_eq!(
        role.uploads.stats().uploads,
        1,
        "the refused upload is dropped"
    );
    // Q-Block1 with Block1.
    let mut both = block(&body, 0, 5, 11);
    both.options.set_uint(opt::BLOCK1, 0x0a);
    ep.handle_datagram(now, client(), &codec::encode(&both));
    assert_eq!(serve(&mut ep, &mut role, now)[0].code, Code::BAD_REQUEST);
    // A value whose block number does not fit in 20 bits.
    let mut wide = block(&body, 0, 6, 12);
    wide.options.set_uint(Q_BLOCK1, u32::MAX);
    ep.handle_datagram(now, client(), &codec::encode(&wide));
    assert_eq!(serve(&mut ep, &mut role, now)[0].code, Code::BAD_REQUEST);
    assert!(bodies.lock().unwrap().is_empty());
    // The one upload left is held with its first block; the others' requests are
    // answered or withheld.
    assert_eq!(role.uploads.stats().uploads, 1);
    assert!(tick(&mut ep, &mut role, now + NON_RECEIVE_TIMEOUT).is_empty());
}

/// Without Q-Block1 declared handled (a connection, or an endpoint set up without
/// it), a request with it still gets 4.02 as RFC 9177 has a client expect.
#[test]
fn q_block1_is_refused_where_it_is_not_declared() {
    let now = Instant::now();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let mut role = role(&bodies, ServerLimits::default());
    let mut ep = Endpoint::new(EndpointConfig::default(), now);
    let body = vec![0u8; 100];
    ep.handle_datagram(now, client(), &codec::encode(&block(&body, 0, 0, 1)));
    let answers = serve(&mut ep, &mut role, now);
    assert_eq!(answers[0].code, Code::BAD_OPTION);
}

/// A GET with Q-Block2 whose answer fits in the block asked for gets it whole with
/// Q-Block2 (how libcoap probes for Q-Block support before it uploads with Q-Block1);
/// a longer answer comes in Block2 blocks.
#[test]
fn q_block2_requests_get_one_block_in_q_block2_and_more_in_block2() {
    let now = Instant::now();
    let bodies = Arc::new(Mutex::new(vec![vec![5u8; 40]]));
    let mut role = role(&bodies, ServerLimits::default());
    let mut ep = endpoint(now);
    let get = |mid: u16| {
        let mut m = Message::new(MessageType::Confirmable, Code::GET, mid);
        m.token = Token::new(&mid.to_be_bytes()).unwrap();
        m.options.set_uri_path("/up");
        m.options
            .set_uint(Q_BLOCK2, BlockValue::new(0, false, SZX).unwrap().encode());
        m
    };
    ep.handle_datagram(now, client(), &codec::encode(&get(1)));
    let one = serve(&mut ep, &mut role, now).remove(0);
    assert_eq!(one.code, Code::CONTENT);
    assert_eq!(one.payload, vec![5u8; 40]);
    let q = one.options.get_uint(Q_BLOCK2).and_then(BlockValue::decode);
    assert_eq!(q.map(|b| (b.num, b.more, b.szx)), Some((0, false, SZX)));
    assert!(one.block2().is_none());
    bodies.lock().unwrap().push(vec![6u8; 100]);
    ep.handle_datagram(now, client(), &codec::encode(&get(2)));
    let first = serve(&mut ep, &mut role, now).remove(0);
    assert_eq!(first.block2().map(|b| (b.num, b.more)), Some((0, true)));
    assert_eq!(first.payload, vec![6u8; 64]);
    assert!(first.options.get_uint(Q_BLOCK2).is_none());
}

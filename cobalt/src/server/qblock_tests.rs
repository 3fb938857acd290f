//! Q-Block1 uploads (RFC 9177) through a shard's role over the datagram endpoint, in
//! virtual time: bursts of NON blocks lost and reordered both ways, 2.31 per set,
//! 4.08 listing the missing blocks, the body handed to the handler once, and nothing
//! left behind (uploads, unanswered exchanges) when it is over or abandoned.

use super::*;
use crate::server::layer::Front;
use crate::server::qblock2_send::QBlock2Sender;
use crate::server::{put, Request, ResourceTree, Routes};
use cobalt_proto::blockwise::qblock::{
    missing_blocks, QBlock1Body, Received, MAX_ASKED_BLOCKS, MAX_PAYLOADS, NON_RECEIVE_TIMEOUT,
    NON_TIMEOUT, Q_BLOCK1, Q_BLOCK2,
};
use cobalt_proto::endpoint::{Endpoint, EndpointConfig};
use cobalt_proto::message::{codec, option, MessageType, Token};
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

/// A CON Q-Block1 block that does not complete its set is acknowledged at once with
/// an empty ACK (libcoap sends CON blocks one per ACK), and its answer waits.
#[test]
fn a_kept_con_q_block1_block_is_acknowledged_at_once() {
    let now = Instant::now();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let mut role = role(&bodies, ServerLimits::default());
    let mut ep = endpoint(now);
    let body = vec![3u8; 64 * 5];
    let mut first = block(&body, 0, 1, 7);
    first.mtype = MessageType::Confirmable;
    ep.handle_datagram(now, client(), &codec::encode(&first));
    let out = serve(&mut ep, &mut role, now);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        (out[0].mtype, out[0].mid),
        (MessageType::Acknowledgement, 7)
    );
    assert!(out[0].is_empty());
    assert!(bodies.lock().unwrap().is_empty());
}

/// `/big`: a GET answers `body` (a body of many blocks), counting its runs in `runs`.
fn big_role(body: Vec<u8>, runs: &Arc<Mutex<u32>>, limits: ServerLimits) -> ShardRole {
    let mut tree = ResourceTree::new();
    let runs = runs.clone();
    tree.insert(
        "/big",
        crate::server::get(move || {
            *runs.lock().unwrap() += 1;
            let body = body.clone();
            async move { body }
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

/// A GET of `path` asking with Q-Block2 for `asked` (number, M bit) in 64-byte
/// blocks; NON unless `con`, with a token and message ID of its own.
fn qget(path: &str, asked: &[(u32, bool)], mid: u16, con: bool) -> Message {
    let mtype = if con {
        MessageType::Confirmable
    } else {
        MessageType::NonConfirmable
    };
    let mut m = Message::new(mtype, Code::GET, mid);
    m.token = Token::new(&mid.to_be_bytes()).unwrap();
    m.options.set_uri_path(path);
    for &(num, more) in asked {
        let v = BlockValue::new(num, more, SZX).unwrap().encode();
        m.options.push(Q_BLOCK2, option::encode_uint(v));
    }
    m.options.set(opt::REQUEST_TAG, [9]);
    m
}

/// The Q-Block2 value of a block that went out.
fn qblock2_of(m: &Message) -> BlockValue {
    m.options
        .get_uint(Q_BLOCK2)
        .and_then(BlockValue::decode)
        .expect("a Q-Block2 block")
}

/// A GET with Q-Block2 whose answer fits in the block asked for gets it whole with
/// Q-Block2 (how libcoap probes for Q-Block support before it uploads with Q-Block1).
#[test]
fn a_q_block2_answer_of_one_block_is_whole() {
    let now = Instant::now();
    let bodies = Arc::new(Mutex::new(vec![vec![5u8; 40]]));
    let mut role = role(&bodies, ServerLimits::default());
    let mut ep = endpoint(now);
    ep.handle_datagram(
        now,
        client(),
        &codec::encode(&qget("/up", &[(0, false)], 1, true)),
    );
    let one = serve(&mut ep, &mut role, now).remove(0);
    assert_eq!(one.code, Code::CONTENT);
    assert_eq!(one.payload, vec![5u8; 40]);
    let q = qblock2_of(&one);
    assert_eq!((q.num, q.more, q.szx), (0, false, SZX));
    assert!(one.block2().is_none());
}

/// A body of 26 blocks asked for with Q-Block2 goes out in sets of MAX_PAYLOADS: the
/// first with the answer, the next NON_TIMEOUT later each, NON for a NON request;
/// every block carries the request's token, the same ETag and Size2. A request with
/// the M bit brings its set at once; the handler runs once; when the body is sent the
/// sender holds nothing. To a CON request the first block is piggybacked on the ACK
/// and the rest of the set is CON.
#[test]
fn a_q_block2_body_goes_out_in_sets_of_max_payloads() {
    let t0 = Instant::now();
    let body: Vec<u8> = (0..64 * 25 + 10).map(|i| (i % 251) as u8).collect();
    let runs = Arc::new(Mutex::new(0));
    let mut role = big_role(body.clone(), &runs, ServerLimits::default());
    let mut ep = endpoint(t0);
    ep.handle_datagram(
        t0,
        client(),
        &codec::encode(&qget("/big", &[(0, false)], 1, false)),
    );
    let first = serve(&mut ep, &mut role, t0);
    let nums: Vec<u32> = first.iter().map(|m| qblock2_of(m).num).collect();
    assert_eq!(nums, (0..10).collect::<Vec<_>>());
    assert!(first.iter().all(|m| m.mtype == MessageType::NonConfirmable));
    let etag = first[0].options.get(opt::ETAG).map(<[u8]>::to_vec);
    assert!(etag.is_some());
    for m in &first {
        assert_eq!(m.token, first[0].token);
        assert_eq!(m.options.get(opt::ETAG).map(<[u8]>::to_vec), etag);
        assert_eq!(m.options.get_uint(opt::SIZE2), Some(body.len() as u32));
    }
    // Nothing more before NON_TIMEOUT; the next set then.
    assert!(tick(&mut ep, &mut role, t0 + NON_TIMEOUT / 2)
        .iter()
        .all(|m| m.options.get_uint(Q_BLOCK2).is_none()));
    let second = tick(&mut ep, &mut role, t0 + NON_TIMEOUT);
    let nums: Vec<u32> = second
        .iter()
        .filter(|m| m.options.contains(Q_BLOCK2))
        .map(|m| qblock2_of(m).num)
        .collect();
    assert_eq!(nums, (10..20).collect::<Vec<_>>());
    // The client asks for the last set with the M bit: it comes at once.
    let t1 = t0 + NON_TIMEOUT + Duration::from_millis(10);
    ep.handle_datagram(
        t1,
        client(),
        &codec::encode(&qget("/big", &[(20, true)], 2, false)),
    );
    let last: Vec<Message> = serve(&mut ep, &mut role, t1)
        .into_iter()
        .filter(|m| m.options.contains(Q_BLOCK2))
        .collect();
    let nums: Vec<u32> = last.iter().map(|m| qblock2_of(m).num).collect();
    assert_eq!(nums, (20..26).collect::<Vec<_>>());
    assert!(!qblock2_of(&last[5]).more);
    assert!(last.iter().all(|m| m.token == last[0].token));
    let got: Vec<u8> = first
        .iter()
        .chain(second.iter().filter(|m| m.options.contains(Q_BLOCK2)))
        .chain(&last)
        .flat_map(|m| m.payload.clone())
        .collect();
    assert_eq!(got, body);
    assert_eq!(*runs.lock().unwrap(), 1);
    let later = tick(&mut ep, &mut role, t1 + NON_TIMEOUT * 3);
    assert!(later.iter().all(|m| !m.options.contains(Q_BLOCK2)));
    assert_eq!(role.qblock2.as_ref().map(QBlock2Sender::len), Some(0));
    let other: SocketAddr = "10.0.0.8:40000".parse().unwrap();
    ep.handle_datagram(
        t1,
        other,
        &codec::encode(&qget("/big", &[(0, false)], 9, true)),
    );
    let con = serve(&mut ep, &mut role, t1);
    assert_eq!(con.len(), MAX_PAYLOADS as usize);
    assert_eq!(
        (con[0].mtype, con[0].mid),
        (MessageType::Acknowledgement, 9)
    );
    assert!(con[1..].iter().all(|m| m.mtype == MessageType::Confirmable));
}

/// A client downloads a body of 47 blocks with Q-Block2 over a network that loses
/// 20% of the datagrams both ways and delivers each burst in random order. It
/// collects the blocks in any order; when a set is complete it asks for the next with
/// the M bit, and when nothing new arrives for NON_RECEIVE_TIMEOUT it asks for up to
/// MAX_PAYLOADS missing blocks in one request (or, with none missing below the
/// highest, for the next set). The body arrives whole with one ETag; the handler runs
/// once (the rest is served from the kept answer).
#[test]
fn a_q_block2_body_arrives_whole_through_loss_and_reordering() {
    for seed in 0..30 {
        let mut rng = StdRng::seed_from_u64(seed);
        let t0 = Instant::now();
        let body: Vec<u8> = (0..64 * 46 + 33).map(|i| (i * 7 % 253) as u8).collect();
        let runs = Arc::new(Mutex::new(0));
        let mut role = big_role(body.clone(), &runs, ServerLimits::default());
        let mut ep = endpoint(t0);
        let mut rx = QBlock1Body::new(1 << 20, t0);
        let (mut now, mut mid, mut etag) = (t0, 0u16, None);
        let mut ask: Vec<(u32, bool)> = vec![(0, false)];
        let mut got = None;
        for _round in 0..300 {
            if got.is_some() {
                break;
            }
            let mut out = Vec::new();
            if !ask.is_empty() {
                mid = mid.wrapping_add(1);
                let req = qget("/big", &ask, mid, false);
                if !rng.random_bool(0.2) {
                    ep.handle_datagram(now, client(), &codec::encode(&req));
                }
                out = serve(&mut ep, &mut role, now);
            }
            out.shuffle(&mut rng);
            let mut progress = false;
            for m in out.into_iter().filter(|m| m.options.contains(Q_BLOCK2)) {
                if rng.random_bool(0.2) {
                    continue; // lost on the way back
                }
                let tag = m.options.get(opt::ETAG).map(<[u8]>::to_vec);
                assert!(tag.is_some(), "seed {seed}: a block without ETag");
                assert_eq!(*etag.get_or_insert(tag.clone()), tag, "seed {seed}");
                match rx.receive(now, qblock2_of(&m), &m.payload).unwrap() {
                    Received::Complete(b) => got = Some(b),
                    Received::Duplicate => {}
                    _ => progress = true,
                }
            }
            if got.is_some() {
                break;
            }
            let missing = rx.missing(MAX_PAYLOADS as usize);
            let held = rx.buffered().div_ceil(64) as u32;
            ask = if progress && missing.is_empty() && held.is_multiple_of(MAX_PAYLOADS) && held > 0
            {
                // A whole set arrived: ask for the next one at once.
                vec![(held, true)]
            } else {
                // Wait for the server's next set or give up waiting and ask.
                now += NON_RECEIVE_TIMEOUT;
                let mut more = tick(&mut ep, &mut role, now);
                more.retain(|m| m.options.contains(Q_BLOCK2));
                if !more.is_empty() {
                    // The server's next set came while waiting: take it next round.
                    for m in more {
                        if rng.random_bool(0.2) {
                            continue;
                        }
                        if let Received::Complete(b) =
                            rx.receive(now, qblock2_of(&m), &m.payload).unwrap()
                        {
                            got = Some(b);
                        }
                    }
                }
                let missing = rx.missing(MAX_PAYLOADS as usize);
                if missing.is_empty() {
                    vec![(rx.buffered().div_ceil(64) as u32, true)]
                } else {
                    missing.into_iter().map(|n| (n, false)).collect()
                }
            };
        }
        assert_eq!(got.as_deref(), Some(&body[..]), "seed {seed}");
        let runs = *runs.lock().unwrap();
        assert!(runs <= 2, "seed {seed}: the handler ran {runs} times");
    }
}

/// Hostile Q-Block2 requests: blocks past the body get 4.02, a request listing many
/// blocks is answered for at most MAX_ASKED_BLOCKS of them, and a storm of requests
/// from many peers keeps no more bodies than the upload budgets allow (the others
/// still get their first set; nothing is kept for them).
#[test]
fn hostile_q_block2_requests_are_bounded() {
    let t0 = Instant::now();
    let body = vec![7u8; 64 * 40];
    let runs = Arc::new(Mutex::new(0));
    let mut limits = ServerLimits::default();
    limits.uploads.max_upload_memory = body.len() * 8;
    limits.uploads.max_upload_memory_per_ip = body.len() * 2;
    let mut role = big_role(body.clone(), &runs, limits.clone());
    let mut ep = endpoint(t0);
    ep.handle_datagram(
        t0,
        client(),
        &codec::encode(&qget("/big", &[(0, false)], 1, false)),
    );
    assert_eq!(serve(&mut ep, &mut role, t0).len(), MAX_PAYLOADS as usize);
    // Past the end of the kept body.
    ep.handle_datagram(
        t0,
        client(),
        &codec::encode(&qget("/big", &[(1000, false)], 2, false)),
    );
    let past = serve(&mut ep, &mut role, t0);
    assert_eq!(past.len(), 1);
    assert_eq!(past[0].code, Code::BAD_OPTION);
    // Forty blocks listed in one request: MAX_ASKED_BLOCKS answered.
    let many: Vec<(u32, bool)> = (1..40).map(|n| (n, false)).collect();
    ep.handle_datagram(t0, client(), &codec::encode(&qget("/big", &many, 3, false)));
    let answered = serve(&mut ep, &mut role, t0);
    assert_eq!(answered.len(), MAX_ASKED_BLOCKS);
    assert_eq!(*runs.lock().unwrap(), 1);
    // A storm from 200 addresses.
    for i in 0..200u16 {
        let peer: SocketAddr = format!("10.1.{}.{}:5683", i / 250, i % 250 + 1)
            .parse()
            .unwrap();
        ep.handle_datagram(
            t0,
            peer,
            &codec::encode(&qget("/big", &[(0, false)], 10 + i, false)),
        );
        let first = serve(&mut ep, &mut role, t0);
        // Kept or not, each gets its first set.
        let nums: Vec<u32> = first.iter().map(|m| qblock2_of(m).num).collect();
        assert_eq!(nums, (0..MAX_PAYLOADS).collect::<Vec<_>>(), "peer {i}");
    }
    let held = role.uploads.stats().bytes;
    assert!(
        held <= limits.uploads.max_upload_memory,
        "{held} bytes kept"
    );
    let bursts = role.qblock2.as_ref().map_or(0, QBlock2Sender::len);
    assert!(
        bursts <= limits.uploads.max_upload_memory / body.len(),
        "{bursts} bodies in flight"
    );
}

/// An observer that registered with Q-Block2 (RFC 9177 §4.4) gets a notification of
/// 26 blocks as a Q-Block2 set: the notification is block 0 with the M bit, Observe,
/// ETag and Size2 under the registration's token, the rest of its first set follows
/// at once and the next sets NON_TIMEOUT apart, every block with that token and ETag;
/// a block it missed is served from the kept notification without running the
/// handler again. A plain observer of the same resource still gets Block2.
#[test]
fn a_q_block2_observer_gets_its_notifications_in_q_block2_sets() {
    use crate::server::observe::Observable;
    let t0 = Instant::now();
    let (obs, state) = (Observable::new(), Arc::new(AtomicU64::new(1)));
    let inbox = Arc::new(ChangeInbox::default());
    obs.attach(vec![inbox.clone()]);
    let runs = Arc::new(Mutex::new(0u32));
    let mut tree = ResourceTree::new();
    let (read, counted) = (state.clone(), runs.clone());
    let big = crate::server::get(move || {
        *counted.lock().unwrap() += 1;
        let digit = b'0' + (read.load(Ordering::Relaxed) % 10) as u8;
        async move { vec![digit; 64 * 25 + 10] }
    })
    .observable(&obs);
    tree.insert("/big", big);
    let (done, _back) = mpsc::unbounded_channel();
    let mut role = ShardRole::for_shard(
        Routes::new(tree, None).serve(),
        ServerLimits::default(),
        inbox,
        done,
        None,
        Front::plain(Scheme::Coap),
    );
    let mut ep = endpoint(t0);
    let mut register = qget("/big", &[(0, false)], 1, false);
    register.options.set_uint(opt::OBSERVE, 0);
    ep.handle_datagram(t0, client(), &codec::encode(&register));
    let plain: SocketAddr = "10.0.0.8:40000".parse().unwrap();
    let mut plain_register = Message::new(MessageType::NonConfirmable, Code::GET, 2);
    plain_register.token = Token::new(&[2]).unwrap();
    plain_register.options.set_uri_path("/big");
    plain_register.options.set_uint(opt::OBSERVE, 0);
    ep.handle_datagram(t0, plain, &codec::encode(&plain_register));
    let answer = serve(&mut ep, &mut role, t0);
    assert_eq!(
        answer
            .iter()
            .filter(|m| m.options.contains(Q_BLOCK2))
            .count(),
        10
    );
    assert_eq!(Service::<Endpoint>::observer_count(&role), 2);
    // A change: the notification and the rest of its first set.
    let t1 = t0 + NON_TIMEOUT * 3;
    tick(&mut ep, &mut role, t1);
    state.store(2, Ordering::Relaxed);
    obs.changed();
    Service::<Endpoint>::take_changes(&mut role);
    let first = serve(&mut ep, &mut role, t1);
    let (mine, theirs): (Vec<Message>, Vec<Message>) =
        first.into_iter().partition(|m| m.token == register.token);
    acknowledge(&mut ep, t1, client(), &mine);
    acknowledge(&mut ep, t1, plain, &theirs);
    assert_eq!(theirs.len(), 1);
    assert!(theirs[0].block2().is_some_and(|b| b.num == 0 && b.more));
    assert!(!theirs[0].options.contains(Q_BLOCK2));
    let nums: Vec<u32> = mine.iter().map(|m| qblock2_of(m).num).collect();
    assert_eq!(nums, (0..MAX_PAYLOADS).collect::<Vec<_>>());
    let note = &mine[0];
    assert!(qblock2_of(note).more);
    assert!(note.options.observe().is_some());
    assert!(note.block2().is_none());
    let etag = note.options.get(opt::ETAG).map(<[u8]>::to_vec);
    assert!(etag.is_some());
    for m in &mine {
        assert_eq!(m.options.get(opt::ETAG).map(<[u8]>::to_vec), etag);
        assert_eq!(m.options.get_uint(opt::SIZE2), Some(64 * 25 + 10));
        assert_eq!(m.payload[0], b'2');
    }
    // The next sets, NON_TIMEOUT apart.
    let second = tick(&mut ep, &mut role, t1 + NON_TIMEOUT);
    acknowledge(&mut ep, t1 + NON_TIMEOUT, client(), &second);
    let nums: Vec<u32> = second
        .iter()
        .filter(|m| m.token == register.token)
        .map(|m| qblock2_of(m).num)
        .collect();
    assert_eq!(nums, (10..20).collect::<Vec<_>>());
    let third = tick(&mut ep, &mut role, t1 + NON_TIMEOUT * 2);
    acknowledge(&mut ep, t1 + NON_TIMEOUT * 2, client(), &third);
    let nums: Vec<u32> = third
        .iter()
        .filter(|m| m.token == register.token)
        .map(|m| qblock2_of(m).num)
        .collect();
    assert_eq!(nums, (20..26).collect::<Vec<_>>());
    // A block it missed, asked for under a token of its own, comes from the kept body.
    let t2 = t1 + NON_TIMEOUT * 2 + Duration::from_millis(10);
    let ran = *runs.lock().unwrap();
    ep.handle_datagram(
        t2,
        client(),
        &codec::encode(&qget("/big", &[(13, false)], 7, false)),
    );
    let again = serve(&mut ep, &mut role, t2);
    assert_eq!(again.len(), 1);
    assert_eq!(qblock2_of(&again[0]).num, 13);
    assert_eq!(again[0].options.get(opt::ETAG).map(<[u8]>::to_vec), etag);
    assert_eq!(
        *runs.lock().unwrap(),
        ran,
        "served from the kept notification"
    );
    assert!(tick(&mut ep, &mut role, t2 + NON_TIMEOUT * 3)
        .iter()
        .all(|m| !m.options.contains(Q_BLOCK2)));
    assert_eq!(role.qblock2.as_ref().map(QBlock2Sender::len), Some(0));
}

/// `peer` acknowledges the CON messages among `got`.
fn acknowledge(ep: &mut Endpoint, now: Instant, peer: SocketAddr, got: &[Message]) {
    for m in got.iter().filter(|m| m.mtype == MessageType::Confirmable) {
        let ack = Message::new(MessageType::Acknowledgement, Code::EMPTY, m.mid);
        ep.handle_datagram(now, peer, &codec::encode(&ack));
    }
}

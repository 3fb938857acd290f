//! The same applications over a datagram link and over a stream link, in the
//! simulator. The datagram link loses 20 % of the datagrams, duplicates 20 % and
//! delays each by up to half a second (so reorders them); the stream link is
//! reliable but cuts every write into chunks of up to 16 bytes, delays them and
//! coalesces them into reads. Each client, one after the other:
//! - downloads a body with Block2, which arrives byte-exact (or the download fails
//!   with a timeout);
//! - uploads a body with Block1, which the server reassembles byte-exact in the
//!   server's own upload table ([`Uploads`]), running the upload's handler once, never
//!   twice;
//! - observes a resource: the notifications it surfaces after the RFC 7641 §3.4
//!   freshness rule are in order, until the server's last one; the server sends them
//!   NON or CON by the relation policy of [`Relation`];
//! - POSTs to a resource that requires a fresh Echo (RFC 9175 §2.3): the first try is
//!   challenged, a repeat with the Echo value runs the handler (once), a repeat after
//!   the Echo went stale is challenged again.
//!
//! After the lifetimes no endpoint, no connection and no upload table keeps any state.

use super::{Observation, Outbound, SessionEvent};
use crate::blockwise::uploads::{UploadCounters, UploadLimits, UploadStep, Uploads};
use crate::blockwise::{check_block, next_block2, slice_response, upload_continues, BlockSize};
use crate::budget::Refusal;
use crate::endpoint::{EndpointConfig, StateCounts};
use crate::message::{opt, BlockValue, Code, Message, MessageType};
use crate::observe::relations::{ConPolicy, Relation};
use crate::observe::{is_fresh, SEQ_MASK};
use crate::sim::net::{LossyConfig, LossyNet};
use crate::sim::stream::StreamConfig;
use crate::sim::{Application, Ctx, Sim};
use crate::tcp_connection::TcpConfig;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::ops::Range;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How long an Echo value stays fresh.
const ECHO_FRESH: Duration = Duration::from_secs(10);
/// Notifications per observation, the last without Observe.
const NOTIFICATIONS: u32 = 30;
const CHANGE_EVERY: Duration = Duration::from_millis(300);

fn download_body() -> Vec<u8> {
    (0..5000u32).map(|i| (i * 7 % 251) as u8).collect()
}

fn upload_body(node: usize) -> Vec<u8> {
    (0..3000usize)
        .map(|i| ((i * 13 + node) % 253) as u8)
        .collect()
}

/// What the run produced, for the checks.
#[derive(Default)]
struct Report {
    downloads_ok: u32,
    uploads_ok: Vec<SocketAddr>,
    /// Bodies the upload handler ran with, by uploader.
    upload_runs: HashMap<SocketAddr, Vec<Vec<u8>>>,
    observations: Vec<Vec<u32>>,
    posts_ok: u32,
    /// Times the POST handler ran, by payload.
    post_runs: HashMap<Vec<u8>, u32>,
    /// Echo values refused as stale.
    stale_refused: u32,
    /// Uploads the server's table still holds (after its last expiry).
    uploads_held: usize,
    failed: u32,
    clients_done: usize,
}

type Shared = Rc<RefCell<Report>>;

fn ack(code: Code) -> Message {
    Message::new(MessageType::Acknowledgement, code, 0)
}

/// The upload table's refusals: none are expected here (one upload per client).
#[derive(Debug)]
struct NoRefusals;

impl UploadCounters for NoRefusals {
    fn refused(&self, refusal: Refusal) {
        panic!("upload refused: {refusal:?}");
    }
    fn expired(&self, _: u64) {}
    fn evicted(&self) {
        panic!("upload evicted");
    }
}

/// One observer: the session's observation and its relation (for the CON policy).
type Observer = (Observation, Relation<()>, u32);

struct Server {
    start: Instant,
    body: Vec<u8>,
    uploads: Uploads,
    observers: Vec<Observer>,
    /// A CON every 5 notifications.
    policy: ConPolicy,
    seq: u32,
    /// When the observed resource changes next (while it has observers).
    next_change: Option<Instant>,
    report: Shared,
}

impl Server {
    fn upload(&mut self, now: Instant, peer: SocketAddr, request: &Message) -> Message {
        let Some(b) = request.block1() else {
            return ack(Code::BAD_REQUEST);
        };
        let resp = match self.uploads.handle(now, peer, request, b) {
            UploadStep::Continue(answer) | UploadStep::Reject(answer) => answer,
            UploadStep::Complete { body, last } => {
                // The handler runs with the whole body.
                let mut report = self.report.borrow_mut();
                report.upload_runs.entry(peer).or_default().push(body);
                let mut resp = ack(Code::CHANGED);
                resp.options.set_uint(opt::BLOCK1, last.encode());
                resp
            }
        };
        self.report.borrow_mut().uploads_held = self.uploads.in_progress();
        resp
    }

    /// Wakes the node for the next change or the upload table's next expiry.
    fn schedule(&self, ctx: &mut Ctx<'_>) {
        let next = self
            .next_change
            .into_iter()
            .chain(self.uploads.poll_timeout());
        if let Some(at) = next.min() {
            ctx.wake_at(at);
        }
    }

    /// RFC 9175 §2.3: the request runs only with an Echo value we issued recently.
    fn post(&mut self, now: Instant, request: &Message) -> Message {
        let issued = request
            .options
            .get(opt::ECHO)
            .and_then(|v| <[u8; 8]>::try_from(v).ok())
            .map(|v| self.start + Duration::from_millis(u64::from_be_bytes(v)));
        match issued {
            Some(t) if t <= now && now - t <= ECHO_FRESH => {
                *self
                    .report
                    .borrow_mut()
                    .post_runs
                    .entry(request.payload.clone())
                    .or_default() += 1;
                let mut resp = ack(Code::CHANGED);
                resp.payload = request.payload.clone();
                resp
            }
            stale => {
                if stale.is_some() {
                    self.report.borrow_mut().stale_refused += 1;
                }
                let ms = u64::try_from((now - self.start).as_millis()).unwrap_or(u64::MAX);
                let mut resp = ack(Code::UNAUTHORIZED);
                resp.options.set(opt::ECHO, ms.to_be_bytes());
                resp
            }
        }
    }

    fn observe(&mut self, ctx: &mut Ctx<'_>, peer: SocketAddr, request: &Message) -> Message {
        let relation = Relation::new(request.clone(), ctx.now(), 0);
        self.observers
            .push((Observation::new(peer, request), relation, 0));
        if self.next_change.is_none() {
            self.next_change = Some(ctx.now() + CHANGE_EVERY);
        }
        let mut resp = ack(Code::CONTENT);
        resp.options.set_uint(opt::OBSERVE, self.seq);
        resp.payload = self.seq.to_be_bytes().to_vec();
        resp
    }
}

impl Application for Server {
    fn on_event(&mut self, ctx: &mut Ctx<'_>, event: SessionEvent) {
        let SessionEvent::Request { id, peer, request } = event else {
            return;
        };
        let now = ctx.now();
        let path = request.options.uri_path_string();
        let resp = match path.as_str() {
            "/big" => {
                let mut full = ack(Code::CONTENT);
                full.payload = self.body.clone();
                slice_response(&request, full, 4)
            }
            "/upload" => self.upload(now, peer, &request),
            "/obs" => self.observe(ctx, peer, &request),
            "/echo" => self.post(now, &request),
            _ => ack(Code::NOT_FOUND),
        };
        ctx.session().respond(now, id, resp).unwrap();
        self.schedule(ctx);
    }

    fn on_wake(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now();
        self.uploads.expire(now);
        self.report.borrow_mut().uploads_held = self.uploads.in_progress();
        if self.next_change.is_some_and(|t| t <= now) {
            self.change(ctx);
        }
        self.schedule(ctx);
    }
}

impl Server {
    /// The observed resource changes: every observer is notified, CON by the policy.
    fn change(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now();
        self.seq = (self.seq + 1) & SEQ_MASK;
        let seq = self.seq;
        for (obs, relation, sent) in &mut self.observers {
            *sent += 1;
            let mut n = Message::new(MessageType::NonConfirmable, Code::CONTENT, 0);
            n.payload = seq.to_be_bytes().to_vec();
            // The last one lacks Observe: the observation ends at both ends.
            let last = *sent == NOTIFICATIONS;
            if !last {
                n.options.set_uint(opt::OBSERVE, seq);
            }
            let con = relation.next_is_confirmable(&self.policy, now, last, true);
            relation.sent(now, con, u64::from(*sent));
            ctx.session().notify(now, obs, n, con).unwrap();
        }
        self.observers.retain(|(_, _, sent)| *sent < NOTIFICATIONS);
        self.next_change = (!self.observers.is_empty()).then_some(now + CHANGE_EVERY);
    }
}

#[derive(Debug, Clone, Copy)]
enum Task {
    Download,
    Upload,
    Observe,
    /// `stale`: repeat the first challenge only after the Echo went stale.
    Post {
        stale: bool,
    },
}

enum Current {
    Download {
        got: Vec<u8>,
    },
    Upload {
        body: Vec<u8>,
        size: BlockSize,
        sent: BlockValue,
        range: Range<usize>,
    },
    Observe {
        last: Option<(u32, Instant)>,
        surfaced: Vec<u32>,
        deadline: Instant,
    },
    Post {
        stale: bool,
        challenges: u32,
        retry_at: Option<Instant>,
    },
}

struct Client {
    server: SocketAddr,
    tasks: VecDeque<Task>,
    current: Option<(Outbound, Message, Current)>,
    report: Shared,
}

fn request(code: Code, path: &str) -> Message {
    let mut m = Message::new(MessageType::Confirmable, code, 0);
    m.options.set_uri_path(path);
    m
}

fn put_block(body: &[u8], size: BlockSize, offset: usize) -> (Message, BlockValue, Range<usize>) {
    let (block, range) = size.block_at(body.len(), offset).unwrap();
    let mut m = request(Code::PUT, "/upload");
    m.options.set_uint(opt::BLOCK1, block.encode());
    m.payload = body[range.clone()].to_vec();
    (m, block, range)
}

impl Client {
    fn send(&mut self, ctx: &mut Ctx<'_>, msg: Message, state: Current) {
        let now = ctx.now();
        let id = ctx
            .session()
            .request(now, self.server, msg.clone())
            .unwrap();
        self.current = Some((id, msg, state));
    }

    fn next_task(&mut self, ctx: &mut Ctx<'_>) {
        let Some(task) = self.tasks.pop_front() else {
            self.current = None;
            self.report.borrow_mut().clients_done += 1;
            return;
        };
        match task {
            Task::Download => self.send(
                ctx,
                request(Code::GET, "/big"),
                Current::Download { got: Vec::new() },
            ),
            Task::Upload => {
                let body = upload_body(ctx.node());
                let size = BlockSize::Szx(4);
                let (m, sent, range) = put_block(&body, size, 0);
                let state = Current::Upload {
                    body,
                    size,
                    sent,
                    range,
                };
                self.send(ctx, m, state);
            }
            Task::Observe => {
                let mut m = request(Code::GET, "/obs");
                m.options.set_uint(opt::OBSERVE, 0);
                let deadline = ctx.now() + Duration::from_secs(120);
                ctx.wake_at(deadline);
                let state = Current::Observe {
                    last: None,
                    surfaced: Vec::new(),
                    deadline,
                };
                self.send(ctx, m, state);
            }
            Task::Post { stale } => {
                let mut m = request(Code::POST, "/echo");
                m.payload = format!("post from {}", ctx.node()).into_bytes();
                let state = Current::Post {
                    stale,
                    challenges: 0,
                    retry_at: None,
                };
                self.send(ctx, m, state);
            }
        }
    }

    fn end_observation(&mut self, ctx: &mut Ctx<'_>, id: Outbound, surfaced: Vec<u32>) {
        let now = ctx.now();
        ctx.session().cancel(now, id);
        self.report.borrow_mut().observations.push(surfaced);
        self.next_task(ctx);
    }

    fn on_response(&mut self, ctx: &mut Ctx<'_>, response: Message) {
        let Some((id, mut last, mut state)) = self.current.take() else {
            return;
        };
        let now = ctx.now();
        match &mut state {
            Current::Download { got } => {
                assert_eq!(response.code, Code::CONTENT);
                let b = response.block2().expect("every answer is a block");
                check_block(b, response.payload.len(), got.len(), false).expect("in order");
                got.extend_from_slice(&response.payload);
                if b.more {
                    let mut m = request(Code::GET, "/big");
                    let next = next_block2(got.len(), b).unwrap();
                    m.options.set_uint(opt::BLOCK2, next.encode());
                    return self.send(ctx, m, state);
                }
                assert_eq!(*got, download_body(), "byte-exact");
                self.report.borrow_mut().downloads_ok += 1;
            }
            Current::Upload {
                body,
                size,
                sent,
                range,
            } => {
                if response.code == Code::CONTINUE {
                    let (offset, next) =
                        upload_continues(*size, *sent, range.clone(), response.block1())
                            .expect("the acknowledgement names the block sent");
                    let (m, b, r) = put_block(body, next, offset);
                    (*size, *sent, *range) = (next, b, r);
                    return self.send(ctx, m, state);
                }
                assert_eq!(response.code, Code::CHANGED);
                self.report.borrow_mut().uploads_ok.push(ctx.addr());
            }
            Current::Observe {
                last: latest,
                surfaced,
                ..
            } => {
                let Some(v) = response.options.observe() else {
                    // The server's last notification.
                    let surfaced = std::mem::take(surfaced);
                    return self.end_observation(ctx, id, surfaced);
                };
                if latest.is_none_or(|(v1, t1)| is_fresh(v1, t1, v, now)) {
                    surfaced.push(v);
                    *latest = Some((v, now));
                }
                self.current = Some((id, last, state));
                return;
            }
            Current::Post {
                stale,
                challenges,
                retry_at,
            } => {
                if response.code == Code::UNAUTHORIZED {
                    let echo = response.options.get(opt::ECHO).expect("Echo");
                    last.options.set(opt::ECHO, echo);
                    *challenges += 1;
                    if *stale && *challenges == 1 {
                        // Repeat only once the Echo value is stale.
                        let at = now + ECHO_FRESH + Duration::from_secs(5);
                        *retry_at = Some(at);
                        ctx.wake_at(at);
                        self.current = Some((id, last, state));
                        return;
                    }
                    return self.send(ctx, last, state);
                }
                assert_eq!(response.code, Code::CHANGED);
                assert_eq!(response.payload, last.payload, "the answer to this POST");
                assert!(*challenges > u32::from(*stale), "{challenges} challenges");
                self.report.borrow_mut().posts_ok += 1;
            }
        }
        self.next_task(ctx);
    }
}

impl Application for Client {
    fn on_event(&mut self, ctx: &mut Ctx<'_>, event: SessionEvent) {
        let current = self.current.as_ref().map(|c| c.0.clone());
        match event {
            SessionEvent::Response { id, response } if Some(id.clone()) == current => {
                self.on_response(ctx, response)
            }
            SessionEvent::Failed { id, .. } if Some(id.clone()) == current => {
                self.report.borrow_mut().failed += 1;
                if let Some((_, _, Current::Observe { surfaced, .. })) = self.current.take() {
                    self.report.borrow_mut().observations.push(surfaced);
                }
                self.next_task(ctx);
            }
            _ => {}
        }
    }

    fn on_wake(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now();
        match self.current.take() {
            Some((
                id,
                _,
                Current::Observe {
                    surfaced, deadline, ..
                },
            )) if deadline <= now => {
                // The last notification never came.
                self.end_observation(ctx, id, surfaced);
            }
            Some((
                _,
                last,
                Current::Post {
                    stale,
                    challenges,
                    retry_at: Some(at),
                },
            )) if at <= now => {
                let state = Current::Post {
                    stale,
                    challenges,
                    retry_at: None,
                };
                self.send(ctx, last, state);
            }
            // The first wake-up starts the first task.
            None if !self.tasks.is_empty() => self.next_task(ctx),
            other => self.current = other,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Link {
    Datagram,
    Stream,
}

const CLIENTS: usize = 3;

/// Runs the server and the clients over `link`; returns the simulation and the report.
fn run(link: Link, seed: u64) -> (Sim<LossyNet>, Shared) {
    let hostile = LossyConfig {
        loss: 0.2,
        duplicate: 0.2,
        max_delay_ms: 500,
    };
    let mut sim = Sim::new(LossyNet::new(hostile, seed), seed);
    match link {
        Link::Datagram => {
            // Echo is the application's here, not the amplification limit's.
            let config = EndpointConfig {
                amplification_factor: 0,
                ..EndpointConfig::default()
            };
            sim.add_nodes(CLIENTS + 1, &config);
        }
        Link::Stream => {
            sim.streams().set_config(StreamConfig {
                max_chunk: 16,
                min_delay_ms: 1,
                max_delay_ms: 200,
            });
            sim.add_stream_nodes(CLIENTS + 1, &TcpConfig::default());
        }
    }
    let report = Shared::default();
    let server = Server {
        start: sim.now(),
        body: download_body(),
        uploads: Uploads::new(
            UploadLimits {
                upload_idle_timeout: Duration::from_secs(60),
                ..UploadLimits::default()
            },
            std::sync::Arc::new(NoRefusals),
        ),
        observers: Vec::new(),
        policy: ConPolicy {
            every: 5,
            ..ConPolicy::default()
        },
        seq: SEQ_MASK - 10, // crosses the 24-bit wrap
        next_change: None,
        report: report.clone(),
    };
    sim.set_app(0, Box::new(server));
    let to = sim.addr(0);
    for c in 1..=CLIENTS {
        let tasks = [
            Task::Download,
            Task::Upload,
            Task::Observe,
            Task::Post { stale: c == 1 },
        ];
        let client = Client {
            server: to,
            tasks: tasks.into_iter().collect(),
            current: None,
            report: report.clone(),
        };
        sim.set_app(c, Box::new(client));
        let now = sim.now();
        sim.wake(c, now);
    }
    let horizon = sim.now() + Duration::from_secs(3000);
    sim.run(horizon);
    (sim, report)
}

fn check(link: Link, seed: u64, sim: &Sim<LossyNet>, report: &Report) {
    let ctx = format!("{link:?} seed {seed}");
    assert_eq!(report.clients_done, CLIENTS, "{ctx}: every client ends");
    // No double handler runs, byte-exact bodies.
    for (peer, runs) in &report.upload_runs {
        assert_eq!(runs.len(), 1, "{ctx}: the upload of {peer} ran once");
        let node = (1..=CLIENTS).find(|&c| sim.addr(c) == *peer).unwrap();
        assert_eq!(runs[0], upload_body(node), "{ctx}: byte-exact upload");
    }
    for peer in &report.uploads_ok {
        assert!(report.upload_runs.contains_key(peer), "{ctx}");
    }
    for (payload, runs) in &report.post_runs {
        assert_eq!(*runs, 1, "{ctx}: {payload:?} ran {runs} times");
    }
    for surfaced in &report.observations {
        for w in surfaced.windows(2) {
            let newer = (w[1].wrapping_sub(w[0]) & SEQ_MASK) < (1 << 23) && w[0] != w[1];
            assert!(newer, "{ctx}: surfaced out of order: {surfaced:?}");
        }
    }
    // Nothing left.
    assert_eq!(report.uploads_held, 0, "{ctx}: uploads left in the table");
    for i in 0..sim.len() {
        match link {
            Link::Datagram => assert_eq!(
                sim.endpoint_ref(i).state_counts(),
                StateCounts::default(),
                "{ctx}: node {i}"
            ),
            Link::Stream => assert_eq!(sim.stream_ref(i).connections(), 0, "{ctx}: node {i}"),
        }
    }
}

#[test]
fn block_observe_and_echo_over_a_stream_link_all_complete() {
    for seed in 0..4 {
        let (mut sim, report) = run(Link::Stream, seed);
        let report = report.borrow();
        check(Link::Stream, seed, &sim, &report);
        // A reliable stream loses nothing: everything completes.
        let n = CLIENTS as u32;
        assert_eq!(report.failed, 0, "seed {seed}");
        assert_eq!(report.downloads_ok, n);
        assert_eq!(report.uploads_ok.len(), CLIENTS);
        assert_eq!(report.posts_ok, n);
        assert_eq!(
            report.stale_refused, 1,
            "the stale client's repeat was refused"
        );
        for surfaced in &report.observations {
            assert_eq!(
                surfaced.len() as u32,
                NOTIFICATIONS,
                "every notification surfaced"
            );
        }
        assert!(sim.streams().is_empty(), "seed {seed}: every stream closed");
        // The same seed gives the same run.
        let (again, report_again) = run(Link::Stream, seed);
        assert_eq!(again.elapsed(), sim.elapsed(), "seed {seed}");
        assert_eq!(report_again.borrow().observations, report.observations);
    }
}

#[test]
fn block_observe_and_echo_over_a_hostile_datagram_link_keep_the_invariants() {
    let (mut downloads, mut uploads, mut posts, mut failed, mut stale) = (0, 0, 0, 0, 0);
    for seed in 0..8 {
        let (sim, report) = run(Link::Datagram, seed);
        let report = report.borrow();
        check(Link::Datagram, seed, &sim, &report);
        assert!(
            report.observations.iter().any(|s| s.len() > 1),
            "seed {seed}: notifications got through"
        );
        downloads += report.downloads_ok;
        uploads += report.uploads_ok.len();
        posts += report.posts_ok;
        failed += report.failed;
        stale += report.stale_refused;
    }
    // 8 seeds × 3 clients: most transfers complete despite the losses.
    let summary =
        format!("{downloads} downloads, {uploads} uploads, {posts} posts, {failed} failed");
    assert!(downloads > 12 && uploads > 12 && posts > 12, "{summary}");
    assert!(stale > 0, "stale Echo values are refused ({summary})");
}

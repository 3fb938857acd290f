//! Heap allocations per request on the UDP hot path, counted by a global allocator.
//!
//! Each stage of a request's way through the server is counted on its own, in this
//! process and without sockets, then the whole path over loopback:
//!
//! - `decode`: a typical request datagram (CON GET, 4-byte token, two Uri-Path segments,
//!   Accept) into a [`Message`];
//! - `decode (larger request)`: one with Uri-Host, three Uri-Path segments and Accept;
//! - `encode (reused buffer)` and `encode (new buffer)`: the answer (2.05, Content-Format,
//!   `hello world`) into a buffer kept across requests, or into a fresh one;
//! - `endpoint: datagram -> event`: a server [`Endpoint`] takes the datagram and hands out
//!   the request event (decoding, deduplication, admission, exchange state, timers);
//! - `endpoint: respond -> transmit`: the answer given to the endpoint until its datagram
//!   comes out (the answer itself is built before counting starts);
//! - `endpoint: timers`: the endpoint's timers, run after every request as a shard does;
//! - `whole server over loopback`: a server with one shard serves `/benchmark` (an inline
//!   handler answering `hello world`); a blocking UDP socket sends it confirmable GETs,
//!   pre-encoded and sent from one reused buffer, and reads each answer into another, so
//!   the client side allocates nothing. Everything the process allocates while it runs is
//!   counted (the shard's thread, its runtime, the handler and its answer).
//!
//! Run: `cargo bench -p cobalt --bench allocations` (or with `-- 100000` requests).

use cobalt::server::get;
use cobalt::Scheme;
use cobalt::Server;
use cobalt_proto::endpoint::{Endpoint, EndpointConfig, Event};
use cobalt_proto::message::{codec, content_format, opt, Code, Message, MessageType, Token};
use std::alloc::{GlobalAlloc, Layout, System};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; only counters move.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Relaxed) {
            ALLOCS.fetch_add(1, Relaxed);
            BYTES.fetch_add(layout.size() as u64, Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Relaxed) {
            ALLOCS.fetch_add(1, Relaxed);
            BYTES.fetch_add(new_size as u64, Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations and bytes allocated by one stage over all requests.
#[derive(Default)]
struct Tally {
    allocs: u64,
    bytes: u64,
}

impl Tally {
    /// Runs `f`, adding what it allocates (on any thread) to the tally.
    fn count<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let (a, b) = (ALLOCS.load(Relaxed), BYTES.load(Relaxed));
        COUNTING.store(true, Relaxed);
        let r = f();
        COUNTING.store(false, Relaxed);
        self.allocs += ALLOCS.load(Relaxed) - a;
        self.bytes += BYTES.load(Relaxed) - b;
        r
    }

    fn print(&self, stage: &str, requests: u32) {
        let n = f64::from(requests);
        println!(
            "{stage:<34} {:>6.2} allocations {:>7.1} bytes per request",
            self.allocs as f64 / n,
            self.bytes as f64 / n
        );
    }
}

/// The request every stage handles: CON GET /sensors/temp with a 4-byte token and
/// Accept: text/plain.
fn request(mid: u16, n: u32) -> Message {
    let mut m = Message::new(MessageType::Confirmable, Code::GET, mid);
    m.token = Token::new(&n.to_be_bytes()).expect("four bytes");
    m.options.set_uri_path("/sensors/temp");
    m.options
        .set_uint(opt::ACCEPT, u32::from(content_format::TEXT_PLAIN));
    m
}

/// Sets the message ID and token of the encoded [`request`] in place.
fn renumber(datagram: &mut [u8], mid: u16, n: u32) {
    datagram[2..4].copy_from_slice(&mid.to_be_bytes());
    datagram[4..8].copy_from_slice(&n.to_be_bytes());
}

/// The handler's answer: 2.05 text/plain `hello world`, piggybacked.
fn answer() -> Message {
    let mut m = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
    m.options
        .set_uint(opt::CONTENT_FORMAT, u32::from(content_format::TEXT_PLAIN));
    m.payload = b"hello world".to_vec();
    m
}

/// Decodes `requests` copies of `message`, each with its own message ID and token.
fn count_decoding(message: &Message, requests: u32) -> Tally {
    let mut datagram = codec::encode(message);
    let mut tally = Tally::default();
    for i in 0..requests {
        renumber(&mut datagram, i as u16, i);
        let m = tally.count(|| codec::decode(&datagram));
        assert!(m.is_ok_and(|m| m.options == message.options));
    }
    tally
}

/// The codec and a server endpoint, stage by stage, in this process.
fn stages(requests: u32) {
    let mut datagram = codec::encode(&request(0, 0));
    count_decoding(&request(0, 0), requests).print("decode", requests);
    // A larger request: Uri-Host, three Uri-Path segments and Accept.
    let mut larger = request(0, 0);
    larger.options.set(opt::URI_HOST, "sensor.example.net");
    larger.options.set_uri_path("/building/7/temperature");
    count_decoding(&larger, requests).print("decode (larger request)", requests);

    let response = answer();
    let (mut reused, mut fresh) = (Tally::default(), Tally::default());
    let mut out = Vec::new();
    for _ in 0..requests {
        reused.count(|| {
            out.clear();
            codec::encode_into(&response, &mut out);
        });
        let bytes = fresh.count(|| codec::encode(&response));
        assert_eq!(bytes, out);
    }
    reused.print("encode (reused buffer)", requests);
    fresh.print("encode (new buffer)", requests);

    let mut now = Instant::now();
    let mut server = Endpoint::with_seed(EndpointConfig::default(), now, 1);
    let peer: SocketAddr = "10.0.0.1:40000".parse().expect("address");
    // A warm-up (the endpoint's tables reach their working size), then the counted run.
    for (first_mid, n, counted) in [(0u16, 2_000, false), (2_000, requests, true)] {
        let (mut receive, mut respond, mut timers) =
            (Tally::default(), Tally::default(), Tally::default());
        for i in 0..n {
            // A client may not reuse a MID within EXCHANGE_LIFETIME: 10 ms of virtual
            // time per request keeps 16-bit MIDs apart.
            now += Duration::from_millis(10);
            renumber(&mut datagram, first_mid.wrapping_add(i as u16), i);
            let id = receive.count(|| {
                server.handle_datagram(now, peer, &datagram);
                match server.poll_event() {
                    Some(Event::Request { id, .. }) => id,
                    other => panic!("expected a request, got {other:?}"),
                }
            });
            let response = answer();
            let tx = respond.count(|| {
                server.respond(now, id, response).expect("exchange");
                server.poll_transmit().expect("piggybacked answer")
            });
            assert_eq!(codec::decode(&tx.bytes).map(|m| m.code), Ok(Code::CONTENT));
            // As a shard does once the datagram is sent.
            server.recycle(tx.bytes);
            timers.count(|| server.handle_timeout(now));
        }
        if counted {
            receive.print("endpoint: datagram -> event", requests);
            respond.print("endpoint: respond -> transmit", requests);
            timers.print("endpoint: timers", requests);
        }
    }
}

/// Sends `n` requests one after the other, each with a fresh message ID and token.
fn exchange(socket: &UdpSocket, template: &mut Message, n: u32, buf: &mut [u8], out: &mut Vec<u8>) {
    for i in 0..n {
        template.mid = template.mid.wrapping_add(1);
        template.token = Token::new(&(i + 1).to_be_bytes()).expect("four bytes");
        out.clear();
        codec::encode_into(template, out);
        socket.send(out).expect("send");
        loop {
            let len = socket.recv(buf).expect("an answer within the timeout");
            // Skip anything but the ACK to this request (there is nothing else here).
            if len >= 4 && u16::from_be_bytes([buf[2], buf[3]]) == template.mid {
                break;
            }
        }
    }
}

/// The whole server over loopback.
fn whole_server(requests: u32) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let server = runtime.block_on(async {
        Server::new()
            .route("/benchmark", get(|| async { "hello world" }))
            .shards(1)
            .bind("127.0.0.1:0")
            .await
            .expect("bind")
    });
    let socket = UdpSocket::bind("127.0.0.1:0").expect("client socket");
    socket
        .connect(server.local_addr(Scheme::Coap).unwrap())
        .expect("connect");
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut template = Message::new(MessageType::Confirmable, Code::GET, 0);
    template.options.set_uri_path("/benchmark");
    let (mut buf, mut out) = (vec![0u8; 1500], Vec::with_capacity(64));
    exchange(&socket, &mut template, 2_000, &mut buf, &mut out);

    let mut tally = Tally::default();
    let start = Instant::now();
    tally.count(|| exchange(&socket, &mut template, requests, &mut buf, &mut out));
    let took = start.elapsed();
    tally.print("whole server over loopback", requests);
    println!(
        "  ({requests} requests, CON GET /benchmark, inline handler, one shard, \
         {:.1} µs per round trip, sequential)",
        took.as_secs_f64() * 1e6 / f64::from(requests)
    );
    runtime.block_on(server.shutdown(Duration::from_millis(100)));
}

fn main() {
    let requests: u32 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20_000);
    stages(requests);
    whole_server(requests);
}

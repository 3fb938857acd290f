//! Heap allocations per request on the UDP hot path, counted by a global allocator.
//!
//! A server with one shard serves `/benchmark` (an inline handler answering
//! `hello world`); a plain blocking UDP socket sends it confirmable GETs, pre-encoded
//! and sent from one reused buffer, and reads each answer into another, so the client
//! side allocates nothing while counting. After a warm-up the benchmark counts every
//! allocation in the process (the shard's thread and the client's) over many requests
//! and prints the count per request, with the bytes allocated per request.
//!
//! Run: `cargo bench -p cobalt --bench allocations` (or with `-- 100000` requests).

use cobalt::server::get;
use cobalt::Scheme;
use cobalt::Server;
use cobalt_proto::message::{encode, Code, Message, MessageType, Token};
use std::alloc::{GlobalAlloc, Layout, System};
use std::net::UdpSocket;
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

/// Sends `n` requests one after the other, each with a fresh message ID and token.
fn exchange(socket: &UdpSocket, template: &mut Message, n: u32, buf: &mut [u8], out: &mut Vec<u8>) {
    for i in 0..n {
        template.mid = template.mid.wrapping_add(1);
        template.token = Token::new(&(i + 1).to_be_bytes()).expect("four bytes");
        out.clear();
        cobalt_proto::message::codec::encode_into(template, out);
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

fn main() {
    let requests: u32 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20_000);
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
    let _ = encode(&template);
    let (mut buf, mut out) = (vec![0u8; 1500], Vec::with_capacity(64));
    exchange(&socket, &mut template, 2_000, &mut buf, &mut out);

    COUNTING.store(true, Relaxed);
    let start = Instant::now();
    exchange(&socket, &mut template, requests, &mut buf, &mut out);
    let took = start.elapsed();
    COUNTING.store(false, Relaxed);

    let allocs = ALLOCS.load(Relaxed) as f64 / f64::from(requests);
    let bytes = BYTES.load(Relaxed) as f64 / f64::from(requests);
    println!(
        "UDP hot path (CON GET /benchmark, inline handler, one shard): \
         {allocs:.2} allocations and {bytes:.0} bytes allocated per request \
         ({requests} requests, {:.1} µs per round trip, sequential)",
        took.as_secs_f64() * 1e6 / f64::from(requests)
    );
    runtime.block_on(server.shutdown(Duration::from_millis(100)));
}

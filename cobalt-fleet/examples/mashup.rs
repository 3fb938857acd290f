//! A mashup: finds temperature sensors at a resource directory, observes each, and
//! serves their count, mean and maximum as an observable resource of its own.
//!
//! ```text
//! cargo run -p cobalt-cli -- rd --port 5683 --in-memory                 # a directory
//! cargo run -p cobalt-cli -- devices -n 100 --rd coap://127.0.0.1:5683   # 100 devices
//! cargo run -p cobalt-fleet --example mashup -- coap://127.0.0.1:5683 5690
//! cargo run -p cobalt-cli -- observe coap://127.0.0.1:5690/aggregate
//! ```
//!
//! Arguments: the directory (default `coap://127.0.0.1:5683`), the port (or
//! address:port) to serve `/aggregate` on (default 5690), the most devices to observe at once (default
//! 10,000) and the seconds between two lookups (default 10).

use cobalt::{Client, EndpointConfig, Server};
use cobalt_fleet::mashup::{Mashup, MashupConfig};
use std::alloc::{GlobalAlloc, Layout};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;
use tikv_jemallocator::Jemalloc;

// The allocator: jemalloc, set up as the `cobalt` binary's (cobalt-cli/src/alloc.rs),
// returning pages freed for a second to the system, here with one arena (the
// runtime's workers and the client's driver allocate little at the same time, and
// every arena keeps partly filled pages of its own: at 10,000 devices eight arenas
// held some 25 bytes per observation more). Observing N devices starts with a
// burst (a lookup's pages, N registrations and their first answers) whose
// short-lived memory glibc's malloc kept: at 10,000 devices some 800 bytes of
// resident memory per observation after the burst, on top of what the
// observations hold.
// The report lines also carry the bytes allocated and not freed (the heap, apart
// from the allocator's own rounding and the pages it keeps), counted here.
#[global_allocator]
static GLOBAL: Counting = Counting;

/// jemalloc, counting the bytes live in [`HEAP_BYTES`].
struct Counting;

/// Bytes allocated through [`Counting`] and not freed.
static HEAP_BYTES: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call goes to jemalloc as it came; the counter is only arithmetic.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HEAP_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { Jemalloc.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        HEAP_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { Jemalloc.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HEAP_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { Jemalloc.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HEAP_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: the caller's contract, passed on.
        unsafe { Jemalloc.realloc(ptr, layout, new_size) }
    }
}

/// jemalloc's settings, read at its start (a C string; `MALLOC_CONF` overrides them).
#[allow(non_upper_case_globals)]
#[export_name = "malloc_conf"]
pub static malloc_conf: &[u8] =
    b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0,narenas:1\0";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let rd = args
        .next()
        .unwrap_or_else(|| "coap://127.0.0.1:5683".into());
    let listen = match args.next() {
        Some(a) if a.contains(':') => a.parse::<SocketAddr>()?,
        Some(port) => SocketAddr::from(([0, 0, 0, 0], port.parse()?)),
        None => SocketAddr::from(([0, 0, 0, 0], 5690)),
    };
    let mut config = MashupConfig::new(&rd);
    config.resource_type = "temperature".into();
    if let Some(max) = args.next() {
        config.max_observed = max.parse()?;
    }
    if let Some(secs) = args.next() {
        config.relookup_every = Duration::from_secs_f64(secs.parse()?);
    }

    // One client for everything: the lookups at the directory and one observation
    // per device, all on the client's socket. Each observation is one of the client's
    // exchanges, so the client's bound on those must leave room for all of them;
    // everything else is the library's default. (Notifications are not remembered
    // for deduplication: a repeated one is recognised by its Observe number. Each
    // device's congestion state, FASOR's RTO estimates learnt from the
    // registration's exchange, is kept with the library's default bound: some 80
    // bytes a device, forgotten 255 s after the device's last exchange.)
    let client = Client::with_config(EndpointConfig {
        max_client_exchanges: config.max_observed + 1000,
        ..EndpointConfig::default()
    })?;
    // The client's socket and driver (its receive buffers: some 800 KB, whatever
    // it observes) start now, so that the baseline below has them and the growth
    // after it is what the observations take.
    let first_uri = match rd.strip_prefix("file:") {
        Some(path) => std::fs::read_to_string(path)?
            .lines()
            .next()
            .map(str::to_string),
        None => Some(rd.clone()),
    };
    if let Some(uri) = first_uri {
        client.connect(&uri).await?;
    }
    let mashup = Mashup::new(client, config);

    // The mashup's own resource: GET /aggregate answers
    // {"count":..,"mean":..,"max":..,"unobserved":..}; observers hear every change.
    let server = Server::new()
        .route("/aggregate", mashup.resource())
        .bind(listen)
        .await?;
    println!("serving coap://{listen}/aggregate; following rt=temperature at {rd}");

    // The report line, first once before anything is observed (the baseline of a
    // benchmark's memory per observation), then every few seconds until Ctrl-C. Each
    // carries when it was written and the process's CPU time and memory then, so that
    // a reader late to read it still gets the numbers of that moment.
    let report_line = || {
        println!(
            "{} observing {} notifications {}{}",
            mashup.aggregate().to_json(),
            mashup.observed(),
            mashup.notifications(),
            process_usage()
        )
    };
    report_line();

    // Look up now and every `relookup_every`: devices that appeared are observed
    // (up to the bound; the rest are counted as unobserved), devices that vanished
    // from the directory leave the aggregate, observations that ended start again.
    // (`file:PATH` in place of the directory: the resource URIs listed there, one
    // per line, are followed instead, without a directory.)
    let follower = match rd.strip_prefix("file:") {
        Some(path) => {
            let uris: Vec<String> = std::fs::read_to_string(path)?
                .lines()
                .map(str::to_string)
                .collect();
            mashup.follow_resources(&uris);
            tokio::spawn(std::future::pending())
        }
        None => tokio::spawn(mashup.clone().run()),
    };
    let mut report = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = report.tick() => report_line(),
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    follower.abort();
    server.shutdown(Duration::from_secs(1)).await;
    Ok(())
}

/// " at UNIX_SECONDS cpu_s SECONDS rss_kb KIB heap_kb KIB": this process's CPU time
/// (user and system) and resident memory now, from Linux's /proc (empty elsewhere),
/// and its heap (the bytes allocated and not freed).
fn process_usage() -> String {
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    // After the command name in parentheses: state is field 3, utime 14, stime 15, in
    // clock ticks of 1/100 s.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok());
    match (ticks(11), ticks(12), rss_kb) {
        (Some(user), Some(system), Some(rss)) => {
            format!(
                " at {at:.3} cpu_s {:.2} rss_kb {rss} heap_kb {}",
                (user + system) as f64 / 100.0,
                HEAP_BYTES.load(Ordering::Relaxed).max(0) / 1024
            )
        }
        _ => String::new(),
    }
}

//! The demo resources every `cobalt serve` has.

use super::clock::now_utc;
use cobalt::server::{get, post, IntoResponse, MethodRouter, Observable, Request};
use cobalt::{content_format, Code, Response, Server};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The longest delay `/separate?delay=MS` accepts.
const MAX_DELAY_MS: u64 = 30_000;
/// Size of `/large`.
const LARGE_SIZE: usize = 4096;

/// Background work the demo resources need (the `/obs` ticker).
pub struct Demo {
    ticker: Observable,
    ticks: Arc<AtomicU64>,
}

impl Demo {
    /// Changes `/obs` every second until the runtime stops.
    pub fn start_ticker(&self) {
        let (obs, ticks) = (self.ticker.clone(), self.ticks.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            every.tick().await;
            loop {
                every.tick().await;
                ticks.fetch_add(1, Ordering::Relaxed);
                obs.changed();
            }
        });
    }
}

/// Adds `/benchmark` (and, unlisted, `/benchmark/{n}` and `/benchmark/static`: the same
/// answer through a route with a parameter and a static route as deep, to measure what
/// matching a parameter costs), `/time`, `/echo`, `/separate`, `/obs`, `/state`, `/large` and `/upload`.
pub fn routes(server: Server) -> (Server, Demo) {
    let demo = Demo {
        ticker: Observable::new(),
        ticks: Arc::new(AtomicU64::new(0)),
    };
    let ticks = demo.ticks.clone();
    let server = server
        .route(
            "/benchmark",
            get(|| async { "hello world" })
                .title("CoAPBench resource")
                .rt("benchmark")
                .ct(content_format::TEXT_PLAIN),
        )
        .route("/benchmark/{n}", get(|| async { "hello world" }))
        .route(
            "/benchmark/static",
            get(|| async { "hello world" }).hidden(),
        )
        .route(
            "/time",
            get(|| async { Response::text(now_utc()).with_max_age(1) })
                .title("Current UTC time")
                .rt("clock")
                .ct(content_format::TEXT_PLAIN),
        )
        .route(
            "/echo",
            post(echo)
                .put(echo)
                .title("Echoes the payload of POST and PUT")
                .rt("echo"),
        )
        .route(
            "/separate",
            get(separate)
                .title("Answers after ?delay=MS (default 1500) with a separate response")
                .rt("separate"),
        )
        .route(
            "/obs",
            get(move || {
                let n = ticks.load(Ordering::Relaxed);
                async move { Response::text(format!("tick {n} at {}", now_utc())).with_max_age(2) }
            })
            .observable(&demo.ticker)
            .title("Observable: changes every second")
            .rt("tick"),
        )
        .route("/state", state_resource())
        .route(
            "/large",
            get(|| async { Response::text(large_text(LARGE_SIZE)) })
                .title("A 4 KiB representation, sent block-wise")
                .attr("sz", &LARGE_SIZE.to_string()),
        )
        .route("/upload", upload_resource());
    (server, demo)
}

/// Deterministic text of `len` bytes: numbered lines, so a broken transfer shows where.
pub fn large_text(len: usize) -> String {
    let mut s = String::with_capacity(len + 32);
    let mut i = 0;
    while s.len() < len {
        s.push_str(&format!(
            "line {i:04}: the quick brown fox jumps over the lazy dog\n"
        ));
        i += 1;
    }
    s.truncate(len);
    s
}

async fn echo(req: Request) -> Response {
    let mut r = Response::new(Code::CHANGED).with_payload(req.payload().to_vec());
    if let Some(cf) = req.content_format() {
        r = r.with_content_format(cf);
    }
    r
}

async fn separate(req: Request) -> Response {
    let delay = match req.query_param("delay").map(str::parse::<u64>) {
        None => 1500,
        Some(Ok(ms)) if ms <= MAX_DELAY_MS => ms,
        Some(_) => {
            return (
                Code::BAD_REQUEST,
                format!("delay must be 0..={MAX_DELAY_MS} milliseconds"),
            )
                .into_response()
        }
    };
    tokio::time::sleep(Duration::from_millis(delay)).await;
    Response::text(format!("answered after {delay} ms"))
}

/// A value that GET reads, PUT replaces, and observers hear about.
fn state_resource() -> MethodRouter {
    let obs = Observable::new();
    let value = Arc::new(Mutex::new(b"initial".to_vec()));
    let read = value.clone();
    let changed = obs.clone();
    get(move || {
        let v = read.lock().unwrap_or_else(|e| e.into_inner()).clone();
        async move { Response::content(v).with_content_format(content_format::TEXT_PLAIN) }
    })
    .put(move |req: Request| {
        *value.lock().unwrap_or_else(|e| e.into_inner()) = req.payload().to_vec();
        changed.changed();
        async { Code::CHANGED }
    })
    .observable(&obs)
    .title("Observable: changes on PUT")
    .rt("state")
}

/// Accepts large bodies (block-wise) with PUT or POST and returns the last one on GET.
fn upload_resource() -> MethodRouter {
    let stored = Arc::new(Mutex::new(Vec::<u8>::new()));
    let (read, write) = (stored.clone(), stored);
    let store = move |req: Request| {
        let len = req.payload().len();
        *write.lock().unwrap_or_else(|e| e.into_inner()) = req.payload().to_vec();
        async move { (Code::CHANGED, format!("stored {len} bytes")).into_response() }
    };
    get(move || {
        let v = read.lock().unwrap_or_else(|e| e.into_inner()).clone();
        async move { Response::content(v) }
    })
    .put(store.clone())
    .post(store)
    .title("Stores a large body sent with PUT or POST (block-wise)")
}

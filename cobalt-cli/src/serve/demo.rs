//! The demo resources every `cobalt serve` has.

use super::clock::now_utc;
use cobalt::server::{get, post, IntoResponse, Request};
use cobalt::{content_format, Code, Response, Server};
use std::time::Duration;

/// The longest delay `/separate?delay=MS` accepts.
const MAX_DELAY_MS: u64 = 30_000;

/// Adds `/benchmark`, `/time`, `/echo` and `/separate` (a delayed, separate response).
pub fn routes(server: Server) -> Server {
    server
        .route(
            "/benchmark",
            get(|| async { "hello world" })
                .title("CoAPBench resource")
                .rt("benchmark")
                .ct(content_format::TEXT_PLAIN),
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

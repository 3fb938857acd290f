//! A minimal CoAP server: `cargo run --example server -- [ADDRESS]` (default
//! `127.0.0.1:5683`; `[::]:5683` serves IPv4 and IPv6), then
//! `cobalt get coap://127.0.0.1:5683/hello` or
//! `cargo run --example observe -- coap://127.0.0.1:5683/temp`.

use cobalt::server::{get, post, Observable, Request};
use cobalt::Scheme;
use cobalt::{Code, Server};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

#[tokio::main]
async fn main() -> cobalt::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:5683".into());
    // An observable "temperature" that changes every second.
    let temp = Observable::new();
    let tenths = Arc::new(AtomicU32::new(215));
    let reading = tenths.clone();
    let server = Server::new()
        .route("/hello", get(|| async { "hello world" }).rt("greeting"))
        .route(
            "/echo",
            post(|req: Request| async move { (Code::CHANGED, req.payload().to_vec()) }),
        )
        .route(
            "/temp",
            get(move || {
                let t = reading.load(Ordering::Relaxed);
                async move { format!("{}.{} C", t / 10, t % 10) }
            })
            .observable(&temp),
        )
        .bind(addr.as_str())
        .await?;
    println!(
        "listening on coap://{}",
        server.local_addr(Scheme::Coap).unwrap()
    );
    let changes = tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            tenths.fetch_add(1, Ordering::Relaxed);
            temp.changed();
        }
    });
    tokio::signal::ctrl_c().await?;
    changes.abort();
    server.shutdown(std::time::Duration::from_secs(1)).await;
    Ok(())
}

//! What the OSCORE interop tests share: a Cobalt server with the resources the peers'
//! servers have.

use cobalt::server::{get, post, Observable, Request, Server};
use cobalt_oscore::Oscore;
use std::time::Duration;

/// A Cobalt server on 127.0.0.1:`port` behind `oscore`, with resources like the
/// peers': /hello, /echo (POST: the payload), /big (2000 letters, Block2 through
/// OSCORE) and /temp (observable, "tN", changed every 200 ms).
pub async fn cobalt_server(oscore: Oscore, port: u16) -> cobalt::ServerHandle {
    let temp = Observable::new();
    let ticking = temp.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            ticking.changed();
        }
    });
    let count = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let big: String = (0..2000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    Server::new()
        .route("/hello", get(|| async { "hello from cobalt" }))
        .route(
            "/echo",
            post(|r: Request| async move { r.payload().to_vec() }),
        )
        .route(
            "/big",
            get(move || {
                let big = big.clone();
                async move { big }
            }),
        )
        .route(
            "/temp",
            get(move || {
                let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async move { format!("t{n}") }
            })
            .observable(&temp),
        )
        .layer(oscore)
        .shards(1)
        .bind(format!("127.0.0.1:{port}").as_str())
        .await
        .unwrap()
}

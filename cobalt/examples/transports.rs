//! Requests per second over each transport, in one run: one server serving the same
//! `/benchmark` over UDP, DTLS (PSK), TCP, TLS (PSK), WebSockets and secure WebSockets
//! (PSK) on loopback, and `TASKS`
//! clients (each with its own socket or connection) looping over requests.
//!
//! `cargo run --release --example transports -- [SECONDS] [TASKS]` (defaults 3 and 50).
//! A throughput comparison of the stacks, not of the machine: read the ratios.

use cobalt::server::get;
use cobalt::transport::credentials::PskStore;
use cobalt::Scheme;
use cobalt::{Client, Server};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() -> cobalt::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let seconds: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let tasks: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(50);
    let any = |port| std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let server = Server::new()
        .route("/benchmark", get(|| async { "hello world" }))
        .psk(PskStore::new().with("bench", "secret-key"))
        .listen(Scheme::Coaps, any(0))
        .listen(Scheme::CoapTcp, any(0))
        .listen(Scheme::CoapWs, any(0))
        .listen(Scheme::CoapsTcp, any(0))
        .listen(Scheme::CoapsWs, any(0))
        .shards(1)
        .bind(any(0))
        .await?;
    let udp = server.local_addr(Scheme::Coap).unwrap();
    let targets = [
        ("coap (UDP)", format!("coap://{udp}/benchmark")),
        (
            "coaps (DTLS PSK)",
            format!(
                "coaps://{}/benchmark",
                server.local_addr(Scheme::Coaps).expect("dtls")
            ),
        ),
        (
            "coap+tcp",
            format!(
                "coap+tcp://{}/benchmark",
                server.local_addr(Scheme::CoapTcp).expect("tcp")
            ),
        ),
        (
            "coaps+tcp (TLS PSK)",
            format!(
                "coaps+tcp://{}/benchmark",
                server.local_addr(Scheme::CoapsTcp).expect("tls")
            ),
        ),
        (
            "coap+ws",
            format!(
                "coap+ws://{}/benchmark",
                server.local_addr(Scheme::CoapWs).expect("ws")
            ),
        ),
        (
            "coaps+ws (TLS PSK)",
            format!(
                "coaps+ws://{}/benchmark",
                server.local_addr(Scheme::CoapsWs).expect("wss")
            ),
        ),
    ];
    println!("{tasks} concurrent request loops, {seconds} s per transport");
    let mut base = None;
    for (name, uri) in targets {
        // One client per loop, as separate devices would be: a single UDP endpoint may
        // send at most 65,536 messages to one server per EXCHANGE_LIFETIME (RFC 7252 §4.4).
        let mut clients = Vec::new();
        for _ in 0..tasks {
            let client = Client::new().with_psk("bench", "secret-key");
            // Warm up: handshakes and connections happen here, not in the measurement.
            client.get(&uri).await?;
            clients.push(client);
        }
        let done = Arc::new(AtomicU64::new(0));
        let until = Instant::now() + Duration::from_secs_f64(seconds);
        let mut loops = Vec::new();
        for client in clients {
            let (c, u, d) = (client, uri.clone(), done.clone());
            loops.push(tokio::spawn(async move {
                while Instant::now() < until {
                    if c.get(&u).await.is_ok() {
                        d.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        for l in loops {
            let _ = l.await;
        }
        let rate = done.load(Ordering::Relaxed) as f64 / seconds;
        let ratio = rate / *base.get_or_insert(rate);
        println!("{name:20} {rate:>10.0} req/s   {:>5.2}× UDP", ratio);
    }
    server.shutdown(Duration::from_secs(1)).await;
    Ok(())
}

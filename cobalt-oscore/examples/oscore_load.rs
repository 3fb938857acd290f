//! Closed-loop load for `bench/oscore.sh`: CLIENTS tasks each GET the URI one request
//! after another for SECONDS, protected with OSCORE when a credentials file is given;
//! prints the 2.xx answers and the time taken as one line of JSON. It stops early
//! after [`MID_BUDGET`] requests: one client endpoint has 65,536 message IDs, and a
//! server takes a reused one within EXCHANGE_LIFETIME (247 s) for a duplicate.
//!
//! Usage: oscore_load URI CLIENTS SECONDS [CREDENTIALS]

use cobalt::Client;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Requests one run sends at most (below the 65,536 message IDs of its endpoint).
const MID_BUDGET: u64 = 60_000;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        return Err("usage: oscore_load URI CLIENTS SECONDS [CREDENTIALS]".into());
    }
    let (uri, clients, seconds) = (
        args[1].clone(),
        args[2].parse::<usize>()?,
        args[3].parse::<f64>()?,
    );
    let mut client = Client::new();
    if let Some(file) = args.get(4) {
        let credentials = cobalt_oscore::Credentials::load(file.as_ref())?;
        client = client.layer(
            credentials
                .oscore()
                .ok_or("no OSCORE context in the file")?,
        );
    }
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (client, uri, done, failed) =
                (client.clone(), uri.clone(), done.clone(), failed.clone());
            tokio::spawn(async move {
                let sent = || done.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed);
                while Instant::now() < deadline && sent() < MID_BUDGET {
                    match client.get(&uri).await {
                        Ok(r) if r.code.is_success() => done.fetch_add(1, Ordering::Relaxed),
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    for task in tasks {
        task.await?;
    }
    println!(
        "{{\"ok\": {}, \"failed\": {}, \"seconds\": {:.3}}}",
        done.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

//! Closed-loop load for `bench/oscore.sh`: CLIENTS tasks each GET the URI one request
//! after another for SECONDS, through one client endpoint, with what a credentials
//! file gives for the URI: OSCORE when it names a context, the DTLS pre-shared key of
//! a matching `coaps://` entry. Prints the 2.xx answers, the other answers by code
//! (`"4.01": N`; errors without an answer as `"error"`) and the time taken as one
//! line of JSON; with `OSCORE_LOAD_DEBUG` set in the environment, each error goes to
//! stderr too. DTLS needs the crate's `vendored-openssl` feature. It stops early
//! after [`MID_BUDGET`] requests: one client endpoint has 65,536 message IDs, and a
//! server takes a reused one within EXCHANGE_LIFETIME (247 s) for a duplicate.
//!
//! Usage: oscore_load URI CLIENTS SECONDS [CREDENTIALS]

use cobalt::proto::uri::CoapUri;
use cobalt::transport::credentials::ClientCredentials;
use cobalt::Client;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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
        let parsed = CoapUri::parse(&uri).map_err(|e| format!("{uri}: {e}"))?;
        let transport = credentials.client_transport_for(&parsed).cloned();
        let has_transport = transport.is_some();
        client = match transport {
            Some(ClientCredentials::Psk(psk)) => client.with_psk(psk.identity, psk.key),
            Some(ClientCredentials::X509(x509)) => client.with_x509(x509),
            None => client,
        };
        match credentials.oscore() {
            Some(oscore) => client = client.layer(oscore),
            None if !has_transport => {
                return Err(
                    format!("{file} has neither an OSCORE context nor DTLS credentials").into(),
                )
            }
            None => {}
        }
    }
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (client, uri, done, failed, failures) = (
                client.clone(),
                uri.clone(),
                done.clone(),
                failed.clone(),
                failures.clone(),
            );
            tokio::spawn(async move {
                let sent = || done.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed);
                while Instant::now() < deadline && sent() < MID_BUDGET {
                    let what = match client.get(&uri).await {
                        Ok(r) if r.code.is_success() => {
                            done.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        Ok(r) => r.code.to_string(),
                        Err(e) => {
                            if std::env::var_os("OSCORE_LOAD_DEBUG").is_some() {
                                eprintln!("{e}");
                            }
                            "error".to_string()
                        }
                    };
                    failed.fetch_add(1, Ordering::Relaxed);
                    *failures.lock().unwrap().entry(what).or_default() += 1;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await?;
    }
    let by_code: Vec<String> = failures
        .lock()
        .unwrap()
        .iter()
        .map(|(what, n)| format!("\"{what}\": {n}"))
        .collect();
    println!(
        "{{\"ok\": {}, \"failed\": {}, \"failures\": {{{}}}, \"seconds\": {:.3}}}",
        done.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        by_code.join(", "),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

//! An LwM2M manager: LwM2M clients register over coap (and coaps with one PSK); each
//! new client's Device object is read and its clock observed.
//!
//! ```text
//! cargo run -p cobalt-lwm2m --example lwm2m_manager -- 5683 5684 device-1 secretkey
//! # then point an LwM2M client at coap://HOST:5683 (or coaps://HOST:5684 with the PSK)
//! ```

use cobalt::transport::credentials::PskStore;
use cobalt::{Scheme, Server};
use cobalt_lwm2m::{Format, LwPath, Lwm2mServer};
use cobalt_rd::{MemoryStore, RdLimits};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let port = args.first().map_or("5683", String::as_str);
    let dtls_port = args.get(1).map_or("5684", String::as_str);
    let identity = args.get(2).map_or("device-1", String::as_str);
    let key = args.get(3).map_or("secretkey", String::as_str);

    // The registrations live in memory here; `cobalt_rd::RedbStore` keeps them on disk.
    let lwm2m = Lwm2mServer::open(Arc::new(MemoryStore::new()), RdLimits::default()).await?;
    let server = lwm2m
        .install(Server::new())
        .psk(PskStore::new().with(identity, key))
        .shards(1) // requests to a client leave from the socket it registered at
        .listen(Scheme::Coap, format!("0.0.0.0:{port}"))
        .listen(Scheme::Coaps, format!("0.0.0.0:{dtls_port}"))
        .start()
        .await?;
    let _expiry = lwm2m.spawn_expiry();
    println!("LwM2M server on coap port {port} and coaps port {dtls_port}");

    // Greet each new client: read its Device object and observe its clock.
    let mut seen = HashSet::new();
    loop {
        for client in lwm2m.clients().await {
            if !seen.insert(client.endpoint.clone()) {
                continue;
            }
            println!(
                "{} registered from {} ({:?})",
                client.endpoint, client.address, client.objects
            );
            let device = lwm2m.device(&client.endpoint).await?;
            match device
                .read(&LwPath::instance(3, 0), Format::SenmlJson)
                .await
            {
                Ok(entries) => entries
                    .iter()
                    .for_each(|e| println!("  {} = {}", e.path, e.value)),
                Err(e) => println!("  read failed: {e}"),
            }
            tokio::spawn(async move {
                let clock = LwPath::resource(3, 0, 13);
                let Ok(mut observation) = device.observe(&clock, Format::SenmlJson).await else {
                    return;
                };
                while let Some(Ok(entries)) = observation.next().await {
                    entries
                        .iter()
                        .for_each(|e| println!("  {} now {}", e.path, e.value));
                }
            });
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    server.shutdown(Duration::from_secs(1)).await;
    Ok(())
}

//! A device that serves a temperature and keeps it registered at a resource directory.
//!
//! ```text
//! cargo run -p cobalt-cli -- rd --port 5683 --in-memory        # a directory
//! cargo run -p cobalt-rd --example rd_client -- coap://127.0.0.1:5683 kitchen
//! cargo run -p cobalt-cli -- rd lookup res coap://127.0.0.1:5683 'rt=temp*'
//! ```

use cobalt::server::get;
use cobalt::{Client, Server};
use cobalt_rd::RdClient;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let rd = args
        .next()
        .unwrap_or_else(|| "coap://127.0.0.1:5683".into());
    let name = args.next().unwrap_or_else(|| "example-sensor".into());

    // The device's own resources, on a port of its own.
    let device = Server::new()
        .route("/temp", get(|| async { "21.5" }).rt("temperature").ct(0))
        .bind("0.0.0.0:0")
        .await?;
    let port = device
        .local_addr(cobalt::Scheme::Coap)
        .map(|a| a.port())
        .unwrap_or(0);

    // Register those links with the device's address as base, and keep them
    // registered: renewed before the lifetime runs out, registered again if the
    // directory lost them.
    let client = Client::new();
    let registration_interface = RdClient::discover(&client, &rd).await?;
    let mut registration = RdClient::new(client, &registration_interface, &name)
        .lifetime(300)
        .base(&format!("coap://127.0.0.1:{port}"))
        .links("</temp>;rt=\"temperature\";ct=0");
    println!("registered at {}", registration.register().await?);
    tokio::select! {
        result = registration.keep_registered() => result?,
        _ = tokio::signal::ctrl_c() => {
            registration.remove().await?;
            println!("removed");
        }
    }
    Ok(())
}

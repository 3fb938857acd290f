//! Observing a resource (RFC 7641):
//! `cargo run --example observe -- coap://127.0.0.1:5683/temp [COUNT]` prints COUNT
//! notifications (default 5), then ends the relation with the server. Try it against
//! `cargo run --example server`. The blocking client does the same with an iterator:
//! `cobalt::client::blocking::Client::new().observe(uri)?.take(5)`.

#[tokio::main]
async fn main() -> cobalt::Result<()> {
    let mut args = std::env::args().skip(1);
    let uri = args
        .next()
        .unwrap_or_else(|| "coap://127.0.0.1:5683/temp".into());
    let count: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(5);
    let mut observation = cobalt::Client::new()
        .observe(&uri)
        .await?
        .on_reregister(|r| {
            eprintln!(
                "{}; registering again ({} of {})",
                r.reason, r.attempt, r.max
            )
        });
    for _ in 0..count {
        match observation.next().await {
            Some(notification) => println!("{}", notification?.text_payload()),
            None => return Ok(()), // the server ended the relation
        }
    }
    // Tell the server we are done (GET with Observe=1), instead of leaving the relation
    // to time out.
    observation.cancel().await?;
    Ok(())
}

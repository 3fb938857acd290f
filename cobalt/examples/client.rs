//! A minimal CoAP client: `cargo run --example client -- coap://127.0.0.1:5683/hello`.
//! Errors are returned from `main`, which prints them as `Error: <message>`.

#[tokio::main]
async fn main() -> cobalt::Result<()> {
    let uri = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "coap://127.0.0.1:5683/hello".into());
    let response = cobalt::Client::new().get(&uri).await?;
    println!("{}: {}", response.code, response.text_payload());
    Ok(())
}

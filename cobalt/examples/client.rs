//! A minimal CoAP client: `cargo run --example client -- coap://127.0.0.1:5683/hello`.

#[tokio::main]
async fn main() {
    let uri = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "coap://127.0.0.1:5683/hello".into());
    let client = cobalt::Client::new();
    match client.get(&uri).await {
        Ok(response) => println!("{}: {}", response.code, response.text_payload()),
        Err(e) => {
            eprintln!("request failed: {e}");
            std::process::exit(1);
        }
    }
}

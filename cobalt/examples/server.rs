//! A minimal CoAP server: `cargo run --example server`, then
//! `cobalt get coap://127.0.0.1:5683/hello`.

use cobalt::server::{get, post, Request};
use cobalt::{Code, Server};

#[tokio::main]
async fn main() -> cobalt::Result<()> {
    let server = Server::new()
        .route("/hello", get(|| async { "hello world" }).rt("greeting"))
        .route(
            "/echo",
            post(|req: Request| async move { (Code::CHANGED, req.payload().to_vec()) }),
        )
        .bind("127.0.0.1:5683")
        .await?;
    println!("listening on coap://{}", server.local_addr());
    tokio::signal::ctrl_c().await?;
    server.shutdown(std::time::Duration::from_secs(1)).await;
    Ok(())
}

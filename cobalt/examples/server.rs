//! A minimal CoAP server: `cargo run --example server -- [ADDRESS]` (default
//! `127.0.0.1:5683`; `[::]:5683` serves IPv4 and IPv6), then
//! `cobalt get coap://127.0.0.1:5683/hello/you`,
//! `cobalt post coap://127.0.0.1:5683/notes --payload "buy milk"` (answers where the new
//! note is, e.g. `/notes/0`; DELETE removes it) or
//! `cargo run --example observe -- coap://127.0.0.1:5683/temp`.

use cobalt::server::extract::{Path, Payload, Text};
use cobalt::server::{get, post, Observable, Request, Routes, State};
use cobalt::{Code, Response, Scheme, Server};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// What the handlers share: the temperature in tenths of a degree and the number of
/// the next note.
#[derive(Clone)]
struct Shared {
    tenths: Arc<AtomicU32>,
    next_note: Arc<AtomicU32>,
}

/// POST /notes: the note becomes a resource of its own, `/notes/{n}`, answering GET
/// and removed by DELETE.
async fn add_note(State(shared): State<Shared>, routes: Routes, Text(note): Text) -> Response {
    let path = format!(
        "/notes/{}",
        shared.next_note.fetch_add(1, Ordering::Relaxed)
    );
    let resource = get(move || std::future::ready(note.clone()))
        .delete(|routes: Routes, req: Request| async move {
            if routes.remove(&req.path()) {
                Code::DELETED
            } else {
                Code::NOT_FOUND
            }
        })
        .rt("note");
    match routes.insert(&path, resource) {
        Ok(()) => Response::created(&path),
        Err(e) => Response::new(Code::INTERNAL_SERVER_ERROR).with_payload(e.to_string()),
    }
}

#[tokio::main]
async fn main() -> cobalt::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:5683".into());
    // An observable "temperature" that changes every second.
    let temp = Observable::new();
    let shared = Shared {
        tenths: Arc::new(AtomicU32::new(215)),
        next_note: Arc::new(AtomicU32::new(0)),
    };
    let tenths = shared.tenths.clone();
    let server = Server::new()
        .with_state(shared)
        .route("/hello", get(|| async { "hello world" }).rt("greeting"))
        .route(
            "/hello/{name}",
            get(|Path(name): Path<String>| async move { format!("hello {name}") }),
        )
        .route(
            "/echo",
            post(|Payload(body): Payload| async move { (Code::CHANGED, body) }),
        )
        .route(
            "/temp",
            get(|State(shared): State<Shared>| async move {
                let t = shared.tenths.load(Ordering::Relaxed);
                format!("{}.{} C", t / 10, t % 10)
            })
            .observable(&temp),
        )
        .route("/notes", post(add_note).rt("notes"))
        .bind(addr.as_str())
        .await?;
    println!(
        "listening on coap://{}",
        server.local_addr(Scheme::Coap).unwrap()
    );
    let changes = tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            tenths.fetch_add(1, Ordering::Relaxed);
            temp.changed();
        }
    });
    tokio::signal::ctrl_c().await?;
    changes.abort();
    server.shutdown(std::time::Duration::from_secs(1)).await;
    Ok(())
}

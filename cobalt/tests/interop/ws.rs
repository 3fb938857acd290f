//! CoAP over WebSockets (RFC 8323 §4, `coap+ws://`) with aiocoap, each way:
//! `aiocoap-client` against a Cobalt server, and Cobalt's client against
//! `tests/peers/aiocoap_server.py` run with aiocoap's `ws` server transport.
//!
//! aiocoap needs its `ws` extra (the `websockets` package) for this;
//! `scripts/install-test-deps.sh` installs `aiocoap[ws]`. libcoap is not tested
//! here: Debian's libcoap 4.3.1 (`libcoap3-bin`) is built without WebSocket support.

use crate::observed;
use crate::stream::{self, Transport};
use crate::{gets_posts_and_gets_big, observe_changes_then_cancel, our_server, start_on, Tool};
use cobalt::{Client, Code, Scheme};
use cobalt_test_support::need;
use cobalt_test_support::peers::aiocoap::{self, Serve};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aiocoap_client_against_our_ws_server() {
    let client = need!("aiocoap-client", aiocoap::client());
    if aiocoap::ws_python().is_none() {
        return;
    }
    let (server, base) = start_on(our_server("hello world"), Scheme::CoapWs).await;
    gets_posts_and_gets_big(Tool::Aiocoap, &client, &[], &base, "hello world").await;
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_against_aiocoap_ws_server() {
    let Some(python) = aiocoap::ws_python() else {
        return;
    };
    let server = aiocoap::server(&python, Serve::Ws, None);
    let client = Client::new();
    let send = |code: Code, path: &str, payload: &[u8]| {
        client
            .request(code, &server.scheme_uri("coap+ws", path))
            .payload(payload.to_vec())
            .timeout(Duration::from_secs(10))
            .send()
    };
    let r = send(Code::GET, "/hello", b"").await.unwrap();
    assert_eq!(
        (r.code, r.text_payload().as_str()),
        (Code::CONTENT, "hello from aiocoap")
    );
    let r = send(Code::POST, "/echo", b"from cobalt over ws")
        .await
        .unwrap();
    assert_eq!(
        (r.code, r.text_payload().as_str()),
        (Code::CHANGED, "from cobalt over ws")
    );
    let r = send(Code::GET, "/large", b"").await.unwrap();
    assert_eq!(r.code, Code::CONTENT);
    assert_eq!(r.payload.len(), 3000);
    assert!(r.text_payload().starts_with("line 0000: abc"));
    let r = send(Code::GET, "/.well-known/core", b"").await.unwrap();
    assert!(
        r.text_payload().contains("</hello>"),
        "{}",
        r.text_payload()
    );
    let r = send(Code::GET, "/missing", b"").await.unwrap();
    assert_eq!(r.code, Code::NOT_FOUND);
    // Observe over coap+ws: aiocoap's /counter ticks every 0.5 s.
    observe_changes_then_cancel(&client, &server.scheme_uri("coap+ws", "/counter")).await;
    // Block1 in 256-byte blocks, reassembled by aiocoap and echoed.
    let body: Vec<u8> = stream::body(5000).iter().map(|b| b'a' + b % 26).collect();
    let r = client
        .request(Code::PUT, &server.scheme_uri("coap+ws", "/echo"))
        .payload(body.clone())
        .block_size(256)
        .unwrap()
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.code, Code::CHANGED);
    assert_eq!(r.payload, body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aiocoap_observes_and_uploads_to_our_ws_server() {
    let Some(python) = aiocoap::ws_python() else {
        return;
    };
    let client = need!("aiocoap-client", aiocoap::client());
    observed::aiocoap_observes_and_uploads(Transport::Ws, &python, &client).await;
}

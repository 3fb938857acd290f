//! CoAP over TCP with libcoap's `coap-client-notls` / `coap-server-notls` and
//! aiocoap's `aiocoap-client` / `aiocoap-fileserver` / `tests/peers/aiocoap_observe.py`,
//! each way: requests, observe (RFC 7641 over RFC 8323 §7), Block1 uploads and BERT
//! (RFC 8323 §6; libcoap 4.3.1 and aiocoap 0.4.17 both announce Block-Wise-Transfer
//! in their CSM and use it).

use crate::observed::{self, bert_blocks, ticks, Observed};
use crate::stream::{self, Transport};
use crate::{
    fetch, gets_posts_and_gets_big, observe_changes_then_cancel, our_server, run, start_on, Tool,
};
use cobalt::proto::message::TcpMessage;
use cobalt::proto::tcp_connection::TcpConfig;
use cobalt::{Client, Code, Scheme};
use cobalt_test_support::need;
use cobalt_test_support::peers::aiocoap;
use cobalt_test_support::peers::libcoap::{self, Port};
use cobalt_test_support::ports::V4;
use cobalt_test_support::temp::TempDir;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A client program (`tool`, at `client`) against our server over coap+tcp.
async fn against_our_server(tool: Tool, client: &Path) {
    let (server, base) = start_on(our_server("hello world"), Scheme::CoapTcp).await;
    // /big: 3000 bytes, more than libcoap's default Max-Message-Size, so in blocks.
    gets_posts_and_gets_big(tool, client, &[], &base, "hello world").await;
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_against_our_server() {
    let client = need!(libcoap::CLIENT, libcoap::tool(libcoap::CLIENT));
    against_our_server(Tool::Libcoap, &client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aiocoap_client_against_our_server() {
    let client = need!("aiocoap-client", aiocoap::client());
    against_our_server(Tool::Aiocoap, &client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_against_libcoap_server() {
    let program = need!(libcoap::SERVER, libcoap::tool(libcoap::SERVER));
    let server = libcoap::server(&program, V4, &[], Port::CoapTcp, None);
    let client = Client::new();
    let at = |path: &str| server.scheme_uri("coap+tcp", path);
    // libcoap's example server describes itself at the root and serves /time.
    let r = fetch(&client, &at("/")).await;
    assert_eq!(r.code, Code::CONTENT, "{}", r.text_payload());
    assert!(r.text_payload().contains("libcoap"), "{}", r.text_payload());
    let r = fetch(&client, &at("/.well-known/core")).await;
    assert_eq!(r.code, Code::CONTENT);
    assert!(r.text_payload().contains("</time>"), "{}", r.text_payload());
    // Several requests reuse the pooled connection.
    for _ in 0..3 {
        assert_eq!(
            fetch(&client, &at("/nonexistent")).await.code,
            Code::NOT_FOUND
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_connects_ahead_to_libcoap_server_with_one_byte_tokens() {
    let program = need!(libcoap::SERVER, libcoap::tool(libcoap::SERVER));
    let server = libcoap::server(&program, V4, &[], Port::CoapTcp, None);
    let uri = server.scheme_uri("coap+tcp", "/");
    let client = Client::new();
    client.set_tcp_config(TcpConfig {
        token_len: 1,
        ..Default::default()
    });
    let seen: Arc<Mutex<Vec<(bool, TcpMessage)>>> = Default::default();
    let log = seen.clone();
    client.set_stream_tracer(Arc::new(move |sent, _, m| {
        log.lock().unwrap().push((sent, m.clone()));
    }));
    // connect() returns once the server's CSM is in: handshake and CSM are done.
    tokio::time::timeout(Duration::from_secs(5), client.connect(&uri))
        .await
        .unwrap()
        .unwrap();
    let csm = |sent: bool| {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|(s, m)| *s == sent && m.code.is_signaling())
            .count()
    };
    // (The connection's task shows the received CSM to the tracer just after it
    // answers connect().)
    let deadline = Instant::now() + Duration::from_secs(5);
    while csm(false) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!((csm(true), csm(false)), (1, 1));
    assert_eq!(fetch(&client, &uri).await.code, Code::CONTENT);
    // The request went over that connection, with a one-byte token libcoap echoed.
    assert_eq!((csm(true), csm(false)), (1, 1));
    let requests: Vec<usize> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, m)| !m.code.is_signaling())
        .map(|(_, m)| m.token.as_bytes().len())
        .collect();
    assert_eq!(requests, [1, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_against_aiocoap_fileserver() {
    let program = need!("aiocoap-fileserver", aiocoap::program("aiocoap-fileserver"));
    let dir = TempDir::new("tcp-interop");
    dir.write("greeting.txt", "hello from aiocoap");
    let big: String = (0..5000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    dir.write("big.txt", &big);
    let server = aiocoap::fileserver(&program, dir.path());
    let client = Client::new();
    let at = |path: &str| server.scheme_uri("coap+tcp", path);
    let r = fetch(&client, &at("/greeting.txt")).await;
    assert_eq!(
        (r.code, r.text_payload().as_str()),
        (Code::CONTENT, "hello from aiocoap")
    );
    let r = fetch(&client, &at("/big.txt")).await;
    assert_eq!((r.code, r.text_payload()), (Code::CONTENT, big));
    assert_eq!(
        fetch(&client, &at("/missing.txt")).await.code,
        Code::NOT_FOUND
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_observes_and_uploads_to_our_server() {
    let client = need!(libcoap::CLIENT, libcoap::tool(libcoap::CLIENT));
    let server = Observed::start(Transport::Tcp).await;
    let obs = server.uri("coap+tcp", "/obs");
    let out = run(&client, &["-s", "2", "-B", "4", &obs]).await;
    let seen = ticks(&out.stdout);
    assert!(seen.len() >= 3, "{out}");
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    // A notification larger than libcoap's Max-Message-Size (-X) comes as a first
    // BERT block; libcoap fetches the rest.
    let big_obs = server.uri("coap+tcp", "/big-obs");
    let out = run(&client, &["-s", "1", "-B", "3", "-X", "5000", &big_obs]).await;
    // (The body starts with ASCII, so its lossy UTF-8 is the same inside the output.)
    let want = String::from_utf8_lossy(&stream::body(9000)).into_owned();
    assert!(out.stdout.contains(&want), "{out}");
    // Uploads larger than our Max-Message-Size: BERT blocks, then 1024-byte blocks.
    let dir = TempDir::new("tcp-upload");
    let data = stream::body(60_000);
    let file = dir.write("body.bin", &data).display().to_string();
    let store = server.uri("coap+tcp", "/store");
    for extra in [&[][..], &["-b", "1024"][..]] {
        server.stored.lock().unwrap().clear();
        let args = [&["-m", "put", "-B", "10", "-f", &file], extra, &[&store]].concat();
        let out = run(&client, &args).await;
        assert!(
            out.stdout.contains("stored 60000 bytes"),
            "{extra:?}: {out}"
        );
        assert!(*server.stored.lock().unwrap() == data, "{extra:?}");
    }
    // The same to the streaming handler shows the blocks: BERT without -b.
    let chunks_uri = server.uri("coap+tcp", "/chunks");
    let out = run(
        &client,
        &["-m", "put", "-B", "10", "-f", &file, &chunks_uri],
    )
    .await;
    let chunks = server.chunks.lock().unwrap().clone();
    assert_eq!(chunks.iter().sum::<usize>(), 60_000, "{chunks:?} {out}");
    assert!(bert_blocks(&chunks), "{chunks:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_observes_libcoap_and_uses_bert_with_it() {
    let program = need!(libcoap::SERVER, libcoap::tool(libcoap::SERVER));
    // -X 5000: libcoap accepts 5000-byte messages, so our 30 kB goes in BERT blocks
    // and its answer comes back in BERT blocks; -v 7 logs the messages to check that.
    let dir = TempDir::new("libcoap-log");
    let log = dir.path().join("server.log");
    let server = libcoap::server(
        &program,
        V4,
        &["-X", "5000", "-v", "7"],
        Port::CoapTcp,
        Some(&log),
    );
    let client = Client::new();
    // libcoap's /time changes every second.
    observe_changes_then_cancel(&client, &server.scheme_uri("coap+tcp", "/time")).await;
    let data = stream::body(30_000);
    let uri = server.scheme_uri("coap+tcp", "/example_data");
    let r = client
        .request(Code::PUT, &uri)
        .payload(data.clone())
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert!(r.code.is_success(), "{:?}", r.code);
    assert_eq!(fetch(&client, &uri).await.payload, data);
    drop(server);
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        log.contains("Block1:0/M/BERT"),
        "no BERT upload in libcoap's log"
    );
    assert!(log.contains("/BERT("), "no BERT download in libcoap's log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aiocoap_observes_and_uploads_to_our_server() {
    let python = need!("aiocoap", aiocoap::python());
    let client = need!("aiocoap-client", aiocoap::client());
    observed::aiocoap_observes_and_uploads(Transport::Tcp, &python, &client).await;
}

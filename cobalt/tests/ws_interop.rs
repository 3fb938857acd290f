//! CoAP over WebSockets interoperability (RFC 8323 §4, `coap+ws://`) with aiocoap,
//! each way: `aiocoap-client` against a Cobalt server, and Cobalt's client against
//! `tests/peers/aiocoap_server.py` run with aiocoap's `ws` server transport.
//!
//! aiocoap needs its `ws` extra (the `websockets` package) for this;
//! `scripts/install-test-deps.sh` installs `aiocoap[ws]`. libcoap is not tested
//! here: Debian's libcoap 4.3.1 (`libcoap3-bin`) is built without WebSocket support.
//!
//! A test whose peer is missing is skipped with a `SKIPPED:` note, unless
//! `COBALT_REQUIRE_PEERS=1`, in which case it fails.

mod common;
mod stream;

use cobalt::server::{get, post, Request};
use cobalt::Scheme;
use cobalt::{Client, Code, Server};
use common::{aiocoap, run, text, Guarded};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The aiocoap virtual environment's Python, if it can run aiocoap's WebSocket
/// transport; `None` (after a note) if the test should be skipped.
fn aiocoap_ws_python() -> Option<PathBuf> {
    let python = aiocoap("python3")?;
    let ok = Command::new(&python)
        .args(["-c", "import aiocoap, websockets"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var("COBALT_REQUIRE_PEERS").as_deref() != Ok("1"),
            "aiocoap's ws extra (websockets) missing and COBALT_REQUIRE_PEERS=1"
        );
        eprintln!(
            "SKIPPED: aiocoap without the websockets package (run \
             scripts/install-test-deps.sh; set COBALT_REQUIRE_PEERS=1 to make this a failure)"
        );
        return None;
    }
    Some(python)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aiocoap_client_against_our_ws_server() {
    let Some(client) = aiocoap("aiocoap-client") else {
        return;
    };
    if aiocoap_ws_python().is_none() {
        return;
    }
    let server = Server::new()
        .route("/hello", get(|| async { "hello world" }))
        .route(
            "/echo",
            post(|req: Request| async move { (Code::CHANGED, req.payload().to_vec()) }),
        )
        .route("/big", get(|| async { "0123456789".repeat(300) }))
        .listen(Scheme::CoapWs, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::CoapWs).unwrap();
    let out = run(
        client.clone(),
        vec![format!("coap+ws://{addr}/hello")],
        Duration::from_secs(20),
    )
    .await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("hello world"),
        "{}",
        text(&out)
    );
    let out = run(
        client.clone(),
        vec![
            "-m".into(),
            "POST".into(),
            "--payload".into(),
            "from aiocoap over ws".into(),
            format!("coap+ws://{addr}/echo"),
        ],
        Duration::from_secs(20),
    )
    .await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("from aiocoap over ws"),
        "{}",
        text(&out)
    );
    let out = run(
        client,
        vec![format!("coap+ws://{addr}/big")],
        Duration::from_secs(20),
    )
    .await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&"0123456789".repeat(300)),
        "{}",
        text(&out)
    );
    server.shutdown(Duration::ZERO).await;
}

/// A port `p` such that `p` and `p + 3000` (where aiocoap's WebSocket server listens)
/// are free just now.
fn free_port_pair() -> u16 {
    for _ in 0..100 {
        let Ok(l) = TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(p) = l.local_addr().map(|a| a.port()) else {
            continue;
        };
        if p < 60000 && TcpListener::bind(("127.0.0.1", p + 3000)).is_ok() {
            return p;
        }
    }
    panic!("no free port pair");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_against_aiocoap_ws_server() {
    let Some(python) = aiocoap_ws_python() else {
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/peers/aiocoap_server.py");
    let port = free_port_pair();
    let ws: SocketAddr = format!("127.0.0.1:{}", port + 3000).parse().unwrap();
    let dir = std::env::temp_dir().join(format!("cobalt-ws-interop-{}", std::process::id()));
    let child = Command::new(&python)
        .arg(&script)
        .args(["--port", &port.to_string(), "--transports", "ws"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start aiocoap_server.py");
    let _server = Guarded { child, dir };
    let started = Instant::now();
    while TcpStream::connect(ws).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "aiocoap did not listen for WebSockets on {ws}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let client = Client::new();
    let send = |code: Code, path: &str, payload: &[u8]| {
        client
            .request(code, &format!("coap+ws://{ws}{path}"))
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
    let mut obs = client
        .observe(&format!("coap+ws://{ws}/counter"))
        .await
        .unwrap();
    let mut counts = Vec::new();
    while counts.len() < 3 {
        let n = obs.next().await.unwrap().unwrap();
        assert!(n.options.observe().is_some(), "{n:?}");
        counts.push(n.text_payload());
    }
    counts.dedup();
    assert!(counts.len() >= 2, "{counts:?}");
    let r = obs.cancel().await.unwrap();
    assert!(r.options.observe().is_none(), "deregistered");
    // Block1 in 256-byte blocks, reassembled by aiocoap and echoed.
    let body: Vec<u8> = stream::body(5000).iter().map(|b| b'a' + b % 26).collect();
    let r = client
        .request(Code::PUT, &format!("coap+ws://{ws}/echo"))
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
    let Some(python) = aiocoap_ws_python() else {
        return;
    };
    let Some(client) = aiocoap("aiocoap-client") else {
        return;
    };
    stream::aiocoap_observes_and_uploads(stream::Transport::Ws, python, client, run).await;
}

//! CoAP over TCP interoperability with other implementations: libcoap's
//! `coap-client-notls` / `coap-server-notls` and aiocoap's `aiocoap-client` /
//! `aiocoap-fileserver` / `tests/peers/aiocoap_observe.py`, each way: requests,
//! observe (RFC 7641 over RFC 8323 §7), Block1 uploads and BERT (RFC 8323 §6; libcoap
//! 4.3.1 and aiocoap 0.4.17 both announce Block-Wise-Transfer in their CSM and use it).
//!
//! A test whose peer program is missing is skipped with a note, unless
//! `COBALT_REQUIRE_PEERS=1`, in which case it fails (`scripts/install-test-deps.sh`
//! installs the peers). libcoap's tools are looked up on `PATH`; `aiocoap-client` in
//! `$COBALT_AIOCOAP_BIN` (a directory), else the workspace's `.venv-peers/bin`, else `PATH`.

mod common;
mod stream;

use cobalt::server::{get, post, Request};
use cobalt::Scheme;
use cobalt::{Client, Code, Server, ServerHandle};
use common::{aiocoap, peer, run, text, Guarded};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use stream::Observed;

async fn our_server() -> ServerHandle {
    Server::new()
        .route("/hello", get(|| async { "hello world" }).rt("greeting"))
        .route(
            "/echo",
            post(|req: Request| async move { (Code::CHANGED, req.payload().to_vec()) }),
        )
        .route("/big", get(|| async { "0123456789".repeat(300) }))
        .listen(Scheme::CoapTcp, "127.0.0.1:0")
        .start()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_against_our_server() {
    let Some(client) = peer("coap-client-notls", &[]) else {
        return;
    };
    let server = our_server().await;
    let addr = server.local_addr(Scheme::CoapTcp).unwrap();
    let out = run(
        client.clone(),
        vec![
            "-B".into(),
            "5".into(),
            "-m".into(),
            "get".into(),
            format!("coap+tcp://{addr}/hello"),
        ],
        Duration::from_secs(10),
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
            "-B".into(),
            "5".into(),
            "-m".into(),
            "post".into(),
            "-e".into(),
            "ping over tcp".into(),
            format!("coap+tcp://{addr}/echo"),
        ],
        Duration::from_secs(10),
    )
    .await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ping over tcp"),
        "{}",
        text(&out)
    );
    // 3000 bytes: more than libcoap's default Max-Message-Size, so Block2 is used.
    let out = run(
        client,
        vec![
            "-B".into(),
            "5".into(),
            "-m".into(),
            "get".into(),
            format!("coap+tcp://{addr}/big"),
        ],
        Duration::from_secs(10),
    )
    .await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&"0123456789".repeat(300)),
        "{}",
        text(&out)
    );
    server.shutdown(Duration::ZERO).await;
}

/// A `coap-server-notls` on a free port, killed on drop.
struct LibcoapServer {
    child: Child,
    addr: SocketAddr,
}

impl Drop for LibcoapServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_libcoap_server(program: &Path) -> LibcoapServer {
    start_libcoap_server_with(program, &[], Stdio::null())
}

fn start_libcoap_server_with(program: &Path, extra: &[&str], log: Stdio) -> LibcoapServer {
    let mut log = Some(log);
    // The port is free for TCP when chosen, but the server also binds UDP and another
    // process may take the port meanwhile: try a few ports.
    for _ in 0..5 {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let child = Command::new(program)
            .args(["-A", "127.0.0.1", "-p", &port.to_string()])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.take().unwrap_or_else(Stdio::null))
            .stderr(Stdio::null())
            .spawn()
            .expect("start coap-server-notls");
        let mut server = LibcoapServer { child, addr };
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            if TcpStream::connect(addr).is_ok() {
                return server;
            }
            if server.child.try_wait().ok().flatten().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("note: coap-server-notls did not listen on {addr}; trying another port");
    }
    panic!("coap-server-notls did not start");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_against_libcoap_server() {
    let Some(program) = peer("coap-server-notls", &[]) else {
        return;
    };
    let server = start_libcoap_server(&program);
    let addr = server.addr;
    let client = Client::new();
    // libcoap's example server describes itself at the root and serves /time.
    let r = client
        .request(Code::GET, &format!("coap+tcp://{addr}/"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    assert_eq!(r.code, Code::CONTENT, "{}", r.text_payload());
    assert!(r.text_payload().contains("libcoap"), "{}", r.text_payload());
    let r = client
        .request(Code::GET, &format!("coap+tcp://{addr}/.well-known/core"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    assert_eq!(r.code, Code::CONTENT);
    assert!(r.text_payload().contains("</time>"), "{}", r.text_payload());
    // Several requests reuse the pooled connection.
    for _ in 0..3 {
        let r = client
            .request(Code::GET, &format!("coap+tcp://{addr}/nonexistent"))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap();
        assert_eq!(r.code, Code::NOT_FOUND);
    }
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_connects_ahead_to_libcoap_server_with_one_byte_tokens() {
    let Some(program) = peer("coap-server-notls", &[]) else {
        return;
    };
    let server = start_libcoap_server(&program);
    let uri = format!("coap+tcp://{}/", server.addr);
    let client = Client::new();
    client.set_tcp_config(cobalt::proto::tcp_connection::TcpConfig {
        token_len: 1,
        ..Default::default()
    });
    type Seen = std::sync::Arc<std::sync::Mutex<Vec<(bool, cobalt::proto::message::TcpMessage)>>>;
    let seen: Seen = Default::default();
    let log = seen.clone();
    client.set_stream_tracer(std::sync::Arc::new(move |sent, _, m| {
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
    let r = client
        .request(Code::GET, &uri)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    assert_eq!(r.code, Code::CONTENT);
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
async fn aiocoap_client_against_our_server() {
    let Some(client) = aiocoap("aiocoap-client") else {
        return;
    };
    let server = our_server().await;
    let addr = server.local_addr(Scheme::CoapTcp).unwrap();
    let out = run(
        client.clone(),
        vec![format!("coap+tcp://{addr}/hello")],
        Duration::from_secs(20),
    )
    .await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("hello world"),
        "{}",
        text(&out)
    );
    let out = run(
        client,
        vec![
            "-m".into(),
            "POST".into(),
            "--payload".into(),
            "from aiocoap".into(),
            format!("coap+tcp://{addr}/echo"),
        ],
        Duration::from_secs(20),
    )
    .await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("from aiocoap"),
        "{}",
        text(&out)
    );
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_against_aiocoap_fileserver() {
    let Some(program) = aiocoap("aiocoap-fileserver") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("cobalt-tcp-interop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("greeting.txt"), "hello from aiocoap").unwrap();
    let big: String = (0..5000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    std::fs::write(dir.join("big.txt"), &big).unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let child = Command::new(&program)
        .arg("--bind")
        .arg(addr.to_string())
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start aiocoap-fileserver");
    let _server = Guarded { child, dir };
    let started = Instant::now();
    while TcpStream::connect(addr).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "aiocoap-fileserver did not listen on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let client = Client::new();
    let r = client
        .request(Code::GET, &format!("coap+tcp://{addr}/greeting.txt"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.code, Code::CONTENT);
    assert_eq!(r.text_payload(), "hello from aiocoap");
    let r = client
        .request(Code::GET, &format!("coap+tcp://{addr}/big.txt"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.code, Code::CONTENT);
    assert_eq!(r.text_payload(), big);
    let r = client
        .request(Code::GET, &format!("coap+tcp://{addr}/missing.txt"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.code, Code::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_observes_and_uploads_to_our_server() {
    let Some(client) = peer("coap-client-notls", &[]) else {
        return;
    };
    let server = Observed::start(stream::Transport::Tcp).await;
    let out = run(
        client.clone(),
        vec![
            "-s".into(),
            "2".into(),
            "-B".into(),
            "4".into(),
            server.uri("coap+tcp", "/obs"),
        ],
        Duration::from_secs(10),
    )
    .await;
    let seen = stream::ticks(&String::from_utf8_lossy(&out.stdout));
    assert!(seen.len() >= 3, "{}", text(&out));
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    // A notification larger than libcoap's Max-Message-Size (-X) comes as a first
    // BERT block; libcoap fetches the rest.
    let out = run(
        client.clone(),
        vec![
            "-s".into(),
            "1".into(),
            "-B".into(),
            "3".into(),
            "-X".into(),
            "5000".into(),
            server.uri("coap+tcp", "/big-obs"),
        ],
        Duration::from_secs(10),
    )
    .await;
    assert!(
        out.stdout
            .windows(9000)
            .any(|w| w == stream::body(9000).as_slice()),
        "{}",
        text(&out)
    );
    // Uploads larger than our Max-Message-Size: BERT blocks, then 1024-byte blocks.
    let dir = std::env::temp_dir().join(format!("cobalt-tcp-upload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("body.bin");
    let data = stream::body(60_000);
    std::fs::write(&file, &data).unwrap();
    for extra in [vec![], vec!["-b".to_string(), "1024".to_string()]] {
        server.stored.lock().unwrap().clear();
        let mut args = vec![
            "-m".to_string(),
            "put".into(),
            "-B".into(),
            "10".into(),
            "-f".into(),
            file.display().to_string(),
        ];
        args.extend(extra.clone());
        args.push(server.uri("coap+tcp", "/store"));
        let out = run(client.clone(), args, Duration::from_secs(15)).await;
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("stored 60000 bytes"),
            "{extra:?}: {}",
            text(&out)
        );
        assert!(*server.stored.lock().unwrap() == data, "{extra:?}");
    }
    // The same to the streaming handler shows the blocks: BERT without -b.
    let mut args = vec!["-m".to_string(), "put".into(), "-B".into(), "10".into()];
    args.extend(["-f".into(), file.display().to_string()]);
    args.push(server.uri("coap+tcp", "/chunks"));
    let out = run(client.clone(), args, Duration::from_secs(15)).await;
    let chunks = server.chunks.lock().unwrap().clone();
    assert_eq!(
        chunks.iter().sum::<usize>(),
        60_000,
        "{chunks:?} {}",
        text(&out)
    );
    assert!(stream::bert_blocks(&chunks), "{chunks:?}");
    let _ = std::fs::remove_dir_all(&dir);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_observes_libcoap_and_uses_bert_with_it() {
    let Some(program) = peer("coap-server-notls", &[]) else {
        return;
    };
    // -X 5000: libcoap accepts 5000-byte messages, so our 30 kB goes in BERT blocks
    // and its answer comes back in BERT blocks; -v 7 logs the messages to check that.
    let log_path = std::env::temp_dir().join(format!("cobalt-libcoap-{}.log", std::process::id()));
    let log = std::fs::File::create(&log_path).unwrap();
    let server = start_libcoap_server_with(&program, &["-X", "5000", "-v", "7"], log.into());
    let addr = server.addr;
    let client = Client::new();
    // libcoap's /time changes every second.
    let mut obs = client
        .observe(&format!("coap+tcp://{addr}/time"))
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let n = obs.next().await.unwrap().unwrap();
        assert_eq!(n.code, Code::CONTENT);
        assert!(n.options.observe().is_some());
        seen.push(n.text_payload());
    }
    seen.dedup();
    assert!(seen.len() >= 2, "{seen:?}");
    let r = obs.cancel().await.unwrap();
    assert!(r.options.observe().is_none(), "deregistered");
    let data = stream::body(30_000);
    let r = client
        .request(Code::PUT, &format!("coap+tcp://{addr}/example_data"))
        .payload(data.clone())
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert!(r.code.is_success(), "{:?}", r.code);
    let r = client
        .request(Code::GET, &format!("coap+tcp://{addr}/example_data"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.payload, data);
    drop(server);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let _ = std::fs::remove_file(&log_path);
    assert!(
        log.contains("Block1:0/M/BERT"),
        "no BERT upload in libcoap's log"
    );
    assert!(log.contains("/BERT("), "no BERT download in libcoap's log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aiocoap_observes_and_uploads_to_our_server() {
    let (Some(python), Some(client)) = (aiocoap("python3"), aiocoap("aiocoap-client")) else {
        return;
    };
    stream::aiocoap_observes_and_uploads(stream::Transport::Tcp, python, client, run).await;
}

//! CoAP over TCP interoperability with other implementations: libcoap's
//! `coap-client-notls` / `coap-server-notls` and aiocoap's `aiocoap-client` /
//! `aiocoap-fileserver`, each way.
//!
//! A test whose peer program is missing is skipped with a note, unless
//! `COBALT_REQUIRE_PEERS=1`, in which case it fails (`scripts/install-test-deps.sh`
//! installs the peers). libcoap's tools are looked up on `PATH`; `aiocoap-client` in
//! `$COBALT_AIOCOAP_BIN` (a directory), else the workspace's `.venv-peers/bin`, else `PATH`.

mod common;

use cobalt::server::{get, post, Request};
use cobalt::{Client, Code, Server, ServerHandle};
use common::{aiocoap, peer, run, text, Guarded};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

async fn our_server() -> ServerHandle {
    Server::new()
        .route("/hello", get(|| async { "hello world" }).rt("greeting"))
        .route(
            "/echo",
            post(|req: Request| async move { (Code::CHANGED, req.payload().to_vec()) }),
        )
        .route("/big", get(|| async { "0123456789".repeat(300) }))
        .bind_tcp("127.0.0.1:0")
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_against_our_server() {
    let Some(client) = peer("coap-client-notls", &[]) else {
        return;
    };
    let server = our_server().await;
    let addr = server.local_addr();
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
            .stdin(Stdio::null())
            .stdout(Stdio::null())
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
async fn aiocoap_client_against_our_server() {
    let Some(client) = aiocoap("aiocoap-client") else {
        return;
    };
    let server = our_server().await;
    let addr = server.local_addr();
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

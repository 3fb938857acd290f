//! CoAP over DTLS (`coaps://`) interoperability with libcoap built on OpenSSL, with
//! PSK and with certificates from a CA generated at run time (client certificates
//! required): `coap-client-openssl` against a Cobalt server, and the Cobalt client
//! against `coap-server-openssl` (which, given `-p N`, serves coap on N and coaps on
//! N+1).
//!
//! A test whose peer program is missing is skipped with a note, unless
//! `COBALT_REQUIRE_PEERS=1`, in which case it fails (`scripts/install-test-deps.sh`
//! installs the peers). The programs are looked up on `PATH`.
#![cfg(feature = "openssl")]

mod common;

use cobalt::server::{get, post, Request};
use cobalt::transport::credentials::PskStore;
use cobalt::Scheme;
use cobalt::{Client, Code, Server, ServerHandle};
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const IDENTITY: &str = "cobalt-interop";
const KEY: &str = "secretPSK";

async fn our_server() -> ServerHandle {
    Server::new()
        .route("/hello", get(|| async { "hello over dtls" }))
        .route(
            "/echo",
            post(|req: Request| async move { (Code::CHANGED, req.payload().to_vec()) }),
        )
        .route("/big", get(|| async { "0123456789".repeat(300) }))
        .psk(PskStore::new().with(IDENTITY, KEY))
        .shards(1)
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap()
}

fn client_args(key: &str, extra: &[&str], uri: String) -> Vec<String> {
    let mut args: Vec<String> = ["-u", IDENTITY, "-k", key, "-B", "5"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push(uri);
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_against_our_dtls_server() {
    let Some(client) = common::peer("coap-client-openssl", &[]) else {
        return;
    };
    let server = our_server().await;
    let addr = server.local_addr(Scheme::Coaps).unwrap();
    let limit = Duration::from_secs(10);
    let out = common::run(
        client.clone(),
        client_args(KEY, &["-m", "get"], format!("coaps://{addr}/hello")),
        limit,
    )
    .await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("hello over dtls"),
        "{}",
        common::text(&out)
    );
    let out = common::run(
        client.clone(),
        client_args(
            KEY,
            &["-m", "post", "-e", "ping over dtls"],
            format!("coaps://{addr}/echo"),
        ),
        limit,
    )
    .await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ping over dtls"),
        "{}",
        common::text(&out)
    );
    let out = common::run(
        client.clone(),
        client_args(KEY, &["-m", "get"], format!("coaps://{addr}/big")),
        limit,
    )
    .await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&"0123456789".repeat(300)),
        "{}",
        common::text(&out)
    );
    // The wrong key gets nothing.
    let out = common::run(
        client,
        client_args("wrong", &["-m", "get"], format!("coaps://{addr}/hello")),
        limit,
    )
    .await;
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("hello over dtls"),
        "{}",
        common::text(&out)
    );
    server.shutdown(Duration::ZERO).await;
}

/// A `coap-server-openssl` on free ports, killed on drop.
struct LibcoapServer {
    child: Child,
    coaps: SocketAddr,
}

impl Drop for LibcoapServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port N with N+1 free too (for UDP, at the time of asking).
fn free_pair() -> Option<u16> {
    for _ in 0..20 {
        let a = UdpSocket::bind("127.0.0.1:0").ok()?;
        let port = a.local_addr().ok()?.port();
        if port < u16::MAX && UdpSocket::bind(("127.0.0.1", port + 1)).is_ok() {
            return Some(port);
        }
    }
    None
}

fn start_libcoap_server(program: &Path) -> LibcoapServer {
    for _ in 0..5 {
        let Some(port) = free_pair() else { continue };
        let child = Command::new(program)
            .args(["-A", "127.0.0.1", "-p", &port.to_string(), "-k", KEY])
            .args(["-h", IDENTITY])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start coap-server-openssl");
        let coaps: SocketAddr = format!("127.0.0.1:{}", port + 1).parse().unwrap();
        let mut server = LibcoapServer { child, coaps };
        // Up once the coaps port is taken.
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            if UdpSocket::bind(coaps).is_err() {
                return server;
            }
            if server.child.try_wait().ok().flatten().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("coap-server-openssl did not start");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_against_libcoap_dtls_server() {
    let Some(program) = common::peer("coap-server-openssl", &[]) else {
        return;
    };
    let server = start_libcoap_server(&program);
    let client = Client::new().with_psk(IDENTITY, KEY);
    let r = client
        .request(Code::GET, &format!("coaps://{}/", server.coaps))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.code, Code::CONTENT);
    assert!(r.text_payload().contains("libcoap"), "{}", r.text_payload());
    // A second request over the same session.
    let r = client
        .request(Code::GET, &format!("coaps://{}/time", server.coaps))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert!(
        r.code.is_success() || r.code == Code::NOT_FOUND,
        "{}",
        r.code
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_with_certificates_against_our_server() {
    let Some(client) = common::peer("coap-client-openssl", &[]) else {
        return;
    };
    let files = common::PkiFiles::new("x509-server");
    let server = Server::new()
        .route("/hello", get(|| async { "hello over x509" }))
        .x509(files.pki.server.clone())
        .shards(1)
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::Coaps).unwrap();
    let args: Vec<String> = vec![
        "-c".into(),
        files.path("client.pem"),
        "-j".into(),
        files.path("client.key"),
        "-C".into(),
        files.path("ca.pem"),
        "-R".into(),
        files.path("ca.pem"),
        "-B".into(),
        "5".into(),
        "-m".into(),
        "get".into(),
        format!("coaps://{addr}/hello"),
    ];
    let out = common::run(client, args, Duration::from_secs(10)).await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("hello over x509"),
        "{}",
        common::text(&out)
    );
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_with_certificates_against_libcoap_server() {
    let Some(program) = common::peer("coap-server-openssl", &[]) else {
        return;
    };
    let files = common::PkiFiles::new("x509-client");
    let mut started = None;
    for _ in 0..5 {
        let Some(port) = free_pair() else { continue };
        let child = Command::new(&program)
            .args(["-A", "127.0.0.1", "-p", &port.to_string()])
            .args([
                "-c",
                &files.path("server.pem"),
                "-j",
                &files.path("server.key"),
            ])
            .args(["-C", &files.path("ca.pem"), "-R", &files.path("ca.pem")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start coap-server-openssl");
        let coaps: SocketAddr = format!("127.0.0.1:{}", port + 1).parse().unwrap();
        let mut server = LibcoapServer { child, coaps };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if UdpSocket::bind(coaps).is_err() {
                started = Some(server);
                break;
            }
            if server.child.try_wait().ok().flatten().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if started.is_some() {
            break;
        }
    }
    let server = started.expect("coap-server-openssl did not start");
    let r = Client::new()
        .with_x509(files.pki.client.clone())
        .request(Code::GET, &format!("coaps://{}/", server.coaps))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert!(r.text_payload().contains("libcoap"), "{}", r.text_payload());
}

//! CoAP over TLS (`coaps+tcp://`, RFC 8323 §8.2) interoperability: libcoap built on
//! OpenSSL (`coap-client-openssl`, `coap-server-openssl`) with certificates from a CA
//! made at run time and with PSK, in both directions, and aiocoap's client (Python's
//! `ssl`, trusting our CA through `SSL_CERT_FILE`).
//!
//! A test whose peer is missing is skipped with a note, unless
//! `COBALT_REQUIRE_PEERS=1`, in which case it fails.
#![cfg(feature = "openssl")]

mod common;

use cobalt::server::{get, post, Request};
use cobalt::transport::credentials::{PskStore, X509Credentials};
use cobalt::Scheme;
use cobalt::{Client, Code, Server, ServerHandle};
use common::PkiFiles;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const IDENTITY: &str = "cobalt-interop";
const KEY: &str = "secretPSK";
const LIMIT: Duration = Duration::from_secs(15);

async fn our_server(files: &PkiFiles, require_client_cert: bool) -> ServerHandle {
    let mut creds = files.pki.server.clone();
    if !require_client_cert {
        creds.ca_pem = None;
    }
    Server::new()
        .route("/hello", get(|| async { "hello over tls" }))
        .route(
            "/echo",
            post(|req: Request| async move { (Code::CHANGED, req.payload().to_vec()) }),
        )
        .route("/big", get(|| async { "0123456789".repeat(300) }))
        .x509(creds)
        .psk(PskStore::new().with(IDENTITY, KEY))
        .shards(1)
        .listen(Scheme::CoapsTcp, "127.0.0.1:0")
        .start()
        .await
        .unwrap()
}

fn args(list: &[&str], uri: String) -> Vec<String> {
    list.iter()
        .map(|s| s.to_string())
        .chain(std::iter::once(uri))
        .collect()
}

fn stdout_has(out: &std::process::Output, want: &str) {
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(want),
        "{}",
        common::text(out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_with_certificates_against_our_tls_server() {
    let Some(client) = common::peer("coap-client-openssl", &[]) else {
        return;
    };
    let files = PkiFiles::new("tls-server");
    let server = our_server(&files, true).await;
    let addr = server.local_addr(Scheme::CoapsTcp).unwrap();
    let (cert, key, ca) = (
        files.path("client.pem"),
        files.path("client.key"),
        files.path("ca.pem"),
    );
    let pki = ["-c", &cert, "-j", &key, "-C", &ca, "-R", &ca];
    let get = [&pki[..], &["-m", "get"]].concat();
    let out = common::run(
        client.clone(),
        args(&get, format!("coaps+tcp://{addr}/hello")),
        LIMIT,
    )
    .await;
    stdout_has(&out, "hello over tls");
    let post = [&pki[..], &["-m", "post", "-e", "ping over tls"]].concat();
    let out = common::run(
        client.clone(),
        args(&post, format!("coaps+tcp://{addr}/echo")),
        LIMIT,
    )
    .await;
    stdout_has(&out, "ping over tls");
    let out = common::run(client, args(&get, format!("coaps+tcp://{addr}/big")), LIMIT).await;
    stdout_has(&out, &"0123456789".repeat(300));
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_with_psk_against_our_tls_server() {
    let Some(client) = common::peer("coap-client-openssl", &[]) else {
        return;
    };
    let files = PkiFiles::new("tls-psk-server");
    let server = our_server(&files, false).await;
    let addr = server.local_addr(Scheme::CoapsTcp).unwrap();
    let psk = ["-u", IDENTITY, "-k", KEY, "-m", "get"];
    let out = common::run(
        client.clone(),
        args(&psk, format!("coaps+tcp://{addr}/hello")),
        LIMIT,
    )
    .await;
    stdout_has(&out, "hello over tls");
    // The wrong key gets nothing, and the server goes on serving.
    let wrong = ["-u", IDENTITY, "-k", "wrong", "-m", "get"];
    let out = common::run(
        client.clone(),
        args(&wrong, format!("coaps+tcp://{addr}/hello")),
        LIMIT,
    )
    .await;
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("hello over tls"),
        "{}",
        common::text(&out)
    );
    let out = common::run(
        client,
        args(&psk, format!("coaps+tcp://{addr}/hello")),
        LIMIT,
    )
    .await;
    stdout_has(&out, "hello over tls");
    server.shutdown(Duration::ZERO).await;
}

/// A `coap-server-openssl` serving coaps+tcp on a free port, killed on drop.
fn start_libcoap_server(files: &PkiFiles, extra: &[&str]) -> (common::Guarded, SocketAddr) {
    let program = common::peer("coap-server-openssl", &[]).expect("checked by the caller");
    for _ in 0..10 {
        // Given -p N, libcoap serves coap and coap+tcp on N, coaps and coaps+tcp on N+1.
        let port = 20_000 + rand::random::<u16>() % 40_000;
        let free = |p: u16| {
            TcpListener::bind(("127.0.0.1", p)).is_ok() && UdpSocket::bind(("127.0.0.1", p)).is_ok()
        };
        if !free(port) || !free(port + 1) {
            continue;
        }
        let child = Command::new(&program)
            .args(["-A", "127.0.0.1", "-p", &port.to_string()])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start coap-server-openssl");
        let guard = common::Guarded {
            child,
            dir: files.dir.join("nothing"),
        };
        let tls: SocketAddr = format!("127.0.0.1:{}", port + 1).parse().unwrap();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            if TcpStream::connect(tls).is_ok() {
                return (guard, tls);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("coap-server-openssl did not start");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_against_libcoap_tls_server() {
    if common::peer("coap-server-openssl", &[]).is_none() {
        return;
    }
    let files = PkiFiles::new("tls-client");
    let (cert, key, ca) = (
        files.path("server.pem"),
        files.path("server.key"),
        files.path("ca.pem"),
    );
    let (_server, tls) = start_libcoap_server(
        &files,
        &[
            "-c", &cert, "-j", &key, "-C", &ca, "-R", &ca, "-k", KEY, "-h", IDENTITY,
        ],
    );
    // Certificates both ways (libcoap asks for a client certificate with -C/-R).
    let r = Client::new()
        .with_x509(files.pki.client.clone())
        .request(Code::GET, &format!("coaps+tcp://{tls}/"))
        .timeout(LIMIT)
        .send()
        .await
        .unwrap();
    assert_eq!(r.code, Code::CONTENT);
    assert!(r.text_payload().contains("libcoap"), "{}", r.text_payload());
    // PSK.
    let r = Client::new()
        .with_psk(IDENTITY, KEY)
        .request(Code::GET, &format!("coaps+tcp://{tls}/"))
        .timeout(LIMIT)
        .send()
        .await
        .unwrap();
    assert!(r.text_payload().contains("libcoap"), "{}", r.text_payload());
    // A CA that did not sign libcoap's certificate: a clear TLS error.
    let other = PkiFiles::new("tls-other");
    let err = Client::new()
        .with_x509(X509Credentials {
            ca_pem: Some(other.pki.ca_pem.clone()),
            ..X509Credentials::default()
        })
        .request(Code::GET, &format!("coaps+tcp://{tls}/"))
        .timeout(LIMIT)
        .send()
        .await
        .unwrap_err();
    assert!(matches!(err, cobalt::Error::Tls { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aiocoap_client_over_tls_and_secure_websockets_against_our_server() {
    let Some(client) = common::aiocoap("aiocoap-client") else {
        return;
    };
    let files = PkiFiles::new("tls-aiocoap");
    let mut creds = files.pki.server.clone();
    creds.ca_pem = None;
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = Server::new()
        .route("/hello", get(|| async { "hello over tls" }))
        .x509(creds)
        .listen(Scheme::CoapsTcp, any)
        .listen(Scheme::CoapsWs, any)
        .shards(1)
        .bind(any)
        .await
        .unwrap();
    // aiocoap checks the certificate against the host name it was given, and trusts
    // the CAs in SSL_CERT_FILE (Python's ssl defaults).
    for uri in [
        format!(
            "coaps+tcp://localhost:{}/hello",
            server.local_addr(Scheme::CoapsTcp).unwrap().port()
        ),
        format!(
            "coaps+ws://localhost:{}/hello",
            server.local_addr(Scheme::CoapsWs).unwrap().port()
        ),
    ] {
        let mut command = Command::new(&client);
        command
            .arg(&uri)
            .env("SSL_CERT_FILE", files.path("ca.pem"))
            .stdin(Stdio::null());
        let out =
            tokio::task::spawn_blocking(move || command.output().expect("run aiocoap-client"))
                .await
                .unwrap();
        stdout_has(&out, "hello over tls");
    }
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_against_aiocoap_tls_and_wss_servers() {
    let Some(python) = common::aiocoap("python3") else {
        return;
    };
    let files = PkiFiles::new("tls-aiocoap-server");
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/peers/aiocoap_server.py");
    let client = Client::new().with_x509(X509Credentials {
        ca_pem: Some(files.pki.ca_pem.clone()),
        ..X509Credentials::default()
    });
    // aiocoap serves coaps+tcp on its port + 1 and coaps+ws on its port + 3001.
    for (transport, offset, scheme) in [("tlsserver", 1, "coaps+tcp"), ("ws", 3001, "coaps+ws")] {
        let mut port = 0;
        for _ in 0..20 {
            let p = 20_000 + rand::random::<u16>() % 30_000;
            // The ws transport listens on port + 3000 (coap+ws) too.
            let free = |q: u16| TcpListener::bind(("127.0.0.1", q)).is_ok();
            if free(p + offset) && (offset == 1 || free(p + 3000)) {
                port = p;
                break;
            }
        }
        let child = Command::new(&python)
            .arg(&script)
            .args(["--port", &port.to_string(), "--transports", transport])
            .args(["--tls-cert", &files.path("server.pem")])
            .args(["--tls-key", &files.path("server.key")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start aiocoap_server.py");
        let _server = common::Guarded {
            child,
            dir: files.dir.join("nothing"),
        };
        let addr: SocketAddr = format!("127.0.0.1:{}", port + offset).parse().unwrap();
        let started = Instant::now();
        while TcpStream::connect(addr).is_err() {
            assert!(
                started.elapsed() < LIMIT,
                "aiocoap did not listen on {addr}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let base = format!("{scheme}://localhost:{}", addr.port());
        let r = client
            .request(Code::GET, &format!("{base}/hello"))
            .timeout(LIMIT)
            .send()
            .await
            .unwrap();
        assert_eq!(
            (r.code, r.text_payload().as_str()),
            (Code::CONTENT, "hello from aiocoap"),
            "{scheme}"
        );
        let r = client
            .request(Code::POST, &format!("{base}/echo"))
            .payload("from cobalt over tls")
            .timeout(LIMIT)
            .send()
            .await
            .unwrap();
        assert_eq!(r.text_payload(), "from cobalt over tls", "{scheme}");
    }
}

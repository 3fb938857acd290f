//! Interop through Cobalt's proxy with real peers: libcoap's `coap-client -P` and
//! `aiocoap-client --proxy` through the CoAP front, curl (HTTP/1.1 and HTTP/2 with
//! prior knowledge) through the HTTP front, to aiocoap and libcoap origins; Block2
//! and Block1 end to end; an observation streamed as Server-Sent Events. A missing
//! peer skips the test, or fails it under `COBALT_REQUIRE_PEERS=1`.

use cobalt::{Scheme, Server, ServerHandle};
use cobalt_proxy::{AllowList, CoapFront, HttpConfig, HttpFront, HttpServer, Proxy, ProxyConfig};
use cobalt_test_support::need;
use cobalt_test_support::peers::aiocoap::{self, Serve};
use cobalt_test_support::peers::libcoap::{self, Port};
use cobalt_test_support::peers::{on_path, COMMAND_LIMIT};
use cobalt_test_support::ports::V4;
use cobalt_test_support::process::{run, Ran};
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

struct Fronts {
    coap: ServerHandle,
    coap_addr: SocketAddr,
    http: HttpServer,
}

async fn fronts() -> Fronts {
    let proxy = Proxy::new(ProxyConfig {
        allow: AllowList::parse(["127.0.0.0/8"]).unwrap(),
        ..ProxyConfig::default()
    });
    let coap = CoapFront::new(proxy.clone())
        .install(Server::new())
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let coap_addr = coap.local_addr(Scheme::Coap).unwrap();
    let http = HttpFront::new(proxy, HttpConfig::default())
        .bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    Fronts {
        coap,
        coap_addr,
        http,
    }
}

/// Runs `cmd` off the async threads.
async fn ran(mut cmd: Command) -> Ran {
    tokio::task::spawn_blocking(move || run(&mut cmd, COMMAND_LIMIT))
        .await
        .unwrap()
}

/// What `tests/peers/aiocoap_server.py` serves at /large.
fn large_body() -> String {
    let mut out = String::new();
    let mut i = 0;
    while out.len() < 3000 {
        out.push_str(&format!("line {i:04}: abcdefghijklmnopqrstuvwxyz\n"));
        i += 1;
    }
    out.truncate(3000);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_through_the_forward_proxy_to_aiocoap_and_libcoap_origins() {
    let client = need!("libcoap coap-client", libcoap::tool(libcoap::CLIENT));
    let python = need!("aiocoap", aiocoap::python());
    let server_bin = need!("libcoap coap-server", libcoap::tool(libcoap::SERVER));
    let aio = aiocoap::server(&python, Serve::Udp, None);
    let lib = libcoap::server(&server_bin, V4, &[], Port::Coap, None);
    let f = fronts().await;
    let proxy = format!("coap://{}", f.coap_addr);
    let mut cmd = Command::new(&client);
    cmd.args(["-P", &proxy, &aio.uri("/large")]);
    let out = ran(cmd).await;
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    // coap-client ends its output with a newline of its own.
    assert_eq!(
        out.stdout.trim_end(),
        large_body().trim_end(),
        "Block2 through the proxy"
    );

    let upload = cobalt_test_support::temp::TempDir::new("proxy-upload");
    let body: String = (0..2500)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let file = upload.write("body.txt", &body);
    let mut cmd = Command::new(&client);
    cmd.args(["-P", &proxy, "-m", "post", "-b", "256", "-f"])
        .arg(&file)
        .arg(aio.uri("/echo"));
    let out = ran(cmd).await;
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.stdout.trim_end(), body, "Block1 through the proxy");

    let mut cmd = Command::new(&client);
    cmd.args(["-P", &proxy, &lib.uri("/")]);
    let out = ran(cmd).await;
    assert!(
        out.stdout.contains("libcoap"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    f.coap.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aiocoap_client_through_the_forward_proxy() {
    let client = need!("aiocoap-client", aiocoap::client());
    let python = need!("aiocoap", aiocoap::python());
    let aio = aiocoap::server(&python, Serve::Udp, None);
    let f = fronts().await;
    let mut cmd = Command::new(&client);
    cmd.args([
        "--proxy",
        &format!("coap://{}", f.coap_addr),
        &aio.uri("/hello"),
    ]);
    let out = ran(cmd).await;
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.stdout.trim(), "hello from aiocoap");
    let mut cmd = Command::new(&client);
    cmd.args([
        "--proxy",
        &format!("coap://{}", f.coap_addr),
        &aio.uri("/large"),
    ]);
    let out = ran(cmd).await;
    assert_eq!(
        out.stdout.trim_end(),
        large_body().trim_end(),
        "{}",
        out.stderr
    );
    f.coap.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_http1_and_http2_through_the_http_front() {
    let curl = need!("curl", on_path("curl"));
    let python = need!("aiocoap", aiocoap::python());
    let server_bin = need!("libcoap coap-server", libcoap::tool(libcoap::SERVER));
    let aio = aiocoap::server(&python, Serve::Udp, None);
    let lib = libcoap::server(&server_bin, V4, &[], Port::Coap, None);
    let f = fronts().await;
    let base = format!("http://{}/hc/", f.http.local_addr());
    for version in ["--http1.1", "--http2-prior-knowledge"] {
        let mut cmd = Command::new(&curl);
        cmd.args([
            "-s",
            "-S",
            "-f",
            version,
            "-w",
            "\n%{http_version} %{content_type}",
        ])
        .arg(format!("{base}{}", aio.uri("/large")));
        let out = ran(cmd).await;
        assert!(out.status.success(), "{version}: {}", out.stderr);
        let (body, meta) = out.stdout.rsplit_once('\n').unwrap();
        assert_eq!(body, large_body(), "{version}");
        let want = if version == "--http1.1" { "1.1" } else { "2" };
        assert_eq!(
            meta,
            format!("{want} text/plain; charset=utf-8"),
            "{version}"
        );

        let mut cmd = Command::new(&curl);
        cmd.args(["-s", "-S", "-f", version])
            .arg(format!("{base}{}", lib.uri("/")));
        let out = ran(cmd).await;
        assert!(
            out.stdout.contains("libcoap"),
            "{version}: {}{}",
            out.stdout,
            out.stderr
        );

        let mut cmd = Command::new(&curl);
        cmd.args([
            "-s",
            "-S",
            "-f",
            version,
            "-X",
            "POST",
            "-H",
            "Content-Type: text/plain",
            "--data-binary",
            "ping",
        ])
        .arg(format!("{base}{}", aio.uri("/echo")));
        let out = ran(cmd).await;
        assert_eq!(out.stdout, "ping", "{version}: {}", out.stderr);
    }
    drop(f.http);
    f.coap.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_streams_an_observation_as_server_sent_events() {
    let curl = need!("curl", on_path("curl"));
    let python = need!("aiocoap", aiocoap::python());
    let aio = aiocoap::server(&python, Serve::Udp, None);
    let f = fronts().await;
    let mut cmd = Command::new(&curl);
    cmd.args([
        "-s",
        "-N",
        "--http1.1",
        "--max-time",
        "4",
        "-H",
        "Accept: text/event-stream",
    ])
    .arg(format!(
        "http://{}/hc/{}",
        f.http.local_addr(),
        aio.uri("/counter")
    ));
    let out = ran(cmd).await;
    let counts: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("data: count "))
        .collect();
    assert!(
        counts.len() >= 3,
        "at least 3 notifications in 4 s: {}",
        out.stdout
    );
    drop(f.http);
    f.coap.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cobalt_client_through_aiocoap_proxy_to_a_cobalt_origin() {
    use cobalt::proto::message::opt;
    use cobalt::server::get;
    use cobalt_test_support::peers::{Listen, PeerServer};
    use cobalt_test_support::ready::Ready;
    let bin = need!("aiocoap-proxy", aiocoap::program("aiocoap-proxy"));
    let origin = Server::new()
        .route("/hello", get(|| async { "hello from cobalt" }))
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let origin_addr = origin.local_addr(Scheme::Coap).unwrap();
    let listen = Listen {
        ip: V4,
        free: &[0],
        at: 0,
        ready: Ready::CoapPing,
    };
    let proxy = tokio::task::spawn_blocking(move || {
        PeerServer::start("aiocoap-proxy", listen, None, |port| {
            let mut c = Command::new(&bin);
            c.args(["--forward", "--bind", &format!("127.0.0.1:{port}")]);
            c
        })
    })
    .await
    .unwrap();
    // aiocoap-proxy takes Proxy-Scheme with the Uri-* options (not Proxy-Uri).
    let port = u32::from(origin_addr.port());
    let r = cobalt::Client::new()
        .request(cobalt::Code::GET, &proxy.uri("/hello"))
        .option(opt::PROXY_SCHEME, "coap")
        .option(opt::URI_HOST, "127.0.0.1")
        .option(
            opt::URI_PORT,
            cobalt::proto::message::option::encode_uint(port),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "hello from cobalt");
    origin.shutdown(Duration::ZERO).await;
}

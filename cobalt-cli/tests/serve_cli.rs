//! `cobalt serve` as a user runs it, through the real binary: the access log at
//! `--log-level debug`, `--tcp` following `--port`, host names where addresses go
//! (`--bind`, `--metrics`, `bench --workers`), and a DTLS certificate whose key cannot
//! serve the DTLS suites refused at start.

use std::sync::mpsc;
use std::time::Duration;

#[path = "common/binary.rs"]
mod binary;

use binary::{cobalt, local_serve, serve_printing, spawn_server, ChildGuard};

/// Starts `command` (a server) and returns it with a channel of its stderr lines.
fn with_stderr_lines(command: std::process::Command) -> (ChildGuard, mpsc::Receiver<String>) {
    let (server, lines) = spawn_server(command);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || lines.map(|l| tx.send(l)).take_while(Result::is_ok).count());
    (server, rx)
}

/// The first line from `lines` containing `wanted`, waiting up to 20 s.
fn line_with(lines: &mpsc::Receiver<String>, wanted: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(l) if l.contains(wanted) => return l,
            Ok(_) => {}
            Err(e) => panic!("no line with {wanted:?}: {e}"),
        }
    }
}

#[test]
fn debug_logs_every_request_with_peer_method_path_code_and_time() {
    let mut serve = local_serve();
    serve.args(["--tcp", "0", "--log-level", "debug"]);
    let (_server, lines) = with_stderr_lines(serve);
    let udp = line_with(&lines, "serving CoAP on ");
    let udp = udp.rsplit(' ').nth(3).unwrap().to_string();
    let tcp = line_with(&lines, "serving CoAP over TCP on ");
    let tcp = tcp.rsplit(' ').next().unwrap().to_string();
    for uri in [
        format!("coap://{udp}/benchmark"),
        format!("coap+tcp://{tcp}/nothing"),
    ] {
        cobalt().args(["get", &uri]).output().unwrap();
    }
    let ok = line_with(&lines, "GET /benchmark 2.05 Content");
    assert!(
        ok.contains("cobalt::access") && ok.contains("127.0.0.1:") && ok.ends_with("µs"),
        "{ok}"
    );
    line_with(&lines, "GET /nothing 4.04 Not Found");
}

#[test]
fn tcp_follows_the_udp_port_and_names_resolve() {
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut serve = cobalt();
    serve
        .args(["serve", "--bind", "localhost", "--shards", "1", "--tcp"])
        .args(["--port", &port.to_string(), "--metrics", "localhost:0"]);
    let (_server, found) = serve_printing(
        serve,
        &[
            "cobalt: serving CoAP on ",
            "cobalt: serving CoAP over TCP on ",
            "cobalt: metrics on http://",
        ],
    );
    assert!(found[0].ends_with(&format!(":{port}")), "{found:?}");
    assert_eq!(found[1], found[0], "--tcp without a number: the UDP port");
    let get = cobalt()
        .args(["get", &format!("coap+tcp://localhost:{port}/benchmark")])
        .output()
        .unwrap();
    assert!(get.status.success(), "{get:?}");
    // `bench --workers` takes host names too.
    let mut worker = cobalt();
    worker.args(["bench", "worker", "--listen", "127.0.0.1:0"]);
    let (_worker, at) = serve_printing(
        worker,
        &["cobalt bench worker: waiting for a coordinator on "],
    );
    let worker_port = at[0].rsplit(':').next().unwrap();
    let bench = cobalt()
        .args(["bench", &format!("coap://{}/benchmark", found[0])])
        .args(["-c", "2", "-d", "0.5", "--warmup", "0", "-q", "--workers"])
        .arg(format!("localhost:{worker_port}"))
        .output()
        .unwrap();
    assert!(bench.status.success(), "{bench:?}");
}

/// A certificate with an RSA key cannot serve the DTLS suites (ECDHE-ECDSA): refused
/// at start, saying what to use. Needs the `openssl` command to make the RSA key.
#[cfg(feature = "openssl")]
#[test]
fn an_rsa_certificate_is_refused_for_dtls() {
    let dir = std::env::temp_dir().join(format!("cobalt-serve-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("rsa.pem"), dir.join("rsa.key"));
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=rsa", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output();
    if !made.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIPPED: the openssl command could not make an RSA certificate");
        return;
    }
    let out = cobalt()
        .args(["serve", "--bind", "127.0.0.1", "--port", "0", "--cert"])
        .arg(&cert)
        .arg("--key")
        .arg(&key)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("RSA key") && err.contains("P-256") && err.contains("prime256v1"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

//! Tests of `coaps://`, `coap+tcp://` and `coap+ws://` benchmarking: argument checks,
//! and steps against small in-process servers built on the library's sans-IO
//! protocol cores (RFC 8323 [`TcpConnection`], [`OpensslDtls`]) that answer, stay
//! silent, or hang up.

use super::{config_from_args, parse_args};
use cobalt::transport::credentials::{ClientCredentials, PskStore};
use cobalt::transport::dtls::{DtlsBackend, DtlsConfig, OpensslDtls};
use cobalt_bench::target::Scheme;
use cobalt_bench::{run_step, Config};
use cobalt_proto::message::{decode, encode, Code, Message, MessageType, TcpMessage};
use cobalt_proto::tcp_connection::{TcpConfig, TcpConnection, TcpEvent};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn config(argv: &[&str]) -> Result<Config, String> {
    config_from_args(&parse_args(argv))
}

#[test]
fn each_scheme_gets_its_settings() {
    let c = config(&["coap+tcp://127.0.0.1:7000/a", "--new-session"]).unwrap();
    assert_eq!(
        (c.scheme, c.new_session, c.target.port()),
        (Scheme::Coap(cobalt::Scheme::CoapTcp), true, 7000)
    );
    assert!(c.dtls.is_none());
    let c = config(&["coap+ws://localhost/a"]).unwrap();
    assert_eq!(
        (c.scheme, c.target.port(), c.host.as_str()),
        (Scheme::Coap(cobalt::Scheme::CoapWs), 80, "localhost")
    );
    let c = config(&[
        "coaps://127.0.0.1/a",
        "--psk-identity",
        "id",
        "--psk-key",
        "0x0102",
    ])
    .unwrap();
    assert_eq!(
        (c.scheme, c.target.port(), c.new_session),
        (Scheme::Coap(cobalt::Scheme::Coaps), 5684, false)
    );
    let Some(ClientCredentials::Psk(psk)) = c.dtls else {
        panic!("no PSK in {c:?}");
    };
    assert_eq!(
        (psk.identity.as_slice(), psk.key.as_slice()),
        (&b"id"[..], &[1u8, 2][..])
    );
    // NON requests over DTLS are fine; CON is the default.
    let c = config(&[
        "coaps://127.0.0.1/",
        "--psk-identity",
        "i",
        "--psk-key",
        "k",
        "--non",
    ]);
    assert!(!c.unwrap().confirmable);
}

#[test]
fn meaningless_combinations_say_why() {
    for (argv, why) in [
        (
            &["coaps+tcp://127.0.0.1/", "--non"][..],
            "coaps+tcp:// has no message types",
        ),
        (
            &["coaps+ws://h/", "--workers", "h:1"],
            "coaps+ws:// cannot run on --workers",
        ),
        (&["coaps://127.0.0.1/"], "coaps:// needs credentials"),
        (
            &["coap+ws://127.0.0.1/", "--non"],
            "coap+ws:// has no message types",
        ),
        (
            &["coap://127.0.0.1/", "--new-session"],
            "coap:// has no sessions",
        ),
        (
            &["http://127.0.0.1/", "--new-session"],
            "use --no-keepalive",
        ),
        (
            &["coap+tcp://127.0.0.1/", "--no-keepalive"],
            "use --new-session",
        ),
        (
            &[
                "coap+tcp://127.0.0.1/",
                "--psk-identity",
                "a",
                "--psk-key",
                "b",
            ],
            "apply to coaps://, coaps+tcp:// and coaps+ws:// targets only",
        ),
        (
            &[
                "coaps://127.0.0.1/",
                "--psk-identity",
                "a",
                "--psk-key",
                "0x1",
            ],
            "--psk-key: odd number of hex digits",
        ),
        (
            &[
                "coaps://h/",
                "--psk-identity",
                "a",
                "--psk-key",
                "b",
                "--workers",
                "h:1",
            ],
            "cannot run on --workers",
        ),
    ] {
        let e = config(argv).unwrap_err();
        assert!(e.contains(why), "{argv:?}: {e}");
    }
}

/// What the in-process RFC 8323 server does with requests.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Behaviour {
    /// 2.05 "hello world" to every request.
    Answer,
    /// Sends its CSM, then never answers.
    Silent,
    /// Answers the first request, then closes the connection.
    OneThenClose,
}

/// A threaded coap+tcp server; returns its address and the count of connections it
/// accepted. It stops when `stop` is set.
fn tcp_server(behaviour: Behaviour, stop: Arc<AtomicBool>) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let Ok((stream, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            count.fetch_add(1, Ordering::Relaxed);
            let stop = stop.clone();
            std::thread::spawn(move || serve_tcp(stream, behaviour, &stop));
        }
    });
    (addr, accepted)
}

fn serve_tcp(mut stream: TcpStream, behaviour: Behaviour, stop: &AtomicBool) {
    stream.set_nonblocking(false).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut conn = TcpConnection::new(TcpConfig::default(), Instant::now());
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        while let Some(bytes) = conn.poll_transmit() {
            if stream.write_all(&bytes).is_err() {
                return;
            }
        }
        let n = match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(_) => continue,
        };
        conn.handle_bytes(Instant::now(), &buf[..n]);
        while let Some(ev) = conn.poll_event() {
            let TcpEvent::Request { token, .. } = ev else {
                continue;
            };
            if behaviour == Behaviour::Silent {
                continue;
            }
            let mut reply = TcpMessage::new(Code::CONTENT);
            reply.payload = b"hello world".to_vec();
            conn.respond(Instant::now(), token, reply).unwrap();
            if behaviour == Behaviour::OneThenClose {
                if let Some(bytes) = conn.poll_transmit() {
                    let _ = stream.write_all(&bytes);
                }
                return;
            }
        }
    }
}

fn tcp_config(addr: SocketAddr, timeout_ms: u64, extra: &[&str]) -> Config {
    let uri = format!("coap+tcp://{addr}/benchmark");
    let timeout = format!("{}", timeout_ms as f64 / 1000.0);
    let mut argv = vec![
        uri.as_str(),
        "-d",
        "1",
        "--warmup",
        "0",
        "--timeout",
        &timeout,
    ];
    argv.extend_from_slice(extra);
    config(&argv).unwrap()
}

#[test]
fn coap_tcp_completes_requests_on_one_connection_per_client() {
    let stop = Arc::new(AtomicBool::new(false));
    let (addr, accepted) = tcp_server(Behaviour::Answer, stop.clone());
    let r = run_step(&tcp_config(addr, 2000, &["--threads", "2"]), 4).unwrap();
    stop.store(true, Ordering::Relaxed);
    assert!(r.completed > 0, "{r:?}");
    assert_eq!((r.lost, r.errors, r.resets), (0, 0, 0), "{r:?}");
    assert!(r.p50_us > 0.0 && r.p50_us <= r.p99_us, "{r:?}");
    assert_eq!(
        accepted.load(Ordering::Relaxed),
        4,
        "one connection per client"
    );
}

#[test]
fn coap_tcp_new_session_opens_a_connection_per_request() {
    let stop = Arc::new(AtomicBool::new(false));
    let (addr, accepted) = tcp_server(Behaviour::Answer, stop.clone());
    let r = run_step(&tcp_config(addr, 2000, &["--new-session"]), 2).unwrap();
    stop.store(true, Ordering::Relaxed);
    assert!(r.completed > 0, "{r:?}");
    assert_eq!((r.lost, r.errors), (0, 0), "{r:?}");
    // Set-up connections, then one per request.
    assert!(
        accepted.load(Ordering::Relaxed) as u64 >= r.completed + 2,
        "{} connections for {r:?}",
        accepted.load(Ordering::Relaxed)
    );
}

#[test]
fn unanswered_requests_are_lost_and_broken_connections_are_errors() {
    let stop = Arc::new(AtomicBool::new(false));
    let (silent, _) = tcp_server(Behaviour::Silent, stop.clone());
    let r = run_step(&tcp_config(silent, 200, &[]), 2).unwrap();
    assert_eq!(r.completed, 0, "{r:?}");
    assert!(r.lost >= 2 && r.errors == 0, "{r:?}");

    let (hangs_up, accepted) = tcp_server(Behaviour::OneThenClose, stop.clone());
    let r = run_step(&tcp_config(hangs_up, 2000, &[]), 2).unwrap();
    stop.store(true, Ordering::Relaxed);
    // Each connection serves one request, breaks on the next (an error), and the
    // client reconnects for the one after.
    assert!(r.completed > 2 && r.errors > 0, "{r:?}");
    assert_eq!(r.lost, 0, "{r:?}");
    assert!(accepted.load(Ordering::Relaxed) > 2);
}

#[test]
fn nothing_listening_fails_the_set_up_with_the_reason() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let e = run_step(&tcp_config(port, 500, &[]), 2).unwrap_err();
    assert!(
        e.message.contains("cannot connect") && e.message.contains("cobalt serve --tcp"),
        "{e}"
    );
    assert_eq!(e.blame, cobalt_bench::Blame::Network, "{e}");
}

/// A single-threaded coaps server over [`OpensslDtls`] that answers every CON request
/// with a piggybacked 2.05; returns its address and its handshake count when stopped.
fn dtls_server(stop: Arc<AtomicBool>) -> (SocketAddr, std::thread::JoinHandle<u64>) {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let keys = Arc::new(PskStore::new().with("alice", "secretPSK"));
    let mut dtls = OpensslDtls::server(keys, DtlsConfig::default()).unwrap();
    let server = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while !stop.load(Ordering::Relaxed) {
            if let Ok((n, peer)) = sock.recv_from(&mut buf) {
                for d in dtls.handle_datagram(Instant::now(), peer, &buf[..n]) {
                    let Ok(req) = decode(&d) else { continue };
                    if req.mtype != MessageType::Confirmable || !req.code.is_request() {
                        continue;
                    }
                    let mut resp =
                        Message::new(MessageType::Acknowledgement, Code::CONTENT, req.mid);
                    resp.token = req.token;
                    resp.payload = b"hello world".to_vec();
                    dtls.encrypt(Instant::now(), peer, &encode(&resp));
                }
            }
            dtls.handle_timeout(Instant::now());
            while let Some(t) = dtls.poll_transmit() {
                let _ = sock.send_to(&t.bytes, t.peer);
            }
        }
        dtls.stats().handshakes
    });
    (addr, server)
}

fn dtls_config(addr: SocketAddr, key: &str, extra: &[&str]) -> Config {
    let uri = format!("coaps://{addr}/benchmark");
    let mut argv = vec![uri.as_str(), "-d", "1", "--warmup", "0", "--timeout", "2"];
    argv.extend_from_slice(&["--psk-identity", "alice", "--psk-key", key]);
    argv.extend_from_slice(extra);
    config(&argv).unwrap()
}

#[test]
fn coaps_handshakes_once_per_client_or_once_per_request() {
    let stop = Arc::new(AtomicBool::new(false));
    let (addr, server) = dtls_server(stop.clone());
    let r = run_step(&dtls_config(addr, "secretPSK", &[]), 3).unwrap();
    assert!(r.completed > 0, "{r:?}");
    assert_eq!((r.lost, r.errors, r.resets), (0, 0, 0), "{r:?}");
    let per_request = run_step(&dtls_config(addr, "secretPSK", &["--new-session"]), 2).unwrap();
    stop.store(true, Ordering::Relaxed);
    let handshakes = server.join().unwrap();
    assert!(per_request.completed > 0, "{per_request:?}");
    assert_eq!(
        (per_request.lost, per_request.errors),
        (0, 0),
        "{per_request:?}"
    );
    // 3 + 2 at set-up, then one per request of the second run.
    assert!(
        handshakes >= 5 + per_request.completed,
        "{handshakes} handshakes for {per_request:?}"
    );
    // At most one per request, with room for set-ups a loaded machine had to repeat.
    assert!(
        handshakes <= 2 * (5 + per_request.sent),
        "{handshakes} for {per_request:?}"
    );
}

#[test]
fn a_wrong_psk_fails_the_set_up_with_the_reason() {
    let stop = Arc::new(AtomicBool::new(false));
    let (addr, server) = dtls_server(stop.clone());
    let e = run_step(&dtls_config(addr, "not-the-key", &[]), 2).unwrap_err();
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
    assert!(
        e.message.contains("DTLS handshake") && e.message.contains("wrong PSK"),
        "{e}"
    );
    // The same exit code as `cobalt get` with a wrong key.
    assert_eq!(e.blame, cobalt_bench::Blame::Network, "{e}");
}

#[test]
fn coap_tcp_runs_on_workers_with_new_session() {
    let stop = Arc::new(AtomicBool::new(false));
    let (addr, accepted) = tcp_server(Behaviour::Answer, stop.clone());
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let worker = l.local_addr().unwrap();
    let quit = stop.clone();
    std::thread::spawn(move || {
        super::distributed::serve_worker(&l, false, || quit.load(Ordering::Relaxed)).unwrap()
    });
    let uri = format!("coap+tcp://{addr}/benchmark");
    let w = worker.to_string();
    let argv = [
        &uri,
        "-d",
        "1",
        "--warmup",
        "0",
        "--new-session",
        "--workers",
        &w,
    ];
    let args = parse_args(&argv);
    let cfg = config_from_args(&args).unwrap();
    let template = super::distributed::request_template(&args);
    assert!(template.new_session);
    let r = super::distributed::run_step(&cfg, &template, &[worker], 2).unwrap();
    stop.store(true, Ordering::Relaxed);
    assert!(r.completed > 0 && r.lost == 0 && r.errors == 0, "{r:?}");
    // The worker opened a connection per request, not one per client.
    assert!(accepted.load(Ordering::Relaxed) as u64 > r.completed);
}

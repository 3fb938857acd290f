//! One benchmark step: its configuration, the generator threads that run it, and the
//! monitor that samples CPU time and prints progress while it runs.

use crate::client::{run_thread, Io};
use crate::engine::StepShared;
use crate::stats::{Recorder, ServerUsage, StepResult};
use crate::sys::now_ns;
use crate::target::{Scheme, Target};
use crate::{dtls, dtls_udp, http, procfs, session, stream, sys, StepError};
use cobalt::transport::credentials::ClientCredentials;
use cobalt::transport::tls::{Alpn, TlsConnector};
use cobalt_proto::message::{encode, opt, Code, Message, MessageType, Token};
use cobalt_proto::tcp_connection::Framing;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// A validated benchmark configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// URI as given.
    pub uri: String,
    /// Resolved server address.
    pub target: SocketAddr,
    /// The protocol.
    pub scheme: Scheme,
    /// The URI's host (for the WebSocket upgrade's Host header).
    pub host: String,
    /// `coaps://`: how clients authenticate.
    pub dtls: Option<ClientCredentials>,
    /// `coaps://`, `coap+tcp://`, `coap+ws://`: a new session or connection per request.
    pub new_session: bool,
    /// HTTP: one connection per client (true) or per request.
    pub keepalive: bool,
    /// Encoded request: CoAP with an 8-byte token and MID 0 (for `coap+tcp://` and
    /// `coap+ws://` reframed per RFC 8323 by the `stream` module), or the HTTP request bytes.
    pub template: Vec<u8>,
    /// CON (true) or NON requests.
    pub confirmable: bool,
    /// coap://: retransmit on this algorithm's timers (`--cc`).
    pub cc: Option<cobalt_proto::congestion::Algorithm>,
    /// Method name, for the report.
    pub method: &'static str,
    /// Concurrency of each step.
    pub steps: Vec<usize>,
    /// Measured time per step.
    pub duration: Duration,
    /// Warm-up per step.
    pub warmup: Duration,
    /// Pause between steps.
    pub cooldown: Duration,
    /// Request timeout.
    pub timeout: Duration,
    /// Load-generator threads.
    pub threads: usize,
    /// `coap://`: the I/O of the generator threads.
    pub io: Io,
    /// Open-loop rate in requests/s; `None` for the closed loop.
    pub rate: Option<f64>,
    /// Server process to sample.
    pub server_pid: Option<u32>,
    /// Progress on stderr.
    pub progress: bool,
    /// Ends a running step early when set (Ctrl-C does too).
    pub stop: std::sync::Arc<AtomicBool>,
}

/// Encodes the request every client sends, with a zero 8-byte token and MID 0 that are
/// patched per request.
pub fn request_template(
    t: &Target,
    code: Code,
    confirmable: bool,
    payload: Option<&str>,
) -> Vec<u8> {
    let mtype = if confirmable {
        MessageType::Confirmable
    } else {
        MessageType::NonConfirmable
    };
    let mut m = Message::new(mtype, code, 0);
    m.token = Token::new(&[0; 8]).unwrap_or(Token::EMPTY);
    // An IP literal (with or without an IPv6 zone) is no Uri-Host.
    let literal = t.host.split('%').next().unwrap_or(&t.host);
    if literal.parse::<std::net::IpAddr>().is_err() {
        m.options.push(opt::URI_HOST, t.host.as_bytes());
    }
    for seg in &t.path {
        m.options.push(opt::URI_PATH, seg.as_bytes());
    }
    for q in &t.query {
        m.options.push(opt::URI_QUERY, q.as_bytes());
    }
    if let Some(p) = payload {
        m.payload = p.as_bytes().to_vec();
    }
    encode(&m)
}

/// Runs one step with `clients` virtual clients.
pub fn run_step(cfg: &Config, clients: usize) -> Result<StepResult, StepError> {
    let m = measure_step(cfg, clients)?;
    let mut r = StepResult::from_recorder(clients, m.duration_s, &m.rec, m.usage, m.partial);
    r.client_cpu_percent = (m.duration_s > 0.0).then(|| m.own_cpu_s * 100.0 / m.duration_s);
    Ok(r)
}

/// The raw outcome of one step on this machine, before summarising.
pub struct Measured {
    /// Merged counters and histogram of all threads.
    pub rec: Recorder,
    /// Measured seconds.
    pub duration_s: f64,
    /// Cut short by Ctrl-C.
    pub partial: bool,
    /// Server figures (with `--server-pid`).
    pub usage: Option<ServerUsage>,
    /// CPU seconds this process (the load generator) used in the measured window.
    pub own_cpu_s: f64,
}

/// Runs one step with `clients` virtual clients and returns the merged recorder.
pub fn measure_step(cfg: &Config, clients: usize) -> Result<Measured, StepError> {
    let threads = cfg.threads.clamp(1, clients.max(1));
    let shared = StepShared {
        target: cfg.target,
        template: cfg.template.clone(),
        client_field: crate::engine::client_field(&cfg.template),
        timeout_ns: cfg.timeout.as_nanos() as u64,
        cc: cfg.cc,
        ready: AtomicUsize::new(0),
        go: AtomicBool::new(false),
        measure_start_ns: AtomicU64::new(0),
        end_ns: AtomicU64::new(0),
        abort: AtomicBool::new(false),
        progress: AtomicU64::new(0),
        progress_other: AtomicU64::new(0),
        stop: cfg.stop.clone(),
    };
    let mut seed = random_seed();
    std::thread::scope(|s| {
        let shares: Vec<usize> = (0..threads)
            .map(|t| clients / threads + usize::from(t < clients % threads))
            .collect();
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let share = shares[t];
                let first_client: usize = shares[..t].iter().sum();
                let shared = &shared;
                let seed = client_seed(&mut seed);
                // Each thread sends its clients' share of the total rate.
                let interval = cfg.rate.map(|r| {
                    (1e9 * clients as f64 / (r * share.max(1) as f64)).clamp(1.0, 1e18) as u64
                });
                std::thread::Builder::new()
                    .name(format!("bench-{t}"))
                    .spawn_scoped(s, move || match cfg.scheme {
                        Scheme::Coap(cobalt::Scheme::Coap) => Ok(run_thread(
                            shared,
                            (first_client, share),
                            seed,
                            interval,
                            cfg.io,
                        )?),
                        Scheme::Http => {
                            Ok(http::run_thread(shared, share, cfg.keepalive, interval)?)
                        }
                        Scheme::Coap(cobalt::Scheme::Coaps) if !cfg.new_session => {
                            let auth = cfg
                                .dtls
                                .as_ref()
                                .ok_or_else(|| "coaps:// needs credentials".to_string())?;
                            let in_flight = (session::HANDSHAKES_IN_FLIGHT / threads).max(1);
                            dtls_udp::run_thread(
                                shared,
                                auth,
                                (first_client, share),
                                seed,
                                (interval, in_flight),
                                cfg.io,
                            )
                        }
                        _ => run_session_thread(cfg, shared, share, seed, interval, threads),
                    })
                    .map_err(|e| {
                        StepError::from(format!("cannot start a load-generator thread: {e}"))
                    })
            })
            .collect();
        let spawned = handles.iter().filter(|h| h.is_ok()).count();
        if spawned < threads {
            shared.abort.store(true, Ordering::SeqCst);
        }
        while shared.ready.load(Ordering::SeqCst) < spawned {
            std::thread::sleep(Duration::from_micros(200));
        }
        let start = now_ns();
        let (measure_start, end) = if shared.abort.load(Ordering::SeqCst) {
            (start, start)
        } else {
            let m = start + cfg.warmup.as_nanos() as u64;
            (m, m + cfg.duration.as_nanos() as u64)
        };
        shared
            .measure_start_ns
            .store(measure_start, Ordering::SeqCst);
        shared.end_ns.store(end, Ordering::SeqCst);
        shared.go.store(true, Ordering::SeqCst);

        let (usage, own_cpu_s) = monitor(cfg, clients, &shared, measure_start, end);
        let stopped = now_ns().min(end);

        let mut total = Recorder::new();
        let mut first_err = None;
        for h in handles {
            let res = match h {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    Err(StepError::from(
                        "a load-generator thread panicked".to_string(),
                    ))
                }),
                Err(e) => Err(e),
            };
            match res {
                Ok(r) => total.merge(&r),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        Ok(Measured {
            rec: total,
            duration_s: stopped.saturating_sub(measure_start) as f64 / 1e9,
            partial: stopped < end,
            usage,
            own_cpu_s,
        })
    })
}

/// Runs one thread's share of a step over a transport with sessions ([`session`]).
fn run_session_thread(
    cfg: &Config,
    shared: &StepShared,
    clients: usize,
    seed: u64,
    interval: Option<u64>,
    threads: usize,
) -> Result<Recorder, StepError> {
    use session::{run_thread, Share, HANDSHAKES_IN_FLIGHT};
    use stream::{Frames, PlainTcp, StreamClient, StreamSetup, Tls, WebSocket};
    type Tcp = <PlainTcp as stream::Dial>::Stream;
    type Secure = <Tls as stream::Dial>::Stream;
    let share = Share {
        shared,
        clients,
        seed,
        interval_ns: interval,
        new_session: cfg.new_session,
        handshakes: (HANDSHAKES_IN_FLIGHT / threads.max(1)).max(1),
    };
    let stream_setup = || {
        let name = cfg.scheme.name();
        StreamSetup::new(PlainTcp, cfg.target, &cfg.host, name, &cfg.template)
    };
    match cfg.scheme {
        Scheme::Coap(cobalt::Scheme::Coaps) => {
            let setup = dtls::DtlsSetup {
                target: cfg.target,
                auth: cfg
                    .dtls
                    .clone()
                    .ok_or_else(|| "coaps:// needs credentials".to_string())?,
                template: cfg.template.clone(),
            };
            run_thread::<dtls::DtlsClient>(&share, &setup)
        }
        Scheme::Coap(cobalt::Scheme::CoapTcp) => {
            run_thread::<StreamClient<PlainTcp, Frames<Tcp>>>(&share, &stream_setup()?)
        }
        Scheme::Coap(cobalt::Scheme::CoapWs) => {
            run_thread::<StreamClient<PlainTcp, WebSocket<Tcp>>>(&share, &stream_setup()?)
        }
        Scheme::Coap(cobalt::Scheme::CoapsTcp) | Scheme::Coap(cobalt::Scheme::CoapsWs) => {
            let ws = cfg.scheme == Scheme::Coap(cobalt::Scheme::CoapsWs);
            let framing = if ws {
                Framing::WebSocket
            } else {
                Framing::Stream
            };
            let connector = TlsConnector::new(cfg.dtls.as_ref(), Alpn::for_framing(framing))
                .map_err(|e| StepError::from(format!("cannot set up TLS: {e}")))?;
            let tls = Tls {
                connector,
                host: cfg.host.clone(),
            };
            let setup =
                StreamSetup::new(tls, cfg.target, &cfg.host, cfg.scheme.name(), &cfg.template)?;
            if ws {
                run_thread::<StreamClient<Tls, WebSocket<Secure>>>(&share, &setup)
            } else {
                run_thread::<StreamClient<Tls, Frames<Secure>>>(&share, &setup)
            }
        }
        other => Err(format!("{}:// is not supported by cobalt bench yet", other.name()).into()),
    }
}

/// Reads eight random bytes from the kernel, falling back to the clock.
fn random_seed() -> u64 {
    let mut seed = 0u64;
    // SAFETY: writes at most 8 bytes into `seed`.
    let n = unsafe { libc::getrandom((&mut seed as *mut u64).cast(), 8, 0) };
    if n != 8 {
        seed = now_ns() ^ (u64::from(std::process::id()) << 32);
    }
    seed
}

fn client_seed(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state ^ (*state >> 29)
}

/// Watches the running step: samples the server's and this process's CPU time at the
/// start and end of the measured window and prints progress once a second. Returns
/// the server figures and the CPU seconds this process (the load generator) used.
fn monitor(
    cfg: &Config,
    clients: usize,
    shared: &StepShared,
    measure_start: u64,
    end: u64,
) -> (Option<ServerUsage>, f64) {
    let tty = std::io::stderr().is_terminal();
    let mut started = false;
    let mut cpu_start = None;
    let mut own_start = 0.0;
    let mut last_tick = now_ns();
    let mut last_count = 0u64;
    let mut last_other = 0u64;
    let mut printed = false;
    loop {
        let now = now_ns();
        if now >= end || shared.stopping() {
            break;
        }
        if !started && now >= measure_start {
            started = true;
            cpu_start = cfg.server_pid.and_then(procfs::cpu_seconds);
            own_start = sys::own_cpu_seconds();
        }
        if cfg.progress && now >= last_tick + 1_000_000_000 {
            let count = shared.progress.load(Ordering::Relaxed);
            let other = shared.progress_other.load(Ordering::Relaxed);
            let per_s = |n: u64| n as f64 * 1e9 / (now - last_tick) as f64;
            let rate = per_s(count - last_count);
            let mut line = if now < measure_start {
                format!(
                    "[{clients} clients] warming up, {:.1}s left  {rate:.0} req/s",
                    (measure_start - now) as f64 / 1e9
                )
            } else {
                format!(
                    "[{clients} clients] {:.0}/{:.0}s  {rate:.0} req/s",
                    (now - measure_start) as f64 / 1e9,
                    (end - measure_start) as f64 / 1e9
                )
            };
            if other > last_other {
                line.push_str(&format!(
                    " 2.xx, {:.0}/s other answers (not counted)",
                    per_s(other - last_other)
                ));
            }
            if tty {
                eprint!("\r\x1b[K{line}");
            } else {
                eprintln!("{line}");
            }
            printed = true;
            last_tick = now;
            last_count = count;
            last_other = other;
        }
        let mut wake = end.min(last_tick + 1_000_000_000);
        if !started && measure_start > now {
            wake = wake.min(measure_start);
        }
        let nap = wake.saturating_sub(now).clamp(1_000, 50_000_000);
        std::thread::sleep(Duration::from_nanos(nap));
    }
    if printed && tty {
        eprint!("\r\x1b[K");
    }
    let own = if started {
        (sys::own_cpu_seconds() - own_start).max(0.0)
    } else {
        0.0
    };
    let usage = cfg.server_pid.map(|pid| ServerUsage {
        cpu_s: match (cpu_start, procfs::cpu_seconds(pid)) {
            (Some(a), Some(b)) => (b - a).max(0.0),
            _ => 0.0,
        },
        rss_kb: procfs::rss_kb(pid),
    });
    (usage, own)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::responder;
    use crate::target::parse_uri;
    use std::net::UdpSocket;
    use std::sync::Arc;

    fn config(target: SocketAddr, timeout_ms: u64) -> Config {
        let t = parse_uri(&format!("coap://{target}/bench")).unwrap();
        Config {
            uri: format!("coap://{target}/bench"),
            target,
            scheme: Scheme::Coap(cobalt::Scheme::Coap),
            host: target.ip().to_string(),
            dtls: None,
            new_session: false,
            keepalive: true,
            template: request_template(&t, Code::GET, true, None),
            confirmable: true,
            cc: None,
            method: "GET",
            steps: vec![4],
            duration: Duration::from_secs(1),
            warmup: Duration::ZERO,
            cooldown: Duration::ZERO,
            timeout: Duration::from_millis(timeout_ms),
            threads: 1,
            io: Io::Auto,
            rate: None,
            server_pid: None,
            progress: false,
            stop: Default::default(),
        }
    }

    #[test]
    fn template_layout() {
        let t = parse_uri("coap://example.org/a/b?x=1").unwrap();
        let bytes = request_template(&t, Code::POST, false, Some("hi"));
        assert_eq!(bytes[0], 0x58); // v1, NON, TKL 8
        assert_eq!(bytes[1], Code::POST.0);
        let m = cobalt_proto::message::decode(&bytes).unwrap();
        assert_eq!(m.options.uri_path_string(), "/a/b");
        assert_eq!(m.options.get(opt::URI_HOST), Some(&b"example.org"[..]));
        assert_eq!(m.payload, b"hi");
    }

    #[test]
    fn bench_against_raw_responder() {
        for io in [Io::Epoll, Io::Uring] {
            let server = responder::Background::start().unwrap();
            let mut cfg = config(server.addr(), 2000);
            cfg.threads = 2;
            cfg.io = io;
            let r = run_step(&cfg, 4).unwrap();
            let answered = server.stop().unwrap();
            assert!(r.completed > 0, "{io:?}: {r:?}");
            assert_eq!(r.lost, 0, "{io:?}: {r:?}");
            assert_eq!((r.errors, r.resets), (0, 0), "{io:?}: {r:?}");
            assert!(answered >= r.completed);
            // The generator's own CPU over the window is measured (it is never idle here).
            assert!(r.client_cpu_percent.is_some_and(|c| c > 0.0), "{r:?}");
            assert!(r.p50_us > 0.0 && r.p50_us <= r.p99_us && r.p99_us <= r.max_us);
        }

        // NON requests get NON responses, matched by token.
        let server = responder::Background::start().unwrap();
        let mut cfg = config(server.addr(), 2000);
        let t = parse_uri("coap://127.0.0.1/x").unwrap();
        cfg.template = request_template(&t, Code::GET, false, None);
        cfg.confirmable = false;
        let r = run_step(&cfg, 4).unwrap();
        server.stop().unwrap();
        assert!(r.completed > 0 && r.lost == 0, "{r:?}");
    }

    /// Answers only retransmissions: the first copy of every message ID is ignored.
    fn answer_retransmissions_only(sock: UdpSocket, stop: Arc<AtomicBool>) -> u64 {
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let mut seen = std::collections::HashSet::new();
        let mut answered = 0;
        let mut buf = [0u8; 1500];
        while !stop.load(Ordering::Relaxed) {
            let Ok((n, peer)) = sock.recv_from(&mut buf) else {
                continue;
            };
            let tkl = usize::from(buf[0] & 0x0f);
            if n < 4 + tkl || seen.insert((peer, buf[2], buf[3])) {
                continue;
            }
            let mut reply = vec![0x60 | buf[0] & 0x0f, 0x45, buf[2], buf[3]];
            reply.extend_from_slice(&buf[4..4 + tkl]);
            reply.extend_from_slice(b"\xffok");
            sock.send_to(&reply, peer).unwrap();
            answered += 1;
        }
        answered
    }

    #[test]
    fn cc_retransmits_what_a_lossy_server_ignored() {
        for cc in [None, Some(cobalt_proto::congestion::Algorithm::Fasor)] {
            let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
            let addr = sock.local_addr().unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let stop2 = stop.clone();
            let server = std::thread::spawn(move || answer_retransmissions_only(sock, stop2));
            let mut cfg = config(addr, 10_000);
            cfg.duration = Duration::from_secs(4);
            cfg.cc = cc;
            let r = run_step(&cfg, 1).unwrap();
            stop.store(true, Ordering::Relaxed);
            let answered = server.join().unwrap();
            match cc {
                // CoAPBench never retransmits: nothing is answered.
                None => assert_eq!((r.completed, answered), (0, 0), "{r:?}"),
                // FASOR's first timer (2.2-2.7 s) fires within the 4 s step.
                Some(_) => assert!(r.completed >= 1 && r.lost == 0, "{r:?}"),
            }
        }
    }

    #[test]
    fn open_loop_rate_is_respected() {
        let server = responder::Background::start().unwrap();
        let mut cfg = config(server.addr(), 2000);
        cfg.rate = Some(2000.0);
        cfg.threads = 2;
        let r = run_step(&cfg, 4).unwrap();
        server.stop().unwrap();
        assert!(r.completed > 0 && r.lost == 0, "{r:?}");
        // Loose bound: the schedule, not the server, limits the count (about 2000).
        assert!(r.completed <= 3000, "{r:?}");
    }

    /// A minimal threaded HTTP/1.1 server answering "hello world"; returns its address.
    fn http_server(stop: Arc<AtomicBool>) -> SocketAddr {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok((mut conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                };
                let stop = stop.clone();
                std::thread::spawn(move || {
                    conn.set_nonblocking(false).unwrap();
                    conn.set_read_timeout(Some(Duration::from_millis(100)))
                        .unwrap();
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !stop.load(Ordering::Relaxed) {
                        let n = match conn.read(&mut chunk) {
                            Ok(0) => return,
                            Ok(n) => n,
                            Err(_) => continue,
                        };
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).to_string();
                            buf.drain(..end + 4);
                            let close = head.contains("Connection: close");
                            let reply = format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: 11\r\n{}\r\nhello world",
                                if close { "Connection: close\r\n" } else { "" }
                            );
                            if conn.write_all(reply.as_bytes()).is_err() || close {
                                return;
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    fn http_config(addr: SocketAddr, keepalive: bool) -> Config {
        let uri = format!("http://{addr}/hello");
        let t = parse_uri(&uri).unwrap();
        let mut cfg = config(addr, 2000);
        cfg.uri = uri;
        cfg.scheme = Scheme::Http;
        cfg.keepalive = keepalive;
        cfg.template = http::request_bytes(&t, "GET", keepalive, None);
        cfg
    }

    #[test]
    fn http_with_and_without_keepalive() {
        let stop = Arc::new(AtomicBool::new(false));
        let addr = http_server(stop.clone());
        for keepalive in [true, false] {
            let r = run_step(&http_config(addr, keepalive), 4).unwrap();
            assert!(r.completed > 0, "keepalive={keepalive}: {r:?}");
            assert_eq!((r.lost, r.errors), (0, 0), "keepalive={keepalive}: {r:?}");
        }
        stop.store(true, Ordering::Relaxed);
        // Nothing listening: refused connections are errors and losses, and it ends.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let mut cfg = http_config(port, true);
        cfg.timeout = Duration::from_millis(300);
        let r = run_step(&cfg, 4).unwrap();
        assert_eq!(r.completed, 0);
        assert!(r.errors > 0 && r.lost > 0, "{r:?}");
    }

    #[test]
    fn nothing_listening_finishes_with_losses() {
        let port = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let cfg = config(port, 300);
        let started = std::time::Instant::now();
        let r = run_step(&cfg, 4).unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(r.completed, 0);
        assert!(r.lost > 0 && r.errors > 0, "{r:?}");
    }

    #[test]
    fn separate_and_duplicate_responses() {
        // Empty ACK first, then the response as CON, sent twice (a retransmission).
        let stop = Arc::new(AtomicBool::new(false));
        let acks = Arc::new(AtomicU64::new(0));
        let seen = acks.clone();
        let mut my_mid = 1000u16;
        let (addr, server) = test_server(stop.clone(), move |sock, d, from| {
            let Ok(req) = cobalt_proto::message::decode(d) else {
                return;
            };
            if req.mtype == MessageType::Acknowledgement {
                seen.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let _ = sock.send_to(&encode(&Message::empty_ack(req.mid)), from);
            my_mid = my_mid.wrapping_add(1);
            let mut resp = Message::new(MessageType::Confirmable, Code::CONTENT, my_mid);
            resp.token = req.token;
            resp.payload = b"late".to_vec();
            let bytes = encode(&resp);
            let _ = sock.send_to(&bytes, from);
            let _ = sock.send_to(&bytes, from);
        });
        let r = run_step(&config(addr, 2000), 4).unwrap();
        stop.store(true, Ordering::Relaxed);
        server.join().unwrap();
        let acks = acks.load(Ordering::Relaxed);
        assert!(r.completed > 0, "{r:?}");
        assert_eq!((r.lost, r.errors, r.resets), (0, 0, 0), "{r:?}");
        // Both copies of every CON response are acknowledged (bar the last few in
        // flight when the step ended).
        assert!(acks + 8 >= 2 * r.completed, "{acks} acks for {r:?}");
    }

    /// A UDP server on loopback that hands every datagram to `on_datagram` until
    /// `stop`; returns its address and thread.
    fn test_server(
        stop: Arc<AtomicBool>,
        mut on_datagram: impl FnMut(&UdpSocket, &[u8], SocketAddr) + Send + 'static,
    ) -> (SocketAddr, std::thread::JoinHandle<()>) {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = sock.local_addr().unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let server = std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while !stop.load(Ordering::Relaxed) {
                if let Ok((n, from)) = sock.recv_from(&mut buf) {
                    on_datagram(&sock, &buf[..n], from);
                }
            }
        });
        (addr, server)
    }

    /// A server that answers the `n`-th request with 5.03 when `n % every == 0`, else
    /// 2.05, piggybacked.
    fn answering_503(
        every: u64,
        stop: Arc<AtomicBool>,
    ) -> (SocketAddr, std::thread::JoinHandle<()>) {
        let mut n_req = 0u64;
        test_server(stop, move |sock, d, from| {
            let Ok(req) = cobalt_proto::message::decode(d) else {
                return;
            };
            n_req += 1;
            let code = if n_req.is_multiple_of(every) {
                Code::SERVICE_UNAVAILABLE
            } else {
                Code::CONTENT
            };
            let mut resp = Message::new(MessageType::Acknowledgement, code, req.mid);
            resp.token = req.token;
            let _ = sock.send_to(&encode(&resp), from);
        })
    }

    #[test]
    fn only_2xx_answers_complete() {
        // Every answer 5.03: nothing completes, every answer is counted by its code.
        let stop = Arc::new(AtomicBool::new(false));
        let (addr, server) = answering_503(1, stop.clone());
        let r = run_step(&config(addr, 2000), 4).unwrap();
        stop.store(true, Ordering::Relaxed);
        server.join().unwrap();
        assert_eq!((r.completed, r.requests_per_s), (0, 0.0), "{r:?}");
        assert!(r.non_2xx > 0, "{r:?}");
        assert_eq!(r.non_2xx_codes.get("5.03"), Some(&r.non_2xx), "{r:?}");
        assert_eq!(r.p50_us, 0.0, "no latency for refusals: {r:?}");

        // Every second answer 5.03: about half complete, the rest are listed.
        let stop = Arc::new(AtomicBool::new(false));
        let (addr, server) = answering_503(2, stop.clone());
        let r = run_step(&config(addr, 2000), 4).unwrap();
        stop.store(true, Ordering::Relaxed);
        server.join().unwrap();
        assert!(r.completed > 0 && r.non_2xx > 0, "{r:?}");
        assert!(r.completed.abs_diff(r.non_2xx) <= 8, "{r:?}");
        let codes = crate::output::codes_text(&r, ": ");
        assert!(codes.starts_with("5.03: "), "{codes}");
    }

    #[test]
    fn garbage_and_resets_are_counted() {
        // A server that answers every request with garbage, then with RST.
        let stop = Arc::new(AtomicBool::new(false));
        let mut n_req = 0u64;
        let (addr, server) = test_server(stop.clone(), move |sock, d, from| {
            if d.len() < 4 {
                return;
            }
            n_req += 1;
            let reply: Vec<u8> = if n_req.is_multiple_of(2) {
                vec![0x70, 0, d[2], d[3]]
            } else {
                vec![0xff, 0x00, 0x01]
            };
            let _ = sock.send_to(&reply, from);
        });
        let cfg = config(addr, 300);
        let r = run_step(&cfg, 4).unwrap();
        stop.store(true, Ordering::Relaxed);
        server.join().unwrap();
        assert_eq!(r.completed, 0, "{r:?}");
        assert!(r.errors > 0 && r.resets > 0, "{r:?}");
    }
}

//! Observe fan-out under a burst of changes, measured from the outside.
//!
//! Registers many observers of one resource on a running server (`/state` of
//! `cobalt serve`: GET reads it, PUT replaces it and notifies), fires a burst of PUTs at
//! it, and meanwhile runs a few "other clients" that GET `/benchmark` in a closed loop.
//! It reports how the other clients fared (2.xx answers, other codes, losses, latency
//! and the longest stretch in which none of them got an answer — how long the server
//! stopped reading its socket), how many notifications the observers got, and whether
//! every observer ended with the latest state.
//!
//! ```text
//! cargo run --release -p cobalt --example fanout_flood -- \
//!     --server 127.0.0.1:5683 --observers 10000 --ips 100 --puts 2000 --seconds 20
//! ```
//!
//! Observers are spread over `--ips` loopback addresses (127.0.0.2, 127.0.0.3, ...) so
//! that a per-address bound does not cap them; each address holds one socket with
//! `observers / ips` relations (distinct tokens). Confirmable notifications are
//! acknowledged, pings (the server verifying an address) answered with RST, and a 4.01
//! with Echo is answered by repeating the request with the Echo option (RFC 9175). `bench/fanout.sh` starts a server and runs this.
//!
//! With `--embedded` it starts its own one-shard server in this process instead,
//! with `/state` and `/state-per-peer` (the same value, whose GET handler asks for
//! the peer's address, as one that answers each client differently would, so the
//! server runs it for each observer instead of once per change), and reports the
//! shard thread's CPU time per notification: `--path /state` against
//! `--path /state-per-peer` shows what producing a notification once per change
//! saves. `--put-interval-ms N` spreads the PUTs out (a change every N ms) instead of
//! sending them at once. `--handler-us N` makes the embedded GET handler spend N µs
//! of CPU per run, as one that builds a real representation would.
//!
//! `--register-seconds N` (default 20) is how long registrations are retried;
//! `--settle-ms N` (default 3000) how long the tool waits after them before it reads
//! the RSS, so that the figure is what the relations hold rather than what the
//! registrations' transient state left to the allocator's decay.
//! `--server-pid PID` reports the server's RSS at each phase; `--deregister` ends
//! every relation at the end (GET without Observe) and reports the RSS after.
//! `--upload-flood N` measures an upload flood instead: N one-block uploads of 1024
//! bytes that are never finished, from `--ips` addresses × 10 ports, and the server's
//! RSS until they have expired (run the server with a short
//! `limits.upload_idle_timeout`).

use cobalt::Scheme;
use cobalt_proto::message::{codec, opt, Code, Message, MessageType, Token};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;

struct Args {
    server: SocketAddr,
    observers: usize,
    ips: usize,
    puts: usize,
    probes: usize,
    /// Requests per second of each other client (at most; closed loop).
    probe_rate: u64,
    seconds: u64,
    probe_timeout: Duration,
    path: String,
    embedded: bool,
    /// Time between two PUTs; zero: all at once.
    put_interval: Duration,
    /// CPU time the embedded server's GET handler spends per run (a stand-in for
    /// building a representation).
    handler_work: Duration,
    /// The server's process, to report its RSS at each phase.
    server_pid: Option<u32>,
    /// End every relation at the end (GET without Observe) and report the RSS after.
    deregister: bool,
    /// Instead of the fan-out: this many one-block uploads of 1024 bytes from
    /// `ips` addresses × 10 ports, then the RSS until they expired.
    upload_flood: usize,
    /// How long the registrations are retried before the run goes on without the
    /// missing ones.
    register_for: Duration,
    /// How long to wait after the registrations before the RSS is read, so that the
    /// allocator has returned what the registrations' transient state took (the
    /// server's jemalloc gives freed pages back after about a second).
    settle: Duration,
}

fn parse_args() -> Args {
    let mut a = Args {
        server: "127.0.0.1:5683".parse().unwrap(),
        observers: 10_000,
        ips: 100,
        puts: 2000,
        probes: 20,
        probe_rate: 100,
        seconds: 20,
        probe_timeout: Duration::from_secs(2),
        path: "/state".into(),
        embedded: false,
        put_interval: Duration::ZERO,
        handler_work: Duration::ZERO,
        server_pid: None,
        deregister: false,
        upload_flood: 0,
        register_for: Duration::from_secs(20),
        settle: Duration::from_secs(3),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        let bad = || -> ! {
            eprintln!("fanout_flood: bad value `{value}` for {}", args[i]);
            std::process::exit(2)
        };
        match args[i].as_str() {
            "--server" => a.server = value.parse().unwrap_or_else(|_| bad()),
            "--observers" => a.observers = value.parse().unwrap_or_else(|_| bad()),
            "--ips" => a.ips = value.parse().unwrap_or_else(|_| bad()),
            "--puts" => a.puts = value.parse().unwrap_or_else(|_| bad()),
            "--probes" => a.probes = value.parse().unwrap_or_else(|_| bad()),
            "--probe-rate" => a.probe_rate = value.parse().unwrap_or_else(|_| bad()),
            "--seconds" => a.seconds = value.parse().unwrap_or_else(|_| bad()),
            "--probe-timeout-ms" => {
                a.probe_timeout = Duration::from_millis(value.parse().unwrap_or_else(|_| bad()))
            }
            "--path" => a.path = value,
            "--handler-us" => {
                a.handler_work = Duration::from_micros(value.parse().unwrap_or_else(|_| bad()))
            }
            "--server-pid" => a.server_pid = Some(value.parse().unwrap_or_else(|_| bad())),
            "--upload-flood" => a.upload_flood = value.parse().unwrap_or_else(|_| bad()),
            "--register-seconds" => {
                a.register_for = Duration::from_secs(value.parse().unwrap_or_else(|_| bad()))
            }
            "--settle-ms" => {
                a.settle = Duration::from_millis(value.parse().unwrap_or_else(|_| bad()))
            }
            "--deregister" => {
                a.deregister = true;
                i += 1;
                continue;
            }
            "--put-interval-ms" => {
                a.put_interval = Duration::from_millis(value.parse().unwrap_or_else(|_| bad()))
            }
            "--embedded" => {
                a.embedded = true;
                i += 1;
                continue;
            }
            other => {
                eprintln!(
                    "fanout_flood: unknown argument `{other}`; see the doc comment of cobalt/examples/fanout_flood.rs"
                );
                std::process::exit(2)
            }
        }
        i += 2;
    }
    a.ips = a.ips.clamp(1, 250);
    a
}

/// A UDP socket on `addr` with a large receive buffer, so that bursts of answers and
/// notifications are not dropped while this tool is busy elsewhere.
fn bind(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    let _ = s.set_recv_buffer_size(4 << 20);
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    UdpSocket::from_std(s.into())
}

fn request(code: Code, mid: u16, token: &[u8], path: &str) -> Message {
    let mut m = Message::new(MessageType::Confirmable, code, mid);
    m.token = Token::new(token).expect("token of at most 8 bytes");
    m.options.set_uri_path(path);
    m
}

/// What one observer saw: the latest sequence number and payload, and when the
/// payload last changed.
#[derive(Clone, Default)]
struct Seen {
    seq: Option<u32>,
    payload: Vec<u8>,
    at: Option<Instant>,
    notifications: u64,
    /// The server answered a GET without Observe: the relation has ended.
    ended: bool,
}

/// One address with its socket and relations.
struct Group {
    socket: Arc<UdpSocket>,
    seen: Mutex<HashMap<Vec<u8>, Seen>>,
    registered: AtomicUsize,
}

async fn observer_group(
    index: usize,
    per_ip: usize,
    args: Arc<Args>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<Arc<Group>> {
    let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + index as u8));
    let socket = Arc::new(bind(SocketAddr::new(ip, 0))?);
    socket.connect(args.server).await?;
    let group = Arc::new(Group {
        socket: socket.clone(),
        seen: Mutex::new(HashMap::new()),
        registered: AtomicUsize::new(0),
    });
    let tokens: Vec<Vec<u8>> = (0..per_ip)
        .map(|j| vec![(index >> 8) as u8, index as u8, (j >> 8) as u8, j as u8])
        .collect();
    // The receiver: ACKs confirmable notifications, records what each token saw.
    let recv = {
        let group = group.clone();
        let args = args.clone();
        let stop = stop.clone();
        let tokens: std::collections::HashSet<Vec<u8>> = tokens.iter().cloned().collect();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            let mut echoes: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
            let mut mid: u16 = 30_000;
            while !stop.load(Ordering::Relaxed) {
                let n = match tokio::time::timeout(
                    Duration::from_millis(200),
                    group.socket.recv(&mut buf),
                )
                .await
                {
                    Ok(Ok(n)) => n,
                    Ok(Err(_)) => continue,
                    Err(_) => continue,
                };
                let Ok(m) = codec::decode(&buf[..n]) else {
                    continue;
                };
                if m.mtype == MessageType::Confirmable && m.code == Code::EMPTY {
                    // A ping: the server verifies this address (RFC 9175 §2.4).
                    let rst = codec::encode(&Message::reset(m.mid));
                    let _ = group.socket.send(&rst).await;
                    continue;
                }
                if m.mtype == MessageType::Confirmable {
                    let _ = group
                        .socket
                        .send(&codec::encode(&Message::empty_ack(m.mid)))
                        .await;
                }
                let token = m.token.as_bytes().to_vec();
                if m.code == Code::UNAUTHORIZED {
                    if let Some(echo) = m.options.get(opt::ECHO) {
                        // Prove the address: repeat the registration with Echo.
                        echoes.insert(token.clone(), echo.to_vec());
                        mid = mid.wrapping_add(1);
                        let mut r = request(Code::GET, mid, &token, &args.path);
                        r.options.set_uint(opt::OBSERVE, 0);
                        r.options.set(opt::ECHO, echo);
                        let _ = group.socket.send(&codec::encode(&r)).await;
                    }
                    continue;
                }
                if !m.code.is_response() || !tokens.contains(&token) {
                    continue;
                }
                let mut seen = group.seen.lock().unwrap();
                let entry = seen.entry(token).or_default();
                let Some(seq) = m.options.observe() else {
                    // The answer to a deregistration (a GET without Observe).
                    entry.ended |= m.code.is_success();
                    continue;
                };
                if entry.seq.is_none() {
                    group.registered.fetch_add(1, Ordering::Relaxed);
                } else {
                    entry.notifications += 1;
                }
                // 24-bit serial arithmetic is not needed for the few seconds of a run.
                if entry.seq.is_none_or(|s| seq > s) {
                    entry.seq = Some(seq);
                    if entry.payload != m.payload {
                        entry.payload = m.payload.clone();
                        entry.at = Some(Instant::now());
                    }
                }
            }
        })
    };
    // Registrations, retried until each token is registered (or `--register-seconds`).
    let deadline = Instant::now() + args.register_for;
    let mut mid: u16 = 0;
    loop {
        let missing: Vec<Vec<u8>> = {
            let seen = group.seen.lock().unwrap();
            tokens
                .iter()
                .filter(|t| seen.get(*t).is_none_or(|s| s.seq.is_none()))
                .cloned()
                .collect()
        };
        if missing.is_empty() || Instant::now() > deadline {
            break;
        }
        // Paced: within the requests one peer may have in progress (the first waits
        // for the server to verify this address).
        for chunk in missing.chunks(16) {
            for t in chunk {
                mid = mid.wrapping_add(1);
                let mut r = request(Code::GET, mid, t, &args.path);
                r.options.set_uint(opt::OBSERVE, 0);
                let _ = socket.send(&codec::encode(&r)).await;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The receiver goes on until `stop`.
    drop(recv);
    Ok(group)
}

/// What the other clients saw; only requests sent once the burst began count.
#[derive(Default)]
struct ProbeStats {
    burst_at: std::sync::OnceLock<Instant>,
    baseline: AtomicU64,
    sent: AtomicU64,
    ok: AtomicU64,
    other: Mutex<HashMap<String, u64>>,
    lost: AtomicU64,
    latencies_us: Mutex<Vec<u64>>,
    answered_at: Mutex<Vec<Instant>>,
}

async fn probe(index: usize, args: Arc<Args>, stats: Arc<ProbeStats>, stop: Arc<AtomicBool>) {
    let ip = IpAddr::V4(Ipv4Addr::new(127, 1, 0, 1 + (index % 250) as u8));
    let Ok(socket) = bind(SocketAddr::new(ip, 0)) else {
        return;
    };
    if socket.connect(args.server).await.is_err() {
        return;
    }
    let mut mid: u16 = rand_u16(index);
    let mut buf = vec![0u8; 2048];
    let period = Duration::from_micros(1_000_000 / args.probe_rate.max(1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        mid = mid.wrapping_add(1);
        let token = [0xfe, index as u8, (mid >> 8) as u8, mid as u8];
        let req = request(Code::GET, mid, &token, "/benchmark");
        let started = Instant::now();
        let counted = stats.burst_at.get().is_some_and(|b| started >= *b);
        if counted {
            stats.sent.fetch_add(1, Ordering::Relaxed);
        }
        let _ = socket.send(&codec::encode(&req)).await;
        let deadline = started + args.probe_timeout;
        let answer = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, socket.recv(&mut buf)).await {
                Ok(Ok(n)) => match codec::decode(&buf[..n]) {
                    Ok(m) if m.token.as_bytes() == token && m.code.is_response() => break Some(m),
                    _ => continue,
                },
                Ok(Err(_)) => continue,
                Err(_) => break None,
            }
        };
        if answer.is_some() && counted {
            // Any answer shows that the server read its socket.
            stats.answered_at.lock().unwrap().push(Instant::now());
        }
        match answer {
            Some(m) if !counted => {
                if m.code.is_success() {
                    stats.baseline.fetch_add(1, Ordering::Relaxed);
                }
            }
            None if !counted => {}
            Some(m) if m.code.is_success() => {
                let now = Instant::now();
                stats.ok.fetch_add(1, Ordering::Relaxed);
                stats
                    .latencies_us
                    .lock()
                    .unwrap()
                    .push((now - started).as_micros() as u64);
            }
            Some(m) => {
                *stats
                    .other
                    .lock()
                    .unwrap()
                    .entry(m.code.to_string())
                    .or_default() += 1;
            }
            None => {
                stats.lost.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn rand_u16(seed: usize) -> u16 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (nanos as usize ^ seed.wrapping_mul(7919)) as u16
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// A one-shard server with `/state`, `/state-per-peer` and `/benchmark`.
async fn embedded_server(work: Duration) -> cobalt::ServerHandle {
    use cobalt::server::{get, Observable, Request, ServerLimits};
    use cobalt::{Response, Server};
    let value = Arc::new(Mutex::new(b"initial".to_vec()));
    let (shared, per_peer) = (Observable::new(), Observable::new());
    let resource = |obs: &Observable, read_peer: bool| {
        let (read, write) = (value.clone(), value.clone());
        let (a, b) = (shared.clone(), per_peer.clone());
        get(move |req: Request| {
            if read_peer {
                // An answer that may depend on who asks: produced per observer.
                let _ = req.peer();
            }
            let v = read.lock().unwrap().clone();
            let until = Instant::now() + work;
            while Instant::now() < until {
                std::hint::spin_loop();
            }
            async move { Response::content(v) }
        })
        .put(move |req: Request| {
            *write.lock().unwrap() = req.payload().to_vec();
            a.changed();
            b.changed();
            async { cobalt::Code::CHANGED }
        })
        .observable(obs)
    };
    Server::new()
        .route("/state", resource(&shared, false))
        .route("/state-per-peer", resource(&per_peer, true))
        .route("/benchmark", get(|| async { "hello world" }))
        .limits(ServerLimits {
            max_observers: 1_000_000,
            ..ServerLimits::default()
        })
        .shards(1)
        .bind("127.0.0.1:0")
        .await
        .expect("bind the embedded server")
}

/// CPU time (user + system) of this process's thread named `name`.
fn thread_cpu(name: &str) -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            return cpu_in_stat(&t.path().join("stat"));
        }
    }
    Duration::ZERO
}

/// CPU time (user + system) of the process `pid`, all its threads.
fn process_cpu(pid: u32) -> Duration {
    cpu_in_stat(std::path::Path::new(&format!("/proc/{pid}/stat")))
}

/// The user and system time in a `/proc/.../stat` file (zero if it cannot be read).
fn cpu_in_stat(path: &std::path::Path) -> Duration {
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .collect();
    let used: u64 = fields
        .get(11..13)
        .map_or(0, |f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum());
    Duration::from_millis(used * 1000 / ticks)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = parse_args();
    let server = if args.embedded {
        let server = embedded_server(args.handler_work).await;
        args.server = server.local_addr(Scheme::Coap).unwrap();
        Some(server)
    } else {
        None
    };
    let args = Arc::new(args);
    let rss_at_start = rss(&args, "at the start");
    if args.upload_flood > 0 {
        return upload_flood(&args).await;
    }
    let stop_observers = Arc::new(AtomicBool::new(false));
    let per_ip = args.observers.div_ceil(args.ips);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..args.ips {
        tasks.push(tokio::spawn(observer_group(
            i,
            per_ip,
            args.clone(),
            stop_observers.clone(),
        )));
    }
    let mut groups = Vec::new();
    for t in tasks {
        groups.push(t.await.expect("observer task")?);
    }
    let registered: usize = groups
        .iter()
        .map(|g| g.registered.load(Ordering::Relaxed))
        .sum();
    println!(
        "observers registered: {registered} of {} in {:.1} s ({} addresses)",
        per_ip * args.ips,
        started.elapsed().as_secs_f64(),
        args.ips
    );
    tokio::time::sleep(args.settle).await;
    let rss_registered = rss(&args, "with the observers registered");
    if let Some((start, with)) = rss_at_start.zip(rss_registered) {
        println!(
            "bytes per relation: {:.0} (RSS delta {} KiB / {registered} relations)",
            with.saturating_sub(start) as f64 * 1024.0 / registered.max(1) as f64,
            with.saturating_sub(start)
        );
    }
    // The other clients: a second of baseline, then the burst, then the rest.
    let stats = Arc::new(ProbeStats::default());
    let stop_probes = Arc::new(AtomicBool::new(false));
    let probes: Vec<_> = (0..args.probes)
        .map(|i| tokio::spawn(probe(i, args.clone(), stats.clone(), stop_probes.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The burst: every PUT sent at once, answers counted as they come.
    let put_socket = Arc::new(bind(SocketAddr::from(([127, 0, 3, 1], 0)))?);
    put_socket.connect(args.server).await?;
    // The answers are read while the PUTs go out (none dropped for lack of room).
    let put_codes: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let put_recv = {
        let codes = put_codes.clone();
        let socket = put_socket.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            while let Ok(n) = socket.recv(&mut buf).await {
                if let Ok(m) = codec::decode(&buf[..n]) {
                    if m.code.is_response() {
                        *codes.lock().unwrap().entry(m.code.to_string()).or_default() += 1;
                    }
                }
            }
        })
    };
    let cpu_before = thread_cpu("cobalt-shard-0");
    let server_cpu_before = args.server_pid.map(process_cpu);
    let sent_before = server.as_ref().map(|s| s.metrics().total());
    let burst_at = Instant::now();
    let _ = stats.burst_at.set(burst_at);
    for i in 0..args.puts {
        let mut r = request(
            Code::PUT,
            i as u16,
            &[0xaa, (i >> 8) as u8, i as u8],
            &args.path,
        );
        r.payload = format!("state-{i:06}").into_bytes();
        put_socket.send(&codec::encode(&r)).await?;
        if !args.put_interval.is_zero() {
            tokio::time::sleep(args.put_interval).await;
        }
    }
    let burst_sent = burst_at.elapsed();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    stop_probes.store(true, Ordering::Relaxed);
    for p in probes {
        let _ = p.await;
    }
    put_recv.abort();
    // The state the server ended with.
    let check = bind(SocketAddr::from(([127, 0, 3, 2], 0)))?;
    check.connect(args.server).await?;
    let mut buf = vec![0u8; 2048];
    let asked = Instant::now();
    let mut final_state = None;
    for mid in 1..=60u16 {
        check
            .send(&codec::encode(&request(Code::GET, mid, &[1], &args.path)))
            .await?;
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(2), check.recv(&mut buf)).await
        {
            match codec::decode(&buf[..n]) {
                Ok(m) if m.code.is_success() => {
                    final_state = Some(m.payload);
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
    let final_state = final_state.unwrap_or_default();
    println!(
        "the server answered a GET of the final state {:.1} s after the window ended",
        asked.elapsed().as_secs_f64()
    );
    // Notifications still under way arrive meanwhile.
    tokio::time::sleep(Duration::from_secs(2)).await;
    rss(&args, "after the burst");
    let cpu = thread_cpu("cobalt-shard-0").saturating_sub(cpu_before);
    let server_cpu = args
        .server_pid
        .zip(server_cpu_before)
        .map(|(pid, before)| process_cpu(pid).saturating_sub(before));
    let server_figures = server.as_ref().zip(sent_before).map(|(s, before)| {
        let after = s.metrics().total();
        (
            after.datagrams_out - before.datagrams_out,
            after.notify_productions - before.notify_productions,
        )
    });

    println!(
        "burst: {} PUTs sent in {:.1} ms; answers by code: {:?}",
        args.puts,
        burst_sent.as_secs_f64() * 1e3,
        put_codes.lock().unwrap()
    );
    let sent = stats.sent.load(Ordering::Relaxed);
    let ok = stats.ok.load(Ordering::Relaxed);
    let lost = stats.lost.load(Ordering::Relaxed);
    let mut lat = stats.latencies_us.lock().unwrap().clone();
    lat.sort_unstable();
    let mut at = stats.answered_at.lock().unwrap().clone();
    at.sort_unstable();
    let window_end = burst_at + Duration::from_secs(args.seconds);
    let mut gap = Duration::ZERO;
    let mut prev = burst_at;
    for t in at
        .iter()
        .copied()
        .filter(|t| *t >= burst_at)
        .chain([window_end])
    {
        gap = gap.max(t.saturating_duration_since(prev));
        prev = t;
    }
    println!(
        "other clients ({} × at most {}/s CON GET /benchmark, timeout {} ms), from the burst on: {sent} sent, {ok} 2.xx ({:.1} %), other codes {:?}, {lost} lost; {} answered before the burst (1 s)",
        args.probes,
        args.probe_rate,
        args.probe_timeout.as_millis(),
        100.0 * ok as f64 / sent.max(1) as f64,
        stats.other.lock().unwrap(),
        stats.baseline.load(Ordering::Relaxed)
    );
    println!(
        "other clients' latency (2.xx): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; longest stretch with no answer of any code after the burst began: {:.3} s",
        percentile(&lat, 0.5) as f64 / 1e3,
        percentile(&lat, 0.99) as f64 / 1e3,
        lat.last().copied().unwrap_or(0) as f64 / 1e3,
        gap.as_secs_f64()
    );
    let mut notifications = 0;
    let mut latest = 0;
    let mut converged = Duration::ZERO;
    let mut total = 0;
    for g in &groups {
        for s in g.seen.lock().unwrap().values() {
            total += 1;
            notifications += s.notifications;
            if s.payload == final_state {
                latest += 1;
                if let Some(at) = s.at {
                    converged = converged.max(at.saturating_duration_since(burst_at));
                }
            }
        }
    }
    println!(
        "observers: {notifications} notifications ({:.1} per observer); {latest} of {total} hold the final state {:?}; the last got it {:.3} s after the burst began",
        notifications as f64 / total.max(1) as f64,
        String::from_utf8_lossy(&final_state),
        converged.as_secs_f64()
    );
    if let Some(cpu) = server_cpu {
        // Includes the PUTs, the ACKs of confirmable notifications and the other
        // clients' requests (run with `--probes 0` for the notifications alone).
        // Notifications received count retransmissions of confirmable ones whose ACK
        // was late; the observers that got the final state count each relation once.
        println!(
            "server process CPU from the burst on: {} ms for {notifications} notifications received: {:.2} µs per notification; {:.2} µs per observer that got the final state ({latest})",
            cpu.as_millis(),
            cpu.as_secs_f64() * 1e6 / notifications.max(1) as f64,
            cpu.as_secs_f64() * 1e6 / latest.max(1) as f64
        );
    }
    if let Some((sent, productions)) = server_figures {
        println!(
            "embedded server, {}: shard CPU {} ms from the burst on for {sent} datagrams sent ({productions} GET handler runs for notifications): {:.2} µs per datagram",
            args.path,
            cpu.as_millis(),
            cpu.as_secs_f64() * 1e6 / sent.max(1) as f64
        );
    }
    if args.deregister {
        // Each relation ends with a GET without Observe, sent again (new message ID)
        // until the server has answered it, for at most as long as the registrations.
        let deadline = Instant::now() + args.register_for;
        let mut round: u16 = 0;
        loop {
            let mut pending = 0usize;
            for g in &groups {
                let tokens: Vec<Vec<u8>> = {
                    let seen = g.seen.lock().unwrap();
                    seen.iter()
                        .filter(|(_, s)| !s.ended)
                        .map(|(t, _)| t.clone())
                        .collect()
                };
                pending += tokens.len();
                for (j, t) in tokens.iter().enumerate() {
                    // Message IDs the registrations did not use (no duplicates).
                    let mid = 40_000u16
                        .wrapping_add(round.wrapping_mul(7919))
                        .wrapping_add(j as u16);
                    let r = request(Code::GET, mid, t, &args.path);
                    let _ = g.socket.send(&codec::encode(&r)).await;
                    if j % 50 == 49 {
                        // Paced, so that the server's socket buffer takes them all.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }
            }
            if pending == 0 || Instant::now() > deadline {
                println!("relations not ended by the tool: {pending}");
                break;
            }
            round = round.wrapping_add(1);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        rss(&args, "3 s after every relation ended");
        if let Some(s) = &server {
            println!("observers left: {}", s.metrics().total().observers);
        }
    }
    // The observers' receivers answer pings and confirmable notifications until here,
    // and see the answers to the deregistrations.
    stop_observers.store(true, Ordering::Relaxed);
    Ok(())
}

/// Counts the bytes this process has allocated and not freed (for `--embedded`: the
/// server's tables, next to this tool's own, which stay the same between phases).
struct Counting;

static LIVE: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - layout.size() as isize, Ordering::Relaxed);
        unsafe { std::alloc::System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Prints the server's RSS, if its process is known, or with `--embedded` the bytes
/// allocated in this process.
/// Returns the figure in KiB.
fn rss(args: &Args, when: &str) -> Option<u64> {
    if args.embedded {
        let live = LIVE.load(Ordering::Relaxed).max(0) as u64;
        println!(
            "heap in use {when}: {:.1} MiB (this process: server and tool)",
            live as f64 / (1 << 20) as f64
        );
        return Some(live / 1024);
    }
    let pid = args.server_pid?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    match kib {
        Some(kib) => println!("server RSS {when}: {kib} kB"),
        None => println!("server RSS {when}: ?"),
    }
    kib
}

/// Uploads that are never finished, from many addresses and ports; the server's RSS
/// until they have expired.
async fn upload_flood(args: &Args) -> std::io::Result<()> {
    let mut sockets = Vec::new();
    for i in 0..args.ips {
        for _ in 0..10 {
            let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + i as u8));
            let s = bind(SocketAddr::new(ip, 0))?;
            s.connect(args.server).await?;
            sockets.push(s);
        }
    }
    let mut codes: HashMap<String, u64> = HashMap::new();
    let mut buf = vec![0u8; 2048];
    let started = Instant::now();
    for n in 0..args.upload_flood {
        let s = &sockets[n % sockets.len()];
        let tag = (n as u32).to_be_bytes();
        let mut r = request(Code::PUT, n as u16, &tag, "/upload");
        r.options.set_uint(opt::BLOCK1, 0x0e); // NUM 0, more, 1024 bytes
        r.options.set(opt::REQUEST_TAG, tag);
        r.payload = vec![b'u'; 1024];
        s.send(&codec::encode(&r)).await?;
        let answer = tokio::time::timeout(Duration::from_secs(2), s.recv(&mut buf)).await;
        let code = match answer {
            Ok(Ok(len)) => {
                codec::decode(&buf[..len]).map_or("garbage".into(), |m| m.code.to_string())
            }
            _ => "lost".into(),
        };
        *codes.entry(code).or_default() += 1;
    }
    println!(
        "upload flood: {} one-block uploads in {:.1} s, answers {codes:?}",
        args.upload_flood,
        started.elapsed().as_secs_f64()
    );
    rss(args, "after the upload flood");
    for _ in 0..args.seconds {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    rss(args, &format!("{} s later", args.seconds));
    Ok(())
}

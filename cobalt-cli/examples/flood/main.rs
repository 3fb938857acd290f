//! `flood`: attacks a CoAP server the way issue 14 describes, while legitimate clients
//! run beside the attacker, and reports what each side got and the server's memory.
//!
//! ```text
//! cargo build --release -p cobalt-cli --example flood
//! target/release/examples/flood dedup coap://127.0.0.1:5683 --rate 20000 --duration 10 \
//!     --legit coap://127.0.0.1:5683/benchmark --server-pid "$(pidof cobalt)" --settle 30
//! ```
//!
//! An example rather than a `cobalt` subcommand: an attack tool has no place in the
//! binary users deploy, and it stays out of the CLI's argument parsing. `bench/floods.sh`
//! builds it and runs every mode against a fresh `cobalt serve`.
//!
//! Modes (the attacker binds `--source` and, with `--ips N`, N addresses of 127/8 from
//! it; the legitimate clients use the system's choice, 127.0.0.1 towards 127.0.0.1):
//!
//! | mode | what the attacker sends |
//! |---|---|
//! | `dtls-handshake` | DTLS ClientHellos; answers the HelloVerifyRequest with the cookie, waits for the server's flight, then abandons the handshake (a half-open handshake per source port) |
//! | `dtls-session` | complete certificate handshakes without a client credential (a server with `--cert` and no `--ca`; `--ca` names what the attacker trusts), then silence: `--connections` established sessions held idle |
//! | `tcp`, `ws` | holds `--connections` connections open from one address and says nothing (`ws`: after the HTTP upgrade) |
//! | `tcp-csm` | the same, after sending a CSM (the connection speaks CoAP, then idles) |
//! | `tls`, `wss` | the same with a TLS ClientHello sent and the handshake never finished |
//! | `dedup` | confirmable GETs of /benchmark over many source ports, each with a new message ID |
//! | `separate` | confirmable GETs of /separate?delay=30000 |
//! | `upload` | one-block Block1 PUTs to /upload (block 0 of a larger body, never continued) |
//! | `observe-non`, `observe-con` | observe registrations of /obs, NON or CON, a new token each, never acknowledging a notification |
//!
//! The output (`--json`) has the attacker's counts (answers by code), each legitimate
//! client's results during the flood and after it (2.xx only count as successes; other
//! codes and errors by name), the server's RSS before, at its peak, at the end of the
//! flood and after `--settle` seconds, and, with `--metrics`, the server's gauges at the
//! same moments.

mod conn;
mod dtls_hello;
mod dtls_session;
mod gauges;
mod legit;
mod udp;

use clap::{Parser, ValueEnum};
use cobalt_bench::procfs;
use serde_json::{json, Value};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the attacker does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Half-open DTLS handshakes after a valid cookie.
    DtlsHandshake,
    /// Complete anonymous DTLS sessions (certificate server), held idle.
    DtlsSession,
    /// Silent TCP connections from one address.
    Tcp,
    /// TCP connections that send their CSM, then nothing.
    TcpCsm,
    /// TLS connections whose handshake never finishes.
    Tls,
    /// WebSocket connections that upgrade, then say nothing.
    Ws,
    /// Secure WebSocket connections whose TLS handshake never finishes.
    Wss,
    /// CON GETs over many ports and message IDs (deduplication state).
    Dedup,
    /// CON GETs of a slow resource (separate responses).
    Separate,
    /// First blocks of Block1 uploads, never continued.
    Upload,
    /// NON observe registrations.
    ObserveNon,
    /// CON observe registrations.
    ObserveCon,
}

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "flood",
    about = "Floods a CoAP server while legitimate clients run beside"
)]
pub struct Args {
    /// The attack.
    #[arg(value_enum)]
    pub mode: Mode,
    /// The server: a URI such as coap://127.0.0.1:5683 (the path, if any, replaces the
    /// mode's default resource).
    pub target: String,
    /// Seconds of flood.
    #[arg(short, long, default_value_t = 10.0)]
    pub duration: f64,
    /// Attack rate: datagrams per second (UDP modes), handshakes per second
    /// (dtls-handshake) or connection attempts per second (tcp, tls, ws, wss).
    #[arg(long)]
    pub rate: Option<u32>,
    /// UDP sockets (source ports) per source address the datagram floods rotate over.
    #[arg(long, default_value_t = 200)]
    pub sources: usize,
    /// The attacker's (first) source address.
    #[arg(long, default_value = "127.0.0.2")]
    pub source: Ipv4Addr,
    /// Source addresses: this many consecutive addresses from --source.
    #[arg(long, default_value_t = 1)]
    pub ips: u32,
    /// Connections held at once (tcp, tls, ws, wss).
    #[arg(long, default_value_t = 2000)]
    pub connections: usize,
    /// Handshakes waiting for the server's answer at once (dtls-handshake).
    #[arg(long, default_value_t = 256)]
    pub in_flight: usize,
    /// A legitimate client: GETs this URI one after another on one client (one socket,
    /// DTLS session or connection). Repeatable.
    #[arg(long, value_name = "URI")]
    pub legit: Vec<String>,
    /// A legitimate client that opens a new client (socket, DTLS session, connection)
    /// for every GET of this URI. Repeatable.
    #[arg(long, value_name = "URI")]
    pub legit_fresh: Vec<String>,
    /// A legitimate client that PUTs a 3 KiB body to this URI (block-wise over UDP and
    /// DTLS) one upload after another. Repeatable.
    #[arg(long, value_name = "URI")]
    pub legit_upload: Vec<String>,
    /// A legitimate observer of this URI (counts notifications). Repeatable.
    #[arg(long, value_name = "URI")]
    pub legit_observe: Vec<String>,
    /// Requests per second of each legitimate GET loop.
    #[arg(long, default_value_t = 10.0)]
    pub legit_rate: f64,
    /// A legitimate request not answered within this many seconds counts as a timeout.
    #[arg(long, default_value_t = 5.0)]
    pub legit_timeout: f64,
    /// PSK identity for coaps, coaps+tcp and coaps+ws URIs (the attacker needs none).
    #[arg(long)]
    pub psk_identity: Option<String>,
    /// The CA certificate (PEM file) of a certificate server: the dtls-session
    /// attacker trusts it, and so do the legitimate clients, which then connect
    /// anonymously (without their PSK) like the attacker.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<std::path::PathBuf>,
    /// PSK (text, or 0x and hex digits).
    #[arg(long)]
    pub psk_key: Option<String>,
    /// The server's process: its RSS is sampled every 100 ms.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// The server's Prometheus endpoint (e.g. 127.0.0.1:9100): gauges are read before,
    /// at the end of the flood and after the settle time.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Seconds after the flood during which the legitimate clients go on and the
    /// server's memory is watched (state should expire and memory come back).
    #[arg(long, default_value_t = 0.0)]
    pub settle: f64,
    /// Print the report as JSON on stdout (a summary goes to stderr in any case).
    #[arg(long)]
    pub json: bool,
}

impl Args {
    /// The contents of `--ca`, if given (exits when it cannot be read).
    pub fn ca_pem(&self) -> Option<Vec<u8>> {
        let path = self.ca.as_ref()?;
        Some(std::fs::read(path).unwrap_or_else(|e| {
            eprintln!("flood: --ca {}: {e}", path.display());
            std::process::exit(2)
        }))
    }

    /// The attacker's source addresses.
    pub fn source_ips(&self) -> Vec<IpAddr> {
        let base = u32::from(self.source);
        (0..self.ips.max(1))
            .map(|i| IpAddr::V4(Ipv4Addr::from(base.wrapping_add(i))))
            .collect()
    }

    /// The default rate of each mode: enough to build state quickly, bounded so the
    /// load generator does not take a shared machine over.
    fn rate(&self) -> u32 {
        self.rate.unwrap_or(match self.mode {
            Mode::Dedup => 20_000,
            Mode::DtlsHandshake => 1_000,
            Mode::DtlsSession => 200,
            Mode::Tcp | Mode::TcpCsm | Mode::Tls | Mode::Ws | Mode::Wss => 1_000,
            Mode::Separate | Mode::Upload | Mode::ObserveNon | Mode::ObserveCon => 2_000,
        })
    }
}

/// Attack counters, by name (e.g. `sent`, `answer 5.03`, `connect failed`).
pub type Counters = Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>>;

/// Adds `n` to counter `name`.
pub fn count(counters: &Counters, name: &str, n: u64) {
    let mut c = counters.lock().unwrap_or_else(|e| e.into_inner());
    *c.entry(name.to_string()).or_default() += n;
}

/// What a holding flood (connections, DTLS sessions) holds open now, and the most it
/// held at once.
#[derive(Debug, Default)]
pub struct Held {
    open: std::sync::atomic::AtomicUsize,
    peak: std::sync::atomic::AtomicUsize,
}

impl Held {
    /// One more is open.
    pub fn opened(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let now_open = self.open.fetch_add(1, Relaxed) + 1;
        self.peak.fetch_max(now_open, Relaxed);
    }

    /// One fewer is open.
    pub fn closed(&self) {
        self.open.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Adds the peak as counter `peak_name` and what is still open as `end_name`.
    pub fn report(&self, counters: &Counters, peak_name: &str, end_name: &str) {
        use std::sync::atomic::Ordering::Relaxed;
        count(counters, peak_name, self.peak.load(Relaxed) as u64);
        count(counters, end_name, self.open.load(Relaxed) as u64);
    }
}

/// The target's address and path from a URI like `coap://127.0.0.1:5683/obs`.
fn parse_target(uri: &str, mode: Mode) -> Result<(SocketAddr, String), String> {
    let (scheme, rest) = uri
        .split_once("://")
        .ok_or_else(|| format!("{uri}: expected SCHEME://HOST:PORT[/PATH]"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let default_port = match scheme {
        "coap" | "coap+tcp" => 5683,
        "coaps" | "coaps+tcp" => 5684,
        "coap+ws" => 8080,
        "coaps+ws" => 8443,
        _ => return Err(format!("{uri}: unknown scheme {scheme}")),
    };
    let addr = authority
        .parse::<SocketAddr>()
        .or_else(|_| {
            authority
                .parse::<IpAddr>()
                .map(|ip| SocketAddr::new(ip, default_port))
        })
        .map_err(|_| format!("{uri}: the host must be an IP address (and port)"))?;
    let path = if path.is_empty() || path == "/" {
        match mode {
            Mode::Dedup => "/benchmark",
            Mode::Separate => "/separate?delay=30000",
            Mode::Upload => "/upload",
            Mode::ObserveNon | Mode::ObserveCon => "/obs",
            _ => "/",
        }
        .to_string()
    } else {
        path.to_string()
    };
    Ok((addr, path))
}

/// RSS samples of the server: before, peak, at the end of the flood, after settling.
#[derive(Debug, Default, Clone, Copy)]
struct Rss {
    before: Option<u64>,
    peak: Option<u64>,
    end: Option<u64>,
    after: Option<u64>,
}

fn main() {
    let args = Args::parse();
    let (target, path) = match parse_target(&args.target, args.mode) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("flood: {e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let report = rt.block_on(run(&args, target, path));
    eprintln!("{}", summary(&report));
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    }
    // Attack tasks may still hold sockets; don't wait for them.
    rt.shutdown_timeout(Duration::from_millis(200));
}

async fn run(args: &Args, target: SocketAddr, path: String) -> Value {
    let rss_pid = args.server_pid;
    let mut rss = Rss {
        before: rss_pid.and_then(procfs::rss_kb),
        ..Rss::default()
    };
    let metrics_before = match args.metrics {
        Some(m) => gauges::read(m).await,
        None => Value::Null,
    };
    let legit = legit::start(args).await;
    // Wait until every legitimate client has been served once, so the flood meets
    // established sessions, connections and relations.
    legit.wait_ready(Duration::from_secs(10)).await;
    legit.set_phase(legit::Phase::Flood);
    let counters: Counters = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.duration);
    let attack = {
        let (counters, stop) = (counters.clone(), stop.clone());
        let rate = args.rate();
        let mode = args.mode;
        let ctx = AttackCtx {
            target,
            path,
            rate,
            sources: args.source_ips(),
            ports_per_ip: args.sources.max(1),
            connections: args.connections.max(1),
            in_flight: args.in_flight.max(1),
            counters,
            stop,
        };
        let ca_pem = args.ca_pem();
        tokio::spawn(async move {
            match mode {
                Mode::DtlsHandshake => dtls_hello::flood(ctx).await,
                Mode::DtlsSession => dtls_session::flood(ctx, ca_pem.unwrap_or_default()).await,
                Mode::Tcp | Mode::TcpCsm | Mode::Tls | Mode::Ws | Mode::Wss => {
                    conn::flood(ctx, mode).await
                }
                _ => udp::flood(ctx, mode).await,
            }
        })
    };
    // Sample the server's RSS while the flood runs.
    while Instant::now() < deadline {
        if let Some(kb) = rss_pid.and_then(procfs::rss_kb) {
            rss.peak = Some(rss.peak.map_or(kb, |p| p.max(kb)));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = tokio::time::timeout(Duration::from_secs(2), attack).await;
    let flood_secs = started.elapsed().as_secs_f64();
    rss.end = rss_pid.and_then(procfs::rss_kb);
    let metrics_end = match args.metrics {
        Some(m) => gauges::read(m).await,
        None => Value::Null,
    };
    legit.set_phase(legit::Phase::After);
    let settle_until = Instant::now() + Duration::from_secs_f64(args.settle);
    while Instant::now() < settle_until {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    rss.after = rss_pid.and_then(procfs::rss_kb);
    let metrics_after = match args.metrics {
        Some(m) => gauges::read(m).await,
        None => Value::Null,
    };
    let legit_report = legit.finish().await;
    let attack_counts = counters.lock().unwrap_or_else(|e| e.into_inner()).clone();
    json!({
        "mode": format!("{:?}", args.mode),
        "target": args.target,
        "duration_s": flood_secs,
        "settle_s": args.settle,
        "rate": args.rate(),
        "source_ips": args.ips.max(1),
        "attacker": attack_counts,
        "legit": legit_report,
        "rss_kib": {
            "before": rss.before, "peak": rss.peak, "end": rss.end, "after": rss.after,
        },
        "gauges": { "before": metrics_before, "end": metrics_end, "after": metrics_after },
    })
}

/// What an attack needs.
pub struct AttackCtx {
    /// The server.
    pub target: SocketAddr,
    /// The resource (path and query) for CoAP floods.
    pub path: String,
    /// Datagrams, handshakes or connection attempts per second.
    pub rate: u32,
    /// The attacker's addresses.
    pub sources: Vec<IpAddr>,
    /// Source ports per address (UDP floods).
    pub ports_per_ip: usize,
    /// Connections held at once (connection floods).
    pub connections: usize,
    /// Handshakes in flight at once (DTLS).
    pub in_flight: usize,
    /// Where the attack counts what it did and got.
    pub counters: Counters,
    /// Set when the flood must end.
    pub stop: Arc<AtomicBool>,
}

impl AttackCtx {
    /// Whether the flood is over.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// The address `socket_index` binds: the sources in turn.
    pub fn source_for(&self, index: usize) -> IpAddr {
        self.sources[index % self.sources.len()]
    }
}

/// Paces a loop at `rate` events per second: how many events are due now.
pub struct Pacer {
    start: Instant,
    rate: f64,
    done: u64,
}

impl Pacer {
    /// A pacer starting now.
    pub fn new(rate: u32) -> Pacer {
        Pacer {
            start: Instant::now(),
            rate: f64::from(rate.max(1)),
            done: 0,
        }
    }

    /// Events due since the last call (at most `cap`).
    pub fn due(&mut self, cap: u64) -> u64 {
        let target = (self.start.elapsed().as_secs_f64() * self.rate) as u64;
        let n = target.saturating_sub(self.done).min(cap);
        self.done += n;
        // Don't build up a debt while the sender could not keep up.
        if target > self.done + cap {
            self.done = target - cap;
        }
        n
    }
}

/// A small xorshift generator: tokens, message IDs, randoms (no need for quality).
pub struct Rng(u64);

impl Rng {
    /// Seeded from the clock and `salt`.
    pub fn new(salt: u64) -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Rng((t ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

fn summary(r: &Value) -> String {
    let kib = |v: &Value| {
        v.as_u64()
            .map_or("-".to_string(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
    };
    let rss = &r["rss_kib"];
    let mut s = format!(
        "flood {} against {} for {:.1} s: attacker {}\nserver RSS: before {}, peak {}, end of flood {}, after {:.0} s {}\n",
        r["mode"].as_str().unwrap_or("?"),
        r["target"].as_str().unwrap_or("?"),
        r["duration_s"].as_f64().unwrap_or(0.0),
        r["attacker"],
        kib(&rss["before"]),
        kib(&rss["peak"]),
        kib(&rss["end"]),
        r["settle_s"].as_f64().unwrap_or(0.0),
        kib(&rss["after"]),
    );
    if let Some(loops) = r["legit"].as_array() {
        for l in loops {
            s.push_str(&format!(
                "legit {} {}: during flood {}, after {}\n",
                l["kind"].as_str().unwrap_or("?"),
                l["uri"].as_str().unwrap_or("?"),
                l["flood"],
                l["after"]
            ));
        }
    }
    s
}

//! Command-line arguments of `cobalt bench` and their validation: the target URI and
//! the concurrency sweep.

use clap::{Args, Subcommand, ValueEnum};
use std::net::{SocketAddr, ToSocketAddrs};

/// Largest concurrency accepted in one step.
pub const MAX_CLIENTS: usize = 1_000_000;
/// Most steps one sweep may have.
pub const MAX_STEPS: usize = 1000;

/// Arguments of `cobalt bench`.
#[derive(Debug, Args)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_help = "Floor to compare servers with: `cobalt bench-responder --bind 127.0.0.1:5690` \
                  answers every request with 2.05 \"hello world\" using recvmmsg/sendmmsg.\n\
                  Example: taskset -c 1 cobalt bench-responder --bind 127.0.0.1:5690 & \
                  taskset -c 0 cobalt bench coap://127.0.0.1:5690/ -c 1..1000:*10 --server-pid $!"
)]
pub struct BenchArgs {
    /// `cobalt bench worker`: serve as a remote load generator for `--workers`.
    #[command(subcommand)]
    pub command: Option<BenchCommand>,

    /// Target URI: coap://127.0.0.1:5683/benchmark (UDP), coaps://... (DTLS 1.2, with
    /// --psk-identity/--psk-key), coap+tcp://... (RFC 8323 over TCP), coap+ws://... (RFC
    /// 8323 over a WebSocket to /.well-known/coap), or http://host:port/path for HTTP/1.1
    #[arg(required = true)]
    pub uri: Option<String>,

    /// Virtual clients per step: a number, a list `10,100,1000`, a range
    /// `10..1000:step` (step defaults to the start), a geometric range `1..10000:*10`,
    /// or a mix of these.
    #[arg(short = 'c', long = "clients", default_value = "10")]
    pub clients: String,

    /// Measured duration of each step, in seconds.
    #[arg(short = 'd', long = "duration", default_value_t = 10.0)]
    pub duration: f64,

    /// Warm-up before each step's measurement, in seconds (not counted).
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,

    /// Pause between steps, in seconds, so that the server drains its queues.
    #[arg(long, default_value_t = 1.0)]
    pub cooldown: f64,

    /// Seconds after which an unanswered request counts as lost.
    #[arg(long, default_value_t = 10.0)]
    pub timeout: f64,

    /// Open loop: send this many requests per second in total, on a fixed schedule, and
    /// measure latency from each request's intended send time. Without it, each client
    /// sends its next request as soon as the previous one ends (closed loop).
    #[arg(long, value_name = "REQ_PER_S")]
    pub rate: Option<f64>,

    /// HTTP only: open a new connection for every request (`Connection: close`)
    /// instead of keeping one connection per client.
    #[arg(long)]
    pub no_keepalive: bool,

    /// coaps://, coap+tcp://, coap+ws://: open a new DTLS session or connection for every
    /// request (handshake, then one request) instead of one per client for the whole
    /// run, to measure handshakes per second; latency then includes the handshake.
    #[arg(long)]
    pub new_session: bool,

    /// Send non-confirmable (NON) requests instead of confirmable ones.
    #[arg(long)]
    pub non: bool,

    /// coap:// only: retransmit unanswered requests on the timers of this congestion
    /// control (default, cocoa, cocoa-strong, fasor, fasor-k, karn; MAX_RETRANSMIT 4,
    /// one controller per virtual client) instead of CoAPBench's single transmission;
    /// a request is then lost when its last timer or --timeout expires.
    #[arg(long = "cc", value_name = "ALGORITHM")]
    pub cc: Option<cobalt_proto::congestion::Algorithm>,

    /// Request method.
    #[arg(short = 'm', long, value_enum, default_value_t = Method::Get)]
    pub method: Method,

    /// Request payload (for POST and PUT).
    #[arg(short = 'p', long)]
    pub payload: Option<String>,

    /// Credentials for coaps:// (same flags as `cobalt get`).
    #[command(flatten)]
    pub dtls: crate::dtls_args::DtlsArgs,

    /// Load-generator threads, each running one epoll loop (coap://, http://) or one
    /// single-threaded async runtime (coaps://, coap+tcp://, coap+ws://) over its share of
    /// clients.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,

    /// Distributed mode: run the clients on these `cobalt bench worker` machines
    /// (host:port,host:port) instead of locally.
    #[arg(long, value_name = "HOST:PORT,...")]
    pub workers: Option<String>,

    /// With --workers: instead of CoAPBench, run this third-party load tool (e.g.
    /// "wrk -t1 -c100 -d10s http://10.0.0.1/benchmark") on every worker at once and print
    /// each worker's output. Workers must be started with --allow-exec.
    #[arg(long, value_name = "COMMAND", requires = "workers")]
    pub exec: Option<String>,

    /// PID of the server process, to report its CPU time per request and its RSS.
    #[arg(long)]
    pub server_pid: Option<u32>,

    /// Print results as JSON.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,

    /// Print results as CSV.
    #[arg(long)]
    pub csv: bool,

    /// Write an SVG plot against concurrency: 2.xx throughput and other answers per
    /// second, p50/p99 latency and (with --server-pid) the server's CPU µs per request
    /// on a log scale. The file is created before the run, so a bad path fails first.
    /// `cobalt bench plot a.json b.json` overlays the --json reports of several runs.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,

    /// No progress on stderr.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// Subcommands of `cobalt bench`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Run as a remote load generator that a coordinator drives with `--workers`.
    Worker(WorkerArgs),
    /// Overlay the `--json` reports of several runs in one SVG figure (throughput,
    /// latency and server CPU per request against concurrency), e.g. to compare
    /// servers: `cobalt bench plot cobalt.json libcoap.json -o compare.svg`.
    Plot(PlotArgs),
}

/// `cobalt bench plot` options.
#[derive(Debug, Args)]
pub struct PlotArgs {
    /// `cobalt bench --json` reports; each is named in the legend by its file name
    /// (without `.json`).
    #[arg(required = true, value_name = "REPORT.json")]
    pub reports: Vec<std::path::PathBuf>,
    /// Where to write the SVG.
    #[arg(short, long, value_name = "FILE.svg")]
    pub output: std::path::PathBuf,
}

/// CoAP request methods the benchmark can send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Method {
    /// GET.
    Get,
    /// POST.
    Post,
    /// PUT.
    Put,
    /// DELETE.
    Delete,
}

impl Method {
    /// The request code.
    pub fn code(self) -> cobalt_proto::message::Code {
        use cobalt_proto::message::Code;
        match self {
            Method::Get => Code::GET,
            Method::Post => Code::POST,
            Method::Put => Code::PUT,
            Method::Delete => Code::DELETE,
        }
    }

    /// Upper-case name.
    pub fn name(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
        }
    }
}

/// The protocol a URI selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `coap://`: CoAP over UDP.
    Coap,
    /// `coaps://`: CoAP over DTLS 1.2 (RFC 7252 §9).
    Coaps,
    /// `coap+tcp://`: CoAP over TCP (RFC 8323 §3).
    CoapTcp,
    /// `coap+ws://`: CoAP over WebSockets (RFC 8323 §4).
    CoapWs,
    /// `coaps+tcp://`: CoAP over TLS (RFC 8323 §8.2).
    CoapsTcp,
    /// `coaps+ws://`: CoAP over secure WebSockets (RFC 8323 §4 and §8.2).
    CoapsWs,
    /// `http://`: HTTP/1.1 over TCP.
    Http,
}

impl Scheme {
    /// Every scheme with its URI name.
    const ALL: [(Scheme, &'static str); 7] = [
        (Scheme::Coap, "coap"),
        (Scheme::Coaps, "coaps"),
        (Scheme::CoapTcp, "coap+tcp"),
        (Scheme::CoapWs, "coap+ws"),
        (Scheme::CoapsTcp, "coaps+tcp"),
        (Scheme::CoapsWs, "coaps+ws"),
        (Scheme::Http, "http"),
    ];

    /// The URI scheme, e.g. `coap+tcp`.
    pub fn name(self) -> &'static str {
        Scheme::ALL
            .iter()
            .find(|(s, _)| *s == self)
            .map_or("coap", |(_, n)| n)
    }

    /// The scheme named `name` (case-insensitive).
    fn from_name(name: &str) -> Option<Scheme> {
        Scheme::ALL
            .iter()
            .find(|(_, n)| n.eq_ignore_ascii_case(name))
            .map(|(s, _)| *s)
    }

    /// The port when the URI has none (RFC 7252 §6, RFC 8323 §8).
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Coap | Scheme::CoapTcp => 5683,
            Scheme::Coaps | Scheme::CoapsTcp => 5684,
            Scheme::CoapWs | Scheme::Http => 80,
            Scheme::CoapsWs => 443,
        }
    }

    /// CoAP over a reliable transport (RFC 8323): no message types, no message IDs.
    pub fn is_reliable(self) -> bool {
        matches!(
            self,
            Scheme::CoapTcp | Scheme::CoapWs | Scheme::CoapsTcp | Scheme::CoapsWs
        )
    }

    /// Each client has a connection or session set up before the measurement.
    pub fn has_sessions(self) -> bool {
        self == Scheme::Coaps || self.is_reliable()
    }
}

/// A parsed `coap://`, `coaps://`, `coap+tcp://`, `coap+ws://` or `http://` URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Which protocol.
    pub scheme: Scheme,
    /// Host as written (without brackets for IPv6 literals).
    pub host: String,
    /// Port ([`Scheme::default_port`] when absent).
    pub port: u16,
    /// Path and query exactly as written (at least "/"), for the HTTP request line.
    pub raw_path: String,
    /// Decoded Uri-Path segments.
    pub path: Vec<String>,
    /// Decoded Uri-Query items.
    pub query: Vec<String>,
}

impl Target {
    /// Resolves the host to the first socket address.
    pub fn resolve(&self) -> Result<SocketAddr, String> {
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve host {:?}: {e}", self.host))?
            .next()
            .ok_or_else(|| format!("host {:?} has no address", self.host))
    }
}

/// Parses a `SCHEME://host[:port]/path?query` URI (see [`Scheme`]).
pub fn parse_uri(uri: &str) -> Result<Target, String> {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return Err(format!(
            "invalid URI {uri:?}: expected coap://host[:port]/path"
        ));
    };
    let scheme = Scheme::from_name(scheme).ok_or_else(|| {
        format!(
            "unsupported scheme {scheme}:// in {uri:?}: use coap://, coaps://, coap+tcp://, \
             coap+ws:// or http://"
        )
    })?;
    let rest = rest.split('#').next().unwrap_or("");
    let (authority, path_query) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err(format!("invalid URI {uri:?}: user info is not allowed"));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("invalid URI {uri:?}: unterminated IPv6 literal"))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("invalid URI {uri:?}: junk after IPv6 literal"))?,
            ),
        };
        (h, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(format!("invalid URI {uri:?}: missing host"));
    }
    // An IPv6 zone (RFC 6874: `fe80::1%25eth0`) as the resolver takes it: `fe80::1%eth0`.
    let host = host.replacen("%25", "%", 1);
    let port = match port {
        None | Some("") => scheme.default_port(),
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| format!("invalid URI {uri:?}: bad port {p:?}"))?,
    };
    if path_query.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(format!(
            "invalid URI {uri:?}: spaces or control characters in the path"
        ));
    }
    let raw_path = if path_query.starts_with('/') {
        path_query.to_string()
    } else {
        format!("/{path_query}")
    };
    let (path, query) = match path_query.split_once('?') {
        Some((p, q)) => (p, q),
        None => (path_query, ""),
    };
    let path = path
        .split('/')
        .skip(1)
        .filter(|s| !s.is_empty())
        .map(|s| percent_decode(s).ok_or_else(|| format!("invalid URI {uri:?}: bad %-escape")))
        .collect::<Result<Vec<_>, _>>()?;
    let query = query
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|s| percent_decode(s).ok_or_else(|| format!("invalid URI {uri:?}: bad %-escape")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Target {
        scheme,
        raw_path,
        host,
        port,
        path,
        query,
    })
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Parses the concurrency sweep: comma-separated numbers and `a..b[:step]` ranges,
/// where the step is added (`:10`, default: `a`) or multiplies (`:*10`).
pub fn parse_sweep(s: &str) -> Result<Vec<usize>, String> {
    let mut steps = Vec::new();
    for item in s.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(format!("invalid client list {s:?}: empty item"));
        }
        if let Some((a, rest)) = item.split_once("..") {
            let (b, step) = match rest.split_once(':') {
                Some((b, st)) => (b, Some(st)),
                None => (rest, None),
            };
            let a = parse_count(a, s)?;
            let b = parse_count(b, s)?;
            if b < a {
                return Err(format!("invalid client range {item:?}: end below start"));
            }
            // `:N` adds N each step, `:*N` (or `:xN`) multiplies by N.
            let (factor, add) = match step.map(str::trim) {
                Some(st) if st.starts_with(['*', 'x']) => {
                    let f = parse_count(&st[1..], s)?;
                    if f < 2 {
                        return Err(format!("invalid client range {item:?}: factor below 2"));
                    }
                    (f, 0)
                }
                Some(st) => (1, parse_count(st, s)?),
                None => (1, a),
            };
            let mut n = a;
            while n <= b {
                steps.push(n);
                if steps.len() > MAX_STEPS {
                    return Err(format!(
                        "invalid client list {s:?}: more than {MAX_STEPS} steps"
                    ));
                }
                n = n.saturating_mul(factor).saturating_add(add);
            }
        } else {
            steps.push(parse_count(item, s)?);
        }
    }
    Ok(steps)
}

fn parse_count(n: &str, whole: &str) -> Result<usize, String> {
    match n.trim().parse::<usize>() {
        Ok(v) if (1..=MAX_CLIENTS).contains(&v) => Ok(v),
        _ => Err(format!(
            "invalid client count {n:?} in {whole:?}: expected a number from 1 to {MAX_CLIENTS}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_basic() {
        let t = parse_uri("coap://127.0.0.1:5690/bench/x?a=1&b").unwrap();
        assert_eq!(t.host, "127.0.0.1");
        assert_eq!(t.port, 5690);
        assert_eq!(t.path, vec!["bench", "x"]);
        assert_eq!(t.query, vec!["a=1", "b"]);
    }

    #[test]
    fn uri_defaults_and_ipv6() {
        let t = parse_uri("coap://localhost").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("localhost", 5683));
        assert!(t.path.is_empty());
        let t = parse_uri("COAP://[::1]:7000/a%20b").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 7000));
        assert_eq!(t.path, vec!["a b"]);
        let t = parse_uri("coap://[::1]/").unwrap();
        assert_eq!(t.port, 5683);
        assert_eq!(t.scheme, Scheme::Coap);
        let t = parse_uri("http://example.org?x=1").unwrap();
        assert_eq!((t.scheme, t.port), (Scheme::Http, 80));
        assert_eq!(t.raw_path, "/?x=1");
        let t = parse_uri("HTTP://h:8080/a/b?c").unwrap();
        assert_eq!((t.port, t.raw_path.as_str()), (8080, "/a/b?c"));
    }

    #[test]
    fn uri_with_an_ipv6_zone() {
        let t = parse_uri("coap://[fe80::1%25lo]:5683/x").unwrap();
        assert_eq!(t.host, "fe80::1%lo");
        let a = t.resolve().unwrap();
        assert!(matches!(a, SocketAddr::V6(v6) if v6.scope_id() == 1), "{a}");
    }

    #[test]
    fn uri_errors() {
        assert!(parse_uri("127.0.0.1:5683").is_err());
        assert!(parse_uri("https://x/")
            .unwrap_err()
            .contains("use coap://, coaps://, coap+tcp://, coap+ws:// or http://"));
        assert!(parse_uri("coap://h/a b").is_err());
        assert!(parse_uri("coap+udp://x/").is_err());
        assert!(parse_uri("coap:///path").is_err());
        assert!(parse_uri("coap://h:99999/").is_err());
        assert!(parse_uri("coap://h:0/").is_err());
        assert!(parse_uri("coap://h:x/").is_err());
        assert!(parse_uri("coap://[::1/").is_err());
        assert!(parse_uri("coap://h/%zz").is_err());
        assert!(parse_uri("coap://u@h/").is_err());
    }

    #[test]
    fn uri_schemes_and_default_ports() {
        for (uri, scheme, port) in [
            ("coaps://h/x", Scheme::Coaps, 5684),
            ("COAP+TCP://h/x", Scheme::CoapTcp, 5683),
            ("coap+ws://h/x", Scheme::CoapWs, 80),
            ("coaps+tcp://h/x", Scheme::CoapsTcp, 5684),
            ("coaps+ws://h/x", Scheme::CoapsWs, 443),
            ("coap+ws://h:8080/x", Scheme::CoapWs, 8080),
        ] {
            let t = parse_uri(uri).unwrap();
            assert_eq!((t.scheme, t.port), (scheme, port), "{uri}");
            assert_eq!(t.path, vec!["x"], "{uri}");
            assert!(uri.to_ascii_lowercase().starts_with(scheme.name()));
        }
        assert!(Scheme::CoapWs.is_reliable() && !Scheme::Coaps.is_reliable());
        assert!(Scheme::Coaps.has_sessions() && !Scheme::Coap.has_sessions());
        assert!(!Scheme::Http.has_sessions());
    }

    #[test]
    fn sweep_lists_and_ranges() {
        assert_eq!(parse_sweep("10").unwrap(), vec![10]);
        assert_eq!(
            parse_sweep("1,10,100,1000").unwrap(),
            vec![1, 10, 100, 1000]
        );
        assert_eq!(parse_sweep("10..50:20").unwrap(), vec![10, 30, 50]);
        assert_eq!(parse_sweep("10..35:10").unwrap(), vec![10, 20, 30]);
        assert_eq!(parse_sweep("10..30").unwrap(), vec![10, 20, 30]);
        assert_eq!(parse_sweep("1, 5..6:1 ,100").unwrap(), vec![1, 5, 6, 100]);
        assert_eq!(
            parse_sweep("1..10000:*10").unwrap(),
            vec![1, 10, 100, 1000, 10000]
        );
        assert_eq!(parse_sweep("5..50:x3").unwrap(), vec![5, 15, 45]);
    }

    #[test]
    fn sweep_errors() {
        for bad in [
            "", "0", "-1", "a", "10..5:1", "10..20:0", "1,,2", "5..", "2000000",
        ] {
            assert!(parse_sweep(bad).is_err(), "{bad:?} accepted");
        }
    }
}

/// Arguments of `cobalt bench worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Address to accept coordinator connections on, e.g. 0.0.0.0:7000.
    #[arg(long)]
    pub listen: String,
    /// Let coordinators run third-party load tools here (`cobalt bench --exec`). Anyone
    /// who can reach the listening address can then run commands as this user.
    #[arg(long)]
    pub allow_exec: bool,
}

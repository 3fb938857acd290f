//! Command-line arguments of `cobalt bench` and its subcommands.

use clap::{Args, Subcommand, ValueEnum};

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
    /// 8323 over a WebSocket to /.well-known/coap), or http://host:port/path for HTTP/1.1.
    /// In a coap:// URI, `{client}` is replaced by each client's number (8 digits), e.g.
    /// `coap://h/rd?ep=bench-{client}` for one resource-directory endpoint per client.
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

    /// Content-Format of the payload, a number or a name (e.g. link-format); CoAP only.
    #[arg(short = 't', long, value_parser = crate::flags::content_format)]
    pub content_format: Option<u16>,

    /// Credentials for coaps:// (same flags as `cobalt get`).
    #[command(flatten)]
    pub dtls: crate::dtls_args::DtlsArgs,

    /// Load-generator threads, each running one epoll loop (coap://, http://) or one
    /// single-threaded async runtime (coaps://, coap+tcp://, coap+ws://) over its share of
    /// clients.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,

    /// coap:// only: how each load-generator thread moves its clients' datagrams:
    /// `uring` hands all pending sends and a standing receive per client to the kernel
    /// in one io_uring call per loop; `epoll` makes a send and a recv per request;
    /// `auto` takes io_uring where the kernel allows it (and a thread has at most
    /// 16384 clients), else epoll.
    #[arg(long, value_enum, default_value_t = IoArg::Auto)]
    pub io: IoArg,

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

/// `--io`: the I/O of the coap:// generator threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IoArg {
    /// io_uring where available, else epoll.
    Auto,
    /// io_uring (fails where the kernel does not allow it).
    Uring,
    /// epoll.
    Epoll,
}

impl IoArg {
    /// The engine's setting.
    pub fn io(self) -> cobalt_bench::Io {
        match self {
            IoArg::Auto => cobalt_bench::Io::Auto,
            IoArg::Uring => cobalt_bench::Io::Uring,
            IoArg::Epoll => cobalt_bench::Io::Epoll,
        }
    }
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

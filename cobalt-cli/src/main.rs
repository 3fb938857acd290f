//! The `cobalt` command: argument parsing only; each command lives in its own module.

mod alloc;
mod bench;
mod devices;
mod dtls_args;
mod exit;
mod flags;
mod lwm2m;
mod manual;
mod proxy;
mod rd;
mod render;
mod request;
mod serve;
mod sink;

use clap::{CommandFactory, Parser, Subcommand};
use cobalt::Code;

/// `cobalt --version`: the crate version and the git revision it was built from.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("COBALT_GIT_REV"), ")");

/// Cobalt: a CoAP client like curl, a demo server, and CoAPBench.
///
/// Exit codes (every command): 0 success (2.xx), 1 local failure (port in use, file
/// descriptors, output file), 2 bad arguments, URI or configuration, 3 timeout, reset, port not
/// open, unreachable host, failed handshake or lost observation, 4 the server answered
/// 4.xx, 5 the server answered 5.xx, 6 unintelligible answer, 130 bench interrupted.
/// `bench` fails (3, 4 or 5) when no request completed with 2.xx.
#[derive(Debug, Parser)]
#[command(name = "cobalt", version = VERSION, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log level on stderr: off, error, warn, info, debug, trace (default: warn; for
    /// `serve` the config's log.level, info). RUST_LOG, when set, wins.
    #[arg(long, global = true, value_name = "LEVEL")]
    log_level: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// GET a resource and print its payload.
    Get(request::RequestArgs),
    /// POST a payload (-p) and print the response payload.
    Post(request::RequestArgs),
    /// PUT a payload (-p) and print the response payload.
    Put(request::RequestArgs),
    /// DELETE a resource.
    Delete(request::RequestArgs),
    /// FETCH (RFC 8132): GET with a request body (-p), e.g. a query in JSON or CBOR.
    Fetch(request::RequestArgs),
    /// PATCH (RFC 8132): change part of a resource with the payload (-p).
    Patch(request::RequestArgs),
    /// iPATCH (RFC 8132): an idempotent PATCH.
    #[command(name = "ipatch")]
    Ipatch(request::RequestArgs),
    /// List a server's resources (GET /.well-known/core, query filters allowed).
    Discover(request::DiscoverArgs),
    /// Observe a resource and print each notification (RFC 7641).
    Observe(request::ObserveArgs),
    /// Run the demo server (/benchmark, /time, /echo, /separate; --plugtest for more).
    Serve(serve::ServeArgs),
    /// A resource directory (RFC 9176): `cobalt rd` serves one (registrations stored
    /// under --data-dir); `cobalt rd register|update|remove|lookup` talk to one.
    Rd(rd::RdArgs),
    /// An LwM2M 1.1 server (registrations stored under --data-dir) with an HTTP/JSON
    /// view of its clients on --http: read, write, execute, observe.
    Lwm2m(lwm2m::Lwm2mArgs),
    /// Simulated devices: each its own socket, observable sensors, registering at a
    /// resource directory (--rd) or an LwM2M server (--lwm2m) until Ctrl-C.
    Devices(devices::DevicesArgs),
    /// A CoAP forward/reverse proxy with a cache, and an HTTP→CoAP proxy (RFC 8075).
    Proxy(proxy::ProxyArgs),
    /// CoAPBench: drive a CoAP (or HTTP) server with many virtual clients.
    Bench(bench::BenchArgs),
    /// Print a shell completion script: `cobalt completions bash > /etc/bash_completion.d/cobalt`
    /// (zsh: into a directory of $fpath as `_cobalt`; fish: ~/.config/fish/completions/cobalt.fish).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff): `cobalt man | man -l -`; with --dir, write
    /// cobalt.1 and one page per subcommand (cobalt-get.1, ...) there.
    Man {
        /// Write the pages into this directory instead of printing cobalt.1.
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
    /// Raw floor responder for `cobalt bench`: answers every request with 2.05 "hello world".
    #[command(name = "bench-responder", hide = true)]
    BenchResponder(bench::responder::ResponderArgs),
    /// Minimal HTTP/1.1 keep-alive responder: answers every request with 200 "hello world".
    #[command(name = "bench-http-responder", hide = true)]
    BenchHttpResponder(bench::http_responder::HttpResponderArgs),
}

/// Logs to stderr: `RUST_LOG` when set (full `EnvFilter` syntax), else `level`.
pub(crate) fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn main() {
    let cli = Cli::parse();
    if let Some(level) = &cli.log_level {
        if !cobalt::config::LOG_LEVELS.contains(&level.as_str()) {
            eprintln!(
                "cobalt: invalid --log-level `{level}`: allowed {}",
                cobalt::config::LOG_LEVELS.join(", ")
            );
            std::process::exit(exit::USAGE);
        }
    }
    if !matches!(cli.command, Command::Serve(_)) {
        // `serve` starts logging once its configuration is known.
        init_logging(cli.log_level.as_deref().unwrap_or("warn"));
    }
    match cli.command {
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "cobalt", &mut out);
            std::process::exit(match sink::write_stdout(&out) {
                Ok(_) => exit::OK,
                Err((code, message)) => {
                    eprintln!("cobalt: {message}");
                    code
                }
            })
        }
        Command::Man { dir } => std::process::exit(manual::run(Cli::command(), dir.as_deref())),
        Command::Bench(args) => std::process::exit(bench::run(args)),
        Command::BenchResponder(args) => std::process::exit(bench::responder::main(args)),
        Command::BenchHttpResponder(args) => std::process::exit(bench::http_responder::main(args)),
        _ => {}
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cobalt: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let result = rt.block_on(async move {
        match cli.command {
            Command::Get(a) => request::run(Code::GET, a).await,
            Command::Post(a) => request::run(Code::POST, a).await,
            Command::Put(a) => request::run(Code::PUT, a).await,
            Command::Delete(a) => request::run(Code::DELETE, a).await,
            Command::Fetch(a) => request::run(Code::FETCH, a).await,
            Command::Patch(a) => request::run(Code::PATCH, a).await,
            Command::Ipatch(a) => request::run(Code::IPATCH, a).await,
            Command::Discover(a) => request::discover(a).await,
            Command::Observe(a) => request::observe(a).await,
            Command::Serve(a) => serve::run(a, cli.log_level.as_deref()).await,
            Command::Rd(a) => rd::run(a).await,
            Command::Lwm2m(a) => lwm2m::run(a).await,
            Command::Devices(a) => devices::run(a).await,
            Command::Proxy(a) => proxy::run(a, cli.log_level.as_deref()).await,
            Command::Bench(_)
            | Command::BenchResponder(_)
            | Command::BenchHttpResponder(_)
            | Command::Completions { .. }
            | Command::Man { .. } => unreachable!("handled above"),
        }
    });
    if let Err((code, message)) = result {
        eprintln!("cobalt: {message}");
        std::process::exit(code);
    }
}

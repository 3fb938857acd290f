//! `cobalt proxy`: a CoAP forward and reverse proxy with a cache, and the HTTP→CoAP
//! cross proxy (RFC 8075), from flags alone (`cobalt-proxy` does the work).
//!
//! The CoAP front's server settings come from the same configuration as `cobalt
//! serve` (`--config FILE`, `COBALT_<SECTION>_<KEY>`, `--set KEY=VALUE`); what is the
//! proxy's is a flag.

use crate::exit;
use clap::Args;
use cobalt::config::Config;
use cobalt::{Scheme, Server};
use cobalt_proxy::{
    serve_metrics, AllowList, CacheLimits, CoapFront, HttpConfig, HttpFront, HttpsTrust, Proxy,
    ProxyConfig, ReverseRoute,
};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// `cobalt proxy [OPTIONS]`.
#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// Serve the CoAP front (forward proxy: Proxy-Uri / Proxy-Scheme; reverse routes)
    /// on this UDP address.
    #[arg(long, value_name = "HOST:PORT", value_parser = crate::flags::host_port, default_value = "[::]:5683")]
    coap: SocketAddr,
    /// Also serve the HTTP→CoAP front (HTTP/1.1 and HTTP/2) on this TCP address:
    /// `GET http://ADDR/hc/coap://host/path`.
    #[arg(long, value_name = "HOST:PORT", value_parser = crate::flags::host_port)]
    http: Option<SocketAddr>,
    /// Origins the proxy may reach (repeatable): `host[:port]`, `*.domain[:port]`,
    /// `ADDR/PREFIX[:port]`, `[v6]:port`, or `*` for an open proxy. Without any, only
    /// reverse routes are served.
    #[arg(long, value_name = "PATTERN")]
    allow: Vec<String>,
    /// A reverse route (repeatable): requests under PREFIX go to the origin URI, e.g.
    /// `/sensors=coap://10.0.0.7/s`.
    #[arg(long, value_name = "PREFIX=URI")]
    reverse: Vec<String>,
    /// Seconds an origin has to answer before the proxy answers 5.04 / 504.
    #[arg(long, value_name = "SECONDS", default_value_t = 20.0)]
    timeout: f64,
    /// Bytes the cache holds (least recently used answers are evicted); 0 turns it off.
    #[arg(long, value_name = "BYTES", default_value_t = CacheLimits::default().max_bytes)]
    cache_bytes: usize,
    /// The proxy's name in 5.08 Hop Limit Reached answers; default cobalt-proxy@ADDR.
    #[arg(long, value_name = "NAME")]
    identity: Option<String>,
    /// The HTTP front's path prefix (the target URI follows it).
    #[arg(long, value_name = "PATH", default_value = "/hc/")]
    http_prefix: String,
    /// Serve Prometheus metrics (the server's and the proxy's) at http://ADDR/metrics.
    #[arg(long, value_name = "HOST:PORT", value_parser = crate::flags::host_port)]
    metrics: Option<SocketAddr>,
    /// Protocol shards of the CoAP front [config: runtime.shards].
    #[arg(long)]
    shards: Option<usize>,
    /// Read server settings from this TOML file (see `cobalt serve --print-config`).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Override one server setting, e.g. `--set endpoint.ack_timeout=3s` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Also trust the CA certificates in this PEM file for https origins (CoAP →
    /// HTTPS; repeatable). Without, an https origin's certificate must chain to the
    /// Mozilla roots (webpki-roots); it is always verified.
    #[arg(long, value_name = "FILE")]
    http_ca: Vec<PathBuf>,
    /// How the proxy authenticates to coaps, coaps+tcp and coaps+ws origins.
    #[command(flatten, next_help_heading = "Credentials for secure origins")]
    upstream: crate::dtls_args::DtlsArgs,
}

fn usage(e: impl std::fmt::Display) -> (i32, String) {
    (exit::USAGE, e.to_string())
}

/// The server configuration: defaults < file < environment < `--set` < flags.
fn load_config(args: &ProxyArgs, log_level: Option<&str>) -> Result<Config, (i32, String)> {
    let mut loader = Config::loader();
    let file = args
        .config
        .clone()
        .or_else(|| std::env::var_os("COBALT_CONFIG").map(PathBuf::from));
    if let Some(path) = &file {
        loader = loader.file(path).map_err(usage)?;
    }
    loader = loader.env_from_process().map_err(usage)?;
    for s in &args.set {
        loader = loader.set_arg(s, "--set").map_err(usage)?;
    }
    if let Some(n) = args.shards {
        loader = loader
            .set("runtime.shards", &n.to_string(), "--shards")
            .map_err(usage)?;
    }
    if let Some(level) = log_level {
        loader = loader
            .set("log.level", level, "--log-level")
            .map_err(usage)?;
    }
    loader.build().map_err(usage)
}

/// Runs the proxy until Ctrl-C (or SIGTERM).
pub async fn run(args: ProxyArgs, log_level: Option<&str>) -> Result<(), (i32, String)> {
    let config = load_config(&args, log_level)?;
    crate::init_logging(&config.log.level);
    let allow = AllowList::parse(args.allow.iter().map(String::as_str)).map_err(usage)?;
    let reverse = args
        .reverse
        .iter()
        .map(|r| r.parse::<ReverseRoute>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(usage)?;
    if allow.is_empty() && reverse.is_empty() {
        eprintln!(
            "cobalt: no --allow and no --reverse: every origin is refused (add --allow PATTERN)"
        );
    }
    let upstream_timeout = crate::flags::seconds("timeout", args.timeout, false).map_err(usage)?;
    let upstream_credentials = args.upstream.client_auth().map_err(usage)?;
    let mut https_trust = HttpsTrust::default();
    for file in &args.http_ca {
        https_trust = https_trust.with_pem_file(file).map_err(usage)?;
    }
    let proxy = Proxy::new(ProxyConfig {
        allow,
        identity: args
            .identity
            .clone()
            .unwrap_or_else(|| format!("cobalt-proxy@{}", args.coap)),
        upstream_timeout,
        cache: CacheLimits {
            max_bytes: args.cache_bytes,
            ..CacheLimits::default()
        },
        reverse,
        upstream_credentials,
        https_trust,
        ..ProxyConfig::default()
    });
    let mut server = Server::new();
    if tracing::enabled!(target: "cobalt::access", tracing::Level::DEBUG) {
        server = server.layer(cobalt::server::layers::AccessLog::new());
    }
    let handle = CoapFront::new(proxy.clone())
        .install(server)
        .with_config(&config.server_settings())
        .listen(Scheme::Coap, args.coap)
        .start()
        .await
        .map_err(|e| (exit::FAILURE, e.to_string()))?;
    for (scheme, addr) in handle.listeners() {
        eprintln!("cobalt: CoAP proxy on {scheme}://{addr} (Proxy-Uri, Proxy-Scheme)");
    }
    for route in &proxy.config().reverse {
        eprintln!(
            "cobalt: reverse route {} -> {}",
            route.prefix,
            cobalt_proxy::uri_string(&route.origin)
        );
    }
    let _http = match args.http {
        Some(addr) => {
            let http = HttpFront::new(
                proxy.clone(),
                HttpConfig {
                    prefix: format!("/{}/", args.http_prefix.trim_matches('/')),
                    ..HttpConfig::default()
                },
            )
            .bind(addr)
            .await
            .map_err(|e| {
                (
                    exit::FAILURE,
                    format!("cannot listen for HTTP on {addr}: {e}"),
                )
            })?;
            eprintln!(
                "cobalt: HTTP proxy on {} (GET http://{}/{}/coap://HOST/PATH)",
                http.local_addr(),
                http.local_addr(),
                args.http_prefix.trim_matches('/')
            );
            Some(http)
        }
        None => None,
    };
    let _metrics = match args.metrics {
        Some(addr) => {
            let server_metrics = handle.metrics();
            let counters = proxy.clone();
            let render = Arc::new(move || {
                let mut text = server_metrics.render_prometheus();
                text.push_str(&counters.metrics().render_prometheus());
                text
            });
            let endpoint = serve_metrics(addr, render).await.map_err(|e| {
                (
                    exit::FAILURE,
                    format!("cannot serve metrics on {addr}: {e}"),
                )
            })?;
            eprintln!(
                "cobalt: metrics on {} (GET /metrics)",
                endpoint.local_addr()
            );
            Some(endpoint)
        }
        None => None,
    };
    crate::serve::wait_for_signal().await;
    eprintln!("cobalt: shutting down");
    handle.shutdown(Duration::from_secs(2)).await;
    Ok(())
}

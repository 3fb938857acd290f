//! `cobalt serve`: the demo server (and the ETSI plugtest resource set with `--plugtest`).
//!
//! Settings come from [`cobalt::config::Config`]: built-in defaults, then `--config FILE`,
//! then `COBALT_<SECTION>_<KEY>` environment variables, then the command line (`--set`,
//! then the dedicated flags such as `--port`).

mod clock;
mod demo;
mod plugtest;

use crate::exit;
use clap::Args;
use cobalt::config::{Config, ConfigError};
use cobalt::metrics::serve_metrics;
use cobalt::Scheme;
use cobalt::Server;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `cobalt serve` options.
///
/// Ports: CoAP over UDP on --port (5683); --tcp without a number uses the same port
/// number over TCP; DTLS (with credentials) uses the next port, 5684 (--dtls-port);
/// --tls without a number uses the DTLS port number over TCP; WebSockets use 8080
/// (--ws-port) and secure WebSockets 8443 (--wss-port). Port 0 picks a free port (the
/// server prints the one it got).
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on: an IPv4 or IPv6 address (`::` serves both families), an
    /// IPv6 address with a zone (`fe80::1%eth0`), or a host name [config: server.bind,
    /// default ::].
    #[arg(long, value_parser = crate::flags::bind_addr)]
    pub bind: Option<crate::flags::BindAddr>,
    /// UDP port; 0 picks a free one [config: server.port, default 5683].
    #[arg(short, long)]
    pub port: Option<u16>,
    /// Also answer requests to the All-CoAP-Nodes groups (224.0.1.187, ff02::fd,
    /// ff05::fd) on the UDP port: on the interfaces named (comma-separated, e.g.
    /// `--multicast eth0,eth1`), or without a name on the one the kernel picks (IPv4
    /// and ff05::fd only). Group answers go out after a random Leisure (--leisure);
    /// errors and empty answers are not sent (RFC 7252 §8, groupcomm-bis).
    #[arg(long, value_name = "IFACES", num_args = 0..=1)]
    pub multicast: Option<Option<String>>,
    /// The most seconds a group answer waits (RFC 7252 §8.2 Leisure; `0.5` or `0.5s`);
    /// default 1, the RFC's S·G/R for 100-byte answers from 80 servers over 64 kbit/s.
    #[arg(long, value_name = "SECONDS", value_parser = crate::flags::leisure, requires = "multicast")]
    pub leisure: Option<std::time::Duration>,
    /// Also serve the ETSI CoAP plugtest resources (/test, /seg1/seg2/seg3, /query, ...).
    #[arg(long)]
    pub plugtest: bool,
    /// Protocol shards (threads with their own socket) [config: runtime.shards, default one per core].
    #[arg(long)]
    pub shards: Option<usize>,
    /// Read settings from this TOML file (`--print-config` shows every key); default:
    /// the file named by the COBALT_CONFIG environment variable, if any.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration as commented TOML and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Override one setting, e.g. `--set endpoint.ack_timeout=3s` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Also serve CoAP over TCP (RFC 8323, `coap+tcp://`) on this TCP port; without a
    /// number on the UDP port's number (5683 by default, the standard port).
    #[arg(long, value_name = "PORT", num_args = 0..=1)]
    pub tcp: Option<Option<u16>>,
    /// Also serve CoAP over DTLS (`coaps://`, PSK) with the keys in FILE, one
    /// `identity:key` per line (key: `0x` and hex digits, or text; `#` comments); with
    /// --tls these keys are accepted over TLS too.
    #[arg(long, value_name = "FILE", visible_alias = "psk-file")]
    pub dtls_psk_file: Option<PathBuf>,
    /// Credentials file (aiocoap's JSON format): its `:label` entries are what the
    /// server accepts — OSCORE contexts (`{":client1": {"oscore": {"basedir":
    /// "dir/"}}}`, requests protected under them are served), EDHOC clients
    /// (`"edhoc-oscore"` with peer_cred; the server's own credential is the first URI
    /// entry's, EDHOC is taken at /.well-known/edhoc), DTLS PSKs (`"dtls"`, added to
    /// --dtls-psk-file's) and a certificate (`"x509"`, where --cert is not given).
    #[arg(long, value_name = "FILE")]
    pub credentials: Option<PathBuf>,
    /// Also serve CoAP over DTLS (and, with --tls, TLS) with this certificate (PEM,
    /// with any intermediates; an EC P-256 key for the DTLS ECDHE-ECDSA suites); needs --key.
    #[arg(
        long = "cert",
        visible_alias = "dtls-cert",
        value_name = "FILE",
        requires = "key"
    )]
    pub cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(
        long = "key",
        visible_alias = "dtls-key",
        value_name = "FILE",
        requires = "cert"
    )]
    pub key: Option<PathBuf>,
    /// Require client certificates that chain to these CA certificates (PEM).
    #[arg(
        long = "ca",
        visible_alias = "dtls-ca",
        value_name = "FILE",
        requires = "cert"
    )]
    pub ca: Option<PathBuf>,
    /// DTLS implementation of coaps://: openssl (PSK and certificates), mbedtls (the
    /// Connection ID; PSK and/or --cert/--key, with --ca for client certificates), or
    /// auto: mbedtls with --cid,
    /// openssl otherwise [config: dtls.backend].
    #[arg(long, value_name = "BACKEND")]
    pub dtls_backend: Option<cobalt::transport::dtls::DtlsBackendKind>,
    /// Grant each coaps:// client a DTLS Connection ID (RFC 9146) of LEN bytes (6 is
    /// usual; 0: none), so that its session survives NAT rebinding; needs the mbedtls
    /// backend. Each shard's CIDs carry its index after the node id, by which a record
    /// from a new address reaches its shard (Linux; else one shard) [config:
    /// dtls.cid_len].
    #[arg(long, value_name = "LEN")]
    pub cid: Option<usize>,
    /// UDP port for CoAP over DTLS (with --dtls-psk-file or --cert); default: the UDP
    /// port + 1 (5684, the standard port), or 0 (a free one) when --port is 0.
    #[arg(long, value_name = "PORT")]
    pub dtls_port: Option<u16>,
    /// Also serve CoAP over TLS (RFC 8323, `coaps+tcp://`) on this TCP port; without a
    /// number on the DTLS port's number (5684 by default, the standard port). Needs
    /// --cert/--key and/or --dtls-psk-file. With --ws, also serves `coaps+ws://` on
    /// --wss-port.
    #[arg(long, value_name = "PORT", num_args = 0..=1)]
    pub tls: Option<Option<u16>>,
    /// TCP port of CoAP over secure WebSockets (`coaps+ws://`, implies it). Default 8443
    /// (the standard port, 443, needs root).
    #[arg(long, value_name = "PORT")]
    pub wss_port: Option<u16>,
    /// Also serve CoAP over WebSockets (RFC 8323 §4, `coap+ws://HOST:PORT/...`):
    /// HTTP/1.1 upgrades on /.well-known/coap with subprotocol `coap`, on TCP port 8080
    /// unless --ws-port says otherwise. (The standard port, 80, needs root; usually a
    /// web server there proxies /.well-known/coap to this port.)
    #[arg(long)]
    pub ws: bool,
    /// TCP port of --ws (implies --ws). Default 8080.
    #[arg(long, value_name = "PORT")]
    pub ws_port: Option<u16>,
    /// Serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9100 or
    /// localhost:9100 [config: server.metrics_addr].
    #[arg(long, value_name = "HOST:PORT", value_parser = crate::flags::host_port)]
    pub metrics: Option<SocketAddr>,
}

/// The ports of the transports besides UDP, from the flags and the UDP port (see
/// [`ServeArgs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ports {
    tcp: Option<u16>,
    dtls: u16,
    tls: Option<u16>,
}

impl Ports {
    fn new(args: &ServeArgs, udp: u16) -> Ports {
        let dtls = args
            .dtls_port
            .unwrap_or(if udp == 0 { 0 } else { udp.saturating_add(1) });
        Ports {
            tcp: args.tcp.map(|p| p.unwrap_or(udp)),
            dtls,
            tls: args.tls.map(|p| p.unwrap_or(dtls)),
        }
    }
}

/// The effective configuration: defaults < file < environment < `--set` < flags.
pub fn load_config(args: &ServeArgs, log_level: Option<&str>) -> Result<Config, ConfigError> {
    let mut loader = Config::loader();
    let file = args
        .config
        .clone()
        .or_else(|| std::env::var_os("COBALT_CONFIG").map(PathBuf::from));
    if let Some(path) = &file {
        loader = loader.file(path)?;
    }
    loader = loader.env_from_process()?;
    for s in &args.set {
        loader = loader.set_arg(s, "--set")?;
    }
    let flags = [
        ("server.bind", args.bind.map(|b| b.ip.to_string()), "--bind"),
        ("server.port", args.port.map(|p| p.to_string()), "--port"),
        (
            "runtime.shards",
            args.shards.map(|n| n.to_string()),
            "--shards",
        ),
        (
            "server.metrics_addr",
            args.metrics.map(|a| a.to_string()),
            "--metrics",
        ),
        ("log.level", log_level.map(str::to_string), "--log-level"),
        (
            "dtls.backend",
            args.dtls_backend.map(|b| b.as_str().to_string()),
            "--dtls-backend",
        ),
        ("dtls.cid_len", args.cid.map(|n| n.to_string()), "--cid"),
    ];
    for (key, value, flag) in flags {
        if let Some(value) = value {
            loader = loader.set(key, &value, flag)?;
        }
    }
    loader.build()
}

/// Runs the server until Ctrl-C (or SIGTERM).
pub async fn run(args: ServeArgs, log_level: Option<&str>) -> Result<(), (i32, String)> {
    let config = load_config(&args, log_level).map_err(|e| (exit::USAGE, e.to_string()))?;
    if args.print_config {
        // A reader that goes away early (`| head`) ends it quietly.
        crate::sink::write_stdout(config.to_toml().as_bytes())?;
        return Ok(());
    }
    crate::init_logging(&config.log.level);
    let (mut server, demo) = demo::routes(Server::new());
    let file = match &args.credentials {
        Some(path) => {
            Some(cobalt_oscore::Credentials::load(path).map_err(|e| (exit::USAGE, e.to_string()))?)
        }
        None => None,
    };
    // OSCORE outermost: the other layers see requests unprotected.
    if let Some(oscore) = file.as_ref().and_then(|f| f.oscore()) {
        server = server.layer(oscore);
    }
    // The access log (`--log-level debug`) is a layer, added only when its lines are
    // wanted: a server without layers routes each request without them.
    if tracing::enabled!(target: "cobalt::access", tracing::Level::DEBUG) {
        server = server.layer(cobalt::server::layers::AccessLog::new());
    }
    let mut plugtest = None;
    if args.plugtest {
        let (with_plugtest, resources) = plugtest::routes(server);
        (server, plugtest) = (with_plugtest, Some(resources));
    }
    // The configured address, with the zone --bind gave it.
    let bind = crate::flags::BindAddr {
        ip: config.server.bind,
        scope_id: args.bind.map_or(0, |b| b.scope_id),
    };
    let addr = bind.with_port(config.server.port);
    let ports = Ports::new(&args, config.server.port);
    if let Some(port) = ports.tcp {
        server = server.listen(Scheme::CoapTcp, bind.with_port(port));
    }
    let mut keys = match &args.dtls_psk_file {
        Some(file) => cobalt::transport::credentials::PskStore::load(file)
            .map_err(|e| (exit::USAGE, e.to_string()))?,
        None => cobalt::transport::credentials::PskStore::new(),
    };
    for (identity, key) in file.iter().flat_map(|f| f.server_psk().iter()) {
        keys.insert(identity.clone(), key.clone());
    }
    let psk = !keys.is_empty();
    if psk {
        server = server.psk(keys);
    }
    let file_x509 = file
        .as_ref()
        .and_then(|f| f.server_x509())
        .filter(|_| args.cert.is_none());
    if let Some(creds) = file_x509 {
        server = server.x509(creds.clone());
    }
    if let (Some(cert), Some(key)) = (&args.cert, &args.key) {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|e| (exit::USAGE, format!("cannot read {}: {e}", p.display())))
        };
        let creds = cobalt::transport::credentials::X509Credentials {
            cert_chain_pem: read(cert)?,
            key_pem: read(key)?,
            ca_pem: args.ca.as_deref().map(read).transpose()?,
            server_name: None,
        };
        // Check the files now, for a clear message.
        cobalt::transport::dtls::OpensslDtls::server_with(None, Some(&creds), Default::default())
            .map_err(|e| (exit::USAGE, format!("unusable --cert/--key/--ca: {e}")))?;
        #[cfg(feature = "openssl")]
        cobalt::transport::credentials::check_certificate(&creds)
            .map_err(|e| (exit::USAGE, format!("--cert/--key cannot serve DTLS: {e}")))?;
        server = server.x509(creds);
    }
    let credentials = psk || args.cert.is_some() || file_x509.is_some();
    if credentials && !cfg!(feature = "openssl") {
        return Err((
            exit::USAGE,
            "--dtls-psk-file and --cert need DTLS and TLS, which this build lacks: rebuild \
             with the `openssl` feature (on by default)"
                .into(),
        ));
    }
    if credentials {
        server = server.listen(Scheme::Coaps, bind.with_port(ports.dtls));
    }
    let ws = args.ws || args.ws_port.is_some();
    if ws {
        server = server.listen(Scheme::CoapWs, bind.with_port(args.ws_port.unwrap_or(8080)));
    }
    let wss = args.wss_port.or((ws && args.tls.is_some()).then_some(8443));
    if (args.tls.is_some() || wss.is_some()) && !credentials {
        return Err((
            exit::USAGE,
            "--tls and --wss-port need credentials: --cert FILE --key FILE, or --dtls-psk-file FILE"
                .into(),
        ));
    }
    if let Some(port) = ports.tls {
        server = server.listen(Scheme::CoapsTcp, bind.with_port(port));
    }
    if let Some(port) = wss {
        server = server.listen(Scheme::CoapsWs, bind.with_port(port));
    }
    if let Some(interfaces) = &args.multicast {
        let mut groups = cobalt::server::GroupConfig {
            interfaces: interfaces
                .iter()
                .flat_map(|names| names.split(','))
                .map(|name| name.trim().to_string())
                .filter(|name| !name.is_empty())
                .collect(),
            ..Default::default()
        };
        if let Some(leisure) = args.leisure {
            groups.leisure = leisure;
        }
        server = server.join_multicast(groups);
    }
    let handle =
        server
            .with_config(&config.server_settings())
            .bind(addr)
            .await
            .map_err(|e| {
                (
            exit::FAILURE,
            format!("cannot listen on {addr}: {e} (is another server using the port? try --port)"),
        )
            })?;
    let _exporter = match config.server.metrics_addr {
        Some(metrics_addr) => Some(
            serve_metrics(metrics_addr, handle.metrics())
                .await
                .map_err(|e| {
                    (
                        exit::FAILURE,
                        format!("cannot serve metrics on {metrics_addr}: {e}"),
                    )
                })?,
        ),
        None => None,
    };
    demo.start_ticker();
    if let Some(p) = &plugtest {
        p.start_ticker();
    }
    eprintln!(
        "cobalt: serving CoAP on {} (Ctrl-C to stop)",
        handle.local_addr(Scheme::Coap).unwrap()
    );
    if let Some(tcp) = handle.local_addr(Scheme::CoapTcp) {
        eprintln!("cobalt: serving CoAP over TCP on {tcp}");
    }
    if let Some(dtls) = handle.local_addr(Scheme::Coaps) {
        eprintln!("cobalt: serving CoAP over DTLS on {dtls}");
    }
    if let Some(ws) = handle.local_addr(Scheme::CoapWs) {
        eprintln!("cobalt: serving CoAP over WebSockets on ws://{ws}/.well-known/coap");
    }
    if let Some(tls) = handle.local_addr(Scheme::CoapsTcp) {
        eprintln!("cobalt: serving CoAP over TLS on {tls}");
    }
    if let Some(wss) = handle.local_addr(Scheme::CoapsWs) {
        eprintln!("cobalt: serving CoAP over secure WebSockets on wss://{wss}/.well-known/coap");
    }
    if let Some(exporter) = &_exporter {
        eprintln!(
            "cobalt: metrics on http://{}/metrics",
            exporter.local_addr()
        );
    }
    wait_for_signal().await;
    eprintln!("cobalt: shutting down");
    handle.shutdown(Duration::from_secs(2)).await;
    Ok(())
}

/// Waits for Ctrl-C or SIGTERM (`cobalt rd` uses it too).
pub(crate) async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cmd {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn args(argv: &[&str]) -> ServeArgs {
        Cmd::parse_from(std::iter::once("serve").chain(argv.iter().copied())).serve
    }

    #[test]
    fn no_arguments_give_the_built_in_defaults() {
        let c = load_config(&args(&[]), None).unwrap();
        assert_eq!(c.server.socket_addr(), "[::]:5683".parse().unwrap());
        assert_eq!(c.runtime.shards, 0);
        assert_eq!(c.server.metrics_addr, None);
        assert_eq!(c.endpoint, cobalt::EndpointConfig::default());
    }

    #[test]
    fn flags_override_file_and_set() {
        let path = std::env::temp_dir().join(format!("cobalt-serve-{}.toml", std::process::id()));
        std::fs::write(
            &path,
            "[server]\nport = 7000\nbind = \"127.0.0.1\"\n[runtime]\nshards = 3\n[endpoint]\nnstart = 2\n",
        )
        .unwrap();
        let file = path.to_str().unwrap();
        let c = load_config(&args(&["--config", file]), None).unwrap();
        assert_eq!(
            (c.server.port, c.runtime.shards, c.endpoint.nstart),
            (7000, 3, 2)
        );
        let c = load_config(
            &args(&[
                "--config",
                file,
                "--set",
                "server.port=7001",
                "--set",
                "endpoint.ack_timeout=3s",
                "--port",
                "7002",
                "--shards",
                "1",
                "--metrics",
                "127.0.0.1:9100",
            ]),
            Some("debug"),
        )
        .unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(c.server.port, 7002, "--port beats --set and the file");
        assert_eq!(c.server.bind.to_string(), "127.0.0.1");
        assert_eq!(c.runtime.shards, 1);
        assert_eq!(c.endpoint.ack_timeout, Duration::from_secs(3));
        assert_eq!(
            c.server.metrics_addr,
            Some("127.0.0.1:9100".parse().unwrap())
        );
        assert_eq!(c.log.level, "debug");
    }

    #[test]
    fn other_transports_follow_the_udp_port() {
        let ports = |argv: &[&str], udp| Ports::new(&args(argv), udp);
        assert_eq!(
            ports(&["--tcp", "--tls"], 5683),
            Ports {
                tcp: Some(5683),
                dtls: 5684,
                tls: Some(5684)
            }
        );
        assert_eq!(
            ports(&["--tcp", "--tls"], 6000),
            Ports {
                tcp: Some(6000),
                dtls: 6001,
                tls: Some(6001)
            }
        );
        assert_eq!(
            ports(&["--tcp", "7000", "--dtls-port", "7100", "--tls"], 0),
            Ports {
                tcp: Some(7000),
                dtls: 7100,
                tls: Some(7100)
            }
        );
        assert_eq!(
            ports(&["--tcp"], 0),
            Ports {
                tcp: Some(0),
                dtls: 0,
                tls: None
            }
        );
        assert_eq!(ports(&[], 65535).dtls, 65535, "no overflow");
    }

    #[test]
    fn bad_overrides_are_refused_naming_the_key() {
        let e = load_config(&args(&["--set", "endpoint.nstart=0"]), None).unwrap_err();
        assert!(e.to_string().contains("endpoint.nstart"), "{e}");
        let e = load_config(&args(&["--set", "endpoint.bogus=1"]), None).unwrap_err();
        assert!(e.to_string().contains("endpoint.bogus"), "{e}");
        let e = load_config(&args(&["--shards", "5000"]), None).unwrap_err();
        assert!(e.to_string().contains("runtime.shards"), "{e}");
    }
}

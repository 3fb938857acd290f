//! `cobalt rd`: a resource directory (RFC 9176) with embedded defaults, and its
//! device-side commands (`register`, `update`, `remove`, `lookup`) in [`device`].

mod device;

use crate::exit;
use clap::{Args, Subcommand};
use cobalt::metrics::serve_metrics;
use cobalt::{Scheme, Server};
use cobalt_rd::{
    MemoryStore, RdLimits, RedbStore, RedisStore, RegistrationStore, ResourceDirectory,
};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// `cobalt rd [OPTIONS]` serves a directory; `cobalt rd register|update|remove|lookup`
/// talks to one.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct RdArgs {
    #[command(subcommand)]
    action: Option<RdAction>,
    #[command(flatten)]
    serve: ServeRdArgs,
}

#[derive(Debug, Subcommand)]
enum RdAction {
    /// Register this device's links at a directory (prints the registration's URI).
    Register(device::RegisterArgs),
    /// Renew a registration (and change its lifetime, base or links).
    Update(device::UpdateArgs),
    /// Remove a registration.
    Remove(device::RemoveArgs),
    /// Look up endpoints (`ep`) or resources (`res`) by attribute.
    Lookup(device::LookupArgs),
}

/// How the directory is served.
#[derive(Debug, Args)]
struct ServeRdArgs {
    /// Address to listen on (`::` serves IPv4 and IPv6).
    #[arg(long, value_parser = crate::flags::bind_addr, default_value = "::")]
    bind: crate::flags::BindAddr,
    /// UDP port; 0 picks a free one.
    #[arg(short, long, default_value_t = 5683)]
    port: u16,
    /// Where registrations are stored (the file registrations.redb) so that a restart
    /// keeps them. Default: $XDG_DATA_HOME/cobalt/rd, else ~/.local/share/cobalt/rd,
    /// else ./cobalt-data/rd.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["in_memory", "store"])]
    data_dir: Option<PathBuf>,
    /// Keep registrations in memory only: a restart forgets them.
    #[arg(long, conflicts_with = "store")]
    in_memory: bool,
    /// Store registrations in a Redis (or Valkey) server that several `cobalt rd`
    /// nodes share, e.g. redis://10.0.0.5:6379: any node then answers for every
    /// registration (a cluster behind one address; see deploy/).
    #[arg(long, value_name = "redis://HOST:PORT")]
    store: Option<String>,
    /// The key prefix in the --store server; directories with different prefixes
    /// on one server are separate directories.
    #[arg(
        long,
        value_name = "PREFIX",
        default_value = "cobalt:rd",
        requires = "store"
    )]
    store_prefix: String,
    /// Serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9100, and
    /// readiness at http://ADDR/ready (503 while the connection to --store is lost;
    /// for a balancer's or Kubernetes' readiness check).
    #[arg(long, value_name = "HOST:PORT", value_parser = crate::flags::host_port)]
    metrics: Option<SocketAddr>,
    /// Also serve over DTLS (`coaps://`, PSK) with the keys in FILE, one `identity:key`
    /// per line; a registration made over DTLS can then be changed only with the same
    /// PSK identity.
    #[arg(long, value_name = "FILE")]
    dtls_psk_file: Option<PathBuf>,
    /// UDP port for DTLS; default: the UDP port + 1 (or 0 when --port is 0).
    #[arg(long, value_name = "PORT")]
    dtls_port: Option<u16>,
    /// Grant each DTLS client a Connection ID (RFC 9146) of LEN bytes (6 is usual), so
    /// that its session survives NAT rebinding; serves DTLS on the mbedtls backend
    /// (each shard's CIDs carry its index after the node id).
    #[arg(long, value_name = "LEN", requires = "dtls_psk_file")]
    cid: Option<usize>,
    /// The first byte(s) of every Connection ID this node grants, in hex (e.g. `01`),
    /// so that a cluster's balancer routes a client's records to this node by them
    /// (scripts/cluster.sh).
    #[arg(long, value_name = "HEX", requires = "cid")]
    cid_node_id: Option<String>,
    /// Most registrations from one address (IPv6: one /64).
    #[arg(long, default_value_t = RdLimits::default().max_per_peer)]
    max_per_peer: usize,
    /// Most registrations in all.
    #[arg(long, default_value_t = RdLimits::default().max_total)]
    max_registrations: usize,
    /// Largest link-format body of a registration, in bytes.
    #[arg(long, default_value_t = RdLimits::default().max_body_bytes)]
    max_body: usize,
    /// Max-Age of lookup answers, in seconds: how soon an observer of a lookup that
    /// hears nothing registers again (in a cluster: finds another node after one died).
    #[arg(long, value_name = "SECONDS", default_value_t = RdLimits::default().lookup_max_age_secs)]
    lookup_max_age: u32,
}

/// The data directory of `service` (`rd`, `lwm2m`) when --data-dir is not given
/// (see its help).
pub(crate) fn default_data_dir(service: &str) -> PathBuf {
    let home_data = || std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share"));
    match std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(home_data)
    {
        Some(base) => base.join("cobalt").join(service),
        None => PathBuf::from("cobalt-data").join(service),
    }
}

/// Runs `cobalt rd ...`.
pub async fn run(args: RdArgs) -> Result<(), (i32, String)> {
    match args.action {
        Some(RdAction::Register(a)) => device::register(a).await,
        Some(RdAction::Update(a)) => device::update(a).await,
        Some(RdAction::Remove(a)) => device::remove(a).await,
        Some(RdAction::Lookup(a)) => device::lookup(a).await,
        None => serve(args.serve).await,
    }
}

async fn serve(args: ServeRdArgs) -> Result<(), (i32, String)> {
    let limits = RdLimits {
        max_per_peer: args.max_per_peer,
        max_total: args.max_registrations,
        max_body_bytes: args.max_body,
        lookup_max_age_secs: args.lookup_max_age,
        ..RdLimits::default()
    };
    let store: Arc<dyn RegistrationStore> = if let Some(url) = &args.store {
        if !url.starts_with("redis://") {
            return Err((
                exit::USAGE,
                format!("--store {url}: give redis://HOST:PORT (the embedded store is --data-dir)"),
            ));
        }
        let store = RedisStore::connect_with_prefix(url, &args.store_prefix)
            .await
            .map_err(|e| (exit::FAILURE, e.to_string()))?;
        eprintln!(
            "cobalt: registrations are stored in {url} under {}",
            store.prefix()
        );
        Arc::new(store)
    } else if args.in_memory {
        Arc::new(MemoryStore::new())
    } else {
        let dir = args
            .data_dir
            .clone()
            .unwrap_or_else(|| default_data_dir("rd"));
        let store = RedbStore::open(&dir).map_err(|e| (exit::FAILURE, e.to_string()))?;
        eprintln!(
            "cobalt: registrations are stored in {}",
            store.path().display()
        );
        Arc::new(store)
    };
    let rd = ResourceDirectory::open(store, limits)
        .await
        .map_err(|e| (exit::FAILURE, e.to_string()))?;
    let mut server = rd
        .install(Server::new())
        .listen(Scheme::Coap, args.bind.with_port(args.port));
    if let Some(file) = &args.dtls_psk_file {
        let keys = cobalt::transport::credentials::PskStore::load(file)
            .map_err(|e| (exit::USAGE, e.to_string()))?;
        let port = args.dtls_port.unwrap_or(if args.port == 0 {
            0
        } else {
            args.port.saturating_add(1)
        });
        server = server
            .psk(keys)
            .listen(Scheme::Coaps, args.bind.with_port(port));
        if let Some(cid_len) = args.cid {
            server = server.dtls_config(cobalt::transport::dtls::DtlsConfig {
                cid_len,
                cid_node_id: args.cid_node_id.clone().unwrap_or_default(),
                ..Default::default()
            });
        }
    }
    let handle = server
        .start()
        .await
        .map_err(|e| (exit::FAILURE, e.to_string()))?;
    let _expiry = rd.spawn_expiry();
    // The metrics endpoint's /ready says whether this node is connected to --store.
    let _sync = rd.spawn_sync_reporting(handle.metrics().readiness().clone());
    let _exporter = match args.metrics {
        Some(addr) => {
            let exporter = serve_metrics(addr, handle.metrics()).await.map_err(|e| {
                (
                    exit::FAILURE,
                    format!("cannot serve metrics on {addr}: {e}"),
                )
            })?;
            eprintln!(
                "cobalt: metrics on http://{}/metrics",
                exporter.local_addr()
            );
            Some(exporter)
        }
        None => None,
    };
    for (scheme, addr) in handle.listeners() {
        eprintln!(
            "cobalt: resource directory on {scheme}://{addr}/rd ({} registrations)",
            rd.len().await
        );
    }
    crate::serve::wait_for_signal().await;
    eprintln!("cobalt: shutting down");
    handle.shutdown(Duration::from_secs(2)).await;
    Ok(())
}

//! `cobalt lwm2m`: an LwM2M 1.1 server with embedded defaults (registrations stored
//! under --data-dir), coap and, with a PSK, coaps; and an HTTP/JSON view of the
//! registered clients ([`http`]) to read, write, execute and observe them.

mod http;

use crate::exit;
use clap::Args;
use cobalt::transport::credentials::PskStore;
use cobalt::{Scheme, Server};
use cobalt_lwm2m::Lwm2mServer;
use cobalt_rd::{MemoryStore, RdLimits, RedbStore, RegistrationStore};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// `cobalt lwm2m [OPTIONS]`.
#[derive(Debug, Args)]
pub struct Lwm2mArgs {
    /// Address to listen on for CoAP (`::` serves IPv4 and IPv6).
    #[arg(long, value_parser = crate::flags::bind_addr, default_value = "::")]
    bind: crate::flags::BindAddr,
    /// UDP port for coap; 0 picks a free one.
    #[arg(short, long, default_value_t = 5683)]
    port: u16,
    /// UDP port for coaps (DTLS with PSK; served when a PSK is given).
    #[arg(long, default_value_t = 5684)]
    dtls_port: u16,
    /// PSK identity a client may use over coaps (with --psk-key).
    #[arg(long, requires = "psk_key", value_name = "IDENTITY")]
    psk_identity: Option<String>,
    /// The key of --psk-identity, as text (`hex:...` for bytes given in hex).
    #[arg(long, requires = "psk_identity", value_name = "KEY")]
    psk_key: Option<String>,
    /// More PSKs: a file with one `identity:key` per line.
    #[arg(long, value_name = "FILE")]
    psk_file: Option<PathBuf>,
    /// Where registrations are stored (the file registrations.redb) so that a restart
    /// keeps them. Default: $XDG_DATA_HOME/cobalt/lwm2m, else
    /// ~/.local/share/cobalt/lwm2m, else ./cobalt-data/lwm2m.
    #[arg(long, value_name = "DIR", conflicts_with = "in_memory")]
    data_dir: Option<PathBuf>,
    /// Keep registrations in memory only: a restart forgets them.
    #[arg(long)]
    in_memory: bool,
    /// Address of the HTTP/JSON view (GET /clients, /clients/{ep},
    /// /clients/{ep}/{obj}/{inst}/{res}[/observe]; PUT writes, POST executes).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    http: SocketAddr,
    /// Most registrations from one address (IPv6: one /64).
    #[arg(long, default_value_t = RdLimits::default().max_per_peer)]
    max_per_peer: usize,
    /// Most registrations in all.
    #[arg(long, default_value_t = RdLimits::default().max_total)]
    max_registrations: usize,
}

/// The PSKs from the flags: --psk-identity/--psk-key and --psk-file together.
fn psk_table(args: &Lwm2mArgs) -> Result<Option<PskStore>, (i32, String)> {
    let mut keys = match &args.psk_file {
        Some(file) => PskStore::load(file).map_err(|e| (exit::USAGE, e.to_string()))?,
        None => PskStore::new(),
    };
    if let (Some(identity), Some(key)) = (&args.psk_identity, &args.psk_key) {
        keys.insert(identity.as_bytes(), psk_key_bytes(key)?);
    }
    Ok((!keys.is_empty()).then_some(keys))
}

/// A key given as text, or as `hex:` followed by hex digits.
fn psk_key_bytes(key: &str) -> Result<Vec<u8>, (i32, String)> {
    let Some(hex) = key.strip_prefix("hex:") else {
        return Ok(key.as_bytes().to_vec());
    };
    hex_bytes(hex).filter(|b| !b.is_empty()).ok_or_else(|| {
        (
            exit::USAGE,
            format!("--psk-key {key:?}: after `hex:` give an even number of hex digits"),
        )
    })
}

/// The bytes an even number of hex digits write.
fn hex_bytes(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Runs `cobalt lwm2m`.
pub async fn run(args: Lwm2mArgs) -> Result<(), (i32, String)> {
    let limits = RdLimits {
        max_per_peer: args.max_per_peer,
        max_total: args.max_registrations,
        ..RdLimits::default()
    };
    let store: Arc<dyn RegistrationStore> = if args.in_memory {
        Arc::new(MemoryStore::new())
    } else {
        let dir = args
            .data_dir
            .clone()
            .unwrap_or_else(|| crate::rd::default_data_dir("lwm2m"));
        let store = RedbStore::open(&dir).map_err(|e| (exit::FAILURE, e.to_string()))?;
        eprintln!(
            "cobalt: registrations are stored in {}",
            store.path().display()
        );
        Arc::new(store)
    };
    let lwm2m = Lwm2mServer::open(store, limits)
        .await
        .map_err(|e| (exit::FAILURE, e.to_string()))?;
    // One shard per listener: requests to a client leave from the socket (and DTLS
    // session) it registered at.
    let mut server = lwm2m
        .install(Server::new())
        .shards(1)
        .listen(Scheme::Coap, args.bind.with_port(args.port));
    if let Some(keys) = psk_table(&args)? {
        server = server
            .psk(keys)
            .listen(Scheme::Coaps, args.bind.with_port(args.dtls_port));
    }
    let http = tokio::net::TcpListener::bind(args.http)
        .await
        .map_err(|e| {
            (
                exit::FAILURE,
                format!(
                    "cannot listen for HTTP on {}: {e}; pick another --http address",
                    args.http
                ),
            )
        })?;
    let handle = server
        .start()
        .await
        .map_err(|e| (exit::FAILURE, e.to_string()))?;
    let _expiry = lwm2m.spawn_expiry();
    for (scheme, addr) in handle.listeners() {
        eprintln!("cobalt: LwM2M server on {scheme}://{addr}/rd");
    }
    let http_addr = http.local_addr().unwrap_or(args.http);
    eprintln!("cobalt: HTTP view on http://{http_addr}/clients");
    let view = tokio::spawn(http::serve(http, lwm2m));
    crate::serve::wait_for_signal().await;
    eprintln!("cobalt: shutting down");
    view.abort();
    handle.shutdown(Duration::from_secs(2)).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psk_keys_are_text_or_hex() {
        assert_eq!(psk_key_bytes("secret").unwrap(), b"secret");
        assert_eq!(psk_key_bytes("hex:6b6579").unwrap(), b"key");
        for bad in ["hex:", "hex:6b6", "hex:zz", "hex:6bé9"] {
            assert!(psk_key_bytes(bad).is_err(), "{bad}");
        }
    }
}

//! EDHOC handshakes for `bench/oscore.sh`: CLIENTS tasks each run EDHOC with the server
//! at URI one handshake after another for SECONDS (message_1 to message_4, the OSCORE
//! context derived), as the credentials file's `edhoc-oscore` entry for URI says;
//! prints the handshakes completed and the time taken as one line of JSON. It stops
//! after [`HANDSHAKE_BUDGET`] handshakes (two message IDs each, below the 65,536 of its
//! endpoint).
//!
//! Usage: edhoc_load URI CLIENTS SECONDS CREDENTIALS
//!        edhoc_load --write-credentials DIR URI
//!
//! The second form makes a server and a client identity and writes
//! `DIR/edhoc-server.json` (for `cobalt serve --credentials`) and
//! `DIR/edhoc-client.json` with their keys.

use cobalt::proto::uri::CoapUri;
use cobalt::Client;
use cobalt_oscore::{CredentialStyle, Credentials, EdhocIdentity};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Handshakes one run makes at most.
const HANDSHAKE_BUDGET: u64 = 30_000;

type Failure = Box<dyn std::error::Error>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("--write-credentials") if args.len() == 4 => {
            write_credentials(Path::new(&args[2]), &args[3])
        }
        Some(_) if args.len() == 5 => {
            load(
                &args[1],
                args[2].parse()?,
                args[3].parse()?,
                Path::new(&args[4]),
            )
            .await
        }
        _ => Err("usage: edhoc_load URI CLIENTS SECONDS CREDENTIALS | edhoc_load --write-credentials DIR URI".into()),
    }
}

async fn load(uri: &str, clients: usize, seconds: f64, file: &Path) -> Result<(), Failure> {
    let credentials = Arc::new(Credentials::load(file)?);
    let target = CoapUri::parse(uri)?;
    let client = Client::new();
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (client, target, credentials) =
                (client.clone(), target.clone(), credentials.clone());
            let (done, failed) = (done.clone(), failed.clone());
            tokio::spawn(async move {
                let made = || done.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed);
                while Instant::now() < deadline && made() < HANDSHAKE_BUDGET {
                    let why = match credentials.client_oscore(&client, &target).await {
                        Ok(Some(_)) => {
                            done.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        Ok(None) => "no edhoc-oscore entry of the file matches the URI".to_string(),
                        Err(e) => e.to_string(),
                    };
                    // The first failure is told; the others only counted.
                    if failed.fetch_add(1, Ordering::Relaxed) == 0 {
                        eprintln!("edhoc_load: {why}");
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await?;
    }
    println!(
        "{{\"ok\": {}, \"failed\": {}, \"seconds\": {:.3}}}",
        done.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn write_credentials(dir: &Path, uri: &str) -> Result<(), Failure> {
    let server = EdhocIdentity::generate("bench-server", b"\x0a", CredentialStyle::ByKeyId);
    let client = EdhocIdentity::generate("bench-client", b"\x0b", CredentialStyle::ByKeyId);
    let own = |name: &str, identity: &EdhocIdentity| -> Result<serde_json::Value, Failure> {
        let key = dir.join(format!("{name}.cosekey"));
        std::fs::write(&key, identity.private_key_cose())?;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
        Ok(
            serde_json::json!({"suite": 2, "method": 3, "own_cred_style": "by-key-id",
            "own_cred": identity.credential().to_json(),
            "private_key_file": format!("{name}.cosekey")}),
        )
    };
    let pattern = format!("{}/*", uri.trim_end_matches('/'));
    let server_file = serde_json::json!({
        pattern.clone(): {"edhoc-oscore": own("server", &server)?},
        ":edhoc-bench": {"edhoc-oscore": {"suite": 2, "method": 3,
            "peer_cred": client.credential().to_json()}},
    });
    let mut client_entry = own("client", &client)?;
    client_entry["peer_cred"] = server.credential().to_json();
    let client_file = serde_json::json!({ pattern: {"edhoc-oscore": client_entry} });
    std::fs::write(dir.join("edhoc-server.json"), server_file.to_string())?;
    std::fs::write(dir.join("edhoc-client.json"), client_file.to_string())?;
    Ok(())
}

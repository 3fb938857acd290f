//! `cobalt serve`: the demo server (and the ETSI plugtest resource set with `--plugtest`).

mod clock;
mod demo;
mod plugtest;

use crate::exit;
use clap::Args;
use cobalt::Server;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// `cobalt serve` options.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (IPv4 or IPv6; `::` serves both families).
    #[arg(long, default_value = "::")]
    pub bind: IpAddr,
    /// UDP port.
    #[arg(short, long, default_value_t = 5683)]
    pub port: u16,
    /// Also serve the ETSI CoAP plugtest resources (/test, /seg1/seg2/seg3, /query, ...).
    #[arg(long)]
    pub plugtest: bool,
    /// Protocol shards (threads with their own socket); default one per core.
    #[arg(long)]
    pub shards: Option<usize>,
}

/// Runs the server until Ctrl-C (or SIGTERM).
pub async fn run(args: ServeArgs) -> Result<(), (i32, String)> {
    let (mut server, demo) = demo::routes(Server::new());
    if args.plugtest {
        server = plugtest::routes(server);
    }
    if let Some(n) = args.shards {
        server = server.shards(n);
    }
    let addr = SocketAddr::new(args.bind, args.port);
    let handle = server.bind(addr).await.map_err(|e| {
        (
            exit::NETWORK,
            format!("cannot listen on {addr}: {e} (is another server using the port? try --port)"),
        )
    })?;
    demo.start_ticker();
    eprintln!(
        "cobalt: serving CoAP on {} (Ctrl-C to stop)",
        handle.local_addr()
    );
    wait_for_signal().await;
    eprintln!("cobalt: shutting down");
    handle.shutdown(Duration::from_secs(2)).await;
    Ok(())
}

async fn wait_for_signal() {
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

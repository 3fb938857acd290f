//! `cobalt devices`: a fleet of simulated devices ([`cobalt_fleet`]) that register at
//! a resource directory (RFC 9176) or an LwM2M server and serve observable sensors,
//! until Ctrl-C (or `--duration`); then they de-register and the summary is printed.

use crate::exit;
use clap::Args;
use cobalt::proto::uri::{CoapUri, Scheme};
use cobalt_fleet::content::Profile;
use cobalt_fleet::device::DeviceSettings;
use cobalt_fleet::fleet::{Fleet, FleetConfig, FleetPsk, SourceAddrs};
use cobalt_fleet::registration::DirectoryTarget;
use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `cobalt devices [OPTIONS]`.
#[derive(Debug, Args)]
pub struct DevicesArgs {
    /// How many devices (each with its own UDP socket).
    #[arg(short = 'n', long, default_value_t = 100)]
    count: u32,
    /// Register at this resource directory (RFC 9176): `coap://host[:port]` (its
    /// registration interface is found by discovery) or the interface's URI
    /// (`coap://host/rd`). The devices serve `/sensors/temp` and `/sensors/hum`.
    #[arg(long, value_name = "URI", conflicts_with = "lwm2m")]
    rd: Option<String>,
    /// Register at this LwM2M 1.1 server (`coap://host[:port]`, interface `/rd` unless
    /// the URI names one) and serve the objects 1, 3 and 3303 (temperature).
    #[arg(long, value_name = "URI")]
    lwm2m: Option<String>,
    /// Registration lifetime in seconds; renewed a minute before it ends (at ¾ of
    /// lifetimes up to 4 minutes).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..))]
    lt: u32,
    /// Sensor changes per second per device (0: the values never change).
    #[arg(long, default_value_t = 1.0)]
    rate: f64,
    /// Address the devices' sockets are bound to.
    #[arg(long, default_value = "127.0.0.1", conflicts_with = "source_net")]
    bind: IpAddr,
    /// Spread the devices over the host addresses of this IPv4 network, e.g.
    /// 127.0.0.0/16 (all of 127.0.0.0/8 is loopback): a server's per-address budgets
    /// then see fewer devices per address.
    #[arg(long, value_name = "NET/LEN")]
    source_net: Option<String>,
    /// Endpoint names: device i is PREFIX{i}.
    #[arg(long, value_name = "PREFIX", default_value = "dev-")]
    ep_prefix: String,
    /// DTLS with a pre-shared key towards the directory (its URI must be coaps://):
    /// device i's identity is PREFIX{i}. The devices are then reachable only over
    /// their sessions with it.
    #[arg(long, value_name = "PREFIX", requires = "psk_key")]
    psk_identity_prefix: Option<String>,
    /// The pre-shared key (text), the same for every device.
    #[arg(long, value_name = "KEY", requires = "psk_identity_prefix")]
    psk_key: Option<String>,
    /// Devices starting to register per second; at shutdown they remove their
    /// registrations at the same pace.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    registrations_per_second: u32,
    /// Most observers per device; a registration beyond is served without Observe.
    #[arg(long, default_value_t = 8)]
    max_observers: usize,
    /// Stop (and de-register) after this many seconds instead of at Ctrl-C.
    #[arg(long, value_name = "SECONDS")]
    duration: Option<f64>,
    /// Print the counters to stderr every this many seconds (0: only at the end).
    #[arg(long, value_name = "SECONDS", default_value_t = 0.0)]
    progress: f64,
    /// Write `ep address` of every device, one per line, to FILE once the sockets are
    /// open.
    #[arg(long, value_name = "FILE")]
    addresses: Option<PathBuf>,
}

/// The directory's URI as a target for the devices.
async fn directory(
    uri: &str,
    profile: Profile,
    secure: bool,
) -> Result<DirectoryTarget, (i32, String)> {
    let usage = |m: String| (exit::USAGE, m);
    let parsed = CoapUri::parse(uri).map_err(|e| usage(e.to_string()))?;
    match (parsed.scheme, secure) {
        (Scheme::Coap, false) | (Scheme::Coaps, true) => {}
        (Scheme::Coaps, false) => {
            return Err(usage(format!(
                "{uri} is coaps://: give the devices a key with --psk-identity-prefix and --psk-key"
            )))
        }
        (Scheme::Coap, true) => {
            return Err(usage(format!(
                "--psk-key needs a coaps:// directory, not {uri}"
            )))
        }
        (other, _) => {
            return Err(usage(format!(
                "the devices speak UDP (coap://, coaps://), not {}",
                other.as_str()
            )))
        }
    }
    let server = tokio::net::lookup_host((parsed.host.as_str(), parsed.port))
        .await
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            (
                exit::USAGE,
                format!("cannot resolve {} of {uri}", parsed.host),
            )
        })?;
    Ok(DirectoryTarget {
        profile,
        server,
        path: parsed.path,
    })
}

/// Runs `cobalt devices`.
pub async fn run(args: DevicesArgs) -> Result<(), (i32, String)> {
    let usage = |m: String| (exit::USAGE, m);
    if !args.rate.is_finite() || args.rate < 0.0 || args.rate > 1000.0 {
        return Err(usage(format!(
            "invalid --rate {}: expected 0 to 1000 changes per second",
            args.rate
        )));
    }
    let duration = args
        .duration
        .map(|d| crate::flags::seconds("duration", d, false))
        .transpose()
        .map_err(usage)?;
    let progress = crate::flags::seconds("progress", args.progress, true).map_err(usage)?;
    let secure = args.psk_key.is_some();
    let (profile, target) = match (&args.rd, &args.lwm2m) {
        (Some(uri), _) => (
            Profile::Rd,
            Some(directory(uri, Profile::Rd, secure).await?),
        ),
        (_, Some(uri)) => (
            Profile::Lwm2m,
            Some(directory(uri, Profile::Lwm2m, secure).await?),
        ),
        (None, None) if secure => {
            return Err(usage(
                "--psk-key needs a directory: --rd or --lwm2m coaps://...".into(),
            ))
        }
        (None, None) => (Profile::Rd, None),
    };
    let source = match &args.source_net {
        Some(net) => SourceAddrs::parse_net(net).map_err(usage)?,
        None => SourceAddrs::One(args.bind),
    };
    let mut settings = DeviceSettings::new(profile);
    settings.directory = target.clone();
    settings.lifetime = args.lt;
    settings.change_every = (args.rate > 0.0).then(|| Duration::from_secs_f64(1.0 / args.rate));
    settings.max_observers = args.max_observers;
    let mut config = FleetConfig::new(args.count, settings);
    config.ep_prefix = args.ep_prefix.clone();
    config.source = source;
    config.registrations_per_second = args.registrations_per_second;
    config.psk = args
        .psk_identity_prefix
        .clone()
        .zip(args.psk_key.clone())
        .map(|(identity_prefix, key)| FleetPsk {
            identity_prefix,
            key: key.into_bytes(),
        });
    let fd_limit = cobalt_bench::sys::raise_fd_limit();
    if u64::from(args.count) + 64 > fd_limit {
        return Err((
            exit::FAILURE,
            format!(
                "{} devices need {} file descriptors, the limit is {fd_limit}: raise `ulimit -Hn`",
                args.count,
                u64::from(args.count) + 64
            ),
        ));
    }
    let fleet = Fleet::start(config)
        .await
        .map_err(|e| (exit::FAILURE, e.to_string()))?;
    if let Some(file) = &args.addresses {
        write_addresses(file, &args.ep_prefix, fleet.addresses())?;
    }
    let place = match &args.source_net {
        Some(net) => format!("spread over {net}"),
        None => format!("on {}", args.bind),
    };
    let goal = match (&args.rd, &args.lwm2m) {
        (Some(uri), _) => format!(", registering at the resource directory {uri}"),
        (_, Some(uri)) => format!(", registering at the LwM2M server {uri}"),
        _ => String::new(),
    };
    eprintln!(
        "cobalt: {} devices {place}{goal}; {} change(s) per second each; Ctrl-C stops and de-registers",
        args.count, args.rate
    );
    let stop = async {
        match duration {
            Some(d) => tokio::select! {
                _ = tokio::time::sleep(d) => {}
                _ = crate::serve::wait_for_signal() => {}
            },
            None => crate::serve::wait_for_signal().await,
        }
    };
    tokio::pin!(stop);
    if progress > Duration::ZERO {
        let mut tick = tokio::time::interval(progress);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = &mut stop => break,
                _ = tick.tick() => eprintln!("cobalt: {}", fleet.stats().summary()),
            }
        }
    } else {
        stop.await;
    }
    eprintln!("cobalt: stopping; removing the registrations");
    let rss = cobalt_bench::procfs::rss_kb(std::process::id());
    let summary = fleet.shutdown().await;
    println!("{summary}");
    if let Some(kb) = rss {
        eprintln!(
            "cobalt: memory before shutdown: RSS {} KiB ({:.1} KiB per device)",
            kb,
            kb as f64 / f64::from(args.count.max(1))
        );
    }
    if target.is_some() && summary.registrations == 0 {
        return Err((
            exit::NETWORK,
            "no device could register; see the errors above (is the directory running?)".into(),
        ));
    }
    Ok(())
}

fn write_addresses(
    file: &PathBuf,
    prefix: &str,
    addrs: &[std::net::SocketAddr],
) -> Result<(), (i32, String)> {
    let fail = |e: std::io::Error| {
        (
            exit::FAILURE,
            format!("cannot write {}: {e}", file.display()),
        )
    };
    let mut out = std::io::BufWriter::new(std::fs::File::create(file).map_err(fail)?);
    for (i, a) in addrs.iter().enumerate() {
        writeln!(out, "{prefix}{i} {a}").map_err(fail)?;
    }
    out.flush().map_err(fail)
}

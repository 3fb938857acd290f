//! `cobalt-linkem`: runs the emulated link until Ctrl-C, SIGTERM or `--duration`, then
//! writes its statistics and removes its namespaces.

use clap::Parser;
use cobalt_linkem::emulator::{Config, Emulator};
use cobalt_linkem::netns;
use cobalt_proto::sim::link::{GilbertElliott, LinkConfig, LossModel, LossPoint};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Emulates a constrained link between two network namespaces (needs root).
///
/// Defaults are the link of the congestion study: 60 kbit/s and 200 ms from the client side
/// (10.78.1.2) to the server side (10.78.2.1), 30 kbit/s and 400 ms back, MTU 296, a
/// drop-tail queue of 2,500 bytes each way, and 10-20 ms of extra delay for the rest
/// of the path. Run programs on either side with `ip netns exec NAME ...`; the names
/// are printed at start.
#[derive(Debug, Parser)]
#[command(name = "cobalt-linkem", version)]
struct Args {
    /// Uplink rate (client to server), bit/s.
    #[arg(long, default_value_t = 60_000)]
    rate_up: u64,
    /// Downlink rate (server to client), bit/s.
    #[arg(long, default_value_t = 30_000)]
    rate_down: u64,
    /// Uplink propagation delay, ms.
    #[arg(long, default_value_t = 200.0)]
    delay_up: f64,
    /// Downlink propagation delay, ms.
    #[arg(long, default_value_t = 400.0)]
    delay_down: f64,
    /// Drop-tail queue of each direction, bytes (e.g. 2500, 28200, 1410000).
    #[arg(long, default_value_t = 2500)]
    buffer: usize,
    /// Uplink queue, bytes, if it differs from --buffer.
    #[arg(long)]
    buffer_up: Option<usize>,
    /// Extra delay of the rest of the path, uniform between two values in ms ("10-20"),
    /// added before the downlink's queue and after the uplink; it never reorders.
    #[arg(long, default_value = "10-20")]
    jitter: String,
    /// Loss on the link: none, medium (Gilbert-Elliott, ~10 %), high (~18 %), or
    /// bernoulli:P (each packet with probability P).
    #[arg(long, default_value = "none")]
    loss: String,
    /// Apply loss on arrival (before the queue, like netem) instead of after the
    /// packet's transmission.
    #[arg(long)]
    loss_on_arrival: bool,
    /// Bytes added to each packet for the rate and the queue (14: an Ethernet header).
    #[arg(long, default_value_t = 0)]
    overhead: usize,
    /// MTU of the devices and the link.
    #[arg(long, default_value_t = 296)]
    mtu: usize,
    /// Seed of every random draw.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Name of the client side's namespace (default: a unique lem... name).
    #[arg(long)]
    client_ns: Option<String>,
    /// Name of the server side's namespace.
    #[arg(long)]
    server_ns: Option<String>,
    /// A sysctl to set in both namespaces, e.g. net.ipv4.tcp_timestamps=0 (repeatable).
    #[arg(long)]
    sysctl: Vec<String>,
    /// Write the statistics (JSON) here instead of standard output.
    #[arg(long)]
    stats: Option<PathBuf>,
    /// Write one CSV line per packet here.
    #[arg(long)]
    log: Option<PathBuf>,
    /// Stop after this many seconds.
    #[arg(long)]
    duration: Option<f64>,
    /// Do not ask for real-time priority for the link's thread.
    #[arg(long)]
    no_realtime: bool,
    /// Remove namespaces left by emulators that were killed, and exit.
    #[arg(long)]
    cleanup: bool,
}

fn parse_loss(s: &str) -> Result<LossModel, String> {
    match s {
        "none" => Ok(LossModel::None),
        "medium" => Ok(LossModel::GilbertElliott(GilbertElliott::medium())),
        "high" => Ok(LossModel::GilbertElliott(GilbertElliott::high())),
        _ => match s.strip_prefix("bernoulli:").map(str::parse::<f64>) {
            Some(Ok(p)) if (0.0..=1.0).contains(&p) => Ok(LossModel::Bernoulli(p)),
            _ => Err(format!(
                "invalid --loss `{s}`: use none, medium, high or bernoulli:P with P in 0..1"
            )),
        },
    }
}

fn parse_range_ms(s: &str) -> Result<(Duration, Duration), String> {
    let bad = || format!("invalid --jitter `{s}`: use A-B in milliseconds, e.g. 10-20 or 0-0");
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    let a: f64 = a.trim().parse().map_err(|_| bad())?;
    let b: f64 = b.trim().parse().map_err(|_| bad())?;
    if !(0.0..=60_000.0).contains(&a) || !(a..=60_000.0).contains(&b) {
        return Err(bad());
    }
    Ok((
        Duration::from_secs_f64(a / 1e3),
        Duration::from_secs_f64(b / 1e3),
    ))
}

fn ms(v: f64, what: &str) -> Result<Duration, String> {
    if (0.0..=600_000.0).contains(&v) {
        Ok(Duration::from_secs_f64(v / 1e3))
    } else {
        Err(format!("invalid --{what} {v}: use 0 to 600000 ms"))
    }
}

fn config(a: &Args) -> Result<Config, String> {
    let loss = parse_loss(&a.loss)?;
    let jitter = parse_range_ms(&a.jitter)?;
    if !(68..=65535).contains(&a.mtu) {
        return Err(format!("invalid --mtu {}: use 68 to 65535", a.mtu));
    }
    let mut link = LinkConfig::paper(a.buffer, loss);
    link.up.rate_bps = a.rate_up;
    link.down.rate_bps = a.rate_down;
    link.up.delay = ms(a.delay_up, "delay-up")?;
    link.down.delay = ms(a.delay_down, "delay-down")?;
    link.up.queue_bytes = a.buffer_up.unwrap_or(a.buffer);
    link.up.jitter_after = jitter;
    link.down.jitter_before = jitter;
    for d in [&mut link.up, &mut link.down] {
        d.overhead = a.overhead;
        d.mtu = a.mtu;
        if a.loss_on_arrival {
            d.loss_at = LossPoint::Arrival;
        }
    }
    let mut c = Config::new(link, a.seed);
    c.mtu = a.mtu;
    if let Some(n) = &a.client_ns {
        c.client.namespace = n.clone();
        c.client.device = n.chars().take(15).collect();
    }
    if let Some(n) = &a.server_ns {
        c.server.namespace = n.clone();
        c.server.device = n.chars().take(15).collect();
    }
    c.sysctls = a.sysctl.clone();
    c.packet_log = a.log.clone();
    c.realtime = !a.no_realtime;
    Ok(c)
}

/// Blocks the stop signals in this thread (and the threads it starts), so that
/// they can be waited for.
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local set; pthread_sigmask with valid pointers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Waits for a stop signal, at most `limit`.
fn wait_for_signal(set: &libc::sigset_t, limit: Option<Duration>) {
    match limit {
        Some(d) => {
            let ts = libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            };
            // SAFETY: valid set and timespec; no siginfo wanted.
            unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
        }
        None => {
            let mut sig = 0;
            // SAFETY: valid set and output pointer.
            unsafe { libc::sigwait(set, &mut sig) };
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let removed = netns::remove_stale();
    if !removed.is_empty() {
        eprintln!(
            "cobalt-linkem: removed stale namespaces {}",
            removed.join(", ")
        );
    }
    if args.cleanup {
        return ExitCode::SUCCESS;
    }
    let config = match config(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cobalt-linkem: {e}");
            return ExitCode::from(2);
        }
    };
    let set = block_signals();
    let (cn, sn) = (config.client.clone(), config.server.clone());
    let emu = match Emulator::start(config) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("cobalt-linkem: cannot start the link: {e} (it needs root, /dev/net/tun and iproute2)");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "client namespace {} ({}), server namespace {} ({}); Ctrl-C stops",
        cn.namespace, cn.addr, sn.namespace, sn.addr
    );
    let limit = args
        .duration
        .map(|s| Duration::from_secs_f64(s.clamp(0.0, 1e9)));
    wait_for_signal(&set, limit);
    let report = match emu.stop() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cobalt-linkem: the link failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let json = serde_json::to_string_pretty(&report).expect("the report serializes");
    match &args.stats {
        Some(p) => {
            if let Err(e) = std::fs::write(p, json + "\n") {
                eprintln!("cobalt-linkem: cannot write {}: {e}", p.display());
                return ExitCode::FAILURE;
            }
        }
        None => println!("{json}"),
    }
    ExitCode::SUCCESS
}

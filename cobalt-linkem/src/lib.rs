//! `cobalt-linkem`: a constrained-link emulator for Linux.
//!
//! Two network namespaces (a client side and a server side) are joined by a TUN
//! device in each and one thread that moves IP packets between them through
//! [`cobalt_proto::sim::link`]: per direction a rate, a propagation delay, a drop-tail
//! queue limited in bytes, extra delay U(a, b) that never reorders, and Bernoulli or
//! time-driven Gilbert–Elliott loss, all seeded. The kernel needs no netem: only TUN,
//! network namespaces and iproute2, and root.
//!
//! ```no_run
//! use cobalt_linkem::emulator::{Config, Emulator};
//! use cobalt_proto::sim::link::{LinkConfig, LossModel};
//!
//! let emu = Emulator::start(Config::new(LinkConfig::paper(2500, LossModel::None), 1))?;
//! // Sockets opened on threads inside the namespaces talk over the link:
//! let server = emu.server_ns().spawn(|| std::net::UdpSocket::bind("10.78.2.1:5683"))?;
//! // ... `ip netns exec <emu.client_ns().name()> cobalt get coap://10.78.2.1/...` works too.
//! let report = emu.stop()?;
//! println!("{}", serde_json::to_string_pretty(&report).unwrap());
//! # drop(server);
//! # Ok::<(), std::io::Error>(())
//! ```
#![warn(missing_docs)]

pub mod emulator;
pub mod log;
pub mod netns;
pub mod tun;

/// Whether this machine can run the emulator: root, `/dev/net/tun` and iproute2.
pub fn unavailable() -> Option<&'static str> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("the emulator needs root (network namespaces, TUN devices)");
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("the emulator needs /dev/net/tun");
    }
    let ip = std::process::Command::new("ip")
        .arg("-V")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    if ip.is_err() {
        return Some("the emulator needs iproute2 (`ip`)");
    }
    None
}

/// For tests that need the emulator: true if it can run here (root, TUN, iproute2, and
/// a network namespace can be made); otherwise false with a note on stderr, or a panic
/// when COBALT_REQUIRE_NETNS=1 says that this machine must run them. The interop
/// switch COBALT_REQUIRE_PEERS does not cover them: a CI container without
/// CAP_NET_ADMIN runs every other test.
pub fn ready_for_tests() -> bool {
    let why = unavailable().or_else(|| {
        (!can_make_namespace())
            .then_some("the emulator needs to create network namespaces (CAP_NET_ADMIN)")
    });
    let Some(why) = why else {
        return true;
    };
    let required = std::env::var("COBALT_REQUIRE_NETNS").is_ok_and(|v| v == "1");
    assert!(!required, "{why}");
    eprintln!("skipped: {why}");
    false
}

/// Creates and removes a throwaway network namespace.
fn can_make_namespace() -> bool {
    // Tests of one binary run in parallel in one process: a name per call.
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("lemprobe{}x{call}", std::process::id());
    let run = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let made = run(&["netns", "add", &name]);
    if made {
        run(&["netns", "del", &name]);
    }
    made
}

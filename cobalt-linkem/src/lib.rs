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

/// For tests that need the emulator: true if it can run here; otherwise false with a
/// note, or a panic when COBALT_REQUIRE_NETNS=1 or COBALT_REQUIRE_PEERS=1 says that
/// this machine (CI) must run them.
pub fn ready_for_tests() -> bool {
    let Some(why) = unavailable() else {
        return true;
    };
    let required = ["COBALT_REQUIRE_NETNS", "COBALT_REQUIRE_PEERS"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|v| v == "1"));
    assert!(!required, "{why}");
    eprintln!("skipped: {why}");
    false
}

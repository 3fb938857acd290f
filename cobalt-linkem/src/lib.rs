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

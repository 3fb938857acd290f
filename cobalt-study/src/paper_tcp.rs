//! The paper's TCP (§IV-B: Linux with CUBIC, a 2 s initial RTO, delayed ACKs on a
//! 200 ms timer, RTO at most 120 s, 40 SYN retries), set for the study's namespaces
//! and sockets as far as this kernel allows.
//!
//! | the paper's | how it is set here |
//! |---|---|
//! | CUBIC | `congctl lock cubic` on the route through the link in both namespaces: a namespace may not choose CUBIC with `net.ipv4.tcp_congestion_control` unless the host lists it in `tcp_allowed_congestion_control`, a route may |
//! | initial RTO 2 s | a BPF sock_ops program answering `BPF_SOCK_OPS_TIMEOUT_INIT` ([`crate::sockops`]); no sysctl or route attribute sets it |
//! | maximum RTO 120 s | `net.ipv4.tcp_rto_max_ms=120000` |
//! | 40 SYN (and SYN-ACK) retries, backed off exponentially | `tcp_syn_retries=40`, `tcp_synack_retries=40`, and `tcp_syn_linear_timeouts=0` (Linux 6.16+ retries the first 4 SYNs without backing off) |
//! | delayed ACK on a constant 200 ms timer | **not settable**: Linux starts the delayed-ACK timeout at 40 ms (`TCP_ATO_MIN`, HZ/25, a compile-time constant), adapts it to the inter-arrival time and enters quick-ACK mode at the start of a connection; 200 ms is only its upper bound (`TCP_DELACK_MAX`, kept). No sysctl, route attribute or BPF socket option raises the floor (`TCP_BPF_DELACK_MAX` and route `rto_min` only lower the ceiling). |
//! | the paper's header sizes | `tcp_timestamps=0` |
//!
//! After a handshake whose SYN or SYN-ACK was retransmitted, Linux starts the
//! connection with a 3 s RTO (`TCP_TIMEOUT_FALLBACK`, RFC 6298 §5.7), as the paper's
//! kernel did.

use crate::sockops::{self, InitialRto};
use cobalt_linkem::emulator::Config;
use cobalt_linkem::netns::Namespace;
use std::io;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// The paper's initial retransmission timeout.
pub const INITIAL_RTO: Duration = Duration::from_secs(2);
/// The paper's largest retransmission timeout.
pub const MAX_RTO: Duration = Duration::from_secs(120);
/// The paper's SYN (and SYN-ACK) retries.
pub const SYN_RETRIES: u32 = 40;
/// The congestion control of the paper's Linux.
pub const CONGESTION_CONTROL: &str = "cubic";

/// Sysctls of both namespaces.
pub fn sysctls() -> Vec<String> {
    vec![
        "net.ipv4.tcp_timestamps=0".into(),
        format!("net.ipv4.tcp_syn_retries={SYN_RETRIES}"),
        format!("net.ipv4.tcp_synack_retries={SYN_RETRIES}"),
        "net.ipv4.tcp_syn_linear_timeouts=0".into(),
        format!("net.ipv4.tcp_rto_max_ms={}", MAX_RTO.as_millis()),
    ]
}

/// Attributes of the route through the link in both namespaces.
pub fn route_attributes() -> Vec<String> {
    ["congctl", "lock", CONGESTION_CONTROL]
        .map(String::from)
        .to_vec()
}

/// Sets the paper's TCP on an emulator's configuration (sysctls, then the route
/// attributes); the initial RTO also needs [`initial_rto`] once the namespaces exist.
pub fn configure(config: &mut Config) {
    config.sysctls.splice(0..0, sysctls());
    config.route_attributes = route_attributes();
}

/// The initial RTO in force for this process's TCP sockets while a returned handle
/// lives: one sock_ops program for the whole process, shared by concurrent runs.
/// `ns` is any namespace of the study (to read the kernel's jiffy in).
pub fn initial_rto(ns: &Namespace) -> io::Result<Arc<InitialRto>> {
    static INSTALLED: Mutex<Weak<InitialRto>> = Mutex::new(Weak::new());
    let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(live) = installed.upgrade() {
        return Ok(live);
    }
    let live = Arc::new(InitialRto::install(INITIAL_RTO, sockops::jiffy(ns)?)?);
    *installed = Arc::downgrade(&live);
    Ok(live)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sysctls_name_the_papers_values() {
        let s = sysctls();
        assert!(s.contains(&"net.ipv4.tcp_syn_retries=40".to_string()));
        assert!(s.contains(&"net.ipv4.tcp_rto_max_ms=120000".to_string()));
        assert!(s.contains(&"net.ipv4.tcp_syn_linear_timeouts=0".to_string()));
        assert_eq!(route_attributes(), ["congctl", "lock", "cubic"]);
    }
}

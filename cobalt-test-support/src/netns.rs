//! Tests that need network namespaces (root, iproute2, CAP_NET_ADMIN): whether they can
//! run here. Where they cannot, a test is skipped with a note, or fails when
//! COBALT_REQUIRE_NETNS=1 says that this machine must run them (the interop switch
//! COBALT_REQUIRE_PEERS does not cover them: a CI container without CAP_NET_ADMIN runs
//! every other test).

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// True if `what` (e.g. "the cluster test") can run here: running as root, every one
/// of `tools` on the PATH, and a network namespace can be made and removed. Otherwise
/// false with a note on stderr, or a panic under COBALT_REQUIRE_NETNS=1.
pub fn ready(what: &str, tools: &[&str]) -> bool {
    let Some(why) = unavailable(what, tools) else {
        return true;
    };
    let required = std::env::var("COBALT_REQUIRE_NETNS").is_ok_and(|v| v == "1");
    assert!(!required, "{why} and COBALT_REQUIRE_NETNS=1");
    eprintln!("skipped: {why}");
    false
}

/// Why `what` cannot run here, if it cannot.
fn unavailable(what: &str, tools: &[&str]) -> Option<String> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    if !root {
        return Some(format!("{what} needs root (network namespaces)"));
    }
    for tool in std::iter::once(&"ip").chain(tools) {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Some(format!(
                "{what} needs {tool} (scripts/install-test-deps.sh installs it)"
            ));
        }
    }
    // Tests of one binary run in parallel in one process: a name per call.
    static PROBES: AtomicUsize = AtomicUsize::new(0);
    let n = PROBES.fetch_add(1, Ordering::Relaxed);
    let probe = format!("cbprobe{}-{n}", std::process::id());
    let made = Command::new("ip")
        .args(["netns", "add", &probe])
        .status()
        .is_ok_and(|s| s.success());
    if !made {
        return Some(format!(
            "{what} cannot create network namespaces (ip netns add: CAP_NET_ADMIN)"
        ));
    }
    let _ = Command::new("ip").args(["netns", "del", &probe]).status();
    None
}

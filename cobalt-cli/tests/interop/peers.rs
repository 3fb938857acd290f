//! Locating the real CoAP peers (libcoap's CLI tools, aiocoap), starting servers on
//! free loopback ports, and running commands with a bounded wall-clock time.
//!
//! Every process started here is owned by a guard that kills it on drop, so a
//! failing (panicking) test leaves nothing running.

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

pub const V4: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
pub const V6: IpAddr = IpAddr::V6(Ipv6Addr::LOCALHOST);

/// Upper bound for any single peer command; the tools have their own, shorter limits.
pub const COMMAND_LIMIT: Duration = Duration::from_secs(30);

/// The workspace root (where `scripts/` and `tests/peers/` live).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cobalt-cli lives inside the workspace")
        .to_path_buf()
}

/// The `cobalt` binary built for these tests.
pub fn cobalt_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cobalt"))
}

/// Decides what happens when a peer is missing: a failure under
/// `COBALT_REQUIRE_PEERS=1`, otherwise a note on stderr and `None` (the test returns).
pub fn require(what: &str, found: Option<PathBuf>) -> Option<PathBuf> {
    if found.is_some() {
        return found;
    }
    let hint = "run scripts/install-test-deps.sh to install the interop peers";
    if std::env::var("COBALT_REQUIRE_PEERS").is_ok_and(|v| v == "1") {
        panic!("{what} is not installed and COBALT_REQUIRE_PEERS=1: {hint}");
    }
    eprintln!(
        "SKIPPED: {what} not found ({hint}; set COBALT_REQUIRE_PEERS=1 to make this a failure)"
    );
    None
}

/// Unwraps a peer or returns from the test (after [`require`] printed the skip note).
macro_rules! need {
    ($what:expr, $found:expr) => {
        match $crate::peers::require($what, $found) {
            Some(p) => p,
            None => return,
        }
    };
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// libcoap's `coap-client-notls`.
pub fn libcoap_client() -> Option<PathBuf> {
    on_path("coap-client-notls")
}

/// libcoap's `coap-server-notls`.
pub fn libcoap_server() -> Option<PathBuf> {
    on_path("coap-server-notls")
}

/// The directory holding aiocoap's scripts: `$COBALT_AIOCOAP_BIN` or `<repo>/.venv-peers/bin`.
fn aiocoap_bin_dir() -> PathBuf {
    match std::env::var_os("COBALT_AIOCOAP_BIN") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => repo_root().join(".venv-peers").join("bin"),
    }
}

/// `aiocoap-client`.
pub fn aiocoap_client() -> Option<PathBuf> {
    Some(aiocoap_bin_dir().join("aiocoap-client")).filter(|p| is_executable(p))
}

/// The Python interpreter that has aiocoap installed (next to `aiocoap-client`).
pub fn aiocoap_python() -> Option<PathBuf> {
    let dir = aiocoap_bin_dir();
    aiocoap_client()?;
    ["python3", "python"]
        .iter()
        .map(|n| dir.join(n))
        .find(|p| is_executable(p))
}

/// A port that was free a moment ago on `ip` (UDP). Another process may take it
/// before we use it, which is why servers are started with a retry.
pub fn free_udp_port(ip: IpAddr) -> u16 {
    let sock = UdpSocket::bind(SocketAddr::new(ip, 0)).expect("bind an ephemeral UDP port");
    sock.local_addr().expect("local address").port()
}

/// A child process killed (and reaped) when dropped.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
}

impl ChildGuard {
    pub fn spawn(what: &str, cmd: &mut Command) -> ChildGuard {
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what} ({cmd:?}): {e}"));
        ChildGuard { child }
    }

    /// The child's stdout, if it was piped and not taken yet (for `californium.rs`,
    /// which not every test crate that includes this file includes).
    #[allow(dead_code)]
    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.child.stdout.take()
    }

    /// `Some(status)` if the process already ended.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// A running server peer.
#[derive(Debug)]
pub struct PeerServer {
    pub addr: SocketAddr,
    _child: ChildGuard,
}

impl PeerServer {
    /// `coap://addr` (IPv6 literals in brackets).
    pub fn base(&self) -> String {
        format!("coap://{}", self.addr)
    }

    /// `coap://addr/path` — `path` starts with `/`.
    pub fn uri(&self, path: &str) -> String {
        format!("{}{path}", self.base())
    }
}

/// Starts a server with `make(port)` and polls `probe_path` until it answers.
/// A server that exits at once (port taken meanwhile) is retried on another port.
fn start_server(
    what: &str,
    ip: IpAddr,
    probe_path: &str,
    make: impl Fn(u16) -> Command,
) -> PeerServer {
    let client = cobalt::client::blocking::Client::new();
    for _attempt in 0..3 {
        let port = free_udp_port(ip);
        let mut cmd = make(port);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = ChildGuard::spawn(what, &mut cmd);
        let addr = SocketAddr::new(ip, port);
        let probe = format!("coap://{addr}{probe_path}");
        // Bounded: 50 probes of at most ~200 ms each.
        for _ in 0..50 {
            if child.exited().is_some() {
                break;
            }
            let answered = client
                .request(
                    cobalt::Code::GET,
                    &probe,
                    Vec::new(),
                    Duration::from_millis(200),
                )
                .is_ok();
            if answered {
                return PeerServer {
                    addr,
                    _child: child,
                };
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
    panic!("{what} did not start answering GET {probe_path} on {ip} (3 attempts)");
}

/// `cobalt serve --plugtest` on `ip` (both the demo and the plugtest resources).
pub fn start_cobalt(ip: IpAddr) -> PeerServer {
    start_cobalt_with(ip, &[])
}

/// `cobalt serve --plugtest ARGS` on `ip`.
pub fn start_cobalt_with(ip: IpAddr, args: &[&str]) -> PeerServer {
    start_server("cobalt serve", ip, "/benchmark", |port| {
        let mut c = Command::new(cobalt_bin());
        c.args(["serve", "--plugtest", "--bind"])
            .arg(ip.to_string())
            .arg("--port")
            .arg(port.to_string())
            .args(args);
        c
    })
}

/// libcoap's example server on 127.0.0.1, allowing 10 resources created by PUT (`-d 10`).
pub fn start_libcoap_server(bin: &Path) -> PeerServer {
    start_server("coap-server-notls", V4, "/", |port| {
        let mut c = Command::new(bin);
        c.args(["-d", "10", "-A", "127.0.0.1", "-p"])
            .arg(port.to_string());
        c
    })
}

/// libcoap's example server on 127.0.0.1 with extra arguments, ready once its port
/// is bound — no request is sent to it first, so e.g. `-l 1` (drop the first datagram
/// it sends) applies to the test's own first exchange.
pub fn start_libcoap_server_quietly(bin: &Path, extra: &[&str]) -> PeerServer {
    start_libcoap_server_bound(bin, extra, Stdio::null)
}

/// [`start_libcoap_server_quietly`] writing its log (stdout, e.g. with `-v 7`) to `log`.
#[allow(dead_code)] // interop_observe.rs uses it, interop.rs does not
pub fn start_libcoap_server_logging(bin: &Path, extra: &[&str], log: &Path) -> PeerServer {
    start_libcoap_server_bound(bin, extra, || {
        Stdio::from(std::fs::File::create(log).expect("create the log file"))
    })
}

fn start_libcoap_server_bound(
    bin: &Path,
    extra: &[&str],
    stdout: impl Fn() -> Stdio,
) -> PeerServer {
    for _attempt in 0..3 {
        let port = free_udp_port(V4);
        let mut cmd = Command::new(bin);
        cmd.args(extra)
            .args(["-A", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(stdout())
            .stderr(Stdio::null());
        let mut child = ChildGuard::spawn("coap-server-notls", &mut cmd);
        let addr = SocketAddr::new(V4, port);
        for _ in 0..50 {
            if child.exited().is_some() {
                break;
            }
            // Our own bind fails once the server holds the port.
            if UdpSocket::bind(addr).is_err() {
                return PeerServer {
                    addr,
                    _child: child,
                };
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
    panic!("coap-server-notls did not bind a port (3 attempts)");
}

/// `tests/peers/aiocoap_server.py` on 127.0.0.1.
pub fn start_aiocoap_server(python: &Path) -> PeerServer {
    let script = repo_root().join("tests/peers/aiocoap_server.py");
    assert!(script.is_file(), "missing {}", script.display());
    start_server("aiocoap_server.py", V4, "/hello", |port| {
        let mut c = Command::new(python);
        c.arg(&script)
            .args(["--bind", "127.0.0.1", "--port"])
            .arg(port.to_string());
        c
    })
}

/// What a finished command left behind.
#[derive(Debug)]
pub struct Ran {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    /// Exit code (`None` if killed by a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Panics (with everything the command printed) unless it exited 0.
    pub fn ok(self) -> Ran {
        assert!(self.status.success(), "command failed: {self:#?}");
        self
    }
}

/// Runs `cmd` to completion with a wall-clock limit; on timeout it is killed and
/// the test fails with what it printed so far.
pub fn run(cmd: &mut Command, limit: Duration) -> Ran {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let shown = format!("{cmd:?}");
    let mut child = ChildGuard::spawn(&shown, cmd);
    let out = drain(child.child.stdout.take());
    let err = drain(child.child.stderr.take());
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.exited() {
            break s;
        }
        if Instant::now() > deadline {
            drop(child);
            let stdout = out.join().unwrap_or_default();
            let stderr = err.join().unwrap_or_default();
            panic!("{shown} ran longer than {limit:?}\nstdout: {stdout}\nstderr: {stderr}");
        }
        thread::sleep(Duration::from_millis(10));
    };
    Ran {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        String::from_utf8_lossy(&buf).into_owned()
    })
}

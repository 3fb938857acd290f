//! Californium as a peer: `tests/peers/californium` (californium-core from Maven
//! Central), built by `scripts/install-test-deps.sh`. Its `CfPeer` program runs as a
//! server or as a client and prints one event per line (`WORD key=value ...`);
//! [`Events`] collects them while it runs.

use super::{on_path, repo_root, require};
use crate::process::ChildGuard;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// How long a Californium client command may take (JVM start included).
pub const CF_LIMIT: Duration = Duration::from_secs(60);

/// `java` and the class path of the built peer, if both are there.
fn find() -> Option<PathBuf> {
    let classpath = repo_root().join("tests/peers/californium/target/classpath.txt");
    on_path("java").and(classpath.is_file().then_some(classpath))
}

/// The Californium peer or, when it is missing, `None` after [`require`] has said so
/// (or panicked under `COBALT_REQUIRE_PEERS=1`).
pub fn need() -> Option<Californium> {
    require(
        "Californium peer (java and tests/peers/californium built by Maven)",
        find(),
    )
    .map(|classpath| Californium { classpath })
}

/// The built Californium peer.
#[derive(Debug, Clone)]
pub struct Californium {
    classpath: PathBuf,
}

impl Californium {
    /// `java -cp ... org.cobalt.peers.CfPeer ARGS`.
    pub fn command(&self, args: &[&str]) -> Command {
        self.program("CfPeer", args)
    }

    /// `java -cp ... org.cobalt.peers.PROGRAM ARGS`: another program of the peer
    /// (e.g. `CidClient`, Scandium with a DTLS Connection ID).
    pub fn program(&self, program: &str, args: &[&str]) -> Command {
        let jars = std::fs::read_to_string(&self.classpath).expect("read classpath.txt");
        let classes = repo_root().join("tests/peers/californium/target/classes");
        let mut c = Command::new("java");
        c.arg("-cp")
            .arg(format!("{}:{}", classes.display(), jars.trim()))
            .arg(format!("org.cobalt.peers.{program}"))
            .args(args);
        c
    }

    /// Runs `PROGRAM ARGS` to its end (bounded by [`CF_LIMIT`]); its event lines.
    pub fn run_program(&self, program: &str, args: &[&str]) -> Vec<String> {
        let mut ev = Events::spawn(&mut self.program(program, args));
        ev.wait_exit(CF_LIMIT);
        ev.lines()
    }

    /// Starts `CfPeer ARGS` and collects what it prints.
    pub fn spawn(&self, args: &[&str]) -> Events {
        Events::spawn(&mut self.command(args))
    }

    /// Runs a client command to its end (bounded by [`CF_LIMIT`]); its event lines.
    pub fn run(&self, args: &[&str]) -> Vec<String> {
        let mut ev = self.spawn(args);
        ev.wait_exit(CF_LIMIT);
        ev.lines()
    }

    /// Starts the Californium server (`CfPeer server ARGS`) and waits until it is ready.
    pub fn server(&self, args: &[&str]) -> CfServer {
        let mut full = vec!["server"];
        full.extend_from_slice(args);
        let events = self.spawn(&full);
        let ready = events.wait_for("the Californium server to start", CF_LIMIT, |l| {
            l.starts_with("READY ")
        });
        let port: u16 = ready["READY ".len()..].trim().parse().expect("READY port");
        CfServer {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            events,
        }
    }
}

/// A running Californium server.
pub struct CfServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// What it printed so far.
    pub events: Events,
}

impl CfServer {
    /// `coap://addr/path`.
    pub fn uri(&self, path: &str) -> String {
        format!("coap://{}{path}", self.addr)
    }
}

/// A running (or finished) `CfPeer` and the lines it printed on stdout.
pub struct Events {
    child: ChildGuard,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<thread::JoinHandle<()>>,
    shown: String,
}

impl Events {
    fn spawn(cmd: &mut Command) -> Events {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let shown = format!("{cmd:?}");
        let mut child = ChildGuard::spawn("Californium peer", cmd);
        let stdout = child.take_stdout().expect("piped stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
        Events {
            child,
            lines,
            reader: Some(reader),
            shown,
        }
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits until a line matches `pred` (checking every 20 ms), up to `limit`; the
    /// first matching line. Panics with everything printed so far on timeout.
    pub fn wait_for(&self, what: &str, limit: Duration, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(l) = self.lines().into_iter().find(|l| pred(l)) {
                return l;
            }
            assert!(
                Instant::now() < deadline,
                "waited {limit:?} for {what}: {}\n{:#?}",
                self.shown,
                self.lines()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the process to exit, up to `limit`, and for its output to be read.
    pub fn wait_exit(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.child.exited().is_none() {
            assert!(
                Instant::now() < deadline,
                "{} ran longer than {limit:?}: {:#?}",
                self.shown,
                self.lines()
            );
            thread::sleep(Duration::from_millis(20));
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// The value of `key=` in an event line (up to the next space), if present.
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!(" {key}=");
    let start = line.find(&pat)? + pat.len();
    let rest = &line[start..];
    Some(rest.split(' ').next().unwrap_or(rest))
}

/// The payload printed after ` payload=` (the rest of the line), unescaped for `\n`
/// and `\\`.
pub fn payload_of(line: &str) -> Option<String> {
    let start = line.find(" payload=")? + " payload=".len();
    Some(unescape(&line[start..]))
}

/// Undoes CfPeer's escaping of `\n` and `\\` (other escapes stay as printed).
pub fn unescape(s: &str) -> String {
    s.replace("\\n", "\n").replace("\\\\", "\\")
}

/// The bytes `CfPeer --payload-size n` sends: the letters a..z repeated.
pub fn letters(n: usize) -> Vec<u8> {
    (0..n).map(|i| b'a' + (i % 26) as u8).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_lines_are_read_by_key() {
        let line = "RESPONSE code=2.05 mid=7 payload=a b\\nc\\\\d";
        assert_eq!(field(line, "code"), Some("2.05"));
        assert_eq!(field(line, "mid"), Some("7"));
        assert_eq!(field(line, "token"), None);
        assert_eq!(payload_of(line).as_deref(), Some("a b\nc\\d"));
        assert_eq!(letters(28), b"abcdefghijklmnopqrstuvwxyzab");
    }
}

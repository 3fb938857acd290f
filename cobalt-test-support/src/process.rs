//! Child processes owned by guards that kill them on drop (so a failing test leaves
//! nothing running), and commands run to completion with a wall-clock limit.

use std::io::Read;
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// A child process killed (and reaped) when dropped.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
}

impl ChildGuard {
    /// Starts `cmd`; panics naming `what` if it cannot.
    pub fn spawn(what: &str, cmd: &mut Command) -> ChildGuard {
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what} ({cmd:?}): {e}"));
        ChildGuard { child }
    }

    /// Guards a child started elsewhere.
    pub fn new(child: Child) -> ChildGuard {
        ChildGuard { child }
    }

    /// The child, e.g. to take its piped stderr.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// The child's stdout, if it was piped and not taken yet.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
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

/// What a finished command left behind.
#[derive(Debug)]
pub struct Ran {
    /// How it ended.
    pub status: ExitStatus,
    /// Its standard output (lossy UTF-8).
    pub stdout: String,
    /// Its standard error (lossy UTF-8).
    pub stderr: String,
}

impl Ran {
    /// Exit code (`None` if killed by a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Panics (with everything the command printed) unless it exited 0.
    pub fn ok(self) -> Ran {
        assert!(self.status.success(), "command failed: {self}");
        self
    }

    /// Panics (with everything the command printed) unless stdout contains `want`.
    pub fn assert_stdout_has(&self, want: &str) {
        assert!(self.stdout.contains(want), "no {want:?} on stdout: {self}");
    }
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}\nstdout: {}\nstderr: {}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Runs `cmd` to completion (stdin closed, stdout and stderr collected) with a
/// wall-clock limit; past it the command is killed and the test fails with what it
/// printed so far.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_collects_output_and_status() {
        let r = run(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(10),
        );
        assert_eq!(
            (r.code(), r.stdout.as_str(), r.stderr.as_str()),
            (Some(3), "out\n", "err\n")
        );
        r.assert_stdout_has("out");
    }

    #[test]
    #[should_panic(expected = "ran longer than")]
    fn run_kills_a_command_past_its_limit() {
        run(Command::new("sleep").arg("30"), Duration::from_millis(100));
    }

    #[test]
    fn a_guard_kills_its_child_on_drop() {
        let mut guard = ChildGuard::spawn("sleep", Command::new("sleep").arg("30"));
        let pid = guard.child().id();
        assert!(guard.exited().is_none());
        drop(guard);
        // Killed and reaped: the process is gone.
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }
}

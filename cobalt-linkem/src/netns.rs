//! Network namespaces: created and deleted with iproute2 (`ip netns`), entered per
//! thread with `setns(2)`.
//!
//! A namespace is entered by one thread only; threads it starts afterwards inherit it.
//! So code that must open sockets inside a namespace runs on a thread of its own:
//! [`Namespace::spawn`].

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Where `ip netns` keeps its namespaces.
const NETNS_DIR: &str = "/var/run/netns";
/// Prefix of the namespaces this crate creates: `lem<pid>x<n><role>`.
pub const PREFIX: &str = "lem";

/// Runs `ip` with `args`; the error says what failed and what `ip` printed.
pub fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            io::Error::new(e.kind(), format!("cannot run `ip` (install iproute2): {e}"))
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "`ip {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// Runs `ip` and returns what it printed.
pub fn ip_output(args: &[&str]) -> io::Result<String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A network namespace this process created; deleted when dropped.
#[derive(Debug)]
pub struct Namespace {
    name: String,
}

/// A name no other namespace of this process uses: `lem<pid>x<n><role>`.
pub fn unique_name(role: char) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{PREFIX}{}x{n}{role}", std::process::id())
}

impl Namespace {
    /// Creates the namespace `name` with its loopback up.
    pub fn create(name: &str) -> io::Result<Namespace> {
        if name.is_empty() || name.len() > 64 || name.contains('/') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad namespace name `{name}`"),
            ));
        }
        ip(&["netns", "add", name])?;
        let ns = Namespace {
            name: name.to_string(),
        };
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Its name (for `ip netns exec NAME ...`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sets a sysctl (`net.ipv4.tcp_timestamps=0`) inside the namespace.
    pub fn sysctl(&self, setting: &str) -> io::Result<()> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.name, "sysctl", "-q", "-w", setting])
            .stdin(Stdio::null())
            .output()?;
        if out.status.success() {
            return Ok(());
        }
        Err(io::Error::other(format!(
            "cannot set {setting} in {}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }

    /// Moves the calling thread into the namespace for good.
    pub fn enter(&self) -> io::Result<()> {
        enter(&self.name)
    }

    /// Runs `f` on a new thread inside the namespace (sockets it opens, and threads
    /// it starts, live there).
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> io::Result<std::thread::JoinHandle<io::Result<T>>> {
        let name = self.name.clone();
        std::thread::Builder::new()
            .name(format!("netns-{name}"))
            .spawn(move || {
                enter(&name)?;
                Ok(f())
            })
    }

    /// Runs `f` inside the namespace on a new thread and waits for it.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
        self.spawn(f)?
            .join()
            .map_err(|_| io::Error::other("the thread in the namespace panicked"))?
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Moves the calling thread into the namespace called `name`.
pub fn enter(name: &str) -> io::Result<()> {
    let f = File::open(format!("{NETNS_DIR}/{name}"))
        .map_err(|e| io::Error::new(e.kind(), format!("no network namespace {name}: {e}")))?;
    // SAFETY: setns on an open namespace file descriptor; affects this thread only.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("cannot enter network namespace {name}: {e}"),
        ));
    }
    Ok(())
}

/// The calling thread's network namespace, to return to later.
pub fn current() -> io::Result<OwnedFd> {
    Ok(File::open("/proc/thread-self/ns/net")?.into())
}

/// Moves the calling thread back into a namespace saved with [`current`].
pub fn restore(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: setns on an open namespace file descriptor.
    if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Deletes namespaces left behind by emulators whose process is gone (killed with
/// SIGKILL, for instance); returns their names.
pub fn remove_stale() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if pid != std::process::id()
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            && ip(&["netns", "del", &name]).is_ok()
        {
            removed.push(name);
        }
    }
    removed
}

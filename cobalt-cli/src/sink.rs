//! Where the commands write their answers: standard output, where a reader that goes
//! away (`cobalt observe … | head -1`) ends the command quietly instead of panicking or
//! running on, or the file of `-o FILE`. Any other write failure is an error with exit
//! code 1.

use crate::exit;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

/// The destination of a request command's answer (`-o FILE`, `-o -`, or stdout).
#[derive(Debug)]
pub struct Output {
    file: Option<(PathBuf, std::fs::File)>,
    /// `-o -`: standard output, even binary data on a terminal.
    forced: bool,
}

impl Output {
    /// Opens the destination: `None` for standard output, `-` for standard output
    /// even on a terminal, else a file created (or truncated) now, so that a path that
    /// cannot be written fails before the request is sent.
    pub fn open(path: Option<&Path>) -> Result<Output, (i32, String)> {
        match path {
            None => Ok(Output {
                file: None,
                forced: false,
            }),
            Some(p) if p == Path::new("-") => Ok(Output {
                file: None,
                forced: true,
            }),
            Some(p) => std::fs::File::create(p)
                .map(|f| Output {
                    file: Some((p.to_path_buf(), f)),
                    forced: false,
                })
                .map_err(|e| (exit::FAILURE, format!("cannot write {}: {e}", p.display()))),
        }
    }

    /// Whether the answer goes to a terminal that binary data would garble (not with
    /// `-o -`).
    pub fn is_terminal(&self) -> bool {
        self.file.is_none() && !self.forced && std::io::stdout().is_terminal()
    }

    /// Writes `bytes`; see [`write_stdout`] for the result.
    pub fn write(&mut self, bytes: &[u8]) -> Result<bool, (i32, String)> {
        match &mut self.file {
            None => write_stdout(bytes),
            Some((path, file)) => file.write_all(bytes).map(|()| true).map_err(|e| {
                (
                    exit::FAILURE,
                    format!("cannot write {}: {e}", path.display()),
                )
            }),
        }
    }
}

/// Writes `bytes` to standard output and flushes. `Ok(true)`: written; `Ok(false)`:
/// the reader has gone away (broken pipe), so the command should end quietly; `Err`:
/// another failure (e.g. a full disk), as an exit code and a message.
pub fn write_stdout(bytes: &[u8]) -> Result<bool, (i32, String)> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err((
            exit::FAILURE,
            format!("cannot write to standard output: {e}"),
        )),
    }
}

/// Resolves once standard output is a pipe whose reader has gone away, or a terminal
/// that hung up (never for a file): lets a command that waits (`observe`) end at once
/// rather than at its next write.
pub async fn stdout_closed() {
    let (tx, rx) = tokio::sync::oneshot::channel();
    // poll(2) with no events still reports POLLERR (no reader), POLLHUP and POLLNVAL.
    // A thread of its own: the process exits without waiting for it.
    let watcher = std::thread::Builder::new()
        .name("stdout-watch".into())
        .spawn(move || loop {
            let mut fd = libc::pollfd {
                fd: libc::STDOUT_FILENO,
                events: 0,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut fd, 1, -1) };
            if n > 0 && fd.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                let _ = tx.send(());
                return;
            }
            if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return;
            }
        });
    if watcher.is_err() || rx.await.is_err() {
        std::future::pending::<()>().await;
    }
}

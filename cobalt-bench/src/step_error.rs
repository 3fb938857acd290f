//! Why a benchmark step could not run.

/// Who is to blame for a step that could not run (the command maps it to its exit
/// code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// The server (or a worker) could not be reached or set up with: a refused
    /// connection, a failed handshake, an unreachable worker.
    Network,
    /// This machine: sockets, threads, file descriptors.
    Local,
}

/// Why a step could not run, and who is to blame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepError {
    /// The server's side or this machine.
    pub blame: Blame,
    /// What failed and what to check.
    pub message: String,
}

impl StepError {
    /// The server (or a worker) could not be reached or refused the session.
    pub fn network(message: impl Into<String>) -> StepError {
        StepError {
            blame: Blame::Network,
            message: message.into(),
        }
    }
}

impl From<String> for StepError {
    /// A failure on this machine (sockets, threads, file descriptors).
    fn from(message: String) -> StepError {
        StepError {
            blame: Blame::Local,
            message,
        }
    }
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

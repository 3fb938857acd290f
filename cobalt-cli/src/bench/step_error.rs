//! Why a benchmark step could not run.

use crate::exit;

/// Why a step could not run, with the exit code it means (see [`crate::exit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepError {
    /// [`exit::NETWORK`] when the server could not be reached or set up with (refused
    /// connection, failed handshake, unreachable worker), else [`exit::FAILURE`].
    pub exit: i32,
    /// What failed and what to check.
    pub message: String,
}

impl StepError {
    /// The server (or a worker) could not be reached or refused the session.
    pub fn network(message: impl Into<String>) -> StepError {
        StepError {
            exit: exit::NETWORK,
            message: message.into(),
        }
    }
}

impl From<String> for StepError {
    /// A failure on this machine (sockets, threads, file descriptors).
    fn from(message: String) -> StepError {
        StepError {
            exit: exit::FAILURE,
            message,
        }
    }
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

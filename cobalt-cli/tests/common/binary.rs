//! Running the real `cobalt` binary from integration tests.

use std::process::{Child, Command};

/// Kills the process (a server) when the test ends, passed or failed.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A command running the `cobalt` binary under test, without the caller's RUST_LOG.
pub fn cobalt() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cobalt"));
    c.env_remove("RUST_LOG");
    c
}

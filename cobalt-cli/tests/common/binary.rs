//! Running the real `cobalt` binary from integration tests.
#![allow(dead_code)] // each test file uses a part

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

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

/// Starts a server (`command`, e.g. `cobalt().args(["serve", ...])`) and waits until it
/// prints a line containing `ready` on stderr; its stderr is drained from then on, so
/// that it never blocks on a full pipe.
pub fn serve_until(mut command: Command, ready: &str) -> KillOnDrop {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let server = KillOnDrop(child);
    let mut lines = BufReader::new(stderr).lines().map_while(Result::ok);
    let up = lines.by_ref().any(|l| l.contains(ready));
    assert!(up, "the server never printed {ready:?}");
    std::thread::spawn(move || lines.for_each(drop));
    server
}

/// Writes a fresh CA (`cn` names it) and the server and client certificates it issued
/// to `dir`: ca.pem, server.pem, server.key, client.pem, client.key.
pub fn write_test_pki(dir: &Path, cn: &str) {
    let pki = cobalt::transport::dtls::test_pki::generate(cn).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    for (name, pem) in [
        ("ca.pem", &pki.ca_pem),
        ("server.pem", &pki.server.cert_chain_pem),
        ("server.key", &pki.server.key_pem),
        ("client.pem", &pki.client.cert_chain_pem),
        ("client.key", &pki.client.key_pem),
    ] {
        std::fs::write(dir.join(name), pem).unwrap();
    }
}

//! Helpers shared by the interoperability tests: finding peer programs (skipping a
//! test with a `SKIPPED:` note when one is missing, unless `COBALT_REQUIRE_PEERS=1`)
//! and running them with a time limit.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The peer program, or `None` (after a note) if the test should be skipped.
pub fn peer(name: &str, extra: &[PathBuf]) -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let found = extra.iter().cloned().chain(on_path).find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var("COBALT_REQUIRE_PEERS").as_deref() != Ok("1"),
            "{name} not found and COBALT_REQUIRE_PEERS=1"
        );
        eprintln!(
            "SKIPPED: {name} not found (run scripts/install-test-deps.sh; \
             set COBALT_REQUIRE_PEERS=1 to make this a failure)"
        );
    }
    found
}

pub fn aiocoap(script: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("COBALT_AIOCOAP_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv-peers/bin"));
    peer(script, &[dir.join(script)])
}

/// Runs a peer program off the async threads, killing it after `limit`.
pub async fn run(program: PathBuf, args: Vec<String>, limit: Duration) -> Output {
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(&program)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
        let started = Instant::now();
        loop {
            if child.try_wait().ok().flatten().is_some() {
                break;
            }
            if started.elapsed() > limit {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().expect("collect output")
    })
    .await
    .unwrap()
}

pub fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A process killed (and a directory removed) on drop.
pub struct Guarded {
    pub child: Child,
    pub dir: PathBuf,
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A throwaway CA, server and client certificates written to a temporary directory.
#[cfg(feature = "openssl")]
pub struct PkiFiles {
    pub dir: PathBuf,
    pub pki: cobalt::transport::dtls::test_pki::TestPki,
}

#[cfg(feature = "openssl")]
impl PkiFiles {
    pub fn new(tag: &str) -> PkiFiles {
        let pki = cobalt::transport::dtls::test_pki::generate("Cobalt interop CA").unwrap();
        let dir = std::env::temp_dir().join(format!("cobalt-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = [
            ("ca.pem", &pki.ca_pem),
            ("server.pem", &pki.server.cert_chain_pem),
            ("server.key", &pki.server.key_pem),
            ("client.pem", &pki.client.cert_chain_pem),
            ("client.key", &pki.client.key_pem),
        ];
        for (name, pem) in files {
            std::fs::write(dir.join(name), pem).unwrap();
        }
        PkiFiles { dir, pki }
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

#[cfg(feature = "openssl")]
impl Drop for PkiFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

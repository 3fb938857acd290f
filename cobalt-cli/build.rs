//! Puts the git revision of the checkout into `cobalt --version` (COBALT_GIT_REV):
//! `git 1a2b3c4d5e6f`, with `-dirty` when the tree has changes, or `no git revision`
//! when built outside a git checkout.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    let rev = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(rev) => {
            let dirty = Command::new("git")
                .args(["diff", "--quiet", "HEAD", "--"])
                .status()
                .is_ok_and(|s| !s.success());
            format!("git {rev}{}", if dirty { "-dirty" } else { "" })
        }
        None => "no git revision".to_string(),
    };
    println!("cargo:rustc-env=COBALT_GIT_REV={rev}");
    // A new commit or checkout changes HEAD or the branch it points to.
    for path in ["HEAD", "packed-refs"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(p) = git(&["rev-parse", "--git-path", &branch]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}

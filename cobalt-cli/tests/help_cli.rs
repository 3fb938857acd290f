//! What `cobalt` says about itself: `--version` with the git revision, shell
//! completions and manual pages generated from the command-line definition.

#[path = "common/binary.rs"]
mod binary;

use binary::cobalt;

fn stdout(args: &[&str]) -> String {
    let out = cobalt().args(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn version_names_the_git_revision() {
    let v = stdout(&["--version"]);
    assert!(v.starts_with("cobalt 0."), "{v}");
    // Built from this git checkout: `(git 0123456789ab)`, maybe `-dirty`.
    assert!(
        v.contains("(git ") || v.contains("(no git revision)"),
        "{v}"
    );
}

#[test]
fn completions_for_every_shell_know_the_subcommands() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = stdout(&["completions", shell]);
        // fish writes long options as `-l pretty`.
        for word in ["fetch", "observe", "serve", "pretty"] {
            assert!(script.contains(word), "{shell}: no {word}");
        }
    }
    let bad = cobalt().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn manual_pages_document_every_subcommand() {
    let page = stdout(&["man"]);
    assert!(
        page.contains(".TH cobalt 1") && page.contains("observe"),
        "{page}"
    );
    let dir = std::env::temp_dir().join(format!("cobalt-man-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    stdout(&["man", "--dir", dir.to_str().unwrap()]);
    let get = std::fs::read_to_string(dir.join("cobalt-get.1")).unwrap();
    assert!(
        get.contains("\\-\\-pretty") && get.contains("If\\-None\\-Match"),
        "{get}"
    );
    assert!(dir.join("cobalt-serve.1").is_file() && dir.join("cobalt-bench.1").is_file());
    assert!(
        !dir.join("cobalt-bench-responder.1").exists(),
        "hidden commands stay out"
    );
    std::fs::remove_dir_all(&dir).ok();
}

//! `cobalt devices` through the real binary: a fleet registers at `cobalt rd`, the
//! directory lists it, and it de-registers when it stops; flags that cannot work are
//! usage errors (exit code 2) that say why.

#[path = "common/binary.rs"]
mod binary;

use binary::{cobalt, serve_printing};

#[test]
fn a_fleet_registers_and_deregisters_at_cobalt_rd() {
    let mut rd = cobalt();
    rd.args(["rd", "--in-memory", "--bind", "127.0.0.1", "--port", "0"]);
    let (_rd, found) = serve_printing(rd, &["cobalt: resource directory on "]);
    let origin = found[0].trim_end_matches("/rd").to_string();
    let out = cobalt()
        .args([
            "devices",
            "-n",
            "3",
            "--rd",
            &origin,
            "--lt",
            "60",
            "--duration",
            "2",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("registered 3 (now 0)"), "{stdout}");
    assert!(stdout.contains("deregistered 3"), "{stdout}");
    assert!(stdout.trim_end().ends_with("errors: none"), "{stdout}");
    assert!(stderr.contains("KiB per device"), "{stderr}");
    let lookup = cobalt()
        .args(["rd", "lookup", "ep", &origin])
        .output()
        .unwrap();
    assert!(lookup.status.success());
    assert_eq!(
        String::from_utf8_lossy(&lookup.stdout).trim(),
        "",
        "all removed"
    );
}

#[test]
fn impossible_flags_are_usage_errors() {
    let cases: [(&[&str], &str); 5] = [
        (
            &[
                "--rd",
                "coap://127.0.0.1:1",
                "--psk-identity-prefix",
                "p",
                "--psk-key",
                "k",
            ],
            "coaps://",
        ),
        (&["--rd", "coaps://127.0.0.1:1"], "--psk-key"),
        (&["--rd", "coap+tcp://127.0.0.1:1"], "UDP"),
        (&["--rate=-1"], "--rate"),
        (&["--source-net", "127.0.0.1"], "127.0.0.0/16"),
    ];
    for (args, says) in cases {
        let out = cobalt().arg("devices").args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(says),
            "{args:?} should mention {says}: {stderr}"
        );
    }
}

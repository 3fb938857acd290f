//! `cobalt bench --plot` and `cobalt bench plot`: the plot's path is checked before a
//! run, and the JSON reports of several runs overlay in one figure.

use std::net::UdpSocket;

#[path = "common/binary.rs"]
mod binary;

use binary::{cobalt, local_serve, serve_printing};

#[test]
fn a_plot_path_that_cannot_be_written_fails_before_the_run() {
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let uri = format!("coap://{}/x", silent.local_addr().unwrap());
    // 30 s of benchmark if the path were checked only at the end (then exit 3, as
    // nothing completes); checked first, it fails at once with exit 1.
    let out = cobalt()
        .args(["bench", &uri, "-c", "1", "-d", "30", "-q"])
        .args(["--plot", "/nonexistent/dir/plot.svg"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot write /nonexistent/dir/plot.svg"),
        "{err}"
    );
}

#[test]
fn reports_of_several_runs_overlay_in_one_figure() {
    let (_server, at) = serve_printing(local_serve(), &["cobalt: serving CoAP on "]);
    let dir = std::env::temp_dir().join(format!("cobalt-bench-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut reports = Vec::new();
    for (name, path) in [("fast", "benchmark"), ("missing", "nothing")] {
        let out = cobalt()
            .args(["bench", &format!("coap://{}/{path}", at[0])])
            .args(["-c", "1,2", "-d", "0.3", "--warmup", "0", "--cooldown", "0"])
            .args(["--json", "-q", "--plot"])
            .arg(dir.join(format!("{name}.svg")))
            .output()
            .unwrap();
        let report = dir.join(format!("{name}.json"));
        std::fs::write(&report, &out.stdout).unwrap();
        reports.push(report);
    }
    // The run against a missing resource plotted its 4.04 answers.
    let missing = std::fs::read_to_string(dir.join("missing.svg")).unwrap();
    assert!(missing.contains("4.04 answers/s"), "{missing}");
    let svg = dir.join("both.svg");
    let out = cobalt()
        .args(["bench", "plot"])
        .args(&reports)
        .arg("-o")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("cobalt bench: 2 runs"), "{text}");
    assert!(
        text.contains("fast: 2.xx req/s") && text.contains("missing: 4.04 answers/s"),
        "{text}"
    );
    // Not a report: a usage error naming the file.
    let out = cobalt()
        .args(["bench", "plot"])
        .arg(&svg)
        .arg("-o")
        .arg(dir.join("x.svg"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    std::fs::remove_dir_all(&dir).ok();
}

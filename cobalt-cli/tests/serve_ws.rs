//! `cobalt serve --ws --ws-port N --tcp N` through the real binary, used by the
//! `cobalt` request commands over `coap+ws://` and `coap+tcp://`: requests, observe
//! (`cobalt observe ... --count`) and large uploads (`cobalt put -p @FILE`, with and
//! without `-b`).

use std::process::Output;

#[path = "common/binary.rs"]
mod binary;

use binary::{cobalt, local_serve, serve_printing, ChildGuard};

/// The demo server on ephemeral ports for `coap+tcp` and `coap+ws`, with the
/// addresses it prints.
struct Serving {
    _child: ChildGuard,
    tcp: String,
    ws: String,
}

fn serve() -> Serving {
    let mut command = local_serve();
    command.args([
        "--tcp",
        "0",
        "--ws",
        "--ws-port",
        "0",
        "--log-level",
        "warn",
    ]);
    let (child, found) = serve_printing(
        command,
        &[
            "cobalt: serving CoAP over TCP on ",
            "cobalt: serving CoAP over WebSockets on ws://",
        ],
    );
    Serving {
        _child: child,
        tcp: found[0].clone(),
        ws: found[1].trim_end_matches("/.well-known/coap").to_string(),
    }
}

/// Runs the `cobalt` binary with `args` and collects its output.
fn run(args: &[&str]) -> Output {
    cobalt().args(args).output().unwrap()
}

#[test]
fn serve_ws_answers_coap_ws_get() {
    let s = serve();
    let get = run(&["get", &format!("coap+ws://{}/benchmark", s.ws)]);
    assert_eq!(
        String::from_utf8_lossy(&get.stdout).trim_end(),
        "hello world",
        "{get:?}"
    );
}

#[test]
fn verbose_shows_the_messages_over_tcp_and_ws() {
    let s = serve();
    for uri in [
        format!("coap+tcp://{}/benchmark", s.tcp),
        format!("coap+ws://{}/benchmark", s.ws),
    ] {
        let out = run(&["get", "-v", &uri]);
        assert!(out.status.success(), "{uri}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hello world");
        let err = String::from_utf8_lossy(&out.stderr);
        for line in [
            "> to ",
            "GET token=",
            ">   Uri-Path: benchmark",
            "< from ",
            "2.05 Content",
        ] {
            assert!(err.contains(line), "{uri}: no {line:?} in\n{err}");
        }
        assert!(
            err.contains("7.01 CSM Max-Message-Size: ") && !err.contains("Csm {"),
            "{uri}: {err}"
        );
        // Quiet by default.
        let quiet = run(&["get", &uri]);
        assert!(quiet.stderr.is_empty(), "{uri}: {quiet:?}");
    }
}

#[test]
fn observe_over_tcp_and_ws_prints_count_notifications() {
    let s = serve();
    for uri in [
        format!("coap+tcp://{}/obs", s.tcp),
        format!("coap+ws://{}/obs", s.ws),
    ] {
        let out = run(&["observe", &uri, "--count", "3", "--timeout", "20"]);
        assert!(out.status.success(), "{uri}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let ticks: Vec<u64> = text
            .lines()
            .map(|l| {
                l.strip_prefix("tick ")
                    .and_then(|r| r.split(' ').next())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("{uri}: unexpected line {l:?}"))
            })
            .collect();
        assert_eq!(ticks.len(), 3, "{uri}: {text}");
        assert!(ticks.windows(2).all(|w| w[0] < w[1]), "{uri}: {ticks:?}");
    }
}

#[test]
fn put_large_files_over_tcp_and_ws() {
    let s = serve();
    let dir = std::env::temp_dir().join(format!("cobalt-cli-put-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("body.bin");
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&file, &data).unwrap();
    let payload = format!("@{}", file.display());
    for (base, block) in [
        (format!("coap+tcp://{}", s.tcp), None),
        (format!("coap+tcp://{}", s.tcp), Some("1024")),
        (format!("coap+ws://{}", s.ws), Some("512")),
    ] {
        let uri = format!("{base}/upload");
        let mut args = vec!["put", uri.as_str(), "-p", payload.as_str()];
        if let Some(b) = block {
            args.extend(["-b", b]);
        }
        let out = run(&args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "stored 300000 bytes",
            "{args:?}"
        );
        let got = run(&["get", &uri]);
        assert!(got.status.success(), "{got:?}");
        assert!(got.stdout == data, "{args:?}: the stored body differs");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

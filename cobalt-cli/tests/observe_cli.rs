//! `cobalt observe` through the real binary against `cobalt serve`: it ends the relation
//! (GET with Observe=1, RFC 7641 §3.6) when `--count` is reached, on Ctrl-C and when
//! its standard output closes, over UDP and TCP; and an observation of a server that
//! went away says so and ends with exit code 3.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

#[path = "common/binary.rs"]
mod binary;

use binary::{cobalt, local_serve, metric, rest_of_stderr, serve_printing, ChildGuard};
use cobalt_test_support::psk;
use cobalt_test_support::temp::TempDir;

/// `cobalt serve` on loopback with metrics (and `extra` flags); returns it, its CoAP
/// address and its metrics address.
fn serve(extra: &[&str], prefixes: &[&str]) -> (ChildGuard, Vec<String>) {
    let mut c = local_serve();
    c.args(["--metrics", "127.0.0.1:0"]).args(extra);
    let mut wanted = vec!["cobalt: serving CoAP on ", "cobalt: metrics on http://"];
    wanted.extend_from_slice(prefixes);
    let (server, mut found) = serve_printing(c, &wanted);
    found[1] = found[1].trim_end_matches("/metrics").to_string();
    (server, found)
}

/// Waits (up to 10 s) until the server's `cobalt_observers` gauge is `n`.
fn wait_for_observers(metrics: &str, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = metric(metrics, "cobalt_observers");
        if now == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "cobalt_observers stayed at {now}, expected {n}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (up to `limit`) for `child` to exit; returns its exit code.
fn wait_exit(child: &mut Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("the observer did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `cobalt observe URI ARGS` with stdout piped, and reads its first line.
fn observe_first_line(uri: &str, args: &[&str]) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = cobalt()
        .args(["observe", uri])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("tick "), "{line:?}");
    (child, out)
}

#[test]
fn observe_ends_the_relation_on_count_ctrl_c_and_closed_stdout() {
    let (_server, at) = serve(&[], &[]);
    let (coap, metrics) = (&at[0], &at[1]);
    let uri = format!("coap://{coap}/obs");
    wait_for_observers(metrics, 0.0);

    // --count: two notifications, then the relation is cancelled, not left behind
    // (the server would otherwise keep it until a confirmable notification failed).
    let out = cobalt()
        .args(["observe", &uri, "--count", "2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 2);
    wait_for_observers(metrics, 0.0);

    // Ctrl-C.
    let (mut child, _out) = observe_first_line(&uri, &[]);
    wait_for_observers(metrics, 1.0);
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(wait_exit(&mut child, Duration::from_secs(10)), Some(0));
    wait_for_observers(metrics, 0.0);

    // `cobalt observe … | head -1`: the reader goes away after one line.
    let (mut child, out) = observe_first_line(&uri, &[]);
    wait_for_observers(metrics, 1.0);
    drop(out);
    assert_eq!(wait_exit(&mut child, Duration::from_secs(10)), Some(0));
    let err = rest_of_stderr(&mut child);
    assert!(!err.contains("panicked"), "{err}");
    wait_for_observers(metrics, 0.0);
}

#[test]
fn observe_over_tcp_websockets_and_dtls_sends_the_deregistering_get() {
    let dir = TempDir::new("observe-cli");
    let keys = psk::keys_file(&dir);
    let keys = keys.to_str().unwrap();
    let (_server, at) = serve(
        &[
            "--tcp",
            "0",
            "--ws-port",
            "0",
            "--dtls-port",
            "0",
            "--dtls-psk-file",
            keys,
        ],
        &[
            "cobalt: serving CoAP over TCP on ",
            "cobalt: serving CoAP over WebSockets on ws://",
            "cobalt: serving CoAP over DTLS on ",
        ],
    );
    let ws = at[3].trim_end_matches("/.well-known/coap");
    for (uri, extra) in [
        (format!("coap+tcp://{}/obs", at[2]), &[][..]),
        (format!("coap+ws://{ws}/obs"), &[][..]),
        (
            format!("coaps://{}/obs", at[4]),
            &["--psk-identity", "alice", "--psk-key", "secretPSK"][..],
        ),
    ] {
        let out = cobalt()
            .args(["observe", "-v", &uri, "--count", "2"])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{uri}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        // -v shows the GET with Observe=1 on the relation's token, and the answer.
        let cancel = err
            .find(">   Observe: 1")
            .unwrap_or_else(|| panic!("{uri}: no deregistration sent:\n{err}"));
        assert!(
            err[cancel..].contains("< from") && err[cancel..].contains("2.05 Content"),
            "{uri}: the deregistration was not answered:\n{err}"
        );
    }
}

#[test]
fn an_observed_server_that_goes_away_is_reported_and_given_up() {
    let (server, at) = serve(&[], &[]);
    let uri = format!("coap://{}/obs", at[0]);
    let (mut child, _out) = observe_first_line(&uri, &[]);
    drop(server); // killed: its port is closed
                  // /obs has Max-Age 2: after 7 s of silence the client registers again, which fails
                  // (port not open) or goes unanswered until it gives up.
    let code = wait_exit(&mut child, Duration::from_secs(90));
    let err = rest_of_stderr(&mut child);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("registering again (attempt 1 of 3)"), "{err}");
    assert!(
        err.contains("port not open") || err.contains("went away"),
        "{err}"
    );
}

/// `cobalt observe --q-block` of `cobalt serve --plugtest`'s `/obs-large` (2,500
/// bytes changing every second, confirmable notifications; 20 blocks of 128 bytes in
/// two sets): the registration's answer and the next notification come as Q-Block2
/// sets and are printed whole.
#[test]
fn observe_with_q_block_prints_whole_notifications_of_a_large_resource() {
    let (_server, at) = serve(&["--plugtest"], &[]);
    let uri = format!("coap://{}/obs-large", at[0]);
    let out = cobalt()
        .args([
            "observe",
            "-v",
            "--q-block",
            "-b",
            "128",
            &uri,
            "--count",
            "2",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let printed = String::from_utf8_lossy(&out.stdout);
    // Each notification is "tick N at TIME" padded with dots to 2,500 bytes.
    let padding = ".".repeat(2400);
    assert_eq!(printed.matches(&padding).count(), 2, "{printed}");
    assert_eq!(printed.matches("tick ").count(), 2, "{printed}");
    // The server gives a Q-Block2 body an ETag (its Block2 notifications have none).
    let shown = String::from_utf8_lossy(&out.stderr);
    assert!(shown.contains("<   ETag: "), "{shown}");
    assert!(!shown.contains(">   Block2: "), "{shown}");
}

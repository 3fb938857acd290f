//! `cobalt proxy` as a user runs it: `cobalt serve` as the origin, a reverse route and
//! the HTTP front in front of it, the proxy's counters on the metrics endpoint.

#[path = "common/binary.rs"]
mod binary;

use binary::{cobalt, local_serve, metric, serve_printing};
use std::io::{Read, Write};

#[test]
fn the_proxy_serves_a_reverse_route_and_http_and_counts_in_its_metrics() {
    let (_origin, at) = serve_printing(local_serve(), &["cobalt: serving CoAP on "]);
    let origin = format!("coap://{}", at[0]);
    let mut proxy = cobalt();
    proxy.args([
        "proxy",
        "--coap",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--metrics",
        "127.0.0.1:0",
        "--allow",
        "127.0.0.1",
        "--reverse",
    ]);
    proxy.arg(format!("/o={origin}/"));
    let (_proxy, found) = serve_printing(
        proxy,
        &[
            "cobalt: CoAP proxy on ",
            "cobalt: HTTP proxy on ",
            "cobalt: metrics on ",
        ],
    );
    let (coap, http, metrics) = (&found[0], &found[1], &found[2]);

    let out = cobalt()
        .args(["get", &format!("{coap}/o/benchmark")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hello world");

    let mut conn = std::net::TcpStream::connect(http.as_str()).unwrap();
    write!(
        conn,
        "GET /hc/{origin}/benchmark HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.ends_with("hello world"), "{answer}");

    assert_eq!(metric(metrics, "cobalt_proxy_cache_misses_total"), 1.0);
    assert_eq!(
        metric(metrics, "cobalt_proxy_cache_hits_total"),
        1.0,
        "the HTTP GET was a hit"
    );
    assert!(
        metric(metrics, "cobalt_requests_total") >= 1.0,
        "the server's own counters too"
    );
}

#[test]
fn a_bad_allow_pattern_is_a_usage_error_naming_it() {
    let out = cobalt()
        .args(["proxy", "--coap", "127.0.0.1:0", "--allow", "10.0.0.0/99"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("10.0.0.0/99") && err.contains("prefix length"),
        "{err}"
    );
}

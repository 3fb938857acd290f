//! `cobalt serve` configuration and metrics, through the real binary.

use std::io::{Read, Write};
use std::time::Duration;

#[path = "common/binary.rs"]
mod binary;

use binary::{cobalt, local_serve, serve_printing};

#[test]
fn print_config_shows_the_effective_configuration_and_parses_back() {
    let out = cobalt()
        .args(["serve", "--print-config", "--port", "6001"])
        .env("COBALT_ENDPOINT_ACK_TIMEOUT", "3s")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("\nport = 6001\n"), "{text}");
    assert!(text.contains("\nack_timeout = \"3s\"\n"), "{text}");
    assert!(text.contains("# default: \"2s\""), "{text}");
    let c = cobalt::config::Config::from_toml(&text).unwrap();
    assert_eq!(c.server.port, 6001);

    let defaults = cobalt().args(["serve", "--print-config"]).output().unwrap();
    assert_eq!(
        String::from_utf8(defaults.stdout).unwrap(),
        cobalt::config::Config::default_toml()
    );
}

#[test]
fn config_file_from_flag_or_cobalt_config() {
    let path = std::env::temp_dir().join(format!("cobalt-cli-test-{}.toml", std::process::id()));
    std::fs::write(&path, "[server]\nport = 6100\n[endpoint]\nnstart = 3\n").unwrap();
    let by_flag = cobalt()
        .args(["serve", "--print-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let by_env = cobalt()
        .args(["serve", "--print-config"])
        .env("COBALT_CONFIG", &path)
        .env("COBALT_SERVER_PORT", "6101")
        .output()
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    let by_flag = String::from_utf8(by_flag.stdout).unwrap();
    let by_env = String::from_utf8(by_env.stdout).unwrap();
    assert!(
        by_flag.contains("\nport = 6100\n") && by_flag.contains("\nnstart = 3\n"),
        "{by_flag}"
    );
    assert!(
        by_env.contains("\nport = 6101\n") && by_env.contains("\nnstart = 3\n"),
        "{by_env}"
    );
}

#[test]
fn bad_configuration_exits_2_naming_the_key() {
    let out = cobalt()
        .args(["serve", "--set", "limits.block_szx=9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("limits.block_szx") && err.contains("0 to 6"),
        "{err}"
    );
}

#[test]
fn serve_with_metrics_answers_get_metrics() {
    let mut command = local_serve();
    command.args(["--metrics", "127.0.0.1:0", "--log-level", "warn"]);
    let (child, found) = serve_printing(
        command,
        &["cobalt: serving CoAP on ", "cobalt: metrics on http://"],
    );
    let coap_addr = &found[0];
    let metrics_addr = found[1].trim_end_matches("/metrics");

    let get = cobalt()
        .args(["get", &format!("coap://{coap_addr}/benchmark")])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&get.stdout).trim_end(),
        "hello world"
    );

    let mut body = String::new();
    for _ in 0..100 {
        let mut s = std::net::TcpStream::connect(metrics_addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        body.clear();
        s.read_to_string(&mut body).unwrap();
        if body.contains("cobalt_responses_total{shard=\"0\",class=\"2xx\"} 1\n") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(child);
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    assert!(
        body.contains("cobalt_requests_total{shard=\"0\"} 1\n"),
        "{body}"
    );
    assert!(
        body.contains("cobalt_responses_total{shard=\"0\",class=\"2xx\"} 1\n"),
        "{body}"
    );
}

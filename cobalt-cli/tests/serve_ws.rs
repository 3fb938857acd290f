//! `cobalt serve --ws --ws-port N` through the real binary, queried by `cobalt get`
//! over `coap+ws://`.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

#[path = "common/binary.rs"]
mod binary;

use binary::{cobalt, KillOnDrop};

#[test]
fn serve_ws_answers_coap_ws_get() {
    let mut child = KillOnDrop(
        cobalt()
            .args([
                "serve",
                "--bind",
                "127.0.0.1",
                "--port",
                "0",
                "--shards",
                "1",
                "--ws",
                "--ws-port",
                "0",
                "--log-level",
                "warn",
            ])
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut stderr = BufReader::new(child.0.stderr.take().unwrap());
    let mut ws_addr = None;
    for _ in 0..10 {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if let Some(rest) = line
            .trim()
            .strip_prefix("cobalt: serving CoAP over WebSockets on ws://")
        {
            ws_addr = rest.strip_suffix("/.well-known/coap").map(str::to_string);
            break;
        }
    }
    let ws_addr = ws_addr.expect("the server prints its WebSocket address");
    let get = cobalt()
        .args(["get", &format!("coap+ws://{ws_addr}/benchmark")])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&get.stdout).trim_end(),
        "hello world",
        "{get:?}"
    );
}

//! Interoperability with other CoAP implementations, each way, over every transport
//! but plain UDP (which `cobalt-cli/tests/interop` covers through the `cobalt`
//! binary): one module per transport, the peers started and found through
//! `cobalt_test_support::peers` (libcoap's command-line tools, aiocoap).
//!
//! A test whose peer program is missing is skipped with a `SKIPPED:` note, unless
//! `COBALT_REQUIRE_PEERS=1`, in which case it fails (`scripts/install-test-deps.sh`
//! installs the peers). libcoap's tools are looked up on `PATH`; aiocoap in
//! `$COBALT_AIOCOAP_BIN` (a directory), else the workspace's `.venv-peers/bin`.

#[path = "../common/mod.rs"]
mod common;
#[path = "../stream/mod.rs"]
mod stream;

mod observed;

#[cfg(feature = "openssl")]
mod dtls;
#[cfg(feature = "mbedtls")]
mod dtls_mbedtls;
mod tcp;
#[cfg(feature = "openssl")]
mod tls;
mod ws;

use cobalt::server::{get, post, Request};
use cobalt::{Client, Code, Response, Scheme, Server, ServerHandle};
use cobalt_test_support::process::{self, Ran};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// How long one peer command may run.
const LIMIT: Duration = cobalt_test_support::peers::COMMAND_LIMIT;

/// What [`our_server`] answers at `/big`: 3000 bytes, more than one block.
fn big() -> String {
    "0123456789".repeat(300)
}

/// A server (not yet listening) with `/hello` answering `hello`, `/echo` answering
/// a POST with its payload, and `/big` ([`big`]).
fn our_server(hello: &'static str) -> Server {
    Server::new()
        .route("/hello", get(move || async move { hello }).rt("greeting"))
        .route(
            "/echo",
            post(|req: Request| async move { (Code::CHANGED, req.payload().to_vec()) }),
        )
        .route("/big", get(|| async { big() }))
}

/// Starts `server` on 127.0.0.1 (a free port) for `scheme`; its `SCHEME://ADDR`.
async fn start_on(server: Server, scheme: Scheme) -> (ServerHandle, String) {
    let server = server.listen(scheme, "127.0.0.1:0").start().await.unwrap();
    let base = format!("{scheme}://{}", server.local_addr(scheme).unwrap());
    (server, base)
}

/// GET `uri` with `client`, bounded by [`LIMIT`].
async fn fetch(client: &Client, uri: &str) -> Response {
    let sent = client.request(Code::GET, uri).timeout(LIMIT).send().await;
    sent.unwrap_or_else(|e| panic!("GET {uri}: {e}"))
}

/// Observes `uri` (a resource of a peer that changes on its own) with `client` until
/// three 2.05 notifications came, which must show at least two states, then cancels:
/// the answer to the cancelling GET has no Observe option.
async fn observe_changes_then_cancel(client: &Client, uri: &str) {
    let mut obs = client.observe(uri).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let n = obs.next().await.unwrap().unwrap();
        assert_eq!(n.code, Code::CONTENT, "{n:?}");
        assert!(n.options.observe().is_some(), "{n:?}");
        seen.push(n.text_payload());
    }
    seen.dedup();
    assert!(seen.len() >= 2, "{seen:?}");
    let r = obs.cancel().await.unwrap();
    assert!(r.options.observe().is_none(), "deregistered");
}

/// Runs `cmd` off the async threads, bounded by [`LIMIT`] (see
/// [`process::run`]).
async fn run_command(mut cmd: Command) -> Ran {
    tokio::task::spawn_blocking(move || process::run(&mut cmd, LIMIT))
        .await
        .unwrap()
}

/// Runs `program ARGS` (see [`run_command`]).
async fn run(program: &Path, args: &[&str]) -> Ran {
    let mut cmd = Command::new(program);
    cmd.args(args);
    run_command(cmd).await
}

/// A client program of another implementation, as far as its command line goes.
#[derive(Debug, Clone, Copy)]
enum Tool {
    /// libcoap's `coap-client-*`, giving up after 5 s of waiting (`-B 5`).
    Libcoap,
    /// `aiocoap-client`.
    Aiocoap,
}

impl Tool {
    /// The arguments of a GET of `uri`.
    fn get(self, uri: &str) -> Vec<String> {
        match self {
            Tool::Libcoap => vec![
                "-B".into(),
                "5".into(),
                "-m".into(),
                "get".into(),
                uri.into(),
            ],
            Tool::Aiocoap => vec![uri.into()],
        }
    }

    /// The arguments of a POST of `payload` to `uri`.
    fn post(self, payload: &str, uri: &str) -> Vec<String> {
        let (m, e) = match self {
            Tool::Libcoap => (["-B", "5", "-m", "post"].as_slice(), "-e"),
            Tool::Aiocoap => (["-m", "POST"].as_slice(), "--payload"),
        };
        let mut args: Vec<String> = m.iter().map(|s| s.to_string()).collect();
        args.extend([e.to_string(), payload.into(), uri.into()]);
        args
    }
}

/// The client `bin` (a `tool`, with `auth` before every request's arguments, e.g.
/// keys) against [`our_server`] at `base` (`SCHEME://ADDR`): GET `/hello` (which
/// answers `hello`), POST `/echo`, GET `/big` (in blocks).
async fn gets_posts_and_gets_big(tool: Tool, bin: &Path, auth: &[&str], base: &str, hello: &str) {
    let with = |args: Vec<String>| {
        let mut cmd = Command::new(bin);
        cmd.args(auth).args(args);
        cmd
    };
    run_command(with(tool.get(&format!("{base}/hello"))))
        .await
        .assert_stdout_has(hello);
    let ping = format!("{tool:?} says hello to {base}");
    run_command(with(tool.post(&ping, &format!("{base}/echo"))))
        .await
        .assert_stdout_has(&ping);
    run_command(with(tool.get(&format!("{base}/big"))))
        .await
        .assert_stdout_has(&big());
}

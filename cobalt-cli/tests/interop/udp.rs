//! Interoperability with real CoAP peers on loopback, in both directions:
//!
//! * libcoap's `coap-client-notls` and aiocoap's `aiocoap-client` against `cobalt serve`;
//! * Cobalt's client (library and `cobalt` CLI) against libcoap's `coap-server-notls`
//!   and an aiocoap server (`tests/peers/aiocoap_server.py`).
//!
//! The peers are installed by `scripts/install-test-deps.sh`. A missing peer skips the
//! test with a note on stderr, or fails it when `COBALT_REQUIRE_PEERS=1`.

use crate::{aiocoap_server, coap_client, libcoap_server, runtime};
use cobalt::client::RequestBuilder;
use cobalt::proto::message::{decode, Message, MessageType};
use cobalt::{Client, Code, Response};
use cobalt_test_support::need;
use cobalt_test_support::peers::libcoap::{self, Port};
use cobalt_test_support::peers::{aiocoap, require, PeerServer, COMMAND_LIMIT};
use cobalt_test_support::ports::{V4, V6};
use cobalt_test_support::process::{self, Ran};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// `aiocoap-client ARGS`, bounded by the harness limit (it has no timeout flag).
fn aiocoap_client(bin: &Path, args: &[&str]) -> Ran {
    process::run(Command::new(bin).args(args), COMMAND_LIMIT)
}

/// With `-v 7`, libcoap logs each message as `v:1 t:TYPE c:CODE i:MID {TOKEN} [ OPTIONS ] :: 'PAYLOAD'`.
/// Returns the first received line of type `mtype` and code `code`.
fn libcoap_logged<'a>(r: &'a Ran, mtype: &str, code: &str) -> Option<&'a str> {
    let prefix = format!("v:1 t:{mtype} c:{code} ");
    r.stdout.lines().find(|l| l.starts_with(&prefix))
}

/// Whether libcoap (with `-v 7`) printed `payload` as the response body: it writes the
/// body right after its "process incoming" log line, without a newline of its own.
fn libcoap_printed_body(r: &Ran, payload: &str) -> bool {
    r.stdout
        .split_once("process incoming")
        .is_some_and(|(_, rest)| rest.contains(&format!("\n{payload}")))
}

/// `cobalt ARGS --timeout 15`.
fn cobalt(args: &[&str]) -> Ran {
    process::run(
        crate::binary::cobalt().args(args).args(["--timeout", "15"]),
        COMMAND_LIMIT,
    )
}

/// The `cobalt` CLI's stdout minus the newline it adds after a text payload.
fn printed(r: &Ran) -> &str {
    r.stdout.strip_suffix('\n').unwrap_or(&r.stdout)
}

/// A blocking request with a bounded time.
fn blocking(method: Code, uri: &str, payload: &str) -> Response {
    cobalt::client::blocking::Client::new()
        .request(method, uri, payload.into(), Duration::from_secs(15))
        .unwrap_or_else(|e| panic!("{method} {uri}: {e}"))
}

/// Datagrams seen by a traced client: (sent?, decoded message).
type Seen = Arc<Mutex<Vec<(bool, Message)>>>;

/// `method uri` (built further by `with`) with a client whose datagrams are traced,
/// bounded by a 15 s timeout unless `with` sets another: the result and the datagrams.
fn traced(
    method: Code,
    uri: &str,
    with: impl FnOnce(RequestBuilder) -> RequestBuilder,
) -> (Result<Response, cobalt::Error>, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let tracer: cobalt::runtime::Tracer = Arc::new(move |sent, _peer, bytes| {
        if let Ok(m) = decode(bytes) {
            log.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((sent, m));
        }
    });
    let client = Client::with_tracer(cobalt::EndpointConfig::default(), tracer).unwrap();
    let request = with(client.request(method, uri).timeout(Duration::from_secs(15)));
    (runtime().block_on(request.send()), seen)
}

/// Asserts that the exchange in `seen` was a separate response: an empty ACK, then a
/// CON response carrying `payload`, which the client acknowledged.
fn assert_separate(seen_ref: &Seen, payload: &str) {
    let seen = seen_lock(seen_ref);
    let received: Vec<&Message> = seen.iter().filter(|(s, _)| !s).map(|(_, m)| m).collect();
    let ack = received
        .iter()
        .position(|m| m.mtype == MessageType::Acknowledgement && m.code == Code::EMPTY);
    let response = received.iter().position(|m| {
        m.mtype == MessageType::Confirmable
            && m.code == Code::CONTENT
            && m.payload == payload.as_bytes()
    });
    match (ack, response) {
        (Some(a), Some(r)) if a < r => {}
        _ => panic!("expected an empty ACK, then a CON 2.05 '{payload}'; got {received:#?}"),
    }
    let con_mid = received[response.unwrap()].mid;
    drop(seen);
    // The client acknowledges the CON response; the ACK may leave just after the
    // response was handed to the caller, so poll for it (bounded).
    let acked = || {
        seen_lock(seen_ref)
            .iter()
            .any(|(sent, m)| *sent && m.mtype == MessageType::Acknowledgement && m.mid == con_mid)
    };
    for _ in 0..50 {
        if acked() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the client did not ACK the separate response (MID {con_mid})");
}

fn seen_lock(seen: &Seen) -> std::sync::MutexGuard<'_, Vec<(bool, Message)>> {
    seen.lock().unwrap_or_else(|e| e.into_inner())
}

/// libcoap's client, or `None` after the skip note.
fn find_libcoap_client() -> Option<PathBuf> {
    require(libcoap::CLIENT, libcoap::tool(libcoap::CLIENT))
}

/// `aiocoap-client`, or `None` after the skip note.
fn find_aiocoap_client() -> Option<PathBuf> {
    require("aiocoap-client", aiocoap::client())
}

/// A client program that was found, and `cobalt serve` on `ip` for it to talk to.
fn with_cobalt(client: Option<PathBuf>, ip: IpAddr) -> Option<(PathBuf, PeerServer)> {
    client.map(|bin| (bin, crate::binary::start_cobalt(ip)))
}

/// A client program (run by `run`) GETs `/benchmark` from `cobalt serve` on `ip`.
fn gets_benchmark(client: Option<PathBuf>, run: fn(&Path, &[&str]) -> Ran, ip: IpAddr) {
    let Some((bin, server)) = with_cobalt(client, ip) else {
        return;
    };
    if ip == V6 {
        assert!(server.uri("").starts_with("coap://[::1]:"));
    }
    let r = run(&bin, &[&server.uri("/benchmark")]).ok();
    assert_eq!(r.stdout.trim_end(), "hello world", "{r:#?}");
}

// ---------------------------------------------------------------------------
// libcoap coap-client -> cobalt serve
// ---------------------------------------------------------------------------

#[test]
fn libcoap_client_gets_benchmark() {
    gets_benchmark(find_libcoap_client(), coap_client, V4);
}

#[test]
fn libcoap_client_gets_benchmark_over_ipv6() {
    gets_benchmark(find_libcoap_client(), coap_client, V6);
}

#[test]
fn libcoap_client_put_and_post_are_echoed() {
    let Some((bin, server)) = with_cobalt(find_libcoap_client(), V4) else {
        return;
    };
    let uri = server.uri("/echo");
    for (method, payload) in [("put", "put from libcoap"), ("post", "post from libcoap")] {
        let r = coap_client(&bin, &["-v", "7", "-m", method, "-e", payload, &uri]).ok();
        let line = libcoap_logged(&r, "ACK", "2.04").unwrap_or_default();
        assert!(
            line.ends_with(&format!(":: '{payload}'")),
            "{method}: {r:#?}"
        );
        assert!(libcoap_printed_body(&r, payload), "{method}: {r:#?}");
    }
}

/// A deterministic text of `len` bytes ("0000-0001-...").
fn numbered_text(len: usize) -> String {
    let mut s: String = (0..)
        .map(|i| format!("{i:04}-"))
        .take(len / 5 + 1)
        .collect();
    s.truncate(len);
    s
}

#[test]
fn libcoap_client_uploads_in_block1_blocks() {
    let Some((bin, server)) = with_cobalt(find_libcoap_client(), V4) else {
        return;
    };
    let uri = server.uri("/echo");
    // 300 bytes in 64-byte Block1 blocks: five 2.31 Continue, then the 2.04 echo.
    let small = numbered_text(300);
    let r = coap_client(
        &bin,
        &["-v", "7", "-b", "64", "-m", "put", "-e", &small, &uri],
    )
    .ok();
    assert!(libcoap_logged(&r, "ACK", "2.31").is_some(), "{r:#?}");
    assert!(libcoap_printed_body(&r, &small), "{r:#?}");
    let r = coap_client(&bin, &["-b", "64", "-m", "put", "-e", &small, &uri]).ok();
    assert_eq!(r.stdout.trim_end(), small);
    // 2000 bytes: libcoap sends 1024-byte Block1 blocks on its own, and the echo comes
    // back in two Block2 blocks (RFC 7959 §3.3).
    let large = numbered_text(2000);
    let r = coap_client(&bin, &["-m", "post", "-e", &large, &uri]).ok();
    assert_eq!(r.stdout.trim_end(), large);
}

#[test]
fn libcoap_client_delete_test_is_deleted() {
    let Some((bin, server)) = with_cobalt(find_libcoap_client(), V4) else {
        return;
    };
    let r = coap_client(&bin, &["-v", "7", "-m", "delete", &server.uri("/test")]).ok();
    assert!(libcoap_logged(&r, "ACK", "2.02").is_some(), "{r:#?}");
}

#[test]
fn libcoap_client_non_request_gets_non_response() {
    let Some((bin, server)) = with_cobalt(find_libcoap_client(), V4) else {
        return;
    };
    let r = coap_client(&bin, &["-N", "-v", "7", &server.uri("/benchmark")]).ok();
    assert!(libcoap_logged(&r, "NON", "GET").is_some(), "{r:#?}");
    let line = libcoap_logged(&r, "NON", "2.05").unwrap_or_default();
    assert!(line.ends_with(":: 'hello world'"), "{r:#?}");
    assert!(libcoap_printed_body(&r, "hello world"), "{r:#?}");
}

#[test]
fn libcoap_client_receives_separate_response() {
    let Some((bin, server)) = with_cobalt(find_libcoap_client(), V4) else {
        return;
    };
    let r = coap_client(&bin, &["-v", "7", &server.uri("/separate?delay=1200")]).ok();
    let out = &r.stdout;
    let ack = out.find("v:1 t:ACK c:0.00 ");
    let con = out.find("v:1 t:CON c:2.05 ");
    assert!(
        matches!((ack, con), (Some(a), Some(c)) if a < c),
        "expected an empty ACK then a CON 2.05: {r:#?}"
    );
    assert!(libcoap_printed_body(&r, "answered after 1200 ms"), "{r:#?}");
}

#[test]
fn libcoap_client_discovers_resources_whole_and_in_blocks() {
    let Some((bin, server)) = with_cobalt(find_libcoap_client(), V4) else {
        return;
    };
    let uri = server.uri("/.well-known/core");
    let whole = coap_client(&bin, &[&uri]).ok();
    assert!(whole.stdout.contains("</benchmark>"), "{whole:#?}");
    assert!(whole.stdout.contains("</echo>"), "{whole:#?}");
    // The plugtest listing is over 1 KiB: libcoap asks for 64-byte blocks and must
    // reassemble exactly the same document.
    let blocks = coap_client(&bin, &["-b", "64", &uri]).ok();
    assert!(whole.stdout.len() > 1024, "{whole:#?}");
    assert_eq!(blocks.stdout, whole.stdout);
}

#[test]
fn libcoap_client_plugtest_options() {
    let Some((bin, server)) = with_cobalt(find_libcoap_client(), V4) else {
        return;
    };
    // Uri-Query and a long Uri-Path.
    let r = coap_client(&bin, &[&server.uri("/query?first=1&second=2")]).ok();
    assert_eq!(r.stdout.trim_end(), "Query: first=1&second=2");
    let r = coap_client(&bin, &[&server.uri("/seg1/seg2/seg3")]).ok();
    assert_eq!(r.stdout.trim_end(), "Long path resource");
    // Location-Query in a 2.01.
    let r = coap_client(
        &bin,
        &["-v", "7", "-m", "post", &server.uri("/location-query")],
    )
    .ok();
    let line = libcoap_logged(&r, "ACK", "2.01").unwrap_or_default();
    assert!(
        line.contains("Location-Query:first=1, Location-Query:second=2"),
        "{r:#?}"
    );
    // Accept: application/xml.
    let r = coap_client(&bin, &["-A", "41", &server.uri("/multi-format")]).ok();
    let xml = r.stdout.trim_end();
    assert!(
        xml.starts_with("<msg type=\"CON\" code=\"GET\" mid=\"")
            && xml.ends_with(" accept=\"41\"/>"),
        "{r:#?}"
    );
    // ETag validation: the ETag from a GET gets 2.03 Valid.
    let uri = server.uri("/validate");
    let r = coap_client(&bin, &["-v", "7", &uri]).ok();
    let line = libcoap_logged(&r, "ACK", "2.05").unwrap_or_default();
    let etag = line
        .split("ETag:")
        .nth(1)
        .and_then(|rest| rest.split([',', ' ']).next())
        .unwrap_or_else(|| panic!("no ETag: {r:#?}"))
        .to_string();
    let r = coap_client(&bin, &["-v", "7", "-O", &format!("4,{etag}"), &uri]).ok();
    assert!(libcoap_logged(&r, "ACK", "2.03").is_some(), "{r:#?}");
    // If-None-Match: created once, then 4.12 Precondition Failed.
    let uri = server.uri("/create1");
    let r = coap_client(&bin, &["-v", "7", "-m", "put", "-O", "5", "-e", "x", &uri]).ok();
    assert!(libcoap_logged(&r, "ACK", "2.01").is_some(), "{r:#?}");
    let r = coap_client(&bin, &["-v", "7", "-m", "put", "-O", "5", "-e", "x", &uri]).ok();
    assert!(libcoap_logged(&r, "ACK", "4.12").is_some(), "{r:#?}");
}

#[test]
fn libcoap_client_reports_not_found() {
    let Some((bin, server)) = with_cobalt(find_libcoap_client(), V4) else {
        return;
    };
    // libcoap prints the error code on stderr and still exits 0.
    let r = coap_client(&bin, &[&server.uri("/no/such/resource")]);
    assert!(r.stderr.contains("4.04"), "{r:#?}");
    assert!(r.stdout.is_empty(), "{r:#?}");
}

// ---------------------------------------------------------------------------
// aiocoap-client -> cobalt serve
// ---------------------------------------------------------------------------

#[test]
fn aiocoap_client_gets_benchmark() {
    gets_benchmark(find_aiocoap_client(), aiocoap_client, V4);
}

#[test]
fn aiocoap_client_gets_benchmark_over_ipv6() {
    gets_benchmark(find_aiocoap_client(), aiocoap_client, V6);
}

#[test]
fn aiocoap_client_put_and_post_are_echoed() {
    let Some((bin, server)) = with_cobalt(find_aiocoap_client(), V4) else {
        return;
    };
    let uri = server.uri("/echo");
    for (method, payload) in [("PUT", "put from aiocoap"), ("POST", "post from aiocoap")] {
        let r = aiocoap_client(&bin, &["-v", "-m", method, "--payload", payload, &uri]).ok();
        assert_eq!(r.stdout.trim_end(), payload, "{method}: {r:#?}");
        assert!(r.stderr.contains("2.04 Changed"), "{method}: {r:#?}");
    }
}

#[test]
fn aiocoap_client_uploads_in_block1_blocks() {
    let Some((bin, server)) = with_cobalt(find_aiocoap_client(), V4) else {
        return;
    };
    let uri = server.uri("/echo");
    let small = numbered_text(300);
    let r = aiocoap_client(
        &bin,
        &[
            "-m",
            "PUT",
            "--payload-initial-szx",
            "2",
            "--payload",
            &small,
            &uri,
        ],
    )
    .ok();
    assert_eq!(r.stdout, small, "{r:#?}");
    // Over 1024 bytes aiocoap uses Block1 by itself; the echo returns in Block2 blocks.
    let large = numbered_text(2000);
    let r = aiocoap_client(&bin, &["-m", "POST", "--payload", &large, &uri]).ok();
    assert_eq!(r.stdout, large, "{r:#?}");
    assert!(!r.stderr.contains("WARNING"), "{r:#?}");
}

#[test]
fn aiocoap_client_delete_test_is_deleted() {
    let Some((bin, server)) = with_cobalt(find_aiocoap_client(), V4) else {
        return;
    };
    let r = aiocoap_client(&bin, &["-v", "-m", "DELETE", &server.uri("/test")]).ok();
    assert!(r.stderr.contains("2.02 Deleted"), "{r:#?}");
}

#[test]
fn aiocoap_client_non_request() {
    let Some((bin, server)) = with_cobalt(find_aiocoap_client(), V4) else {
        return;
    };
    let r = aiocoap_client(&bin, &["--non", &server.uri("/benchmark")]).ok();
    assert_eq!(r.stdout.trim_end(), "hello world", "{r:#?}");
}

#[test]
fn aiocoap_client_receives_separate_response() {
    let Some((bin, server)) = with_cobalt(find_aiocoap_client(), V4) else {
        return;
    };
    let r = aiocoap_client(&bin, &[&server.uri("/separate?delay=1200")]).ok();
    assert_eq!(r.stdout.trim_end(), "answered after 1200 ms", "{r:#?}");
}

#[test]
fn aiocoap_client_discovers_resources_in_blocks() {
    let Some((bin, server)) = with_cobalt(find_aiocoap_client(), V4) else {
        return;
    };
    let r = aiocoap_client(&bin, &[&server.uri("/.well-known/core")]).ok();
    let own = blocking(Code::GET, &server.uri("/.well-known/core"), "");
    assert!(own.payload.len() > 1024, "listing too short to need Block2");
    assert!(r.stdout.contains("</benchmark>"), "{r:#?}");
    // aiocoap follows Block2 (1024-byte blocks) and reassembles the same document.
    assert_eq!(r.stdout.trim_end(), own.text_payload());
}

#[test]
fn aiocoap_client_reports_not_found() {
    let Some((bin, server)) = with_cobalt(find_aiocoap_client(), V4) else {
        return;
    };
    let r = aiocoap_client(&bin, &[&server.uri("/no/such/resource")]);
    assert_eq!(r.code(), Some(1), "{r:#?}");
    assert!(r.stderr.contains("4.04 Not Found"), "{r:#?}");
}

// ---------------------------------------------------------------------------
// Cobalt client -> libcoap coap-server
// ---------------------------------------------------------------------------

#[test]
fn cobalt_gets_from_libcoap_server() {
    let Some(server) = libcoap_server() else {
        return;
    };
    let r = blocking(Code::GET, &server.uri("/"), "");
    assert_eq!(r.code, Code::CONTENT);
    assert!(r.text_payload().contains("libcoap"), "{r:?}");

    let cli = cobalt(&["get", &server.uri("/time")]).ok();
    assert!(!printed(&cli).is_empty(), "{cli:#?}");
}

#[test]
fn cobalt_put_get_delete_round_trip_on_libcoap_server() {
    let Some(server) = libcoap_server() else {
        return;
    };
    // A resource created by PUT (coap-server -d) supports GET, PUT and DELETE.
    let uri = server.uri("/cobalt-dyn");
    let r = blocking(Code::PUT, &uri, "first");
    assert_eq!(r.code, Code::CREATED, "{r:?}");
    let r = blocking(Code::GET, &uri, "");
    assert_eq!(
        (r.code, r.text_payload().as_str()),
        (Code::CONTENT, "first")
    );
    let r = blocking(Code::PUT, &uri, "second");
    assert_eq!(r.code, Code::CHANGED, "{r:?}");
    let r = blocking(Code::GET, &uri, "");
    assert_eq!(r.text_payload(), "second");
    let r = blocking(Code::DELETE, &uri, "");
    assert_eq!(r.code, Code::DELETED, "{r:?}");
    let r = blocking(Code::GET, &uri, "");
    assert_eq!(r.code, Code::NOT_FOUND, "{r:?}");

    // The same through the CLI, on the built-in /example_data and a new resource.
    let data = server.uri("/example_data");
    cobalt(&["put", &data, "-p", "from the cobalt cli"]).ok();
    let r = cobalt(&["get", &data]).ok();
    assert_eq!(printed(&r), "from the cobalt cli");
    let dyn_uri = server.uri("/cli-dyn");
    cobalt(&["put", &dyn_uri, "-p", "x"]).ok();
    cobalt(&["delete", &dyn_uri]).ok();
    let r = cobalt(&["get", &dyn_uri]);
    assert_eq!(r.code(), Some(4), "{r:#?}");
    assert!(r.stderr.contains("4.04"), "{r:#?}");
}

#[test]
fn cobalt_uploads_in_block1_to_libcoap_server() {
    let Some(server) = libcoap_server() else {
        return;
    };
    // libcoap drops datagrams over its PDU size (1152 bytes): 5000 bytes must go in
    // Block1 blocks, and the GET comes back in Block2 blocks.
    let body = numbered_text(5000);
    let uri = server.uri("/cobalt-large");
    let r = blocking(Code::PUT, &uri, &body);
    assert_eq!(r.code, Code::CREATED, "{r:?}");
    let r = blocking(Code::GET, &uri, "");
    assert_eq!(r.code, Code::CONTENT);
    assert!(
        r.text_payload() == body,
        "GET returned {} bytes",
        r.payload.len()
    );

    let cli_uri = server.uri("/cli-large");
    cobalt(&["put", &cli_uri, "-p", &body]).ok();
    let r = cobalt(&["get", &cli_uri]).ok();
    assert!(
        printed(&r) == body,
        "CLI GET returned {} bytes",
        r.stdout.len()
    );
}

#[test]
fn cobalt_receives_separate_response_from_libcoap_server() {
    let Some(server) = libcoap_server() else {
        return;
    };
    // libcoap 4.3.1's /async answers separately after its default 4 s delay (an explicit
    // ?delay=N is mis-scheduled by that version and never answered).
    let (r, seen) = traced(Code::GET, &server.uri("/async"), |b| b);
    let r = r.expect("separate response");
    assert_eq!((r.code, r.text_payload().as_str()), (Code::CONTENT, "done"));
    assert_separate(&seen, "done");
}

#[test]
fn cobalt_retransmits_when_libcoap_server_loses_a_response() {
    let bin = need!(libcoap::SERVER, libcoap::tool(libcoap::SERVER));
    // `-l 1`: the server fails to send its first datagram, the answer to our PUT.
    let server = libcoap::server(&bin, V4, &["-l", "1", "-d", "5"], Port::CoapQuiet, None);
    let uri = server.uri("/lossy");
    let (r, seen) = traced(Code::PUT, &uri, |b| {
        b.payload("sent twice").timeout(Duration::from_secs(20))
    });
    let r = r.expect("response after a retransmission");
    assert!(r.code.is_success(), "{r:?}");
    let puts: Vec<u16> = seen_lock(&seen)
        .iter()
        .filter(|(sent, m)| *sent && m.code == Code::PUT)
        .map(|(_, m)| m.mid)
        .collect();
    assert!(
        puts.len() >= 2 && puts.iter().all(|&mid| mid == puts[0]),
        "expected the PUT retransmitted with the same MID: {puts:?}"
    );
    let r = blocking(Code::GET, &uri, "");
    assert_eq!(r.text_payload(), "sent twice");
}

#[test]
fn cobalt_cli_retransmits_to_libcoap_server_under_every_congestion_control() {
    let bin = need!(libcoap::SERVER, libcoap::tool(libcoap::SERVER));
    for cc in ["default", "cocoa", "cocoa-strong", "fasor"] {
        // `-l 1`: the server fails to send its first datagram, the answer to our PUT.
        let server = libcoap::server(&bin, V4, &["-l", "1", "-d", "5"], Port::CoapQuiet, None);
        let uri = server.uri("/lossy-cc");
        let r = cobalt(&["put", "--cc", cc, "-v", "-p", cc, &uri]).ok();
        let puts = r
            .stderr
            .lines()
            .filter(|l| l.starts_with("> to") && l.contains("PUT"))
            .count();
        assert!(puts >= 2, "--cc {cc}: expected a retransmitted PUT: {r:#?}");
        let r = cobalt(&["get", "--cc", cc, &uri]).ok();
        assert_eq!(printed(&r), cc);
    }
}

#[test]
fn cobalt_observes_libcoap_server_time() {
    let Some(server) = libcoap_server() else {
        return;
    };
    // libcoap's /time notifies every second.
    let cli = cobalt(&["observe", "-n", "2", &server.uri("/time")]).ok();
    let lines: Vec<&str> = cli.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{cli:#?}");
    assert!(lines.iter().all(|l| !l.is_empty()), "{cli:#?}");

    let client = Client::new();
    let got = runtime().block_on(async {
        let mut obs = client.observe(&server.uri("/time")).await.expect("observe");
        crate::notifications(&mut obs, 2).await
    });
    assert!(got.iter().all(|r| r.code == Code::CONTENT));
    let (first, second) = (
        got[0]
            .options
            .observe()
            .expect("Observe in the first notification"),
        got[1]
            .options
            .observe()
            .expect("Observe in the second notification"),
    );
    assert_ne!(first, second, "notifications carry new Observe numbers");
}

#[test]
fn cobalt_discovers_libcoap_server() {
    let Some(server) = libcoap_server() else {
        return;
    };
    let r = cobalt(&["discover", &server.uri("")]).ok();
    let targets: Vec<&str> = r
        .stdout
        .lines()
        .filter_map(|l| l.split('\t').next())
        .collect();
    for want in ["/", "/time", "/async", "/example_data"] {
        assert!(targets.contains(&want), "{want} missing: {r:#?}");
    }
    assert!(
        r.stdout
            .lines()
            .any(|l| l.starts_with("/time\t") && l.contains("rt=ticks") && l.contains("obs")),
        "{r:#?}"
    );
}

#[test]
fn cobalt_non_request_to_libcoap_server() {
    let Some(server) = libcoap_server() else {
        return;
    };
    let (r, seen) = traced(Code::GET, &server.uri("/"), |b| b.non_confirmable());
    let r = r.expect("NON response");
    assert_eq!(r.code, Code::CONTENT);
    assert!(r.text_payload().contains("libcoap"));
    let seen = seen_lock(&seen);
    assert!(seen
        .iter()
        .all(|(_, m)| m.mtype == MessageType::NonConfirmable));
    drop(seen);

    let cli = cobalt(&["get", "--non", &server.uri("/time")]).ok();
    assert!(!printed(&cli).is_empty(), "{cli:#?}");
}

#[test]
fn cobalt_reports_not_found_from_libcoap_server() {
    let Some(server) = libcoap_server() else {
        return;
    };
    let r = blocking(Code::GET, &server.uri("/no/such/resource"), "");
    assert_eq!(r.code, Code::NOT_FOUND);
    let cli = cobalt(&["get", &server.uri("/no/such/resource")]);
    assert_eq!(cli.code(), Some(4), "{cli:#?}");
}

// ---------------------------------------------------------------------------
// Cobalt client -> aiocoap server (tests/peers/aiocoap_server.py)
// ---------------------------------------------------------------------------

/// The body of the aiocoap server's `/large`, built the same way as in the script.
fn large_body() -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while out.len() < 3000 {
        out.extend_from_slice(format!("line {i:04}: abcdefghijklmnopqrstuvwxyz\n").as_bytes());
        i += 1;
    }
    out.truncate(3000);
    out
}

#[test]
fn cobalt_gets_from_aiocoap_server() {
    let Some(server) = aiocoap_server() else {
        return;
    };
    let r = blocking(Code::GET, &server.uri("/hello"), "");
    assert_eq!(r.code, Code::CONTENT);
    assert_eq!(r.text_payload(), "hello from aiocoap");
    let cli = cobalt(&["get", &server.uri("/hello")]).ok();
    assert_eq!(
        cli.stdout, "hello from aiocoap",
        "payload byte-exact, like curl"
    );
}

#[test]
fn cobalt_post_and_put_are_echoed_by_aiocoap_server() {
    let Some(server) = aiocoap_server() else {
        return;
    };
    let uri = server.uri("/echo");
    for method in [Code::POST, Code::PUT] {
        let payload = format!("{method} from cobalt");
        let r = blocking(method, &uri, &payload);
        assert_eq!(r.code, Code::CHANGED, "{method}");
        assert_eq!(r.text_payload(), payload);
    }
    let cli = cobalt(&["post", &uri, "-p", "cli payload", "-t", "text/plain"]).ok();
    assert_eq!(printed(&cli), "cli payload");
}

#[test]
fn cobalt_large_post_is_echoed_by_aiocoap_server() {
    let Some(server) = aiocoap_server() else {
        return;
    };
    // Block1 up (1024-byte blocks), Block2 back.
    let body = numbered_text(5000);
    let r = blocking(Code::POST, &server.uri("/echo"), &body);
    assert_eq!(r.code, Code::CHANGED, "{r:?}");
    assert!(
        r.text_payload() == body,
        "echo returned {} bytes",
        r.payload.len()
    );
}

#[test]
fn cobalt_non_request_to_aiocoap_server() {
    let Some(server) = aiocoap_server() else {
        return;
    };
    let (r, seen) = traced(Code::GET, &server.uri("/hello"), |b| b.non_confirmable());
    let r = r.expect("NON response");
    assert_eq!(r.text_payload(), "hello from aiocoap");
    let seen = seen_lock(&seen);
    assert!(
        seen.iter()
            .all(|(_, m)| m.mtype == MessageType::NonConfirmable),
        "{seen:#?}"
    );
    drop(seen);
    let cli = cobalt(&["get", "--non", &server.uri("/hello")]).ok();
    assert_eq!(printed(&cli), "hello from aiocoap");
}

#[test]
fn cobalt_receives_separate_response_from_aiocoap_server() {
    let Some(server) = aiocoap_server() else {
        return;
    };
    let (r, seen) = traced(Code::GET, &server.uri("/slow"), |b| b);
    let r = r.expect("separate response");
    assert_eq!(r.text_payload(), "slow response");
    assert_separate(&seen, "slow response");
}

#[test]
fn cobalt_downloads_block2_from_aiocoap_server() {
    let Some(server) = aiocoap_server() else {
        return;
    };
    let (r, seen) = traced(Code::GET, &server.uri("/large"), |b| b);
    let r = r.expect("Block2 download");
    assert_eq!(r.code, Code::CONTENT);
    assert_eq!(r.payload.len(), 3000);
    assert!(r.payload == large_body(), "payload differs from /large");
    let blocks = seen_lock(&seen)
        .iter()
        .filter(|(sent, m)| !sent && m.block2().is_some())
        .count();
    assert!(
        blocks >= 3,
        "expected the body in several blocks, saw {blocks}"
    );

    let cli = cobalt(&["get", &server.uri("/large")]).ok();
    assert_eq!(printed(&cli).as_bytes(), &large_body()[..]);
}

#[test]
fn cobalt_discovers_aiocoap_server() {
    let Some(server) = aiocoap_server() else {
        return;
    };
    let r = cobalt(&["discover", &server.uri("")]).ok();
    let targets: Vec<&str> = r
        .stdout
        .lines()
        .filter_map(|l| l.split('\t').next())
        .collect();
    for want in ["/hello", "/echo", "/slow", "/large"] {
        assert!(targets.contains(&want), "{want} missing: {r:#?}");
    }
}

#[test]
fn cobalt_reports_not_found_from_aiocoap_server() {
    let Some(server) = aiocoap_server() else {
        return;
    };
    let r = blocking(Code::GET, &server.uri("/no/such/resource"), "");
    assert_eq!(r.code, Code::NOT_FOUND);
    let cli = cobalt(&["get", &server.uri("/no/such/resource")]);
    assert_eq!(cli.code(), Some(4), "{cli:#?}");
    assert!(cli.stderr.contains("4.04"), "{cli:#?}");
}

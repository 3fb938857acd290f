//! The ETSI CoAP plugtest test descriptions (TD_COAP_CORE_*, TD_COAP_LINK_*,
//! TD_COAP_BLOCK_*, TD_COAP_OBS_*) against `cobalt serve --plugtest`, driven the way
//! libcoap's `examples/etsi_testcases.sh` drives a server: one `coap-client` command
//! per TD. Where that script leaves the checks of the TD to a person reading a
//! capture, these tests read `coap-client -v 7`'s message log and assert them.
//! The observe TDs run as a test campaign runs them, in order against one server,
//! over UDP, DTLS and TCP (see [`observe_campaign`]). TD_COAP_OBS_04/05 (the server
//! notices a vanished or rebooted observer) need a client that stops answering or
//! answers RST, so a bare UDP socket plays it.
//! TD_COAP_BLOCK_01 (early Block2 negotiation) runs with every client: libcoap,
//! aiocoap, Californium and Cobalt's own.

use crate::coap_client;
use cobalt::proto::message::{
    decode, encode, opt, option::encode_uint, Code, Message, MessageType, Token,
};
use cobalt_test_support::need;
use cobalt_test_support::peers::californium;
use cobalt_test_support::peers::libcoap;
use cobalt_test_support::peers::{aiocoap, repo_root, require, PeerServer, COMMAND_LIMIT};
use cobalt_test_support::ports::V4;
use cobalt_test_support::process::{self, Ran};
use std::net::UdpSocket;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// coap-client and its message log
// ---------------------------------------------------------------------------

/// One message in coap-client's `-v 7` log.
#[derive(Debug, Clone)]
struct Logged {
    /// Sent by the client (else received).
    sent: bool,
    mtype: String,
    code: String,
    mid: String,
    token: String,
    options: String,
}

impl Logged {
    fn is(&self, mtype: &str, code: &str) -> bool {
        self.mtype == mtype && self.code == code
    }

    /// The value of option `name` (e.g. "Observe", "Block2"), if present.
    fn option(&self, name: &str) -> Option<&str> {
        self.options
            .split(", ")
            .find_map(|o| o.strip_prefix(name)?.strip_prefix(':'))
    }
}

/// The messages coap-client logged with `-v 7`: a line `v:1 t:CON c:GET i:8728 {01}
/// [ Uri-Path:test ] :: 'payload'`, after a "UDP : sent N bytes" or "DTLS: received N
/// bytes" line that says its direction. Over TCP the type and message ID are
/// placeholders (`t:CON i:0000`).
fn logged(r: &Ran) -> Vec<Logged> {
    let mut out = Vec::new();
    let mut sent = None;
    for line in r.stdout.lines().chain(r.stderr.lines()) {
        if line.contains(": sent ") {
            sent = Some(true);
        } else if line.contains(": received ") {
            sent = Some(false);
        } else if line.contains("Client app version") {
            sent = None;
        }
        let (Some(dir), Some(rest)) = (sent, line.strip_prefix("v:1 t:")) else {
            continue;
        };
        sent = None;
        let word = |key: &str| {
            rest.split(' ')
                .find_map(|w| w.strip_prefix(key))
                .unwrap_or_default()
                .to_string()
        };
        let between = |a: char, b: char| {
            rest.split_once(a)
                .and_then(|(_, r)| r.split_once(b))
                .map(|(v, _)| v.trim().to_string())
                .unwrap_or_default()
        };
        out.push(Logged {
            sent: dir,
            mtype: rest.split(' ').next().unwrap_or_default().to_string(),
            code: word("c:"),
            mid: word("i:"),
            token: between('{', '}'),
            options: between('[', ']'),
        });
    }
    out
}

/// Runs one TD's coap-client command with `-v 7`; the messages it sent and received,
/// without the server's address validation (RFC 9175 §2.4: a CoAP ping, CON 0.00,
/// that the client rejects with RST before the server answers a new client in full)
/// and CoAP over TCP's signals (RFC 8323 §5), which the TDs predate.
fn td(bin: &Path, name: &str, args: &[&str]) -> (Vec<Logged>, Vec<Logged>) {
    let mut all = vec!["-v", "7"];
    all.extend_from_slice(args);
    let r = coap_client(bin, &all);
    let mut log = logged(&r);
    const SIGNALS: [&str; 5] = ["CSM", "Ping", "Pong", "Release", "Abort"];
    log.retain(|m| {
        !m.is("CON", "0.00") && !m.is("RST", "0.00") && !SIGNALS.contains(&m.code.as_str())
    });
    let (sent, received): (Vec<Logged>, Vec<Logged>) = log.into_iter().partition(|m| m.sent);
    assert!(
        !sent.is_empty() && !received.is_empty(),
        "{name}: nothing logged: {r:#?}"
    );
    (sent, received)
}

/// The response to the request `req` among the messages received: piggybacked on the
/// ACK with the request's MID or, for a confirmable request, after an empty ACK with
/// that MID, as a separate response. The server answers a new client separately when
/// the client's RST to its address-validation ping is slower than the separate-ACK delay.
fn response<'a>(name: &str, req: &Logged, received: &'a [Logged]) -> &'a Logged {
    let first = received
        .iter()
        .find(|m| m.code != "0.00")
        .unwrap_or_else(|| panic!("{name}: no response: {received:?}"));
    if first.mtype == "ACK" {
        assert_eq!(first.mid, req.mid, "{name}: piggybacked on the ACK");
    } else if req.mtype == "CON" {
        assert!(
            received
                .iter()
                .any(|m| m.is("ACK", "0.00") && m.mid == req.mid),
            "{name}: a separate response after an empty ACK: {received:?}"
        );
    }
    first
}

/// A file holding `text`, removed when dropped.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str, text: &[u8]) -> TempFile {
        let path = std::env::temp_dir().join(format!("cobalt-{name}-{}", std::process::id()));
        std::fs::write(&path, text).expect("write temp file");
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `&[String]` as the `&[&str]` the helpers take.
fn args_of(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Asserts that coap-client printed `body` (it adds a newline when the body has none).
fn assert_printed(r: &Ran, body: &[u8]) {
    let mut expected = body.to_vec();
    if !expected.ends_with(b"\n") {
        expected.push(b'\n');
    }
    assert!(
        r.stdout.as_bytes() == expected,
        "printed {} bytes, expected {}: {r:#?}",
        r.stdout.len(),
        body.len()
    );
}

/// Text of `len` bytes: numbered lines, so a broken transfer shows where.
fn numbered_text(len: usize) -> Vec<u8> {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < len {
        s.push_str(&format!("line {i:04} of the plugtest body\n"));
        i += 1;
    }
    s.truncate(len);
    s.into_bytes()
}

// ---------------------------------------------------------------------------
// TD_COAP_CORE
// ---------------------------------------------------------------------------

#[test]
fn td_coap_core_01_to_13_with_libcoap() {
    let bin = need!(libcoap::CLIENT, libcoap::tool(libcoap::CLIENT));
    let server = crate::binary::start_cobalt(V4);
    let test = server.uri("/test");
    // CORE_01-04 (CON) and CORE_05-08 (NON): GET, POST, PUT, DELETE on /test.
    let methods = [
        ("get", "2.05", &[][..]),
        ("post", "2.01", &["-t", "0", "-e", "sometext"][..]),
        ("put", "2.04", &["-t", "0", "-e", "sometext"][..]),
        ("delete", "2.02", &[][..]),
    ];
    for non in [false, true] {
        for (i, (method, code, extra)) in methods.iter().enumerate() {
            let name = format!("TD_COAP_CORE_{:02}", i + 1 + if non { 4 } else { 0 });
            let mut args = vec!["-m", method];
            args.extend_from_slice(extra);
            if non {
                args.push("-N");
            }
            args.push(&test);
            let (sent, received) = td(&bin, &name, &args);
            let req = &sent[0];
            let resp = response(&name, req, &received);
            let t = if non { "NON" } else { "CON" };
            assert!(req.is(t, &method.to_uppercase()), "{name}: {req:?}");
            assert_eq!(resp.code, *code, "{name}: {resp:?}");
            if non {
                assert_eq!(resp.mtype, "NON", "{name}: {resp:?}");
            }
            if *method == "get" {
                assert!(resp.option("Content-Format").is_some(), "{name}: {resp:?}");
            }
        }
    }
    // CORE_09: a separate response: empty ACK, then CON 2.05, acknowledged.
    let (sent, received) = td(&bin, "TD_COAP_CORE_09", &[&server.uri("/separate")]);
    assert!(received[0].is("ACK", "0.00"), "{received:?}");
    assert_eq!(received[0].mid, sent[0].mid);
    let separate = received
        .iter()
        .find(|m| m.is("CON", "2.05"))
        .unwrap_or_else(|| panic!("TD_COAP_CORE_09: no CON 2.05: {received:?}"));
    assert!(separate.option("Content-Format").is_some(), "{separate:?}");
    assert!(
        sent.iter()
            .any(|m| m.is("ACK", "0.00") && m.mid == separate.mid),
        "TD_COAP_CORE_09: the client acknowledges: {sent:?}"
    );
    // CORE_10: the Token comes back.
    let (sent, received) = td(&bin, "TD_COAP_CORE_10", &["-T", "sometok", &test]);
    // "-T" gives the starting token; libcoap counts up from it.
    assert!(sent[0].token.starts_with("736f6d65746f"), "{sent:?}");
    let resp = response("TD_COAP_CORE_10", &sent[0], &received);
    assert_eq!(
        (resp.token.as_str(), resp.code.as_str()),
        (sent[0].token.as_str(), "2.05")
    );
    // CORE_12: one Uri-Path option per segment.
    let (sent, received) = td(&bin, "TD_COAP_CORE_12", &[&server.uri("/seg1/seg2/seg3")]);
    assert!(
        sent[0]
            .options
            .contains("Uri-Path:seg1, Uri-Path:seg2, Uri-Path:seg3"),
        "{sent:?}"
    );
    assert_eq!(
        response("TD_COAP_CORE_12", &sent[0], &received).code,
        "2.05"
    );
    // CORE_13: several Uri-Query options.
    let uri = server.uri("/query?first=1&second=2&third=3");
    let (sent, received) = td(&bin, "TD_COAP_CORE_13", &[&uri]);
    assert!(
        sent[0]
            .options
            .contains("Uri-Query:first=1, Uri-Query:second=2, Uri-Query:third=3"),
        "{sent:?}"
    );
    assert_eq!(
        response("TD_COAP_CORE_13", &sent[0], &received).code,
        "2.05"
    );
    let r = coap_client(&bin, &[&uri]).ok();
    assert_eq!(r.stdout.trim_end(), "Query: first=1&second=2&third=3");
}

#[test]
fn td_coap_core_14_15_lossy_with_libcoap() {
    // The client loses its first datagram (`-l 1`): the request is retransmitted with
    // the same MID and answered once, piggybacked (CORE_14) or separately (CORE_15).
    let bin = need!(libcoap::CLIENT, libcoap::tool(libcoap::CLIENT));
    let server = crate::binary::start_cobalt(V4);
    for (name, path) in [
        ("TD_COAP_CORE_14", "/test"),
        ("TD_COAP_CORE_15", "/separate"),
    ] {
        let (sent, received) = td(&bin, name, &["-l", "1", &server.uri(path)]);
        let requests: Vec<&Logged> = sent.iter().filter(|m| m.is("CON", "GET")).collect();
        assert!(requests.len() >= 2, "{name}: retransmitted: {sent:?}");
        assert_eq!(requests[0].mid, requests[1].mid, "{name}");
        let resp = response(name, requests[0], &received);
        assert_eq!(resp.code, "2.05", "{name}: {received:?}");
        if path == "/separate" {
            assert_eq!(resp.mtype, "CON", "{name}: a separate response");
        }
    }
}

// ---------------------------------------------------------------------------
// TD_COAP_LINK
// ---------------------------------------------------------------------------

#[test]
fn td_coap_link_01_02_with_libcoap() {
    let bin = need!(libcoap::CLIENT, libcoap::tool(libcoap::CLIENT));
    let server = crate::binary::start_cobalt(V4);
    // LINK_01: the whole listing, in link-format.
    let wkc = server.uri("/.well-known/core");
    let (sent, received) = td(&bin, "TD_COAP_LINK_01", &[&wkc]);
    assert_eq!(
        response("TD_COAP_LINK_01", &sent[0], &received).option("Content-Format"),
        Some("application/link-format"),
        "{received:?}"
    );
    let all = coap_client(&bin, &[&wkc]).ok();
    for path in [
        "</test>",
        "</obs>",
        "</obs-non>",
        "</large-post>",
        "</multi-format>",
        "</link1>",
        "</path/sub1>",
    ] {
        assert!(all.stdout.contains(path), "{path} listed: {all:#?}");
    }
    // LINK_02: filtered by rt.
    let r = coap_client(&bin, &[&server.uri("/.well-known/core?rt=Type1")]).ok();
    let links: Vec<&str> = r.stdout.trim_end().split(',').collect();
    assert_eq!(links.len(), 2, "{r:#?}");
    assert!(links[0].starts_with("</link1>") && links[1].starts_with("</link3>"));
}

// ---------------------------------------------------------------------------
// TD_COAP_BLOCK
// ---------------------------------------------------------------------------

#[test]
fn td_coap_block_02_to_05_with_libcoap() {
    let bin = need!(libcoap::CLIENT, libcoap::tool(libcoap::CLIENT));
    let server = crate::binary::start_cobalt(V4);
    // BLOCK_02: late negotiation: no Block2 in the first request, then every request
    // asks for the next block.
    let (sent, received) = td(&bin, "TD_COAP_BLOCK_02", &[&server.uri("/large")]);
    assert!(sent[0].option("Block2").is_none(), "{sent:?}");
    let first = response("TD_COAP_BLOCK_02", &sent[0], &received);
    assert!(first.option("Block2").is_some(), "{received:?}");
    let asked: Vec<u32> = sent
        .iter()
        .filter_map(|m| m.option("Block2")?.split('/').next()?.parse().ok())
        .collect();
    assert!(
        asked.windows(2).all(|w| w[1] == w[0] + 1) && asked.first() == Some(&1),
        "{asked:?}"
    );
    let whole = coap_client(&bin, &[&server.uri("/large")]).ok();
    assert_eq!(whole.stdout.trim_end().len(), 4096, "{whole:#?}");

    // BLOCK_03: PUT in Block1 blocks of 1024, then the resource holds the body.
    let body = numbered_text(3000);
    let file = TempFile::new("plugtest-block", &body);
    let path = file.0.to_str().unwrap();
    // `coap-client -m METHOD` sending the file in Block1 blocks of 1024 bytes.
    let upload = |method: &'static str, uri: &str| -> Vec<String> {
        ["-m", method, "-b", "1024", "-t", "0", "-f", path, uri]
            .map(str::to_string)
            .to_vec()
    };
    let uri = server.uri("/large-update");
    let (sent, received) = td(&bin, "TD_COAP_BLOCK_03", &args_of(&upload("put", &uri)));
    assert_eq!(sent[0].option("Block1"), Some("0/M/1024"), "{sent:?}");
    assert!(received.iter().any(|m| m.code == "2.04"), "{received:?}");
    let back = coap_client(&bin, &[&uri]).ok();
    assert_printed(&back, &body);

    // BLOCK_04: POST in blocks creates a resource at the Location it answers.
    let create = upload("post", &server.uri("/large-create"));
    let (sent, received) = td(&bin, "TD_COAP_BLOCK_04", &args_of(&create));
    assert_eq!(sent[0].option("Block1"), Some("0/M/1024"), "{sent:?}");
    let created = received
        .iter()
        .find(|m| m.code == "2.01")
        .unwrap_or_else(|| panic!("TD_COAP_BLOCK_04: no 2.01: {received:?}"));
    let query = created
        .option("Location-Query")
        .unwrap_or_else(|| panic!("{created:?}"));
    assert_eq!(created.option("Location-Path"), Some("large-create"));
    let back = coap_client(&bin, &[&server.uri(&format!("/large-create?{query}"))]).ok();
    assert_printed(&back, &body);

    // BLOCK_05: POST in Block1 blocks answered in Block2 blocks in the same exchange.
    let r = coap_client(&bin, &args_of(&upload("post", &server.uri("/large-post")))).ok();
    assert_printed(&r, &body.to_ascii_uppercase());
}

/// The Block2 sizes of every response block a client got, asking for `size`-byte
/// blocks from the first request on (TD_COAP_BLOCK_01), per client.
fn early_negotiation_sizes(server: &PeerServer, size: usize) -> Vec<(&'static str, Vec<usize>)> {
    let uri = server.uri("/large");
    let s = size.to_string();
    let mut out = Vec::new();
    if let Some(bin) = require(
        "coap-client-notls (libcoap)",
        libcoap::tool(libcoap::CLIENT),
    ) {
        let (sent, received) = td(&bin, "TD_COAP_BLOCK_01", &["-b", &s, &uri]);
        let first = sent[0].option("Block2").unwrap_or_default();
        assert_eq!(first, format!("0/_/{size}"), "libcoap asks early");
        let sizes = received
            .iter()
            .filter_map(|m| m.option("Block2")?.rsplit('/').next()?.parse().ok())
            .collect();
        out.push(("libcoap", sizes));
    }
    if let Some(python) = require("aiocoap", aiocoap::python()) {
        let script = repo_root().join("tests/peers/aiocoap_block2.py");
        let r = process::run(
            Command::new(python).arg(script).args([&uri, &s]),
            COMMAND_LIMIT,
        )
        .ok();
        // Blocks after the first, as aiocoap logged them (SZX); the first is the one
        // whose size made aiocoap ask for block 1 at that size.
        let sizes = r
            .stdout
            .lines()
            .filter_map(|l| l.strip_prefix("BLOCK\t"))
            .filter_map(|l| l.split('\t').nth(2)?.parse::<u32>().ok())
            .map(|szx| 16usize << szx)
            .collect();
        assert!(r.stdout.contains("DONE\t2.05\t4096"), "{r:#?}");
        out.push(("aiocoap", sizes));
    }
    if let Some(cf) = californium::need() {
        // Californium asks for its preferred size (default 512) after the first block,
        // so it is set to the size under test too.
        let lines = cf.run(&["request", "GET", &uri, "--early", &s, "--block-size", &s]);
        let sizes = lines
            .iter()
            .filter(|l| l.starts_with("RECV "))
            .filter_map(|l| {
                californium::field(l, "block2")?
                    .rsplit('/')
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        out.push(("californium", sizes));
    }
    let cobalt = process::run(
        crate::binary::cobalt().args(["get", "-v", "--block-size", &s, &uri]),
        COMMAND_LIMIT,
    )
    .ok();
    assert_eq!(cobalt.stdout.len(), 4096, "{cobalt:#?}");
    // `-v` shows each response ("< from ...: ACK [MID=..] 2.05 ...") and then its
    // options, one per line ("<   Block2: 1/1/64").
    let mut sizes = Vec::new();
    let mut in_response = false;
    for line in cobalt.stderr.lines() {
        if line.starts_with("< from ") || line.starts_with("> to ") {
            in_response = line.starts_with("< from ") && line.contains(" 2.05 ");
        } else if let Some(b) = line.strip_prefix("<   Block2: ").filter(|_| in_response) {
            sizes.extend(
                b.rsplit('/')
                    .next()
                    .and_then(|z| z.trim().parse::<usize>().ok()),
            );
        }
    }
    out.push(("cobalt", sizes));
    out
}

/// TD_COAP_BLOCK_01: each client asks for blocks of 64 to 1024 bytes in its first
/// request; every block of the answer has that size (the last may be shorter, but its
/// SZX is the same). The server verifies each new client's address with one ping round
/// trip (RFC 9175 §2.4) instead of answering it in smaller blocks than it asked for.
#[test]
fn td_coap_block_01_early_negotiation_is_honoured_by_every_client() {
    let server = crate::binary::start_cobalt(V4);
    for size in [64, 128, 256, 512, 1024] {
        for (client, sizes) in early_negotiation_sizes(&server, size) {
            assert!(!sizes.is_empty(), "{client} at {size}: no blocks seen");
            assert!(
                sizes.iter().all(|s| *s == size),
                "{client} asked for {size}-byte blocks and got {sizes:?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// TD_COAP_OBS
// ---------------------------------------------------------------------------

/// A transport the observe campaign runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Udp,
    Dtls,
    Tcp,
}

/// The PSK the campaign's DTLS server and clients share.
const PSK_IDENTITY: &str = "plugtest";
const PSK_KEY: &str = "secretPSK";

impl Transport {
    /// The libcoap client that speaks it.
    fn libcoap(self) -> &'static str {
        match self {
            Transport::Dtls => libcoap::CLIENT_OPENSSL,
            Transport::Udp | Transport::Tcp => libcoap::CLIENT,
        }
    }

    /// The arguments that give libcoap's client the PSK, where it needs one.
    fn libcoap_psk(self) -> Vec<&'static str> {
        match self {
            Transport::Dtls => vec!["-u", PSK_IDENTITY, "-k", PSK_KEY],
            Transport::Udp | Transport::Tcp => Vec::new(),
        }
    }

    /// Cobalt's client for it.
    fn client(self) -> cobalt::Client {
        match self {
            Transport::Dtls => cobalt::Client::new().with_psk(PSK_IDENTITY, PSK_KEY),
            Transport::Udp | Transport::Tcp => cobalt::Client::new(),
        }
    }
}

/// `cobalt serve --plugtest` for a test campaign: CoAP over UDP, over TCP on the same
/// port and over DTLS with [`PSK_KEY`]. Retransmissions give up after ~1 s, so an
/// observer that vanished (TD_COAP_OBS_04) goes quickly.
struct CampaignServer {
    server: PeerServer,
    dtls_port: u16,
    _keys: TempFile,
}

impl CampaignServer {
    fn start(t: Transport) -> CampaignServer {
        let name = format!("plugtest-psk-{t:?}");
        let keys = TempFile::new(&name, format!("{PSK_IDENTITY}:{PSK_KEY}\n").as_bytes());
        let dtls_port = cobalt_test_support::ports::free_udp_port(V4).to_string();
        let keys_path = keys.0.to_string_lossy().into_owned();
        let server = crate::binary::start_cobalt_with(
            V4,
            &[
                "--tcp",
                "--dtls-port",
                &dtls_port,
                "--dtls-psk-file",
                &keys_path,
                "--set",
                "endpoint.ack_timeout=200ms",
                "--set",
                "endpoint.max_retransmit=2",
            ],
        );
        CampaignServer {
            server,
            dtls_port: dtls_port.parse().unwrap(),
            _keys: keys,
        }
    }

    /// `scheme://address` of the server over `t`.
    fn base(&self, t: Transport) -> String {
        let addr = self.server.addr;
        match t {
            Transport::Udp => format!("coap://{addr}"),
            Transport::Tcp => format!("coap+tcp://{addr}"),
            Transport::Dtls => format!("coaps://{}:{}", addr.ip(), self.dtls_port),
        }
    }
}

/// The plugtest observe cases in the order a test campaign runs them, against one
/// server over `t`: TD_COAP_OBS_01/02 with libcoap's client, TD_COAP_OBS_04/05 (the
/// server drops a vanished and a rebooted observer; UDP only, a bare socket plays the
/// observer), the server's reboot (`/obs-reset`, as issue 21 words TD_COAP_OBS_04),
/// TD_COAP_OBS_07/08/09 with Cobalt's client. Each case starts from where the one
/// before left the server.
fn observe_campaign(t: Transport) {
    let bin = need!(t.libcoap(), libcoap::tool(t.libcoap()));
    let server = CampaignServer::start(t);
    let base = server.base(t);
    obs_01_02_with_libcoap(&bin, t, &base);
    if t == Transport::Udp {
        obs_04_05_vanished_and_rebooted_observers(&server.server);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = t.client();
        tokio::time::timeout(Duration::from_secs(60), async {
            obs_server_reboot(&client, &base).await;
            obs_07_08_09(&client, &base).await;
        })
        .await
        .expect("the observations took too long");
    });
}

#[test]
fn td_coap_obs_campaign_over_udp() {
    observe_campaign(Transport::Udp);
}

#[test]
fn td_coap_obs_campaign_over_dtls() {
    observe_campaign(Transport::Dtls);
}

#[test]
fn td_coap_obs_campaign_over_tcp() {
    observe_campaign(Transport::Tcp);
}

/// TD_COAP_OBS_01 (`/obs`: confirmable notifications, each acknowledged) and
/// TD_COAP_OBS_02 (`/obs-non`: non-confirmable ones), observed for 4 s each with
/// libcoap's client: a response and then notifications with increasing Observe
/// values. Over TCP there are no message types and no ACKs (RFC 8323).
fn obs_01_02_with_libcoap(bin: &Path, t: Transport, base: &str) {
    let reliable = t == Transport::Tcp;
    for (name, path, non) in [
        ("TD_COAP_OBS_01", "/obs", false),
        ("TD_COAP_OBS_02", "/obs-non", true),
    ] {
        let uri = format!("{base}{path}");
        let mut args = t.libcoap_psk();
        if non && !reliable {
            args.push("-N");
        }
        args.extend(["-s", "4", &uri]);
        let (sent, received) = td(bin, name, &args);
        assert_eq!(sent[0].option("Observe"), Some("0"), "{name}: {sent:?}");
        let answers: Vec<&Logged> = received
            .iter()
            .filter(|m| m.code == "2.05" && m.option("Observe").is_some())
            .collect();
        assert!(
            answers.len() >= 3,
            "{name}: a response and notifications: {received:?}"
        );
        let seq: Vec<u32> = answers
            .iter()
            .filter_map(|m| m.option("Observe")?.parse().ok())
            .collect();
        assert!(seq.windows(2).all(|w| w[0] < w[1]), "{name}: {seq:?}");
        if reliable {
            continue;
        }
        let notes = &answers[1..];
        let of = |mtype: &str| notes.iter().filter(|m| m.mtype == mtype).count();
        if non {
            assert!(of("NON") >= 1, "{name}: {received:?}");
        } else {
            assert_eq!(of("CON"), notes.len(), "{name}: {received:?}");
        }
        for n in notes.iter().filter(|m| m.mtype == "CON") {
            assert!(
                sent.iter().any(|m| m.mtype == "ACK" && m.mid == n.mid),
                "{name}: notification {} acknowledged: {sent:?}",
                n.mid
            );
        }
    }
}

/// A bare UDP socket that registers as an observer of `path`. It answers the server's
/// address-validation pings (CON 0.00) with RST, as every CoAP client does, until it
/// is switched off; it acknowledges nothing else unless told to.
struct Ghost {
    sock: UdpSocket,
    token: Token,
    switched_off: std::cell::Cell<bool>,
}

impl Ghost {
    fn register(server: &PeerServer, path: &str, token: u8) -> Ghost {
        let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
        sock.connect(server.addr).expect("connect");
        let token = Token::new(&[token, 0xee]).unwrap();
        let mut get = Message::new(
            MessageType::Confirmable,
            Code::GET,
            u16::from(token.as_bytes()[0]),
        );
        get.token = token.clone();
        get.options.set_uri_path(path);
        get.options.set(opt::OBSERVE, encode_uint(0));
        sock.send(&encode(&get)).expect("send");
        let ghost = Ghost {
            sock,
            token,
            switched_off: std::cell::Cell::new(false),
        };
        let answer = ghost
            .recv(Duration::from_secs(5))
            .expect("the registration is answered");
        assert_eq!(answer.code, Code::CONTENT, "{answer:?}");
        assert!(answer.options.observe().is_some(), "registered: {answer:?}");
        if answer.mtype == MessageType::Confirmable {
            // A separate response (the ping's RST was late): acknowledge it.
            ghost
                .sock
                .send(&encode(&Message::empty_ack(answer.mid)))
                .unwrap();
        }
        ghost
    }

    /// The next message with this ghost's token within `limit` (pings answered on the way).
    fn recv(&self, limit: Duration) -> Option<Message> {
        let deadline = Instant::now() + limit;
        let mut buf = [0u8; 2048];
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            self.sock
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .ok()?;
            let Ok(n) = self.sock.recv(&mut buf) else {
                continue;
            };
            let Ok(m) = decode(&buf[..n]) else { continue };
            if m.mtype == MessageType::Confirmable && m.code == Code::EMPTY {
                if !self.switched_off.get() {
                    self.sock.send(&encode(&Message::reset(m.mid))).unwrap();
                }
            } else if m.token == self.token {
                return Some(m);
            }
        }
    }

    /// Everything with this ghost's token that arrived by now, without waiting.
    fn drain(&self) -> Vec<Message> {
        let mut out = Vec::new();
        self.sock.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 2048];
        while let Ok(n) = self.sock.recv(&mut buf) {
            if let Ok(m) = decode(&buf[..n]) {
                if m.token == self.token {
                    out.push(m);
                }
            }
        }
        self.sock.set_nonblocking(false).unwrap();
        out
    }
}

/// TD_COAP_OBS_04 (the observer is switched off: its notifications go
/// unacknowledged) and TD_COAP_OBS_05 (it rebooted: it answers a notification with
/// RST): the server drops both and goes on notifying a third.
fn obs_04_05_vanished_and_rebooted_observers(server: &PeerServer) {
    // OBS_04: the client is switched off: its notifications go unacknowledged.
    let off = Ghost::register(server, "/obs", 4);
    off.switched_off.set(true);
    // OBS_05: the client rebooted: it answers the next notification with RST.
    let rebooted = Ghost::register(server, "/obs", 5);
    let note = rebooted
        .recv(Duration::from_secs(5))
        .expect("a notification");
    assert_eq!(
        note.mtype,
        MessageType::Confirmable,
        "/obs notifies with CON"
    );
    rebooted
        .sock
        .send(&encode(&Message::reset(note.mid)))
        .unwrap();
    let first = off.recv(Duration::from_secs(5)).expect("a notification");
    // A witness keeps observing; once it has had three more notifications after the
    // vanished observer's retransmissions ended, the other two must have had none.
    let witness = Ghost::register(server, "/obs", 6);
    // Unacknowledged, the CON is retransmitted (or replaced by the next one) until
    // the server gives up; then nothing comes for 3 s.
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Some(m) = off.recv(Duration::from_secs(3)) {
        assert_eq!(m.mtype, MessageType::Confirmable, "{m:?}");
        assert!(
            Instant::now() < deadline,
            "the server never gives up on {first:?}"
        );
    }
    let _ = rebooted.drain();
    let mut seen = 0;
    while seen < 3 {
        let m = witness
            .recv(Duration::from_secs(5))
            .expect("the witness keeps getting notifications");
        if m.mtype == MessageType::Confirmable {
            witness
                .sock
                .send(&encode(&Message::empty_ack(m.mid)))
                .unwrap();
        }
        seen += 1;
    }
    assert!(
        off.drain().is_empty(),
        "TD_COAP_OBS_04: no more notifications"
    );
    assert!(
        rebooted.drain().is_empty(),
        "TD_COAP_OBS_05: no more notifications after the RST"
    );
}

/// Notifications of `obs` until one satisfies `pred`; every one before it must
/// satisfy `meanwhile` and the relation must not end first.
async fn until(
    obs: &mut cobalt::Observation,
    what: &str,
    pred: impl Fn(&cobalt::Response) -> bool,
    meanwhile: impl Fn(&cobalt::Response) -> bool,
) -> cobalt::Response {
    loop {
        let n = obs.next().await;
        let n = n.unwrap_or_else(|| panic!("{what}: the observation ended"));
        let n = n.unwrap_or_else(|e| panic!("{what}: {e}"));
        if pred(&n) {
            return n;
        }
        assert!(meanwhile(&n), "{what}: {n:?}");
    }
}

/// The tick number of a `/obs` clock text ("tick 7 at ...").
fn tick_of(r: &cobalt::Response) -> Option<u64> {
    r.text_payload()
        .strip_prefix("tick ")?
        .split(' ')
        .next()?
        .parse()
        .ok()
}

/// The server reboots (`/obs-reset`, TD_COAP_OBS_04 as issue 21 words it): it
/// forgets every observer without sending anything and `/obs` is back in its initial
/// state (the value stored by PUT gone, the clock from 0). The observer hears
/// nothing more, notices when the Max-Age of the last notification has run out and
/// registers again (Cobalt's client does that by itself).
async fn obs_server_reboot(client: &cobalt::Client, base: &str) {
    let uri = format!("{base}/obs");
    let reregistered = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = reregistered.clone();
    let mut obs = client
        .observe(&uri)
        .await
        .expect("observe")
        .on_reregister(move |r| log.lock().unwrap().push(r.reason.clone()));
    let content = |r: &cobalt::Response| r.code == Code::CONTENT;
    let first = until(&mut obs, "registration", content, |_| true).await;
    let before = tick_of(&first).expect("a clock text");
    let put = client
        .request(Code::PUT, &uri)
        .content_format(0)
        .payload("before the reboot")
        .send()
        .await
        .expect("PUT /obs");
    assert_eq!(put.code, Code::CHANGED);
    let stored = |r: &cobalt::Response| r.payload == b"before the reboot";
    until(&mut obs, "the PUT value", stored, content).await;
    let reboot = client
        .request(Code::POST, &format!("{base}/obs-reset"))
        .payload("sesame")
        .send()
        .await
        .expect("POST /obs-reset");
    assert_eq!(reboot.code, Code::CHANGED);
    // The initial state: the stored value (kept for 5 ticks) is gone, the clock restarted.
    let now = client.get(&uri).await.expect("GET /obs");
    assert_eq!(now.code, Code::CONTENT);
    let after = tick_of(&now).unwrap_or_else(|| panic!("a clock text: {now:?}"));
    assert!(
        after < before,
        "the clock restarted: {after} after {before}"
    );
    // Nothing comes until the observer registers again: had the relation lived on,
    // the clock's notifications every second would keep it from ever re-registering.
    // A notification that left before the reboot may still arrive.
    let again = until(
        &mut obs,
        "TD_COAP_OBS_04 (reboot)",
        |_| !reregistered.lock().unwrap().is_empty(),
        content,
    )
    .await;
    assert_eq!(again.code, Code::CONTENT, "registered again: {again:?}");
    assert!(tick_of(&again).is_some(), "{again:?}");
    let reasons = reregistered.lock().unwrap().clone();
    assert!(
        reasons.iter().all(|r| r.starts_with("no notification")),
        "noticed by Max-Age: {reasons:?}"
    );
    let cancelled = obs.cancel().await.expect("cancel");
    assert_eq!(cancelled.code, Code::CONTENT);
}

/// TD_COAP_OBS_07 (DELETE ends the observation of `/obs-non` with 4.04; the resource
/// is back), TD_COAP_OBS_08 (a PUT in another Content-Format than the text/plain the
/// observer registered for ends it with 4.06) and, right after it, TD_COAP_OBS_09 (a
/// new observer of `/obs` is notified of a PUT's text/plain value).
async fn obs_07_08_09(client: &cobalt::Client, base: &str) {
    let content = |r: &cobalt::Response| r.code == Code::CONTENT;
    let put = |cf: u16, body: &'static str| {
        client
            .request(Code::PUT, &format!("{base}/obs"))
            .content_format(cf)
            .payload(body)
            .send()
    };
    // TD_COAP_OBS_07
    let non = format!("{base}/obs-non");
    let mut obs = client.observe(&non).await.expect("observe");
    until(&mut obs, "registration", content, |_| true).await;
    let deleted = client.delete(&non).await.expect("DELETE /obs-non");
    assert_eq!(deleted.code, Code::DELETED);
    let not_found = |r: &cobalt::Response| r.code == Code::NOT_FOUND;
    until(&mut obs, "TD_COAP_OBS_07", not_found, content).await;
    assert!(obs.next().await.is_none(), "TD_COAP_OBS_07: ended");
    let again = client.get(&non).await.expect("GET /obs-non");
    assert_eq!(again.code, Code::CONTENT, "TD_COAP_OBS_07: back");
    // TD_COAP_OBS_08
    let mut obs = client
        .observe(&format!("{base}/obs"))
        .await
        .expect("observe");
    until(&mut obs, "registration", content, |_| true).await;
    assert_eq!(put(41, "<v/>").await.expect("PUT").code, Code::CHANGED);
    let not_acceptable = |r: &cobalt::Response| r.code == Code::NOT_ACCEPTABLE;
    until(&mut obs, "TD_COAP_OBS_08", not_acceptable, content).await;
    assert!(obs.next().await.is_none(), "TD_COAP_OBS_08: ended");
    // TD_COAP_OBS_09, while the XML value is still shown.
    let mut obs = client
        .observe(&format!("{base}/obs"))
        .await
        .expect("observe");
    until(&mut obs, "registration", content, |_| true).await;
    assert_eq!(
        put(0, "TD_COAP_OBS_09").await.expect("PUT").code,
        Code::CHANGED
    );
    let value = |r: &cobalt::Response| r.payload == b"TD_COAP_OBS_09";
    until(&mut obs, "TD_COAP_OBS_09", value, content).await;
    let cancelled = obs.cancel().await.expect("cancel");
    assert_eq!(cancelled.code, Code::CONTENT);
}

#[test]
fn td_coap_obs_13_large_notifications_with_cobalt_and_californium() {
    // Every notification of /obs-large (2500 bytes) carries its first block; the
    // observer completes it with Block2 requests (RFC 7959 §3.4).
    let server = crate::binary::start_cobalt(V4);
    let uri = server.uri("/obs-large");
    let californium = californium::need()
        .map(|cf| cf.spawn(&["observe", &uri, "--seconds", "4", "--cancel", "proactive"]));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut obs = cobalt::Client::new().observe(&uri).await.expect("observe");
        let mut ticks = Vec::new();
        for n in crate::notifications(&mut obs, 3).await {
            assert_eq!((n.code, n.payload.len()), (Code::CONTENT, 2500));
            let text = String::from_utf8_lossy(&n.payload).into_owned();
            ticks.push(text.split(' ').nth(1).unwrap_or_default().to_string());
        }
        ticks.dedup();
        assert!(ticks.len() >= 2, "new values: {ticks:?}");
    });
    if let Some(mut cf) = californium {
        cf.wait_exit(californium::CF_LIMIT);
        let lines = cf.lines();
        let whole: Vec<String> = lines
            .iter()
            .filter(|l| l.starts_with("NOTIFY ") && californium::field(l, "observe") != Some("-"))
            .filter_map(|l| californium::payload_of(l))
            .collect();
        assert!(whole.len() >= 2, "{lines:#?}");
        for p in &whole {
            assert!(
                p.starts_with("tick ") && p.len() == 2500,
                "{} bytes: {lines:#?}",
                p.len()
            );
        }
    }
}

//! Q-Block (RFC 9177) against libcoap 4.3.4, the first libcoap with it (Debian
//! bookworm's 4.3.1 has none; `scripts/install-test-deps.sh` unpacks trixie's
//! packages into `.cache/libcoap-4.3.4`): libcoap's `coap-client -L 5` (Q-Block)
//! downloads a large Cobalt resource in Q-Block2 sets and uploads a large body in
//! Q-Block1 sets, over UDP and DTLS (PSK), with `-l` dropping a share of what libcoap
//! sends (its requests for the next set or for missing blocks, its blocks, its ACKs).

use cobalt_test_support::need;
use cobalt_test_support::peers::libcoap::{self, Q_BLOCK_MODE};
use cobalt_test_support::peers::{PeerServer, COMMAND_LIMIT};
use cobalt_test_support::ports::V4;
use cobalt_test_support::process::{self, Ran};
use cobalt_test_support::temp::TempDir;
use std::path::Path;
use std::process::Command;

/// `/large` of `cobalt serve` (the demo's 4 KiB text).
const LARGE_SIZE: usize = 4096;

/// The PSK of the DTLS test.
const PSK_IDENTITY: &str = "qblock";
const PSK_KEY: &str = "secretPSK";

/// The demo's `/large` text (`cobalt serve`'s `large_text`): numbered lines.
fn large_text(len: usize) -> Vec<u8> {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < len {
        s.push_str(&format!(
            "line {i:04}: the quick brown fox jumps over the lazy dog\n"
        ));
        i += 1;
    }
    s.truncate(len);
    s.into_bytes()
}

/// libcoap 4.3.4's `bin ARGS` with Q-Block on (`-L 5`), waiting at most 60 s.
fn q_client(bin: &Path, args: &[&str]) -> Ran {
    process::run(
        Command::new(bin)
            .args(["-L", Q_BLOCK_MODE, "-B", "60"])
            .args(args),
        COMMAND_LIMIT * 3,
    )
}

/// Runs `args` with libcoap's Q-Block client, writing the body to a file, and
/// returns that body (with what the client printed, for a failure's message).
fn q_get(bin: &Path, dir: &TempDir, args: &[&str], uri: &str) -> (Vec<u8>, String) {
    let out = dir.path().join("got");
    let _ = std::fs::remove_file(&out);
    let out_arg = out.to_string_lossy().into_owned();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["-o", &out_arg, uri]);
    let ran = q_client(bin, &all);
    let got = std::fs::read(&out).unwrap_or_default();
    (got, format!("{ran:?}"))
}

/// `cobalt serve` on 127.0.0.1 with a DTLS port using [`PSK_KEY`]: the server and
/// its DTLS port (the key file lives in `dir`).
fn cobalt_server(dir: &TempDir) -> (PeerServer, u16) {
    let keys = dir.write("keys", format!("{PSK_IDENTITY}:{PSK_KEY}\n"));
    let dtls_port = cobalt_test_support::ports::free_udp_port(V4);
    let server = crate::binary::start_cobalt_with(
        V4,
        &[
            "--dtls-port",
            &dtls_port.to_string(),
            "--dtls-psk-file",
            &keys.to_string_lossy(),
        ],
    );
    (server, dtls_port)
}

/// libcoap's Q-Block client downloads `/large` in 64-byte Q-Block2 blocks (64 blocks,
/// 7 sets), CON and NON, while it drops 10% of what it sends: the body arrives whole.
/// libcoap's own client sometimes gives up at that loss (it renews its request when a
/// set's blocks go missing, and then may see a new ETag), so a lossy download gets
/// three attempts; the body must arrive whole in one of them.
#[test]
fn libcoap_q_block2_get_of_a_large_resource_through_loss() {
    let bin = need!(
        "libcoap 4.3.4 coap-client-notls",
        libcoap::qblock_tool(libcoap::CLIENT)
    );
    let dir = TempDir::new("qblock2-get");
    let (server, _) = cobalt_server(&dir);
    let uri = server.uri("/large");
    let want = large_text(LARGE_SIZE);
    for args in [
        &["-b", "64"][..],
        &["-N", "-b", "64"],
        &["-b", "64", "-l", "10%"],
        &["-N", "-b", "64", "-l", "10%"],
    ] {
        let download = || {
            let (got, ran) = q_get(&bin, &dir, args, &uri);
            match got == want {
                true => Ok(()),
                false => Err(format!("got {} bytes\n{ran}", got.len())),
            }
        };
        if args.contains(&"-l") {
            within_attempts(3, &format!("{args:?}"), download);
        } else if let Err(e) = download() {
            panic!("{args:?}: {e}");
        }
    }
}

/// libcoap's Q-Block client (with `-v 7`) shows that the body came in Q-Block2
/// blocks with one ETag, not in Block2 blocks.
#[test]
fn libcoap_sees_q_block2_blocks_with_one_etag() {
    let bin = need!(
        "libcoap 4.3.4 coap-client-notls",
        libcoap::qblock_tool(libcoap::CLIENT)
    );
    let dir = TempDir::new("qblock2-seen");
    let (server, _) = cobalt_server(&dir);
    let ran = q_client(&bin, &["-v", "7", "-N", "-b", "64", &server.uri("/large")]);
    let blocks: Vec<&str> = ran
        .stdout
        .lines()
        .filter(|l| l.starts_with("v:1 t:NON c:2.05 "))
        .collect();
    // After the blocks libcoap logs the reassembled body as one more (option-less) 2.05.
    assert!(!blocks.iter().any(|l| l.contains(" Block2:")));
    let blocks: Vec<&str> = blocks
        .into_iter()
        .filter(|l| l.contains("Q-Block2:"))
        .collect();
    assert!(
        blocks.len() >= 64,
        "{} blocks\n{}",
        blocks.len(),
        ran.stdout
    );
    let etag = |l: &str| {
        l.split("ETag:")
            .nth(1)
            .map(|t| t.split(',').next().unwrap_or("").to_string())
    };
    let first = etag(blocks[0]);
    assert!(first.is_some());
    assert!(blocks.iter().all(|l| etag(l) == first));
}

/// libcoap's Q-Block client uploads a 3,000-byte body with Q-Block1 (PUT, 64-byte
/// blocks: 47 blocks in 5 sets), NON and CON (one block per ACK), while it drops 10%
/// of what it sends; Cobalt's `/upload` stores each body whole. A lossy upload gets
/// three attempts (libcoap's client sometimes stops at a 4.08 it took as final).
#[test]
fn libcoap_q_block1_put_of_a_large_body_through_loss() {
    let bin = need!(
        "libcoap 4.3.4 coap-client-notls",
        libcoap::qblock_tool(libcoap::CLIENT)
    );
    let dir = TempDir::new("qblock1-put");
    let (server, _) = cobalt_server(&dir);
    let body: Vec<u8> = large_text(3000).into_iter().rev().collect();
    let file = dir.write("body", &body);
    let uri = server.uri("/upload");
    let file_arg = file.to_string_lossy().into_owned();
    let runs = [("-N", "0%"), ("-N", "10%"), ("", "0%"), ("", "10%")];
    for (i, (non, loss)) in runs.into_iter().enumerate() {
        // Each upload stores a body of its own.
        let mut body = body.clone();
        body[0] = b'a' + i as u8;
        std::fs::write(&file, &body).unwrap();
        let mut args = vec!["-m", "put", "-b", "64", "-l", loss, "-f", &file_arg, &uri];
        if !non.is_empty() {
            args.insert(0, non);
        }
        let upload = || {
            let ran = q_client(&bin, &args);
            let (got, get_ran) = q_get(&bin, &dir, &["-b", "1024"], &uri);
            match got == body {
                true => Ok(()),
                false => Err(format!(
                    "stored {} bytes\nput: {ran:?}\nget: {get_ran}",
                    got.len()
                )),
            }
        };
        if loss == "0%" {
            if let Err(e) = upload() {
                panic!("{non} loss {loss}: {e}");
            }
        } else {
            within_attempts(3, &format!("{non} loss {loss}"), upload);
        }
    }
}

/// Over DTLS (PSK), libcoap's Q-Block client on OpenSSL downloads `/large` in
/// Q-Block2 sets and uploads a body in Q-Block1 sets.
#[test]
fn libcoap_q_block_over_dtls() {
    let bin = need!(
        "libcoap 4.3.4 coap-client-openssl",
        libcoap::qblock_tool(libcoap::CLIENT_OPENSSL)
    );
    let dir = TempDir::new("qblock-dtls");
    let (server, dtls_port) = cobalt_server(&dir);
    let base = format!("coaps://127.0.0.1:{dtls_port}");
    let psk = ["-u", PSK_IDENTITY, "-k", PSK_KEY];
    let mut args = psk.to_vec();
    args.extend(["-N", "-b", "64"]);
    let (got, ran) = q_get(&bin, &dir, &args, &format!("{base}/large"));
    assert!(
        got == large_text(LARGE_SIZE),
        "got {} bytes\n{ran}",
        got.len()
    );
    let body = large_text(2500);
    let file = dir.write("body", &body);
    let file_arg = file.to_string_lossy().into_owned();
    let mut put = psk.to_vec();
    let upload = format!("{base}/upload");
    put.extend(["-m", "put", "-b", "64", "-f", &file_arg, &upload]);
    let ran = q_client(&bin, &put);
    let mut get = psk.to_vec();
    get.extend(["-b", "1024"]);
    let (got, get_ran) = q_get(&bin, &dir, &get, &upload);
    assert!(
        got == body,
        "stored {} bytes\nput: {ran:?}\nget: {get_ran}",
        got.len()
    );
    drop(server);
}

/// `cobalt ARGS` (a request command), bounded by the harness's limit.
fn cobalt(args: &[&str]) -> Ran {
    process::run(crate::binary::cobalt().args(args), COMMAND_LIMIT * 4)
}

/// Runs `attempt` up to `times` times until it succeeds; panics with every failure
/// otherwise. For transfers through a lossy libcoap 4.3.4: its client gives up now and
/// then, and its server sometimes renews a body's ETag when it takes a request for
/// missing blocks as a new request (see `bench/results/qblock-2026-11-27.md`).
fn within_attempts(times: usize, what: &str, mut attempt: impl FnMut() -> Result<(), String>) {
    let mut failed = Vec::new();
    for _ in 0..times {
        match attempt() {
            Ok(()) => return,
            Err(e) => failed.push(e),
        }
    }
    panic!("{what}: {failed:#?}");
}

/// The body a `cobalt` request command printed (it ends its output with a newline).
fn printed_body(ran: &Ran) -> &str {
    ran.stdout.strip_suffix('\n').unwrap_or(&ran.stdout)
}

/// `cobalt get -b 1024 URI EXTRA` prints `body` whole (what a server stored after an
/// upload); `what` names the run in the failure.
fn assert_stored(uri: &str, extra: &[&str], body: &[u8], what: &str) {
    let mut get = vec!["get", "-b", "1024", uri];
    get.extend(extra);
    let got = cobalt(&get);
    let got = printed_body(&got);
    assert!(got.as_bytes() == body, "{what}: stored {} bytes", got.len());
}

/// libcoap 4.3.4's `coap-server -L 5 -d 10 ARGS` (Q-Block; resources created by PUT)
/// holding `body` at `/big`, put there by its own Q-Block client; `quiet`: ready once
/// bound (a server dropping datagrams may not answer the readiness ping).
fn libcoap_server_with(bin: &Path, client: &Path, args: &[&str], body: &[u8]) -> PeerServer {
    let mut all = vec!["-L", Q_BLOCK_MODE, "-d", "10"];
    all.extend_from_slice(args);
    let port = if args.contains(&"-l") {
        libcoap::Port::CoapQuiet
    } else {
        libcoap::Port::Coap
    };
    let server = libcoap::server(bin, V4, &all, port, None);
    let dir = TempDir::new("qblock-server-body");
    let file = dir.write("body", body);
    let uri = server.uri("/big");
    let ran = q_client(client, &["-m", "put", "-f", &file.to_string_lossy(), &uri]);
    assert!(ran.status.success(), "PUT of /big: {ran:?}");
    server
}

/// Cobalt's client downloads a body from libcoap 4.3.4's Q-Block server with
/// `cobalt get --q-block` (64-byte blocks: 105 blocks in 11 sets), CON and NON; the
/// trace shows Q-Block2 (option 31) going out and coming back.
#[test]
fn cobalt_q_block2_get_from_libcoap() {
    let bin = need!(
        "libcoap 4.3.4 coap-server-notls",
        libcoap::qblock_tool(libcoap::SERVER)
    );
    let client = need!(
        "libcoap 4.3.4 coap-client-notls",
        libcoap::qblock_tool(libcoap::CLIENT)
    );
    let body: Vec<u8> = large_text(6668).into_iter().rev().collect();
    let server = libcoap_server_with(&bin, &client, &[], &body);
    let uri = server.uri("/big");
    for non in [false, true] {
        let mut args = vec![
            "get",
            "--q-block",
            "-b",
            "64",
            "-v",
            "--timeout",
            "60",
            &uri,
        ];
        if non {
            args.insert(1, "--non");
        }
        let ran = cobalt(&args);
        assert!(ran.status.success(), "{args:?}: {ran:?}");
        let got = printed_body(&ran);
        assert!(got.as_bytes() == body, "{args:?}: got {} bytes", got.len());
        assert!(ran.stderr.contains("> to") && ran.stderr.contains("Option(31)"));
    }
}

/// Cobalt's client downloads with Q-Block2 from libcoap 4.3.4's server that drops 5%
/// of what it sends (NON, 64-byte blocks, 40 blocks): the missing blocks are asked
/// for and the body arrives whole. Up to eight attempts: in a fresh-clone CI run, libcoap
/// renewed the body's ETag mid-transfer in three attempts in a row (the client rightly
/// stops there).
#[test]
fn cobalt_q_block2_get_from_libcoap_through_loss() {
    let bin = need!(
        "libcoap 4.3.4 coap-server-notls",
        libcoap::qblock_tool(libcoap::SERVER)
    );
    let client = need!(
        "libcoap 4.3.4 coap-client-notls",
        libcoap::qblock_tool(libcoap::CLIENT)
    );
    let body = large_text(2500);
    let server = libcoap_server_with(&bin, &client, &["-l", "5%"], &body);
    let uri = server.uri("/big");
    within_attempts(8, "a download through 5% loss", || {
        let ran = cobalt(&[
            "get",
            "--non",
            "--q-block",
            "-b",
            "64",
            "--timeout",
            "90",
            &uri,
        ]);
        let got = printed_body(&ran);
        match ran.status.success() && got.as_bytes() == body {
            true => Ok(()),
            false => Err(format!("got {} bytes: {ran:?}", got.len())),
        }
    });
}

/// `cobalt get --q-block` against `cobalt serve`: `/large` in Q-Block2 sets (CON and
/// NON), over UDP and DTLS.
#[test]
fn cobalt_q_block2_get_from_cobalt() {
    let dir = TempDir::new("qblock2-cobalt");
    let (server, dtls_port) = cobalt_server(&dir);
    let want = large_text(LARGE_SIZE);
    let coaps = format!("coaps://127.0.0.1:{dtls_port}/large");
    let udp = server.uri("/large");
    let psk = ["--psk-identity", PSK_IDENTITY, "--psk-key", PSK_KEY];
    for (uri, non) in [(&udp, false), (&udp, true), (&coaps, false), (&coaps, true)] {
        let mut args = vec!["get", "--q-block", "-b", "64", "-v", uri.as_str()];
        if non {
            args.insert(1, "--non");
        }
        if uri.starts_with("coaps") {
            args.extend(psk);
        }
        let ran = cobalt(&args);
        assert!(ran.status.success(), "{args:?}: {ran:?}");
        let got = printed_body(&ran);
        assert!(got.as_bytes() == want, "{args:?}: got {} bytes", got.len());
        // Every block came as a message of its own (not one whole answer).
        let blocks = ran.stderr.matches("< from").count();
        assert!(
            blocks >= 64,
            "{args:?}: {blocks} messages in\n{}",
            ran.stderr
        );
    }
}

/// `cobalt put --q-block -p @FILE URI` with `extra` arguments: the upload ran (its
/// exit status checked by the caller) with the trace (`-v`) on standard error.
fn cobalt_q_put(file: &Path, uri: &str, extra: &[&str]) -> Ran {
    let payload = format!("@{}", file.to_string_lossy());
    let mut args = vec!["put", "--q-block", "-b", "64", "-v", "--timeout", "90"];
    args.extend_from_slice(extra);
    args.extend(["-p", &payload, uri]);
    cobalt(&args)
}

/// Cobalt's client uploads a 6,200-byte body to libcoap 4.3.4's Q-Block server
/// (`-d 10`: a PUT creates the resource) with `cobalt put --q-block` (64-byte blocks:
/// 97 blocks in 10 sets), CON (libcoap acknowledges every block and sends no 2.31)
/// and NON (2.31 per set); libcoap then serves the body it reassembled. The trace shows
/// Q-Block1 (option 19) going out.
#[test]
fn cobalt_q_block1_put_to_libcoap() {
    let bin = need!(
        "libcoap 4.3.4 coap-server-notls",
        libcoap::qblock_tool(libcoap::SERVER)
    );
    let server = libcoap::server(
        &bin,
        V4,
        &["-L", Q_BLOCK_MODE, "-d", "10"],
        libcoap::Port::Coap,
        None,
    );
    let dir = TempDir::new("qblock1-libcoap");
    for non in [false, true] {
        let body: Vec<u8> = large_text(6200 + usize::from(non))
            .into_iter()
            .rev()
            .collect();
        let file = dir.write("body", &body);
        let uri = server.uri(if non { "/non" } else { "/con" });
        let ran = cobalt_q_put(&file, &uri, if non { &["--non"] } else { &[] });
        assert!(ran.status.success(), "non {non}: {ran:?}");
        assert!(
            ran.stderr.contains("Option(19)"),
            "non {non}: {}",
            ran.stderr
        );
        let blocks = ran.stderr.matches("> to").count();
        assert_eq!(blocks, 97, "non {non}: each block once without loss");
        assert_stored(&uri, &[], &body, &format!("non {non}"));
    }
}

/// Over DTLS (PSK), `cobalt put --q-block` uploads to libcoap 4.3.4's Q-Block server
/// on OpenSSL, CON and NON, and libcoap serves the body it reassembled.
#[test]
fn cobalt_q_block1_put_to_libcoap_over_dtls() {
    let bin = need!(
        "libcoap 4.3.4 coap-server-openssl",
        libcoap::qblock_tool(libcoap::SERVER_OPENSSL)
    );
    let server = libcoap::server(
        &bin,
        V4,
        &["-L", Q_BLOCK_MODE, "-d", "10", "-k", PSK_KEY],
        libcoap::Port::Coaps,
        None,
    );
    let dir = TempDir::new("qblock1-libcoap-dtls");
    let psk = ["--psk-identity", PSK_IDENTITY, "--psk-key", PSK_KEY];
    for non in [false, true] {
        let body = large_text(3100 + usize::from(non));
        let file = dir.write("body", &body);
        let uri = server.scheme_uri("coaps", if non { "/non" } else { "/con" });
        let mut extra: Vec<&str> = psk.to_vec();
        if non {
            extra.push("--non");
        }
        let ran = cobalt_q_put(&file, &uri, &extra);
        assert!(ran.status.success(), "non {non}: {ran:?}");
        assert_stored(&uri, &psk, &body, &format!("non {non}"));
    }
}

/// Cobalt's client uploads with Q-Block1 (NON, 40 blocks) to libcoap 4.3.4's server
/// that drops 10% of what it sends (2.31s, 4.08s, the final answer): the client goes
/// on after NON_TIMEOUT, sends the blocks asked for again, asks again with the last
/// block, and the body arrives whole.
#[test]
fn cobalt_q_block1_put_to_libcoap_through_loss() {
    let bin = need!(
        "libcoap 4.3.4 coap-server-notls",
        libcoap::qblock_tool(libcoap::SERVER)
    );
    let server = libcoap::server(
        &bin,
        V4,
        &["-L", Q_BLOCK_MODE, "-d", "10", "-l", "10%"],
        libcoap::Port::CoapQuiet,
        None,
    );
    let dir = TempDir::new("qblock1-libcoap-loss");
    let body = large_text(2500);
    let file = dir.write("body", &body);
    let uri = server.uri("/lossy");
    within_attempts(3, "an upload through 10% loss", || {
        let ran = cobalt_q_put(&file, &uri, &["--non"]);
        if !ran.status.success() {
            return Err(format!("{ran:?}"));
        }
        // The server also drops 10% of its answers to the GETs: asked until whole.
        let whole = (0..10).any(|_| {
            let got = cobalt(&["get", "-b", "1024", "--timeout", "20", &uri]);
            printed_body(&got).as_bytes() == body
        });
        match whole {
            true => Ok(()),
            false => Err("the body stored is not the one uploaded".into()),
        }
    });
}

/// `cobalt put --q-block` against `cobalt serve`'s `/upload`: CON and NON, over UDP
/// and DTLS; `/upload` then serves the body whole.
#[test]
fn cobalt_q_block1_put_to_cobalt() {
    let dir = TempDir::new("qblock1-cobalt");
    let (server, dtls_port) = cobalt_server(&dir);
    let coaps = format!("coaps://127.0.0.1:{dtls_port}/upload");
    let udp = server.uri("/upload");
    let psk = ["--psk-identity", PSK_IDENTITY, "--psk-key", PSK_KEY];
    let runs = [(&udp, false), (&udp, true), (&coaps, false), (&coaps, true)];
    for (i, (uri, non)) in runs.into_iter().enumerate() {
        let mut body = large_text(3000 + i);
        body[0] = b'a' + i as u8;
        let file = dir.write("body", &body);
        let mut extra: Vec<&str> = Vec::new();
        if non {
            extra.push("--non");
        }
        if uri.starts_with("coaps") {
            extra.extend(psk);
        }
        let ran = cobalt_q_put(&file, uri, &extra);
        assert!(ran.status.success(), "{uri} non {non}: {ran:?}");
        assert!(ran.stderr.contains("Option(19)"), "{uri}: {}", ran.stderr);
        let get_extra: &[&str] = if uri.starts_with("coaps") { &psk } else { &[] };
        assert_stored(uri, get_extra, &body, &format!("{uri} non {non}"));
    }
}

/// libcoap's Q-Block client observes `cobalt serve --plugtest`'s `/obs-large` (2,500
/// bytes changing every second, confirmable notifications) for 4 s (8 s with loss) in
/// 256-byte blocks (one set of 10), with a CON and a NON registration and with 10% of
/// what it sends dropped: each notification comes as a Q-Block2 set (RFC 9177 §4.4)
/// and libcoap prints each whole.
#[test]
fn libcoap_observes_with_q_block2_sets() {
    let bin = need!(
        "libcoap 4.3.4 coap-client-notls",
        libcoap::qblock_tool(libcoap::CLIENT)
    );
    let dir = TempDir::new("qblock2-observe");
    let (server, _) = cobalt_server(&dir);
    let uri = server.uri("/obs-large");
    // Each notification is "tick N at TIME" padded with dots to 2,500 bytes.
    let padding = ".".repeat(2400);
    // Longer under loss: a lost ACK delays a confirmable notification by seconds.
    for args in [
        &["-s", "4"][..],
        &["-s", "4", "-N"],
        &["-s", "8", "-l", "10%"],
    ] {
        let mut all = vec!["-b", "256"];
        all.extend_from_slice(args);
        all.push(&uri);
        let ran = q_client(&bin, &all);
        let whole = ran.stdout.matches(&padding).count();
        let started = ran.stdout.matches("tick ").count();
        assert!(whole >= 2, "{args:?}: {whole} whole notifications\n{ran:?}");
        assert_eq!(
            whole, started,
            "{args:?}: a notification cut short\n{ran:?}"
        );
    }
}

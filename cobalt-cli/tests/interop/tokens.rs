//! Extended tokens (RFC 8974) with real peers, both ways. What the peers do:
//!
//! * libcoap 4.3.1 (Debian's) predates RFC 8974: its server rejects a request whose
//!   token is longer than eight bytes with RST — the answer by which RFC 8974 §2.2.2 has
//!   a client learn that a server lacks extended tokens — and `coap-client -T` sends at
//!   most eight bytes of the token it is given.
//! * aiocoap 0.4.17 takes a token length nibble of 9 to 12 as the length itself, as
//!   RFC 8974 does, but knows nothing of the extended lengths (13, 14): a request with
//!   a longer token is dropped unanswered. Its client has no way to choose a token.
//!
//! `cobalt serve` against Cobalt's client covers what neither peer can send: tokens of
//! every length up to the limit over UDP and TCP, and 4.00 beyond it.

use crate::{aiocoap_server, coap_client, libcoap_server};
use cobalt_test_support::peers::libcoap;
use cobalt_test_support::peers::{require, COMMAND_LIMIT};
use cobalt_test_support::ports::V4;
use cobalt_test_support::process::{self, Ran};

/// `cobalt ARGS --timeout SECONDS`.
fn cobalt(args: &[&str], seconds: u32) -> Ran {
    process::run(
        crate::binary::cobalt()
            .args(args)
            .args(["--timeout", &seconds.to_string()]),
        COMMAND_LIMIT,
    )
}

/// A token of `len` bytes as hex digits.
fn hex_token(len: usize) -> String {
    (0..len).map(|i| format!("{:02x}", 0xa0 + i % 16)).collect()
}

#[test]
fn libcoap_server_rejects_tokens_longer_than_8_bytes_with_rst() {
    let Some(server) = libcoap_server() else {
        return;
    };
    let uri = server.uri("/");
    cobalt(&["get", "--token", &hex_token(8), &uri], 10).ok();
    for len in [9, 13, 40] {
        let r = cobalt(&["get", "-v", "--token", &hex_token(len), &uri], 10);
        assert!(!r.status.success(), "{len} bytes: {r}");
        assert!(
            r.stderr.contains("rejected by") && r.stderr.contains("with RST"),
            "{len} bytes: {r}"
        );
    }
}

#[test]
fn libcoap_client_token_is_echoed_and_capped_at_8_bytes() {
    let Some(bin) = require(libcoap::CLIENT, libcoap::tool(libcoap::CLIENT)) else {
        return;
    };
    let server = crate::binary::start_cobalt(V4);
    let r = coap_client(
        &bin,
        &[
            "-v",
            "7",
            "-T",
            "0123456789abcdef",
            &server.uri("/benchmark"),
        ],
    )
    .ok();
    // The 16 characters given become an 8-byte starting token (libcoap counts up from
    // it), echoed in the answer.
    let ack = r
        .stdout
        .lines()
        .find(|l| l.starts_with("v:1 t:ACK c:2.05 "))
        .unwrap_or_else(|| panic!("no 2.05 ACK: {r}"));
    let token = ack.split(['{', '}']).nth(1).unwrap_or_default();
    assert!(
        token.len() == 16 && token.starts_with("30313233343536"),
        "{ack}"
    );
}

#[test]
fn aiocoap_server_answers_9_to_12_byte_tokens_but_drops_extended_lengths() {
    let Some(server) = aiocoap_server() else {
        return;
    };
    let uri = server.uri("/hello");
    for len in [9, 12] {
        let r = cobalt(&["get", "-v", "--token", &hex_token(len), &uri], 10).ok();
        assert_eq!(r.stdout.trim_end(), "hello from aiocoap", "{len} bytes");
        assert!(
            r.stderr
                .contains(&format!("2.05 Content token={}", hex_token(len))),
            "{r}"
        );
    }
    // TKL 13: aiocoap reads the extension byte as part of the token and fails on
    // the options after it.
    let r = cobalt(&["get", "--token", &hex_token(13), &uri], 3);
    assert!(!r.status.success(), "{r}");
    assert!(r.stderr.contains("no response within 3s"), "{r}");
}

#[test]
fn cobalt_serve_echoes_long_tokens_over_udp_and_tcp_and_refuses_longer_ones() {
    // --tcp: CoAP over TCP on the UDP port's number.
    let server = crate::binary::start_cobalt_with(V4, &["--tcp"]);
    let udp = server.uri("");
    let tcp = udp.replace("coap://", "coap+tcp://");
    for base in [&udp, &tcp] {
        for len in [9, 13, 64] {
            let token = hex_token(len);
            let r = cobalt(
                &["get", "-v", "--token", &token, &format!("{base}/benchmark")],
                10,
            )
            .ok();
            assert_eq!(r.stdout.trim_end(), "hello world", "{base}, {len} bytes");
            assert!(
                r.stderr.contains(&format!("2.05 Content token={token}")),
                "{r}"
            );
        }
    }
    // Beyond the server's max_token_len (64): over UDP 4.00 from the server, over TCP
    // the client does not send it, as the server's CSM announced 64.
    let too_long = hex_token(65);
    let r = cobalt(
        &["get", "--token", &too_long, &format!("{udp}/benchmark")],
        10,
    );
    assert!(r.stderr.contains("4.00 Bad Request"), "{r}");
    let r = cobalt(
        &["get", "--token", &too_long, &format!("{tcp}/benchmark")],
        10,
    );
    assert!(
        r.stderr
            .contains("token of 65 bytes is longer than the 64 the peer"),
        "{r}"
    );
}

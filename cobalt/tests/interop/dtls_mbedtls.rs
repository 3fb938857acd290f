//! CoAP over DTLS on the Mbed TLS backend (the one with the DTLS Connection ID, RFC
//! 9146) against real peers: libcoap's `coap-client-openssl` (4.3.1: no CID, so a
//! plain PSK session with a server that offers one), the Cobalt client asking
//! `coap-server-openssl` for a CID it does not grant, and Californium's Scandium
//! client with a CID through a loopback "NAT" that gives it a new source port after
//! each pause (`tests/peers/californium`, `CidClient`).

use crate::{fetch, gets_posts_and_gets_big, our_server, run, start_on, Tool};
use cobalt::transport::credentials::PskStore;
use cobalt::transport::dtls::{DtlsBackendKind, DtlsConfig};
use cobalt::{Client, Code, Scheme, Server};
use cobalt_test_support::need;
use cobalt_test_support::peers::libcoap::{self, Port, CLIENT_OPENSSL, SERVER_OPENSSL};
use cobalt_test_support::ports::V4;
use cobalt_test_support::psk::{IDENTITY, KEY};
use std::time::Duration;

/// The Mbed TLS backend granting 6-byte CIDs that start with node id `c0ba`.
pub(crate) fn with_cid() -> DtlsConfig {
    DtlsConfig {
        backend: DtlsBackendKind::Mbedtls,
        cid_len: 6,
        cid_node_id: "c0ba".into(),
        ..DtlsConfig::default()
    }
}

fn mbedtls_server(hello: &'static str, config: DtlsConfig) -> Server {
    our_server(hello)
        .psk(PskStore::new().with(IDENTITY, KEY))
        .dtls_config(config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_against_our_mbedtls_server_with_and_without_a_cid() {
    let client = need!(CLIENT_OPENSSL, libcoap::tool(CLIENT_OPENSSL));
    let plain = DtlsConfig {
        backend: DtlsBackendKind::Mbedtls,
        ..DtlsConfig::default()
    };
    for config in [plain, with_cid()] {
        let (server, base) =
            start_on(mbedtls_server("hello over mbedtls", config), Scheme::Coaps).await;
        let psk = ["-u", IDENTITY, "-k", KEY];
        gets_posts_and_gets_big(Tool::Libcoap, &client, &psk, &base, "hello over mbedtls").await;
        // The wrong key gets nothing.
        let uri = format!("{base}/hello");
        let out = run(&client, &["-u", IDENTITY, "-k", "wrong", "-B", "5", &uri]).await;
        assert!(!out.stdout.contains("hello over mbedtls"), "{out}");
        server.shutdown(Duration::ZERO).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_cid_client_against_libcoap_server_that_grants_none() {
    let program = need!(SERVER_OPENSSL, libcoap::tool(SERVER_OPENSSL));
    let args = ["-k", KEY, "-h", IDENTITY];
    let server = libcoap::server(&program, V4, &args, Port::Coaps, None);
    let client = Client::new()
        .with_dtls_cid()
        .unwrap()
        .with_psk(IDENTITY, KEY);
    let r = fetch(&client, &server.scheme_uri("coaps", "/")).await;
    assert_eq!(r.code, Code::CONTENT);
    assert!(r.text_payload().contains("libcoap"), "{}", r.text_payload());
}

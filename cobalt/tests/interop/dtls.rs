//! CoAP over DTLS (`coaps://`) with libcoap built on OpenSSL, with PSK and with
//! certificates from a CA generated at run time (client certificates required):
//! `coap-client-openssl` against a Cobalt server, and the Cobalt client against
//! `coap-server-openssl` (which, given `-p N`, serves coap on N and coaps on N+1).

use crate::common::TestCredentials;
use crate::{fetch, gets_posts_and_gets_big, our_server, run, start_on, Tool};
use cobalt::transport::credentials::PskStore;
use cobalt::{Client, Code, Scheme};
use cobalt_test_support::need;
use cobalt_test_support::peers::libcoap::{self, Port, CLIENT_OPENSSL, SERVER_OPENSSL};
use cobalt_test_support::pki::PkiFiles;
use cobalt_test_support::ports::V4;
use cobalt_test_support::psk::{IDENTITY, KEY};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_against_our_dtls_server() {
    let client = need!(CLIENT_OPENSSL, libcoap::tool(CLIENT_OPENSSL));
    let server = our_server("hello over dtls").psk(PskStore::new().with(IDENTITY, KEY));
    let (server, base) = start_on(server.shards(1), Scheme::Coaps).await;
    let psk = ["-u", IDENTITY, "-k", KEY];
    gets_posts_and_gets_big(Tool::Libcoap, &client, &psk, &base, "hello over dtls").await;
    // The wrong key gets nothing.
    let uri = format!("{base}/hello");
    let out = run(&client, &["-u", IDENTITY, "-k", "wrong", "-B", "5", &uri]).await;
    assert!(!out.stdout.contains("hello over dtls"), "{out}");
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_against_libcoap_dtls_server() {
    let program = need!(SERVER_OPENSSL, libcoap::tool(SERVER_OPENSSL));
    let args = ["-k", KEY, "-h", IDENTITY];
    let server = libcoap::server(&program, V4, &args, Port::Coaps, None);
    let client = Client::new().with_psk(IDENTITY, KEY);
    let r = fetch(&client, &server.scheme_uri("coaps", "/")).await;
    assert_eq!(r.code, Code::CONTENT);
    assert!(r.text_payload().contains("libcoap"), "{}", r.text_payload());
    // A second request over the same session.
    let r = fetch(&client, &server.scheme_uri("coaps", "/time")).await;
    assert!(
        r.code.is_success() || r.code == Code::NOT_FOUND,
        "{}",
        r.code
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_with_certificates_against_our_server() {
    let client = need!(CLIENT_OPENSSL, libcoap::tool(CLIENT_OPENSSL));
    let files = PkiFiles::new("x509-server");
    let server = our_server("hello over x509").x509(TestCredentials::from_pki(&files.pki).server);
    let (server, base) = start_on(server.shards(1), Scheme::Coaps).await;
    let pki = libcoap::pki_args(&files, "client");
    let uri = format!("{base}/hello");
    let args: Vec<&str> = pki
        .iter()
        .map(String::as_str)
        .chain(["-B", "5", &uri])
        .collect();
    run(&client, &args)
        .await
        .assert_stdout_has("hello over x509");
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_with_certificates_against_libcoap_server() {
    let program = need!(SERVER_OPENSSL, libcoap::tool(SERVER_OPENSSL));
    let files = PkiFiles::new("x509-client");
    let pki = libcoap::pki_args(&files, "server");
    let args: Vec<&str> = pki.iter().map(String::as_str).collect();
    let server = libcoap::server(&program, V4, &args, Port::Coaps, None);
    let client = Client::new().with_x509(TestCredentials::from_pki(&files.pki).client);
    let r = fetch(&client, &server.scheme_uri("coaps", "/")).await;
    assert!(r.text_payload().contains("libcoap"), "{}", r.text_payload());
}

/// Californium's Scandium (its own record layer, in Java) with PSK and CCM_8
/// against the OpenSSL backend, whose established sessions protect their records
/// without OpenSSL: three requests over one session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scandium_client_against_our_openssl_server_over_one_session() {
    let Some(cf) = cobalt_test_support::peers::californium::need() else {
        return;
    };
    let server = our_server("hello over dtls").psk(PskStore::new().with(IDENTITY, KEY));
    let (server, _) = start_on(server.shards(1), Scheme::Coaps).await;
    let uri = format!(
        "coaps://{}/hello",
        server.local_addr(Scheme::Coaps).unwrap()
    );
    let lines = tokio::task::spawn_blocking(move || {
        cf.run_program("CidClient", &[&uri, IDENTITY, KEY, "3", "100"])
    })
    .await
    .unwrap();
    assert!(lines.iter().any(|l| l == "DONE ok=3"), "{lines:?}");
    let totals = server.metrics().total();
    assert_eq!(totals.dtls_handshakes, 1, "one session for three requests");
    server.shutdown(Duration::ZERO).await;
}

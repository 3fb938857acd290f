//! CoAP over DTLS (`coaps://`) with libcoap built on OpenSSL, with PSK and with
//! certificates from a CA generated at run time (client certificates required):
//! `coap-client-openssl` against a Cobalt server, and the Cobalt client against
//! `coap-server-openssl` (which, given `-p N`, serves coap on N and coaps on N+1).

use crate::common::TestCredentials;
use crate::{gets_posts_and_gets_big, our_server, run, Tool};
use cobalt::transport::credentials::PskStore;
use cobalt::{Client, Code, Scheme, ServerHandle};
use cobalt_test_support::need;
use cobalt_test_support::peers::libcoap::{self, Port};
use cobalt_test_support::pki::PkiFiles;
use cobalt_test_support::ports::V4;
use cobalt_test_support::psk::{IDENTITY, KEY};
use std::time::Duration;

async fn our_dtls_server() -> ServerHandle {
    our_server("hello over dtls")
        .psk(PskStore::new().with(IDENTITY, KEY))
        .shards(1)
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_against_our_dtls_server() {
    let client = need!(
        libcoap::CLIENT_OPENSSL,
        libcoap::tool(libcoap::CLIENT_OPENSSL)
    );
    let server = our_dtls_server().await;
    let base = format!("coaps://{}", server.local_addr(Scheme::Coaps).unwrap());
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
    let program = need!(
        libcoap::SERVER_OPENSSL,
        libcoap::tool(libcoap::SERVER_OPENSSL)
    );
    let server = libcoap::server(
        &program,
        V4,
        &["-k", KEY, "-h", IDENTITY],
        Port::Coaps,
        None,
    );
    let client = Client::new().with_psk(IDENTITY, KEY);
    let r = client
        .request(Code::GET, &server.scheme_uri("coaps", "/"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.code, Code::CONTENT);
    assert!(r.text_payload().contains("libcoap"), "{}", r.text_payload());
    // A second request over the same session.
    let r = client
        .request(Code::GET, &server.scheme_uri("coaps", "/time"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert!(
        r.code.is_success() || r.code == Code::NOT_FOUND,
        "{}",
        r.code
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_with_certificates_against_our_server() {
    let client = need!(
        libcoap::CLIENT_OPENSSL,
        libcoap::tool(libcoap::CLIENT_OPENSSL)
    );
    let files = PkiFiles::new("x509-server");
    let server = our_server("hello over x509")
        .x509(TestCredentials::from_pki(&files.pki).server)
        .shards(1)
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let uri = format!(
        "coaps://{}/hello",
        server.local_addr(Scheme::Coaps).unwrap()
    );
    let (cert, key, ca) = (
        files.path("client.pem"),
        files.path("client.key"),
        files.path("ca.pem"),
    );
    let args = [
        "-c", &cert, "-j", &key, "-C", &ca, "-R", &ca, "-B", "5", &uri,
    ];
    run(&client, &args)
        .await
        .assert_stdout_has("hello over x509");
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_with_certificates_against_libcoap_server() {
    let program = need!(
        libcoap::SERVER_OPENSSL,
        libcoap::tool(libcoap::SERVER_OPENSSL)
    );
    let files = PkiFiles::new("x509-client");
    let (cert, key, ca) = (
        files.path("server.pem"),
        files.path("server.key"),
        files.path("ca.pem"),
    );
    let args = ["-c", &cert, "-j", &key, "-C", &ca, "-R", &ca];
    let server = libcoap::server(&program, V4, &args, Port::Coaps, None);
    let r = Client::new()
        .with_x509(TestCredentials::from_pki(&files.pki).client)
        .request(Code::GET, &server.scheme_uri("coaps", "/"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert!(r.text_payload().contains("libcoap"), "{}", r.text_payload());
}

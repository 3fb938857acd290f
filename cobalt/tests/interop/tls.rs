//! CoAP over TLS (`coaps+tcp://`, RFC 8323 §8.2): libcoap built on OpenSSL
//! (`coap-client-openssl`, `coap-server-openssl`) with certificates from a CA made at
//! run time and with PSK, in both directions, and aiocoap (Python's `ssl`, trusting
//! our CA through `SSL_CERT_FILE`) over TLS and secure WebSockets, both directions.

use crate::common::TestCredentials;
use crate::{fetch, gets_posts_and_gets_big, our_server, run, run_command, Tool, LIMIT};
use cobalt::transport::credentials::{PskStore, X509Credentials};
use cobalt::{Client, Code, Scheme, ServerHandle};
use cobalt_test_support::need;
use cobalt_test_support::peers::aiocoap::{self, Serve};
use cobalt_test_support::peers::libcoap::{self, Port, CLIENT_OPENSSL, SERVER_OPENSSL};
use cobalt_test_support::pki::PkiFiles;
use cobalt_test_support::ports::V4;
use cobalt_test_support::psk::{IDENTITY, KEY};
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

/// A server over TLS with `files`' server certificate (asking for a client
/// certificate if `require_client_cert`) and the PSK, on `schemes`.
async fn our_tls_server(
    files: &PkiFiles,
    require_client_cert: bool,
    schemes: &[Scheme],
) -> ServerHandle {
    let mut creds = TestCredentials::from_pki(&files.pki).server;
    if !require_client_cert {
        creds.ca_pem = None;
    }
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = our_server("hello over tls")
        .x509(creds)
        .psk(PskStore::new().with(IDENTITY, KEY))
        .shards(1);
    let server = schemes
        .iter()
        .fold(server, |s, &scheme| s.listen(scheme, any));
    server.bind(any).await.unwrap()
}

/// `coaps+tcp://ADDR` of a server.
fn tls_base(server: &ServerHandle) -> String {
    format!(
        "coaps+tcp://{}",
        server.local_addr(Scheme::CoapsTcp).unwrap()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_with_certificates_against_our_tls_server() {
    let client = need!(CLIENT_OPENSSL, libcoap::tool(CLIENT_OPENSSL));
    let files = PkiFiles::new("tls-server");
    let server = our_tls_server(&files, true, &[Scheme::CoapsTcp]).await;
    let pki = libcoap::pki_args(&files, "client");
    let pki: Vec<&str> = pki.iter().map(String::as_str).collect();
    gets_posts_and_gets_big(
        Tool::Libcoap,
        &client,
        &pki,
        &tls_base(&server),
        "hello over tls",
    )
    .await;
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_with_psk_against_our_tls_server() {
    let client = need!(CLIENT_OPENSSL, libcoap::tool(CLIENT_OPENSSL));
    let files = PkiFiles::new("tls-psk-server");
    let server = our_tls_server(&files, false, &[Scheme::CoapsTcp]).await;
    let uri = format!("{}/hello", tls_base(&server));
    let psk = ["-u", IDENTITY, "-k", KEY, "-m", "get", &uri];
    run(&client, &psk).await.assert_stdout_has("hello over tls");
    // The wrong key gets nothing, and the server goes on serving.
    let wrong = ["-u", IDENTITY, "-k", "wrong", "-m", "get", &uri];
    let out = run(&client, &wrong).await;
    assert!(!out.stdout.contains("hello over tls"), "{out}");
    run(&client, &psk).await.assert_stdout_has("hello over tls");
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_against_libcoap_tls_server() {
    let program = need!(SERVER_OPENSSL, libcoap::tool(SERVER_OPENSSL));
    let files = PkiFiles::new("tls-client");
    let pki = libcoap::pki_args(&files, "server");
    let psk = ["-k", KEY, "-h", IDENTITY];
    let args: Vec<&str> = pki.iter().map(String::as_str).chain(psk).collect();
    let server = libcoap::server(&program, V4, &args, Port::CoapsTcp, None);
    let uri = server.scheme_uri("coaps+tcp", "/");
    // Certificates both ways (libcoap asks for a client certificate with -C/-R), and
    // PSK.
    let x509 = Client::new().with_x509(TestCredentials::from_pki(&files.pki).client);
    for client in [x509, Client::new().with_psk(IDENTITY, KEY)] {
        let r = fetch(&client, &uri).await;
        assert_eq!(r.code, Code::CONTENT);
        assert!(r.text_payload().contains("libcoap"), "{}", r.text_payload());
    }
    // A CA that did not sign libcoap's certificate: a clear TLS error.
    let other = PkiFiles::new("tls-other");
    let err = Client::new()
        .with_x509(X509Credentials {
            ca_pem: Some(other.pki.ca_pem.clone()),
            ..X509Credentials::default()
        })
        .request(Code::GET, &uri)
        .timeout(LIMIT)
        .send()
        .await
        .unwrap_err();
    assert!(matches!(err, cobalt::Error::Tls { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aiocoap_client_over_tls_and_secure_websockets_against_our_server() {
    let client = need!("aiocoap-client", aiocoap::client());
    let files = PkiFiles::new("tls-aiocoap");
    let server = our_tls_server(&files, false, &[Scheme::CoapsTcp, Scheme::CoapsWs]).await;
    // aiocoap checks the certificate against the host name it was given, and trusts
    // the CAs in SSL_CERT_FILE (Python's ssl defaults).
    for scheme in [Scheme::CoapsTcp, Scheme::CoapsWs] {
        let port = server.local_addr(scheme).unwrap().port();
        let mut command = Command::new(&client);
        command
            .arg(format!("{scheme}://localhost:{port}/hello"))
            .env("SSL_CERT_FILE", files.path("ca.pem"));
        run_command(command)
            .await
            .assert_stdout_has("hello over tls");
    }
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_against_aiocoap_tls_and_wss_servers() {
    let python = need!("aiocoap", aiocoap::python());
    let files = PkiFiles::new("tls-aiocoap-server");
    let client = Client::new().with_x509(X509Credentials {
        ca_pem: Some(files.pki.ca_pem.clone()),
        ..X509Credentials::default()
    });
    let (cert, key) = (files.path("server.pem"), files.path("server.key"));
    for (serve, scheme) in [(Serve::Tls, "coaps+tcp"), (Serve::Wss, "coaps+ws")] {
        let server = aiocoap::server(&python, serve, Some((&cert, &key)));
        // By name: the certificate names localhost.
        let base = format!("{scheme}://localhost:{}", server.addr.port());
        let r = fetch(&client, &format!("{base}/hello")).await;
        assert_eq!(
            (r.code, r.text_payload().as_str()),
            (Code::CONTENT, "hello from aiocoap"),
            "{scheme}"
        );
        let r = client
            .request(Code::POST, &format!("{base}/echo"))
            .payload("from cobalt over tls")
            .timeout(LIMIT)
            .send()
            .await
            .unwrap();
        assert_eq!(r.text_payload(), "from cobalt over tls", "{scheme}");
    }
}

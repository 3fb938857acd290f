//! EDHOC + OSCORE interop with aiocoap 0.4.17 (`aiocoap[oscore]`, whose EDHOC is
//! lakers-python 0.6), both ways, with credentials in aiocoap's `edhoc-oscore` form
//! (CBOR diagnostic notation): aiocoap-client (EDHOC with the combined request) against
//! a Cobalt server, and Cobalt's client (with message_4, and with the combined request)
//! against an aiocoap server; a credential the other side does not know. Skipped when aiocoap's OSCORE
//! extra or lakers-python is missing, failed under `COBALT_REQUIRE_PEERS=1`.

use cobalt::proto::message::Code;
use cobalt::{Client, Scheme};
use cobalt_oscore::edhoc::{establish, Completion, EdhocError};
use cobalt_oscore::{CredentialStyle, EdhocIdentity, EdhocResponder, Oscore, UriPattern};
use cobalt_test_support::need;
use cobalt_test_support::peers::{aiocoap, Listen, PeerServer};
use cobalt_test_support::ports::V4;
use cobalt_test_support::process::run;
use cobalt_test_support::ready::Ready;
use cobalt_test_support::temp::TempDir;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

mod common;

/// The Python of `.venv-peers` if it has aiocoap's EDHOC (lakers-python, cbor-diag).
fn edhoc_python() -> Option<PathBuf> {
    let python = aiocoap::python()?;
    let ok = Command::new(&python)
        .args(["-c", "import aiocoap.edhoc, lakers, cbor_diag"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(python)
}

/// Writes `identity`'s private key as aiocoap reads it (a COSE_Key, mode 0600).
fn key_file(dir: &TempDir, name: &str, identity: &EdhocIdentity) -> PathBuf {
    let path = dir.write(name, identity.private_key_cose());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// An aiocoap `edhoc-oscore` entry: with an own identity (credential, key file) and/or
/// the peer's credential.
fn entry(own: Option<(&EdhocIdentity, &Path)>, peer: Option<&EdhocIdentity>) -> String {
    let mut fields = vec!["\"suite\": 2".to_string(), "\"method\": 3".to_string()];
    if let Some((identity, key)) = own {
        let style = match identity.style() {
            CredentialStyle::ByKeyId => "by-key-id",
            CredentialStyle::ByValue => "by-value",
        };
        fields.push(format!("\"own_cred_style\": \"{style}\""));
        fields.push(format!("\"own_cred\": {}", identity.credential().to_diag()));
        fields.push(format!("\"private_key_file\": \"{}\"", key.display()));
    }
    if let Some(peer) = peer {
        fields.push(format!("\"peer_cred\": {}", peer.credential().to_diag()));
    }
    format!("{{\"edhoc-oscore\": {{{}}}}}", fields.join(", "))
}

struct Keys {
    dir: TempDir,
    server: EdhocIdentity,
    client: EdhocIdentity,
}

fn keys(tag: &str) -> Keys {
    Keys {
        dir: TempDir::new(tag),
        server: EdhocIdentity::generate("cobalt-test-server", b"\x0a", CredentialStyle::ByKeyId),
        client: EdhocIdentity::generate("cobalt-test-client", b"\x0b", CredentialStyle::ByKeyId),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aiocoap_client_does_edhoc_with_a_cobalt_server() {
    let python = need!("aiocoap[oscore] with lakers-python", edhoc_python());
    let aio = need!("aiocoap-client", aiocoap::client());
    let k = keys("edhoc-cobalt-server");
    let responder = Arc::new(
        EdhocResponder::new(k.server.clone()).client("aiocoap", k.client.credential().clone()),
    );
    let port = cobalt_test_support::ports::free_udp_port(V4);
    let server = common::cobalt_server(Oscore::new().edhoc(responder.clone()), port).await;
    let addr = server.local_addr(Scheme::Coap).unwrap();
    let uri = |p: &str| format!("coap://{addr}{p}");
    let client_key = key_file(&k.dir, "client.cosekey", &k.client);
    let credentials = |name: &str, own: &EdhocIdentity, key: &Path| {
        k.dir.write(
            name,
            format!(
                "{{\"coap://{addr}/*\": {}}}",
                entry(Some((own, key)), Some(&k.server))
            ),
        )
    };
    let client_file = credentials("client.diag", &k.client, &client_key);
    let limit = Duration::from_secs(30);
    let client = |args: &[&str]| {
        let mut c = Command::new(&aio);
        c.arg("--credentials").arg(&client_file).args(args);
        c
    };

    run(&mut client(&[&uri("/hello")]), limit)
        .ok()
        .assert_stdout_has("hello from cobalt");
    run(
        &mut client(&["-m", "POST", "--payload", "ping", &uri("/echo")]),
        limit,
    )
    .ok()
    .assert_stdout_has("ping");
    let big = run(&mut client(&[&uri("/big")]), limit).ok();
    assert_eq!(
        big.stdout.trim_end().len(),
        2000,
        "Block2 through OSCORE: {big}"
    );
    let mut obs = Command::new(&python);
    obs.arg(aiocoap::script("aiocoap_observe.py"))
        .arg(uri("/temp"))
        .arg("3")
        .arg(&client_file);
    let notes = run(&mut obs, limit).ok();
    let lines: Vec<&str> = notes.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{notes}");
    assert!(lines.iter().all(|l| l.contains("\tt")), "{notes}");
    // Each run set up its own context with EDHOC, completed by the combined request.
    assert_eq!(responder.counts(), (0, 4));

    // A client the server does not know: EDHOC fails, nothing is answered.
    let stranger = EdhocIdentity::generate("stranger", b"\x0b", CredentialStyle::ByKeyId);
    let stranger_key = key_file(&k.dir, "stranger.cosekey", &stranger);
    let stranger_file = credentials("stranger.diag", &stranger, &stranger_key);
    let mut refused = Command::new(&aio);
    refused
        .arg("--credentials")
        .arg(&stranger_file)
        .arg(uri("/hello"));
    let failed = run(&mut refused, limit);
    assert!(!failed.stdout.contains("hello from cobalt"), "{failed}");
    assert_eq!(responder.counts(), (0, 4), "no context for the stranger");
    server.shutdown(Duration::ZERO).await;
}

/// aiocoap_server.py with the credentials `write(port)` writes (it needs the port).
fn aiocoap_server(python: &Path, write: impl Fn(u16) -> PathBuf) -> PeerServer {
    let script = aiocoap::script("aiocoap_server.py");
    let listen = Listen {
        ip: V4,
        free: &[0],
        at: 0,
        ready: Ready::CoapPing,
    };
    PeerServer::start("aiocoap_server.py (EDHOC)", listen, None, |port| {
        let mut c = Command::new(python);
        c.arg(&script)
            .args(["--bind", "127.0.0.1", "--port"])
            .arg(port.to_string())
            .arg("--credentials")
            .arg(write(port));
        c
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cobalt_client_does_edhoc_with_an_aiocoap_server() {
    let python = need!("aiocoap[oscore] with lakers-python", edhoc_python());
    let k = keys("edhoc-aiocoap-server");
    let server_key = key_file(&k.dir, "server.cosekey", &k.server);
    let start = || {
        aiocoap_server(&python, |port| {
            k.dir.write(
                "server.diag",
                format!(
                    "{{\"coap://127.0.0.1:{port}/*\": {}, \":cobalt\": {}}}",
                    entry(Some((&k.server, &server_key)), None),
                    entry(None, Some(&k.client)),
                ),
            )
        })
    };
    let plain = Client::new();
    let server = start();
    for completion in [Completion::Message4, Completion::Combined] {
        let origin = format!("coap://{}", server.addr);
        let uri = |p: &str| format!("{origin}{p}");
        let established = establish(
            &plain,
            &origin,
            &k.client,
            k.server.credential(),
            completion,
        )
        .await
        .unwrap();
        let pattern = UriPattern::parse(&format!("{origin}/*")).unwrap();
        let client = Client::new().layer(Oscore::new().protect_edhoc(pattern, established));
        let r = client.get(&uri("/hello")).await.unwrap();
        assert_eq!(
            (r.code, r.text_payload().as_str()),
            (Code::CONTENT, "hello from aiocoap"),
            "{completion:?}"
        );
        let r = client.post(&uri("/echo"), "ping").await.unwrap();
        assert_eq!(
            (r.code, r.payload.as_slice()),
            (Code::CHANGED, &b"ping"[..])
        );
        let r = client.get(&uri("/large")).await.unwrap();
        assert_eq!(r.payload.len(), 3000, "Block2 through OSCORE");
        let mut observation = client.observe(&uri("/counter")).await.unwrap();
        let mut counts = Vec::new();
        while counts.len() < 3 {
            let n = tokio::time::timeout(Duration::from_secs(10), observation.next())
                .await
                .unwrap_or_else(|_| {
                    panic!("{completion:?}: a notification within 10 s after {counts:?}")
                })
                .unwrap()
                .unwrap();
            counts.push(n.text_payload());
        }
        assert!(counts.iter().all(|c| c.starts_with("count ")), "{counts:?}");
        let r = observation.cancel().await.unwrap();
        assert_eq!(r.code, Code::CONTENT);
    }
    let origin = format!("coap://{}", server.addr);

    // A server that authenticates with another credential than the client expects.
    let other = EdhocIdentity::generate("other", b"\x0a", CredentialStyle::ByKeyId);
    let e = establish(
        &plain,
        &origin,
        &k.client,
        other.credential(),
        Completion::Message4,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            e,
            EdhocError::Invalid {
                step: "message_2",
                ..
            }
        ),
        "{e}"
    );
    // A client the server does not know: aiocoap refuses message_3.
    let stranger = EdhocIdentity::generate("stranger", b"\x0b", CredentialStyle::ByKeyId);
    let e = establish(
        &plain,
        &origin,
        &stranger,
        k.server.credential(),
        Completion::Message4,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            e,
            EdhocError::Refused {
                step: "message_3",
                ..
            }
        ),
        "{e}"
    );
}

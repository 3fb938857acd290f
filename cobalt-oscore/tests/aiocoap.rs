//! OSCORE interop with aiocoap 0.4.17 (`aiocoap[oscore]` in `.venv-peers`, installed
//! by `scripts/install-test-deps.sh`), both ways, with one pair of context
//! directories in aiocoap's format: GET, POST, observe and Block2; a wrong key; a
//! replayed request; a restart with persisted sequence numbers. Skipped when aiocoap's
//! OSCORE extra is missing, failed under `COBALT_REQUIRE_PEERS=1`.

use cobalt::proto::message::codec::{decode, encode};
use cobalt::proto::message::{Code, Message, MessageType, Token};
use cobalt::{Client, Scheme};
use cobalt_oscore::{Credentials, Material, SecurityContext, OSCORE};
use cobalt_test_support::need;
use cobalt_test_support::peers::{aiocoap, Listen, PeerServer};
use cobalt_test_support::ports::V4;
use cobalt_test_support::process::run;
use cobalt_test_support::ready::Ready;
use cobalt_test_support::temp::TempDir;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;

const SECRET: &str = "0102030405060708090a0b0c0d0e0f10";
const SALT: &str = "9e7ca92223786340";

/// The Python of `.venv-peers` if it has aiocoap's OSCORE extra.
fn oscore_python() -> Option<PathBuf> {
    let python = aiocoap::python()?;
    let ok = Command::new(&python)
        .args(["-c", "import aiocoap.oscore, cbor2, cryptography, filelock"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(python)
}

/// Writes an aiocoap context directory `name` (sender and recipient ID in hex).
fn context_dir(dir: &TempDir, name: &str, sender: &str, recipient: &str, secret: &str) {
    let settings = format!(
        r#"{{"sender-id_hex": "{sender}", "recipient-id_hex": "{recipient}", "secret_hex": "{secret}", "salt_hex": "{SALT}"}}"#
    );
    std::fs::create_dir_all(dir.path().join(name)).unwrap();
    dir.write(&format!("{name}/settings.json"), settings);
}

/// A credentials file `name` with one entry, the context directory `basedir` (of
/// `dir`) named by its full path: aiocoap reads it from its working directory.
fn credentials(dir: &TempDir, name: &str, key: &str, basedir: &str) -> PathBuf {
    let basedir = dir.path().join(basedir);
    let basedir = basedir.display();
    dir.write(
        name,
        format!(r#"{{"{key}": {{"oscore": {{"basedir": "{basedir}/"}}}}}}"#),
    )
}

/// aiocoap_server.py with OSCORE for the contexts of `creds`.
fn aiocoap_server(python: &Path, creds: &Path) -> PeerServer {
    let script = aiocoap::script("aiocoap_server.py");
    let listen = Listen {
        ip: V4,
        free: &[0],
        at: 0,
        ready: Ready::CoapPing,
    };
    PeerServer::start("aiocoap_server.py (OSCORE)", listen, None, |port| {
        let mut c = Command::new(python);
        c.arg(&script)
            .args(["--bind", "127.0.0.1", "--port"])
            .arg(port.to_string())
            .arg("--credentials")
            .arg(creds);
        c
    })
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The client's side of the contexts the tests write, in memory.
fn client_material() -> Material {
    Material::new(&unhex(SECRET), &[], &[1]).with_salt(&unhex(SALT))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cobalt_client_against_an_aiocoap_oscore_server() {
    let python = need!("aiocoap[oscore]", oscore_python());
    let dir = TempDir::new("oscore-aio-server");
    context_dir(&dir, "server", "01", "", SECRET);
    let server_file = credentials(&dir, "server.json", ":cobalt", "server");
    let server = aiocoap_server(&python, &server_file);
    let addr = server.addr;
    context_dir(&dir, "client", "", "01", SECRET);
    let client_file = credentials(&dir, "client.json", &format!("coap://{addr}/*"), "client");
    let uri = |p: &str| format!("coap://{addr}{p}");

    {
        let creds = Credentials::load(&client_file).unwrap();
        let client = Client::new().layer(creds.oscore().unwrap());
        let r = client.get(&uri("/hello")).await.unwrap();
        assert_eq!(
            (r.code, r.text_payload().as_str()),
            (Code::CONTENT, "hello from aiocoap")
        );
        let r = client.post(&uri("/echo"), "ping").await.unwrap();
        assert_eq!(
            (r.code, r.payload.as_slice()),
            (Code::CHANGED, &b"ping"[..])
        );
        let r = client.get(&uri("/large")).await.unwrap();
        assert_eq!(r.payload.len(), 3000, "Block2 through OSCORE");
        assert!(r.text_payload().starts_with("line 0000: abc"));
        let mut observation = client.observe(&uri("/counter")).await.unwrap();
        let mut counts = Vec::new();
        while counts.len() < 3 {
            let n = tokio::time::timeout(Duration::from_secs(10), observation.next())
                .await
                .expect("a notification within 10 s")
                .unwrap()
                .unwrap();
            counts.push(n.text_payload());
        }
        assert!(counts.iter().all(|c| c.starts_with("count ")), "{counts:?}");
        assert_ne!(counts[0], counts[2], "the counter moved: {counts:?}");
        drop(observation);
    }
    // "Restart": the client's context is loaded again from its directory and goes on
    // past the sequence numbers it reserved; aiocoap's replay window accepts them.
    let before = std::fs::read_to_string(dir.path().join("client/sequence.json")).unwrap();
    {
        let creds = Credentials::load(&client_file).unwrap();
        let client = Client::new().layer(creds.oscore().unwrap());
        let r = client.get(&uri("/hello")).await.unwrap();
        assert_eq!(r.text_payload(), "hello from aiocoap");
    }
    let after = std::fs::read_to_string(dir.path().join("client/sequence.json")).unwrap();
    assert_ne!(before, after, "the restarted client reserved new numbers");

    // A wrong key: aiocoap cannot decrypt and answers with an unprotected error.
    let mut wrong = client_material();
    wrong.master_secret[0] ^= 1;
    let client = Client::new().layer(cobalt_oscore::Oscore::new().protect(
        cobalt_oscore::UriPattern::any(),
        SecurityContext::new(wrong).unwrap(),
    ));
    let r = client.get(&uri("/hello")).await.unwrap();
    assert_eq!(r.code.class(), 4, "{:?} {}", r.code, r.text_payload());
    assert_ne!(r.text_payload(), "hello from aiocoap");
}

fn exchange(socket: &UdpSocket, message: &Message) -> Message {
    socket.send(&encode(message)).unwrap();
    let mut buf = [0u8; 1500];
    let n = socket.recv(&mut buf).unwrap();
    decode(&buf[..n]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aiocoap_answers_a_replayed_request_4_01() {
    let python = need!("aiocoap[oscore]", oscore_python());
    let dir = TempDir::new("oscore-aio-replay");
    context_dir(&dir, "server", "01", "", SECRET);
    let server = aiocoap_server(
        &python,
        &credentials(&dir, "server.json", ":cobalt", "server"),
    );
    let client = SecurityContext::new(client_material()).unwrap();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(server.addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut request = Message::new(MessageType::Confirmable, Code::GET, 0x4000);
    request.token = Token::new(&[9, 9]).unwrap();
    request.options.set_uri_path("/hello");
    let binding = client.protect_request(&mut request).unwrap();
    let mut answer = exchange(&socket, &request);
    client.unprotect_response(&mut answer, &binding).unwrap();
    assert_eq!(answer.payload, b"hello from aiocoap");
    // The same protected request in a new CoAP message.
    request.mid = 0x4001;
    request.token = Token::new(&[7]).unwrap();
    let replayed = exchange(&socket, &request);
    assert_eq!(replayed.code, Code::UNAUTHORIZED, "{replayed:?}");
    assert!(!replayed.options.contains(OSCORE));
    assert!(
        String::from_utf8_lossy(&replayed.payload).contains("Replay"),
        "{replayed:?}"
    );
}

/// A Cobalt server from `file`'s `:label` contexts ([`common::cobalt_server`]).
async fn cobalt_server(file: &Path, port: u16) -> cobalt::ServerHandle {
    let creds = Credentials::load(file).unwrap();
    common::cobalt_server(creds.oscore().unwrap(), port).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aiocoap_client_against_a_cobalt_oscore_server() {
    let python = need!("aiocoap[oscore]", oscore_python());
    let aio = need!("aiocoap-client", aiocoap::client());
    let dir = TempDir::new("oscore-cobalt-server");
    context_dir(&dir, "server", "01", "", SECRET);
    let server_file = credentials(&dir, "server.json", ":aiocoap", "server");
    let port = cobalt_test_support::ports::free_udp_port(V4);
    let server = cobalt_server(&server_file, port).await;
    let addr = server.local_addr(Scheme::Coap).unwrap();
    context_dir(&dir, "client", "", "01", SECRET);
    let client_file = credentials(&dir, "client.json", &format!("coap://{addr}/*"), "client");
    let uri = |p: &str| format!("coap://{addr}{p}");
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

    // Restart: the server's replay window is lost; it asks aiocoap for an Echo
    // (Appendix B.1.2) with a sequence number past those it reserved.
    server.shutdown(Duration::ZERO).await;
    let server = cobalt_server(&server_file, port).await;
    run(&mut client(&[&uri("/hello")]), limit)
        .ok()
        .assert_stdout_has("hello from cobalt");
    let sequence = std::fs::read_to_string(dir.path().join("server/sequence.json")).unwrap();
    assert!(
        !sequence.contains("\"next-to-send\":0,"),
        "the Echo used a fresh number: {sequence}"
    );

    // A wrong key: Cobalt answers 4.00 unprotected, which aiocoap reports as an error.
    context_dir(&dir, "wrong", "", "01", "ff02030405060708090a0b0c0d0e0f10");
    let wrong_file = credentials(&dir, "wrong.json", &format!("coap://{addr}/*"), "wrong");
    let mut wrong = Command::new(&aio);
    wrong
        .arg("--credentials")
        .arg(&wrong_file)
        .arg(uri("/hello"));
    let failed = run(&mut wrong, limit);
    assert!(!failed.status.success(), "{failed}");
    assert!(!failed.stdout.contains("hello from cobalt"), "{failed}");
    server.shutdown(Duration::ZERO).await;
}

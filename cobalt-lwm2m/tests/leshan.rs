//! Interop with Eclipse Leshan's LwM2M client (leshan-client-cf 2.0.0-M15 from Maven
//! Central, driven by `tests/peers/leshan`, built by `scripts/install-test-deps.sh`):
//! it registers at the library service over coap and over coaps (PSK), is read
//! (SenML-JSON, SenML-CBOR, TLV, text), discovered, written to (text, SenML-JSON,
//! SenML-CBOR; replace and partial update), executed, observed (then the observation
//! is cancelled), updates its registration, and de-registers.
//! Skipped without java or the built peer, a failure under `COBALT_REQUIRE_PEERS=1`.

use cobalt::proto::message::{self, opt, Code, Message, MessageType, Token};
use cobalt::transport::credentials::PskStore;
use cobalt::{Scheme, ServerHandle};
use cobalt_lwm2m::{Entry, Format, LwPath, Lwm2mServer, Value, WriteMode};
use cobalt_rd::{MemoryStore, RdLimits};
use cobalt_test_support::need;
use cobalt_test_support::peers::{on_path, repo_root};
use cobalt_test_support::process::ChildGuard;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;

const PSK_IDENTITY: &str = "leshan-device";
const PSK_KEY: &[u8] = b"cobalt-lwm2m-key";

/// The class path of the built peer, when java and the peer are there.
fn find() -> Option<PathBuf> {
    let classpath = repo_root().join("tests/peers/leshan/target/classpath.txt");
    on_path("java").and(classpath.is_file().then_some(classpath))
}

/// A running Leshan client: what it printed, and its stdin for commands.
struct Leshan {
    _child: ChildGuard,
    stdin: ChildStdin,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Leshan {
    fn start(classpath: &PathBuf, args: &[&str]) -> Leshan {
        let jars = std::fs::read_to_string(classpath).expect("read classpath.txt");
        let classes = repo_root().join("tests/peers/leshan/target/classes");
        let mut cmd = Command::new("java");
        cmd.arg("-cp")
            .arg(format!("{}:{}", classes.display(), jars.trim()))
            .arg("org.cobalt.peers.LeshanPeer")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = ChildGuard::spawn("the Leshan client peer", &mut cmd);
        let stdin = child.child().stdin.take().expect("piped stdin");
        let stdout = child.take_stdout().expect("piped stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
        Leshan {
            _child: child,
            stdin,
            lines,
        }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits (up to 30 s) for a line starting with `prefix`; panics with all lines.
    async fn wait_for(&self, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(l) = self.lines().into_iter().find(|l| l.starts_with(prefix)) {
                return l;
            }
            assert!(
                Instant::now() < deadline,
                "waited 30 s for {prefix:?} from Leshan: {:#?}",
                self.lines()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn command(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("write to Leshan's stdin");
        self.stdin.flush().expect("flush Leshan's stdin");
    }
}

async fn start_server() -> (Lwm2mServer, ServerHandle) {
    let lwm2m = Lwm2mServer::open(Arc::new(MemoryStore::new()), RdLimits::default())
        .await
        .unwrap();
    let server = lwm2m
        .install(cobalt::Server::new())
        .psk(PskStore::new().with(PSK_IDENTITY, PSK_KEY))
        .shards(1)
        .listen(Scheme::Coap, "127.0.0.1:0")
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    (lwm2m, server)
}

fn string(entries: &[Entry], path: &str) -> Option<String> {
    let path: LwPath = path.parse().unwrap();
    entries
        .iter()
        .find(|e| e.path == path)
        .map(|e| match &e.value {
            Value::String(s) => s.clone(),
            other => format!("{other:?}"),
        })
}

/// Malformed, oversized and too many registrations from another peer, beside the
/// Leshan client: each refused with its code, and the client is served as before.
async fn hostile_registrations(server: SocketAddr) {
    let socket = UdpSocket::bind("127.0.0.3:0").await.unwrap();
    let mut codes = Vec::new();
    let mut bodies: Vec<(String, Vec<u8>)> = vec![
        ("ep=h&b=Z".into(), b"</1/0>,</3/0>".to_vec()),
        ("ep=h".into(), b"</1/0>,</3/0>,</not-an-object>".to_vec()),
        ("ep=h".into(), vec![b'<'; 20_000]),
    ];
    let max_per_peer = RdLimits::default().max_per_peer;
    bodies.extend((0..=max_per_peer).map(|i| (format!("ep=flood-{i}"), b"</3/0>".to_vec())));
    for (mid, (query, body)) in bodies.into_iter().enumerate() {
        let mid = mid as u16;
        let mut m = Message::new(MessageType::Confirmable, Code::POST, mid);
        m.token = Token::new(&mid.to_be_bytes()).unwrap();
        m.options.set_uri_path("/rd");
        m.options.set_uri_query(&query);
        m.options.set_uint(opt::CONTENT_FORMAT, 40);
        m.payload = body;
        socket.send_to(&message::encode(&m), server).await.unwrap();
        let mut buf = vec![0u8; 2048];
        let (n, _) = tokio::time::timeout(Duration::from_secs(10), socket.recv_from(&mut buf))
            .await
            .expect("an answer within 10 s")
            .unwrap();
        codes.push(message::decode(&buf[..n]).unwrap().code);
    }
    assert_eq!(
        &codes[..3],
        &[
            Code::BAD_REQUEST,
            Code::BAD_REQUEST,
            Code::REQUEST_ENTITY_TOO_LARGE
        ]
    );
    assert!(
        codes[3..3 + max_per_peer]
            .iter()
            .all(|c| *c == Code::CREATED),
        "{codes:?}"
    );
    assert_eq!(
        codes.last(),
        Some(&Code::SERVICE_UNAVAILABLE),
        "the peer's budget"
    );
}

/// Everything the manager does with one Leshan client, over `scheme`.
async fn manage_leshan(scheme: Scheme) {
    let classpath = need!(
        "Leshan client peer (java and tests/peers/leshan built by Maven)",
        find()
    );
    let (lwm2m, server) = start_server().await;
    let addr = server.local_addr(scheme).unwrap();
    let endpoint = format!("leshan-{scheme}");
    let uri = format!("{scheme}://{addr}");
    let hex_key: String = PSK_KEY.iter().map(|b| format!("{b:02x}")).collect();
    let mut args = vec![uri.as_str(), endpoint.as_str(), "--lifetime", "120"];
    if scheme == Scheme::Coaps {
        args.extend(["--psk", PSK_IDENTITY, hex_key.as_str()]);
    }
    let mut leshan = Leshan::start(&classpath, &args);
    leshan.wait_for("REGISTERED").await;

    let info = lwm2m.client(&endpoint).await.expect("registered");
    assert_eq!((info.version.as_str(), info.lifetime), ("1.1", 120));
    assert!(info.has_object(1) && info.has_object(3), "{info:?}");
    assert!(info.formats.contains(&110), "{info:?}");
    let device = lwm2m.device(&endpoint).await.unwrap();
    hostile_registrations(server.local_addr(Scheme::Coap).unwrap()).await;

    // Read: the Device instance in three formats, one resource as text.
    let instance: LwPath = "/3/0".parse().unwrap();
    for format in [Format::SenmlJson, Format::SenmlCbor, Format::Tlv] {
        let entries = device.read(&instance, format).await.unwrap();
        assert_eq!(
            string(&entries, "/3/0/0").as_deref(),
            Some("Cobalt Test Devices"),
            "{format}: {entries:?}"
        );
        let battery = entries.iter().find(|e| e.path == LwPath::resource(3, 0, 9));
        assert_eq!(
            battery.map(|e| &e.value),
            Some(&Value::Integer(87)),
            "{format}"
        );
        let time = entries
            .iter()
            .find(|e| e.path == LwPath::resource(3, 0, 13));
        assert!(
            matches!(time.map(|e| &e.value), Some(Value::Time(t)) if *t > 1_600_000_000),
            "{format}: {time:?}"
        );
    }
    let name = device
        .read(&"/3/0/0".parse().unwrap(), Format::Text)
        .await
        .unwrap();
    assert_eq!(name[0].value, Value::String("Cobalt Test Devices".into()));
    let lifetime = device
        .read(&"/1/0/1".parse().unwrap(), Format::Text)
        .await
        .unwrap();
    assert_eq!(lifetime[0].value, Value::Integer(120));
    let links = device.discover(&instance).await.unwrap();
    assert!(links.iter().any(|l| l.target == "/3/0/13"), "{links:?}");

    // Write: the UTC offset, as text and as SenML-JSON; read back.
    let offset = LwPath::resource(3, 0, 14);
    for (format, value) in [
        (Format::Text, "+05"),
        (Format::SenmlJson, "-03"),
        (Format::SenmlCbor, "+07"),
    ] {
        let entries = [Entry::new(offset, Value::String(value.into()))];
        device
            .write(&offset, &entries, format, WriteMode::Replace)
            .await
            .unwrap();
        leshan
            .wait_for(&format!("WRITTEN path=/3/0/14 value={value}"))
            .await;
        let back = device.read(&offset, Format::Text).await.unwrap();
        assert_eq!(back[0].value, Value::String(value.into()));
    }

    // Partial update of the instance: only the timezone changes.
    let zone = LwPath::resource(3, 0, 15);
    let entries = [Entry::new(zone, Value::String("Asia/Tokyo".into()))];
    device
        .write(&instance, &entries, Format::SenmlJson, WriteMode::Update)
        .await
        .unwrap();
    leshan
        .wait_for("WRITTEN path=/3/0/15 value=Asia/Tokyo")
        .await;
    let after = device.read(&instance, Format::SenmlJson).await.unwrap();
    assert_eq!(string(&after, "/3/0/15").as_deref(), Some("Asia/Tokyo"));
    assert_eq!(string(&after, "/3/0/14").as_deref(), Some("+07"));

    // Execute: reboot.
    device
        .execute(&LwPath::resource(3, 0, 4), None)
        .await
        .unwrap();
    leshan.wait_for("EXECUTED path=/3/0/4").await;

    // Observe the current time: the first answer and two notifications, then cancel.
    let mut observation = device
        .observe(&LwPath::resource(3, 0, 13), Format::SenmlJson)
        .await
        .unwrap();
    let mut times = Vec::new();
    while times.len() < 3 {
        let next = tokio::time::timeout(Duration::from_secs(10), observation.next())
            .await
            .expect("a notification within 10 s (the device changes /3/0/13 every second)");
        let entries = next.expect("the observation goes on").unwrap();
        match entries.first().map(|e| &e.value) {
            Some(Value::Time(t)) => times.push(*t),
            other => panic!("not a time: {other:?}"),
        }
    }
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert!(times[2] > times[0], "{times:?}");
    observation.cancel().await.unwrap();

    // Update, then the device is still managed.
    leshan.command("update");
    leshan.wait_for("UPDATED").await;
    let again = lwm2m.device(&endpoint).await.unwrap();
    let model = again
        .read(&"/3/0/1".parse().unwrap(), Format::Text)
        .await
        .unwrap();
    assert_eq!(model[0].value, Value::String("leshan-peer".into()));

    // De-register.
    leshan.command("deregister");
    leshan.wait_for("DEREGISTERED").await;
    assert!(lwm2m.client(&endpoint).await.is_none());
    assert!(
        !leshan.lines().iter().any(|l| l.starts_with("FAILED")),
        "{:#?}",
        leshan.lines()
    );
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leshan_client_over_coap_is_registered_read_written_executed_observed_and_deregistered() {
    manage_leshan(Scheme::Coap).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leshan_client_over_coaps_psk_is_registered_read_written_executed_observed_and_deregistered(
) {
    manage_leshan(Scheme::Coaps).await;
}

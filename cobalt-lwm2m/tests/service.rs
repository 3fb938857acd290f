//! The LwM2M server against a device driven by hand on a UDP socket: registration,
//! update and de-registration; the LwM2M checks (4.00, 4.12, 4.13, 5.03); device
//! management requests leaving from the server's socket and their answers decoded;
//! hostile answers refused without harm.

use cobalt::proto::message::{self, opt, BlockValue, Code, Message, MessageType, Token};
use cobalt::{Scheme, ServerHandle};
use cobalt_lwm2m::{
    DecodeLimits, Entry, Format, LwPath, Lwm2mServer, ManageError, ManagerLimits, Value, WriteMode,
};
use cobalt_rd::{MemoryStore, RdLimits};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UdpSocket;

const OBJECTS: &str = r#"</>;rt="oma.lwm2m";ct=110,</1/0>,</3/0>"#;

async fn start(limits: RdLimits) -> (Lwm2mServer, ServerHandle, SocketAddr) {
    let lwm2m = Lwm2mServer::open(Arc::new(MemoryStore::new()), limits.clone())
        .await
        .unwrap();
    let server = lwm2m
        .install(cobalt::Server::new())
        .shards(1)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::Coap).unwrap();
    (lwm2m, server, addr)
}

/// A device on a socket of its own, speaking CoAP by hand.
struct FakeDevice {
    socket: UdpSocket,
    server: SocketAddr,
    mid: u16,
    /// Requests of the server that arrived while it waited for an answer.
    early: Vec<(Message, SocketAddr)>,
}

impl FakeDevice {
    async fn new(server: SocketAddr) -> FakeDevice {
        FakeDevice::from(server, "127.0.0.1:0").await
    }

    async fn from(server: SocketAddr, bind: &str) -> FakeDevice {
        FakeDevice {
            socket: UdpSocket::bind(bind).await.unwrap(),
            server,
            mid: 100,
            early: Vec::new(),
        }
    }

    /// Sends a CON request and returns the piggybacked answer.
    async fn request(&mut self, code: Code, path: &str, query: &str, body: &[u8]) -> Message {
        self.mid += 1;
        let mut m = Message::new(MessageType::Confirmable, code, self.mid);
        m.token = Token::new(&self.mid.to_be_bytes()).unwrap();
        m.options.set_uri_path(path);
        if !query.is_empty() {
            m.options.set_uri_query(query);
        }
        if !body.is_empty() {
            m.options.set_uint(opt::CONTENT_FORMAT, 40);
            m.payload = body.to_vec();
        }
        self.socket
            .send_to(&message::encode(&m), self.server)
            .await
            .unwrap();
        loop {
            let (answer, from) = self.receive().await;
            if answer.mid == self.mid && answer.is_response() {
                return answer;
            }
            if answer.is_request() {
                self.early.push((answer, from));
            }
        }
    }

    async fn receive(&self) -> (Message, SocketAddr) {
        let mut buf = vec![0u8; 70_000];
        let (n, from) =
            tokio::time::timeout(Duration::from_secs(10), self.socket.recv_from(&mut buf))
                .await
                .expect("a datagram within 10 s")
                .unwrap();
        (message::decode(&buf[..n]).unwrap(), from)
    }

    /// Waits for the server's next request and answers it with `code`, `cf` and `body`
    /// (piggybacked); returns the request.
    async fn answer(&mut self, code: Code, cf: Option<u16>, body: &[u8]) -> Message {
        let (req, from) = match self.early.pop() {
            Some(early) => early,
            None => self.receive().await,
        };
        assert_eq!(
            from, self.server,
            "requests leave from the server's own socket"
        );
        let mut ack = Message::new(MessageType::Acknowledgement, code, req.mid);
        ack.token = req.token.clone();
        if let Some(cf) = cf {
            ack.options.set_uint(opt::CONTENT_FORMAT, u32::from(cf));
        }
        ack.payload = body.to_vec();
        self.socket
            .send_to(&message::encode(&ack), from)
            .await
            .unwrap();
        req
    }

    async fn register(&mut self, ep: &str) -> String {
        let r = self
            .request(
                Code::POST,
                "/rd",
                &format!("ep={ep}&lt=300&lwm2m=1.1&b=U"),
                OBJECTS.as_bytes(),
            )
            .await;
        assert_eq!(
            r.code,
            Code::CREATED,
            "{}",
            String::from_utf8_lossy(&r.payload)
        );
        r.options.location_path_string().unwrap()
    }
}

#[tokio::test]
async fn registration_update_and_deregistration_follow_lwm2m() {
    let (lwm2m, server, addr) = start(RdLimits::default()).await;
    let mut dev = FakeDevice::new(addr).await;
    let location = dev.register("dev-1").await;
    assert_eq!(location, "/rd/0");
    let info = lwm2m.client("dev-1").await.unwrap();
    assert_eq!(
        (info.version.as_str(), info.binding.as_str(), info.lifetime),
        ("1.1", "U", 300)
    );
    assert_eq!(
        info.objects,
        vec![LwPath::instance(1, 0), LwPath::instance(3, 0)]
    );
    assert_eq!(
        info.address,
        format!("coap://{}", dev.socket.local_addr().unwrap())
    );

    let r = dev
        .request(
            Code::POST,
            &location,
            "lt=600&b=UQ",
            b"</1/0>,</3/0>,</3303/0>",
        )
        .await;
    assert_eq!(r.code, Code::CHANGED);
    let info = lwm2m.client("dev-1").await.unwrap();
    assert_eq!(
        (info.binding.as_str(), info.lifetime, info.queue_mode),
        ("UQ", 600, true)
    );
    assert!(info.has_object(3303));

    assert_eq!(
        dev.request(Code::DELETE, &location, "", b"").await.code,
        Code::DELETED
    );
    assert!(lwm2m.clients().await.is_empty());
    assert!(matches!(
        lwm2m.device("dev-1").await,
        Err(ManageError::NotRegistered(_))
    ));
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn malformed_registrations_get_the_code_and_a_reason_and_others_keep_registering() {
    let limits = RdLimits {
        max_per_peer: 2,
        max_body_bytes: 512,
        ..RdLimits::default()
    };
    let (lwm2m, server, addr) = start(limits).await;
    let mut dev = FakeDevice::new(addr).await;
    for (query, body, code, says) in [
        (
            "ep=a&b=X",
            OBJECTS.as_bytes().to_vec(),
            Code::BAD_REQUEST,
            "binding",
        ),
        (
            "ep=a&lwm2m=7.0",
            OBJECTS.as_bytes().to_vec(),
            Code::PRECONDITION_FAILED,
            "not supported",
        ),
        (
            "ep=a",
            b"</1/0>,</3/0>,</temperature>".to_vec(),
            Code::BAD_REQUEST,
            "not an object",
        ),
        (
            "ep=a",
            b"</1/0>,</3/0>,</4/0>,</5/0>,</6/0>,</3/1".to_vec(),
            Code::BAD_REQUEST,
            "malformed link-format",
        ),
        (
            "lt=60",
            OBJECTS.as_bytes().to_vec(),
            Code::BAD_REQUEST,
            "ep=",
        ),
        (
            "ep=a&lt=0",
            OBJECTS.as_bytes().to_vec(),
            Code::BAD_REQUEST,
            "lt=0",
        ),
        (
            "ep=a",
            vec![b'x'; 600],
            Code::REQUEST_ENTITY_TOO_LARGE,
            "600 bytes",
        ),
    ] {
        let r = dev.request(Code::POST, "/rd", query, &body).await;
        let reason = String::from_utf8_lossy(&r.payload).to_string();
        assert_eq!(r.code, code, "{query}: {reason:?}");
        assert!(
            reason.contains(says),
            "{query} ({says}): {} {reason:?}",
            r.code
        );
    }
    assert!(lwm2m.clients().await.is_empty());
    // Registrations per peer are the directory's budget.
    dev.register("a1").await;
    dev.register("a2").await;
    let r = dev
        .request(Code::POST, "/rd", "ep=a3", OBJECTS.as_bytes())
        .await;
    assert_eq!(r.code, Code::SERVICE_UNAVAILABLE);
    // Another client (another address: without DTLS, owners are addresses) may not
    // update or de-register it: 4.03; an unknown registration is 4.04.
    let mut other = FakeDevice::from(addr, "127.0.0.2:0").await;
    let r = other.request(Code::POST, "/rd/0", "lt=60", b"").await;
    assert_eq!(r.code, Code::FORBIDDEN);
    let r = other.request(Code::DELETE, "/rd/0", "", b"").await;
    assert_eq!(r.code, Code::FORBIDDEN);
    let r = other.request(Code::POST, "/rd/99", "", b"").await;
    assert_eq!(r.code, Code::NOT_FOUND);
    assert_eq!(lwm2m.clients().await.len(), 2);
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn management_requests_reach_the_device_from_the_server_socket_and_decode() {
    let (lwm2m, server, addr) = start(RdLimits::default()).await;
    let mut dev = FakeDevice::new(addr).await;
    dev.register("dev-2").await;
    let device = lwm2m.device("dev-2").await.unwrap();

    let read = tokio::spawn(async move {
        let d = device;
        let json = d.read(&"/3/0".parse().unwrap(), Format::SenmlJson).await;
        let tlv = d.read(&"/3/0/9".parse().unwrap(), Format::Tlv).await;
        let text = d.read(&"/3/0/13".parse().unwrap(), Format::Text).await;
        let entries = [Entry::new(
            LwPath::resource(3, 0, 14),
            Value::String("+02".into()),
        )];
        let write = d
            .write(
                &LwPath::resource(3, 0, 14),
                &entries,
                Format::SenmlCbor,
                WriteMode::Replace,
            )
            .await;
        let exec = d.execute(&LwPath::resource(3, 0, 4), None).await;
        let refused = d.read(&"/3/0/99".parse().unwrap(), Format::Text).await;
        (json, tlv, text, write, exec, refused)
    });
    let req = dev
        .answer(
            Code::CONTENT,
            Some(110),
            br#"[{"bn":"/3/0/","n":"0","vs":"Fake"},{"n":"9","v":50}]"#,
        )
        .await;
    assert_eq!(req.options.uri_path_string(), "/3/0");
    assert_eq!(req.options.accept(), Some(110));
    let req = dev.answer(Code::CONTENT, Some(11542), &[0xc1, 9, 77]).await;
    assert_eq!(req.options.accept(), Some(11542));
    dev.answer(Code::CONTENT, Some(0), b"1700000000").await;
    let req = dev.answer(Code::CHANGED, None, b"").await;
    assert_eq!(
        (req.code, req.options.content_format()),
        (Code::PUT, Some(112))
    );
    let req = dev.answer(Code::CHANGED, None, b"").await;
    assert_eq!(
        (req.code, req.options.uri_path_string().as_str()),
        (Code::POST, "/3/0/4")
    );
    dev.answer(Code::NOT_FOUND, None, b"").await;

    let (json, tlv, text, write, exec, refused) = read.await.unwrap();
    assert_eq!(
        json.unwrap(),
        vec![
            Entry::new(LwPath::resource(3, 0, 0), Value::String("Fake".into())),
            Entry::new(LwPath::resource(3, 0, 9), Value::Integer(50)),
        ]
    );
    assert_eq!(tlv.unwrap()[0].value, Value::Integer(77));
    assert_eq!(text.unwrap()[0].value, Value::Time(1_700_000_000));
    write.unwrap();
    exec.unwrap();
    assert!(matches!(
        refused,
        Err(ManageError::Refused {
            code: Code::NOT_FOUND,
            ..
        })
    ));
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn hostile_answers_are_errors_and_the_manager_keeps_working() {
    let (lwm2m, server, addr) = start(RdLimits::default()).await;
    let lwm2m = lwm2m.with_limits(ManagerLimits {
        decode: DecodeLimits {
            max_payload_bytes: 1000,
            max_entries: 10,
        },
        ..ManagerLimits::default()
    });
    let mut dev = FakeDevice::new(addr).await;
    dev.register("evil").await;
    let device = lwm2m.device("evil").await.unwrap();
    let reads = tokio::spawn(async move {
        let at: LwPath = "/3/0".parse().unwrap();
        let mut results = Vec::new();
        for _ in 0..7 {
            results.push(device.read(&at, Format::SenmlJson).await);
        }
        results
    });
    let many: String = format!(
        "[{}]",
        (0..11)
            .map(|i| format!(r#"{{"n":"/9/0/{i}","v":1}}"#))
            .collect::<Vec<_>>()
            .join(",")
    );
    for (cf, body) in [
        (110, b"[{\"n\":".to_vec()), // cut short
        (110, many.into_bytes()),    // too many records
        (110, vec![b' '; 1001]),     // too large
    ] {
        dev.answer(Code::CONTENT, Some(cf), &body).await;
    }
    // The first of 1024-byte blocks, more to come: refused before block 1 is asked.
    let (req, from) = dev.receive().await;
    let mut block = Message::new(MessageType::Acknowledgement, Code::CONTENT, req.mid);
    block.token = req.token;
    block.options.set_uint(opt::CONTENT_FORMAT, 110);
    let first = BlockValue::new(0, true, 6).unwrap();
    block.options.set_uint(opt::BLOCK2, first.encode());
    block.payload = vec![b' '; 1024];
    dev.socket
        .send_to(&message::encode(&block), from)
        .await
        .unwrap();
    for (cf, body) in [
        (11542, vec![0xc8, 0x00, 0xff]), // TLV length past the end
        (
            112,
            vec![0x9b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        ), // 2^64 items
        (110, br#"[{"bn":"/3/0/","n":"0","vs":"fine"}]"#.to_vec()),
    ] {
        let req = dev.answer(Code::CONTENT, Some(cf), &body).await;
        assert_eq!(req.block2(), None, "no follow-up block was asked for");
    }
    let results = reads.await.unwrap();
    for i in [0, 1, 4, 5] {
        let r = &results[i];
        assert!(matches!(r, Err(ManageError::Decode(_))), "{i}: {r:?}");
    }
    for i in [2, 3] {
        let r = &results[i];
        let refused = matches!(
            r,
            Err(ManageError::Request(cobalt::Error::LayerRefused { .. }))
        );
        assert!(refused, "{i}: {r:?}");
    }
    let last = results[6].as_ref().unwrap();
    assert_eq!(last[0].value, Value::String("fine".into()));
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn after_a_restart_a_client_is_listed_and_managed_again_from_its_next_update() {
    let store = Arc::new(MemoryStore::new());
    let open = |store: Arc<MemoryStore>| async move {
        let lwm2m = Lwm2mServer::open(store, RdLimits::default()).await.unwrap();
        let server = lwm2m
            .install(cobalt::Server::new())
            .shards(1)
            .bind("127.0.0.1:0")
            .await
            .unwrap();
        let addr = server.local_addr(Scheme::Coap).unwrap();
        (lwm2m, server, addr)
    };
    let (_, first, addr) = open(store.clone()).await;
    let mut dev = FakeDevice::new(addr).await;
    let location = dev.register("keeper").await;
    first.shutdown(Duration::ZERO).await;

    let (lwm2m, server, addr) = open(store).await;
    assert!(lwm2m.client("keeper").await.is_some(), "the store kept it");
    let e = lwm2m.device("keeper").await.err().expect("no route yet");
    assert!(matches!(e, ManageError::Unreachable(_)), "{e}");
    assert!(e.to_string().contains("next registration update"), "{e}");
    dev.server = addr;
    assert_eq!(
        dev.request(Code::POST, &location, "", b"").await.code,
        Code::CHANGED
    );
    let device = lwm2m.device("keeper").await.unwrap();
    let read =
        tokio::spawn(async move { device.read(&LwPath::resource(3, 0, 0), Format::Text).await });
    dev.answer(Code::CONTENT, Some(0), b"back").await;
    let entries = read.await.unwrap().unwrap();
    assert_eq!(entries[0].value, Value::String("back".into()));
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn requests_to_a_client_in_queue_mode_wait_for_its_next_update() {
    let (lwm2m, server, addr) = start(RdLimits::default()).await;
    let mut dev = FakeDevice::new(addr).await;
    let r = dev
        .request(Code::POST, "/rd", "ep=sleeper&b=UQ", OBJECTS.as_bytes())
        .await;
    assert_eq!(r.code, Code::CREATED);
    let location = r.options.location_path_string().unwrap();
    // Asleep at once (no awake window): without an update, the request does not go.
    let asleep = |timeout| ManagerLimits {
        queue_awake: Duration::ZERO,
        request_timeout: timeout,
        ..ManagerLimits::default()
    };
    let impatient = lwm2m
        .clone()
        .with_limits(asleep(Duration::from_millis(100)));
    let at = LwPath::resource(3, 0, 0);
    let e = impatient
        .device("sleeper")
        .await
        .unwrap()
        .read(&at, Format::Text)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ManageError::Unreachable(m) if m.contains("queue mode")),
        "{e}"
    );
    // The next update wakes a waiting request.
    let patient = lwm2m.with_limits(asleep(Duration::from_secs(30)));
    let device = patient.device("sleeper").await.unwrap();
    let read = tokio::spawn(async move { device.read(&at, Format::Text).await });
    tokio::task::yield_now().await;
    let r = dev.request(Code::POST, &location, "", b"").await;
    assert_eq!(r.code, Code::CHANGED);
    let req = dev.answer(Code::CONTENT, Some(0), b"awake").await;
    assert_eq!(req.options.uri_path_string(), "/3/0/0");
    let entries = read.await.unwrap().unwrap();
    assert_eq!(entries[0].value, Value::String("awake".into()));
    server.shutdown(Duration::ZERO).await;
}

//! `cobalt lwm2m` as a user runs it: a device registers over CoAP, and the HTTP view
//! lists it, reads, writes and executes on it, and streams an observation as
//! Server-Sent Events. The device is driven by hand on a UDP socket (Leshan's client
//! against the same service is in cobalt-lwm2m/tests/leshan.rs).

#[path = "common/binary.rs"]
mod binary;

use binary::{cobalt, serve_printing};
use cobalt_proto::message::{self, opt, Code, Message, MessageType, Token};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

/// A device speaking CoAP by hand.
struct Device {
    socket: UdpSocket,
    server: SocketAddr,
}

impl Device {
    fn receive(&self) -> (Message, SocketAddr) {
        let mut buf = [0u8; 2048];
        let (n, from) = self
            .socket
            .recv_from(&mut buf)
            .expect("a datagram within 10 s");
        (message::decode(&buf[..n]).unwrap(), from)
    }

    fn send(&self, m: &Message) {
        self.socket
            .send_to(&message::encode(m), self.server)
            .unwrap();
    }

    /// Answers the server's next request (piggybacked) with `code`, `cf`, `body`,
    /// and `observe` when given; returns the request.
    fn answer(&self, code: Code, cf: Option<u16>, body: &[u8], observe: Option<u32>) -> Message {
        let (req, _) = self.receive();
        let mut ack = Message::new(MessageType::Acknowledgement, code, req.mid);
        ack.token = req.token.clone();
        if let Some(seq) = observe {
            ack.options.set_uint(opt::OBSERVE, seq);
        }
        if let Some(cf) = cf {
            ack.options.set_uint(opt::CONTENT_FORMAT, u32::from(cf));
        }
        ack.payload = body.to_vec();
        self.send(&ack);
        req
    }
}

/// One HTTP/1.1 exchange; (status, body).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // As `curl -d` sends it: form-encoded, whatever the body is.
    let ct = if body.is_empty() {
        ""
    } else {
        "Content-Type: application/x-www-form-urlencoded\r\n"
    };
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{ct}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

#[test]
fn the_http_view_lists_reads_writes_executes_and_observes_a_registered_device() {
    let mut cmd = cobalt();
    cmd.args([
        "lwm2m",
        "--bind",
        "127.0.0.1",
        "--port",
        "0",
        "--in-memory",
        "--http",
        "127.0.0.1:0",
    ]);
    let (_server, found) = serve_printing(
        cmd,
        &[
            "cobalt: LwM2M server on coap://",
            "cobalt: HTTP view on http://",
        ],
    );
    let coap: SocketAddr = found[0].trim_end_matches("/rd").parse().unwrap();
    let web = found[1].trim_end_matches("/clients").to_string();

    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let device = Device {
        socket,
        server: coap,
    };
    let mut reg = Message::new(MessageType::Confirmable, Code::POST, 1);
    reg.token = Token::new(&[1]).unwrap();
    reg.options.set_uri_path("/rd");
    reg.options.set_uri_query("ep=cli-dev&lt=300&lwm2m=1.1&b=U");
    reg.options.set_uint(opt::CONTENT_FORMAT, 40);
    reg.payload = br#"</>;rt="oma.lwm2m";ct=110,</1/0>,</3/0>"#.to_vec();
    device.send(&reg);
    let (created, _) = device.receive();
    assert_eq!(created.code, Code::CREATED);

    let (status, list) = http(&web, "GET", "/clients", "");
    assert_eq!(status, 200, "{list}");
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(list[0]["endpoint"], "cli-dev");
    assert_eq!(list[0]["objects"], serde_json::json!(["/1/0", "/3/0"]));
    assert_eq!(http(&web, "GET", "/clients/nobody", "").0, 404);

    std::thread::scope(|s| {
        let web = web.as_str();
        let read = s.spawn(move || http(web, "GET", "/clients/cli-dev/3/0/0?format=text", ""));
        let req = device.answer(Code::CONTENT, Some(0), b"Acme", None);
        assert_eq!(req.options.uri_path_string(), "/3/0/0");
        let (status, body) = read.join().unwrap();
        assert_eq!(status, 200, "{body}");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            body["values"][0],
            serde_json::json!({"path": "/3/0/0", "type": "string", "value": "Acme"})
        );

        let write = s.spawn(move || http(web, "PUT", "/clients/cli-dev/3/0/14", r#""+02""#));
        let req = device.answer(Code::CHANGED, None, b"", None);
        assert_eq!((req.code, req.payload.as_slice()), (Code::PUT, &b"+02"[..]));
        assert_eq!(write.join().unwrap().0, 204);

        let exec = s.spawn(move || http(web, "POST", "/clients/cli-dev/3/0/4", ""));
        let req = device.answer(Code::CHANGED, None, b"", None);
        assert_eq!(
            (req.code, req.options.uri_path_string().as_str()),
            (Code::POST, "/3/0/4")
        );
        assert_eq!(exec.join().unwrap().0, 204);

        let refused = s.spawn(move || http(web, "GET", "/clients/cli-dev/3/0/99?format=text", ""));
        device.answer(Code::NOT_FOUND, None, b"", None);
        assert_eq!(refused.join().unwrap().0, 404);

        let discover = s.spawn(move || http(web, "GET", "/clients/cli-dev/3/0?format=link", ""));
        let req = device.answer(Code::CONTENT, Some(40), b"</3/0/0>,</3/0/13>;obs", None);
        assert_eq!(req.options.accept(), Some(40));
        let (status, links) = discover.join().unwrap();
        assert_eq!(status, 200);
        assert!(links.contains("</3/0/13>;obs"), "{links}");

        let body = r#"[{"path": "/3303/0/5700", "value": 21.5}]"#;
        let create = s.spawn(move || http(web, "POST", "/clients/cli-dev/3303", body));
        let req = device.answer(Code::CREATED, None, b"", None);
        assert_eq!(
            (
                req.code,
                req.options.uri_path_string().as_str(),
                req.options.content_format()
            ),
            (Code::POST, "/3303", Some(110))
        );
        assert!(String::from_utf8_lossy(&req.payload).contains("21.5"));
        assert_eq!(create.join().unwrap().0, 201);

        // Observe as Server-Sent Events: the first answer, then one notification.
        let events = s.spawn(move || {
            let mut stream = TcpStream::connect(web).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            write!(
                stream,
                "GET /clients/cli-dev/3/0/13/observe HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            .unwrap();
            let mut data = Vec::new();
            for line in BufReader::new(stream).lines() {
                let line = line.unwrap();
                if let Some(d) = line.strip_prefix("data: ") {
                    data.push(d.to_string());
                    if data.len() == 2 {
                        break;
                    }
                }
            }
            data
        });
        let req = device.answer(
            Code::CONTENT,
            Some(110),
            br#"[{"n":"/3/0/13","v":1700000000}]"#,
            Some(2),
        );
        assert_eq!(req.options.observe(), Some(0));
        let mut notification = Message::new(MessageType::NonConfirmable, Code::CONTENT, 500);
        notification.token = req.token;
        notification.options.set_uint(opt::OBSERVE, 3);
        notification.options.set_uint(opt::CONTENT_FORMAT, 110);
        notification.payload = br#"[{"n":"/3/0/13","v":1700000001}]"#.to_vec();
        device.send(&notification);
        let data = events.join().unwrap();
        assert!(data[0].contains("1700000000"), "{data:?}");
        assert!(data[1].contains("1700000001"), "{data:?}");
    });
}

//! Micro-benchmarks of the protocol core: decode, encode, and a full endpoint round
//! trip (client request → server request event → piggybacked response → client event).
//! Run with `cargo bench -p cobalt-proto`.

use cobalt_proto::endpoint::{Endpoint, EndpointConfig, Event};
use cobalt_proto::message::{self, opt, Code, Message, MessageType, Token};
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use std::net::SocketAddr;
use std::time::Instant;

/// A typical request: CON GET with a 4-byte token and five options (62 bytes).
fn request() -> Message {
    let mut m = Message::new(MessageType::Confirmable, Code::GET, 0x1234);
    m.token = Token::new(&[1, 2, 3, 4]).unwrap();
    m.options.set(opt::URI_HOST, &b"sensor.example.net"[..]);
    m.options.set_uri_path("/building/7/temperature");
    m.options.set_uint(opt::ACCEPT, 50);
    m
}

fn codec(c: &mut Criterion) {
    let bytes = message::encode(&request());
    c.bench_function("decode request", |b| {
        b.iter(|| message::decode(black_box(&bytes)).unwrap())
    });
    let m = request();
    let mut out = Vec::with_capacity(128);
    c.bench_function("encode request", |b| {
        b.iter(|| {
            out.clear();
            message::encode_into(black_box(&m), &mut out);
        })
    });
}

fn round_trip(c: &mut Criterion) {
    let mut now = Instant::now();
    let mut iteration = 0u64;
    let cfg = EndpointConfig::default;
    let mut client = Endpoint::with_seed(cfg(), now, 1);
    let mut server = Endpoint::with_seed(cfg(), now, 2);
    let c_addr: SocketAddr = "10.0.0.1:40000".parse().unwrap();
    let s_addr: SocketAddr = "10.0.0.2:5683".parse().unwrap();
    let mut resp = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
    resp.payload = b"hello world".to_vec();
    c.bench_function("endpoint round trip (CON GET, piggybacked 2.05)", |b| {
        b.iter(|| {
            // A client may not reuse a MID within EXCHANGE_LIFETIME: let virtual time
            // pass (10 ms per request) so that 16-bit MIDs never repeat inside it, and
            // let the endpoints expire old state as a real shard would.
            iteration += 1;
            now += std::time::Duration::from_millis(10);
            if iteration.is_multiple_of(1024) {
                client.handle_timeout(now);
                server.handle_timeout(now);
            }
            client.request(now, s_addr, request()).unwrap();
            let tx = client.poll_transmit().unwrap();
            server.handle_datagram(now, c_addr, &tx.bytes);
            let id = match server.poll_event() {
                Some(Event::Request { id, .. }) => id,
                other => panic!("expected a request, got {other:?} ({:?})", server.stats()),
            };
            server.respond(now, id, resp.clone()).unwrap();
            let tx = server.poll_transmit().unwrap();
            client.handle_datagram(now, s_addr, &tx.bytes);
            black_box(client.poll_event().unwrap());
        })
    });
}

criterion_group!(benches, codec, round_trip);
criterion_main!(benches);

//! `dtls_hold`: opens N DTLS PSK sessions to a `coaps` server, one source port each,
//! and holds them (silent) until its standard input closes, so that a script can read
//! the server's memory with N sessions and without (`bench/dtls-backends.sh`).
//!
//! ```text
//! cargo build --release -p cobalt --example dtls_hold
//! target/release/examples/dtls_hold 127.0.0.1:5684 1000 IDENTITY KEY
//! ```
//!
//! KEY as in a key file: `0x` and hex digits, or text.
//!
//! Prints `HELD n` on stdout when the sessions are up (or `FAILED reason` and exits
//! 1). The handshakes run a few at a time; the server must allow that many sessions
//! per address (`--set dtls.max_sessions_per_ip=N`).

use cobalt::transport::credentials::{parse_key, ClientPsk};
use cobalt::transport::dtls::{DtlsBackend, DtlsConfig, DtlsEvent, OpensslDtls};
use std::io::Read;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// Handshakes in flight at once.
const IN_FLIGHT: usize = 16;

struct Session {
    dtls: OpensslDtls,
    socket: UdpSocket,
    up: bool,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [server, count, identity, key] = args.as_slice() else {
        eprintln!("usage: dtls_hold SERVER-ADDR COUNT PSK-IDENTITY PSK-KEY");
        std::process::exit(2);
    };
    let server: SocketAddr = server
        .parse()
        .unwrap_or_else(|e| fail(&format!("{server}: {e}")));
    let count: usize = count
        .parse()
        .unwrap_or_else(|e| fail(&format!("{count}: {e}")));
    let key = parse_key(key).unwrap_or_else(|e| fail(&format!("the key: {e}")));
    let psk = ClientPsk::new(identity.as_bytes(), key);
    let mut held: Vec<Session> = Vec::with_capacity(count);
    let mut opened = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while held.iter().filter(|s| s.up).count() < count {
        if Instant::now() > deadline {
            fail("the sessions did not come up within 120 s");
        }
        while opened < count && held.iter().filter(|s| !s.up).count() < IN_FLIGHT {
            held.push(open(server, &psk));
            opened += 1;
        }
        for s in held.iter_mut().filter(|s| !s.up) {
            pump(s);
        }
    }
    println!("HELD {count}");
    // Hold until told to stop.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

fn open(server: SocketAddr, psk: &ClientPsk) -> Session {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap_or_else(|e| fail(&format!("bind: {e}")));
    socket
        .set_read_timeout(Some(Duration::from_millis(2)))
        .unwrap_or_else(|e| fail(&format!("socket: {e}")));
    let mut dtls = OpensslDtls::client(psk.clone(), DtlsConfig::default())
        .unwrap_or_else(|e| fail(&format!("OpenSSL: {e}")));
    dtls.connect(Instant::now(), server);
    let mut s = Session {
        dtls,
        socket,
        up: false,
    };
    send(&mut s);
    s
}

fn send(s: &mut Session) {
    while let Some(t) = s.dtls.poll_transmit() {
        let _ = s.socket.send_to(&t.bytes, t.peer);
    }
}

/// Feeds what arrived, runs timers, and notes a completed handshake.
fn pump(s: &mut Session) {
    let mut buf = [0u8; 2048];
    if let Ok((n, from)) = s.socket.recv_from(&mut buf) {
        s.dtls.handle_datagram(Instant::now(), from, &buf[..n]);
    }
    if s.dtls.poll_timeout().is_some_and(|t| t <= Instant::now()) {
        s.dtls.handle_timeout(Instant::now());
    }
    send(s);
    while let Some(event) = s.dtls.poll_event() {
        match event {
            DtlsEvent::Connected { .. } => s.up = true,
            DtlsEvent::HandshakeFailed { reason, .. } | DtlsEvent::Closed { reason, .. } => {
                fail(&format!("a session failed: {reason}"))
            }
        }
    }
}

fn fail(reason: &str) -> ! {
    println!("FAILED {reason}");
    std::process::exit(1)
}

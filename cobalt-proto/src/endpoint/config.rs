//! Protocol parameters of the endpoint (RFC 7252 §4.8), all configurable.

use std::time::Duration;

/// Transmission and state parameters. `Default` gives the RFC 7252 values.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointConfig {
    /// Initial retransmission timeout base (ACK_TIMEOUT, default 2 s).
    pub ack_timeout: Duration,
    /// Randomisation of the initial timeout (ACK_RANDOM_FACTOR, default 1.5, must be ≥ 1).
    pub ack_random_factor: f64,
    /// Retransmissions of a confirmable message before giving up (MAX_RETRANSMIT, default 4).
    pub max_retransmit: u32,
    /// Outstanding interactions per peer (NSTART, default 1); further requests queue.
    pub nstart: usize,
    /// Maximum one-way latency assumed by the lifetimes (MAX_LATENCY, default 100 s).
    pub max_latency: Duration,
    /// Time a receiver needs to answer a CON (PROCESSING_DELAY, default = ACK_TIMEOUT).
    pub processing_delay: Duration,
    /// How long a request handler may take before the server sends an empty ACK and
    /// answers later with a separate response (default 1 s, below ACK_TIMEOUT so the
    /// client does not retransmit).
    pub separate_ack_delay: Duration,
    /// How long a client waits for the response to a NON request, or for a separate
    /// response after an empty ACK (default: NON_LIFETIME resp. EXCHANGE_LIFETIME when `None`).
    pub response_timeout: Option<Duration>,
    /// Messages remembered for deduplication per peer (IP address and port): its last
    /// this many, each for EXCHANGE_LIFETIME (default 8). A peer retransmits only its
    /// outstanding confirmable messages (NSTART of them), so a few suffice; a duplicate
    /// older than the peer's last `dedup_per_peer` messages is processed again.
    pub dedup_per_peer: usize,
    /// Bytes the deduplication store may hold (stored replies plus 160 bytes per
    /// message, default 16 MiB); beyond it the oldest entries of all peers are dropped
    /// first. Nobody is refused for it.
    pub max_dedup_bytes: usize,
    /// Upper bound on requests being handled at once (default 100,000). At the bound a
    /// request from an IP address that already has requests in progress gets 5.03 with
    /// Max-Age; an address with none still gets in, up to an eighth more.
    pub max_server_exchanges: usize,
    /// Requests in progress per peer (IP address and port, default 32); beyond it 4.29
    /// Too Many Requests (RFC 8516) with Max-Age.
    pub max_exchanges_per_peer: usize,
    /// Requests in progress per IP address over all its ports (default 10,000); beyond
    /// it 4.29 with Max-Age.
    pub max_exchanges_per_ip: usize,
    /// Upper bound on client requests outstanding or queued; `request` fails beyond it.
    pub max_client_exchanges: usize,
    /// Length of generated tokens in bytes (1–8, default 8).
    pub token_len: usize,
    /// Remember nothing of answered safe requests (GET, FETCH; default true): a duplicate
    /// that arrives after the answer runs the handler again, as RFC 7252 §4.5 permits
    /// for idempotent requests, so the store never holds their (possibly large)
    /// answers. A duplicate that arrives while the handler runs is still recognised.
    /// With `false` their answers are stored like those of other methods.
    pub dedup_rerun_safe: bool,
    /// Max-Age (seconds) put on 5.03 and 4.29 answers given when a bound is reached.
    pub overload_max_age: u32,
    /// Amplification limit (RFC 9175 §2.4, default 3; 0 turns it off): until a peer's
    /// address is verified, what the endpoint sends in answer to a request is at most
    /// this many times the request's bytes, and it sends no notification. A larger
    /// answer waits for one verification round trip — an empty confirmable message
    /// (CoAP ping) that the peer must answer with RST — and is then sent in full.
    pub amplification_factor: usize,
    /// How long a verified address stays verified after its last proof (an RST to a
    /// ping, an ACK of a confirmable message, a valid Echo option; default 10 min).
    pub verified_lifetime: Duration,
    /// Verified addresses remembered (default 100,000); beyond it the ones verified
    /// longest ago are forgotten and verify again when they need to.
    pub max_verified_peers: usize,
    /// Address verifications in progress (default 10,000); beyond it an answer that
    /// needs one is replaced by 4.01 with an Echo option (RFC 9175 §2.4).
    pub max_address_probes: usize,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            ack_timeout: Duration::from_secs(2),
            ack_random_factor: 1.5,
            max_retransmit: 4,
            nstart: 1,
            max_latency: Duration::from_secs(100),
            processing_delay: Duration::from_secs(2),
            separate_ack_delay: Duration::from_secs(1),
            response_timeout: None,
            dedup_per_peer: 8,
            max_dedup_bytes: 16 << 20,
            max_server_exchanges: 100_000,
            max_exchanges_per_peer: 32,
            max_exchanges_per_ip: 10_000,
            max_client_exchanges: 100_000,
            token_len: 8,
            dedup_rerun_safe: true,
            overload_max_age: 2,
            amplification_factor: 3,
            verified_lifetime: Duration::from_secs(600),
            max_verified_peers: 100_000,
            max_address_probes: 10_000,
        }
    }
}

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The offending field.
    pub key: &'static str,
    /// What values are allowed.
    pub allowed: &'static str,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid value for `{}`: allowed {}",
            self.key, self.allowed
        )
    }
}

impl std::error::Error for ConfigError {}

impl EndpointConfig {
    /// MAX_TRANSMIT_SPAN: ACK_TIMEOUT × (2^MAX_RETRANSMIT − 1) × ACK_RANDOM_FACTOR.
    pub fn max_transmit_span(&self) -> Duration {
        let factor = ((1u64 << self.max_retransmit.min(20)) - 1) as f64 * self.ack_random_factor;
        self.ack_timeout.mul_f64(factor)
    }

    /// MAX_TRANSMIT_WAIT: ACK_TIMEOUT × (2^(MAX_RETRANSMIT+1) − 1) × ACK_RANDOM_FACTOR.
    pub fn max_transmit_wait(&self) -> Duration {
        let factor =
            ((1u64 << (self.max_retransmit.min(20) + 1)) - 1) as f64 * self.ack_random_factor;
        self.ack_timeout.mul_f64(factor)
    }

    /// EXCHANGE_LIFETIME: MAX_TRANSMIT_SPAN + 2 × MAX_LATENCY + PROCESSING_DELAY (247 s by default).
    pub fn exchange_lifetime(&self) -> Duration {
        self.max_transmit_span() + 2 * self.max_latency + self.processing_delay
    }

    /// NON_LIFETIME: MAX_TRANSMIT_SPAN + MAX_LATENCY (145 s by default).
    pub fn non_lifetime(&self) -> Duration {
        self.max_transmit_span() + self.max_latency
    }

    /// Checks every value; the error names the key and the allowed range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let check = |ok: bool, key, allowed| {
            if ok {
                Ok(())
            } else {
                Err(ConfigError { key, allowed })
            }
        };
        check(
            !self.ack_timeout.is_zero() && self.ack_timeout <= Duration::from_secs(600),
            "ack_timeout",
            "1 ms to 600 s",
        )?;
        check(
            (1.0..=10.0).contains(&self.ack_random_factor),
            "ack_random_factor",
            "1.0 to 10.0",
        )?;
        check(self.max_retransmit <= 20, "max_retransmit", "0 to 20")?;
        check(
            self.max_latency <= Duration::from_secs(3600),
            "max_latency",
            "0 s to 3600 s",
        )?;
        check(
            self.processing_delay <= Duration::from_secs(600),
            "processing_delay",
            "0 s to 600 s",
        )?;
        check(
            self.separate_ack_delay <= Duration::from_secs(600),
            "separate_ack_delay",
            "0 s to 600 s",
        )?;
        check(
            self.response_timeout.is_none_or(|t| {
                t >= Duration::from_millis(1) && t <= Duration::from_secs(24 * 3600)
            }),
            "response_timeout",
            "1 ms to 24 h (or unset: derived from the lifetimes)",
        )?;
        check((1..=1024).contains(&self.nstart), "nstart", "1 to 1024")?;
        check((1..=8).contains(&self.token_len), "token_len", "1 to 8")?;
        check(
            (1..=1024).contains(&self.dedup_per_peer),
            "dedup_per_peer",
            "1 to 1024",
        )?;
        check(
            self.max_dedup_bytes >= 64 << 10,
            "max_dedup_bytes",
            "at least 65536",
        )?;
        check(
            self.max_exchanges_per_peer >= 1,
            "max_exchanges_per_peer",
            "at least 1",
        )?;
        check(
            self.max_exchanges_per_ip >= 1,
            "max_exchanges_per_ip",
            "at least 1",
        )?;
        check(
            self.amplification_factor <= 1000,
            "amplification_factor",
            "0 to 1000",
        )?;
        check(
            self.verified_lifetime >= Duration::from_secs(1)
                && self.verified_lifetime <= Duration::from_secs(24 * 3600),
            "verified_lifetime",
            "1 s to 24 h",
        )?;
        check(
            self.max_verified_peers >= 1,
            "max_verified_peers",
            "at least 1",
        )?;
        check(
            self.max_address_probes >= 1,
            "max_address_probes",
            "at least 1",
        )?;
        check(
            self.max_server_exchanges >= 1,
            "max_server_exchanges",
            "at least 1",
        )?;
        check(
            self.max_client_exchanges >= 1,
            "max_client_exchanges",
            "at least 1",
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_derived_values() {
        let c = EndpointConfig::default();
        assert_eq!(c.max_transmit_span(), Duration::from_secs(45));
        assert_eq!(c.max_transmit_wait(), Duration::from_secs(93));
        assert_eq!(c.exchange_lifetime(), Duration::from_secs(247));
        assert_eq!(c.non_lifetime(), Duration::from_secs(145));
        assert!(c.validate().is_ok());
    }

    #[test]
    fn bad_values_name_the_key() {
        let c = EndpointConfig {
            nstart: 0,
            ..Default::default()
        };
        assert_eq!(c.validate().unwrap_err().key, "nstart");
        let c = EndpointConfig {
            ack_random_factor: 0.5,
            ..Default::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("ack_random_factor"));
    }

    #[test]
    fn durations_are_bounded() {
        let bad = [
            EndpointConfig {
                max_latency: Duration::from_secs(3601),
                ..Default::default()
            },
            EndpointConfig {
                processing_delay: Duration::from_secs(601),
                ..Default::default()
            },
            EndpointConfig {
                separate_ack_delay: Duration::from_secs(601),
                ..Default::default()
            },
            EndpointConfig {
                response_timeout: Some(Duration::ZERO),
                ..Default::default()
            },
        ];
        let keys: Vec<&str> = bad.iter().map(|c| c.validate().unwrap_err().key).collect();
        assert_eq!(
            keys,
            [
                "max_latency",
                "processing_delay",
                "separate_ack_delay",
                "response_timeout"
            ]
        );
        let ok = EndpointConfig {
            response_timeout: Some(Duration::from_secs(30)),
            ..Default::default()
        };
        assert!(ok.validate().is_ok());
    }
}

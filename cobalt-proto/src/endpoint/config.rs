//! Protocol parameters of the endpoint (RFC 7252 §4.8), all configurable.

use crate::congestion::{Algorithm, Params, PeerTable};
use std::sync::Arc;
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
    /// Upper bound on stored deduplication entries; at the bound new confirmable requests
    /// are answered 5.03 Service Unavailable with Max-Age instead of growing memory.
    pub max_dedup_entries: usize,
    /// Upper bound on requests being handled at once; at the bound new requests get 5.03.
    pub max_server_exchanges: usize,
    /// Upper bound on client requests outstanding or queued; `request` fails beyond it.
    pub max_client_exchanges: usize,
    /// Length of generated tokens in bytes (1–8, default 8).
    pub token_len: usize,
    /// Do not store deduplication state for GET requests (idempotent, RFC 7252 §4.5
    /// permits re-processing): saves memory, a duplicate GET runs the handler again.
    pub dedup_skip_idempotent: bool,
    /// Max-Age (seconds) put on 5.03 answers given under overload.
    pub overload_max_age: u32,
    /// Retransmission-timeout algorithm for confirmable messages (default: RFC 7252's
    /// [`Algorithm::Default`]; see [`crate::congestion`]).
    pub congestion_control: Algorithm,
    /// Upper bound on peers with congestion state (RTO estimates, NON pacing); at the
    /// bound new peers run on throw-away initial state (default 100,000).
    pub max_congestion_peers: usize,
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
            max_dedup_entries: 1_000_000,
            max_server_exchanges: 100_000,
            max_client_exchanges: 100_000,
            token_len: 8,
            dedup_skip_idempotent: false,
            overload_max_age: 2,
            congestion_control: Algorithm::FasorK,
            max_congestion_peers: 100_000,
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

    /// The congestion state table this configuration asks for: its algorithm, its
    /// bound, kept for EXCHANGE_LIFETIME but at least 255 s.
    pub(crate) fn congestion_table(&self) -> PeerTable {
        PeerTable::new(
            Arc::new(self.congestion_control),
            Params {
                ack_timeout: self.ack_timeout,
                ack_random_factor: self.ack_random_factor,
            },
            self.max_congestion_peers,
            self.exchange_lifetime(),
        )
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
            self.max_dedup_entries >= 1,
            "max_dedup_entries",
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
        check(
            self.max_congestion_peers >= 1,
            "max_congestion_peers",
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

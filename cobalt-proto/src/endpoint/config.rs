//! Protocol parameters of the endpoint (RFC 7252 §4.8), all configurable.

use crate::address::AddressPrefix;
use crate::congestion::{Algorithm, Congestion, Params};
use crate::message::{DEFAULT_MAX_TOKEN_LEN, MAX_TOKEN_LEN};
use crate::settings::{within, Param, Settings};
use std::sync::Arc;
use std::time::Duration;

/// Transmission and state parameters. `Default` gives the RFC 7252 values; the
/// allowed values are those of [`EndpointConfig::params`]. With the feature `serde` it
/// is the `[endpoint]` section of a configuration file (durations as `"2s"`).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields, default)
)]
pub struct EndpointConfig {
    /// Initial retransmission timeout base (ACK_TIMEOUT, default 2 s).
    #[cfg_attr(feature = "serde", serde(with = "crate::settings::duration"))]
    pub ack_timeout: Duration,
    /// Randomisation of the initial timeout (ACK_RANDOM_FACTOR, default 1.5, must be ≥ 1).
    pub ack_random_factor: f64,
    /// Retransmissions of a confirmable message before giving up (MAX_RETRANSMIT, default 4).
    pub max_retransmit: u32,
    /// Outstanding interactions per peer (NSTART, default 1); further requests queue.
    pub nstart: usize,
    /// Maximum one-way latency assumed by the lifetimes (MAX_LATENCY, default 100 s).
    #[cfg_attr(feature = "serde", serde(with = "crate::settings::duration"))]
    pub max_latency: Duration,
    /// Time a receiver needs to answer a CON (PROCESSING_DELAY, default = ACK_TIMEOUT).
    #[cfg_attr(feature = "serde", serde(with = "crate::settings::duration"))]
    pub processing_delay: Duration,
    /// How long a request handler may take before the server sends an empty ACK and
    /// answers later with a separate response (default 1 s, below ACK_TIMEOUT so the
    /// client does not retransmit).
    #[cfg_attr(feature = "serde", serde(with = "crate::settings::duration"))]
    pub separate_ack_delay: Duration,
    /// How long a client waits for the response to a NON request, or for a separate
    /// response after an empty ACK (default: NON_LIFETIME resp. EXCHANGE_LIFETIME when `None`).
    #[cfg_attr(feature = "serde", serde(with = "crate::settings::auto_duration"))]
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
    /// Requests in progress per IP address (IPv6: per [`ipv6_budget_prefix`]) over all
    /// its ports (default 10,000); beyond it 4.29 with Max-Age.
    ///
    /// [`ipv6_budget_prefix`]: EndpointConfig::ipv6_budget_prefix
    pub max_exchanges_per_ip: usize,
    /// How IPv6 peers are counted by every per-address budget: by this many leading
    /// bits of their address (default /64, what one host or subscriber usually holds;
    /// see [`crate::address`]). IPv4 addresses are counted whole. A server applies it
    /// to exchanges, uploads, observe relations, connections and DTLS handshakes alike.
    pub ipv6_budget_prefix: AddressPrefix,
    /// Upper bound on client requests outstanding or queued; `request` fails beyond it.
    pub max_client_exchanges: usize,
    /// Length of generated tokens in bytes (1–8, default 8).
    pub token_len: usize,
    /// Longest token accepted, in bytes (RFC 8974 extended tokens; default
    /// [`DEFAULT_MAX_TOKEN_LEN`], 8 to 65,804). A request with a longer token is answered
    /// 4.00 Bad Request without reaching the application, as RFC 8974 §2.2.2 asks of a
    /// server that supports extended tokens but not that length; nothing of it is kept.
    /// [`Endpoint::request`](super::Endpoint::request) refuses to send a longer one.
    pub max_token_len: usize,
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
    #[cfg_attr(feature = "serde", serde(with = "crate::settings::duration"))]
    pub verified_lifetime: Duration,
    /// Verified addresses remembered (default 100,000); beyond it the ones verified
    /// longest ago are forgotten and verify again when they need to.
    pub max_verified_peers: usize,
    /// Address verifications in progress (default 10,000); beyond it an answer that
    /// needs one is replaced by 4.01 with an Echo option (RFC 9175 §2.4).
    pub max_address_probes: usize,
    /// Retransmission-timeout algorithm for confirmable messages (default
    /// [`Algorithm::Fasor`], draft-ietf-core-fasor-02; why, and why not Cobalt's
    /// [`Algorithm::FasorK`], in [`crate::congestion`] and `bench/congestion/`).
    pub congestion_control: Algorithm,
    /// Upper bound on peers with congestion state (RTO estimates, NON pacing); at the
    /// bound new peers run on throw-away initial state (default 100,000).
    pub max_congestion_peers: usize,
    /// Critical options the application handles beyond the known ones (a server's
    /// layers declare them): requests carrying them are not answered 4.02 Bad Option.
    /// Set by the server from its layers; not part of a configuration file.
    #[cfg_attr(feature = "serde", serde(skip))]
    pub handled_options: crate::message::option::HandledOptions,
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
            ipv6_budget_prefix: AddressPrefix::SUBNET,
            max_client_exchanges: 100_000,
            token_len: 8,
            max_token_len: DEFAULT_MAX_TOKEN_LEN,
            dedup_rerun_safe: true,
            overload_max_age: 2,
            amplification_factor: 3,
            verified_lifetime: Duration::from_secs(600),
            max_verified_peers: 100_000,
            max_address_probes: 10_000,
            congestion_control: Algorithm::Fasor,
            max_congestion_peers: 100_000,
            handled_options: Default::default(),
        }
    }
}

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

    /// The congestion control this configuration asks for: its algorithm, its bound
    /// on peers with state, kept for EXCHANGE_LIFETIME but at least 255 s.
    pub(crate) fn congestion_table(&self) -> Congestion {
        Congestion::new(
            Arc::new(self.congestion_control),
            Params {
                ack_timeout: self.ack_timeout,
                ack_random_factor: self.ack_random_factor,
            },
            self.max_congestion_peers,
            self.exchange_lifetime(),
        )
    }
}

impl Settings for EndpointConfig {
    /// Every parameter with what it does and the values allowed, in file order.
    fn params(&self) -> Vec<Param> {
        let secs = Duration::from_secs;
        let at_least_1 = "at least 1";
        vec![
            Param::new("ack_timeout", "Initial retransmission timeout of a confirmable message (ACK_TIMEOUT).", "1ms to 600s", within(self.ack_timeout, Duration::from_millis(1), secs(600))),
            Param::new("ack_random_factor", "Randomisation of the initial timeout (ACK_RANDOM_FACTOR).", "1.0 to 10.0", (1.0..=10.0).contains(&self.ack_random_factor)),
            Param::new("max_retransmit", "Retransmissions of a confirmable message before giving up (MAX_RETRANSMIT).", "0 to 20", self.max_retransmit <= 20),
            Param::new("nstart", "Outstanding interactions per peer (NSTART); further requests queue.", "1 to 1024", (1..=1024).contains(&self.nstart)),
            Param::new("max_latency", "Maximum one-way latency assumed by the lifetimes (MAX_LATENCY).", "0s to 3600s", self.max_latency <= secs(3600)),
            Param::new("processing_delay", "Time a receiver needs to answer a CON (PROCESSING_DELAY).", "0s to 600s", self.processing_delay <= secs(600)),
            Param::new("separate_ack_delay", "A handler slower than this gets an empty ACK; its answer follows as a separate response.", "0s to 600s", self.separate_ack_delay <= secs(600)),
            Param::new("response_timeout", "Client wait for a NON response or a separate response; \"auto\": NON_LIFETIME resp. EXCHANGE_LIFETIME.", "\"auto\" or 1ms to 24h", self.response_timeout.is_none_or(|t| within(t, Duration::from_millis(1), secs(24 * 3600)))),
            Param::new("dedup_per_peer", "Messages remembered per peer (IP address and port) for deduplication: its last this many, each for EXCHANGE_LIFETIME. A duplicate older than that is processed again.", "1 to 1024", (1..=1024).contains(&self.dedup_per_peer)),
            Param::new("max_dedup_bytes", "Bytes the deduplication store of one shard may hold (answers plus 160 bytes per message); near it the busiest peers keep only their last two messages, at it the oldest go. Nobody is refused for it.", "at least 65536", self.max_dedup_bytes >= 64 << 10),
            Param::new("max_server_exchanges", "Requests being handled at once per shard; at the bound an IP address that already has requests in progress gets 5.03 with Max-Age, one with none still gets in (up to an eighth more).", at_least_1, self.max_server_exchanges >= 1),
            Param::new("max_exchanges_per_peer", "Requests in progress per peer (IP address and port); beyond it 4.29 Too Many Requests with Max-Age.", at_least_1, self.max_exchanges_per_peer >= 1),
            Param::new("max_exchanges_per_ip", "Requests in progress per IP address (IPv6: per ipv6_budget_prefix), over all its ports; beyond it 4.29 with Max-Age.", at_least_1, self.max_exchanges_per_ip >= 1),
            Param::new("ipv6_budget_prefix", "Leading bits of an IPv6 address that make one budget, for every per-address bound of the server (exchanges, uploads, observers, connections, DTLS handshakes); IPv4 addresses count whole. 64: one /64, what a host or subscriber usually holds; 128: every address on its own.", "1 to 128", (1..=128).contains(&self.ipv6_budget_prefix.bits())),
            Param::new("max_client_exchanges", "Bound on client requests outstanding or queued.", at_least_1, self.max_client_exchanges >= 1),
            Param::new("token_len", "Length of generated tokens in bytes.", "1 to 8", (1..=8).contains(&self.token_len)),
            Param::new("max_token_len", "Longest token accepted (RFC 8974 extended tokens); a request with a longer one gets 4.00 Bad Request and nothing of it is kept.", "8 to 65804", (8..=MAX_TOKEN_LEN).contains(&self.max_token_len)),
            Param::new("dedup_rerun_safe", "Keep no answers of safe requests (GET, FETCH): a duplicate arriving after the answer runs the handler again (RFC 7252 §4.5); false keeps them like other methods' answers.", "true or false", true),
            Param::new("overload_max_age", "Max-Age (seconds) on 5.03 and 4.29 answers given when a bound is reached.", "0 to 4294967295", true),
            Param::new("amplification_factor", "Until a peer's address is verified it gets at most this many times the bytes of its request, and no notifications (RFC 9175 §2.4); more waits for one verification round trip (a CoAP ping the peer answers with RST). 0: off. DTLS peers are verified by the handshake.", "0 to 1000", self.amplification_factor <= 1000),
            Param::new("verified_lifetime", "How long a verified address stays verified after its last proof (RST to a ping, ACK, valid Echo).", "1s to 24h", within(self.verified_lifetime, secs(1), secs(24 * 3600))),
            Param::new("max_verified_peers", "Verified addresses remembered per shard; beyond it those verified longest ago verify again.", at_least_1, self.max_verified_peers >= 1),
            Param::new("max_address_probes", "Address verifications in progress per shard; beyond it an answer that needs one becomes 4.01 with Echo.", at_least_1, self.max_address_probes >= 1),
            Param::new("congestion_control", "Retransmission timeouts of confirmable messages: \"default\" (RFC 7252: 2-3 s, doubled per retransmission), \"cocoa\" (draft-ietf-core-cocoa-03 RTT estimation), \"cocoa-strong\" (CoCoA without ambiguous samples), \"fasor\" (draft-ietf-core-fasor-02; the default), \"fasor-k\" (FASOR keeping the backed-off timer until an unambiguous sample, as TCP does) or \"karn\" (RFC 6298 with Karn's retention). See bench/congestion/ for the study behind the choice.", "default, cocoa, cocoa-strong, fasor, fasor-k, karn", true),
            Param::new("max_congestion_peers", "Bound on peers with congestion state (RTO estimates, NON pacing), kept at least 255 s after last use; beyond it new peers run on fresh state that is not kept.", at_least_1, self.max_congestion_peers >= 1),
        ]
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

//! Per-shard metrics and their Prometheus text exposition.
//!
//! Each shard publishes a snapshot of its endpoint's counters ([`Stats`]) and state
//! sizes ([`StateCounts`]) into its [`ShardMetrics`] after every batch of work: a few
//! relaxed atomic stores, no lock. [`Metrics`] reads them all, and
//! [`serve_metrics`] answers `GET /metrics` over HTTP/1.1 in the Prometheus text
//! format:
//!
//! ```text
//! # HELP cobalt_requests_total Requests received and handed to a handler.
//! # TYPE cobalt_requests_total counter
//! cobalt_requests_total{shard="0"} 123
//! ```

use cobalt_proto::endpoint::{StateCounts, Stats};
use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Declares the per-shard values once: the [`ShardSnapshot`] struct, its field count
/// and its conversion to and from the array of atomics a shard publishes into.
macro_rules! shard_values {
    ($( $(#[doc = $doc:literal])+ $field:ident, )*) => {
        /// The values of one shard at one moment.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct ShardSnapshot {
            $( $(#[doc = $doc])+ pub $field: u64, )*
        }

        const FIELDS: usize = [$(stringify!($field)),*].len();

        impl ShardSnapshot {
            fn to_array(self) -> [u64; FIELDS] {
                [$(self.$field),*]
            }

            fn from_array(a: [u64; FIELDS]) -> ShardSnapshot {
                let mut values = a.into_iter();
                ShardSnapshot { $($field: values.next().unwrap_or(0)),* }
            }
        }
    };
}

shard_values! {
    /// Datagrams received.
    datagrams_in,
    /// Datagrams sent.
    datagrams_out,
    /// New requests handed to a handler.
    requests,
    /// Responses and notifications sent with a 2.xx code.
    responses_2xx,
    /// Responses and notifications sent with a 4.xx code.
    responses_4xx,
    /// Responses and notifications sent with a 5.xx code.
    responses_5xx,
    /// Confirmable messages retransmitted.
    retransmissions,
    /// Duplicate messages recognised by deduplication.
    duplicates,
    /// Undecodable datagrams (dropped, or answered with RST when confirmable).
    format_errors,
    /// Requests answered 4.02 Bad Option.
    bad_options,
    /// Requests answered 5.03 because the total bound on requests in progress was reached.
    overload_rejections,
    /// Requests answered 4.29 because their peer or address had too many in progress.
    busy_rejections,
    /// ACKs, RSTs and responses that matched nothing (dropped).
    unmatched,
    /// RSTs sent.
    resets_sent,
    /// Deduplication entries held (gauge).
    dedup_entries,
    /// Bytes held by the deduplication store (gauge).
    dedup_bytes,
    /// Deduplication entries dropped before their lifetime ended.
    dedup_evictions,
    /// Answers and notifications held back for an address verification.
    parked,
    /// Address-verification pings sent.
    probes_sent,
    /// Addresses verified while answers waited.
    addresses_verified,
    /// Address verifications that got no answer.
    probes_failed,
    /// Answers and notifications withheld because an address was never verified.
    unverified,
    /// Address verifications in progress (gauge).
    address_probes,
    /// Verified addresses remembered (gauge).
    verified_peers,
    /// Requests being handled (gauge).
    server_exchanges,
    /// Observe relations (gauge).
    observers,
    /// Peers with per-peer state (gauge).
    peers,
    /// DTLS HelloVerifyRequests sent (cookie exchanges started).
    dtls_hello_verify_sent,
    /// DTLS handshakes completed.
    dtls_handshakes,
    /// DTLS handshakes that failed or timed out (wrong key, untrusted certificate, ...).
    dtls_handshake_failures,
    /// DTLS sessions evicted to make room.
    dtls_evicted,
    /// DTLS records dropped (no session, failed decryption, garbage).
    dtls_dropped,
    /// GET handler runs that produced notifications (one may serve many observers).
    notify_productions,
    /// Notifications held back (an unacknowledged CON, or pacing) and sent later with
    /// the state then current.
    notify_deferred,
    /// Observers queued for a notification (gauge).
    notify_backlog,
    /// Block1 uploads in progress (gauge).
    uploads,
    /// Bytes held by uploads in progress and kept answers (gauge).
    upload_bytes,
    /// DTLS handshakes in progress dropped to stay within the handshake budgets.
    dtls_handshakes_displaced,
    /// New DTLS sessions refused: the table was full of active sessions.
    dtls_refused,
    /// Established DTLS sessions (gauge).
    dtls_sessions,
    /// DTLS handshakes in progress (gauge).
    dtls_handshaking,
}

/// Refusals and dropped state of the server role over a whole server (every shard and
/// listener): the bounds of `[limits]` at work.
#[derive(Debug, Default)]
pub struct LimitCounters {
    /// Observe registrations answered 4.29: the address holds its share.
    pub observe_refused_peer: AtomicU64,
    /// Observe registrations answered 5.03: the server-wide bound.
    pub observe_refused_server: AtomicU64,
    /// Uploads (or blocks of one) answered 4.29: the address or port holds its share.
    pub upload_refused_peer: AtomicU64,
    /// Uploads (or blocks of one) answered 5.03: a shard's or listener's bound.
    pub upload_refused_server: AtomicU64,
    /// Uploads dropped after `upload_idle_timeout` without a block.
    pub uploads_expired: AtomicU64,
    /// Uploads dropped at a bound to make room for an address holding less.
    pub uploads_evicted: AtomicU64,
}

/// One shard's published values: written by the shard, read by anyone.
#[derive(Debug)]
pub struct ShardMetrics {
    shard: usize,
    values: [AtomicU64; FIELDS],
}

impl ShardMetrics {
    /// All zero, for shard number `shard`.
    fn new(shard: usize) -> ShardMetrics {
        ShardMetrics {
            shard,
            values: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Default for ShardMetrics {
    fn default() -> Self {
        ShardMetrics::new(0)
    }
}

impl ShardSnapshot {
    /// The snapshot of an endpoint's counters and state.
    pub fn from_endpoint(stats: &Stats, counts: StateCounts, observers: usize) -> ShardSnapshot {
        ShardSnapshot {
            datagrams_in: stats.datagrams_in,
            datagrams_out: stats.datagrams_out,
            requests: stats.requests,
            responses_2xx: stats.responses_2xx,
            responses_4xx: stats.responses_4xx,
            responses_5xx: stats.responses_5xx,
            retransmissions: stats.retransmissions,
            duplicates: stats.duplicates,
            format_errors: stats.format_errors,
            bad_options: stats.bad_options,
            overload_rejections: stats.overload_rejections,
            busy_rejections: stats.busy_rejections,
            unmatched: stats.unmatched,
            resets_sent: stats.resets_sent,
            dedup_entries: counts.dedup_entries as u64,
            dedup_bytes: counts.dedup_bytes as u64,
            dedup_evictions: stats.dedup_evictions,
            parked: stats.parked,
            probes_sent: stats.probes_sent,
            addresses_verified: stats.addresses_verified,
            probes_failed: stats.probes_failed,
            unverified: stats.unverified,
            address_probes: counts.address_probes as u64,
            verified_peers: counts.verified_peers as u64,
            server_exchanges: counts.server_exchanges as u64,
            observers: observers as u64,
            peers: counts.peers as u64,
            ..ShardSnapshot::default()
        }
    }

    /// Adds the server role's fan-out and upload figures (for server shards).
    pub fn with_server_role(
        mut self,
        productions: u64,
        deferred: u64,
        backlog: usize,
        uploads: usize,
        upload_bytes: usize,
    ) -> ShardSnapshot {
        self.notify_productions = productions;
        self.notify_deferred = deferred;
        self.notify_backlog = backlog as u64;
        self.uploads = uploads as u64;
        self.upload_bytes = upload_bytes as u64;
        self
    }

    /// Adds a DTLS layer's counters (for shards that serve `coaps://`).
    pub fn with_dtls(mut self, d: &crate::transport::dtls::DtlsStats) -> ShardSnapshot {
        self.dtls_hello_verify_sent = d.hello_verify_sent;
        self.dtls_handshakes = d.handshakes;
        self.dtls_handshake_failures = d.handshake_failures;
        self.dtls_evicted = d.evicted;
        self.dtls_dropped = d.dropped;
        self.dtls_handshakes_displaced = d.handshakes_displaced;
        self.dtls_refused = d.refused;
        self.dtls_sessions = d.sessions;
        self.dtls_handshaking = d.handshaking;
        self
    }

    /// Field-wise sum (counters and gauges over all shards).
    pub fn sum<'a>(snapshots: impl IntoIterator<Item = &'a ShardSnapshot>) -> ShardSnapshot {
        let mut total = [0u64; FIELDS];
        for s in snapshots {
            for (t, v) in total.iter_mut().zip(s.to_array()) {
                *t += v;
            }
        }
        ShardSnapshot::from_array(total)
    }
}

impl ShardMetrics {
    /// Publishes the shard's current values (relaxed stores), and logs at debug level
    /// the malformed datagrams and rejected requests since the last call.
    pub fn publish(&self, snapshot: ShardSnapshot) {
        let shard = self.shard;
        let old = self.snapshot();
        for (slot, v) in self.values.iter().zip(snapshot.to_array()) {
            slot.store(v, Relaxed);
        }
        let new_format_errors = snapshot.format_errors.saturating_sub(old.format_errors);
        if new_format_errors > 0 {
            tracing::debug!(
                shard,
                count = new_format_errors,
                "malformed datagrams dropped (RST sent to confirmable ones)"
            );
        }
        let new_overload = snapshot
            .overload_rejections
            .saturating_sub(old.overload_rejections);
        if new_overload > 0 {
            tracing::debug!(
                shard,
                count = new_overload,
                "requests rejected with 5.03 (a state bound was reached)"
            );
        }
        let new_bad_options = snapshot.bad_options.saturating_sub(old.bad_options);
        if new_bad_options > 0 {
            tracing::debug!(
                shard,
                count = new_bad_options,
                "requests rejected with 4.02 Bad Option"
            );
        }
    }

    /// The shard's number (its `shard` label).
    pub fn shard(&self) -> usize {
        self.shard
    }

    /// The values last published.
    pub fn snapshot(&self) -> ShardSnapshot {
        let mut a = [0u64; FIELDS];
        for (v, slot) in a.iter_mut().zip(&self.values) {
            *v = slot.load(Relaxed);
        }
        ShardSnapshot::from_array(a)
    }
}

/// The metrics of every shard of a server (cheap to clone).
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    shards: Vec<Arc<ShardMetrics>>,
    limits: Option<Arc<LimitCounters>>,
    stages: Option<Arc<crate::runtime::StageCounters>>,
    transports: Vec<(&'static str, Arc<TcpCounters>)>,
}

impl Metrics {
    /// Metrics for `shards` shards, all zero.
    pub fn new(shards: usize) -> Metrics {
        Metrics {
            shards: (0..shards)
                .map(|shard| Arc::new(ShardMetrics::new(shard)))
                .collect(),
            limits: None,
            stages: None,
            transports: Vec::new(),
        }
    }

    /// Also reports the server role's refusals and dropped uploads.
    pub(crate) fn with_limits(mut self, counters: Arc<LimitCounters>) -> Metrics {
        self.limits = Some(counters);
        self
    }

    /// The server role's refusals and dropped uploads, if reported.
    pub fn limits(&self) -> Option<&LimitCounters> {
        self.limits.as_deref()
    }

    /// Also reports a TCP or WebSocket listener's counters under `transport="name"`.
    pub(crate) fn with_transport(
        mut self,
        name: &'static str,
        counters: Arc<TcpCounters>,
    ) -> Metrics {
        self.transports.push((name, counters));
        self
    }

    /// Also reports the receiver stages' counters (single-socket mode).
    pub(crate) fn with_stages(mut self, stages: Arc<crate::runtime::StageCounters>) -> Metrics {
        self.stages = Some(stages);
        self
    }

    /// The per-shard slots, in shard order.
    pub fn shards(&self) -> &[Arc<ShardMetrics>] {
        &self.shards
    }

    /// Every shard's last published values, in shard order.
    pub fn snapshot(&self) -> Vec<ShardSnapshot> {
        self.shards.iter().map(|s| s.snapshot()).collect()
    }

    /// The sum over all shards.
    pub fn total(&self) -> ShardSnapshot {
        ShardSnapshot::sum(&self.snapshot())
    }

    /// The Prometheus text exposition of every shard's values (and, in single-socket
    /// mode, of the datagrams the receiver stage refused because a worker was full).
    pub fn render_prometheus(&self) -> String {
        let mut out = render_prometheus(&self.snapshot());
        if let Some(stages) = &self.stages {
            let n = stages.overload.load(std::sync::atomic::Ordering::Relaxed);
            let _ = writeln!(
                out,
                "# HELP cobalt_stage_overload_total Datagrams refused by the receiver stage because a worker queue was full (CON requests answered 5.03).\n# TYPE cobalt_stage_overload_total counter\ncobalt_stage_overload_total {n}"
            );
        }
        if let Some(l) = &self.limits {
            render_limits(&mut out, l);
        }
        render_transports(&mut out, &self.transports);
        out
    }
}

/// What a TCP or WebSocket listener has seen, for the metrics exporter.
#[derive(Debug, Default)]
pub struct TcpCounters {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connections refused because `max_connections` were open.
    pub refused: AtomicU64,
    /// Connections refused because their address held `max_connections_per_ip`
    /// connections or `max_handshakes_per_ip` handshakes.
    pub refused_per_ip: AtomicU64,
    /// Connections open now (a gauge).
    pub open: AtomicU64,
    /// Connections aborted by this side for a protocol error (bad or missing CSM,
    /// oversized frame, malformed message).
    pub protocol_errors: AtomicU64,
    /// Connections closed because the TLS handshake, the CSM or a frame took too long,
    /// or the peer answered no keep-alive Ping (slow, silent or vanished peers).
    pub timeouts: AtomicU64,
    /// Connections released for being idle.
    pub idle_closed: AtomicU64,
    /// TLS handshakes that failed (wrong key, untrusted certificate, not TLS) and
    /// WebSocket upgrades refused or abandoned.
    pub handshake_failures: AtomicU64,
    /// Observe relations held on the listener's connections now (a gauge).
    pub observers: Arc<AtomicU64>,
}

/// The server role's refusals and dropped uploads.
fn render_limits(out: &mut String, l: &LimitCounters) {
    let v = |c: &AtomicU64| c.load(Relaxed);
    let refusals = [
        (
            "cobalt_observe_refused_total",
            "Observe registrations refused: 4.29 (reason=\"peer\": the address holds max_observers_per_ip) or 5.03 (reason=\"server\": near max_observers).",
            v(&l.observe_refused_peer),
            v(&l.observe_refused_server),
        ),
        (
            "cobalt_upload_refused_total",
            "Uploads or blocks refused: 4.29 (reason=\"peer\": the address or port holds its share) or 5.03 (reason=\"server\": near a shard's or listener's bound).",
            v(&l.upload_refused_peer),
            v(&l.upload_refused_server),
        ),
    ];
    for (name, help, peer, server) in refusals {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{reason=\"peer\"}} {peer}\n{name}{{reason=\"server\"}} {server}"
        );
    }
    for (name, help, value) in [
        (
            "cobalt_uploads_expired_total",
            "Uploads dropped after upload_idle_timeout without a block.",
            v(&l.uploads_expired),
        ),
        (
            "cobalt_uploads_evicted_total",
            "Uploads dropped at a bound to make room for an address holding less.",
            v(&l.uploads_evicted),
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
        );
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

/// One series of a family: an optional extra label and where its value comes from.
type Series = (
    Option<(&'static str, &'static str)>,
    fn(&ShardSnapshot) -> u64,
);

/// A metric: name, help, type, an optional extra label and where its value comes from.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    series: &'static [Series],
}

/// Every metric exposed, in output order (the README lists them).
const FAMILIES: &[Family] = &[
    Family {
        name: "cobalt_requests_total",
        help: "Requests received and handed to a handler (duplicates and rejected requests excluded).",
        kind: Kind::Counter,
        series: &[(None, |s| s.requests)],
    },
    Family {
        name: "cobalt_responses_total",
        help: "Responses and notifications sent, by code class.",
        kind: Kind::Counter,
        series: &[
            (Some(("class", "2xx")), |s| s.responses_2xx),
            (Some(("class", "4xx")), |s| s.responses_4xx),
            (Some(("class", "5xx")), |s| s.responses_5xx),
        ],
    },
    Family {
        name: "cobalt_retransmissions_total",
        help: "Confirmable messages retransmitted for lack of an ACK.",
        kind: Kind::Counter,
        series: &[(None, |s| s.retransmissions)],
    },
    Family {
        name: "cobalt_duplicates_total",
        help: "Duplicate messages recognised by deduplication (answered from the stored reply or dropped).",
        kind: Kind::Counter,
        series: &[(None, |s| s.duplicates)],
    },
    Family {
        name: "cobalt_format_errors_total",
        help: "Undecodable datagrams (dropped; confirmable ones are answered with RST).",
        kind: Kind::Counter,
        series: &[(None, |s| s.format_errors)],
    },
    Family {
        name: "cobalt_unmatched_total",
        help: "ACKs, RSTs and responses that matched no exchange (dropped).",
        kind: Kind::Counter,
        series: &[(None, |s| s.unmatched)],
    },
    Family {
        name: "cobalt_bad_options_total",
        help: "Requests answered 4.02 Bad Option (unrecognized critical option).",
        kind: Kind::Counter,
        series: &[(None, |s| s.bad_options)],
    },
    Family {
        name: "cobalt_overload_rejections_total",
        help: "Requests answered 5.03 Service Unavailable because the total bound on requests in progress was reached (only addresses with requests in progress are refused).",
        kind: Kind::Counter,
        series: &[(None, |s| s.overload_rejections)],
    },
    Family {
        name: "cobalt_busy_rejections_total",
        help: "Requests answered 4.29 Too Many Requests because their peer (IP and port) or IP address had too many requests in progress.",
        kind: Kind::Counter,
        series: &[(None, |s| s.busy_rejections)],
    },
    Family {
        name: "cobalt_resets_sent_total",
        help: "RST messages sent.",
        kind: Kind::Counter,
        series: &[(None, |s| s.resets_sent)],
    },
    Family {
        name: "cobalt_datagrams_received_total",
        help: "UDP datagrams received.",
        kind: Kind::Counter,
        series: &[(None, |s| s.datagrams_in)],
    },
    Family {
        name: "cobalt_datagrams_sent_total",
        help: "UDP datagrams sent.",
        kind: Kind::Counter,
        series: &[(None, |s| s.datagrams_out)],
    },
    Family {
        name: "cobalt_dedup_entries",
        help: "Deduplication entries held (including requests in progress).",
        kind: Kind::Gauge,
        series: &[(None, |s| s.dedup_entries)],
    },
    Family {
        name: "cobalt_dedup_bytes",
        help: "Bytes held by the deduplication store (bounded by endpoint.max_dedup_bytes).",
        kind: Kind::Gauge,
        series: &[(None, |s| s.dedup_bytes)],
    },
    Family {
        name: "cobalt_dedup_evictions_total",
        help: "Deduplication entries dropped before EXCHANGE_LIFETIME: from a peer's full window or at the byte bound.",
        kind: Kind::Counter,
        series: &[(None, |s| s.dedup_evictions)],
    },
    Family {
        name: "cobalt_address_validation_total",
        help: "Address validation against amplification (RFC 9175 §2.4): answers held back, pings sent, addresses verified, verifications failed, answers withheld.",
        kind: Kind::Counter,
        series: &[
            (Some(("event", "parked")), |s| s.parked),
            (Some(("event", "ping")), |s| s.probes_sent),
            (Some(("event", "verified")), |s| s.addresses_verified),
            (Some(("event", "failed")), |s| s.probes_failed),
            (Some(("event", "withheld")), |s| s.unverified),
        ],
    },
    Family {
        name: "cobalt_address_probes",
        help: "Address verifications in progress.",
        kind: Kind::Gauge,
        series: &[(None, |s| s.address_probes)],
    },
    Family {
        name: "cobalt_verified_peers",
        help: "Verified addresses remembered.",
        kind: Kind::Gauge,
        series: &[(None, |s| s.verified_peers)],
    },
    Family {
        name: "cobalt_server_exchanges",
        help: "Requests being handled (received and not yet answered).",
        kind: Kind::Gauge,
        series: &[(None, |s| s.server_exchanges)],
    },
    Family {
        name: "cobalt_observers",
        help: "Observe relations (RFC 7641) registered.",
        kind: Kind::Gauge,
        series: &[(None, |s| s.observers)],
    },
    Family {
        name: "cobalt_peers",
        help: "Peers with per-peer state (message ID counter, NSTART queue).",
        kind: Kind::Gauge,
        series: &[(None, |s| s.peers)],
    },
    Family {
        name: "cobalt_notify_productions_total",
        help: "GET handler runs that produced notifications (one run serves every observer that registered the same request, unless the handler reads the peer).",
        kind: Kind::Counter,
        series: &[(None, |s| s.notify_productions)],
    },
    Family {
        name: "cobalt_notify_deferred_total",
        help: "Notifications held back while the observer's confirmable one was unacknowledged or its pacing interval ran, then sent with the state current then.",
        kind: Kind::Counter,
        series: &[(None, |s| s.notify_deferred)],
    },
    Family {
        name: "cobalt_notify_backlog",
        help: "Observers queued for a notification (worked off observe_batch per turn of the shard's loop).",
        kind: Kind::Gauge,
        series: &[(None, |s| s.notify_backlog)],
    },
    Family {
        name: "cobalt_uploads",
        help: "Block1 uploads in progress.",
        kind: Kind::Gauge,
        series: &[(None, |s| s.uploads)],
    },
    Family {
        name: "cobalt_upload_bytes",
        help: "Bytes held by uploads in progress and by answers kept for their Block2 follow-ups.",
        kind: Kind::Gauge,
        series: &[(None, |s| s.upload_bytes)],
    },
    Family {
        name: "cobalt_dtls_hello_verify_sent_total",
        help: "DTLS HelloVerifyRequests sent: cookie exchanges started, no state kept.",
        kind: Kind::Counter,
        series: &[(None, |s| s.dtls_hello_verify_sent)],
    },
    Family {
        name: "cobalt_dtls_handshakes_total",
        help: "DTLS handshakes completed.",
        kind: Kind::Counter,
        series: &[(None, |s| s.dtls_handshakes)],
    },
    Family {
        name: "cobalt_dtls_handshake_failures_total",
        help: "DTLS handshakes that failed or timed out (wrong key, untrusted certificate).",
        kind: Kind::Counter,
        series: &[(None, |s| s.dtls_handshake_failures)],
    },
    Family {
        name: "cobalt_dtls_evicted_total",
        help: "DTLS sessions evicted to stay within the session cap.",
        kind: Kind::Counter,
        series: &[(None, |s| s.dtls_evicted)],
    },
    Family {
        name: "cobalt_dtls_dropped_total",
        help: "DTLS records dropped: no session, failed decryption or garbage.",
        kind: Kind::Counter,
        series: &[(None, |s| s.dtls_dropped)],
    },
    Family {
        name: "cobalt_dtls_handshakes_displaced_total",
        help: "DTLS handshakes in progress dropped to stay within max_handshakes / max_handshakes_per_ip, or replaced by a new ClientHello from the same address.",
        kind: Kind::Counter,
        series: &[(None, |s| s.dtls_handshakes_displaced)],
    },
    Family {
        name: "cobalt_dtls_refused_total",
        help: "New DTLS sessions refused because the session table was full of active sessions.",
        kind: Kind::Counter,
        series: &[(None, |s| s.dtls_refused)],
    },
    Family {
        name: "cobalt_dtls_sessions",
        help: "Established DTLS sessions.",
        kind: Kind::Gauge,
        series: &[(None, |s| s.dtls_sessions)],
    },
    Family {
        name: "cobalt_dtls_handshakes_in_progress",
        help: "DTLS handshakes in progress (after the cookie exchange).",
        kind: Kind::Gauge,
        series: &[(None, |s| s.dtls_handshaking)],
    },
];

/// Renders snapshots (index = shard number) in the Prometheus text format 0.0.4.
pub fn render_prometheus(shards: &[ShardSnapshot]) -> String {
    let mut out = String::with_capacity(256 + FAMILIES.len() * shards.len() * 48);
    for f in FAMILIES {
        let kind = match f.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(out, "# TYPE {} {kind}", f.name);
        for (label, value) in f.series {
            for (i, s) in shards.iter().enumerate() {
                let _ = match label {
                    Some((k, v)) => {
                        writeln!(out, "{}{{shard=\"{i}\",{k}=\"{v}\"}} {}", f.name, value(s))
                    }
                    None => writeln!(out, "{}{{shard=\"{i}\"}} {}", f.name, value(s)),
                };
            }
        }
    }
    out
}

type Connections = (
    &'static str,
    &'static str,
    fn(&TcpCounters) -> &std::sync::atomic::AtomicU64,
);

/// The connection counters of the TCP and WebSocket listeners.
fn render_transports(out: &mut String, transports: &[(&'static str, Arc<TcpCounters>)]) {
    if transports.is_empty() {
        return;
    }
    const FAMILIES: &[Connections] = &[
        ("cobalt_connections_accepted_total", "Connections accepted.", |c| &c.accepted),
        ("cobalt_connections_refused_total", "Connections refused: max_connections were open.", |c| &c.refused),
        ("cobalt_connections_refused_per_ip_total", "Connections refused because their source address held max_connections_per_ip connections or max_handshakes_per_ip handshakes.", |c| &c.refused_per_ip),
        ("cobalt_connections_protocol_errors_total", "Connections aborted for a protocol error (bad or missing CSM, oversized frame, malformed message).", |c| &c.protocol_errors),
        ("cobalt_connections_timeouts_total", "Connections closed because the TLS handshake, the CSM or a frame took too long, or a keep-alive Ping went unanswered (silent, slow or vanished peers).", |c| &c.timeouts),
        ("cobalt_connections_idle_closed_total", "Connections released for being idle.", |c| &c.idle_closed),
        ("cobalt_connections_handshake_failures_total", "TLS handshakes that failed (wrong key, untrusted certificate, not TLS) and WebSocket upgrades refused or abandoned.", |c| &c.handshake_failures),
    ];
    for (name, help, field) in FAMILIES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (transport, c) in transports {
            let v = field(c).load(std::sync::atomic::Ordering::Relaxed);
            let _ = writeln!(out, "{name}{{transport=\"{transport}\"}} {v}");
        }
    }
    let name = "cobalt_connections_open";
    let _ = writeln!(
        out,
        "# HELP {name} Connections open on a TCP, TLS or WebSocket listener.\n# TYPE {name} gauge"
    );
    for (transport, c) in transports {
        let v = c.open.load(std::sync::atomic::Ordering::Relaxed);
        let _ = writeln!(out, "{name}{{transport=\"{transport}\"}} {v}");
    }
    let name = "cobalt_connection_observers";
    let _ = writeln!(
        out,
        "# HELP {name} Observe relations held on the connections of a TCP, TLS or WebSocket listener.\n# TYPE {name} gauge"
    );
    for (transport, c) in transports {
        let v = c.observers.load(std::sync::atomic::Ordering::Relaxed);
        let _ = writeln!(out, "{name}{{transport=\"{transport}\"}} {v}");
    }
}

/// Largest HTTP request accepted by the metrics endpoint.
const MAX_REQUEST: usize = 8 * 1024;
/// Time a client has to send its request and read the answer.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// A running metrics HTTP endpoint; stops when dropped.
#[derive(Debug)]
pub struct MetricsServer {
    local_addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsServer {
    /// The bound address (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `GET /metrics` (Prometheus text format) on `addr` over HTTP/1.1, one request
/// per connection. Must be called within a tokio runtime; the listener runs as a task
/// on it until the returned [`MetricsServer`] is dropped.
pub async fn serve_metrics(addr: SocketAddr, metrics: Metrics) -> io::Result<MetricsServer> {
    let listener = TcpListener::bind(addr).await?;
    let local_addr = listener.local_addr()?;
    tracing::info!(%local_addr, "metrics endpoint listening (GET /metrics)");
    let task = tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let metrics = metrics.clone();
                    tokio::spawn(async move {
                        let answered =
                            tokio::time::timeout(HTTP_TIMEOUT, answer(stream, &metrics)).await;
                        match answered {
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, error = %e, "metrics request failed")
                            }
                            Err(_) => tracing::debug!(%peer, "metrics request timed out"),
                            Ok(Ok(())) => {}
                        }
                    });
                }
                Err(e) => {
                    tracing::debug!(error = %e, "metrics endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(MetricsServer { local_addr, task })
}

/// Reads one request, writes one response, closes.
async fn answer(mut stream: TcpStream, metrics: &Metrics) -> io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let head_end = loop {
        if let Some(end) = find_head_end(&buf) {
            break Some(end);
        }
        if buf.len() >= MAX_REQUEST {
            break None;
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            if buf.is_empty() {
                return Ok(());
            }
            break Some(buf.len());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let (status, content_type, body, head_only) = match head_end {
        None => (
            "431 Request Header Fields Too Large",
            "text/plain; charset=utf-8",
            "request larger than 8 KiB\n".to_string(),
            false,
        ),
        Some(end) => route(&buf[..end], metrics),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n",
        body.len(),
        if status.starts_with("405") {
            "Allow: GET, HEAD\r\n"
        } else {
            ""
        },
    );
    stream.write_all(response.as_bytes()).await?;
    if !head_only {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await?;
    // Read what the client may still send (bounded), so that closing with unread
    // data does not reset the connection before the client has read the answer.
    let mut drained = 0;
    while drained < 64 * 1024 {
        match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => drained += n,
            _ => break,
        }
    }
    Ok(())
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

/// Status, content type, body, and whether only the head is sent (HEAD).
fn route(head: &[u8], metrics: &Metrics) -> (&'static str, &'static str, String, bool) {
    const TEXT: &str = "text/plain; charset=utf-8";
    let bad = || ("400 Bad Request", TEXT, "bad request\n".to_string(), false);
    let Ok(head) = std::str::from_utf8(head) else {
        return bad();
    };
    let line = head.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return bad();
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return bad();
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => {
            return (
                "405 Method Not Allowed",
                TEXT,
                "only GET and HEAD\n".into(),
                false,
            )
        }
    };
    let path = target.split('?').next().unwrap_or(target);
    if path != "/metrics" {
        return (
            "404 Not Found",
            TEXT,
            "not found; metrics are at /metrics\n".into(),
            head_only,
        );
    }
    (
        "200 OK",
        "text/plain; version=0.0.4; charset=utf-8",
        metrics.render_prometheus(),
        head_only,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<ShardSnapshot> {
        vec![
            ShardSnapshot {
                requests: 123,
                responses_2xx: 120,
                responses_4xx: 2,
                responses_5xx: 1,
                dedup_entries: 7,
                ..Default::default()
            },
            ShardSnapshot {
                requests: 5,
                observers: 3,
                ..Default::default()
            },
        ]
    }

    #[test]
    fn renders_the_prometheus_text_format() {
        let text = render_prometheus(&sample());
        assert!(text
            .starts_with("# HELP cobalt_requests_total Requests received and handed to a handler"));
        assert!(text.contains("# TYPE cobalt_requests_total counter\n"));
        assert!(text.contains("cobalt_requests_total{shard=\"0\"} 123\n"));
        assert!(text.contains("cobalt_requests_total{shard=\"1\"} 5\n"));
        assert!(text.contains("cobalt_responses_total{shard=\"0\",class=\"2xx\"} 120\n"));
        assert!(text.contains("cobalt_responses_total{shard=\"0\",class=\"4xx\"} 2\n"));
        assert!(text.contains("cobalt_responses_total{shard=\"0\",class=\"5xx\"} 1\n"));
        assert!(text.contains("# TYPE cobalt_dedup_entries gauge\n"));
        assert!(text.contains("cobalt_dedup_entries{shard=\"0\"} 7\n"));
        assert!(text.contains("cobalt_observers{shard=\"1\"} 3\n"));
        // Every line is a comment or `name{labels} value`, and each family is
        // introduced once by HELP and TYPE.
        for line in text.lines() {
            if line.starts_with('#') {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            value.parse::<u64>().unwrap();
            assert!(
                series.starts_with("cobalt_") && series.ends_with('}'),
                "{line}"
            );
        }
        for f in FAMILIES {
            assert_eq!(text.matches(&format!("# TYPE {} ", f.name)).count(), 1);
            assert_eq!(text.matches(&format!("# HELP {} ", f.name)).count(), 1);
            if f.kind == Kind::Counter {
                assert!(f.name.ends_with("_total"), "{}", f.name);
            }
        }
    }

    #[test]
    fn publish_and_snapshot_round_trip() {
        let m = Metrics::new(2);
        let s = sample();
        m.shards()[0].publish(s[0]);
        m.shards()[1].publish(s[1]);
        assert_eq!(m.snapshot(), s);
        assert_eq!(m.total().requests, 128);
        assert_eq!(m.total().observers, 3);
        let stats = Stats {
            requests: 4,
            responses_4xx: 1,
            ..Default::default()
        };
        let counts = StateCounts {
            dedup_entries: 9,
            ..Default::default()
        };
        let snap = ShardSnapshot::from_endpoint(&stats, counts, 2);
        assert_eq!(
            (
                snap.requests,
                snap.responses_4xx,
                snap.dedup_entries,
                snap.observers
            ),
            (4, 1, 9, 2)
        );
    }

    async fn http(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request).await.unwrap();
        s.shutdown().await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn http_endpoint_answers_get_metrics_and_refuses_the_rest() {
        let m = Metrics::new(1);
        m.shards()[0].publish(sample()[0]);
        let server = serve_metrics("127.0.0.1:0".parse().unwrap(), m)
            .await
            .unwrap();
        let addr = server.local_addr();
        let ok = http(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            ok.contains("Content-Type: text/plain; version=0.0.4"),
            "{ok}"
        );
        assert!(ok.contains("Connection: close"), "{ok}");
        assert!(
            ok.contains("cobalt_requests_total{shard=\"0\"} 123\n"),
            "{ok}"
        );
        let (head, body) = ok.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {}", body.len())));

        let head = http(addr, b"HEAD /metrics HTTP/1.0\r\n\r\n").await;
        assert!(
            head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        let nf = http(addr, b"GET / HTTP/1.1\r\n\r\n").await;
        assert!(nf.starts_with("HTTP/1.1 404 Not Found\r\n"), "{nf}");
        let bad = http(addr, b"hello\r\n\r\n").await;
        assert!(bad.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{bad}");
        let post = http(addr, b"POST /metrics HTTP/1.1\r\n\r\n").await;
        assert!(
            post.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
            "{post}"
        );
        assert!(post.contains("Allow: GET, HEAD\r\n"), "{post}");
        let big = vec![b'a'; 9000];
        let too_big = http(addr, &big).await;
        assert!(too_big.starts_with("HTTP/1.1 431 "), "{too_big}");
    }
}

//! Per-shard metrics and their Prometheus text exposition.
//!
//! Each shard publishes a snapshot of its endpoint's counters ([`Stats`]) and state
//! sizes ([`StateCounts`]) into its [`ShardMetrics`] when a reader asks for it and
//! about once a second besides: relaxed atomic stores, no lock. A shard's turns cost
//! nothing for metrics; a reader ([`Metrics::snapshot`], [`Metrics::total`],
//! [`Metrics::render_prometheus`]) asks every running shard to publish and waits for
//! it, bounded, so that it sees every answer already sent. [`serve_metrics`] answers
//! `GET /metrics` over HTTP/1.1 in the Prometheus text format:
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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A metric's value as a struct holds it: a number (snapshots) or an atomic (live
/// counters).
trait Value {
    fn get(&self) -> u64;
    fn set(&mut self, v: u64);
}

impl Value for u64 {
    fn get(&self) -> u64 {
        *self
    }
    fn set(&mut self, v: u64) {
        *self = v;
    }
}

impl Value for AtomicU64 {
    fn get(&self) -> u64 {
        self.load(Relaxed)
    }
    fn set(&mut self, v: u64) {
        *self.get_mut() = v;
    }
}

impl Value for Arc<AtomicU64> {
    fn get(&self) -> u64 {
        self.load(Relaxed)
    }
    fn set(&mut self, v: u64) {
        self.store(v, Relaxed);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

/// One series of a family: its labels and where its value comes from.
type Series<T> = (&'static [(&'static str, &'static str)], fn(&T) -> u64);

/// A metric family read from a `T`: name, help, type and series.
struct Family<T: 'static> {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    series: &'static [Series<T>],
}

/// Declares a struct of metric values and its metric families in one table: each
/// line is a family (`Counter` or `Gauge`, name, help) with its series, a field each
/// (of the struct's value type unless one is given) with its labels. The struct gets
/// `FAMILIES`, `FIELDS`, `values` and `from_values`.
macro_rules! metric_values {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident($ty:ty) {
            $( $kind:ident $metric:literal $help:literal {
                $( $field:ident $(($lk:literal = $lv:literal))? $(: $fty:ty)? ),+ $(,)?
            } )*
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( $(
                #[doc = concat!("`", $metric, $("{", $lk, "=\"", $lv, "\"}",)? "`: ", $help)]
                pub $field: metric_values!(@type $ty $(, $fty)?),
            )+ )*
        }

        impl $name {
            /// Every metric family read from it, in output order.
            const FAMILIES: &'static [Family<$name>] = &[$(
                Family {
                    name: $metric,
                    help: $help,
                    kind: Kind::$kind,
                    series: &[$( (&[$(($lk, $lv))?], |s: &$name| Value::get(&s.$field)) ),+],
                },
            )*];

            /// How many values it holds.
            pub const FIELDS: usize = [$($(stringify!($field)),+),*].len();

            /// Every value, in output order.
            pub fn values(&self) -> [u64; $name::FIELDS] {
                [$($(Value::get(&self.$field)),+),*]
            }

            /// The values of [`values`](Self::values), back in their fields.
            pub fn from_values(values: [u64; $name::FIELDS]) -> $name {
                let mut s = $name::default();
                let mut values = values.into_iter();
                $($( Value::set(&mut s.$field, values.next().unwrap_or(0)); )+)*
                s
            }
        }
    };
    (@type $ty:ty) => { $ty };
    (@type $ty:ty, $fty:ty) => { $fty };
}

metric_values! {
    /// The values of one shard at one moment.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct ShardSnapshot(u64) {
        Counter "cobalt_requests_total" "Requests received and handed to a handler (duplicates and rejected requests excluded)." { requests }
        Counter "cobalt_responses_total" "Responses and notifications sent, by code class." { responses_2xx ("class" = "2xx"), responses_4xx ("class" = "4xx"), responses_5xx ("class" = "5xx") }
        Counter "cobalt_retransmissions_total" "Confirmable messages retransmitted for lack of an ACK." { retransmissions }
        Counter "cobalt_duplicates_total" "Duplicate messages recognised by deduplication (answered from the stored reply or dropped)." { duplicates }
        Counter "cobalt_format_errors_total" "Undecodable datagrams (dropped; confirmable ones are answered with RST)." { format_errors }
        Counter "cobalt_unmatched_total" "ACKs, RSTs and responses that matched no exchange (dropped)." { unmatched }
        Counter "cobalt_bad_options_total" "Requests answered 4.02 Bad Option (unrecognized critical option)." { bad_options }
        Counter "cobalt_long_tokens_total" "Requests answered 4.00 Bad Request because their token is longer than endpoint.max_token_len (RFC 8974)." { long_tokens }
        Counter "cobalt_overload_rejections_total" "Requests answered 5.03 Service Unavailable because the total bound on requests in progress was reached (only addresses with requests in progress are refused)." { overload_rejections }
        Counter "cobalt_busy_rejections_total" "Requests answered 4.29 Too Many Requests because their peer (IP and port) or IP address had too many requests in progress." { busy_rejections }
        Counter "cobalt_resets_sent_total" "RST messages sent." { resets_sent }
        Counter "cobalt_datagrams_received_total" "UDP datagrams received." { datagrams_in }
        Counter "cobalt_datagrams_sent_total" "UDP datagrams sent." { datagrams_out }
        Gauge "cobalt_dedup_entries" "Deduplication entries held (including requests in progress)." { dedup_entries }
        Gauge "cobalt_dedup_bytes" "Bytes held by the deduplication store (bounded by endpoint.max_dedup_bytes)." { dedup_bytes }
        Counter "cobalt_dedup_evictions_total" "Deduplication entries dropped before EXCHANGE_LIFETIME: from a peer's full window or at the byte bound." { dedup_evictions }
        Counter "cobalt_address_validation_total" "Address validation against amplification (RFC 9175 §2.4): answers held back, pings sent, addresses verified, verifications failed, answers withheld." { parked ("event" = "parked"), probes_sent ("event" = "ping"), addresses_verified ("event" = "verified"), probes_failed ("event" = "failed"), unverified ("event" = "withheld") }
        Gauge "cobalt_address_probes" "Address verifications in progress." { address_probes }
        Gauge "cobalt_verified_peers" "Verified addresses remembered." { verified_peers }
        Gauge "cobalt_server_exchanges" "Requests being handled (received and not yet answered)." { server_exchanges }
        Gauge "cobalt_observers" "Observe relations (RFC 7641) registered." { observers }
        Gauge "cobalt_peers" "Peers with per-peer state (message ID counter, NSTART queue)." { peers }
        Counter "cobalt_notify_productions_total" "GET handler runs that produced notifications (one run serves every observer that registered the same request, unless the handler reads the peer)." { notify_productions }
        Counter "cobalt_notify_deferred_total" "Notifications held back while the observer's confirmable one was unacknowledged or its pacing interval ran, then sent with the state current then." { notify_deferred }
        Gauge "cobalt_notify_backlog" "Observers queued for a notification (worked off observe_batch per turn of the shard's loop)." { notify_backlog }
        Gauge "cobalt_uploads" "Block1 uploads in progress." { uploads }
        Gauge "cobalt_upload_bytes" "Bytes held by uploads in progress and by answers kept for their Block2 follow-ups." { upload_bytes }
        Counter "cobalt_dtls_hello_verify_sent_total" "DTLS HelloVerifyRequests sent: cookie exchanges started, no state kept." { dtls_hello_verify_sent }
        Counter "cobalt_dtls_handshakes_total" "DTLS handshakes completed." { dtls_handshakes }
        Counter "cobalt_dtls_handshake_failures_total" "DTLS handshakes that failed or timed out (wrong key, untrusted certificate)." { dtls_handshake_failures }
        Counter "cobalt_dtls_evicted_total" "DTLS sessions ended to make room (max_sessions, max_sessions_per_ip) or for being silent (idle_timeout, unused_timeout); the peer handshakes again." { dtls_evicted }
        Counter "cobalt_dtls_dropped_total" "DTLS records dropped: no session, failed decryption or garbage." { dtls_dropped }
        Counter "cobalt_dtls_handshakes_displaced_total" "DTLS handshakes in progress dropped to stay within max_handshakes / max_handshakes_per_ip, or replaced by a new ClientHello from the same address." { dtls_handshakes_displaced }
        Counter "cobalt_dtls_refused_total" "New DTLS sessions refused because the session table was full of active sessions." { dtls_refused }
        Gauge "cobalt_dtls_sessions" "Established DTLS sessions." { dtls_sessions }
        Gauge "cobalt_dtls_handshakes_in_progress" "DTLS handshakes in progress (after the cookie exchange)." { dtls_handshaking }
        Counter "cobalt_dtls_address_updates_total" "DTLS sessions moved to a new client address by an authentic, newer record with a Connection ID (RFC 9146; Mbed TLS backend)." { dtls_address_updates }
        Counter "cobalt_dtls_address_updates_refused_total" "Records with a known DTLS Connection ID from another address that did not move their session: forged, replayed or older than the newest." { dtls_address_updates_refused }
    }
}

metric_values! {
    /// Counters of the receiver and sender stages (single-socket mode).
    #[derive(Debug, Default)]
    pub struct StageCounters(AtomicU64) {
        Counter "cobalt_stage_overload_total" "Datagrams refused by the receiver stage because a worker queue was full (CON requests answered 5.03)." { overload }
    }
}

metric_values! {
    /// Refusals and dropped state of the server role over a whole server (every shard
    /// and listener): the bounds of `[limits]` at work.
    #[derive(Debug, Default)]
    pub struct LimitCounters(AtomicU64) {
        Counter "cobalt_observe_refused_total" "Observe registrations refused: 4.29 (reason=\"peer\": the address holds max_observers_per_ip) or 5.03 (reason=\"server\": near max_observers)." { observe_refused_peer ("reason" = "peer"), observe_refused_server ("reason" = "server") }
        Counter "cobalt_upload_refused_total" "Uploads or blocks refused: 4.29 (reason=\"peer\": the address or port holds its share) or 5.03 (reason=\"server\": near a shard's or listener's bound)." { upload_refused_peer ("reason" = "peer"), upload_refused_server ("reason" = "server") }
        Counter "cobalt_uploads_expired_total" "Uploads dropped after upload_idle_timeout without a block." { uploads_expired }
        Counter "cobalt_uploads_evicted_total" "Uploads dropped at a bound to make room for an address holding less." { uploads_evicted }
    }
}

metric_values! {
    /// What a TCP or WebSocket listener has seen, for the metrics exporter.
    #[derive(Debug, Default)]
    pub struct TcpCounters(AtomicU64) {
        Counter "cobalt_connections_accepted_total" "Connections accepted." { accepted }
        Counter "cobalt_connections_refused_total" "Connections refused: max_connections were open." { refused }
        Counter "cobalt_connections_evicted_total" "Connections evicted (Abort, then closed) to make room for a connection from another address when max_connections were open: the idlest of the address holding the most." { evicted }
        Counter "cobalt_connections_refused_per_ip_total" "Connections refused because their source address held max_connections_per_ip connections or max_handshakes_per_ip handshakes." { refused_per_ip }
        Counter "cobalt_connections_protocol_errors_total" "Connections aborted for a protocol error (bad or missing CSM, oversized frame, malformed message)." { protocol_errors }
        Counter "cobalt_connections_timeouts_total" "Connections closed because the TLS handshake, the CSM or a frame took too long, or a keep-alive Ping went unanswered (silent, slow or vanished peers)." { timeouts }
        Counter "cobalt_connections_idle_closed_total" "Connections released for being idle." { idle_closed }
        Counter "cobalt_connections_handshake_failures_total" "TLS handshakes that failed (wrong key, untrusted certificate, not TLS) and WebSocket upgrades refused or abandoned." { handshake_failures }
        Gauge "cobalt_connections_open" "Connections open on a TCP, TLS or WebSocket listener." { open }
        Gauge "cobalt_connection_observers" "Observe relations held on the connections of a TCP, TLS or WebSocket listener." { observers: Arc<AtomicU64> }
    }
}

/// Writes `families` in the Prometheus text format, each series once per source: a
/// `T` and the value of the label `source` names (`shard="0"`), if any.
fn render<T>(
    out: &mut String,
    families: &[Family<T>],
    source: Option<&str>,
    values: &[(String, &T)],
) {
    for f in families {
        let kind = match f.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(out, "# TYPE {} {kind}", f.name);
        for (labels, value) in f.series {
            for (label, v) in values {
                out.push_str(f.name);
                let source = source.map(|s| (s, label.as_str()));
                for (i, (k, v)) in source.iter().chain(labels.iter()).enumerate() {
                    let _ = write!(out, "{}{k}=\"{v}\"", if i == 0 { '{' } else { ',' });
                }
                if source.is_some() || !labels.is_empty() {
                    out.push('}');
                }
                let _ = writeln!(out, " {}", value(v));
            }
        }
    }
}

/// How long a reader waits for the shards it asked to publish (see
/// [`Metrics::snapshot`]): a shard answers within its current turn, microseconds to a
/// few milliseconds; one held up longer (a handler blocking its thread) is read as it
/// last published.
const PUBLISH_WAIT: Duration = Duration::from_secs(1);

/// How a reader reaches a running shard: the runtime links each shard's
/// [`ShardMetrics`] to it when the shard starts.
pub(crate) trait ShardLink: Send + Sync {
    /// Asks the shard to publish its values soon; false when it has stopped.
    fn ask(&self) -> bool;
    /// Whether the shard can answer the calling thread: it still runs (it publishes
    /// once more when it stops) and the caller is not a shard (which would stall while it waits).
    fn can_answer(&self) -> bool;
}

/// One shard's published values: written by the shard, read by anyone.
pub struct ShardMetrics {
    shard: usize,
    values: [AtomicU64; ShardSnapshot::FIELDS],
    /// The running shard, once linked; readers of a slot without one (values published
    /// by hand) take the values as they are.
    link: OnceLock<Box<dyn ShardLink>>,
    /// How many times readers asked for values at least as new as their question.
    asked: AtomicU64,
    /// A request to publish is on its way to the shard: readers asking meanwhile need
    /// not send another (at most one per shard is queued, however many readers ask).
    request_queued: AtomicBool,
    /// The last count of `asked` that the published values answer.
    answered: Mutex<u64>,
    /// Signalled when `answered` grows.
    answered_grew: Condvar,
}

impl std::fmt::Debug for ShardMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardMetrics")
            .field("shard", &self.shard)
            .field("values", &self.snapshot())
            .field("linked", &self.link.get().is_some())
            .finish_non_exhaustive()
    }
}

impl ShardMetrics {
    /// All zero, for shard number `shard`.
    fn new(shard: usize) -> ShardMetrics {
        ShardMetrics {
            shard,
            values: std::array::from_fn(|_| AtomicU64::new(0)),
            link: OnceLock::new(),
            asked: AtomicU64::new(0),
            request_queued: AtomicBool::new(false),
            answered: Mutex::new(0),
            answered_grew: Condvar::new(),
        }
    }

    /// Links the slot to the shard that publishes into it (once; later links are
    /// ignored).
    pub(crate) fn link(&self, shard: Box<dyn ShardLink>) {
        let _ = self.link.set(shard);
    }

    /// The shard's side: publishes the values `current` reads, answering every reader
    /// that asked before. The question count is read before the values, so that the
    /// values are at least as new as every question they answer.
    pub(crate) fn publish_current(&self, current: impl FnOnce() -> ShardSnapshot) {
        self.request_queued.store(false, SeqCst);
        let asked = self.asked.load(SeqCst);
        self.publish(current());
        let mut answered = self.answered.lock().unwrap_or_else(|e| e.into_inner());
        if asked > *answered {
            *answered = asked;
            self.answered_grew.notify_all();
        }
    }

    /// Asks the linked shard, if it runs, to publish; returns the question's number
    /// to wait for with [`ShardMetrics::wait_answered`].
    fn ask(&self) -> Option<u64> {
        let link = self.link.get().filter(|l| l.can_answer())?;
        let question = self.asked.fetch_add(1, SeqCst) + 1;
        if !self.request_queued.swap(true, SeqCst) && !link.ask() {
            self.request_queued.store(false, SeqCst);
            return None;
        }
        Some(question)
    }

    /// Waits until the shard has answered `question`, it has stopped, or `deadline`.
    fn wait_answered(&self, question: u64, deadline: Instant) {
        let mut answered = self.answered.lock().unwrap_or_else(|e| e.into_inner());
        while *answered < question {
            let left = deadline.saturating_duration_since(Instant::now());
            let can_answer = self.link.get().is_some_and(|l| l.can_answer());
            if left.is_zero() || !can_answer {
                return;
            }
            // In slices, so that a shard that stops without answering is noticed.
            let slice = left.min(Duration::from_millis(10));
            answered = match self.answered_grew.wait_timeout(answered, slice) {
                Ok((guard, _)) => guard,
                Err(e) => e.into_inner().0,
            };
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
            long_tokens: stats.long_tokens,
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
        self.dtls_address_updates = d.address_updates;
        self.dtls_address_updates_refused = d.address_updates_refused;
        self
    }

    /// Field-wise sum (counters and gauges over all shards).
    pub fn sum<'a>(snapshots: impl IntoIterator<Item = &'a ShardSnapshot>) -> ShardSnapshot {
        let mut total = [0u64; ShardSnapshot::FIELDS];
        for s in snapshots {
            for (t, v) in total.iter_mut().zip(s.values()) {
                *t += v;
            }
        }
        ShardSnapshot::from_values(total)
    }
}

impl ShardMetrics {
    /// Publishes the shard's current values (relaxed stores), and logs at debug level
    /// the malformed datagrams and rejected requests since the last call.
    pub fn publish(&self, snapshot: ShardSnapshot) {
        let shard = self.shard;
        let old = self.snapshot();
        for (slot, v) in self.values.iter().zip(snapshot.values()) {
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
        let mut a = [0u64; ShardSnapshot::FIELDS];
        for (v, slot) in a.iter_mut().zip(&self.values) {
            *v = slot.load(Relaxed);
        }
        ShardSnapshot::from_values(a)
    }
}

/// Whether a process is ready to serve, as the metrics endpoint answers `GET /ready`
/// for a balancer's or an orchestrator's readiness check: ready unless a part that must
/// work said why not (e.g. a resource directory that lost its shared store). Clones
/// share one state.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<std::sync::Mutex<Option<String>>>);

impl Readiness {
    /// Marks it ready.
    pub fn set_ready(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Marks it not ready, saying why (what `GET /ready` answers with its 503).
    pub fn set_unready(&self, why: impl Into<String>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.into());
    }

    /// Why it is not ready; `None` when it is.
    pub fn why_not(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The metrics of every shard of a server (cheap to clone), and its [`Readiness`].
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    shards: Vec<Arc<ShardMetrics>>,
    readiness: Readiness,
    limits: Option<Arc<LimitCounters>>,
    stages: Option<Arc<StageCounters>>,
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
            readiness: Readiness::default(),
        }
    }

    /// The server's readiness, shared by every copy of these metrics: what the
    /// metrics endpoint answers at `/ready`.
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
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
    pub(crate) fn with_stages(mut self, stages: Arc<StageCounters>) -> Metrics {
        self.stages = Some(stages);
        self
    }

    /// The per-shard slots, in shard order.
    pub fn shards(&self) -> &[Arc<ShardMetrics>] {
        &self.shards
    }

    /// Every shard's current values, in shard order: each running shard is asked to
    /// publish, and is waited for (up to a second; a shard held up longer is read as it
    /// last published), so that every answer a shard sent before the call is counted.
    /// Blocks the calling thread meanwhile (microseconds to milliseconds). Called on a
    /// shard's thread (from a handler), it does not wait: it reads what the shards last
    /// published (at most about a second old).
    pub fn snapshot(&self) -> Vec<ShardSnapshot> {
        let questions: Vec<Option<u64>> = self.shards.iter().map(|s| s.ask()).collect();
        let deadline = Instant::now() + PUBLISH_WAIT;
        for (shard, question) in self.shards.iter().zip(questions) {
            if let Some(question) = question {
                shard.wait_answered(question, deadline);
            }
        }
        self.shards.iter().map(|s| s.snapshot()).collect()
    }

    /// The sum over all shards (of a [`snapshot`](Self::snapshot)).
    pub fn total(&self) -> ShardSnapshot {
        ShardSnapshot::sum(&self.snapshot())
    }

    /// The Prometheus text exposition of every shard's current values (asked for and
    /// waited for as by [`snapshot`](Self::snapshot)) and, in single-socket mode, of
    /// the datagrams the receiver stage refused because a worker was full.
    pub fn render_prometheus(&self) -> String {
        let mut out = render_prometheus(&self.snapshot());
        if let Some(stages) = &self.stages {
            let one = [(String::new(), &**stages)];
            render(&mut out, StageCounters::FAMILIES, None, &one);
        }
        if let Some(limits) = &self.limits {
            let one = [(String::new(), &**limits)];
            render(&mut out, LimitCounters::FAMILIES, None, &one);
        }
        if !self.transports.is_empty() {
            let transports: Vec<(String, &TcpCounters)> = self
                .transports
                .iter()
                .map(|(name, c)| (name.to_string(), &**c))
                .collect();
            render(
                &mut out,
                TcpCounters::FAMILIES,
                Some("transport"),
                &transports,
            );
        }
        out
    }
}

/// Renders snapshots (index = shard number) in the Prometheus text format 0.0.4.
pub fn render_prometheus(shards: &[ShardSnapshot]) -> String {
    let mut out = String::with_capacity(256 + ShardSnapshot::FIELDS * (shards.len() * 48 + 128));
    let shards: Vec<(String, &ShardSnapshot)> = shards
        .iter()
        .enumerate()
        .map(|(i, s)| (i.to_string(), s))
        .collect();
    render(&mut out, ShardSnapshot::FAMILIES, Some("shard"), &shards);
    out
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

/// Serves `GET /metrics` (Prometheus text format) and `GET /ready` (200, or 503 with
/// the reason from [`Metrics::readiness`]) on `addr` over HTTP/1.1, one request per
/// connection. Must be called within a tokio runtime; the listener runs as a task
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
        Some(end) => {
            // Off the runtime's thread: reading the metrics waits for the shards.
            let (head, metrics) = (buf[..end].to_vec(), metrics.clone());
            tokio::task::spawn_blocking(move || route(&head, &metrics))
                .await
                .map_err(io::Error::other)?
        }
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
    if path == "/ready" {
        return match metrics.readiness.why_not() {
            None => ("200 OK", TEXT, "ready\n".into(), head_only),
            Some(why) => (
                "503 Service Unavailable",
                TEXT,
                format!("not ready: {why}\n"),
                head_only,
            ),
        };
    }
    if path != "/metrics" {
        return (
            "404 Not Found",
            TEXT,
            "not found; metrics are at /metrics, readiness at /ready\n".into(),
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
        for f in ShardSnapshot::FAMILIES {
            assert_eq!(text.matches(&format!("# TYPE {} ", f.name)).count(), 1);
            assert_eq!(text.matches(&format!("# HELP {} ", f.name)).count(), 1);
            if f.kind == Kind::Counter {
                assert!(f.name.ends_with("_total"), "{}", f.name);
            }
        }
    }

    #[test]
    fn every_family_is_named_once_and_every_counter_ends_in_total() {
        fn names<T>(families: &[Family<T>]) -> Vec<(&'static str, Kind, usize)> {
            families
                .iter()
                .map(|f| (f.name, f.kind, f.series.len()))
                .collect()
        }
        let mut all = names(ShardSnapshot::FAMILIES);
        all.extend(names(StageCounters::FAMILIES));
        all.extend(names(LimitCounters::FAMILIES));
        all.extend(names(TcpCounters::FAMILIES));
        let mut unique: Vec<_> = all.iter().map(|(n, _, _)| *n).collect();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), all.len());
        for (name, kind, _) in &all {
            assert!(name.starts_with("cobalt_"), "{name}");
            assert_eq!(name.ends_with("_total"), *kind == Kind::Counter, "{name}");
        }
        // Every field is one series.
        let series = |f: &[(&str, Kind, usize)]| f.iter().map(|x| x.2).sum::<usize>();
        assert_eq!(
            series(&names(ShardSnapshot::FAMILIES)),
            ShardSnapshot::FIELDS
        );
        assert_eq!(series(&names(TcpCounters::FAMILIES)), TcpCounters::FIELDS);
        assert_eq!(
            series(&names(LimitCounters::FAMILIES)),
            LimitCounters::FIELDS
        );
    }

    #[test]
    fn server_wide_counters_render_with_their_labels() {
        let limits = Arc::new(LimitCounters::default());
        limits.observe_refused_peer.store(5, Relaxed);
        limits.uploads_evicted.store(7, Relaxed);
        let tcp = Arc::new(TcpCounters::default());
        tcp.open.store(2, Relaxed);
        tcp.observers.store(9, Relaxed);
        let stages = Arc::new(StageCounters::default());
        stages.overload.store(11, Relaxed);
        let text = Metrics::new(1).render_prometheus();
        assert!(!text.contains("transport=") && !text.contains("reason="));
        let text = Metrics::new(1)
            .with_limits(limits)
            .with_transport("tcp", tcp)
            .with_transport("ws", Arc::default())
            .with_stages(stages)
            .render_prometheus();
        for line in [
            "# TYPE cobalt_stage_overload_total counter\ncobalt_stage_overload_total 11\n",
            "cobalt_observe_refused_total{reason=\"peer\"} 5\ncobalt_observe_refused_total{reason=\"server\"} 0\n",
            "# TYPE cobalt_uploads_evicted_total counter\ncobalt_uploads_evicted_total 7\n",
            "# TYPE cobalt_connections_open gauge\ncobalt_connections_open{transport=\"tcp\"} 2\ncobalt_connections_open{transport=\"ws\"} 0\n",
            "cobalt_connection_observers{transport=\"tcp\"} 9\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        let s = sample()[0];
        assert_eq!(ShardSnapshot::from_values(s.values()), s);
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

    /// A shard on a thread of its own that counts requests and publishes when asked.
    struct FakeShard {
        asks: std::sync::mpsc::Sender<()>,
        stopped: Arc<AtomicBool>,
    }

    impl ShardLink for FakeShard {
        fn ask(&self) -> bool {
            self.asks.send(()).is_ok()
        }
        fn can_answer(&self) -> bool {
            !self.stopped.load(SeqCst)
        }
    }

    #[test]
    fn a_reader_sees_the_values_of_the_moment_it_asks() {
        let m = Metrics::new(1);
        let slot = m.shards()[0].clone();
        let (asks, asked) = std::sync::mpsc::channel();
        let stopped = Arc::new(AtomicBool::new(false));
        slot.link(Box::new(FakeShard {
            asks,
            stopped: stopped.clone(),
        }));
        // The shard has handled 7 requests and published none of them.
        let handled = Arc::new(AtomicU64::new(7));
        let shard = {
            let (slot, handled, stopped) = (slot.clone(), handled.clone(), stopped.clone());
            std::thread::spawn(move || {
                while asked.recv().is_ok() {
                    let requests = handled.load(SeqCst);
                    slot.publish_current(|| ShardSnapshot {
                        requests,
                        ..Default::default()
                    });
                    if requests == 9 {
                        stopped.store(true, SeqCst);
                        return;
                    }
                }
            })
        };
        assert_eq!(slot.snapshot().requests, 0, "nothing published yet");
        assert_eq!(m.total().requests, 7);
        handled.store(9, SeqCst);
        assert_eq!(
            m.render_prometheus().lines().nth(2),
            Some("cobalt_requests_total{shard=\"0\"} 9")
        );
        shard.join().unwrap();
        // A stopped shard is read as it last published, without asking or waiting.
        handled.store(11, SeqCst);
        assert_eq!(m.total().requests, 9);
        assert!(!slot.request_queued.load(SeqCst));
    }

    #[test]
    fn readers_queue_one_request_per_shard_however_many_ask() {
        let m = Metrics::new(1);
        let slot = &m.shards()[0];
        let (asks, asked) = std::sync::mpsc::channel();
        slot.link(Box::new(FakeShard {
            asks,
            stopped: Arc::default(),
        }));
        let questions: Vec<_> = (0..3).map(|_| slot.ask().unwrap()).collect();
        assert_eq!(questions, [1, 2, 3]);
        assert_eq!(asked.try_iter().count(), 1, "one request on its way");
        // One publication answers every question asked before it.
        slot.publish_current(|| ShardSnapshot {
            requests: 4,
            ..Default::default()
        });
        slot.wait_answered(3, Instant::now());
        assert_eq!(*slot.answered.lock().unwrap(), 3);
        assert_eq!(slot.ask(), Some(4));
        assert_eq!(asked.try_iter().count(), 1, "a new request once answered");
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

    #[tokio::test]
    async fn ready_answers_what_the_readiness_says() {
        let m = Metrics::new(1);
        let readiness = m.readiness().clone();
        let server = serve_metrics("127.0.0.1:0".parse().unwrap(), m)
            .await
            .unwrap();
        let addr = server.local_addr();
        let ready = http(addr, b"GET /ready HTTP/1.1\r\n\r\n").await;
        assert!(
            ready.starts_with("HTTP/1.1 200 OK\r\n") && ready.ends_with("ready\n"),
            "{ready}"
        );
        readiness.set_unready("lost the store");
        let not = http(addr, b"GET /ready HTTP/1.1\r\n\r\n").await;
        assert!(
            not.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{not}"
        );
        assert!(not.ends_with("not ready: lost the store\n"), "{not}");
        readiness.set_ready();
        let again = http(addr, b"HEAD /ready HTTP/1.1\r\n\r\n").await;
        assert!(again.starts_with("HTTP/1.1 200 OK\r\n"), "{again}");
    }
}

//! The legitimate clients that run beside the attacker: GET loops on one client, GET
//! loops with a new client per request, and observers. Each counts what it got during
//! the flood and after it: only 2.xx answers are successes; other codes and errors are
//! counted by name.

use crate::Args;
use cobalt::transport::credentials::X509Credentials;
use cobalt::{Client, Error};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Which part of the run a result belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Before the flood (not reported: the clients set up).
    Warmup = 0,
    /// While the attacker runs.
    Flood = 1,
    /// After the flood, while the server settles.
    After = 2,
}

type Tally = BTreeMap<String, u64>;

/// Makes a new client with the run's credentials.
type MakeClient = Arc<dyn Fn() -> Client + Send + Sync>;

/// One legitimate client's results.
struct Loop {
    kind: &'static str,
    uri: String,
    ready: AtomicBool,
    phases: Mutex<[Tally; 3]>,
    /// The first message of each kind of error, to tell what went wrong.
    first_errors: Mutex<BTreeMap<String, String>>,
}

impl Loop {
    /// Counts an error under its kind, keeping the first message of that kind.
    fn error(&self, phase: u8, prefix: &str, e: &Error) {
        let name = format!("{prefix}{}", error_name(e));
        self.first_errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.clone())
            .or_insert_with(|| e.to_string());
        self.add(phase, &name);
    }

    fn add(&self, phase: u8, what: &str) {
        let mut p = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        *p[usize::from(phase.min(2))]
            .entry(what.to_string())
            .or_default() += 1;
    }
}

/// The running legitimate clients.
pub struct Legit {
    loops: Vec<Arc<Loop>>,
    phase: Arc<AtomicU8>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Starts every legitimate client of `args`.
pub async fn start(args: &Args) -> Legit {
    let phase = Arc::new(AtomicU8::new(Phase::Warmup as u8));
    let stop = Arc::new(AtomicBool::new(false));
    let psk = match (&args.psk_identity, &args.psk_key) {
        (Some(id), Some(key)) => {
            let key = cobalt::transport::credentials::parse_key(key).unwrap_or_else(|e| {
                eprintln!("flood: --psk-key: {e}");
                std::process::exit(2)
            });
            Some((id.as_bytes().to_vec(), key))
        }
        _ => None,
    };
    let ca_pem = args.ca_pem();
    // A new client shares nothing with another: socket, DTLS session, connection.
    let make: MakeClient = Arc::new(move || match (&ca_pem, &psk) {
        (Some(ca), _) => Client::new().with_x509(X509Credentials {
            ca_pem: Some(ca.clone()),
            ..X509Credentials::default()
        }),
        (None, Some((id, key))) => Client::new().with_psk(id.clone(), key.clone()),
        (None, None) => Client::new(),
    });
    let mut legit = Legit {
        loops: Vec::new(),
        phase,
        stop,
        tasks: Vec::new(),
    };
    let timeout = Duration::from_secs_f64(args.legit_timeout);
    let interval = Duration::from_secs_f64(1.0 / args.legit_rate.max(0.01));
    let kinds = [
        ("get", &args.legit),
        ("get-new-client", &args.legit_fresh),
        ("upload", &args.legit_upload),
        ("observe", &args.legit_observe),
    ];
    for (kind, uris) in kinds {
        for uri in uris {
            let l = Arc::new(Loop {
                kind,
                uri: uri.clone(),
                ready: AtomicBool::new(false),
                phases: Default::default(),
                first_errors: Default::default(),
            });
            let (phase, stop, make) = (legit.phase.clone(), legit.stop.clone(), make.clone());
            let task = {
                let l = l.clone();
                tokio::spawn(async move {
                    match kind {
                        "observe" => observe_loop(&l, &make(), &phase, &stop).await,
                        _ => {
                            let how = match kind {
                                "get-new-client" => How::FreshGet,
                                "upload" => How::Upload,
                                _ => How::Get,
                            };
                            request_loop(&l, &make, how, timeout, interval, &phase, &stop).await
                        }
                    }
                })
            };
            legit.loops.push(l);
            legit.tasks.push(task);
        }
    }
    legit
}

impl Legit {
    /// Waits until every client has been served once (or `limit` passes).
    pub async fn wait_ready(&self, limit: Duration) {
        let until = Instant::now() + limit;
        while Instant::now() < until && !self.loops.iter().all(|l| l.ready.load(Ordering::Relaxed))
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for l in self
            .loops
            .iter()
            .filter(|l| !l.ready.load(Ordering::Relaxed))
        {
            eprintln!(
                "flood: legitimate {} {} not served before the flood",
                l.kind, l.uri
            );
        }
    }

    /// Results from now on count for `phase`.
    pub fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Relaxed);
    }

    /// Stops the clients and reports their results.
    pub async fn finish(self) -> Value {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            // A request in progress may take up to its timeout.
            let _ = tokio::time::timeout(Duration::from_secs(1), t).await;
        }
        let report: Vec<Value> = self
            .loops
            .iter()
            .map(|l| {
                let p = l.phases.lock().unwrap_or_else(|e| e.into_inner());
                json!({
                    "kind": l.kind,
                    "uri": l.uri,
                    "flood": rates(&p[Phase::Flood as usize]),
                    "after": rates(&p[Phase::After as usize]),
                    "first_errors": *l.first_errors.lock().unwrap_or_else(|e| e.into_inner()),
                })
            })
            .collect();
        Value::Array(report)
    }
}

/// The tally with the success ratio of the requests sent.
fn rates(t: &Tally) -> Value {
    let mut v = serde_json::to_value(t).unwrap_or(Value::Null);
    if let (Some(sent), Value::Object(m)) = (t.get("sent"), &mut v) {
        let ok = t.get("2.xx").copied().unwrap_or(0);
        let ratio = if *sent == 0 {
            0.0
        } else {
            ok as f64 / *sent as f64
        };
        m.insert("success_ratio".into(), json!(ratio));
    }
    v
}

/// The name an error is counted under.
fn error_name(e: &Error) -> String {
    let name = match e {
        Error::Timeout { .. } | Error::Deadline(_) => "timeout",
        Error::Reset(_) => "reset",
        Error::Connection(_) => "connection failed",
        Error::Dtls { .. } => "DTLS handshake failed",
        Error::Tls { .. } => "TLS handshake failed",
        Error::TooManyRequests => "too many requests (client side)",
        Error::Io(_) => "I/O error",
        _ => "other error",
    };
    format!("error: {name}")
}

/// What a request loop sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    /// GETs on one client.
    Get,
    /// GETs, each on a new client.
    FreshGet,
    /// PUTs of [`UPLOAD_SIZE`] bytes on one client.
    Upload,
}

/// Body size of a legitimate upload: three 1 KiB blocks.
const UPLOAD_SIZE: usize = 3 * 1024;

#[allow(clippy::too_many_arguments)]
async fn request_loop(
    l: &Loop,
    make: &MakeClient,
    how: How,
    timeout: Duration,
    interval: Duration,
    phase: &AtomicU8,
    stop: &AtomicBool,
) {
    let mut next = Instant::now();
    let mut client = make();
    while !stop.load(Ordering::Relaxed) {
        if how == How::FreshGet {
            client = make();
        }
        let p = phase.load(Ordering::Relaxed);
        l.add(p, "sent");
        let request = match how {
            How::Upload => client
                .request(cobalt::Code::PUT, &l.uri)
                .payload(vec![b'u'; UPLOAD_SIZE]),
            How::Get | How::FreshGet => client.request(cobalt::Code::GET, &l.uri),
        };
        let r = request.timeout(timeout).send().await;
        match r {
            Ok(resp) if resp.code.class() == 2 => {
                l.add(p, "2.xx");
                l.ready.store(true, Ordering::Relaxed);
            }
            Ok(resp) => l.add(p, &format!("answer {}", resp.code)),
            Err(e) => l.error(p, "", &e),
        }
        next += interval;
        let now = Instant::now();
        if next > now {
            tokio::time::sleep(next - now).await;
        } else {
            next = now;
        }
    }
}

async fn observe_loop(l: &Loop, client: &Client, phase: &AtomicU8, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let p = phase.load(Ordering::Relaxed);
        l.add(p, "registrations");
        let mut obs = match client.observe(&l.uri).await {
            Ok(o) => o,
            Err(e) => {
                l.error(p, "registration ", &e);
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        loop {
            let item = tokio::select! {
                item = obs.next() => item,
                _ = async {
                    while !stop.load(Ordering::Relaxed) {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                } => return,
            };
            let p = phase.load(Ordering::Relaxed);
            match item {
                Some(Ok(n)) if n.code.class() == 2 => {
                    l.add(p, "notifications");
                    l.ready.store(true, Ordering::Relaxed);
                }
                Some(Ok(n)) => l.add(p, &format!("notification {}", n.code)),
                Some(Err(e)) => {
                    l.error(p, "observation ended, ", &e);
                    break;
                }
                None => {
                    l.add(p, "observation ended by the server");
                    break;
                }
            }
        }
    }
}

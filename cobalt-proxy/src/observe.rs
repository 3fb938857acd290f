//! Upstream observations shared by every downstream observer of the same resource:
//! one relation with the origin per target (and cache key), whose notifications
//! reach the CoAP front's observers through the server's own fan-out (an
//! [`Observable`] changed for the observers of that target) and the HTTP front's
//! event streams through a watch channel.
//!
//! An upstream observation ends when the origin ends it or fails (its observers get
//! the error as a last notification: 5.02, 5.04, or the origin's code), and when
//! nobody downstream listens any more: no event stream, and no CoAP observer was sent
//! the last three notifications (or the front has no observers at all).

use crate::cache::CacheKey;
use crate::core::{strip_hop_by_hop, Proxy, ProxyError, Upstream};
use cobalt::proto::message::{opt, Code};
use cobalt::server::Observable;
use cobalt::{Observation, Response};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// How often an upstream observation checks that someone still listens.
const LIVENESS_CHECK: Duration = Duration::from_secs(10);
/// Notifications in a row that no CoAP observer was sent before the observation ends.
const UNSERVED_LIMIT: u32 = 3;
/// How long an observation that failed keeps answering with its failure (so that the
/// fan-out to its observers gets the error rather than opening a new one).
const FAILED_GRACE: Duration = Duration::from_secs(5);

/// One upstream observation and who listens to it.
pub(crate) struct Shared {
    /// The latest answer (`None` until the first).
    latest: watch::Sender<Option<Response>>,
    /// Addresses of the CoAP observers of this target (bounded; beyond the bound every
    /// observer of the front is told of each change).
    peers: Arc<Mutex<HashSet<SocketAddr>>>,
    overflow: AtomicBool,
    /// The CoAP front's observable, once a CoAP observer joined.
    observable: Mutex<Option<Observable>>,
    /// Whether a CoAP observer was sent the latest notification.
    served: AtomicBool,
    unserved: AtomicU32,
}

impl Shared {
    /// A receiver of the latest answer and every later one.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<Response>> {
        self.latest.subscribe()
    }

    /// The latest answer, for a CoAP observer (marks the observation as listened to).
    pub(crate) fn latest_for_coap(&self) -> Option<Response> {
        self.served.store(true, Relaxed);
        self.latest.borrow().clone()
    }

    fn add_peer(&self, peer: SocketAddr, observable: &Observable, bound: usize) {
        let mut slot = self.observable.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert_with(|| observable.clone());
        drop(slot);
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if peers.len() < bound {
            peers.insert(peer);
        } else if !peers.contains(&peer) {
            self.overflow.store(true, Relaxed);
        }
    }

    /// Makes `response` the latest answer and tells every listener.
    fn publish(&self, response: Response) {
        self.latest.send_replace(Some(response));
        let observable = self
            .observable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(observable) = observable {
            if self.overflow.load(Relaxed) {
                observable.changed();
            } else {
                let peers = self.peers.clone();
                observable.changed_for(move |p| {
                    peers.lock().unwrap_or_else(|e| e.into_inner()).contains(&p)
                });
            }
        }
    }

    /// Whether anybody may still listen: an event stream (or a waiting request), or
    /// CoAP observers that were sent one of the last notifications.
    fn listened(&self) -> bool {
        if self.latest.receiver_count() > 0 {
            return true;
        }
        let observable = self
            .observable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match observable {
            Some(o) if o.observer_count() > 0 => self.unserved.load(Relaxed) < UNSERVED_LIMIT,
            _ => false,
        }
    }
}

/// The upstream observations of one proxy, by cache key.
#[derive(Default)]
pub(crate) struct Observations {
    open: Mutex<HashMap<CacheKey, Arc<Shared>>>,
}

impl Observations {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CacheKey, Arc<Shared>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Upstream observations open now.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn remove(&self, key: &CacheKey, shared: &Arc<Shared>) {
        let mut open = self.lock();
        if open.get(key).is_some_and(|s| Arc::ptr_eq(s, shared)) {
            open.remove(key);
        }
    }
}

impl Proxy {
    /// Joins the upstream observation of `up`'s target, opening it if none is open:
    /// `coap` is a CoAP observer (its address and the front's observable) to notify.
    /// Returns at once; the first answer arrives on [`Shared::subscribe`].
    pub(crate) fn join(
        &self,
        up: Upstream,
        coap: Option<(SocketAddr, &Observable)>,
    ) -> Result<Arc<Shared>, ProxyError> {
        let key = CacheKey::new(Code::GET, &up.target, &up.options, &[]);
        let config = &self.shared.config;
        let shared = {
            let mut open = self.shared.observations.lock();
            if let Some(shared) = open.get(&key) {
                shared.clone()
            } else {
                if open.len() >= config.max_observations {
                    return Err(ProxyError::Busy("upstream observations"));
                }
                let shared = Arc::new(Shared {
                    latest: watch::channel(None).0,
                    peers: Arc::default(),
                    overflow: AtomicBool::new(false),
                    observable: Mutex::new(None),
                    served: AtomicBool::new(false),
                    unserved: AtomicU32::new(0),
                });
                open.insert(key.clone(), shared.clone());
                tokio::spawn(run(self.clone(), key, shared.clone(), up));
                shared
            }
        };
        if let Some((peer, observable)) = coap {
            shared.add_peer(peer, observable, config.max_observers_per_observation);
        }
        Ok(shared)
    }
}

/// Runs one upstream observation until it ends, then takes it out of the table.
async fn run(proxy: Proxy, key: CacheKey, shared: Arc<Shared>, up: Upstream) {
    let metrics = &proxy.shared.metrics;
    metrics.upstream_observations.fetch_add(1, Relaxed);
    let failure = match open(&proxy, &up).await {
        Err(e) => Some(e.to_response()),
        Ok(observation) => pump(&proxy, &key, &shared, &up, observation).await,
    };
    if let Some(failure) = failure {
        shared.publish(failure);
        tokio::time::sleep(FAILED_GRACE).await;
    }
    proxy.shared.observations.remove(&key, &shared);
    metrics.upstream_observations.fetch_sub(1, Relaxed);
}

async fn open(proxy: &Proxy, up: &Upstream) -> Result<Observation, ProxyError> {
    let (to, name) = proxy.admit(&up.target, up.reverse).await?;
    proxy
        .request(up, &to, name.as_deref())
        .observe()
        .await
        .map_err(|e| proxy.upstream_error(&up.target, &e))
}

/// Publishes the origin's notifications until the observation ends: the failure to
/// tell the observers, or `None` when it ended because nobody listens (or the origin
/// answered without observing, which was published as is).
async fn pump(
    proxy: &Proxy,
    key: &CacheKey,
    shared: &Shared,
    up: &Upstream,
    mut observation: Observation,
) -> Option<Response> {
    let timeout = proxy.shared.config.upstream_timeout;
    let first = match tokio::time::timeout(timeout, observation.next()).await {
        Err(_) => {
            return Some(
                proxy
                    .upstream_error(&up.target, &cobalt::Error::Deadline(timeout))
                    .to_response(),
            )
        }
        Ok(n) => n,
    };
    let mut next = first;
    loop {
        let mut response = match next {
            None => {
                return Some(
                    ProxyError::Unreachable(format!("{} ended the observation", up.target))
                        .to_response(),
                )
            }
            Some(Err(e)) => return Some(proxy.upstream_error(&up.target, &e).to_response()),
            Some(Ok(r)) => r,
        };
        let observing = response.options.contains(opt::OBSERVE);
        strip_hop_by_hop(&mut response);
        if !response.code.is_success() {
            return Some(response);
        }
        proxy.shared.cache.store(key.clone(), &response);
        if shared.served.swap(false, Relaxed) {
            shared.unserved.store(0, Relaxed);
        } else {
            shared.unserved.fetch_add(1, Relaxed);
        }
        shared.publish(response);
        if !observing {
            return None;
        }
        next = loop {
            tokio::select! {
                n = observation.next() => break n,
                () = tokio::time::sleep(LIVENESS_CHECK) => {
                    if !shared.listened() {
                        let _ = observation.cancel().await;
                        return None;
                    }
                }
            }
        };
        if !shared.listened() {
            let _ = observation.cancel().await;
            return None;
        }
    }
}

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
use crate::listeners::Shared;
use cobalt::proto::message::{opt, Code};
use cobalt::server::Observable;
use cobalt::{Observation, Response};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// How often an upstream observation checks that someone still listens.
const LIVENESS_CHECK: Duration = Duration::from_secs(10);
/// How long an observation that failed keeps answering with its failure (so that the
/// fan-out to its observers gets the error rather than opening a new one).
const FAILED_GRACE: Duration = Duration::from_secs(5);

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
                let shared = Arc::new(Shared::new());
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
        shared.count_served();
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

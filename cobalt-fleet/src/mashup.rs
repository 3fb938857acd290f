//! The mashup, a service in the client role: it finds devices by a resource lookup
//! at a resource directory (`rt=temperature`), observes each, and keeps an
//! [`Aggregate`] (count, mean, max) of their latest readings that it serves as an
//! observable resource of its own.
//!
//! - **Following.** [`Mashup::follow`] looks up again (all pages) and starts observing
//!   resources that appeared, stops observing those that vanished (de-registered or
//!   expired; their readings leave the aggregate at once), and restarts observations
//!   that ended (the device stopped answering). [`Mashup::run`] does that every
//!   [`MashupConfig::relookup_every`].
//! - **Bounds.** At most [`MashupConfig::max_observed`] observations at once. Resources
//!   found beyond that are not observed and are counted in
//!   [`Aggregate::unobserved`]; they are taken on, in lookup order, when observed
//!   ones vanish. Per observation the mashup keeps one latest value and the task
//!   that receives the notifications (which holds the mashup as one pointer); the
//!   client keeps the relation's state. A
//!   lookup answer is read a page ([`LOOKUP_PAGE`] links) at a time (or at once from a
//!   directory whose first page is empty: aiocoap-rd does not page).
//! - A notification that is not a number is ignored (the device keeps its last
//!   reading); an observation that ends (an error, or the device went away) drops
//!   its reading from the aggregate.

use cobalt::server::{get, MethodRouter, Observable};
use cobalt::{content_format, Client, Response};
use cobalt_rd::RdClientError;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::task::AbortHandle;

/// Links asked for per lookup request (`count`); the lookup pages through the rest.
pub const LOOKUP_PAGE: usize = 500;

/// What the mashup follows and how much it holds.
#[derive(Debug, Clone)]
pub struct MashupConfig {
    /// The directory: `coap://host[:port]` (its resource lookup interface is found by
    /// discovery).
    pub rd: String,
    /// The resource type looked up.
    pub resource_type: String,
    /// Most resources observed at once.
    pub max_observed: usize,
    /// Time between two lookups in [`Mashup::run`].
    pub relookup_every: Duration,
}

impl MashupConfig {
    /// Temperatures at the directory `rd`, at most 10,000 observed, looked up every 30 s.
    pub fn new(rd: &str) -> MashupConfig {
        MashupConfig {
            rd: rd.to_string(),
            resource_type: "temperature".into(),
            max_observed: 10_000,
            relookup_every: Duration::from_secs(30),
        }
    }
}

/// The aggregate over the latest reading of every observed resource.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Aggregate {
    /// Resources with a reading.
    pub count: usize,
    /// Mean of their readings (`None` without any).
    pub mean: Option<f64>,
    /// Highest reading (`None` without any).
    pub max: Option<f64>,
    /// Resources found by the lookup but not observed ([`MashupConfig::max_observed`]).
    pub unobserved: usize,
}

impl Aggregate {
    /// As JSON: `{"count":3,"mean":21.5,"max":23.1,"unobserved":0}` (`null` mean and
    /// max without readings).
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "count": self.count,
            "mean": self.mean.map(|m| (m * 100.0).round() / 100.0),
            "max": self.max,
            "unobserved": self.unobserved,
        })
        .to_string()
    }
}

/// The latest reading of each resource, with the sum and an ordered count of the
/// values so that the aggregate costs O(log n) per change, not O(n).
#[derive(Debug, Default)]
pub struct Readings {
    latest: HashMap<Arc<str>, f64>,
    sum: f64,
    /// How many readings have each value (by [`order_key`]), for the maximum.
    values: BTreeMap<i64, (f64, u32)>,
}

/// A key whose order is the numeric order of finite `f64`s.
fn order_key(v: f64) -> i64 {
    let bits = v.to_bits() as i64;
    bits ^ (((bits >> 63) as u64) >> 1) as i64
}

impl Readings {
    /// Records `value` as the latest of `resource`; true if the aggregate changed.
    pub fn set(&mut self, resource: &Arc<str>, value: f64) -> bool {
        if !value.is_finite() {
            return false;
        }
        match self.latest.insert(resource.clone(), value) {
            Some(old) if old == value => return false,
            Some(old) => self.forget_value(old),
            None => {}
        }
        self.sum += value;
        self.values.entry(order_key(value)).or_insert((value, 0)).1 += 1;
        true
    }

    /// Forgets the reading of `resource`; true if it had one.
    pub fn remove(&mut self, resource: &str) -> bool {
        match self.latest.remove(resource) {
            Some(old) => {
                self.forget_value(old);
                true
            }
            None => false,
        }
    }

    fn forget_value(&mut self, old: f64) {
        self.sum -= old;
        let key = order_key(old);
        if let Some(entry) = self.values.get_mut(&key) {
            entry.1 -= 1;
            if entry.1 == 0 {
                self.values.remove(&key);
            }
        }
        if self.latest.is_empty() {
            self.sum = 0.0; // no rounding residue left behind
        }
    }

    /// Count, mean and max of the readings (`unobserved` is left at 0).
    pub fn aggregate(&self) -> Aggregate {
        let count = self.latest.len();
        Aggregate {
            count,
            mean: (count > 0).then(|| self.sum / count as f64),
            max: self.values.last_key_value().map(|(_, (v, _))| *v),
            unobserved: 0,
        }
    }
}

/// What a lookup changes: resources to start observing and to stop observing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Found and not observed, within the bound, in lookup order.
    pub start: Vec<String>,
    /// Observed and no longer found.
    pub stop: Vec<String>,
    /// Found but beyond the bound.
    pub unobserved: usize,
}

/// The plan that takes the `observed` set to the resources `found`, observing at most
/// `max` (those observed already first, then newcomers in lookup order).
pub fn plan<'a>(observed: impl Iterator<Item = &'a str>, found: &[String], max: usize) -> Plan {
    let found_set: std::collections::HashSet<&str> = found.iter().map(String::as_str).collect();
    let observed: std::collections::HashSet<&str> = observed.collect();
    let stop: Vec<String> = observed
        .iter()
        .filter(|r| !found_set.contains(*r))
        .map(|r| r.to_string())
        .collect();
    let kept = observed.len() - stop.len();
    let room = max.saturating_sub(kept);
    let mut newcomers = found.iter().filter(|r| !observed.contains(r.as_str()));
    let start: Vec<String> = newcomers.by_ref().take(room).cloned().collect();
    Plan {
        start,
        stop,
        unobserved: newcomers.count(),
    }
}

#[derive(Debug, Default)]
struct State {
    readings: Readings,
    /// The observations running, by resource URI.
    observed: HashMap<Arc<str>, AbortHandle>,
    unobserved: usize,
}

impl State {
    fn aggregate(&self) -> Aggregate {
        Aggregate {
            unobserved: self.unobserved,
            ..self.readings.aggregate()
        }
    }
}

/// The mashup (see the [module docs](self)). Cheap to clone; clones share everything.
#[derive(Debug, Clone)]
pub struct Mashup {
    /// One pointer: every observation's task holds a clone.
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    client: Client,
    config: MashupConfig,
    state: Mutex<State>,
    changes: Observable,
    lookup_uri: Mutex<Option<String>>,
    notifications: AtomicU64,
}

impl Mashup {
    /// A mashup that uses `client` for its lookups and observations.
    pub fn new(client: Client, config: MashupConfig) -> Mashup {
        Mashup {
            shared: Arc::new(Shared {
                client,
                config,
                state: Mutex::default(),
                changes: Observable::new(),
                lookup_uri: Mutex::default(),
                notifications: AtomicU64::default(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every update is
        // one assignment after the checks), so a poisoned lock is used as is.
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The aggregate now.
    pub fn aggregate(&self) -> Aggregate {
        self.state().aggregate()
    }

    /// Notifications received so far (the registrations' answers included).
    pub fn notifications(&self) -> u64 {
        self.shared.notifications.load(Ordering::Relaxed)
    }

    /// Observations running now.
    pub fn observed(&self) -> usize {
        self.state().observed.len()
    }

    /// The `/aggregate` resource: GET answers the aggregate as JSON; observable, with a
    /// notification whenever it changes.
    pub fn resource(&self) -> MethodRouter {
        let me = self.clone();
        get(move || {
            let body = me.aggregate().to_json();
            async move { Response::content(body).with_content_format(content_format::JSON) }
        })
        .rt("aggregate")
        .observable(&self.shared.changes)
    }

    /// Looks up and follows what it finds (see the [module docs](self)).
    pub async fn follow(&self) -> Result<(), RdClientError> {
        let found = self.lookup().await?;
        self.follow_resources(&found);
        Ok(())
    }

    /// Follows `found` (resource URIs) as if a lookup had found them: for resources
    /// known without a directory, or more than a directory's lookup can list in time.
    pub fn follow_resources(&self, found: &[String]) {
        let plan = {
            let state = self.state();
            plan(
                state.observed.keys().map(|k| &**k),
                found,
                self.shared.config.max_observed,
            )
        };
        let mut changed = false;
        {
            let mut state = self.state();
            for gone in &plan.stop {
                if let Some(task) = state.observed.remove(gone.as_str()) {
                    task.abort();
                }
                changed |= state.readings.remove(gone);
            }
            changed |= state.unobserved != plan.unobserved;
            state.unobserved = plan.unobserved;
            for uri in plan.start {
                let uri: Arc<str> = uri.into();
                let task = tokio::spawn(self.clone().observe(uri.clone()));
                state.observed.insert(uri, task.abort_handle());
            }
        }
        if changed {
            self.shared.changes.changed();
        }
    }

    /// [`Mashup::follow`] every [`MashupConfig::relookup_every`], forever; a failed
    /// lookup is logged and tried again at the next turn.
    pub async fn run(self) {
        let mut tick = tokio::time::interval(self.shared.config.relookup_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = self.follow().await {
                tracing::warn!("looking up {} failed: {e}", self.shared.config.rd);
            }
        }
    }

    /// Every resource of the configured type, page by page.
    async fn lookup(&self) -> Result<Vec<String>, RdClientError> {
        let lookup_uri = match self.shared.lookup_uri.lock().ok().and_then(|u| u.clone()) {
            Some(u) => u,
            None => {
                let u = cobalt_rd::find_interface(
                    &self.shared.client,
                    &self.shared.config.rd,
                    "core.rd-lookup-res",
                )
                .await?;
                if let Ok(mut slot) = self.shared.lookup_uri.lock() {
                    *slot = Some(u.clone());
                }
                u
            }
        };
        let mut found = Vec::new();
        for page in 0.. {
            let page_str = page.to_string();
            let count = LOOKUP_PAGE.to_string();
            let links = cobalt_rd::lookup_at(
                &self.shared.client,
                &lookup_uri,
                &[
                    ("rt", &self.shared.config.resource_type),
                    ("page", &page_str),
                    ("count", &count),
                ],
            )
            .await?;
            let n = links.len();
            if n == 0 && page == 0 {
                // aiocoap-rd 0.4.17 answers nothing to `count`: ask without paging.
                let all = cobalt_rd::lookup_at(
                    &self.shared.client,
                    &lookup_uri,
                    &[("rt", &self.shared.config.resource_type)],
                )
                .await?;
                return Ok(all.into_iter().map(|l| l.target).collect());
            }
            found.extend(links.into_iter().map(|l| l.target));
            if n < LOOKUP_PAGE {
                break;
            }
        }
        Ok(found)
    }

    /// Observes one resource until it ends or the task is aborted; its reading
    /// leaves the aggregate when it ends.
    async fn observe(self, uri: Arc<str>) {
        // One task per observation, waiting in `next` nearly all the time: the
        // observation is boxed so that the task's state holds it once (a value moved
        // between the steps of an async function may take room in each).
        match self.shared.client.observe(&uri).await.map(Box::new) {
            Ok(mut observation) => {
                while let Some(Ok(n)) = observation.next().await {
                    self.shared.notifications.fetch_add(1, Ordering::Relaxed);
                    let Ok(value) = n.text_payload().trim().parse::<f64>() else {
                        continue;
                    };
                    if self.state().readings.set(&uri, value) {
                        self.shared.changes.changed();
                    }
                }
            }
            Err(e) => tracing::debug!("cannot observe {uri}: {e}"),
        }
        let removed = {
            let mut state = self.state();
            state.observed.remove(&uri);
            state.readings.remove(&uri)
        };
        if removed {
            self.shared.changes.changed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every observed resource has a task waiting in this future: its size is paid
    /// once per observation (1,080 bytes with the observation held in it, twice; 312
    /// with it boxed and the mashup one pointer, which makes a task of 512 bytes in a
    /// release build, down from 640 with a clone of every handle).
    #[tokio::test]
    async fn an_observing_task_holds_little() {
        let config = MashupConfig::new("coap://127.0.0.1:9");
        let mashup = Mashup::new(Client::new(), config);
        let task = mashup.observe("coap://127.0.0.1:9/t".into());
        assert!(
            std::mem::size_of_val(&task) <= 360,
            "{}",
            std::mem::size_of_val(&task)
        );
    }

    #[test]
    fn readings_aggregate_and_forget() {
        let mut r = Readings::default();
        let (a, b, c): (Arc<str>, Arc<str>, Arc<str>) = ("a".into(), "b".into(), "c".into());
        assert_eq!(r.aggregate(), Aggregate::default());
        assert!(r.set(&a, 20.0));
        assert!(r.set(&b, 24.0));
        assert!(r.set(&c, 24.0));
        assert!(!r.set(&c, 24.0), "same value: no change");
        assert!(!r.set(&c, f64::NAN), "not a number: ignored");
        let agg = r.aggregate();
        assert_eq!((agg.count, agg.max), (3, Some(24.0)));
        assert!((agg.mean.unwrap() - 68.0 / 3.0).abs() < 1e-9);
        assert!(r.remove("b"));
        assert_eq!(r.aggregate().max, Some(24.0), "c still has 24");
        assert!(r.set(&c, -5.5));
        assert_eq!(r.aggregate().max, Some(20.0));
        assert!(r.remove("a") && r.remove("c") && !r.remove("c"));
        assert_eq!(r.aggregate(), Aggregate::default());
    }

    #[test]
    fn order_keys_sort_like_the_numbers() {
        let mut v = [3.5, -1.0, 0.0, -20.25, 100.0, -0.5];
        v.sort_by_key(|x| order_key(*x));
        assert_eq!(v, [-20.25, -1.0, -0.5, 0.0, 3.5, 100.0]);
    }

    #[test]
    fn plans_follow_the_lookup_within_the_bound() {
        let found: Vec<String> = ["a", "b", "c", "d"].map(String::from).to_vec();
        let p = plan(["b", "x"].into_iter(), &found, 3);
        assert_eq!(p.stop, ["x"]);
        assert_eq!(p.start, ["a", "c"], "b kept, two more fit");
        assert_eq!(p.unobserved, 1);
        let p = plan(["a", "b", "c"].into_iter(), &found[..3], 3);
        assert_eq!(p, Plan::default(), "nothing changed");
        let p = plan(std::iter::empty(), &found, 0);
        assert_eq!((p.start.len(), p.unobserved), (0, 4));
    }

    #[test]
    fn the_aggregate_reads_as_json() {
        let a = Aggregate {
            count: 2,
            mean: Some(21.456),
            max: Some(23.0),
            unobserved: 1,
        };
        let v: serde_json::Value = serde_json::from_str(&a.to_json()).unwrap();
        assert_eq!(v["count"], 2);
        assert_eq!(v["mean"], 21.46);
        assert_eq!(v["max"], 23.0);
        assert_eq!(v["unobserved"], 1);
        let empty: serde_json::Value =
            serde_json::from_str(&Aggregate::default().to_json()).unwrap();
        assert!(empty["mean"].is_null());
    }
}

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
//!   ones vanish. Every observation is a member of one [`ObservationSet`], read by
//!   one task: per observation the mashup keeps its URI (one allocation, shared by
//!   the set's member), one entry in one table (the [`Readings`], which also say
//!   what is followed) and the member's relation, and no task or queue of its own.
//!   Both tables make room for what a lookup found at once, not by doubling. A
//!   lookup answer is read a page ([`LOOKUP_PAGE`] links) at a time (or at once from a
//!   directory whose first page is empty: aiocoap-rd does not page).
//! - A notification that is not a number is ignored (the device keeps its last
//!   reading); an observation that ends (an error, or the device went away) drops
//!   its reading from the aggregate.

use cobalt::server::{get, MethodRouter, Observable};
use cobalt::{content_format, Client, ObservationSet, Response};
use cobalt_rd::RdClientError;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
use tokio::sync::mpsc;

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

/// The resources followed and the latest reading of each, with the sum and an
/// ordered count of the values so that the aggregate costs O(log n) per change, not
/// O(n). One table for both: a mashup of many devices pays one entry per device.
#[derive(Debug, Default)]
pub struct Readings {
    /// Every followed resource's latest reading (NaN until it has one: readings
    /// are finite).
    latest: HashMap<Arc<str>, f64>,
    /// Resources with a reading.
    count: usize,
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
    /// Starts following `resource` (without a reading yet); false if it was followed.
    pub fn follow(&mut self, resource: Arc<str>) -> bool {
        match self.latest.entry(resource) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(f64::NAN);
                true
            }
        }
    }

    /// Makes room for `additional` more resources at once.
    pub fn reserve(&mut self, additional: usize) {
        self.latest.reserve(additional);
    }

    /// Resources followed.
    pub fn followed(&self) -> impl Iterator<Item = &Arc<str>> {
        self.latest.keys()
    }

    /// How many resources are followed.
    pub fn followed_count(&self) -> usize {
        self.latest.len()
    }

    /// Records `value` as the latest of `resource`, if it is followed; true if the
    /// aggregate changed.
    pub fn set(&mut self, resource: &str, value: f64) -> bool {
        if !value.is_finite() {
            return false;
        }
        let Some(latest) = self.latest.get_mut(resource) else {
            return false;
        };
        let old = std::mem::replace(latest, value);
        if old == value {
            return false;
        }
        if old.is_nan() {
            self.count += 1;
        } else {
            self.forget_value(old);
        }
        self.sum += value;
        self.values.entry(order_key(value)).or_insert((value, 0)).1 += 1;
        true
    }

    /// Stops following `resource`: its key and whether its reading left the
    /// aggregate (`None` if it was not followed).
    pub fn remove(&mut self, resource: &str) -> Option<(Arc<str>, bool)> {
        let (key, old) = self.latest.remove_entry(resource)?;
        if old.is_nan() {
            return Some((key, false));
        }
        self.count -= 1;
        self.forget_value(old);
        Some((key, true))
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
        if self.count == 0 {
            self.sum = 0.0; // no rounding residue left behind
        }
    }

    /// Count, mean and max of the readings (`unobserved` is left at 0).
    pub fn aggregate(&self) -> Aggregate {
        let count = self.count;
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
    /// The resources observed (or asked to be), by URI, and their readings.
    readings: Readings,
    unobserved: usize,
}

/// What the task that reads the observations is asked to do.
#[derive(Debug)]
enum Change {
    /// Observe this resource.
    Start(Arc<str>),
    /// Stop observing it.
    Stop(Arc<str>),
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
    /// The task that holds the observations, started on first use; it ends when
    /// the mashup is dropped.
    observer: Mutex<Option<mpsc::UnboundedSender<Vec<Change>>>>,
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
                observer: Mutex::default(),
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
        self.state().readings.followed_count()
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
                state.readings.followed().map(|k| &**k),
                found,
                self.shared.config.max_observed,
            )
        };
        let mut changed = false;
        let mut asked = Vec::with_capacity(plan.start.len() + plan.stop.len());
        {
            let mut state = self.state();
            for gone in &plan.stop {
                if let Some((uri, had_reading)) = state.readings.remove(gone) {
                    asked.push(Change::Stop(uri));
                    changed |= had_reading;
                }
            }
            changed |= state.unobserved != plan.unobserved;
            state.unobserved = plan.unobserved;
            state.readings.reserve(plan.start.len());
            for uri in plan.start {
                let uri: Arc<str> = uri.into();
                if state.readings.follow(uri.clone()) {
                    asked.push(Change::Start(uri));
                }
            }
        }
        if !asked.is_empty() {
            self.ask(asked);
        }
        if changed {
            self.shared.changes.changed();
        }
    }

    /// Hands `changes` to the task that holds the observations, starting it if
    /// there is none.
    fn ask(&self, changes: Vec<Change>) {
        let mut observer = self
            .shared
            .observer
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let changes = match observer.as_ref() {
            Some(tx) => match tx.send(changes) {
                Ok(()) => return,
                Err(mpsc::error::SendError(changes)) => changes,
            },
            None => changes,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(changes);
        tokio::spawn(observe_all(
            Arc::downgrade(&self.shared),
            self.shared.client.clone(),
            rx,
        ));
        *observer = Some(tx);
    }

    /// A notification (or the end) of the observation of `uri`.
    fn notified(&self, uri: &Arc<str>, note: Option<cobalt::Result<Response>>) {
        let reading = match note {
            Some(Ok(n)) => {
                self.shared.notifications.fetch_add(1, Ordering::Relaxed);
                // Not a number: ignored, the last reading stays.
                Some(n.text_payload().trim().parse::<f64>().ok())
            }
            Some(Err(e)) => {
                tracing::debug!("observing {uri} failed: {e}");
                None
            }
            None => None,
        };
        let mut state = self.state();
        let changed = match reading {
            Some(Some(value)) => state.readings.set(uri, value),
            Some(None) => false,
            None => state.readings.remove(uri).is_some_and(|(_, had)| had),
        };
        drop(state);
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
}

/// Holds every observation of the mashup `shared` in one [`ObservationSet`] and
/// reads them, taking the `changes` asked for between two notifications; ends when
/// the mashup is gone. An observation that fails or ends is dropped, and its
/// reading leaves the aggregate (a later lookup observes it again).
async fn observe_all(
    shared: Weak<Shared>,
    client: Client,
    mut changes: mpsc::UnboundedReceiver<Vec<Change>>,
) {
    let mut set: ObservationSet<Arc<str>> = ObservationSet::new(&client);
    drop(client);
    loop {
        tokio::select! {
            asked = changes.recv() => {
                let Some(asked) = asked else {
                    return; // the mashup is gone
                };
                let starts = asked.iter().filter(|c| matches!(c, Change::Start(_))).count();
                set.reserve(starts);
                for change in asked {
                    match change {
                        Change::Stop(uri) => {
                            set.remove(&uri);
                        }
                        Change::Start(uri) => {
                            if let Err(e) = set.observe(uri.clone(), &uri).await {
                                let Some(shared) = shared.upgrade() else { return };
                                tracing::debug!("cannot observe {uri}: {e}");
                                Mashup { shared }.notified(&uri, None);
                            }
                        }
                    }
                }
            }
            (uri, note) = next_of(&mut set) => {
                let Some(shared) = shared.upgrade() else { return };
                let ends = !matches!(note, Some(Ok(_)));
                if ends {
                    set.remove(&uri);
                }
                Mashup { shared }.notified(&uri, note);
            }
        }
    }
}

/// The next item of `set` (which always has one, in time).
async fn next_of(
    set: &mut ObservationSet<Arc<str>>,
) -> (Arc<str>, Option<cobalt::Result<Response>>) {
    match set.next().await {
        Some(item) => item,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The task that reads the observations holds the mashup weakly: dropping the
    /// last handle frees it (and the task ends at its next turn).
    #[tokio::test]
    async fn the_observing_task_does_not_keep_the_mashup() {
        let mashup = Mashup::new(Client::new(), MashupConfig::new("coap://127.0.0.1:9"));
        mashup.follow_resources(&["coap://127.0.0.1:9/t".to_string()]);
        assert_eq!(mashup.observed(), 1);
        assert!(mashup.shared.observer.lock().unwrap().is_some(), "started");
        let weak = Arc::downgrade(&mashup.shared);
        tokio::task::yield_now().await;
        drop(mashup);
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn readings_aggregate_and_forget() {
        let mut r = Readings::default();
        assert!(r.follow("a".into()) && r.follow("b".into()) && r.follow("c".into()));
        assert!(!r.follow("c".into()), "followed already");
        assert_eq!(r.aggregate(), Aggregate::default(), "no readings yet");
        assert!(r.set("a", 20.0));
        assert!(r.set("b", 24.0));
        assert!(r.set("c", 24.0));
        assert!(!r.set("c", 24.0), "same value: no change");
        assert!(!r.set("c", f64::NAN), "not a number: ignored");
        assert!(!r.set("x", 99.0), "not followed: ignored");
        let agg = r.aggregate();
        assert_eq!((agg.count, agg.max), (3, Some(24.0)));
        assert!((agg.mean.unwrap() - 68.0 / 3.0).abs() < 1e-9);
        assert_eq!(
            r.remove("b").map(|(k, had)| (k.to_string(), had)),
            Some(("b".into(), true))
        );
        assert_eq!(r.aggregate().max, Some(24.0), "c still has 24");
        assert!(r.set("c", -5.5));
        assert_eq!(r.aggregate().max, Some(20.0));
        assert!(r.remove("a").is_some() && r.remove("c").is_some() && r.remove("c").is_none());
        assert_eq!(r.aggregate(), Aggregate::default());
        assert_eq!(r.followed_count(), 0);
    }

    /// A resource followed but not yet read counts as observed, not in the
    /// aggregate, and leaves without changing it.
    #[test]
    fn a_followed_resource_without_a_reading_is_not_in_the_aggregate() {
        let mut r = Readings::default();
        assert!(r.follow("a".into()) && r.follow("b".into()));
        assert!(r.set("a", 10.0));
        assert_eq!((r.aggregate().count, r.followed_count()), (1, 2));
        assert_eq!(r.remove("b").map(|(_, had)| had), Some(false));
        assert_eq!(r.aggregate().mean, Some(10.0));
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

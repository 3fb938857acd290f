//! The directory as a CoAP service: [`ResourceDirectory`] holds the [`Directory`]
//! and its store, installs the RFC 9176 interfaces on a [`Server`] and runs the
//! expiry timer.

use crate::directory::{Directory, Registrant};
use crate::error::{RdError, StoreError};
use crate::limits::RdLimits;
use crate::lookup::{lookup, LookupKind, LookupQuery};
use crate::registration::{parse_links, Owner, Registration, RegistrationParams};
use crate::store::{RegistrationStore, StoreChange, Write, Written};
use cobalt::content_format;
use cobalt::metrics::Readiness;
use cobalt::proto::address::{AddressKey, AddressPrefix};
use cobalt::server::extract::Path;
use cobalt::server::{get, post, Observable, Request};
use cobalt::{Code, Response, Server};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{Mutex, Notify, Semaphore};

/// The wall clock the directory stamps expiry times with, in seconds since the Unix
/// epoch. Tests give one that follows tokio's virtual time.
pub trait Clock: Send + Sync + 'static {
    /// Now.
    fn now(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }
}

/// Longest sleep of the expiry timer: it also wakes up this often when nothing is
/// due, so that a clock that jumps is followed.
const EXPIRY_TICK: Duration = Duration::from_secs(60);

/// How often a write is made again from a refreshed view when a shared store says
/// that the view was stale (another node changed the same registration meanwhile).
const STALE_RETRIES: usize = 3;

/// How long the sync task waits before loading a shared store again after a load
/// failed.
const RESYNC_RETRY: Duration = Duration::from_secs(1);

struct Shared {
    directory: Mutex<Directory>,
    /// The directory's limits (they never change), readable without the lock.
    limits: RdLimits,
    store: Arc<dyn RegistrationStore>,
    clock: Arc<dyn Clock>,
    prefix: AddressPrefix,
    /// The client simple registration fetches `/.well-known/core` with.
    fetcher: cobalt::Client,
    /// One permit per simple-registration fetch in progress.
    fetches: Arc<Semaphore>,
    /// Observers of the endpoint lookup, notified on every change.
    endpoint_lookups: Observable,
    /// Observers of the resource lookup, notified on every change.
    resource_lookups: Observable,
    /// Woken when a registration may expire earlier than the timer's next wake-up.
    changed: Notify,
}

/// A resource directory service: build it with [`ResourceDirectory::open`], add its
/// routes to a server with [`ResourceDirectory::install`], and start its expiry timer
/// with [`ResourceDirectory::spawn_expiry`].
///
/// ```no_run
/// use cobalt_rd::{MemoryStore, RdLimits, ResourceDirectory};
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let rd = ResourceDirectory::open(std::sync::Arc::new(MemoryStore::new()), RdLimits::default()).await?;
/// let server = rd.install(cobalt::Server::new()).bind("[::]:5683").await?;
/// let _expiry = rd.spawn_expiry();
/// server.wait().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ResourceDirectory {
    shared: Arc<Shared>,
}

impl ResourceDirectory {
    /// A directory on `store`, loading what it holds (with the system clock).
    pub async fn open(
        store: Arc<dyn RegistrationStore>,
        limits: RdLimits,
    ) -> Result<ResourceDirectory, StoreError> {
        ResourceDirectory::open_with_clock(store, limits, Arc::new(SystemClock)).await
    }

    /// [`ResourceDirectory::open`] with another clock. Registrations already expired
    /// by `clock` are dropped from the store on load.
    pub async fn open_with_clock(
        store: Arc<dyn RegistrationStore>,
        limits: RdLimits,
        clock: Arc<dyn Clock>,
    ) -> Result<ResourceDirectory, StoreError> {
        let max_simple_fetches = limits.max_simple_fetches;
        let mut directory = Directory::new(limits.clone());
        for r in store.load().await? {
            directory.apply(r);
        }
        let expired = directory.expired(clock.now());
        if !expired.is_empty() {
            for id in store.remove_expired(expired, clock.now()).await? {
                directory.remove(id);
            }
        }
        Ok(ResourceDirectory {
            shared: Arc::new(Shared {
                directory: Mutex::new(directory),
                limits,
                store,
                clock,
                prefix: AddressPrefix::default(),
                fetcher: cobalt::Client::new(),
                fetches: Arc::new(Semaphore::new(max_simple_fetches)),
                endpoint_lookups: Observable::new(),
                resource_lookups: Observable::new(),
                changed: Notify::new(),
            }),
        })
    }

    /// How many registrations it holds now.
    pub async fn len(&self) -> usize {
        self.shared.directory.lock().await.len()
    }

    /// Whether it holds none.
    pub async fn is_empty(&self) -> bool {
        self.len().await == 0
    }

    /// A copy of every registration it holds now, by id (for services built on the
    /// directory, such as an LwM2M server).
    pub async fn registrations(&self) -> Vec<crate::Registration> {
        self.shared.directory.lock().await.iter().cloned().collect()
    }

    /// A copy of the registration of endpoint `ep` in sector `sector`, if it holds one.
    pub async fn registration_named(
        &self,
        ep: &str,
        sector: Option<&str>,
    ) -> Option<crate::Registration> {
        self.shared.directory.lock().await.find(ep, sector).cloned()
    }

    /// `server` with the directory's resources: `/rd` (registration, `rt=core.rd`),
    /// `/rd/{id}` (update and removal), `/rd-lookup/ep` and `/rd-lookup/res`
    /// (lookups, observable: an observer gets its lookup again after every change),
    /// and `/.well-known/rd` (simple registration). Install it on one server only. `/.well-known/core`
    /// lists the first three with `ct=40`, which is RD discovery.
    pub fn install(&self, server: Server) -> Server {
        let (reg, upd, del, ep, res, simple) = (
            self.clone(),
            self.clone(),
            self.clone(),
            self.clone(),
            self.clone(),
            self.clone(),
        );
        server
            .route(
                "/rd",
                post(move |req: Request| {
                    let rd = reg.clone();
                    async move {
                        rd.register(&req)
                            .await
                            .unwrap_or_else(RdError::into_response)
                    }
                })
                .rt("core.rd")
                .ct(content_format::LINK_FORMAT),
            )
            .route(
                "/rd/{id}",
                post(move |Path(id): Path<u64>, req: Request| {
                    let rd = upd.clone();
                    async move {
                        rd.update(id, &req)
                            .await
                            .unwrap_or_else(RdError::into_response)
                    }
                })
                .delete(move |Path(id): Path<u64>, req: Request| {
                    let rd = del.clone();
                    async move {
                        rd.remove(id, &req)
                            .await
                            .unwrap_or_else(RdError::into_response)
                    }
                }),
            )
            .route(
                "/rd-lookup/ep",
                get(move |req: Request| {
                    let rd = ep.clone();
                    async move {
                        rd.lookup(LookupKind::Endpoint, &req)
                            .await
                            .unwrap_or_else(RdError::into_response)
                    }
                })
                .rt("core.rd-lookup-ep")
                .observable(&self.shared.endpoint_lookups)
                .ct(content_format::LINK_FORMAT),
            )
            .route(
                "/rd-lookup/res",
                get(move |req: Request| {
                    let rd = res.clone();
                    async move {
                        rd.lookup(LookupKind::Resource, &req)
                            .await
                            .unwrap_or_else(RdError::into_response)
                    }
                })
                .rt("core.rd-lookup-res")
                .observable(&self.shared.resource_lookups)
                .ct(content_format::LINK_FORMAT),
            )
            .route(
                "/.well-known/rd",
                post(move |req: Request| {
                    let rd = simple.clone();
                    async move {
                        rd.simple_register(req)
                            .await
                            .unwrap_or_else(RdError::into_response)
                    }
                })
                .hidden(),
            )
    }

    fn registrant(&self, req: &Request) -> Registrant {
        let identity = req.identity();
        let peer_key = AddressKey::of(identity.addr().ip(), self.shared.prefix).ip();
        let addr = identity.addr();
        let ip = addr.ip().to_canonical();
        let host = if ip.is_ipv6() {
            format!("[{ip}]")
        } else {
            ip.to_string()
        };
        Registrant {
            owner: Owner::of(&identity, peer_key),
            peer_key,
            source_base: format!("{}://{host}:{}", identity.scheme(), addr.port()),
        }
    }

    fn check_content_format(req: &Request) -> Result<(), RdError> {
        match req.content_format() {
            None | Some(content_format::LINK_FORMAT) => Ok(()),
            Some(other) => Err(RdError {
                code: Code::UNSUPPORTED_CONTENT_FORMAT,
                message: format!("content format {other} is not accepted: send link-format (40)"),
                max_age: None,
                size1: None,
            }),
        }
    }

    /// `POST /rd?ep=..`: registers (or replaces) and answers 2.01 with its location.
    async fn register(&self, req: &Request) -> Result<Response, RdError> {
        Self::check_content_format(req)?;
        let limits = &self.shared.limits;
        let params = RegistrationParams::parse(req.query(), limits)?;
        let links = parse_links(req.payload(), limits)?;
        let who = self.registrant(req);
        let now = self.shared.clock.now();
        let registration = self
            .write(|dir| dir.register(params.clone(), links.clone(), &who, now))
            .await?;
        Ok(Response::created(&registration.path()))
    }

    /// `POST /rd/<id>`: renews, and changes base, attributes or links; 2.04.
    async fn update(&self, id: u64, req: &Request) -> Result<Response, RdError> {
        Self::check_content_format(req)?;
        let limits = &self.shared.limits;
        let params = RegistrationParams::parse(req.query(), limits)?;
        let links = if req.payload().is_empty() {
            None
        } else {
            Some(parse_links(req.payload(), limits)?)
        };
        let owner = self.registrant(req).owner;
        let now = self.shared.clock.now();
        self.write(|dir| dir.update(id, params.clone(), links.clone(), &owner, now))
            .await?;
        Ok(Response::new(Code::CHANGED))
    }

    /// `DELETE /rd/<id>`: 2.02.
    async fn remove(&self, id: u64, req: &Request) -> Result<Response, RdError> {
        let mut dir = self.shared.directory.lock().await;
        dir.check_remove(id, &self.registrant(req).owner)?;
        self.shared
            .store
            .remove(vec![id])
            .await
            .map_err(store_failed)?;
        dir.remove(id);
        self.lookups_changed();
        Ok(Response::new(Code::DELETED))
    }

    /// Makes a registration from the directory's view with `make`, stores it and
    /// applies it. A shared store may answer that the view was stale (another node
    /// registered the same (ep, d), or changed or removed this registration,
    /// meanwhile): the view is refreshed with what the store holds and `make` runs
    /// again, so that the rules are checked against the store's state.
    async fn write(
        &self,
        make: impl Fn(&Directory) -> Result<Registration, RdError>,
    ) -> Result<Registration, RdError> {
        let store = &self.shared.store;
        let mut dir = self.shared.directory.lock().await;
        for _ in 0..STALE_RETRIES {
            let mut registration = make(&dir)?;
            let write = if dir.get(registration.id).is_some() {
                Write::Replace
            } else {
                if let Some(id) = store.allocate_id().await.map_err(store_failed)? {
                    registration.id = id;
                }
                Write::New {
                    max_per_peer: dir.limits().max_per_peer,
                    max_total: dir.limits().max_total,
                }
            };
            let written = store
                .put_checked(registration.clone(), write)
                .await
                .map_err(store_failed)?;
            match written {
                Written::Stored => {
                    self.apply(&mut dir, registration.clone());
                    return Ok(registration);
                }
                Written::Stale(Some(current)) => self.apply(&mut dir, current),
                Written::Stale(None) => {
                    if dir.remove(registration.id).is_some() {
                        self.lookups_changed();
                    }
                }
                Written::PeerFull => return Err(dir.peer_full(registration.peer_key)),
                Written::Full => return Err(dir.full()),
            }
        }
        Err(RdError::unavailable(
            "the registration kept changing on other nodes while this one wrote it; retry".into(),
            1,
        ))
    }

    /// Puts `registration` into the directory (stored already), waking the expiry
    /// timer if it expires first and the lookups' observers.
    fn apply(&self, dir: &mut Directory, registration: Registration) {
        let sooner = dir
            .next_expiry()
            .is_none_or(|next| registration.expires_at < next);
        dir.apply(registration);
        if sooner {
            self.shared.changed.notify_one();
        }
        self.lookups_changed();
    }

    /// Tells the observers of both lookups that the registrations changed (each
    /// observer's lookup runs again; changes in quick succession are coalesced).
    fn lookups_changed(&self) {
        self.shared.endpoint_lookups.changed();
        self.shared.resource_lookups.changed();
    }

    /// `GET /rd-lookup/{ep,res}?filters&page&count`: 2.05 in link-format.
    async fn lookup(&self, kind: LookupKind, req: &Request) -> Result<Response, RdError> {
        if req
            .accept()
            .is_some_and(|cf| cf != content_format::LINK_FORMAT)
        {
            return Err(RdError {
                code: Code::NOT_ACCEPTABLE,
                message: "lookups answer in link-format (40) only".into(),
                max_age: None,
                size1: None,
            });
        }
        let query = LookupQuery::parse(req.query(), self.shared.limits.max_lookup_count)?;
        let dir = self.shared.directory.lock().await;
        let body = lookup(&dir, kind, &query, self.shared.clock.now());
        let answer = Response::content(body).with_content_format(content_format::LINK_FORMAT);
        Ok(match self.shared.limits.lookup_max_age_secs {
            60 => answer,
            age => answer.with_max_age(age),
        })
    }

    /// `POST /.well-known/rd?ep=..`: answers 2.04 at once, then fetches the sender's
    /// `/.well-known/core` and registers what it lists with the sender as base.
    async fn simple_register(&self, req: Request) -> Result<Response, RdError> {
        let limits = self.shared.limits.clone();
        let params = RegistrationParams::parse(req.query(), &limits)?;
        if params.base.is_some() {
            return Err(RdError::bad_request(
                "simple registration takes no `base`: the RD uses the sender's address".into(),
            ));
        }
        if params.ep.is_none() {
            return Err(RdError::bad_request(
                "a registration needs the endpoint name: add `?ep=NAME`".into(),
            ));
        }
        let permit = self
            .shared
            .fetches
            .clone()
            .try_acquire_owned()
            .map_err(|_| {
                RdError::unavailable(
                    "too many simple registrations in progress; retry later".into(),
                    limits.retry_after_secs,
                )
            })?;
        let who = self.registrant(&req);
        // A client of its own rather than `Request::client()`: requests sent with the
        // handler's client (on the shard's socket) got no answers when this was
        // written; the source address of the fetch does not matter to the endpoint.
        let client = self.shared.fetcher.clone();
        let rd = self.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let uri = format!("{}/.well-known/core", who.source_base);
            let links = match client.get(&uri).await {
                Ok(r) if r.code == Code::CONTENT => parse_links(&r.payload, &limits),
                Ok(r) => Err(RdError::bad_request(format!("{uri} answered {}", r.code))),
                Err(e) => Err(RdError::bad_request(format!("cannot fetch {uri}: {e}"))),
            };
            let outcome = match links {
                Ok(links) => rd.register_fetched(params, links, &who).await,
                Err(e) => Err(e),
            };
            if let Err(e) = outcome {
                tracing::info!("simple registration from {} failed: {}", who.source_base, e);
            }
        });
        Ok(Response::new(Code::CHANGED))
    }

    async fn register_fetched(
        &self,
        params: RegistrationParams,
        links: String,
        who: &Registrant,
    ) -> Result<(), RdError> {
        let now = self.shared.clock.now();
        self.write(|dir| dir.register(params.clone(), links.clone(), who, now))
            .await
            .map(|_| ())
    }

    /// Removes the registrations whose lifetime has run out, now; returns how many.
    /// With a shared store, one renewed on another node meanwhile stays (its new
    /// expiry arrives through [`ResourceDirectory::spawn_sync`]).
    pub async fn expire_now(&self) -> Result<usize, StoreError> {
        let mut dir = self.shared.directory.lock().await;
        let now = self.shared.clock.now();
        let expired = dir.expired(now);
        if expired.is_empty() {
            return Ok(0);
        }
        let removed = self.shared.store.remove_expired(expired, now).await?;
        for id in &removed {
            dir.remove(*id);
        }
        if !removed.is_empty() {
            self.lookups_changed();
        }
        Ok(removed.len())
    }

    /// Starts following a shared store's changes on the current tokio runtime, so
    /// that this directory answers with the registrations made through every node
    /// (`None` for a store that only this directory writes). Abort the handle to
    /// stop it.
    pub fn spawn_sync(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.spawn_sync_reporting(Readiness::default())
    }

    /// [`spawn_sync`](Self::spawn_sync), and `readiness` (e.g. the server's
    /// [`Metrics::readiness`](cobalt::metrics::Metrics::readiness), what its metrics
    /// endpoint answers at `/ready`) says whether this node is connected to the shared
    /// store: not ready from a lost connection until the store is loaded again, so that
    /// a balancer sends its clients to nodes that see the current registrations.
    pub fn spawn_sync_reporting(
        &self,
        readiness: Readiness,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let mut changes = self.shared.store.subscribe()?;
        let rd = self.clone();
        Some(tokio::spawn(async move {
            while let Some(change) = changes.recv().await {
                match change {
                    StoreChange::Lost(why) => readiness.set_unready(format!("shared store: {why}")),
                    StoreChange::Resync => {
                        rd.follow(StoreChange::Resync).await;
                        readiness.set_ready();
                    }
                    change => rd.follow(change).await,
                }
            }
        }))
    }

    /// Applies one change made to the shared store.
    async fn follow(&self, change: StoreChange) {
        match change {
            StoreChange::Stored(r) => {
                let mut dir = self.shared.directory.lock().await;
                self.apply(&mut dir, r);
            }
            StoreChange::Removed(id) => {
                if self.shared.directory.lock().await.remove(id).is_some() {
                    self.lookups_changed();
                }
            }
            StoreChange::Resync => loop {
                match self.shared.store.load().await {
                    Ok(all) => {
                        self.shared.directory.lock().await.replace_all(all);
                        self.shared.changed.notify_one();
                        self.lookups_changed();
                        return;
                    }
                    Err(e) => {
                        tracing::warn!("loading the shared store again: {e}; retrying");
                        tokio::time::sleep(RESYNC_RETRY).await;
                    }
                }
            },
            StoreChange::Lost(_) => {}
        }
    }

    /// Starts the expiry timer on the current tokio runtime: it sleeps until the
    /// earliest expiry (at most a minute) and removes what has run out. Abort the
    /// handle to stop it.
    pub fn spawn_expiry(&self) -> tokio::task::JoinHandle<()> {
        let rd = self.clone();
        tokio::spawn(async move {
            // At least a second between runs that removed nothing: what a shared
            // store kept (renewed elsewhere) stays due here until its update arrives.
            let mut least = Duration::ZERO;
            loop {
                let next = rd.shared.directory.lock().await.next_expiry();
                let now = rd.shared.clock.now();
                let wait = next.map_or(EXPIRY_TICK, |at| {
                    Duration::from_secs(at.saturating_sub(now)).clamp(least, EXPIRY_TICK)
                });
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = rd.shared.changed.notified() => continue,
                }
                match rd.expire_now().await {
                    Ok(0) => least = Duration::from_secs(1),
                    Ok(_) => least = Duration::ZERO,
                    Err(e) => {
                        tracing::warn!("expiring registrations: {e}; retrying in a minute");
                        tokio::time::sleep(EXPIRY_TICK).await;
                    }
                }
            }
        })
    }
}

fn store_failed(e: StoreError) -> RdError {
    RdError::internal(format!("{e}; nothing was changed, try again"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registration::Registration;
    use crate::store::MemoryStore;
    use std::net::{IpAddr, Ipv4Addr};

    /// A wall clock that follows tokio's (paused, virtual) time from `start`.
    struct VirtualClock {
        start: u64,
        origin: tokio::time::Instant,
    }

    impl Clock for VirtualClock {
        fn now(&self) -> u64 {
            self.start + self.origin.elapsed().as_secs()
        }
    }

    fn stored(id: u64, expires_at: u64) -> Registration {
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        Registration {
            id,
            ep: format!("ep{id}"),
            sector: None,
            base: "coap://127.0.0.1:5683".into(),
            lifetime: 100,
            expires_at,
            attrs: Vec::new(),
            links: "</a>".into(),
            owner: Owner::Address(ip),
            peer_key: ip,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_expiry_timer_removes_registrations_when_their_lifetime_runs_out() {
        let store = Arc::new(MemoryStore::new());
        for (id, at) in [(0, 500), (1, 1_100), (2, 1_200), (3, 5_000)] {
            store.put(stored(id, at)).await.unwrap();
        }
        let clock = Arc::new(VirtualClock {
            start: 1_000,
            origin: tokio::time::Instant::now(),
        });
        let rd = ResourceDirectory::open_with_clock(store.clone(), RdLimits::default(), clock)
            .await
            .unwrap();
        // Expired while the directory was down: dropped at start, from the store too.
        assert_eq!(rd.len().await, 3);
        let _timer = rd.spawn_expiry();
        tokio::time::sleep(Duration::from_secs(99)).await;
        assert_eq!(rd.len().await, 3);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(rd.len().await, 2);
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert_eq!(rd.len().await, 1);
        assert_eq!(
            store
                .load()
                .await
                .unwrap()
                .iter()
                .map(|r| r.id)
                .collect::<Vec<_>>(),
            vec![3]
        );
        tokio::time::sleep(Duration::from_secs(3_800)).await;
        assert!(rd.is_empty().await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_registration_expiring_sooner_wakes_the_timer() {
        let clock = Arc::new(VirtualClock {
            start: 1_000,
            origin: tokio::time::Instant::now(),
        });
        let store = Arc::new(MemoryStore::new());
        let rd = ResourceDirectory::open_with_clock(store, RdLimits::default(), clock)
            .await
            .unwrap();
        let _timer = rd.spawn_expiry();
        tokio::time::sleep(Duration::from_secs(1)).await;
        rd.write(|_| Ok(stored(7, 1_011))).await.unwrap();
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert_eq!(rd.len().await, 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            rd.is_empty().await,
            "expired at 1011, before the timer's one-minute tick"
        );
    }
}

//! The LwM2M server as a Cobalt service: [`Lwm2mServer`] is a resource directory
//! (`cobalt-rd`: store, registration, expiry, limits, ownership) with a [`Layer`]
//! that applies the LwM2M registration rules before the directory sees a request
//! and, once the directory has answered, remembers through which of the server's
//! sockets (plain or DTLS, with its session) each registered client is reached.

use crate::device::{Device, ManageError};
use crate::limits::ManagerLimits;
use crate::registration::{check, ClientInfo};
use crate::route::Route;
use cobalt::server::{Layer, Request};
use cobalt::{Code, Response, Server};
use cobalt_rd::{RdLimits, RegistrationStore, ResourceDirectory, StoreError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

/// The routes of the registered clients, by registration id. An entry is added only
/// for a registration the directory accepted (so the directory's limits bound it)
/// and removed on de-registration or when the directory no longer holds it.
#[derive(Default)]
struct Routes {
    by_id: Mutex<HashMap<u64, Route>>,
}

impl Routes {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Route>> {
        self.by_id.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// An LwM2M 1.1 server: the registration interface (`/rd`) on a resource
/// directory, and device management of the registered clients ([`Device`]).
///
/// ```no_run
/// use cobalt_lwm2m::{Format, Lwm2mServer};
/// use cobalt_rd::{MemoryStore, RdLimits};
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let lwm2m = Lwm2mServer::open(std::sync::Arc::new(MemoryStore::new()), RdLimits::default()).await?;
/// // One shard: requests to a client leave from the address it registered with.
/// let server = lwm2m.install(cobalt::Server::new()).shards(1).bind("[::]:5683").await?;
/// let _expiry = lwm2m.spawn_expiry();
/// let device = lwm2m.device("my-device").await?;
/// for entry in device.read(&"/3/0".parse()?, Format::SenmlJson).await? {
///     println!("{} = {}", entry.path, entry.value);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Lwm2mServer {
    rd: ResourceDirectory,
    routes: Arc<Routes>,
    rd_limits: RdLimits,
    limits: ManagerLimits,
    observations: Arc<Semaphore>,
}

impl Lwm2mServer {
    /// A server whose registrations live in `store` (loaded now), within `rd_limits`
    /// (body size, links, registrations per peer and in total).
    pub async fn open(
        store: Arc<dyn RegistrationStore>,
        rd_limits: RdLimits,
    ) -> Result<Lwm2mServer, StoreError> {
        let rd = ResourceDirectory::open(store, rd_limits.clone()).await?;
        Ok(Lwm2mServer::on(rd, rd_limits))
    }

    /// A server on an opened directory `rd` (e.g. one with a test clock) that
    /// enforces `rd_limits`.
    pub fn on(rd: ResourceDirectory, rd_limits: RdLimits) -> Lwm2mServer {
        let limits = ManagerLimits::default();
        Lwm2mServer {
            rd,
            routes: Arc::default(),
            rd_limits,
            observations: Arc::new(Semaphore::new(limits.max_observations)),
            limits,
        }
    }

    /// The same server with other manager-side limits.
    pub fn with_limits(mut self, limits: ManagerLimits) -> Lwm2mServer {
        self.observations = Arc::new(Semaphore::new(limits.max_observations));
        self.limits = limits;
        self
    }

    /// The directory the registrations live in.
    pub fn directory(&self) -> &ResourceDirectory {
        &self.rd
    }

    /// `server` with the registration interface: the directory's resources (`/rd`,
    /// `/rd/{id}`, its lookups) and the LwM2M layer. Serve it with one shard per
    /// listener ([`Server::shards`]`(1)`): requests to a client then leave from the
    /// socket it registered at, which LwM2M clients expect (and DTLS requires).
    pub fn install(&self, server: Server) -> Server {
        self.rd.install(server).layer(RegistrationLayer {
            routes: self.routes.clone(),
            max_body: self.rd_limits.max_body_bytes,
        })
    }

    /// Starts the directory's expiry timer, and forgets the routes of expired
    /// registrations once a minute. Abort the handle to stop both.
    pub fn spawn_expiry(&self) -> tokio::task::JoinHandle<()> {
        let expiry = self.rd.spawn_expiry();
        let me = self.clone();
        tokio::spawn(async move {
            let _stop_with_me = AbortOnDrop(expiry);
            loop {
                tokio::time::sleep(Duration::from_secs(60)).await;
                me.forget_unregistered().await;
            }
        })
    }

    /// Drops the routes of registrations the directory no longer holds.
    async fn forget_unregistered(&self) {
        let ids: std::collections::HashSet<u64> =
            self.rd.registrations().await.iter().map(|r| r.id).collect();
        self.routes.map().retain(|id, _| ids.contains(id));
    }

    /// Every registered client.
    pub async fn clients(&self) -> Vec<ClientInfo> {
        self.rd
            .registrations()
            .await
            .iter()
            .map(ClientInfo::of)
            .collect()
    }

    /// The registered client with endpoint name `endpoint`.
    pub async fn client(&self, endpoint: &str) -> Option<ClientInfo> {
        let registration = self.rd.registration_named(endpoint, None).await?;
        Some(ClientInfo::of(&registration))
    }

    /// A handle for managing the registered client `endpoint`: read, write, execute,
    /// observe. Fails when it is not registered, or when the manager has no way to
    /// reach it yet (registered before a restart, over a stream transport).
    pub async fn device(&self, endpoint: &str) -> Result<Device, ManageError> {
        let info = self
            .client(endpoint)
            .await
            .ok_or_else(|| ManageError::NotRegistered(endpoint.to_string()))?;
        let route = self.routes.map().get(&info.id).cloned().ok_or_else(|| {
            ManageError::Unreachable(format!(
                "{endpoint} registered from {} before this server started (or over a stream \
                 transport); it can be managed after its next registration update",
                info.address
            ))
        })?;
        Ok(Device::new(
            info,
            route,
            self.limits.clone(),
            self.observations.clone(),
        ))
    }
}

/// Aborts a task when dropped (the expiry timer stops with the route sweeper).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The LwM2M rules on `/rd` and `/rd/{id}`, and the routes of registered clients.
struct RegistrationLayer {
    routes: Arc<Routes>,
    max_body: usize,
}

/// The server's client for the socket a registration request arrived on.
#[derive(Clone)]
struct ShardClient(cobalt::Client);

/// What a request on the registration interface is.
enum Operation {
    Register,
    Update(u64),
    Deregister(u64),
}

fn operation(request: &Request) -> Option<Operation> {
    let path = request.path();
    let id = || path.strip_prefix("/rd/")?.parse::<u64>().ok();
    match request.method() {
        Code::POST if path == "/rd" => Some(Operation::Register),
        Code::POST => id().map(Operation::Update),
        Code::DELETE => id().map(Operation::Deregister),
        _ => None,
    }
}

impl Layer for RegistrationLayer {
    fn on_request(&self, request: &mut Request) -> Result<(), Response> {
        let register = match operation(request) {
            Some(Operation::Register) => true,
            Some(Operation::Update(_)) => false,
            _ => return Ok(()),
        };
        // The answer hook sees the request without its client: keep it for then.
        let client = request.client();
        request.extensions_mut().insert(ShardClient(client));
        if request.payload().len() > self.max_body {
            // The directory answers 4.13 with Size1.
            return Ok(());
        }
        check(request.query(), request.payload(), register)
            .map_err(|r| Response::new(r.code).with_payload(r.message))
    }

    fn on_response(&self, request: &Request, response: &mut Response) {
        let id = match operation(request) {
            Some(Operation::Deregister(id)) if response.code == Code::DELETED => {
                self.routes.map().remove(&id);
                return;
            }
            Some(Operation::Register) if response.code == Code::CREATED => response
                .options
                .location_path_string()
                .and_then(|p| p.strip_prefix("/rd/")?.parse::<u64>().ok()),
            // The client may come from a new address (NAT rebinding).
            Some(Operation::Update(id)) if response.code == Code::CHANGED => Some(id),
            _ => None,
        };
        let client = request.extensions().get::<ShardClient>().cloned();
        if let (Some(id), Some(ShardClient(client))) = (id, client) {
            let identity = request.identity();
            let mut routes = self.routes.map();
            let mut route = Route::new(client, identity.addr(), identity.scheme());
            if let Some(known) = routes.get(&id) {
                // Requests waiting for a client in queue mode wake up now.
                route.heard = known.heard.clone();
                route.heard.send_replace(std::time::Instant::now());
            }
            routes.insert(id, route);
        }
    }

    fn name(&self) -> &'static str {
        "lwm2m-registration"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_rd::{MemoryStore, Owner, Registration};
    use std::time::{SystemTime, UNIX_EPOCH};

    #[tokio::test]
    async fn routes_of_registrations_the_directory_no_longer_holds_are_forgotten() {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let ip = "192.0.2.1".parse().unwrap();
        let held = Registration {
            id: 3,
            ep: "held".into(),
            sector: None,
            base: "coap://192.0.2.1:5683".into(),
            lifetime: 600,
            expires_at: now + 600,
            attrs: Vec::new(),
            links: "</3/0>".into(),
            owner: Owner::Address(ip),
            peer_key: ip,
        };
        let store = Arc::new(MemoryStore::new());
        store.put(held).await.unwrap();
        let lwm2m = Lwm2mServer::open(store, RdLimits::default()).await.unwrap();
        for id in [3, 7] {
            let peer = "192.0.2.1:5683".parse().unwrap();
            let route = Route::new(cobalt::Client::new(), peer, cobalt::Scheme::Coap);
            lwm2m.routes.map().insert(id, route);
        }
        lwm2m.forget_unregistered().await;
        let left: Vec<u64> = lwm2m.routes.map().keys().copied().collect();
        assert_eq!(left, vec![3]);
        assert!(lwm2m.device("held").await.is_ok());
    }
}

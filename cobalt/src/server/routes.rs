//! The routes of a running server, changed while it serves: [`Routes`] edits them
//! and every shard and stream connection serves the latest version from its next
//! request on.
//!
//! Each edit builds a new [`ResourceTree`] from the current one and publishes it with
//! a new epoch. A server role keeps the tree it serves in a [`CurrentTree`] and, before
//! each request, compares the epoch (one atomic load) with the one it holds; only
//! after an edit does it take the lock to fetch the new tree. Matching itself never
//! locks and, for a static path, never allocates.

use super::handler::{FromRequestParts, MethodRouter};
use super::pattern::InvalidRoute;
use super::request::{Request, Response};
use super::tree::ResourceTree;
use crate::changes::ChangeInbox;
use cobalt_proto::link_format::Link;
use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The routes of a running server, to add and remove resources while it serves (a
/// resource directory creating `/rd/4521` on POST and removing it on DELETE): from
/// [`ServerHandle::routes`](super::ServerHandle::routes), from a handler's
/// [`Request::routes`], or as a handler argument. Cheap to clone; every clone edits
/// the same routes.
///
/// Every shard and connection serves an edit from its next request on, and
/// `/.well-known/core` lists what was added with a concrete path. An observable
/// resource added here notifies its observers like one given at start; removing one
/// tells its observers it is gone (4.04, RFC 7641 §3.2).
///
/// An edit copies the route table (its cost grows with the number of routes), so it
/// suits routes that change per registration, not per request.
#[derive(Clone, Default)]
pub struct Routes {
    inner: Arc<Shared>,
}

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routes")
            .field("epoch", &self.inner.epoch.load(Ordering::Relaxed))
            .field("state", &self.inner.state.as_ref().map(|s| s.type_name))
            .finish()
    }
}

/// What the clones of a [`Routes`] share.
#[derive(Default)]
struct Shared {
    current: Mutex<Current>,
    /// Bumped by every edit, after the new tree is in place.
    epoch: AtomicU64,
    /// The server's state ([`Server::with_state`](super::Server::with_state)).
    state: Option<StateValue>,
}

/// The tree being served and where observable resources post their changes.
#[derive(Default)]
struct Current {
    tree: Arc<ResourceTree>,
    /// The datagram shards' inboxes, once they run.
    shards: Option<Vec<Arc<ChangeInbox>>>,
}

/// A server's state, with its type's name for the error when a handler asks for
/// another type.
#[derive(Clone)]
pub(crate) struct StateValue {
    value: Arc<dyn Any + Send + Sync>,
    type_name: &'static str,
}

impl StateValue {
    /// Wraps `state`.
    pub(crate) fn new<S: Send + Sync + 'static>(state: S) -> StateValue {
        StateValue {
            value: Arc::new(state),
            type_name: std::any::type_name::<S>(),
        }
    }
}

impl std::fmt::Debug for StateValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StateValue<{}>", self.type_name)
    }
}

impl Routes {
    /// Routes serving `tree`, with `state` for the handlers.
    pub(crate) fn new(tree: ResourceTree, state: Option<StateValue>) -> Routes {
        Routes {
            inner: Arc::new(Shared {
                current: Mutex::new(Current {
                    tree: Arc::new(tree),
                    shards: None,
                }),
                epoch: AtomicU64::new(0),
                state,
            }),
        }
    }

    fn current(&self) -> MutexGuard<'_, Current> {
        self.inner.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends the changes of every observable resource, those added later included,
    /// to the datagram shards' `inboxes`.
    pub(crate) fn attach_shards(&self, inboxes: Vec<Arc<ChangeInbox>>) {
        let mut current = self.current();
        for o in current.tree.observables() {
            o.attach(inboxes.clone());
        }
        current.shards = Some(inboxes);
    }

    /// Applies `edit` to a copy of the current tree and publishes the copy; what
    /// `edit` returns.
    fn edit<T>(&self, edit: impl FnOnce(&mut ResourceTree) -> T) -> T {
        let mut current = self.current();
        let mut tree = ResourceTree::clone(&current.tree);
        let out = edit(&mut tree);
        current.tree = Arc::new(tree);
        self.inner.epoch.fetch_add(1, Ordering::Release);
        out
    }

    /// Puts a resource at `path` (a pattern as in [`Server::route`](super::Server::route)),
    /// replacing one already there. Fails, changing nothing, when `path` is not a valid
    /// pattern.
    pub fn insert(&self, path: &str, resource: MethodRouter) -> Result<(), InvalidRoute> {
        let observable = resource.observable.clone();
        self.edit(|tree| tree.try_insert(path, resource))?;
        if let Some(o) = observable {
            if let Some(shards) = &self.current().shards {
                o.attach(shards.clone());
            }
        }
        Ok(())
    }

    /// Takes the resource at `path` (written as it was inserted, `{name}` included) out;
    /// false if there was none. Its observers are told it is gone.
    pub fn remove(&self, path: &str) -> bool {
        if !self.current().tree.contains(path) {
            return false;
        }
        let removed = self.edit(|tree| tree.remove(path));
        if let Some(o) = removed.as_ref().and_then(|r| r.observable.as_ref()) {
            o.deleted();
        }
        removed.is_some()
    }

    /// Whether a resource is at `path` (written as it was inserted).
    pub fn contains(&self, path: &str) -> bool {
        self.current().tree.contains(path)
    }

    /// The budgets of the server's peers (the same in every version of the tree).
    pub(crate) fn budgets(&self) -> Arc<super::budget::Budgets> {
        self.current().tree.budgets()
    }

    /// What `/.well-known/core` lists now.
    pub fn links(&self) -> Vec<Link> {
        self.current().tree.links().to_vec()
    }

    /// The tree to serve, kept current by [`CurrentTree::refresh`].
    pub(crate) fn serve(&self) -> CurrentTree {
        let current = self.current();
        CurrentTree {
            tree: current.tree.clone(),
            epoch: self.inner.epoch.load(Ordering::Acquire),
            routes: self.clone(),
        }
    }

    /// The state if it is an `S`; otherwise the name of the state's type (`None` when
    /// the server has none).
    fn state<S: Clone + 'static>(&self) -> Result<S, Option<&'static str>> {
        let state = self.inner.state.as_ref().ok_or(None)?;
        let value = state.value.downcast_ref::<S>();
        value.cloned().ok_or(Some(state.type_name))
    }
}

/// The tree a server role serves: the latest version of its [`Routes`] as of the last
/// [`CurrentTree::refresh`].
pub(crate) struct CurrentTree {
    tree: Arc<ResourceTree>,
    /// The routes' epoch when `tree` was taken.
    epoch: u64,
    routes: Routes,
}

impl CurrentTree {
    /// Takes the routes' latest tree if they were edited since the last call.
    #[inline]
    pub(crate) fn refresh(&mut self) {
        let epoch = self.routes.inner.epoch.load(Ordering::Acquire);
        if epoch != self.epoch {
            self.reload(epoch);
        }
    }

    /// Takes the routes' tree after an edit (out of line: rare).
    #[cold]
    #[inline(never)]
    fn reload(&mut self, epoch: u64) {
        // Taken after the epoch was read: at least as new as that epoch's tree.
        self.tree = self.routes.current().tree.clone();
        self.epoch = epoch;
    }

    /// Lets `req` reach these routes and the server's state (its handler's
    /// [`Routes`] and [`State`] arguments).
    #[inline]
    pub(crate) fn link(&self, req: &mut Request) {
        req.server = Some(self.routes.inner.clone());
    }
}

impl std::ops::Deref for CurrentTree {
    type Target = ResourceTree;

    fn deref(&self) -> &ResourceTree {
        &self.tree
    }
}

impl Request {
    /// The routes of the server that received this request, to add or remove
    /// resources from a handler. For a request built by hand (outside a server), routes
    /// of their own that serve nothing.
    pub fn routes(&self) -> Routes {
        let shared = self
            .server
            .clone()
            .and_then(|s| s.downcast::<Shared>().ok());
        shared.map(|inner| Routes { inner }).unwrap_or_default()
    }
}

impl FromRequestParts for Routes {
    fn from_request_parts(req: &Request) -> Result<Self, Response> {
        Ok(req.routes())
    }
}

/// The server's state as a handler argument, given with
/// [`Server::with_state`](super::Server::with_state):
/// `get(|State(db): State<Db>| async move { ... })`.
///
/// A handler asking for a type other than the one given (or for state when the server
/// has none) is not run: the request is answered 5.00 with a payload naming both types,
/// and the mistake is logged as an error.
#[derive(Debug, Clone, Copy, Default)]
pub struct State<S>(pub S);

impl<S: Clone + Send + Sync + 'static> FromRequestParts for State<S> {
    fn from_request_parts(req: &Request) -> Result<Self, Response> {
        let asked = std::any::type_name::<S>();
        match req.routes().state::<S>() {
            Ok(state) => Ok(State(state)),
            Err(given) => {
                let given = given.map_or_else(
                    || "no state (Server::with_state was not called)".to_string(),
                    |t| format!("state of type {t}"),
                );
                let why = format!("a handler asks for State<{asked}> but the server has {given}");
                tracing::error!(path = %req.path(), "{why}");
                Err(
                    Response::new(cobalt_proto::message::Code::INTERNAL_SERVER_ERROR)
                        .with_payload(why),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::{get, post};
    use cobalt_proto::message::{Code, Message, MessageType};
    use futures_util::FutureExt;

    fn request(method: Code, path: &str) -> Request {
        let mut m = Message::new(MessageType::Confirmable, method, 1);
        m.options.set_uri_path(path);
        Request::new("127.0.0.1:9".parse().unwrap(), m)
    }

    fn answer(tree: &CurrentTree, method: Code, path: &str) -> Response {
        let mut req = request(method, path);
        tree.link(&mut req);
        match tree.route(req) {
            Ok(routed) => routed.future.now_or_never().expect("ready at once"),
            Err(refused) => refused,
        }
    }

    #[test]
    fn a_served_tree_sees_edits_after_refreshing() {
        let routes = Routes::new(ResourceTree::new(), None);
        let mut served = routes.serve();
        routes
            .insert("/late", get(|| async { "late" }).rt("x"))
            .unwrap();
        assert_eq!(
            answer(&served, Code::GET, "/late").code,
            Code::NOT_FOUND,
            "the version served until the next refresh"
        );
        served.refresh();
        assert_eq!(answer(&served, Code::GET, "/late").text_payload(), "late");
        assert_eq!(routes.links()[0].target, "/late");
        assert!(routes.remove("/late"));
        assert!(!routes.remove("/late"));
        served.refresh();
        assert_eq!(answer(&served, Code::GET, "/late").code, Code::NOT_FOUND);
        assert!(routes.links().is_empty());
        let bad = routes
            .insert("/x/{*a}/b", get(|| async { "" }))
            .unwrap_err();
        assert!(bad.to_string().contains("last segment"), "{bad}");
    }

    #[test]
    fn a_handler_adds_routes_and_a_request_by_hand_has_its_own() {
        let mut tree = ResourceTree::new();
        tree.insert(
            "/things",
            post(|routes: Routes, req: Request| async move {
                let n = String::from_utf8_lossy(req.payload()).into_owned();
                let path = format!("/things/{n}");
                let body = format!("thing {n}");
                let made = routes.insert(&path, get(move || std::future::ready(body.clone())));
                made.map(|()| Response::created(&path))
                    .map_err(|e| Response::new(Code::BAD_REQUEST).with_payload(e.to_string()))
            }),
        );
        let routes = Routes::new(tree, None);
        let mut served = routes.serve();
        let mut m = Message::new(MessageType::Confirmable, Code::POST, 1);
        m.options.set_uri_path("/things");
        m.payload = b"42".to_vec();
        let mut create = Request::new("127.0.0.1:9".parse().unwrap(), m);
        served.link(&mut create);
        let created = match served.route(create) {
            Ok(r) => r.future.now_or_never().unwrap(),
            Err(r) => r,
        };
        assert_eq!(created.code, Code::CREATED, "{created:?}");
        served.refresh();
        assert_eq!(
            answer(&served, Code::GET, "/things/42").text_payload(),
            "thing 42"
        );
        let by_hand = request(Code::GET, "/things");
        by_hand.routes().insert("/x", get(|| async { "" })).unwrap();
        assert!(
            !routes.contains("/x"),
            "a request built by hand has routes of its own"
        );
    }

    #[test]
    fn observables_added_later_post_to_the_shards() {
        let routes = Routes::new(ResourceTree::new(), None);
        let inbox = Arc::new(ChangeInbox::default());
        routes.attach_shards(vec![inbox.clone()]);
        let o = crate::server::Observable::new();
        routes
            .insert("/obs/{n}", get(|| async { "x" }).observable(&o))
            .unwrap();
        o.changed();
        let taken = inbox.take();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].0, o.id());
        assert!(routes.remove("/obs/{n}"));
        let taken = inbox.take();
        assert!(
            matches!(
                taken[0].1.ending,
                Some(crate::changes::Ending::With(Code::NOT_FOUND))
            ),
            "observers are told the resource is gone"
        );
    }

    #[derive(Clone, Debug, PartialEq)]
    struct Db(u32);

    #[test]
    fn state_reaches_handlers_and_the_wrong_type_is_a_clear_5_00() {
        let mut tree = ResourceTree::new();
        tree.insert(
            "/db",
            get(|State(db): State<Db>| async move { format!("{}", db.0) }),
        );
        tree.insert(
            "/wrong",
            get(|State(n): State<u64>| async move { format!("{n}") }),
        );
        let served = Routes::new(tree.clone(), Some(StateValue::new(Db(7)))).serve();
        assert_eq!(answer(&served, Code::GET, "/db").text_payload(), "7");
        let wrong = answer(&served, Code::GET, "/wrong");
        assert_eq!(wrong.code, Code::INTERNAL_SERVER_ERROR);
        let why = wrong.text_payload();
        assert!(why.contains("State<u64>") && why.contains("Db"), "{why}");
        let stateless = Routes::new(tree, None).serve();
        let none = answer(&stateless, Code::GET, "/db");
        assert_eq!(none.code, Code::INTERNAL_SERVER_ERROR);
        assert!(none.text_payload().contains("with_state"), "{none:?}");
    }
}

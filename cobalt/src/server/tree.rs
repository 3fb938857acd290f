//! The resource tree: paths to resources, dispatch with 4.04/4.05, and the
//! `/.well-known/core` listing generated from it.

use super::budget::Budgets;
use super::exact::ExactPaths;
use super::executor::Executor;
use super::handler::{BoxedChunkHandler, MethodRouter, UploadChunk};
use super::observe::Observable;
use super::pattern::{self, InvalidRoute, RoutePattern, Segment};
use super::request::BoxFuture;
use super::request::{IntoResponse, Request, Response};
use cobalt_proto::link_format::{self, Link};
use cobalt_proto::message::{content_format, opt, Code, Message};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Path of the discovery resource (RFC 6690 §4).
pub const WELL_KNOWN_CORE: &str = "/.well-known/core";

/// A resource with what routed requests to it: the pattern that tells its parameters'
/// places, for a route with parameters.
#[derive(Debug, Clone)]
struct Resource {
    router: MethodRouter,
    pattern: Option<Arc<RoutePattern>>,
}

#[derive(Debug, Default, Clone)]
struct Node {
    resource: Option<Resource>,
    executor: Option<Executor>,
    /// Static segments.
    children: BTreeMap<String, Node>,
    /// `{name}`: any one (non-empty) segment.
    param: Option<Box<Node>>,
    /// `{*name}`: the remaining segments; only its resource and executor are used.
    wildcard: Option<Box<Node>>,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.resource.is_none()
            && self.executor.is_none()
            && self.children.is_empty()
            && self.param.is_none()
            && self.wildcard.is_none()
    }

    fn child_mut(&mut self, seg: Segment<'_>) -> &mut Node {
        match seg {
            Segment::Static(s) => self.children.entry(s.to_string()).or_default(),
            Segment::Param(_) => self.param.get_or_insert_with(Default::default),
            Segment::Wildcard(_) => self.wildcard.get_or_insert_with(Default::default),
        }
    }

    fn child(&self, seg: Segment<'_>) -> Option<&Node> {
        match seg {
            Segment::Static(s) => self.children.get(s),
            Segment::Param(_) => self.param.as_deref(),
            Segment::Wildcard(_) => self.wildcard.as_deref(),
        }
    }

    /// Takes the resource at `segments` below this node, dropping the nodes left
    /// empty on the way back up.
    fn remove(&mut self, segments: &[Segment<'_>]) -> Option<Resource> {
        let Some((first, rest)) = segments.split_first() else {
            return self.resource.take();
        };
        let (removed, emptied) = match *first {
            Segment::Static(s) => {
                let child = self.children.get_mut(s)?;
                let removed = child.remove(rest);
                let emptied = child.is_empty();
                if emptied {
                    self.children.remove(s);
                }
                (removed, false)
            }
            Segment::Param(_) => {
                let child = self.param.as_deref_mut()?;
                (child.remove(rest), child.is_empty())
            }
            Segment::Wildcard(_) => {
                let child = self.wildcard.as_deref_mut()?;
                (child.remove(rest), child.is_empty())
            }
        };
        if emptied {
            match first {
                Segment::Param(_) => self.param = None,
                _ => self.wildcard = None,
            }
        }
        removed
    }

    /// The best match of `segments` below this node, static segments before
    /// parameters before a wildcard, with the nearest executor chosen on the way.
    fn search<'t>(
        &'t self,
        segments: &[&str],
        executor: Option<&'t Executor>,
    ) -> Option<(&'t Resource, Option<&'t Executor>)> {
        let executor = self.executor.as_ref().or(executor);
        let (first, rest) = match segments.split_first() {
            Some(split) => split,
            None => {
                if let Some(r) = &self.resource {
                    return Some((r, executor));
                }
                return self.wildcard_match(executor);
            }
        };
        if let Some(found) = self
            .children
            .get(*first)
            .and_then(|c| c.search(rest, executor))
        {
            return Some(found);
        }
        if let Some(found) = self
            .param
            .as_deref()
            .filter(|_| !first.is_empty())
            .and_then(|p| p.search(rest, executor))
        {
            return Some(found);
        }
        self.wildcard_match(executor)
    }

    fn wildcard_match<'t>(
        &'t self,
        executor: Option<&'t Executor>,
    ) -> Option<(&'t Resource, Option<&'t Executor>)> {
        let w = self.wildcard.as_deref()?;
        let r = w.resource.as_ref()?;
        Some((r, w.executor.as_ref().or(executor)))
    }
}

/// A request matched to a resource.
pub(crate) struct Routed {
    /// The handler's answer.
    pub future: BoxFuture,
    /// The resource's observable handle, for a GET to an observable resource.
    pub observable: Option<Observable>,
    /// Where the handler runs.
    pub executor: Executor,
}

/// Resources by path: static paths (`/sensors/temp`), paths with parameters
/// (`/rd/{id}`, one segment each) and a trailing wildcard (`/files/{*rest}`, the
/// remaining segments, zero or more), and a fallback for requests no route matches.
///
/// A request goes to the route whose segments match its Uri-Path best, segment by
/// segment from the left: a static segment wins over a parameter, a parameter over a
/// wildcard. `/.well-known/core` (unless a static route takes it) lists the resources
/// with a static path; routes with parameters have no concrete path to list.
#[derive(Debug, Default, Clone)]
pub struct ResourceTree {
    root: Node,
    /// Answers requests that no route matches.
    fallback: Option<Resource>,
    /// Whether any route has a parameter or wildcard (otherwise a request that the
    /// static walk does not match goes straight to the fallback or 4.04).
    patterns: bool,
    /// The resources with a static path and the executor each inherits, by path: a
    /// request for exactly such a path (the best match there is) skips the walk.
    exact: ExactPaths<(Resource, Option<Executor>)>,
    /// The methods (bit `code`) that some resource has a streaming upload handler
    /// for: a request with another method has no streaming route to look for.
    streamed: u32,
    links: Vec<Link>,
    /// What the peers of a server that serves this tree hold, over all its shards and
    /// listeners.
    budgets: Arc<Budgets>,
}

impl ResourceTree {
    /// An empty tree.
    pub fn new() -> ResourceTree {
        ResourceTree::default()
    }

    /// Puts a resource at `path`, replacing one already there. `path` is made of
    /// segments separated by `/`: literal text, `{name}` for any one segment (read it
    /// with [`Request::param`]) and, last, `{*name}` for the remaining segments.
    ///
    /// # Panics
    ///
    /// When `path` is not a valid pattern (see [`ResourceTree::try_insert`]).
    pub fn insert(&mut self, path: &str, resource: MethodRouter) {
        if let Err(e) = self.try_insert(path, resource) {
            panic!("{e}");
        }
    }

    /// Like [`ResourceTree::insert`], failing when `path` has braces that are not a
    /// whole `{name}` segment, a wildcard before the last segment, or a name twice.
    pub fn try_insert(&mut self, path: &str, resource: MethodRouter) -> Result<(), InvalidRoute> {
        let segments = pattern::parse(path)?;
        let node = self.node_mut(&segments);
        if let Some(e) = &resource.executor {
            node.executor = Some(e.clone());
        }
        node.resource = Some(Resource {
            router: resource,
            pattern: RoutePattern::of(&segments).map(Arc::new),
        });
        self.reindex();
        Ok(())
    }

    /// Takes the resource at `path` (written as it was inserted) out of the tree; the
    /// removed resource, or `None` if there was none.
    pub fn remove(&mut self, path: &str) -> Option<MethodRouter> {
        let segments = pattern::parse(path).ok()?;
        let removed = self.root.remove(&segments)?;
        self.reindex();
        Some(removed.router)
    }

    /// Whether a resource is at `path` (written as it was inserted).
    pub fn contains(&self, path: &str) -> bool {
        let Ok(segments) = pattern::parse(path) else {
            return false;
        };
        let mut node = &self.root;
        for seg in segments {
            match node.child(seg) {
                Some(n) => node = n,
                None => return false,
            }
        }
        node.resource.is_some()
    }

    /// Answers requests that no route matches with `resource` (instead of 4.04 Not
    /// Found), whatever their path; a method it has no handler for is answered 4.05.
    /// Its handlers see the whole request, also Proxy-Uri or Proxy-Scheme (once the
    /// server lets such a request through to routing): a forward proxy is a fallback.
    /// It is not listed in `/.well-known/core`.
    pub fn set_fallback(&mut self, resource: MethodRouter) {
        self.fallback = Some(Resource {
            router: resource,
            pattern: None,
        });
        self.reindex();
    }

    /// Runs the handlers of every resource at or below `path` on `executor`, unless a
    /// resource further down chooses another.
    ///
    /// # Panics
    ///
    /// When `path` is not a valid pattern (see [`ResourceTree::try_insert`]).
    pub fn set_executor(&mut self, path: &str, executor: Executor) {
        let segments = pattern::parse(path).unwrap_or_else(|e| panic!("{e}"));
        self.node_mut(&segments).executor = Some(executor);
        self.reindex();
    }

    fn node_mut(&mut self, segments: &[Segment<'_>]) -> &mut Node {
        let mut node = &mut self.root;
        for seg in segments {
            node = node.child_mut(*seg);
        }
        node
    }

    /// The resource at a path (Uri-Path segments), if any.
    pub fn get<'a>(&self, segments: impl Iterator<Item = &'a str>) -> Option<&MethodRouter> {
        let segments: Vec<&str> = segments.collect();
        self.find(segments.iter().copied())
            .or_else(|| self.find_pattern(&segments))
            .map(|(r, _)| &r.router)
    }

    /// The resource at a path and the executor it inherits (nearest ancestor's choice)
    /// in one walk without going back: at each segment the static child, else the
    /// parameter, else the wildcard. When it finds a resource that is the best match
    /// (each step took the best choice there is); when it finds none, a match that
    /// needs to go back may still exist ([`ResourceTree::lookup_slow`]). A static
    /// path is matched without allocating and, in a tree without parameters, exactly
    /// as before there were any.
    fn find<'a>(
        &self,
        segments: impl Iterator<Item = &'a str>,
    ) -> Option<(&Resource, Option<&Executor>)> {
        let mut node = &self.root;
        let mut executor = node.executor.as_ref();
        for seg in segments {
            node = match node.children.get(seg) {
                Some(child) => child,
                None => match node.param.as_deref() {
                    Some(param) if !seg.is_empty() => param,
                    _ => return node.wildcard_match(executor),
                },
            };
            executor = node.executor.as_ref().or(executor);
        }
        match &node.resource {
            Some(r) => Some((r, executor)),
            None => node.wildcard_match(executor),
        }
    }

    /// The resource with exactly the static path `message` asks for (of at most
    /// [`EXACT_SEGMENTS`] segments), and the executor it inherits: what
    /// [`ResourceTree::find`] finds for such a path, with one hash.
    #[inline]
    fn find_exact(&self, message: &Message) -> Option<(&Resource, Option<&Executor>)> {
        let mut segments: [&[u8]; EXACT_SEGMENTS] = [&[]; EXACT_SEGMENTS];
        let mut n = 0;
        for segment in message.options.get_all(opt::URI_PATH) {
            // A longer path is left to the walk.
            *segments.get_mut(n)? = segment;
            n += 1;
        }
        let (resource, executor) = self.exact.get(&segments[..n])?;
        Some((resource, executor.as_ref()))
    }

    /// The resource at the path of `message` (best match), without the fallback.
    #[inline]
    fn find_message(&self, message: &Message) -> Option<(&Resource, Option<&Executor>)> {
        self.find_exact(message)
            .or_else(|| self.find(message.options.uri_path()))
    }

    /// The best route with parameters or a wildcard for `segments`.
    fn find_pattern(&self, segments: &[&str]) -> Option<(&Resource, Option<&Executor>)> {
        if !self.patterns {
            return None;
        }
        self.root.search(segments, None)
    }

    /// The resource for a request that [`ResourceTree::find`] does not match: a route
    /// with parameters reached by going back, or the fallback (running on its own
    /// executor or the root's).
    #[inline(never)]
    fn lookup_slow(&self, message: &Message) -> Option<(&Resource, Option<&Executor>)> {
        with_segments(message, |segments| self.find_pattern(segments)).or_else(|| {
            let fallback = self.fallback.as_ref()?;
            Some((fallback, self.root.executor.as_ref()))
        })
    }

    /// The observe-relation budget and the refusal counters shared by every shard and
    /// listener serving this tree.
    pub(crate) fn budgets(&self) -> Arc<Budgets> {
        self.budgets.clone()
    }

    /// The links of every visible resource, in path order.
    pub fn links(&self) -> &[Link] {
        &self.links
    }

    /// Recomputes what follows from the routes: the discovery links, whether any
    /// route has parameters, the static paths' index and the streamed methods.
    fn reindex(&mut self) {
        self.links = self.collect_links();
        let patterns = self
            .nodes()
            .any(|(_, n)| n.param.is_some() || n.wildcard.is_some());
        self.patterns = patterns;
        self.exact.clear();
        index_static(&self.root, &mut Vec::new(), None, &mut self.exact);
        let resources = self.nodes().filter_map(|(_, n)| n.resource.as_ref());
        self.streamed = resources
            .chain(&self.fallback)
            .flat_map(|r| r.router.streamed_methods())
            .fold(0, |mask, code| mask | method_bit(code));
    }

    /// Every node with the path that reaches it, `None` below a parameter or wildcard.
    fn nodes(&self) -> impl Iterator<Item = (Option<String>, &Node)> {
        let mut stack: Vec<(Option<String>, &Node)> = vec![(Some(String::new()), &self.root)];
        std::iter::from_fn(move || {
            let (path, node) = stack.pop()?;
            for (seg, child) in node.children.iter().rev() {
                stack.push((path.as_ref().map(|p| format!("{p}/{seg}")), child));
            }
            for child in [&node.param, &node.wildcard].into_iter().flatten() {
                stack.push((None, child));
            }
            Some((path, node))
        })
    }

    /// The links of the resources with a concrete path that are not hidden.
    fn collect_links(&self) -> Vec<Link> {
        let mut out = Vec::new();
        for (path, node) in self.nodes() {
            let (Some(path), Some(r)) = (path, &node.resource) else {
                continue;
            };
            let r = &r.router;
            if r.hidden || path.is_empty() {
                continue;
            }
            let mut link = Link::new(&path);
            for (k, v) in &r.attrs {
                link = match v {
                    Some(v) => link.attr(k, v),
                    None => link.flag(k),
                };
            }
            out.push(link);
        }
        out
    }

    /// Every observable attached to a resource in the tree (the fallback included).
    pub(crate) fn observables(&self) -> Vec<Observable> {
        let resources = self.nodes().filter_map(|(_, n)| n.resource.as_ref());
        resources
            .chain(&self.fallback)
            .filter_map(|r| r.router.observable.clone())
            .collect()
    }

    /// The streaming upload handler for this request's path and method, with the
    /// executor it runs on, if the resource has one. For a route with parameters the
    /// handler is wrapped to give each block's request the route's parameters.
    #[inline]
    pub(crate) fn stream_route(&self, req: &Message) -> Option<(BoxedChunkHandler, Executor)> {
        if self.streamed & method_bit(req.code) == 0 {
            return None;
        }
        let (resource, executor) = match self.find_message(req) {
            Some(found) => found,
            None => self.lookup_slow(req)?,
        };
        let h = resource.router.stream_handler(req.code)?;
        let h = match &resource.pattern {
            None => h.clone(),
            Some(pattern) => with_params(h, pattern),
        };
        Some((h, executor.cloned().unwrap_or_default()))
    }

    /// Routes a request: the handler's future, or an immediate 4.04 / 4.05, or the
    /// generated `/.well-known/core`.
    pub fn dispatch(&self, req: Request) -> Result<BoxFuture, Response> {
        self.route(req).map(|r| r.future)
    }

    /// Like [`ResourceTree::dispatch`], also returning the resource's observable handle
    /// when the request is a GET to an observable resource. (An access log is a layer:
    /// [`AccessLog`](super::layers::AccessLog).)
    pub(crate) fn route(&self, mut req: Request) -> Result<Routed, Response> {
        let found = match self.find_message(req.message()) {
            Some(found) if found.0.pattern.is_none() => found,
            // A static route may take the discovery path; a pattern may not.
            _ if is_well_known_core(req.options().uri_path()) => {
                return Err(self.well_known_core(&req))
            }
            Some(found) => found,
            None => match self.lookup_slow(req.message()) {
                Some(found) => found,
                None => return Err(Code::NOT_FOUND.into_response()),
            },
        };
        let (resource, executor) = found;
        let router = &resource.router;
        let observable = match req.method() {
            Code::GET => router.observable.clone(),
            _ => None,
        };
        if let Some(pattern) = &resource.pattern {
            req.set_pattern(pattern.clone());
        }
        match router.handler(req.method()) {
            Some(h) => Ok(Routed {
                future: h(req),
                observable,
                executor: executor.cloned().unwrap_or_default(),
            }),
            None => Err(Code::METHOD_NOT_ALLOWED.into_response()),
        }
    }

    fn well_known_core(&self, req: &Request) -> Response {
        if req.method() != Code::GET {
            return Code::METHOD_NOT_ALLOWED.into_response();
        }
        let selected = link_format::filter_by_query(&self.links, req.query());
        let owned: Vec<Link> = selected.into_iter().cloned().collect();
        Response::content(link_format::encode(&owned).into_bytes())
            .with_content_format(content_format::LINK_FORMAT)
    }
}

/// Puts every resource at or below `node` (reached by the static `path`, inheriting
/// `executor`) whose path is static into `exact`.
fn index_static(
    node: &Node,
    path: &mut Vec<Box<str>>,
    executor: Option<&Executor>,
    exact: &mut ExactPaths<(Resource, Option<Executor>)>,
) {
    let executor = node.executor.as_ref().or(executor);
    if let Some(r) = &node.resource {
        exact.insert(path.clone(), (r.clone(), executor.cloned()));
    }
    for (seg, child) in &node.children {
        path.push(seg.as_str().into());
        index_static(child, path, executor, exact);
        path.pop();
    }
}

/// The bit of a method code in [`ResourceTree::streamed`] (codes above 31 share the
/// top bit: only ever a reason to look).
fn method_bit(code: Code) -> u32 {
    1 << code.0.min(31)
}

/// `h`, giving each block's request the parameters of the route `pattern`.
#[cold]
fn with_params(h: &BoxedChunkHandler, pattern: &Arc<RoutePattern>) -> BoxedChunkHandler {
    let (h, pattern) = (h.clone(), pattern.clone());
    Arc::new(move |mut chunk: UploadChunk| {
        chunk.request.set_pattern(pattern.clone());
        h(chunk)
    })
}

/// Uri-Path segments gathered on the stack to look a path up in the static paths'
/// index; a request with more is matched by walking the tree.
const EXACT_SEGMENTS: usize = 8;

/// Uri-Path segments gathered on the stack to match routes with parameters; a longer
/// path is gathered on the heap.
const INLINE_SEGMENTS: usize = 16;

/// Runs `f` on the Uri-Path segments of `message`, gathered on the stack when there
/// are at most [`INLINE_SEGMENTS`] of them.
fn with_segments<'m, R>(message: &'m Message, f: impl FnOnce(&[&'m str]) -> R) -> R {
    let mut inline: [&str; INLINE_SEGMENTS] = [""; INLINE_SEGMENTS];
    let mut n = 0;
    for seg in message.options.uri_path() {
        if n == INLINE_SEGMENTS {
            let all: Vec<&str> = message.options.uri_path().collect();
            return f(&all);
        }
        inline[n] = seg;
        n += 1;
    }
    f(&inline[..n])
}

/// Whether Uri-Path is the two segments `.well-known` and `core` (RFC 6690 §4); one
/// segment `.well-known/core` is another path (RFC 7252 §6.4 escapes its `/`).
fn is_well_known_core<'a>(mut path: impl Iterator<Item = &'a str>) -> bool {
    path.next() == Some(".well-known") && path.next() == Some("core") && path.next().is_none()
}

#[cfg(test)]
#[path = "tree_tests.rs"]
mod tests;

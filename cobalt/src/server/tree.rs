//! The resource tree: paths to resources, dispatch with 4.04/4.05, and the
//! `/.well-known/core` listing generated from it.

use super::budget::Budgets;
use super::executor::Executor;
use super::handler::{BoxedChunkHandler, MethodRouter};
use super::observe::Observable;
use super::request::BoxFuture;
use super::request::{IntoResponse, Request, Response};
use cobalt_proto::link_format::{self, Link};
use cobalt_proto::message::{content_format, Code};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Path of the discovery resource (RFC 6690 §4).
pub const WELL_KNOWN_CORE: &str = "/.well-known/core";

#[derive(Debug, Default)]
struct Node {
    resource: Option<MethodRouter>,
    executor: Option<Executor>,
    children: BTreeMap<String, Node>,
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

/// Resources by path.
#[derive(Debug, Default)]
pub struct ResourceTree {
    root: Node,
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

    /// Puts a resource at `path` (segments separated by `/`), replacing one already there.
    pub fn insert(&mut self, path: &str, resource: MethodRouter) {
        let node = self.node_mut(path);
        if let Some(e) = &resource.executor {
            node.executor = Some(e.clone());
        }
        node.resource = Some(resource);
        self.links = self.collect_links();
    }

    /// Runs the handlers of every resource at or below `path` on `executor`, unless a
    /// resource further down chooses another.
    pub fn set_executor(&mut self, path: &str, executor: Executor) {
        self.node_mut(path).executor = Some(executor);
    }

    fn node_mut(&mut self, path: &str) -> &mut Node {
        let mut node = &mut self.root;
        for seg in path.split('/').filter(|s| !s.is_empty()) {
            node = node.children.entry(seg.to_string()).or_default();
        }
        node
    }

    /// The resource at a path, if any.
    pub fn get<'a>(&self, segments: impl Iterator<Item = &'a str>) -> Option<&MethodRouter> {
        self.find(segments).map(|(r, _)| r)
    }

    /// The resource at a path and the executor it inherits (nearest ancestor's choice).
    fn find<'a>(
        &self,
        segments: impl Iterator<Item = &'a str>,
    ) -> Option<(&MethodRouter, Option<&Executor>)> {
        let mut node = &self.root;
        let mut executor = node.executor.as_ref();
        for seg in segments {
            node = node.children.get(seg)?;
            executor = node.executor.as_ref().or(executor);
        }
        node.resource.as_ref().map(|r| (r, executor))
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

    fn collect_links(&self) -> Vec<Link> {
        let mut out = Vec::new();
        let mut stack: Vec<(String, &Node)> = vec![(String::new(), &self.root)];
        while let Some((path, node)) = stack.pop() {
            if let Some(r) = &node.resource {
                if !r.hidden && !path.is_empty() {
                    let mut link = Link::new(&path);
                    for (k, v) in &r.attrs {
                        link = match v {
                            Some(v) => link.attr(k, v),
                            None => link.flag(k),
                        };
                    }
                    out.push(link);
                }
            }
            for (seg, child) in node.children.iter().rev() {
                stack.push((format!("{path}/{seg}"), child));
            }
        }
        out
    }

    /// Every observable attached to a resource in the tree.
    pub(crate) fn observables(&self) -> Vec<Observable> {
        let mut out = Vec::new();
        let mut stack = vec![&self.root];
        while let Some(node) = stack.pop() {
            if let Some(o) = node.resource.as_ref().and_then(|r| r.observable.clone()) {
                out.push(o);
            }
            stack.extend(node.children.values());
        }
        out
    }

    /// The streaming upload handler for this request's path and method, with the
    /// executor it runs on, if the resource has one.
    pub(crate) fn stream_route(
        &self,
        req: &cobalt_proto::message::Message,
    ) -> Option<(BoxedChunkHandler, Executor)> {
        let (resource, executor) = self.find(req.options.uri_path())?;
        let h = resource.stream_handler(req.code)?.clone();
        Some((h, executor.cloned().unwrap_or_default()))
    }

    /// Routes a request: the handler's future, or an immediate 4.04 / 4.05, or the
    /// generated `/.well-known/core`.
    pub fn dispatch(&self, req: Request) -> Result<BoxFuture, Response> {
        self.route(req).map(|r| r.future)
    }

    /// Like [`ResourceTree::dispatch`], also returning the resource's observable handle
    /// when the request is a GET to an observable resource.
    ///
    /// With `debug` enabled for the target `cobalt::access` (`cobalt serve --log-level
    /// debug`), every routed request is logged when its answer is ready: peer, method,
    /// path, code and the microseconds from routing to answer. Requests refused before
    /// routing (4.02, 4.29, 5.03, duplicates) are not.
    pub(crate) fn route(&self, req: Request) -> Result<Routed, Response> {
        if !tracing::enabled!(target: "cobalt::access", tracing::Level::DEBUG) {
            return self.route_quietly(req);
        }
        let (peer, method, path) = (req.peer(), req.method(), req.path());
        let started = std::time::Instant::now();
        let log = move |code: Code| {
            let us = started.elapsed().as_micros();
            tracing::debug!(target: "cobalt::access", "{peer} {method} {path} {code} {us}µs");
        };
        match self.route_quietly(req) {
            Ok(mut routed) => {
                let future = routed.future;
                routed.future = Box::pin(async move {
                    let response = future.await;
                    log(response.code);
                    response
                });
                Ok(routed)
            }
            Err(response) => {
                log(response.code);
                Err(response)
            }
        }
    }

    fn route_quietly(&self, req: Request) -> Result<Routed, Response> {
        let found = self.find(req.options().uri_path());
        if found.is_none() && is_well_known_core(req.options().uri_path()) {
            return Err(self.well_known_core(&req));
        }
        let Some((resource, executor)) = found else {
            return Err(Code::NOT_FOUND.into_response());
        };
        let observable = match req.method() {
            Code::GET => resource.observable.clone(),
            _ => None,
        };
        match resource.handler(req.method()) {
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

/// Whether Uri-Path is the two segments `.well-known` and `core` (RFC 6690 §4); one
/// segment `.well-known/core` is another path (RFC 7252 §6.4 escapes its `/`).
fn is_well_known_core<'a>(mut path: impl Iterator<Item = &'a str>) -> bool {
    path.next() == Some(".well-known") && path.next() == Some("core") && path.next().is_none()
}

//! The resource tree: paths to resources, dispatch with 4.04/4.05, and the
//! `/.well-known/core` listing generated from it.

use super::handler::{BoxFuture, MethodRouter};
use super::observe::Observable;
use super::request::{IntoResponse, Request, Response};
use cobalt_proto::link_format::{self, Link};
use cobalt_proto::message::{content_format, Code};
use std::collections::BTreeMap;

/// Path of the discovery resource (RFC 6690 §4).
pub const WELL_KNOWN_CORE: &str = "/.well-known/core";

#[derive(Debug, Default)]
struct Node {
    resource: Option<MethodRouter>,
    children: BTreeMap<String, Node>,
}

/// Resources by path.
#[derive(Debug, Default)]
pub struct ResourceTree {
    root: Node,
    links: Vec<Link>,
}

impl ResourceTree {
    /// An empty tree.
    pub fn new() -> ResourceTree {
        ResourceTree::default()
    }

    /// Puts a resource at `path` (segments separated by `/`), replacing one already there.
    pub fn insert(&mut self, path: &str, resource: MethodRouter) {
        let mut node = &mut self.root;
        for seg in path.split('/').filter(|s| !s.is_empty()) {
            node = node.children.entry(seg.to_string()).or_default();
        }
        node.resource = Some(resource);
        self.links = self.collect_links();
    }

    /// The resource at a path, if any.
    pub fn get<'a>(&self, segments: impl Iterator<Item = &'a str>) -> Option<&MethodRouter> {
        let mut node = &self.root;
        for seg in segments {
            node = node.children.get(seg)?;
        }
        node.resource.as_ref()
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

    /// Routes a request: the handler's future, or an immediate 4.04 / 4.05, or the
    /// generated `/.well-known/core`.
    pub fn dispatch(&self, req: Request) -> Result<BoxFuture, Response> {
        self.route(req).map(|(fut, _)| fut)
    }

    /// Like [`ResourceTree::dispatch`], also returning the resource's observable handle
    /// when the request is a GET to an observable resource.
    pub(crate) fn route(&self, req: Request) -> Result<(BoxFuture, Option<Observable>), Response> {
        let found = self.get(req.options().uri_path());
        if found.is_none() && req.path() == WELL_KNOWN_CORE {
            return Err(self.well_known_core(&req));
        }
        let Some(resource) = found else {
            return Err(Code::NOT_FOUND.into_response());
        };
        let observable = match req.method() {
            Code::GET => resource.observable.clone(),
            _ => None,
        };
        match resource.handler(req.method()) {
            Some(h) => Ok((h(req), observable)),
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

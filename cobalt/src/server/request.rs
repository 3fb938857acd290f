//! What a handler receives ([`Request`]) and returns ([`BoxFuture`] of a
//! [`Response`], or anything [`IntoResponse`]).

use super::extensions::Extensions;
use super::pattern::RoutePattern;
pub use crate::response::{IntoResponse, Response};
use crate::transport::identity::{Credential, PeerIdentity};
use cobalt_proto::message::{Code, Message, Options};
use cobalt_proto::uri::Scheme;
use std::any::Any;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The future a handler returns, boxed: the answer to a request, whenever it is ready.
pub type BoxFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send + 'static>>;

/// The route with parameters that a request matched.
#[derive(Debug, Clone)]
struct Matched {
    /// Where its parameters are in the Uri-Path.
    pattern: Arc<RoutePattern>,
    /// The segments a `{*name}` wildcard took, joined with `/`.
    rest: String,
}

/// A request as a handler sees it.
#[derive(Debug, Clone)]
pub struct Request {
    peer: SocketAddr,
    message: Message,
    pub(crate) client: Option<Arc<crate::Client>>,
    /// Set when the handler asks for the peer (its answer then depends on who asks).
    peer_read: Option<Arc<AtomicBool>>,
    /// The transport it came over.
    scheme: Scheme,
    /// What the peer proved in its DTLS or TLS handshake, shared by the session's
    /// requests.
    credential: Option<Arc<Credential>>,
    /// What layers attached.
    extensions: Extensions,
    /// The route with parameters that matched, if it has any (boxed: a static route's
    /// request carries one pointer for it).
    matched: Option<Box<Matched>>,
    /// The routes (and state) of the server that received it: a
    /// [`Routes`](super::Routes)' shared part, behind `Any` so that requests need not
    /// know the tree they are routed in (see `routes.rs`).
    pub(crate) server: Option<Arc<dyn Any + Send + Sync>>,
}

impl Request {
    /// Wraps a received message.
    pub fn new(peer: SocketAddr, message: Message) -> Request {
        Request {
            peer,
            message,
            client: None,
            peer_read: None,
            scheme: Scheme::Coap,
            credential: None,
            extensions: Extensions::new(),
            matched: None,
            server: None,
        }
    }

    /// Says that the request came over `scheme` from a peer that proved `credential`.
    pub fn with_identity(mut self, scheme: Scheme, credential: Option<Arc<Credential>>) -> Self {
        self.set_identity(scheme, credential);
        self
    }

    /// [`Request::with_identity`] in place.
    #[inline]
    pub(crate) fn set_identity(&mut self, scheme: Scheme, credential: Option<Arc<Credential>>) {
        self.scheme = scheme;
        self.credential = credential;
    }

    /// Who sent it: the transport, the address and, over DTLS or TLS, the PSK
    /// identity or verified certificate subject the peer proved in its handshake
    /// (taken once per session). Reading it reads the peer (see [`Request::peer`]).
    pub fn identity(&self) -> PeerIdentity {
        PeerIdentity::new(self.scheme, self.peer(), self.credential.clone())
    }

    /// The credential the peer proved, without marking the peer as read.
    pub(crate) fn credential(&self) -> Option<&Arc<Credential>> {
        self.credential.as_ref()
    }

    /// Values attached by layers (e.g. a security context id), by type.
    pub fn extensions(&self) -> &Extensions {
        &self.extensions
    }

    /// Values attached by layers, to add or change.
    pub fn extensions_mut(&mut self) -> &mut Extensions {
        &mut self.extensions
    }

    /// The whole message, to change (a layer that rewrites or unwraps requests).
    pub fn message_mut(&mut self) -> &mut Message {
        &mut self.message
    }

    /// A copy without the payload (and without a watch on the peer), for layers'
    /// answer hooks.
    pub(crate) fn head(&self) -> Request {
        let mut message = Message::new(self.message.mtype, self.message.code, self.message.mid);
        message.token = self.message.token.clone();
        message.options = self.message.options.clone();
        Request {
            peer: self.peer,
            message,
            client: None,
            peer_read: None,
            scheme: self.scheme,
            credential: self.credential.clone(),
            extensions: self.extensions.clone(),
            matched: self.matched.clone(),
            server: self.server.clone(),
        }
    }

    /// Records the route with parameters that matched this request (out of line: the
    /// routing of a static path stays small).
    #[inline(never)]
    pub(crate) fn set_pattern(&mut self, pattern: Arc<RoutePattern>) {
        let mut rest = String::new();
        if let Some((_, first)) = pattern.rest() {
            for (i, seg) in self.message.options.uri_path().skip(first).enumerate() {
                if i > 0 {
                    rest.push('/');
                }
                rest.push_str(seg);
            }
        }
        self.matched = Some(Box::new(Matched { pattern, rest }));
    }

    /// The value of the route parameter `name`: the Uri-Path segment that `{name}`
    /// matched, or the segments that `{*name}` matched joined with `/` (`""` for none).
    /// `None` when the route that matched has no parameter so named (a static route
    /// has none).
    ///
    /// ```
    /// # use cobalt::server::{get, Request, Server};
    /// let server = Server::new().route(
    ///     "/rd/{id}/{*rest}",
    ///     get(|req: Request| async move {
    ///         format!("{:?} {:?}", req.param("id"), req.param("rest"))
    ///     }),
    /// );
    /// ```
    pub fn param(&self, name: &str) -> Option<&str> {
        let matched = self.matched.as_deref()?;
        if let Some(i) = matched.pattern.segment_of(name) {
            return self.message.options.uri_path().nth(i);
        }
        match matched.pattern.rest() {
            Some((rest, _)) if rest == name => Some(&matched.rest),
            _ => None,
        }
    }

    /// Every route parameter as `(name, value)`, in path order (the wildcard last).
    pub fn params(&self) -> impl Iterator<Item = (&str, &str)> {
        let matched = self.matched.as_deref();
        let segments = matched.into_iter().flat_map(|m| {
            m.pattern
                .params()
                .filter_map(|(name, i)| Some((name, self.message.options.uri_path().nth(i)?)))
        });
        let rest = matched.and_then(|m| Some((m.pattern.rest()?.0, m.rest.as_str())));
        segments.chain(rest)
    }

    /// Takes the payload out of the request.
    pub(crate) fn take_payload(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.message.payload)
    }

    /// Sets `flag` when the handler asks for [`Request::peer`].
    pub(crate) fn watch_peer(mut self, flag: Arc<AtomicBool>) -> Request {
        self.peer_read = Some(flag);
        self
    }

    /// A client for requests the handler makes. On a UDP listener served by one shard,
    /// its requests go out on that shard's socket, so their responses come back to the
    /// same shard (thesis §8.3); with several shards (or staged workers) the kernel
    /// would hand a response to whichever shard its peer hashes to, so the handlers of
    /// such a listener share one client with a socket of its own. Awaiting its
    /// responses inside the handler resumes on the resource's executor. Outside a
    /// server (a request built by hand) it is a fresh standalone client.
    pub fn client(&self) -> crate::Client {
        self.client.as_deref().cloned().unwrap_or_default()
    }

    /// Who sent it.
    ///
    /// For a notification, a handler that asks this is run for each observer; one that
    /// does not may run once for all observers that registered with the same request
    /// ([`Observable`](super::Observable)).
    pub fn peer(&self) -> SocketAddr {
        if let Some(flag) = &self.peer_read {
            flag.store(true, Ordering::Relaxed);
        }
        self.peer
    }

    /// The method (GET, POST, ...).
    pub fn method(&self) -> Code {
        self.message.code
    }

    /// The path with a leading `/`.
    pub fn path(&self) -> String {
        self.message.options.uri_path_string()
    }

    /// The Uri-Query items.
    pub fn query(&self) -> impl Iterator<Item = &str> {
        self.message.options.uri_query()
    }

    /// The value of `name=value` in the query, if present (`Some("")` for a bare `name`).
    pub fn query_param(&self, name: &str) -> Option<&str> {
        self.query().find_map(|q| match q.split_once('=') {
            Some((k, v)) if k == name => Some(v),
            None if q == name => Some(""),
            _ => None,
        })
    }

    /// The payload bytes.
    pub fn payload(&self) -> &[u8] {
        &self.message.payload
    }

    /// The payload as UTF-8 text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.message.payload).into_owned()
    }

    /// Content-Format of the payload.
    pub fn content_format(&self) -> Option<u16> {
        self.message.options.content_format()
    }

    /// The Accept option.
    pub fn accept(&self) -> Option<u16> {
        self.message.options.accept()
    }

    /// All options.
    pub fn options(&self) -> &Options {
        &self.message.options
    }

    /// The whole message.
    pub fn message(&self) -> &Message {
        &self.message
    }

    /// True if the request was confirmable.
    pub fn is_confirmable(&self) -> bool {
        self.message.mtype == cobalt_proto::message::MessageType::Confirmable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_proto::message::MessageType;

    #[test]
    fn query_params() {
        let mut m = Message::new(MessageType::Confirmable, Code::GET, 1);
        m.options.set_uri_query("a=1&flag");
        let req = Request::new("127.0.0.1:1".parse().unwrap(), m);
        assert_eq!(req.query_param("a"), Some("1"));
        assert_eq!(req.query_param("flag"), Some(""));
        assert_eq!(req.query_param("b"), None);
    }
}

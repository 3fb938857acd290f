//! The [`Layer`] trait (middleware) of both roles, how a server runs its layers, and
//! how a layer is given to a client (which runs it through
//! `client::hooks`).

use super::extensions::Extensions;
use super::handler::MethodRouter;
use super::request::{BoxFuture, Request, Response};
use crate::client::hooks::ClientHooks;
use crate::client::{blocking, Client, Exchange, Refusal};
use crate::transport::identity::{Credential, PeerIdentity};
use cobalt_proto::message::option::HandledOptions;
use cobalt_proto::message::{opt, Message, Token};
use cobalt_proto::uri::Scheme;
use std::net::SocketAddr;
use std::sync::Arc;

/// Middleware of a server, of one resource or of a client: code that sits between
/// the protocol and the resources (or the application that asks). Every method has a
/// default that does nothing, so a layer implements only what it needs, and one type
/// may serve both roles. Implementations must be cheap on the request path: they run
/// on the thread that reads the socket (server) or that awaits the request (client).
///
/// Which hooks each role calls:
///
/// | role | hooks |
/// |------|-------|
/// | server ([`Server::layer`](super::Server::layer)) | [`options`](Layer::options), [`on_request`](Layer::on_request), [`around`](Layer::around), [`on_response`](Layer::on_response), [`on_notification`](Layer::on_notification) |
/// | resource ([`MethodRouter::layer`]) | [`on_request`](Layer::on_request), [`around`](Layer::around), [`on_response`](Layer::on_response) |
/// | client ([`Client::layer`](crate::Client::layer)) | [`on_send`](Layer::on_send), [`on_receive`](Layer::on_receive) |
///
/// A layer of the server ([`Server::layer`](super::Server::layer)) sees every request
/// that reaches routing, its answer, and every notification once per observer; a
/// layer of a resource ([`MethodRouter::layer`]) sees the requests routed to that
/// resource (and the GET runs that produce its notifications).
///
/// Order: the first layer given is the outermost. Requests pass the layers first to
/// last, answers last to first; a layer that answers a request itself stops it there,
/// and only the layers it passed see that answer.
///
/// What a server layer does not see: what the server answers before routing, the same
/// for every resource (a duplicate, 4.02 for an option no layer declared, 4.29/5.03
/// when a budget is full, 5.05 for proxy requests when no layer declared Proxy-Uri,
/// the blocks of an upload before it is complete and Block2 follow-ups of a kept
/// answer), and the Block2 slicing of large answers, which happens after the layers.
///
/// ```
/// use cobalt::server::{get, Layer, Request, Response, Server};
/// use cobalt::Code;
///
/// /// Answers 4.03 to requests without `key=secret` in the query.
/// struct Key;
///
/// impl Layer for Key {
///     fn on_request(&self, request: &mut Request) -> Result<(), Response> {
///         match request.query_param("key") {
///             Some("secret") => Ok(()),
///             _ => Err(Response::new(Code::FORBIDDEN).with_payload("give key=secret")),
///         }
///     }
/// }
///
/// let server = Server::new()
///     .route("/data", get(|| async { "42" }))
///     .layer(Key);
/// ```
pub trait Layer: Send + Sync + 'static {
    /// Option numbers this layer handles that the protocol does not know (e.g. 9,
    /// OSCORE, or a private number). The server collects them from its layers into the
    /// protocol machines' [`HandledOptions`], so that a request carrying one of them
    /// is passed on instead of answered 4.02 Bad Option. Declaring Proxy-Uri (35) or
    /// Proxy-Scheme (39) says the layer handles proxy requests: the server then stops
    /// answering them 5.05 Proxying Not Supported. A client collects them from its
    /// layers likewise: a response or notification carrying an unknown critical
    /// option is rejected ([`Error::BadResponseOption`](crate::Error::BadResponseOption))
    /// unless a layer declares it. The layers of one resource are not asked (the
    /// machines check options before a request is routed).
    fn options(&self) -> &[u16] {
        &[]
    }

    /// Sees (and may change) a request before it is routed; `Err` answers it with
    /// that response instead, and the request goes no further.
    fn on_request(&self, request: &mut Request) -> Result<(), Response> {
        let _ = request;
        Ok(())
    }

    /// Wraps the handler's answer: returns a future that resolves to the response
    /// (e.g. one that gives up after a time, or waits for a permit). `request` is the
    /// request as the handler got it, without its payload.
    fn around(&self, request: &Request, answer: BoxFuture) -> BoxFuture {
        let _ = request;
        answer
    }

    /// Sees (and may change) the answer to a request this layer passed on: the
    /// handler's, a routing error (4.04, 4.05) or an inner layer's. `request` is the
    /// request as it left the layers (with their [`Extensions`]), without its payload.
    fn on_response(&self, request: &Request, response: &mut Response) {
        let _ = (request, response);
    }

    /// Sees (and may change) a notification for one observer before it is sent: once
    /// per observer, even when several share the handler's answer. Only a server's
    /// layers are asked.
    fn on_notification(&self, observer: &Observer<'_>, notification: &mut Response) {
        let _ = (observer, notification);
    }

    /// Client role: sees (and may change) a request before it goes out — every
    /// message the client sends for the application's call: each block of a Block1
    /// upload and each Block2 follow-up, the repeat with an Echo (RFC 9175), each
    /// (re-)registration of an observation and its deregistration by
    /// [`Observation::cancel`](crate::Observation::cancel) (not the one a TCP
    /// connection sends by itself when an observation is dropped). `Err` refuses it:
    /// nothing is sent and the call ends with [`Error::LayerRefused`](crate::Error::LayerRefused)
    /// naming this layer. Requests pass the layers first to last. What the layer keeps
    /// for the answer goes in [`Exchange::extensions_mut`]; the token is not chosen
    /// yet (the protocol machine chooses it as the request goes out).
    fn on_send(&self, exchange: &mut Exchange, request: &mut Message) -> Result<(), Refusal> {
        let _ = (exchange, request);
        Ok(())
    }

    /// Client role: sees (and may change) each response to a request this layer let
    /// out, and each notification of an observation it registered, before the
    /// application (or the client's own block-wise, Echo and observe logic) sees it.
    /// `request` is the request as it left the layers. `Err` refuses the message: the
    /// call (or the observation) ends with [`Error::LayerRefused`](crate::Error::LayerRefused).
    /// Responses pass the layers last to first.
    fn on_receive(
        &self,
        exchange: &mut Exchange,
        request: &Message,
        response: &mut Message,
    ) -> Result<(), Refusal> {
        let _ = (exchange, request, response);
        Ok(())
    }

    /// The layer's name in errors (by default its type's name).
    fn name(&self) -> &'static str {
        std::any::type_name::<Self>()
    }
}

/// The observer a notification goes to, as [`Layer::on_notification`] sees it.
#[derive(Debug)]
pub struct Observer<'a> {
    identity: PeerIdentity,
    token: Token,
    registration: &'a Message,
    extensions: &'a Extensions,
}

impl Observer<'_> {
    /// Who observes (transport, address, credential).
    pub fn identity(&self) -> &PeerIdentity {
        &self.identity
    }

    /// The observer's address.
    pub fn peer(&self) -> SocketAddr {
        self.identity.addr()
    }

    /// The token of the observation.
    pub fn token(&self) -> Token {
        self.token.clone()
    }

    /// The registering request as it left the layers.
    pub fn registration(&self) -> &Message {
        self.registration
    }

    /// What the layers attached to the registering request.
    pub fn extensions(&self) -> &Extensions {
        self.extensions
    }
}

/// What a server keeps of an observer beyond its registration: the credential it
/// proved and the extensions the layers attached (only for observers that have one).
#[derive(Debug, Default, Clone)]
pub(crate) struct ObserverExtras {
    /// What the observer proved in its DTLS or TLS handshake.
    pub credential: Option<Arc<Credential>>,
    /// What the layers attached to its registration.
    pub extensions: Extensions,
}

impl ObserverExtras {
    /// What a request from a peer that proved `credential` carries beyond its
    /// message when no layer attached anything.
    #[inline]
    pub(crate) fn of_credential(credential: Option<&Arc<Credential>>) -> Option<ObserverExtras> {
        credential.map(|c| ObserverExtras {
            credential: Some(c.clone()),
            extensions: Extensions::new(),
        })
    }

    /// What `request` carries beyond its message, if anything.
    pub(crate) fn of(request: &Request) -> Option<ObserverExtras> {
        let credential = request.credential().cloned();
        let extensions = request.extensions();
        (credential.is_some() || !extensions.is_empty()).then(|| ObserverExtras {
            credential,
            extensions: extensions.clone(),
        })
    }
}

/// What the roles of one listener share beyond the resources: the server's layers and
/// the transport.
#[derive(Clone, Debug)]
pub(crate) struct Front {
    /// The server's layers, outermost first.
    pub layers: Layers,
    /// The transport served.
    pub scheme: Scheme,
}

impl Front {
    /// A front without layers over `scheme`.
    #[cfg(test)]
    pub(crate) fn plain(scheme: Scheme) -> Front {
        Front {
            layers: Layers::default(),
            scheme,
        }
    }
}

/// The layers of a server, outermost first. Cheap to clone.
#[derive(Clone, Default)]
pub(crate) struct Layers(Arc<[Arc<dyn Layer>]>);

impl std::fmt::Debug for Layers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Layers({})", self.0.len())
    }
}

/// A request that passed (some of) the layers: what their answer hooks need.
pub(crate) struct Passed {
    /// The request as it left the layers, without its payload.
    head: Request,
    /// How many layers it passed (all, or up to the one that answered it).
    count: usize,
}

impl Layers {
    /// Adds `layer` inside the others (while a server is built).
    pub(crate) fn push(&mut self, layer: Arc<dyn Layer>) {
        let mut all = self.0.to_vec();
        all.push(layer);
        self.0 = all.into();
    }

    /// Whether there are none (then the server does nothing more per request).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The option numbers the layers declare.
    pub(crate) fn handled_options(&self) -> HandledOptions {
        HandledOptions::new(self.0.iter().flat_map(|l| l.options().iter().copied()))
    }

    /// Whether a layer declares that it handles proxy requests (Proxy-Uri or
    /// Proxy-Scheme among its options).
    pub(crate) fn proxies(&self) -> bool {
        self.0.iter().any(|l| {
            l.options()
                .iter()
                .any(|n| *n == opt::PROXY_URI || *n == opt::PROXY_SCHEME)
        })
    }

    /// Runs the request hooks, first to last: what the answer hooks need, and the
    /// answer of a layer that stopped the request, if one did.
    pub(crate) fn enter(&self, request: &mut Request) -> (Passed, Option<Response>) {
        for (i, layer) in self.0.iter().enumerate() {
            if let Err(answer) = layer.on_request(request) {
                let passed = Passed {
                    head: request.head(),
                    count: i,
                };
                return (passed, Some(answer));
            }
        }
        let passed = Passed {
            head: request.head(),
            count: self.0.len(),
        };
        (passed, None)
    }

    /// Wraps a handler's answer in every layer's [`Layer::around`], the outermost last
    /// (so it runs first).
    pub(crate) fn wrap(&self, passed: &Passed, mut answer: BoxFuture) -> BoxFuture {
        for layer in self.0[..passed.count].iter().rev() {
            answer = layer.around(&passed.head, answer);
        }
        answer
    }

    /// Runs the answer hooks of the layers the request passed, last to first.
    pub(crate) fn leave(&self, passed: &Passed, response: &mut Response) {
        for layer in self.0[..passed.count].iter().rev() {
            layer.on_response(&passed.head, response);
        }
    }

    /// Runs every layer's notification hook for the observer `key` (over `scheme`)
    /// with what was kept of its registration.
    pub(crate) fn notify(
        &self,
        scheme: Scheme,
        key: (SocketAddr, Token),
        registration: &Message,
        extras: Option<&ObserverExtras>,
        notification: &mut Response,
    ) {
        let none = Extensions::default();
        let observer = Observer {
            identity: PeerIdentity::new(scheme, key.0, extras.and_then(|e| e.credential.clone())),
            token: key.1,
            registration,
            extensions: extras.map_or(&none, |e| &e.extensions),
        };
        for layer in self.0.iter().rev() {
            layer.on_notification(&observer, notification);
        }
    }
}

/// What a client calls of a layer: its client hooks.
impl<L: Layer> ClientHooks for L {
    fn options(&self) -> &[u16] {
        Layer::options(self)
    }

    fn on_send(&self, exchange: &mut Exchange, request: &mut Message) -> Result<(), Refusal> {
        Layer::on_send(self, exchange, request)
    }

    fn on_receive(
        &self,
        exchange: &mut Exchange,
        request: &Message,
        response: &mut Message,
    ) -> Result<(), Refusal> {
        Layer::on_receive(self, exchange, request, response)
    }

    fn name(&self) -> &'static str {
        Layer::name(self)
    }
}

impl Client {
    /// This client with `layer` inside the layers it has (the first given is the
    /// outermost): every message sent for a request or an observation passes the
    /// layer's [`Layer::on_send`] and every response and notification its
    /// [`Layer::on_receive`] (see [`Layer`] for which hooks a client calls); answers
    /// may carry the options it declares ([`Layer::options`]). Clones of the result
    /// share its layers; clones made before keep theirs (and all share sockets and
    /// connections). A client without layers does nothing more per request.
    ///
    /// ```
    /// use cobalt::proto::message::Message;
    /// use cobalt::server::{Exchange, Layer, Refusal};
    ///
    /// /// Refuses to send requests with a payload over 64 bytes.
    /// struct SmallRequests;
    ///
    /// impl Layer for SmallRequests {
    ///     fn on_send(&self, _: &mut Exchange, request: &mut Message) -> Result<(), Refusal> {
    ///         if request.payload.len() > 64 {
    ///             return Err(Refusal::new("payload over 64 bytes; send less"));
    ///         }
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let client = cobalt::Client::new().layer(SmallRequests);
    /// ```
    pub fn layer<L: Layer>(self, layer: L) -> Client {
        self.with_layer(Arc::new(layer))
    }
}

impl blocking::Client {
    /// This client with `layer` inside the layers it has, like
    /// [`Client::layer`] (the first given is the outermost).
    pub fn layer<L: Layer>(self, layer: L) -> blocking::Client {
        self.map_async(|client| client.layer(layer))
    }
}

impl MethodRouter {
    /// Puts `layer` around this resource's handlers (every method, streamed uploads
    /// included); the first layer given is the outermost. Its request hook runs after
    /// routing, so it sees only this resource's requests. Its
    /// [`options`](Layer::options) and [`on_notification`](Layer::on_notification) are
    /// not used: give such a layer to the server.
    ///
    /// ```
    /// use cobalt::server::{get, Layer, Request, Response};
    ///
    /// struct Tag;
    /// impl Layer for Tag {
    ///     fn on_response(&self, _: &Request, response: &mut Response) {
    ///         response.payload.extend_from_slice(b" (tagged)");
    ///     }
    /// }
    /// let resource = get(|| async { "hello" }).layer(Tag);
    /// ```
    pub fn layer<L: Layer>(mut self, layer: L) -> MethodRouter {
        let layer: Arc<dyn Layer> = Arc::new(layer);
        self.wrap_handlers(
            |handler| layered(&layer, handler, |request| request),
            |handler| layered(&layer, handler, |chunk| &mut chunk.request),
        );
        self
    }
}

/// `handler` behind `layer`: the request that `request_of` finds in the handler's
/// input passes the layer's request hook, the handler's answer its wrapper and its
/// answer hook.
fn layered<T: 'static>(
    layer: &Arc<dyn Layer>,
    handler: Arc<dyn Fn(T) -> BoxFuture + Send + Sync>,
    request_of: fn(&mut T) -> &mut Request,
) -> Arc<dyn Fn(T) -> BoxFuture + Send + Sync> {
    let layer = layer.clone();
    Arc::new(move |mut input: T| {
        let request = request_of(&mut input);
        if let Err(answer) = layer.on_request(request) {
            return Box::pin(std::future::ready(answer));
        }
        let head = request.head();
        let answer = layer.around(&head, handler(input));
        let layer = layer.clone();
        Box::pin(async move {
            let mut response = answer.await;
            layer.on_response(&head, &mut response);
            response
        })
    })
}

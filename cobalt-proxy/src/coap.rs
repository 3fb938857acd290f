//! The CoAP front: a forward proxy (Proxy-Uri, or Proxy-Scheme with the Uri-*
//! options) as the server's fallback, reverse routes as routes under their prefixes,
//! and a layer that lets proxy requests through the server's validation and gives each
//! a canonical Proxy-Uri. Block-wise transfers on the downstream side are the server's
//! (Block1 reassembled before the handler, Block2 cut from the whole answer); on the
//! upstream side the client's.

use crate::core::{Proxy, ProxyError, ReverseRoute, Upstream};
use crate::hop::{next_hop_limit, HOP_LIMIT};
use crate::http_origin::{http_target, HttpTarget};
use crate::target::{forward_target, is_proxy_request, reverse_target, uri_string, Refused};
use cobalt::proto::message::option::{is_unsafe, option_def};
use cobalt::proto::message::{opt, Code, Options};
use cobalt::proto::uri::CoapUri;
use cobalt::server::{any, Layer, MethodRouter, Observable, Request, Response, Server};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// The forward target a proxy request names, parsed by the front's layer.
#[derive(Debug, Clone)]
struct ForwardTarget(CoapUri);

/// The `http` origin a proxy request names (CoAP → HTTP), parsed by the front's layer.
#[derive(Debug, Clone)]
struct HttpForward(HttpTarget);

/// Who registered an observation (read by the layer, so that producing a
/// notification does not depend on the observer: the server then produces it once
/// for all observers of the same target).
#[derive(Debug, Clone, Copy)]
struct Registrant(SocketAddr);

/// The CoAP front of a [`Proxy`]: [`CoapFront::install`] puts it on a server.
///
/// ```no_run
/// use cobalt_proxy::{AllowList, CoapFront, Proxy, ProxyConfig};
/// # async fn run() -> cobalt::Result<()> {
/// let config = ProxyConfig {
///     allow: AllowList::parse(["10.0.0.0/8:5683"]).unwrap(),
///     ..ProxyConfig::default()
/// };
/// let front = CoapFront::new(Proxy::new(config));
/// let server = front.install(cobalt::Server::new()).bind("[::]:5683").await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct CoapFront {
    proxy: Proxy,
    /// The one observable of every proxied resource: changed for the observers of a
    /// target when its upstream observation notifies.
    observable: Observable,
}

impl CoapFront {
    /// A front for `proxy`.
    pub fn new(proxy: Proxy) -> CoapFront {
        CoapFront {
            proxy,
            observable: Observable::new(),
        }
    }

    /// The proxy behind this front.
    pub fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    /// `server` with this front: its layer (declaring Proxy-Uri, Proxy-Scheme and
    /// Hop-Limit), the forward proxy as fallback, and a route `PREFIX/{*rest}` per
    /// reverse route of the configuration. A forward-proxy request is routed as a
    /// request for `/`, so the server should have no route of its own at `/`.
    pub fn install(&self, server: Server) -> Server {
        let mut server = server
            .layer(ProxyLayer {
                proxy: self.proxy.clone(),
            })
            .fallback(self.resource(None));
        for route in &self.proxy.config().reverse {
            let path = format!("{}/{{*rest}}", route.prefix.trim_end_matches('/'));
            server = server.route(&path, self.resource(Some(Arc::new(route.clone()))));
        }
        server
    }

    /// The resource that proxies every method: forward requests, or those under
    /// `reverse`'s prefix.
    fn resource(&self, reverse: Option<Arc<ReverseRoute>>) -> MethodRouter {
        let front = self.clone();
        any(move |req: Request| {
            let front = front.clone();
            let reverse = reverse.clone();
            async move { front.answer(reverse.as_deref(), req).await }
        })
        .observable(&self.observable)
        .hidden()
    }

    async fn answer(&self, reverse: Option<&ReverseRoute>, req: Request) -> Response {
        let metrics = self.proxy.metrics();
        metrics.coap_requests.fetch_add(1, Relaxed);
        let http = match req.extensions().get::<HttpForward>() {
            Some(HttpForward(target)) => Some(target.clone()),
            None => http_target(req.options()).and_then(Result::ok),
        };
        if let Some(target) = &http {
            let hop = next_hop_limit(req.options(), &self.proxy.config().identity);
            if let Err(refused) = hop {
                metrics.refused.fetch_add(1, Relaxed);
                return refused.into_response();
            }
            return self
                .proxy
                .forward_http(req.method(), target, req.options(), req.payload().to_vec())
                .await
                .unwrap_or_else(|e| e.to_response());
        }
        match self.upstream(reverse, &req) {
            Ok(up) => self.send(up, &req).await,
            Err(refused) => {
                metrics.refused.fetch_add(1, Relaxed);
                refused.into_response()
            }
        }
    }

    /// What to send upstream for `req`.
    fn upstream(&self, reverse: Option<&ReverseRoute>, req: &Request) -> Result<Upstream, Refused> {
        let options = req.options();
        // The layer's parse, or (producing a notification for an observer whose
        // registration's extensions the server has not kept yet) the canonical
        // Proxy-Uri the layer left in the message.
        let forward = match req.extensions().get::<ForwardTarget>() {
            Some(ForwardTarget(target)) => Some(target.clone()),
            None if is_proxy_request(options) => Some(forward_target(options)?),
            None => None,
        };
        let (target, is_reverse) = match (forward, reverse) {
            (Some(target), _) => (target, false),
            (None, Some(route)) => {
                let skip = route.prefix.split('/').filter(|s| !s.is_empty()).count();
                let rest: Vec<&str> = options.uri_path().skip(skip).collect();
                let query: Vec<&str> = options.uri_query().collect();
                (reverse_target(&route.origin, &rest, &query), true)
            }
            (None, None) => {
                return Err(Refused::new(
                    Code::NOT_FOUND,
                    "nothing here: this is a proxy; name the origin in Proxy-Uri (or Proxy-Scheme and Uri-Host)",
                ))
            }
        };
        let hop_limit = next_hop_limit(options, &self.proxy.config().identity)?;
        Ok(Upstream {
            method: req.method(),
            target,
            options: options.clone(),
            payload: req.payload().to_vec(),
            hop_limit,
            reverse: is_reverse,
        })
    }

    async fn send(&self, up: Upstream, req: &Request) -> Response {
        let registers = req.method() == Code::GET && req.options().observe() == Some(0);
        let result = if registers {
            self.observe(up, req).await
        } else {
            self.proxy.forward(up).await
        };
        result.unwrap_or_else(|e| e.to_response())
    }

    /// Answers an observe registration (or produces a notification for the observers
    /// of a target) from the shared upstream observation.
    async fn observe(&self, up: Upstream, req: &Request) -> Result<Response, ProxyError> {
        // Read by the layer, so that producing a notification does not read the peer
        // (which would make the server produce it for each observer); read here only
        // where the server has not kept the registration's extensions yet.
        let registrant = match req.extensions().get::<Registrant>() {
            Some(Registrant(peer)) => *peer,
            None => req.peer(),
        };
        let wait = self.proxy.config().upstream_timeout + Duration::from_secs(1);
        let shared = self.proxy.join(up, Some((registrant, &self.observable)))?;
        let mut latest = shared.subscribe();
        match tokio::time::timeout(wait, latest.wait_for(Option::is_some)).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) | Err(_) => {
                return Err(ProxyError::Timeout(
                    "the origin did not answer the observation".into(),
                ))
            }
        }
        drop(latest);
        shared
            .latest_for_coap()
            .ok_or_else(|| ProxyError::Unreachable("the observation ended".into()))
    }
}

/// The front's server layer: declares the proxy options, parses the forward target
/// of a proxy request (refusing bad ones before routing) and rewrites the request to
/// name it in one canonical Proxy-Uri (so that it routes to the fallback, and
/// observers of the same target share one notification whatever form they used).
struct ProxyLayer {
    proxy: Proxy,
}

impl Layer for ProxyLayer {
    fn options(&self) -> &[u16] {
        &[opt::PROXY_URI, opt::PROXY_SCHEME, HOP_LIMIT]
    }

    fn on_request(&self, request: &mut Request) -> Result<(), Response> {
        if request.options().contains(opt::OBSERVE) {
            let peer = request.peer();
            request.extensions_mut().insert(Registrant(peer));
        }
        if !is_proxy_request(request.options()) {
            return Ok(());
        }
        let refuse = |r: Refused| {
            self.proxy.metrics().refused.fetch_add(1, Relaxed);
            r.into_response()
        };
        if let Some(http) = http_target(request.options()) {
            let target = http.map_err(refuse)?;
            let options = &mut request.message_mut().options;
            for number in [
                opt::URI_HOST,
                opt::URI_PORT,
                opt::URI_PATH,
                opt::URI_QUERY,
                opt::PROXY_SCHEME,
            ] {
                options.remove(number);
            }
            options.set(opt::PROXY_URI, target.uri().as_bytes());
            request.extensions_mut().insert(HttpForward(target));
            return Ok(());
        }
        let target = forward_target(request.options()).map_err(refuse)?;
        if let Some(unsafe_option) = unknown_unsafe(request.options()) {
            // RFC 7252 §5.7.1: an unsafe option the proxy does not understand.
            return Err(refuse(Refused::new(
                Code::BAD_GATEWAY,
                format!("option {unsafe_option} is unsafe to forward and unknown to this proxy"),
            )));
        }
        let options = &mut request.message_mut().options;
        for number in [
            opt::URI_HOST,
            opt::URI_PORT,
            opt::URI_PATH,
            opt::URI_QUERY,
            opt::PROXY_SCHEME,
        ] {
            options.remove(number);
        }
        options.set(opt::PROXY_URI, uri_string(&target).as_bytes());
        request.extensions_mut().insert(ForwardTarget(target));
        Ok(())
    }

    fn name(&self) -> &'static str {
        "cobalt-proxy"
    }
}

/// The first option in `options` that is unsafe to forward and unknown here.
fn unknown_unsafe(options: &Options) -> Option<u16> {
    options
        .iter()
        .map(|o| o.number)
        .find(|n| option_def(*n).is_none() && is_unsafe(*n) && *n != HOP_LIMIT)
}

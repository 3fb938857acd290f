//! The HTTP front (RFC 8075): HTTP/1.1 and HTTP/2 (cleartext, prior knowledge) on
//! hyper. `GET /hc/coap://host/path?q` (the default template `/hc/{+tu}`) or
//! `GET /hc?target_uri=coap%3A%2F%2Fhost%2Fpath` asks the CoAP origin through the
//! same [`Proxy`] (allow-list, cache, upstream client) as the CoAP front; whole bodies
//! both ways (the client does the block-wise transfers); an observation as
//! Server-Sent Events when the client accepts `text/event-stream`.
//!
//! Bounds: request bodies up to [`HttpConfig::max_body`] (413 beyond), headers within
//! [`HttpConfig::header_timeout`] and bodies within [`HttpConfig::body_timeout`] (a
//! slow client loses its connection, 408), at most [`HttpConfig::max_connections`]
//! connections, [`HttpConfig::max_connections_per_ip`] from one address (more are
//! closed at once) and [`HttpConfig::max_streams`] concurrent
//! streams per HTTP/2 connection. Message framing is hyper's, which refuses what
//! request smuggling relies on (conflicting Content-Length values, Content-Length with
//! Transfer-Encoding handled as chunked only).

use crate::core::{Proxy, ProxyError, Upstream};
use crate::hop::next_hop_limit;
use crate::mapping::{coap_etag, coap_method, content_format, http_etag, http_status, media_type};
use crate::target::uri_string;
use bytes::Bytes;
use cobalt::proto::message::{opt, Code, Options};
use cobalt::proto::uri::CoapUri;
use cobalt::Response;
use http_body_util::channel::Channel;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// A response body: whole, or a stream of events.
type Body = UnsyncBoxBody<Bytes, Infallible>;

/// The HTTP front's settings.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// The path the target URI follows (`/hc/` gives `/hc/coap://host/path`); the
    /// same path without its last `/` takes `?target_uri=`.
    pub prefix: String,
    /// Largest request body.
    pub max_body: usize,
    /// Time a client has to send a request's headers (and between requests on a
    /// kept-alive connection).
    pub header_timeout: Duration,
    /// Time a client has to send a request's body.
    pub body_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections open at once from one IP address (so that one client cannot take
    /// them all).
    pub max_connections_per_ip: usize,
    /// Concurrent streams per HTTP/2 connection.
    pub max_streams: u32,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            prefix: "/hc/".into(),
            max_body: 1 << 20,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 1024,
            max_connections_per_ip: 256,
            max_streams: 64,
        }
    }
}

/// The HTTP front of a [`Proxy`].
///
/// ```no_run
/// use cobalt_proxy::{AllowList, HttpConfig, HttpFront, Proxy, ProxyConfig};
/// # async fn run() -> std::io::Result<()> {
/// let proxy = Proxy::new(ProxyConfig {
///     allow: AllowList::parse(["127.0.0.1"]).unwrap(),
///     ..ProxyConfig::default()
/// });
/// let http = HttpFront::new(proxy, HttpConfig::default())
///     .bind("127.0.0.1:8080".parse().unwrap())
///     .await?;
/// println!("curl http://{}/hc/coap://127.0.0.1/hello", http.local_addr());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct HttpFront {
    proxy: Proxy,
    config: Arc<HttpConfig>,
}

/// A running HTTP front; stops accepting when dropped.
#[derive(Debug)]
pub struct HttpServer {
    local_addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl HttpServer {
    /// The bound address (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A request the front answers itself, before any origin: a status and what to do.
#[derive(Debug)]
struct Rejection(u16, String);

fn reject(status: u16, text: impl Into<String>) -> Rejection {
    Rejection(status, text.into())
}

impl From<Rejection> for hyper::Response<Body> {
    fn from(r: Rejection) -> Self {
        plain(r.0, r.1)
    }
}

/// An answer the front makes itself: a status and a text body.
fn plain(status: u16, text: impl Into<String>) -> hyper::Response<Body> {
    let mut r = hyper::Response::new(full(Bytes::from(text.into())));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn full(bytes: Bytes) -> Body {
    Full::new(bytes).boxed_unsync()
}

impl HttpFront {
    /// A front for `proxy` with `config`.
    pub fn new(proxy: Proxy, config: HttpConfig) -> HttpFront {
        HttpFront {
            proxy,
            config: Arc::new(config),
        }
    }

    /// Listens on `addr` and serves in a task of the current runtime.
    pub async fn bind(self, addr: SocketAddr) -> std::io::Result<HttpServer> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        tracing::info!(%local_addr, prefix = %self.config.prefix, "HTTP front listening");
        let task = tokio::spawn(self.serve(listener));
        Ok(HttpServer { local_addr, task })
    }

    /// Serves the connections `listener` accepts, until the task is dropped.
    pub async fn serve(self, listener: TcpListener) {
        let connections = Arc::new(Semaphore::new(self.config.max_connections.max(1)));
        let per_ip: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.config.header_timeout)
            .max_headers(64);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(self.config.max_streams)
            .max_header_list_size(16 * 1024)
            .keep_alive_interval(Some(self.config.header_timeout))
            .keep_alive_timeout(self.config.header_timeout);
        let builder = Arc::new(builder);
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::debug!(error = %e, "HTTP front: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = connections.clone().try_acquire_owned() else {
                tracing::debug!(%peer, "HTTP front: connection limit reached, closing");
                continue;
            };
            let Some(held) = PerIp::take(&per_ip, peer.ip(), self.config.max_connections_per_ip)
            else {
                tracing::debug!(%peer, "HTTP front: connection limit of the address reached, closing");
                continue;
            };
            let front = self.clone();
            let builder = builder.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let front = front.clone();
                    async move { Ok::<_, Infallible>(front.answer(req).await) }
                });
                if let Err(e) = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(%peer, error = %e, "HTTP connection ended");
                }
                drop((permit, held));
            });
        }
    }

    /// The answer to one HTTP request.
    async fn answer(&self, req: hyper::Request<Incoming>) -> hyper::Response<Body> {
        self.proxy.metrics().http_requests.fetch_add(1, Relaxed);
        let target = match self.target(req.uri()) {
            Ok(t) => t,
            Err(rejection) => return rejection.into(),
        };
        let Some(method) = coap_method(req.method().as_str()) else {
            return plain(
                501,
                format!(
                    "{} cannot be mapped to CoAP (GET, POST, PUT, DELETE, FETCH, PATCH)",
                    req.method()
                ),
            );
        };
        let (parts, body) = req.into_parts();
        let (options, conditional) = match request_options(&parts.headers, method) {
            Ok(o) => o,
            Err(rejection) => return rejection.into(),
        };
        let limited = Limited::new(body, self.config.max_body);
        let payload = match tokio::time::timeout(self.config.body_timeout, limited.collect()).await
        {
            Err(_) => return plain(408, "the request body did not arrive in time"),
            Ok(Err(e))
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some() =>
            {
                return plain(
                    413,
                    format!(
                        "request bodies are limited to {} bytes",
                        self.config.max_body
                    ),
                )
            }
            Ok(Err(e)) => return plain(400, format!("bad request body: {e}")),
            Ok(Ok(collected)) => collected.to_bytes(),
        };
        let hop_limit = match next_hop_limit(&Options::new(), &self.proxy.config().identity) {
            Ok(h) => h,
            Err(r) => return plain(508, r.reason),
        };
        let up = Upstream {
            method,
            target,
            options,
            payload: payload.to_vec(),
            hop_limit,
            reverse: false,
        };
        if method == Code::GET && accepts_event_stream(&parts.headers) {
            return self.events(up).await;
        }
        let prefix = self.config.prefix.clone();
        let target = up.target.clone();
        match self.proxy.forward(up).await {
            Ok(response) => http_response(response, conditional, &prefix, &target),
            Err(e) => error_response(&e),
        }
    }

    /// The CoAP target of an HTTP request URI (`/hc/{+tu}` or `/hc?target_uri=`).
    fn target(&self, uri: &hyper::Uri) -> Result<CoapUri, Rejection> {
        let prefix = &self.config.prefix;
        let path = uri.path();
        let text = if let Some(rest) = path.strip_prefix(prefix.as_str()).filter(|r| !r.is_empty())
        {
            match uri.query() {
                Some(q) => format!("{rest}?{q}"),
                None => rest.to_string(),
            }
        } else if path == prefix.trim_end_matches('/') || path == prefix {
            let found = uri
                .query()
                .unwrap_or_default()
                .split('&')
                .find_map(|kv| kv.strip_prefix("target_uri="));
            match found.map(percent_decode) {
                Some(Some(t)) => t,
                Some(None) => return Err(reject(400, "target_uri is not percent-encoded UTF-8")),
                None => return Err(reject(400, format!("name the CoAP target: {prefix}coap://host/path or {}?target_uri=coap%3A%2F%2Fhost%2Fpath", prefix.trim_end_matches('/')))),
            }
        } else {
            return Err(reject(
                404,
                format!("this is an HTTP-to-CoAP proxy: ask for {prefix}coap://host/path"),
            ));
        };
        if !text.contains("://") {
            return Err(reject(400, format!("'{text}' is not an absolute CoAP URI")));
        }
        CoapUri::parse(&text).map_err(|e| {
            let scheme = text.split_once("://").map_or("", |(s, _)| s);
            if scheme.parse::<cobalt::Scheme>().is_err() {
                reject(400, format!("scheme '{scheme}' is not a CoAP scheme (coap, coaps, coap+tcp, coaps+tcp, coap+ws, coaps+ws)"))
            } else {
                reject(400, e.to_string())
            }
        })
    }

    /// An observation as Server-Sent Events: one event per notification (its payload
    /// as text, one `data:` line per line), `event: error` with the code when the
    /// observation fails, and the end of the stream when the origin ends it.
    ///
    /// The first answer decides the status: a failure (the origin refused, is
    /// unreachable or silent, or is not allowed) is answered with its HTTP status
    /// instead of a stream.
    async fn events(&self, up: Upstream) -> hyper::Response<Body> {
        let prefix = self.config.prefix.clone();
        let target = up.target.clone();
        let shared = match self.proxy.join(up, None) {
            Ok(s) => s,
            Err(e) => return error_response(&e),
        };
        let mut latest = shared.subscribe();
        drop(shared);
        let wait = self.proxy.config().upstream_timeout + Duration::from_secs(1);
        let first = match tokio::time::timeout(wait, latest.wait_for(Option::is_some)).await {
            Ok(Ok(first)) => first.clone(),
            Ok(Err(_)) | Err(_) => {
                let silent =
                    ProxyError::Timeout("the origin did not answer the observation".into());
                return error_response(&silent);
            }
        };
        if let Some(failure) = first.filter(|r| !r.code.is_success()) {
            return http_response(failure, false, &prefix, &target);
        }
        let (mut tx, body) = Channel::<Bytes, Infallible>::new(4);
        tokio::spawn(async move {
            let mut id = 0u64;
            loop {
                let current = latest.borrow_and_update().clone();
                if let Some(response) = current {
                    id += 1;
                    let ends = !response.code.is_success();
                    if tx.send_data(sse_event(id, &response)).await.is_err() || ends {
                        return; // the client left, or the observation failed
                    }
                }
                if latest.changed().await.is_err() {
                    let _ = tx
                        .send_data(Bytes::from_static(
                            b"event: end\ndata: the observation ended\n\n",
                        ))
                        .await;
                    return;
                }
            }
        });
        let mut r = hyper::Response::new(body.boxed_unsync());
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        r
    }
}

/// One connection counted against its address's share; given back when dropped.
struct PerIp {
    table: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl PerIp {
    /// Counts a connection from `ip`, unless it has `max` open already.
    fn take(table: &Arc<Mutex<HashMap<IpAddr, usize>>>, ip: IpAddr, max: usize) -> Option<PerIp> {
        let mut open = table.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(ip).or_insert(0);
        if *count >= max.max(1) {
            return None;
        }
        *count += 1;
        Some(PerIp {
            table: table.clone(),
            ip,
        })
    }
}

impl Drop for PerIp {
    fn drop(&mut self) {
        let mut open = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Whether the client asks for an event stream (an observation).
fn accepts_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|m| {
            m.split(';')
                .next()
                .is_some_and(|e| e.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}

/// One Server-Sent Event for a notification.
fn sse_event(id: u64, response: &Response) -> Bytes {
    let mut s = format!("id: {id}\n");
    if !response.code.is_success() {
        let _ = writeln!(s, "event: error\ndata: {}", response.code);
    }
    for line in String::from_utf8_lossy(&response.payload).lines() {
        let _ = writeln!(s, "data: {line}");
    }
    if response.payload.is_empty() && response.code.is_success() {
        s.push_str("data:\n");
    }
    s.push('\n');
    Bytes::from(s)
}

/// The CoAP options of an HTTP request's headers, and whether it carries validators
/// (If-None-Match with entity tags: a 2.03 answer is then 304).
fn request_options(headers: &HeaderMap, method: Code) -> Result<(Options, bool), Rejection> {
    let mut options = Options::new();
    let text = |name: &header::HeaderName| -> Result<Option<&str>, Rejection> {
        headers
            .get(name)
            .map(|v| {
                v.to_str()
                    .map_err(|_| reject(400, format!("{name} is not ASCII")))
            })
            .transpose()
    };
    if let Some(ct) = text(&header::CONTENT_TYPE)? {
        let cf = content_format(ct).ok_or_else(|| {
            reject(
                415,
                format!("no CoAP Content-Format for '{ct}' (use application/coap-payload; cf=N)"),
            )
        })?;
        options.set_uint(opt::CONTENT_FORMAT, u32::from(cf));
    }
    if let Some(accept) = text(&header::ACCEPT)? {
        if let Some(cf) = accept
            .split(',')
            .find_map(|m| content_format(m.split(";q=").next().unwrap_or(m)))
        {
            options.set_uint(opt::ACCEPT, u32::from(cf));
        }
    }
    if let Some(tags) = text(&header::IF_MATCH)? {
        for tag in tags.split(',').map(str::trim) {
            if tag == "*" {
                options.push(opt::IF_MATCH, []);
            } else {
                let etag = coap_etag(tag).ok_or_else(|| {
                    reject(
                        412,
                        format!("If-Match {tag} is no entity tag of this proxy"),
                    )
                })?;
                options.push(opt::IF_MATCH, etag);
            }
        }
    }
    let mut conditional = false;
    if let Some(tags) = text(&header::IF_NONE_MATCH)? {
        if tags.trim() == "*" {
            options.push(opt::IF_NONE_MATCH, []);
        } else if method == Code::GET || method == Code::FETCH {
            for etag in tags.split(',').filter_map(coap_etag) {
                options.push(opt::ETAG, etag);
                conditional = true;
            }
        }
    }
    Ok((options, conditional))
}

/// The HTTP answer for a CoAP `response` to a request for `target`.
fn http_response(
    response: Response,
    conditional: bool,
    prefix: &str,
    target: &CoapUri,
) -> hyper::Response<Body> {
    let status = http_status(response.code, !response.payload.is_empty(), conditional);
    let o = &response.options;
    let mut headers = HeaderMap::new();
    let media = match o.content_format() {
        Some(cf) => Some(media_type(cf)),
        None if !response.payload.is_empty() && !response.code.is_success() => {
            Some("text/plain; charset=utf-8".to_string())
        }
        None => None,
    };
    if let Some(media) = media.and_then(|m| HeaderValue::from_str(&m).ok()) {
        headers.insert(header::CONTENT_TYPE, media);
    }
    if let Some(etag) = o
        .get(opt::ETAG)
        .and_then(|e| HeaderValue::from_str(&http_etag(e)).ok())
    {
        headers.insert(header::ETAG, etag);
    }
    if response.code == Code::CONTENT
        || response.code == Code::VALID
        || matches!(response.code.class(), 4 | 5)
    {
        let age = o
            .get_uint(opt::MAX_AGE)
            .unwrap_or(crate::cache::DEFAULT_MAX_AGE);
        if let Ok(v) = HeaderValue::from_str(&format!("max-age={age}")) {
            headers.insert(header::CACHE_CONTROL, v);
        }
    }
    if let Some(path) = o.location_path_string() {
        let mut at = target.clone();
        at.path = path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        at.query = o
            .get_all(opt::LOCATION_QUERY)
            .map(|q| String::from_utf8_lossy(q).into_owned())
            .collect();
        if let Ok(v) = HeaderValue::from_str(&format!("{prefix}{}", uri_string(&at))) {
            headers.insert(header::LOCATION, v);
        }
    }
    let body = if status == 304 || status == 204 {
        Bytes::new()
    } else {
        Bytes::from(response.payload)
    };
    let mut r = hyper::Response::new(full(body));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    *r.headers_mut() = headers;
    r
}

/// The HTTP answer when no origin answered: 403 for a forbidden origin, 502 when
/// unreachable, 504 when silent, 503 with Retry-After when busy, and the mapped code
/// of a refusal; the body says what happened.
fn error_response(e: &ProxyError) -> hyper::Response<Body> {
    let status = match e {
        ProxyError::Forbidden { .. } => 403,
        ProxyError::Unreachable(_) => 502,
        ProxyError::Timeout(_) => 504,
        ProxyError::Busy(_) => 503,
        ProxyError::Refused(r) => http_status(r.code, true, false),
    };
    let mut r = plain(status, e.to_string());
    if matches!(e, ProxyError::Busy(_)) {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

/// Percent-decodes a query value (`+` is a space), if it is UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = s.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_counted_per_address_and_given_back() {
        let table = Arc::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let first = PerIp::take(&table, a, 2).unwrap();
        let _second = PerIp::take(&table, a, 2).unwrap();
        assert!(
            PerIp::take(&table, a, 2).is_none(),
            "a third from the same address"
        );
        assert!(
            PerIp::take(&table, b, 2).is_some(),
            "another address is not affected"
        );
        drop(first);
        assert!(
            PerIp::take(&table, a, 2).is_some(),
            "a closed connection gives its share back"
        );
    }

    #[test]
    fn query_values_are_percent_decoded() {
        assert_eq!(
            percent_decode("coap%3A%2F%2Fh%2Fa").as_deref(),
            Some("coap://h/a")
        );
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%"), None);
    }

    #[test]
    fn headers_become_options() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("image/png, application/cbor;q=0.5"),
        );
        h.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_static("\"0a\", W/\"0b\""),
        );
        let (o, conditional) = request_options(&h, Code::GET).unwrap();
        assert_eq!(o.content_format(), Some(50));
        assert_eq!(o.accept(), Some(60));
        assert_eq!(o.get_all(opt::ETAG).collect::<Vec<_>>(), [&[0x0a][..]]);
        assert!(conditional);
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("image/png"));
        assert_eq!(request_options(&h, Code::GET).unwrap_err().0, 415);
    }

    #[test]
    fn responses_carry_type_etag_max_age_and_location() {
        let target = CoapUri::parse("coap://h:5683/a").unwrap();
        let r = Response::content("{}")
            .with_content_format(50)
            .with_etag(&[1, 2])
            .with_max_age(7);
        let h = http_response(r, false, "/hc/", &target);
        assert_eq!(h.status(), 200);
        assert_eq!(h.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(h.headers()[header::ETAG], "\"0102\"");
        assert_eq!(h.headers()[header::CACHE_CONTROL], "max-age=7");
        let h = http_response(Response::created("/new/1"), false, "/hc/", &target);
        assert_eq!(h.status(), 201);
        assert_eq!(h.headers()[header::LOCATION], "/hc/coap://h/new/1");
        let valid = Response::new(Code::VALID).with_etag(&[1]);
        assert_eq!(http_response(valid, true, "/hc/", &target).status(), 304);
    }

    #[test]
    fn events_have_one_data_line_per_payload_line() {
        let e = sse_event(3, &Response::content("a\nb"));
        assert_eq!(&e[..], b"id: 3\ndata: a\ndata: b\n\n");
        let e = sse_event(4, &Response::new(Code::GATEWAY_TIMEOUT));
        assert_eq!(
            &e[..],
            b"id: 4\nevent: error\ndata: 5.04 Gateway Timeout\n\n"
        );
    }
}

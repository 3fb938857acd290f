//! CoAP → HTTP(S): a CoAP request whose Proxy-Uri (or Proxy-Scheme) names an `http`
//! or `https` origin is sent over HTTP/1.1 and its answer mapped back (RFC 8075 §7
//! read in the other direction; media types to Content-Formats). `https` origins must
//! present a certificate that verifies ([`HttpsTrust`](crate::HttpsTrust)). One
//! connection per request (no pool); not cached.

use crate::core::{Proxy, ProxyError};
use crate::https;
use crate::mapping::{content_format, media_type};
use crate::target::{Refused, MAX_PROXY_URI};
use bytes::Bytes;
use cobalt::proto::message::{opt, Code, Options};
use cobalt::Response;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{self, HeaderValue};
use hyper_util::rt::TokioIo;
use std::net::IpAddr;
use std::time::Instant;
use tokio::net::TcpStream;

/// Largest HTTP answer the proxy takes from an origin.
const MAX_HTTP_BODY: usize = 4 << 20;

/// An `http` or `https` origin named by a CoAP request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpTarget {
    /// `https`: reached over TLS, its certificate verified.
    pub tls: bool,
    /// Host name or address (without brackets).
    pub host: String,
    /// Port (80 for `http`, 443 for `https` when not given).
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path_and_query: String,
}

impl HttpTarget {
    /// `http` or `https`.
    pub fn scheme(&self) -> &'static str {
        scheme_name(self.tls)
    }

    /// The target as a URI with its port always written:
    /// `https://h.example:443/a?b`, `http://[::1]:8080/`.
    pub fn uri(&self) -> String {
        let scheme = self.scheme();
        let Self {
            host,
            port,
            path_and_query,
            ..
        } = self;
        if host.contains(':') {
            format!("{scheme}://[{host}]:{port}{path_and_query}")
        } else {
            format!("{scheme}://{host}:{port}{path_and_query}")
        }
    }
}

fn scheme_name(tls: bool) -> &'static str {
    if tls {
        "https"
    } else {
        "http"
    }
}

/// `Some(tls)` for the schemes proxied over HTTP: `http`, `https`.
fn http_scheme(scheme: &str) -> Option<bool> {
    match scheme.to_ascii_lowercase().as_str() {
        "http" => Some(false),
        "https" => Some(true),
        _ => None,
    }
}

/// The `http` or `https` target of a proxy request, if it names one: `None` when
/// the request names a CoAP target (or none); malformed URIs are refused (4.00).
pub fn http_target(options: &Options) -> Option<Result<HttpTarget, Refused>> {
    if let Some(raw) = options.get(opt::PROXY_URI) {
        if raw.len() > MAX_PROXY_URI {
            return None; // refused by the CoAP target's own check
        }
        let text = std::str::from_utf8(raw).ok()?;
        let (scheme, rest) = text.split_once("://")?;
        let tls = http_scheme(scheme)?;
        return Some(parse_authority_path(tls, rest));
    }
    let scheme = options.get(opt::PROXY_SCHEME)?;
    let tls = http_scheme(std::str::from_utf8(scheme).ok()?)?;
    let Some(host) = options
        .get(opt::URI_HOST)
        .and_then(|h| std::str::from_utf8(h).ok())
    else {
        return Some(Err(Refused::new(
            Code::BAD_REQUEST,
            "Proxy-Scheme http(s) without Uri-Host",
        )));
    };
    let default_port = if tls { 443 } else { 80 };
    let port = options
        .get_uint(opt::URI_PORT)
        .map_or(Ok(default_port), |p| {
            u16::try_from(p)
                .map_err(|_| Refused::new(Code::BAD_REQUEST, format!("Uri-Port {p} is not a port")))
        });
    let port = match port {
        Ok(p) => p,
        Err(e) => return Some(Err(e)),
    };
    let mut path = String::new();
    for seg in options.uri_path() {
        path.push('/');
        path.push_str(&encode(seg));
    }
    if path.is_empty() {
        path.push('/');
    }
    for (i, q) in options.uri_query().enumerate() {
        path.push(if i == 0 { '?' } else { '&' });
        path.push_str(&encode(q));
    }
    Some(Ok(HttpTarget {
        tls,
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port,
        path_and_query: path,
    }))
}

/// Percent-encodes what may not stand in an HTTP path or query as it is.
fn encode(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~!$'()*+,;=:@".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `host[:port]/path?query` of an `http://` (`https://` when `tls`) URI.
fn parse_authority_path(tls: bool, rest: &str) -> Result<HttpTarget, Refused> {
    let scheme = scheme_name(tls);
    let bad = |why: &str| {
        Refused::new(
            Code::BAD_REQUEST,
            format!("Proxy-Uri {scheme}://{rest}: {why}"),
        )
    };
    let rest = rest.split('#').next().unwrap_or_default();
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or_else(|| bad("missing ']'"))?;
        (h, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() || authority.contains('@') {
        return Err(bad("no host (or user information, which is not allowed)"));
    }
    let port = match port {
        None if tls => 443,
        None => 80,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| bad("bad port"))?,
    };
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    if path.bytes().any(|b| b <= b' ' || b >= 0x7f) {
        return Err(bad(
            "the path holds spaces, controls or non-ASCII bytes; percent-encode them",
        ));
    }
    Ok(HttpTarget {
        tls,
        host: host.to_string(),
        port,
        path_and_query: path,
    })
}

/// The CoAP code for an HTTP status (RFC 8075 §7 in the other direction): 200→2.05
/// (2.04 for a PUT, POST or PATCH), 201→2.01, 204→2.04 (2.02 for a DELETE), 304→2.03,
/// other 3xx→5.02 (the proxy does not follow redirects), 4xx and 5xx the same number
/// where CoAP has it (401→4.01, 404→4.04, 429→4.29, 504→5.04), else 4.00 / 5.00.
pub fn coap_code(status: u16, method: Code) -> Code {
    let modifies = matches!(method, Code::POST | Code::PUT | Code::PATCH | Code::IPATCH);
    match status {
        200 if modifies => Code::CHANGED,
        200 | 203 | 206 => Code::CONTENT,
        201 => Code::CREATED,
        204 if method == Code::DELETE => Code::DELETED,
        202 | 204 => Code::CHANGED,
        304 => Code::VALID,
        300..=399 => Code::BAD_GATEWAY,
        400 | 401 | 402 | 403 | 404 | 405 | 406 | 409 | 412 | 413 | 415 | 422 | 429 => {
            Code::new(4, (status - 400) as u8)
        }
        400..=499 => Code::BAD_REQUEST,
        500..=505 => Code::new(5, (status - 500) as u8),
        _ => Code::INTERNAL_SERVER_ERROR,
    }
}

impl Proxy {
    /// Sends `method` with `options` and `payload` to the `http` origin `target` and
    /// maps its answer to CoAP.
    pub async fn forward_http(
        &self,
        method: Code,
        target: &HttpTarget,
        options: &Options,
        payload: Vec<u8>,
    ) -> Result<Response, ProxyError> {
        let config = self.config();
        let ip: Option<IpAddr> = target.host.parse().ok();
        let addr = match ip {
            Some(ip) => std::net::SocketAddr::new(ip, target.port),
            None => {
                if !config.allow.may_allow_name(&target.host, target.port) {
                    return Err(self.forbidden_origin(&target.host, target.port));
                }
                let found = tokio::time::timeout(
                    config.upstream_timeout,
                    tokio::net::lookup_host((target.host.as_str(), target.port)),
                )
                .await;
                match found {
                    Ok(Ok(mut addrs)) => addrs.next().ok_or_else(|| {
                        ProxyError::Unreachable(format!("{} has no address", target.host))
                    })?,
                    Ok(Err(e)) => {
                        return Err(ProxyError::Unreachable(format!(
                            "cannot resolve {}: {e}",
                            target.host
                        )))
                    }
                    Err(_) => {
                        return Err(ProxyError::Timeout(format!("resolving {}", target.host)))
                    }
                }
            }
        };
        if !config
            .allow
            .allows(&target.host, Some(addr.ip()), target.port)
        {
            return Err(self.forbidden_origin(&target.host, target.port));
        }
        let name = match method {
            Code::GET => "GET",
            Code::POST => "POST",
            Code::PUT => "PUT",
            Code::DELETE => "DELETE",
            Code::FETCH => "FETCH",
            Code::PATCH | Code::IPATCH => "PATCH",
            other => {
                return Err(ProxyError::Refused(Refused::new(
                    Code::METHOD_NOT_ALLOWED,
                    format!("{other} has no HTTP method"),
                )))
            }
        };
        let host_header = if target.host.contains(':') {
            format!("[{}]:{}", target.host, target.port)
        } else {
            format!("{}:{}", target.host, target.port)
        };
        let mut builder = hyper::Request::builder()
            .method(name)
            .uri(target.path_and_query.as_str())
            .header(header::HOST, host_header);
        if let Some(cf) = options.content_format() {
            builder = builder.header(header::CONTENT_TYPE, media_type(cf));
        }
        if let Some(cf) = options.accept() {
            builder = builder.header(header::ACCEPT, media_type(cf));
        }
        let request = builder
            .body(Full::new(Bytes::from(payload)))
            .map_err(|e| ProxyError::Refused(Refused::new(Code::BAD_REQUEST, e.to_string())))?;
        let started = Instant::now();
        let exchange = async {
            let tcp = TcpStream::connect(addr)
                .await
                .map_err(|e| ProxyError::Unreachable(format!("{addr}: {e}")))?;
            if target.tls {
                let tls =
                    https::handshake(self.shared.https.clone(), &target.host, target.port, tcp)
                        .await
                        .map_err(ProxyError::Unreachable)?;
                http1_exchange(TokioIo::new(tls), request, addr).await
            } else {
                http1_exchange(TokioIo::new(tcp), request, addr).await
            }
        };
        let result = tokio::time::timeout(config.upstream_timeout, exchange).await;
        self.metrics().upstream_latency(started.elapsed());
        let (parts, body) = match result {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                self.metrics()
                    .upstream_unreachable
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Err(e);
            }
            Err(_) => {
                self.metrics()
                    .upstream_timeouts
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Err(ProxyError::Timeout(target.uri()));
            }
        };
        let mut response =
            Response::new(coap_code(parts.status.as_u16(), method)).with_payload(body.to_vec());
        let header = |name: header::HeaderName| {
            parts
                .headers
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
        };
        if let Some(ct) = header(header::CONTENT_TYPE) {
            response = response.with_content_format(
                content_format(ct).unwrap_or(cobalt::content_format::OCTET_STREAM),
            );
        }
        let max_age = header(header::CACHE_CONTROL)
            .and_then(|cc| {
                cc.split(',')
                    .find_map(|d| d.trim().strip_prefix("max-age=")?.parse::<u32>().ok())
            })
            .unwrap_or(0);
        response = response.with_max_age(max_age);
        if let Some(location) = header(header::LOCATION).filter(|l| l.starts_with('/')) {
            let (path, query) = location.split_once('?').unwrap_or((location, ""));
            for seg in path.split('/').filter(|s| !s.is_empty()) {
                response.options.push(opt::LOCATION_PATH, seg.as_bytes());
            }
            for q in query.split('&').filter(|s| !s.is_empty()) {
                response.options.push(opt::LOCATION_QUERY, q.as_bytes());
            }
        }
        Ok(response)
    }
}

/// One HTTP/1.1 exchange over `io` (a TCP or TLS connection to `addr`): the
/// answer's head and body (at most [`MAX_HTTP_BODY`] bytes).
async fn http1_exchange<T>(
    io: TokioIo<T>,
    request: hyper::Request<Full<Bytes>>,
    addr: std::net::SocketAddr,
) -> Result<(hyper::http::response::Parts, Bytes), ProxyError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| ProxyError::Unreachable(format!("{addr}: {e}")))?;
    let conn = tokio::spawn(conn);
    let answer = sender
        .send_request(request)
        .await
        .map_err(|e| ProxyError::Unreachable(format!("{addr}: {e}")))?;
    let (parts, body) = answer.into_parts();
    let body = Limited::new(body, MAX_HTTP_BODY)
        .collect()
        .await
        .map_err(|e| ProxyError::Unreachable(format!("{addr}: the answer's body: {e}")))?
        .to_bytes();
    conn.abort();
    Ok((parts, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy_uri(uri: &str) -> Options {
        let mut o = Options::new();
        o.set(opt::PROXY_URI, uri.as_bytes());
        o
    }

    #[test]
    fn http_targets_from_proxy_uri_and_proxy_scheme() {
        let t = http_target(&proxy_uri("http://h.example:8080/a/b?x=1"))
            .unwrap()
            .unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path_and_query.as_str()),
            ("h.example", 8080, "/a/b?x=1")
        );
        let t = http_target(&proxy_uri("http://[::1]")).unwrap().unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path_and_query.as_str()),
            ("::1", 80, "/")
        );
        assert!(http_target(&proxy_uri("coap://h/")).is_none());
        let https = http_target(&proxy_uri("HTTPS://h/x")).unwrap().unwrap();
        assert!(https.tls);
        assert_eq!(https.uri(), "https://h:443/x");
        assert_eq!(
            http_target(&proxy_uri("https://[::1]:8443"))
                .unwrap()
                .unwrap()
                .uri(),
            "https://[::1]:8443/"
        );
        assert_eq!(
            http_target(&proxy_uri("http://u@h/"))
                .unwrap()
                .unwrap_err()
                .code,
            Code::BAD_REQUEST
        );
        assert_eq!(
            http_target(&proxy_uri("http://h/a b"))
                .unwrap()
                .unwrap_err()
                .code,
            Code::BAD_REQUEST
        );
        let mut o = Options::new();
        o.set(opt::PROXY_SCHEME, b"http");
        o.set(opt::URI_HOST, b"h");
        o.set_uri_path("/a b/c");
        let t = http_target(&o).unwrap().unwrap();
        assert_eq!(t.path_and_query, "/a%20b/c");
        assert_eq!((t.tls, t.port), (false, 80));
        o.set(opt::PROXY_SCHEME, b"https");
        let t = http_target(&o).unwrap().unwrap();
        assert_eq!((t.tls, t.port), (true, 443));
    }

    #[test]
    fn http_statuses_map_back_to_coap_codes() {
        assert_eq!(coap_code(200, Code::GET), Code::CONTENT);
        assert_eq!(coap_code(200, Code::PUT), Code::CHANGED);
        assert_eq!(coap_code(201, Code::POST), Code::CREATED);
        assert_eq!(coap_code(204, Code::DELETE), Code::DELETED);
        assert_eq!(coap_code(301, Code::GET), Code::BAD_GATEWAY);
        assert_eq!(coap_code(304, Code::GET), Code::VALID);
        assert_eq!(coap_code(404, Code::GET), Code::NOT_FOUND);
        assert_eq!(coap_code(418, Code::GET), Code::BAD_REQUEST);
        assert_eq!(coap_code(429, Code::GET), Code::TOO_MANY_REQUESTS);
        assert_eq!(coap_code(504, Code::GET), Code::GATEWAY_TIMEOUT);
        assert_eq!(coap_code(599, Code::GET), Code::INTERNAL_SERVER_ERROR);
    }
}

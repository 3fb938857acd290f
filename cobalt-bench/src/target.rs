//! The target URI and the concurrency sweep of a benchmark.

use std::net::{SocketAddr, ToSocketAddrs};

/// Largest concurrency accepted in one step.
pub const MAX_CLIENTS: usize = 1_000_000;
/// Most steps one sweep may have.
pub const MAX_STEPS: usize = 1000;

/// The protocol a URI selects: CoAP over one of its transports, or HTTP/1.1 to compare
/// a CoAP server with an HTTP one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// CoAP over the transport that [`cobalt::Scheme`] names.
    Coap(cobalt::Scheme),
    /// `http://`: HTTP/1.1 over TCP.
    Http,
}

impl Scheme {
    /// The URI scheme, e.g. `coap+tcp`.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Coap(t) => t.as_str(),
            Scheme::Http => "http",
        }
    }

    /// The scheme named `name` (case-insensitive).
    fn from_name(name: &str) -> Option<Scheme> {
        if name.eq_ignore_ascii_case("http") {
            return Some(Scheme::Http);
        }
        name.parse().ok().map(Scheme::Coap)
    }

    /// The port when the URI has none (RFC 7252 §6, RFC 8323 §8).
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Coap(t) => t.default_port(),
            Scheme::Http => 80,
        }
    }

    /// CoAP over a reliable transport (RFC 8323): no message types, no message IDs.
    pub fn is_reliable(self) -> bool {
        matches!(self, Scheme::Coap(t) if !t.is_datagram())
    }

    /// CoAP secured by DTLS or TLS (credentials apply).
    pub fn is_secure(self) -> bool {
        matches!(self, Scheme::Coap(t) if t.is_secure())
    }

    /// Each client has a connection or session set up before the measurement.
    pub fn has_sessions(self) -> bool {
        matches!(self, Scheme::Coap(t) if t != cobalt::Scheme::Coap)
    }
}

/// A parsed `coap://`, `coaps://`, `coap+tcp://`, `coap+ws://` or `http://` URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Which protocol.
    pub scheme: Scheme,
    /// Host as written (without brackets for IPv6 literals).
    pub host: String,
    /// Port ([`Scheme::default_port`] when absent).
    pub port: u16,
    /// Path and query exactly as written (at least "/"), for the HTTP request line.
    pub raw_path: String,
    /// Decoded Uri-Path segments.
    pub path: Vec<String>,
    /// Decoded Uri-Query items.
    pub query: Vec<String>,
}

impl Target {
    /// Resolves the host to the first socket address.
    pub fn resolve(&self) -> Result<SocketAddr, String> {
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve host {:?}: {e}", self.host))?
            .next()
            .ok_or_else(|| format!("host {:?} has no address", self.host))
    }
}

/// Parses a `SCHEME://host[:port]/path?query` URI (see [`Scheme`]).
pub fn parse_uri(uri: &str) -> Result<Target, String> {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return Err(format!(
            "invalid URI {uri:?}: expected coap://host[:port]/path"
        ));
    };
    let scheme = Scheme::from_name(scheme).ok_or_else(|| {
        format!(
            "unsupported scheme {scheme}:// in {uri:?}: use coap://, coaps://, coap+tcp://, \
             coap+ws:// or http://"
        )
    })?;
    let rest = rest.split('#').next().unwrap_or("");
    let (authority, path_query) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err(format!("invalid URI {uri:?}: user info is not allowed"));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("invalid URI {uri:?}: unterminated IPv6 literal"))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("invalid URI {uri:?}: junk after IPv6 literal"))?,
            ),
        };
        (h, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(format!("invalid URI {uri:?}: missing host"));
    }
    // An IPv6 zone (RFC 6874: `fe80::1%25eth0`) as the resolver takes it: `fe80::1%eth0`.
    let host = host.replacen("%25", "%", 1);
    let port = match port {
        None | Some("") => scheme.default_port(),
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| format!("invalid URI {uri:?}: bad port {p:?}"))?,
    };
    if path_query.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(format!(
            "invalid URI {uri:?}: spaces or control characters in the path"
        ));
    }
    let raw_path = if path_query.starts_with('/') {
        path_query.to_string()
    } else {
        format!("/{path_query}")
    };
    let (path, query) = match path_query.split_once('?') {
        Some((p, q)) => (p, q),
        None => (path_query, ""),
    };
    // RFC 7252 §6.4: every segment is a Uri-Path, an empty one too (`/rd/` is "rd"
    // and ""; aiocoap-rd serves `/resourcedirectory/`), except for the path `/`.
    let path = path
        .split('/')
        .skip(1)
        .filter(|_| path.len() > 1)
        .map(|s| percent_decode(s).ok_or_else(|| format!("invalid URI {uri:?}: bad %-escape")))
        .collect::<Result<Vec<_>, _>>()?;
    let query = query
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|s| percent_decode(s).ok_or_else(|| format!("invalid URI {uri:?}: bad %-escape")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Target {
        scheme,
        raw_path,
        host,
        port,
        path,
        query,
    })
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Parses the concurrency sweep: comma-separated numbers and `a..b[:step]` ranges,
/// where the step is added (`:10`, default: `a`) or multiplies (`:*10`).
pub fn parse_sweep(s: &str) -> Result<Vec<usize>, String> {
    let mut steps = Vec::new();
    for item in s.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(format!("invalid client list {s:?}: empty item"));
        }
        if let Some((a, rest)) = item.split_once("..") {
            let (b, step) = match rest.split_once(':') {
                Some((b, st)) => (b, Some(st)),
                None => (rest, None),
            };
            let a = parse_count(a, s)?;
            let b = parse_count(b, s)?;
            if b < a {
                return Err(format!("invalid client range {item:?}: end below start"));
            }
            // `:N` adds N each step, `:*N` (or `:xN`) multiplies by N.
            let (factor, add) = match step.map(str::trim) {
                Some(st) if st.starts_with(['*', 'x']) => {
                    let f = parse_count(&st[1..], s)?;
                    if f < 2 {
                        return Err(format!("invalid client range {item:?}: factor below 2"));
                    }
                    (f, 0)
                }
                Some(st) => (1, parse_count(st, s)?),
                None => (1, a),
            };
            let mut n = a;
            while n <= b {
                steps.push(n);
                if steps.len() > MAX_STEPS {
                    return Err(format!(
                        "invalid client list {s:?}: more than {MAX_STEPS} steps"
                    ));
                }
                n = n.saturating_mul(factor).saturating_add(add);
            }
        } else {
            steps.push(parse_count(item, s)?);
        }
    }
    Ok(steps)
}

fn parse_count(n: &str, whole: &str) -> Result<usize, String> {
    match n.trim().parse::<usize>() {
        Ok(v) if (1..=MAX_CLIENTS).contains(&v) => Ok(v),
        _ => Err(format!(
            "invalid client count {n:?} in {whole:?}: expected a number from 1 to {MAX_CLIENTS}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_basic() {
        let t = parse_uri("coap://127.0.0.1:5690/bench/x?a=1&b").unwrap();
        assert_eq!(t.host, "127.0.0.1");
        assert_eq!(t.port, 5690);
        assert_eq!(t.path, vec!["bench", "x"]);
        assert_eq!(t.query, vec!["a=1", "b"]);
        let t = parse_uri("coap://h/resourcedirectory/?ep=a").unwrap();
        assert_eq!(
            t.path,
            vec!["resourcedirectory", ""],
            "a trailing slash is a segment"
        );
    }

    #[test]
    fn uri_defaults_and_ipv6() {
        let t = parse_uri("coap://localhost").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("localhost", 5683));
        assert!(t.path.is_empty());
        let t = parse_uri("COAP://[::1]:7000/a%20b").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 7000));
        assert_eq!(t.path, vec!["a b"]);
        let t = parse_uri("coap://[::1]/").unwrap();
        assert_eq!(t.port, 5683);
        assert_eq!(t.scheme, Scheme::Coap(cobalt::Scheme::Coap));
        let t = parse_uri("http://example.org?x=1").unwrap();
        assert_eq!((t.scheme, t.port), (Scheme::Http, 80));
        assert_eq!(t.raw_path, "/?x=1");
        let t = parse_uri("HTTP://h:8080/a/b?c").unwrap();
        assert_eq!((t.port, t.raw_path.as_str()), (8080, "/a/b?c"));
    }

    #[test]
    fn uri_with_an_ipv6_zone() {
        let t = parse_uri("coap://[fe80::1%25lo]:5683/x").unwrap();
        assert_eq!(t.host, "fe80::1%lo");
        let a = t.resolve().unwrap();
        assert!(matches!(a, SocketAddr::V6(v6) if v6.scope_id() == 1), "{a}");
    }

    #[test]
    fn uri_errors() {
        assert!(parse_uri("127.0.0.1:5683").is_err());
        assert!(parse_uri("https://x/")
            .unwrap_err()
            .contains("use coap://, coaps://, coap+tcp://, coap+ws:// or http://"));
        assert!(parse_uri("coap://h/a b").is_err());
        assert!(parse_uri("coap+udp://x/").is_err());
        assert!(parse_uri("coap:///path").is_err());
        assert!(parse_uri("coap://h:99999/").is_err());
        assert!(parse_uri("coap://h:0/").is_err());
        assert!(parse_uri("coap://h:x/").is_err());
        assert!(parse_uri("coap://[::1/").is_err());
        assert!(parse_uri("coap://h/%zz").is_err());
        assert!(parse_uri("coap://u@h/").is_err());
    }

    #[test]
    fn uri_schemes_and_default_ports() {
        for (uri, scheme, port) in [
            ("coaps://h/x", Scheme::Coap(cobalt::Scheme::Coaps), 5684),
            (
                "COAP+TCP://h/x",
                Scheme::Coap(cobalt::Scheme::CoapTcp),
                5683,
            ),
            ("coap+ws://h/x", Scheme::Coap(cobalt::Scheme::CoapWs), 80),
            (
                "coaps+tcp://h/x",
                Scheme::Coap(cobalt::Scheme::CoapsTcp),
                5684,
            ),
            ("coaps+ws://h/x", Scheme::Coap(cobalt::Scheme::CoapsWs), 443),
            (
                "coap+ws://h:8080/x",
                Scheme::Coap(cobalt::Scheme::CoapWs),
                8080,
            ),
        ] {
            let t = parse_uri(uri).unwrap();
            assert_eq!((t.scheme, t.port), (scheme, port), "{uri}");
            assert_eq!(t.path, vec!["x"], "{uri}");
            assert!(uri.to_ascii_lowercase().starts_with(scheme.name()));
        }
        assert!(
            Scheme::Coap(cobalt::Scheme::CoapWs).is_reliable()
                && !Scheme::Coap(cobalt::Scheme::Coaps).is_reliable()
        );
        assert!(
            Scheme::Coap(cobalt::Scheme::Coaps).has_sessions()
                && !Scheme::Coap(cobalt::Scheme::Coap).has_sessions()
        );
        assert!(!Scheme::Http.has_sessions());
    }

    #[test]
    fn sweep_lists_and_ranges() {
        assert_eq!(parse_sweep("10").unwrap(), vec![10]);
        assert_eq!(
            parse_sweep("1,10,100,1000").unwrap(),
            vec![1, 10, 100, 1000]
        );
        assert_eq!(parse_sweep("10..50:20").unwrap(), vec![10, 30, 50]);
        assert_eq!(parse_sweep("10..35:10").unwrap(), vec![10, 20, 30]);
        assert_eq!(parse_sweep("10..30").unwrap(), vec![10, 20, 30]);
        assert_eq!(parse_sweep("1, 5..6:1 ,100").unwrap(), vec![1, 5, 6, 100]);
        assert_eq!(
            parse_sweep("1..10000:*10").unwrap(),
            vec![1, 10, 100, 1000, 10000]
        );
        assert_eq!(parse_sweep("5..50:x3").unwrap(), vec![5, 15, 45]);
    }

    #[test]
    fn sweep_errors() {
        for bad in [
            "", "0", "-1", "a", "10..5:1", "10..20:0", "1,,2", "5..", "2000000",
        ] {
            assert!(parse_sweep(bad).is_err(), "{bad:?} accepted");
        }
    }
}

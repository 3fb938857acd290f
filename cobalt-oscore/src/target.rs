//! Which requests a client protects with which context: URI patterns as aiocoap's
//! credentials files write them (`coap://host:port/*`, `coap://host/path`, `*`).

use cobalt_proto::message::Message;
use cobalt_proto::uri::{CoapUri, Scheme};
use std::net::SocketAddr;

/// A pattern over request URIs: a scheme, a host, an optional port and a path that is
/// matched exactly or, ending in `*`, as a prefix. `*` alone matches every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UriPattern {
    /// `None`: any request.
    parts: Option<Parts>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Parts {
    scheme: Scheme,
    /// Lower-case host as written (an IPv6 literal without brackets).
    host: String,
    port: Option<u16>,
    /// The path without the trailing `*`.
    path: String,
    prefix: bool,
}

/// Why a pattern is not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{pattern:?} is not a URI pattern ({reason}); write e.g. coap://host:5683/* or *")]
pub struct PatternError {
    pattern: String,
    reason: &'static str,
}

impl UriPattern {
    /// Matches every request.
    pub fn any() -> UriPattern {
        UriPattern { parts: None }
    }

    /// Parses `scheme://host[:port][/path][*]`, or `*`.
    pub fn parse(pattern: &str) -> Result<UriPattern, PatternError> {
        let error = |reason| PatternError {
            pattern: pattern.to_string(),
            reason,
        };
        if pattern == "*" {
            return Ok(UriPattern::any());
        }
        let (scheme, rest) = pattern.split_once("://").ok_or(error("no scheme"))?;
        let scheme: Scheme = scheme.parse().map_err(|_| error("unknown scheme"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or(error("unclosed ["))?;
            (host, after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(error("no host"));
        }
        let port = match port {
            Some(p) => Some(p.parse().map_err(|_| error("bad port"))?),
            None => None,
        };
        let (path, prefix) = match path.strip_suffix('*') {
            Some(p) => (p, true),
            None => (path, false),
        };
        Ok(UriPattern {
            parts: Some(Parts {
                scheme,
                host: host.to_ascii_lowercase(),
                port,
                path: path.to_string(),
                prefix,
            }),
        })
    }

    /// Whether a request to `peer` over `scheme` matches: its host is its Uri-Host or,
    /// without one, the peer's address.
    pub fn matches(&self, scheme: Scheme, peer: SocketAddr, request: &Message) -> bool {
        let host = request.options.get(cobalt_proto::message::opt::URI_HOST);
        self.matches_with(
            scheme,
            peer.port(),
            &request.options.uri_path_string(),
            |p| match host {
                Some(host) => host.eq_ignore_ascii_case(p.as_bytes()),
                None => p
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip == peer.ip()),
            },
        )
    }

    /// Whether `uri` matches (its host compared as written).
    pub fn matches_uri(&self, uri: &CoapUri) -> bool {
        self.matches_with(uri.scheme, uri.port, &uri.path_string(), |p| {
            p.eq_ignore_ascii_case(&uri.host)
        })
    }

    fn matches_with(
        &self,
        scheme: Scheme,
        port: u16,
        path: &str,
        host_matches: impl FnOnce(&str) -> bool,
    ) -> bool {
        let Some(p) = &self.parts else {
            return true;
        };
        if p.scheme != scheme || p.port.unwrap_or(scheme.default_port()) != port {
            return false;
        }
        if !host_matches(&p.host) {
            return false;
        }
        if p.prefix {
            path.starts_with(&p.path)
                || (p.path.ends_with('/') && path == &p.path[..p.path.len() - 1])
        } else {
            path == p.path || (p.path.is_empty() && path == "/")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_proto::message::{opt, Code, MessageType};

    fn get(path: &str, host: Option<&str>) -> Message {
        let mut m = Message::new(MessageType::Confirmable, Code::GET, 1);
        if let Some(h) = host {
            m.options.set(opt::URI_HOST, h);
        }
        m.options.set_uri_path(path);
        m
    }

    #[test]
    fn patterns_match_scheme_host_port_and_path() {
        let peer: SocketAddr = "127.0.0.1:5683".parse().unwrap();
        let all = UriPattern::parse("coap://127.0.0.1/*").unwrap();
        assert!(all.matches(Scheme::Coap, peer, &get("/a/b", None)));
        assert!(all.matches(Scheme::Coap, peer, &get("/", None)));
        assert!(!all.matches(Scheme::Coaps, peer, &get("/a", None)));
        assert!(!all.matches(
            Scheme::Coap,
            "127.0.0.1:5700".parse().unwrap(),
            &get("/a", None)
        ));
        let named = UriPattern::parse("coap://Sensor.example:5683/temp").unwrap();
        assert!(named.matches(Scheme::Coap, peer, &get("/temp", Some("sensor.example"))));
        assert!(!named.matches(Scheme::Coap, peer, &get("/temp/x", Some("sensor.example"))));
        assert!(!named.matches(Scheme::Coap, peer, &get("/temp", None)));
        let v6 = UriPattern::parse("coap://[::1]:5700/*").unwrap();
        assert!(v6.matches(
            Scheme::Coap,
            "[::1]:5700".parse().unwrap(),
            &get("/x", None)
        ));
        assert!(UriPattern::parse("*")
            .unwrap()
            .matches(Scheme::Coap, peer, &get("/", None)));
        assert!(UriPattern::parse("127.0.0.1/*").is_err());
        assert!(UriPattern::parse("coap://h:x/").is_err());
        let uri = CoapUri::parse("coap://sensor.example/temp").unwrap();
        assert!(named.matches_uri(&uri));
        assert!(!all.matches_uri(&uri));
    }
}

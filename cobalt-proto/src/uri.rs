//! CoAP URIs (RFC 7252 §6): parsing `coap://host:port/path?query` and turning it
//! into a destination and request options (§6.4).

use crate::message::{opt, Options};
use std::fmt;
use std::net::IpAddr;

/// The URI schemes of CoAP, one per transport: the one type that names a transport
/// everywhere (URIs, listeners, metrics, the command line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scheme {
    /// `coap` over UDP (default port 5683).
    Coap,
    /// `coaps` over DTLS (default port 5684).
    Coaps,
    /// `coap+tcp` (RFC 8323, port 5683).
    CoapTcp,
    /// `coaps+tcp` (RFC 8323, port 5684).
    CoapsTcp,
    /// `coap+ws` (RFC 8323, port 80).
    CoapWs,
    /// `coaps+ws` (RFC 8323, port 443).
    CoapsWs,
}

impl Scheme {
    /// The scheme's name as written in URIs.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Coap => "coap",
            Scheme::Coaps => "coaps",
            Scheme::CoapTcp => "coap+tcp",
            Scheme::CoapsTcp => "coaps+tcp",
            Scheme::CoapWs => "coap+ws",
            Scheme::CoapsWs => "coaps+ws",
        }
    }

    /// The default port of the scheme.
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Coap | Scheme::CoapTcp => 5683,
            Scheme::Coaps | Scheme::CoapsTcp => 5684,
            Scheme::CoapWs => 80,
            Scheme::CoapsWs => 443,
        }
    }

    /// Every scheme, datagram ones first.
    pub const ALL: [Scheme; 6] = [
        Scheme::Coap,
        Scheme::Coaps,
        Scheme::CoapTcp,
        Scheme::CoapsTcp,
        Scheme::CoapWs,
        Scheme::CoapsWs,
    ];

    /// True for the schemes secured by DTLS or TLS.
    pub fn is_secure(self) -> bool {
        matches!(self, Scheme::Coaps | Scheme::CoapsTcp | Scheme::CoapsWs)
    }

    /// True for CoAP over UDP or DTLS (RFC 7252); false for the RFC 8323 transports.
    pub fn is_datagram(self) -> bool {
        matches!(self, Scheme::Coap | Scheme::Coaps)
    }

    /// True for CoAP over WebSockets (`coap+ws`, `coaps+ws`).
    pub fn is_websocket(self) -> bool {
        matches!(self, Scheme::CoapWs | Scheme::CoapsWs)
    }

    fn parse(s: &str) -> Option<Scheme> {
        Some(match s.to_ascii_lowercase().as_str() {
            "coap" => Scheme::Coap,
            "coaps" => Scheme::Coaps,
            "coap+tcp" => Scheme::CoapTcp,
            "coaps+tcp" => Scheme::CoapsTcp,
            "coap+ws" => Scheme::CoapWs,
            "coaps+ws" => Scheme::CoapsWs,
            _ => return None,
        })
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Scheme {
    type Err = UriError;

    fn from_str(s: &str) -> Result<Scheme, UriError> {
        Scheme::parse(s).ok_or_else(|| UriError {
            uri: s.to_string(),
            reason: "not a CoAP scheme (coap, coaps, coap+tcp, coaps+tcp, coap+ws, coaps+ws)"
                .into(),
        })
    }
}

/// Why a string is not a usable CoAP URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UriError {
    /// The input.
    pub uri: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for UriError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad URI '{}': {}", self.uri, self.reason)
    }
}

impl std::error::Error for UriError {}

/// A parsed CoAP URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoapUri {
    /// Scheme.
    pub scheme: Scheme,
    /// Host as written (without brackets, and without the zone, for IPv6 literals).
    pub host: String,
    /// The zone of a link-local IPv6 literal (RFC 6874: `coap://[fe80::1%25eth0]/`
    /// gives `eth0`): an interface name or index.
    pub zone: Option<String>,
    /// Port (the scheme's default when absent).
    pub port: u16,
    /// Path segments, percent-decoded.
    pub path: Vec<String>,
    /// Query items, percent-decoded.
    pub query: Vec<String>,
}

impl CoapUri {
    /// Parses an absolute URI. Fragments are not allowed (§6.4 step 3).
    pub fn parse(uri: &str) -> Result<CoapUri, UriError> {
        let err = |reason: &str| UriError {
            uri: uri.to_string(),
            reason: reason.to_string(),
        };
        let (scheme, rest) = uri
            .split_once("://")
            .ok_or_else(|| err("expected scheme://host, e.g. coap://127.0.0.1/path"))?;
        let scheme = Scheme::parse(scheme).ok_or_else(|| {
            err(&format!(
                "unsupported scheme '{scheme}' (use coap, coaps, coap+tcp, coaps+tcp, coap+ws or coaps+ws)"
            ))
        })?;
        if rest.contains('#') {
            return Err(err("fragments (#...) are not allowed in CoAP URIs"));
        }
        let (authority, path_query) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err(err(
                "user information (user@host) is not allowed in CoAP URIs",
            ));
        }
        let (host, port) = split_host_port(authority).map_err(|r| err(&r))?;
        if host.is_empty() {
            return Err(err("missing host"));
        }
        let (host, zone) = split_zone(host).map_err(|r| err(&r))?;
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| err(&format!("invalid port '{p}'")))?,
            None => scheme.default_port(),
        };
        let (path, query) = match path_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_query, None),
        };
        let mut segments = Vec::new();
        let trimmed = path.strip_prefix('/').unwrap_or(path);
        if !trimmed.is_empty() {
            for seg in trimmed.split('/') {
                segments.push(percent_decode(seg).map_err(|r| err(&r))?);
            }
        }
        let mut items = Vec::new();
        if let Some(q) = query {
            for item in q.split('&').filter(|s| !s.is_empty()) {
                items.push(percent_decode(item).map_err(|r| err(&r))?);
            }
        }
        for s in segments.iter().chain(items.iter()) {
            if s.len() > 255 {
                return Err(err("a path segment or query item is longer than 255 bytes"));
            }
        }
        Ok(CoapUri {
            scheme,
            host: host.to_string(),
            zone,
            port,
            path: segments,
            query: items,
        })
    }

    /// The host as an IP address, if it is a literal.
    pub fn ip(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }

    /// Puts Uri-Host (for names, not literals), Uri-Path and Uri-Query into `options`.
    pub fn apply_to(&self, options: &mut Options) {
        if self.ip().is_none() {
            options.set(opt::URI_HOST, self.host.as_bytes());
        }
        options.remove(opt::URI_PATH);
        for seg in &self.path {
            options.push(opt::URI_PATH, seg.as_bytes());
        }
        options.remove(opt::URI_QUERY);
        for q in &self.query {
            options.push(opt::URI_QUERY, q.as_bytes());
        }
    }

    /// Path joined with `/`, with a leading `/`.
    pub fn path_string(&self) -> String {
        format!("/{}", self.path.join("/"))
    }
}

impl fmt::Display for CoapUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match (&self.zone, self.host.contains(':')) {
            (Some(zone), _) => format!("[{}%25{zone}]", self.host),
            (None, true) => format!("[{}]", self.host),
            (None, false) => self.host.clone(),
        };
        write!(
            f,
            "{}://{}:{}{}",
            self.scheme.as_str(),
            host,
            self.port,
            self.path_string()
        )?;
        if !self.query.is_empty() {
            write!(f, "?{}", self.query.join("&"))?;
        }
        Ok(())
    }
}

/// Splits the zone off an IPv6 literal: `fe80::1%25eth0` (RFC 6874), or `fe80::1%eth0`
/// as people also write it.
fn split_zone(host: &str) -> Result<(&str, Option<String>), String> {
    let Some((addr, zone)) = host.split_once('%') else {
        return Ok((host, None));
    };
    let zone = zone.strip_prefix("25").unwrap_or(zone);
    let zone = percent_decode(zone)?;
    if zone.is_empty() {
        return Err("empty IPv6 zone after '%25'".into());
    }
    Ok((addr, Some(zone)))
}

fn split_host_port(authority: &str) -> Result<(&str, Option<&str>), String> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or("unterminated IPv6 literal (missing ']')")?;
        let addr = host.split_once('%').map_or(host, |(a, _)| a);
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("'{addr}' is not an IPv6 address"));
        }
        return match after {
            "" => Ok((host, None)),
            p if p.starts_with(':') => Ok((host, Some(&p[1..]))),
            _ => Err("unexpected characters after the IPv6 literal".into()),
        };
    }
    match authority.rsplit_once(':') {
        Some((h, _)) if h.contains(':') => {
            Err("IPv6 addresses must be written in brackets, e.g. coap://[::1]/".into())
        }
        Some((h, p)) => Ok((h, Some(p))),
        None => Ok((authority, None)),
    }
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent-encoding in '{s}'"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("'{s}' does not decode to UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_zones_per_rfc_6874() {
        let u = CoapUri::parse("coap://[fe80::1%25eth0]:5690/x").unwrap();
        assert_eq!(
            (u.host.as_str(), u.zone.as_deref()),
            ("fe80::1", Some("eth0"))
        );
        assert_eq!(u.ip(), Some("fe80::1".parse().unwrap()));
        assert_eq!(u.to_string(), "coap://[fe80::1%25eth0]:5690/x");
        let u = CoapUri::parse("coap://[fe80::1%eth1]/").unwrap();
        assert_eq!(u.zone.as_deref(), Some("eth1"));
        let u = CoapUri::parse("coap://[fe80::1%252]/").unwrap();
        assert_eq!(u.zone.as_deref(), Some("2"));
        assert_eq!(CoapUri::parse("coap://[::1]/").unwrap().zone, None);
        assert!(CoapUri::parse("coap://[fe80::1%25]/").is_err());
        assert!(CoapUri::parse("coap://[nonsense%25eth0]/").is_err());
    }

    #[test]
    fn parses_the_usual_forms() {
        let u = CoapUri::parse("coap://example.com/sensors/temp?unit=c&x").unwrap();
        assert_eq!(u.scheme, Scheme::Coap);
        assert_eq!(u.host, "example.com");
        assert_eq!(u.port, 5683);
        assert_eq!(u.path, ["sensors", "temp"]);
        assert_eq!(u.query, ["unit=c", "x"]);
        let u = CoapUri::parse("coap://[::1]:5690/").unwrap();
        assert_eq!(u.host, "::1");
        assert_eq!(u.port, 5690);
        assert!(u.path.is_empty());
        let u = CoapUri::parse("coaps://10.0.0.1").unwrap();
        assert_eq!(u.port, 5684);
        let u = CoapUri::parse("coap://h/a%20b/%C3%A9").unwrap();
        assert_eq!(u.path, ["a b", "é"]);
    }

    #[test]
    fn options_follow_section_6_4() {
        let mut o = Options::new();
        CoapUri::parse("coap://example.net/.well-known/core?rt=x")
            .unwrap()
            .apply_to(&mut o);
        assert_eq!(o.get(opt::URI_HOST), Some(&b"example.net"[..]));
        assert_eq!(o.uri_path_string(), "/.well-known/core");
        let mut o = Options::new();
        CoapUri::parse("coap://127.0.0.1/x")
            .unwrap()
            .apply_to(&mut o);
        assert!(!o.contains(opt::URI_HOST), "no Uri-Host for IP literals");
    }

    #[test]
    fn rejects_bad_uris_with_reasons() {
        for (bad, why) in [
            ("http://x/", "unsupported scheme"),
            ("example.com/x", "expected scheme"),
            ("coap://", "missing host"),
            ("coap://h:99999/", "invalid port"),
            ("coap://h/#frag", "fragments"),
            ("coap://::1/", "brackets"),
            ("coap://[::1/", "unterminated"),
            ("coap://h/%zz", "percent"),
        ] {
            let e = CoapUri::parse(bad).unwrap_err();
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
    }
}

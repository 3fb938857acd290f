//! Which origins the proxy may reach: an allow-list of host, CIDR and port patterns.
//! An open proxy is an attack tool (it hides the attacker and reaches hosts behind the
//! proxy's firewall), so the list is empty, and every origin refused, until configured.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// One allowed origin pattern:
///
/// - `*`: every origin (an open proxy; only where the network is trusted);
/// - `host`, `host:port`: a host name, exactly (case-insensitive);
/// - `*.example.com[:port]`: every name under `example.com` (not `example.com` itself);
/// - `192.0.2.7[:port]`, `[2001:db8::1]:port`: one address;
/// - `10.0.0.0/8[:port]`, `[fd00::/8]:port`: a network (CIDR).
///
/// Without a port every port matches; `host:*` says the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginPattern {
    host: HostPattern,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Any,
    Name(String),
    Suffix(String),
    Net { addr: IpAddr, prefix: u8 },
}

/// Why an origin pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad origin pattern '{pattern}': {reason} (write host[:port], *.domain[:port], ADDR/PREFIX[:port], [v6]:port or *)")]
pub struct BadPattern {
    /// The pattern as given.
    pub pattern: String,
    /// What is wrong with it.
    pub reason: String,
}

impl FromStr for OriginPattern {
    type Err = BadPattern;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| BadPattern {
            pattern: s.to_string(),
            reason: reason.to_string(),
        };
        let s = s.trim();
        if s == "*" {
            return Ok(OriginPattern {
                host: HostPattern::Any,
                port: None,
            });
        }
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (inside, after) = rest.split_once(']').ok_or_else(|| bad("missing ']'"))?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("expected ':' after ']'"))?,
                ),
            };
            (inside, port)
        } else if s.matches(':').count() > 1 {
            (s, None) // a bare IPv6 address or network
        } else {
            match s.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (s, None),
            }
        };
        let port = match port {
            None | Some("*") => None,
            Some(p) => Some(
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| bad(&format!("'{p}' is not a port")))?,
            ),
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let host = if let Some((addr, prefix)) = host.split_once('/') {
            let addr: IpAddr = addr
                .parse()
                .map_err(|_| bad(&format!("'{addr}' is not an IP address")))?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let prefix = prefix
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| bad(&format!("'{prefix}' is not a prefix length 0..={max}")))?;
            HostPattern::Net { addr, prefix }
        } else if let Ok(addr) = host.parse::<IpAddr>() {
            let prefix = if addr.is_ipv4() { 32 } else { 128 };
            HostPattern::Net { addr, prefix }
        } else if let Some(domain) = host.strip_prefix("*.") {
            if domain.is_empty() || domain.contains('*') {
                return Err(bad("a wildcard name is *.domain"));
            }
            HostPattern::Suffix(format!(".{}", domain.to_ascii_lowercase()))
        } else if host.contains('*') {
            return Err(bad("'*' only as the whole pattern or as *.domain"));
        } else {
            HostPattern::Name(host.to_ascii_lowercase())
        };
        Ok(OriginPattern { host, port })
    }
}

impl fmt::Display for OriginPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPattern::Any => write!(f, "*")?,
            HostPattern::Name(n) => write!(f, "{n}")?,
            HostPattern::Suffix(s) => write!(f, "*{s}")?,
            HostPattern::Net { addr, prefix } => match addr {
                IpAddr::V4(_) => write!(f, "{addr}/{prefix}")?,
                IpAddr::V6(_) => write!(f, "[{addr}/{prefix}]")?,
            },
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

impl OriginPattern {
    /// Whether the origin `host` (as named in the request), reached at `ip`, port
    /// `port`, matches. A name pattern matches the name, a network pattern the address.
    pub fn matches(&self, host: &str, ip: Option<IpAddr>, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match &self.host {
            HostPattern::Any => true,
            HostPattern::Name(n) => host.eq_ignore_ascii_case(n),
            HostPattern::Suffix(s) => {
                host.len() > s.len()
                    && host.is_char_boundary(host.len() - s.len())
                    && host[host.len() - s.len()..].eq_ignore_ascii_case(s)
            }
            HostPattern::Net { addr, prefix } => {
                ip.is_some_and(|ip| in_network(ip, *addr, *prefix))
            }
        }
    }
}

/// Whether `ip` is in the network `net/prefix` (an IPv4-mapped IPv6 address counts as
/// the IPv4 address it maps).
fn in_network(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// The origins a proxy may reach. Empty (the default) refuses every origin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    patterns: Vec<OriginPattern>,
}

impl AllowList {
    /// An empty list: every origin refused.
    pub fn new() -> AllowList {
        AllowList::default()
    }

    /// Every origin allowed (an open proxy).
    pub fn open() -> AllowList {
        AllowList::new().allow(OriginPattern {
            host: HostPattern::Any,
            port: None,
        })
    }

    /// This list with `pattern` added.
    pub fn allow(mut self, pattern: OriginPattern) -> AllowList {
        self.patterns.push(pattern);
        self
    }

    /// A list of the patterns written in `patterns` (see [`OriginPattern`]).
    pub fn parse<'a>(patterns: impl IntoIterator<Item = &'a str>) -> Result<AllowList, BadPattern> {
        let mut list = AllowList::new();
        for p in patterns {
            list = list.allow(p.parse()?);
        }
        Ok(list)
    }

    /// Whether no origin is allowed.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The patterns, in the order given.
    pub fn patterns(&self) -> &[OriginPattern] {
        &self.patterns
    }

    /// Whether the origin named `host` on `port` may be allowed once resolved: a
    /// name pattern matches it, or a network pattern (or `*`) may match its address.
    /// When not, the proxy refuses it without resolving the name.
    pub fn may_allow_name(&self, host: &str, port: u16) -> bool {
        self.patterns.iter().any(|p| {
            p.port.is_none_or(|q| q == port)
                && (matches!(p.host, HostPattern::Net { .. }) || p.matches(host, None, port))
        })
    }

    /// Whether the origin `host`, reached at `ip` on `port`, is allowed.
    pub fn allows(&self, host: &str, ip: Option<IpAddr>, port: u16) -> bool {
        self.patterns.iter().any(|p| p.matches(host, ip, port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn an_empty_list_refuses_everything_and_star_allows_everything() {
        assert!(!AllowList::new().allows("localhost", ip("127.0.0.1"), 5683));
        assert!(AllowList::open().allows("example.org", ip("192.0.2.1"), 1));
    }

    #[test]
    fn names_suffixes_and_ports() {
        let list = AllowList::parse(["sensor.local:5683", "*.example.com"]).unwrap();
        assert!(list.allows("SENSOR.local", None, 5683));
        assert!(!list.allows("sensor.local", None, 5684));
        assert!(list.allows("a.b.example.com", None, 1));
        assert!(!list.allows("example.com", None, 1));
        assert!(!list.allows("evilexample.com", None, 1));
    }

    #[test]
    fn networks_match_addresses_v4_v6_and_mapped() {
        let list = AllowList::parse(["10.0.0.0/8:5683", "[fd00::/8]", "::1"]).unwrap();
        assert!(list.allows("x", ip("10.1.2.3"), 5683));
        assert!(list.allows("x", ip("::ffff:10.1.2.3"), 5683));
        assert!(!list.allows("x", ip("10.1.2.3"), 80));
        assert!(!list.allows("x", ip("11.0.0.1"), 5683));
        assert!(list.allows("x", ip("fd12::1"), 9));
        assert!(list.allows("x", ip("::1"), 9));
        assert!(!list.allows("x", ip("::2"), 9));
        assert!(!list.allows("x", None, 5683), "a network needs an address");
        assert!(list.may_allow_name("x", 5683), "until resolved");
        let names = AllowList::parse(["a.example:5683"]).unwrap();
        assert!(names.may_allow_name("a.example", 5683));
        assert!(!names.may_allow_name("b.example", 5683));
        assert!(!names.may_allow_name("a.example", 1));
    }

    #[test]
    fn bad_patterns_say_what_is_wrong() {
        for bad in ["", "host:0", "10.0.0.0/33", "[::1", "a*b", "*.", "host:x"] {
            let e = bad.parse::<OriginPattern>().unwrap_err();
            assert!(e.to_string().contains("bad origin pattern"), "{bad}: {e}");
        }
        let p: OriginPattern = "[fd00::/8]:5683".parse().unwrap();
        assert_eq!(p.to_string(), "[fd00::/8]:5683");
    }
}

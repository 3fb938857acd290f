//! Endpoint and resource lookup (RFC 9176 §7): attribute filters with exact values or
//! a trailing `*`, `page` and `count`, and answers in link-format. Resource lookup
//! answers carry absolute target URIs, resolved against the registration's base, with
//! that base as `anchor`.

use crate::directory::Directory;
use crate::error::RdError;
use crate::registration::{truncated, Registration};
use cobalt_proto::link_format::{self, Link};

/// Which lookup interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupKind {
    /// `/rd-lookup/ep` (`rt=core.rd-lookup-ep`): registrations.
    Endpoint,
    /// `/rd-lookup/res` (`rt=core.rd-lookup-res`): registered links.
    Resource,
}

/// A lookup's query: its filters and the page asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LookupQuery {
    /// `name=value` filters; a value ending in `*` matches by prefix.
    pub filters: Vec<(String, String)>,
    /// The page (from 0), in units of `count`.
    pub page: usize,
    /// The most results to answer.
    pub count: usize,
}

impl LookupQuery {
    /// Parses the Uri-Query items of a lookup. 4.00 for a `page` or `count` that is no
    /// number, or a `page` without `count` beyond the first.
    pub fn parse<'a>(
        query: impl IntoIterator<Item = &'a str>,
        max_count: usize,
    ) -> Result<LookupQuery, RdError> {
        let mut q = LookupQuery {
            count: max_count,
            ..LookupQuery::default()
        };
        let number = |name: &str, v: &str| {
            v.parse::<usize>().map_err(|_| {
                RdError::bad_request(format!("`{name}={}` is not a whole number", truncated(v)))
            })
        };
        for item in query {
            let (name, value) = item.split_once('=').unwrap_or((item, ""));
            match name {
                "page" => q.page = number(name, value)?,
                "count" => q.count = number(name, value)?.min(max_count),
                "" => return Err(RdError::bad_request("an empty query parameter".into())),
                _ => {
                    if q.filters.len() >= 16 {
                        return Err(RdError::bad_request("more than 16 lookup filters".into()));
                    }
                    q.filters.push((name.to_string(), value.to_string()));
                }
            }
        }
        Ok(q)
    }

    fn window<T>(&self, items: impl Iterator<Item = T>) -> impl Iterator<Item = T> {
        items
            .skip(self.page.saturating_mul(self.count))
            .take(self.count)
    }
}

/// Whether one attribute value matches a filter value: exactly, by prefix before a
/// trailing `*`, or (for space-separated lists such as `rt`) any one item of it.
fn value_matches(value: &str, pattern: &str, list: bool) -> bool {
    let one = |v: &str| match pattern.strip_suffix('*') {
        Some(prefix) => v.starts_with(prefix),
        None => v == pattern,
    };
    one(value) || (list && value.split_ascii_whitespace().any(one))
}

fn is_list(name: &str) -> bool {
    matches!(name, "rt" | "if" | "rel" | "et")
}

fn endpoint_matches(r: &Registration, name: &str, pattern: &str) -> bool {
    r.attr(name)
        .is_some_and(|v| value_matches(&v, pattern, is_list(name)))
}

fn link_matches(link: &Link, resolved: &str, name: &str, pattern: &str) -> bool {
    if name == "href" {
        return value_matches(resolved, pattern, false)
            || value_matches(&link.target, pattern, false);
    }
    link.attrs
        .iter()
        .filter(|(n, _)| n == name)
        .any(|(_, v)| value_matches(v.as_deref().unwrap_or(""), pattern, is_list(name)))
}

/// `target` resolved against `base` (`scheme://authority`): kept when absolute.
fn resolve(base: &str, target: &str) -> String {
    if target.contains("://") {
        target.to_string()
    } else if target.starts_with('/') {
        format!("{base}{target}")
    } else {
        format!("{base}/{target}")
    }
}

/// The answer to a lookup at `now`, as link-format text.
pub fn lookup(dir: &Directory, kind: LookupKind, q: &LookupQuery, now: u64) -> String {
    // A filter on one endpoint name needs only that name's registrations (the filters
    // below still decide); otherwise every registration is a candidate.
    let named = q
        .filters
        .iter()
        .find(|(name, pattern)| name == "ep" && !pattern.ends_with('*'))
        .and_then(|(_, name)| dir.candidates_named(name));
    let candidates: Box<dyn Iterator<Item = &Registration>> = match named {
        Some(named) => Box::new(named),
        None => Box::new(dir.iter()),
    };
    let live = candidates.filter(move |r| r.expires_at > now);
    match kind {
        LookupKind::Endpoint => {
            let matching = live.filter(|r| {
                let links = dir.links(r.id);
                q.filters.iter().all(|(name, pattern)| {
                    endpoint_matches(r, name, pattern)
                        || links
                            .iter()
                            .any(|l| link_matches(l, &resolve(&r.base, &l.target), name, pattern))
                })
            });
            let links: Vec<Link> = q.window(matching).map(endpoint_link).collect();
            link_format::encode(&links)
        }
        LookupKind::Resource => {
            let matching = live.flat_map(|r| {
                dir.links(r.id).iter().filter_map(move |l| {
                    let resolved = resolve(&r.base, &l.target);
                    let keep = q.filters.iter().all(|(name, pattern)| {
                        link_matches(l, &resolved, name, pattern)
                            || endpoint_matches(r, name, pattern)
                    });
                    keep.then_some((r, l, resolved))
                })
            });
            // Only the page's links are copied.
            let links: Vec<Link> = q
                .window(matching)
                .map(|(r, l, resolved)| absolute_link(r, l.clone(), resolved))
                .collect();
            link_format::encode(&links)
        }
    }
}

/// A registration as an endpoint lookup answers it: its registration resource with
/// `ep`, `d`, `base` and its endpoint attributes (not `lt`, RFC 9176 §7.3).
fn endpoint_link(r: &Registration) -> Link {
    let mut link = Link::new(r.path()).attr("ep", r.ep.clone());
    if let Some(d) = &r.sector {
        link = link.attr("d", d.clone());
    }
    link = link.attr("base", r.base.clone());
    for (name, value) in &r.attrs {
        link = match value {
            Some(v) => link.attr(name.clone(), v.clone()),
            None => link.flag(name.clone()),
        };
    }
    link
}

/// A registered link as resource lookup answers it: absolute target, and an absolute
/// `anchor` (the base unless the link gave its own).
fn absolute_link(r: &Registration, mut link: Link, resolved: String) -> Link {
    link.target = resolved;
    match link.attrs.iter_mut().find(|(n, _)| n == "anchor") {
        Some((_, Some(anchor))) => *anchor = resolve(&r.base, anchor),
        _ => link.attrs.push(("anchor".into(), Some(r.base.clone()))),
    }
    link
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directory::{Directory, Registrant};
    use crate::limits::RdLimits;
    use crate::registration::{Owner, RegistrationParams};
    use std::net::{IpAddr, Ipv4Addr};

    fn directory() -> Directory {
        let mut d = Directory::new(RdLimits::default());
        let ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7));
        let who = Registrant {
            owner: Owner::Address(ip),
            peer_key: ip,
            source_base: "coap://192.0.2.7:61616".into(),
        };
        for (q, links) in [
            (
                &["ep=node1", "et=oic.d.sensor"][..],
                "</temp>;rt=\"temperature\";ct=0,</light>;rt=\"light-lux core.s\"",
            ),
            (
                &["ep=node2", "d=floor2", "base=coap://[2001:db8::2]"],
                "</temp>;rt=\"temperature-c\",<sub/hum>;if=\"core.s\"",
            ),
            (&["ep=gone", "lt=10"], "</temp>;rt=\"temperature\""),
        ] {
            let p = RegistrationParams::parse(q.iter().copied(), &RdLimits::default()).unwrap();
            let r = d.register(p, links.into(), &who, 0).unwrap();
            d.apply(r);
        }
        d
    }

    fn find(kind: LookupKind, q: &[&str]) -> String {
        let query = LookupQuery::parse(q.iter().copied(), 1000).unwrap();
        lookup(&directory(), kind, &query, 100)
    }

    #[test]
    fn endpoint_lookup_lists_live_registrations_with_their_attributes() {
        assert_eq!(
            find(LookupKind::Endpoint, &[]),
            "</rd/0>;ep=node1;base=coap://192.0.2.7:61616;et=oic.d.sensor,\
             </rd/1>;ep=node2;d=floor2;base=coap://[2001:db8::2]"
        );
        assert_eq!(
            find(LookupKind::Endpoint, &["d=floor2"])
                .matches("</rd/")
                .count(),
            1
        );
        assert!(find(LookupKind::Endpoint, &["et=oic.d.sensor"]).starts_with("</rd/0>"));
        // A resource attribute selects the endpoints that have such a resource.
        assert!(find(LookupKind::Endpoint, &["rt=light*"]).starts_with("</rd/0>"));
        assert_eq!(find(LookupKind::Endpoint, &["ep=nothing"]), "");
    }

    #[test]
    fn resource_lookup_answers_absolute_uris_with_anchor() {
        assert_eq!(
            find(LookupKind::Resource, &["rt=temperature"]),
            "<coap://192.0.2.7:61616/temp>;rt=\"temperature\";ct=0;anchor=\"coap://192.0.2.7:61616\""
        );
        let by_prefix = find(LookupKind::Resource, &["rt=temperature*"]);
        assert!(
            by_prefix.contains("<coap://[2001:db8::2]/temp>"),
            "{by_prefix}"
        );
        assert_eq!(by_prefix.matches('<').count(), 2);
        // One item of a space-separated rt matches.
        assert!(find(LookupKind::Resource, &["rt=core.s"])
            .starts_with("<coap://192.0.2.7:61616/light>"));
        // Relative references resolve against the base; endpoint attributes filter too.
        assert!(find(LookupKind::Resource, &["ep=node2", "if=core.s"])
            .starts_with("<coap://[2001:db8::2]/sub/hum>"));
        assert!(
            find(LookupKind::Resource, &["href=coap://192.0.2.7:61616/l*"]).contains("/light>")
        );
    }

    #[test]
    fn a_lookup_by_name_finds_the_same_with_or_without_the_name_index() {
        assert!(find(LookupKind::Resource, &["ep=node2"]).contains("sub/hum"));
        assert!(!find(LookupKind::Resource, &["ep=node2"]).contains("light"));
        assert_eq!(find(LookupKind::Endpoint, &["ep=nobody"]), "");
        // A link naming an endpoint in an attribute of its own matches `ep` too, so
        // the directory then looks at every registration.
        let mut d = directory();
        let ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 8));
        let who = Registrant {
            owner: Owner::Address(ip),
            peer_key: ip,
            source_base: "coap://192.0.2.8:5683".into(),
        };
        let p = RegistrationParams::parse(["ep=proxy"], &RdLimits::default()).unwrap();
        let r = d
            .register(p, "</relay>;ep=\"node1\"".into(), &who, 0)
            .unwrap();
        d.apply(r);
        assert!(d.candidates_named("node1").is_none());
        let q = LookupQuery::parse(["ep=node1"], 100).unwrap();
        let found = lookup(&d, LookupKind::Resource, &q, 1);
        assert!(
            found.contains("/relay") && found.contains("/temp"),
            "{found}"
        );
        let id = d.find("proxy", None).unwrap().id;
        d.remove(id);
        assert!(
            d.candidates_named("node1").is_some(),
            "the shortcut holds again"
        );
    }

    #[test]
    fn page_and_count_select_a_window() {
        let all = find(LookupKind::Resource, &[]);
        assert_eq!(all.matches('<').count(), 4);
        let first = find(LookupKind::Resource, &["count=3"]);
        let second = find(LookupKind::Resource, &["count=3", "page=1"]);
        assert_eq!(
            (first.matches('<').count(), second.matches('<').count()),
            (3, 1)
        );
        assert!(second.contains("sub/hum"));
        assert_eq!(find(LookupKind::Resource, &["count=3", "page=9"]), "");
        let e = LookupQuery::parse(["count=x"], 10).unwrap_err();
        assert!(e.message.contains("count=x"));
        assert_eq!(LookupQuery::parse(["count=99999"], 10).unwrap().count, 10);
    }
}

//! The LwM2M 1.1 registration interface (§6.2) on the resource directory's: what an
//! LwM2M client adds to an RFC 9176 registration (`lwm2m`, `b`, `sms`, `Q`, and a
//! body that lists objects and instances), checked before the directory stores it,
//! and the LwM2M view of a stored registration ([`ClientInfo`]).

use crate::path::LwPath;
use cobalt::Code;
use cobalt_proto::link_format::{self, Link};
use cobalt_rd::Registration;
use serde::Serialize;

/// The LwM2M versions this server manages.
pub const SUPPORTED_VERSIONS: [&str; 3] = ["1.0", "1.1", "1.2"];

/// The binding letters of LwM2M 1.1 (§6.2.1.1): UDP, MQTT, HTTP, TCP, SMS, Non-IP,
/// and queue mode (1.0).
const BINDING_LETTERS: &str = "UMHTSNQ";

/// A registered LwM2M client as the manager sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClientInfo {
    /// The registration's number (`/rd/<id>`).
    pub id: u64,
    /// The endpoint client name (`ep`).
    pub endpoint: String,
    /// `scheme://address:port` it registered from, where the manager reaches it.
    pub address: String,
    /// The lifetime in seconds (`lt`).
    pub lifetime: u32,
    /// When the registration expires: seconds since the Unix epoch.
    pub expires_at: u64,
    /// The LwM2M version (`lwm2m`; 1.0 when absent).
    pub version: String,
    /// The binding (`b`; `U` when absent).
    pub binding: String,
    /// Whether it is in queue mode (`Q`, or `Q` in a 1.0 binding).
    pub queue_mode: bool,
    /// The MSISDN (`sms`), if given.
    pub sms: Option<String>,
    /// The alternate path its objects live under (`/` unless its body says otherwise).
    pub root: String,
    /// The content formats it announced on its root link (`ct`).
    pub formats: Vec<u16>,
    /// The objects and object instances it registered.
    pub objects: Vec<LwPath>,
}

impl ClientInfo {
    /// The LwM2M view of a directory registration.
    pub fn of(r: &Registration) -> ClientInfo {
        let links = link_format::parse(&r.links).unwrap_or_default();
        let root = root_of(&links);
        let formats = links
            .iter()
            .find(|l| is_root_link(l))
            .map(|l| l.content_formats().collect())
            .unwrap_or_default();
        let objects = links
            .iter()
            .filter_map(|l| object_path(&root, &l.target))
            .collect();
        let binding = r.attr("b").unwrap_or_else(|| "U".into());
        ClientInfo {
            id: r.id,
            endpoint: r.ep.clone(),
            address: r.base.clone(),
            lifetime: r.lifetime,
            expires_at: r.expires_at,
            version: r.attr("lwm2m").unwrap_or_else(|| "1.0".into()),
            queue_mode: binding.contains('Q') || r.attrs.iter().any(|(n, _)| n == "Q"),
            binding,
            sms: r.attr("sms"),
            root,
            formats,
            objects,
        }
    }

    /// Whether it registered object `object` (or an instance of it).
    pub fn has_object(&self, object: u16) -> bool {
        self.objects.iter().any(|p| p.object == object)
    }
}

/// A registration or update the LwM2M rules refuse: the code and what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// 4.00, or 4.12 for an LwM2M version this server does not speak.
    pub code: Code,
    /// The diagnostic payload.
    pub message: String,
}

impl Refused {
    fn bad(message: String) -> Refused {
        Refused {
            code: Code::BAD_REQUEST,
            message,
        }
    }
}

/// Checks the LwM2M parts of a registration (`register` true) or update: `lwm2m`,
/// `b`, and that the body lists objects and object instances only. What the
/// directory checks itself (`ep`, `lt`, sizes, link-format syntax) is left to it: a
/// body that is not link-format passes here and gets the directory's 4.00.
pub fn check<'a>(
    query: impl IntoIterator<Item = &'a str>,
    body: &[u8],
    register: bool,
) -> Result<(), Refused> {
    for item in query {
        let (name, value) = item.split_once('=').unwrap_or((item, ""));
        match name {
            "lwm2m" if !register => {
                return Err(Refused::bad(
                    "an update cannot change `lwm2m`; register again".into(),
                ))
            }
            "lwm2m" if !SUPPORTED_VERSIONS.contains(&value) => {
                return Err(Refused {
                    code: Code::PRECONDITION_FAILED,
                    message: format!(
                        "LwM2M version {:?} is not supported: this server speaks {}",
                        short(value),
                        SUPPORTED_VERSIONS.join(", ")
                    ),
                })
            }
            "b" => check_binding(value)?,
            _ => {}
        }
    }
    let Some(links) = std::str::from_utf8(body)
        .ok()
        .filter(|t| !t.trim().is_empty())
        .and_then(|t| link_format::parse(t).ok())
    else {
        return Ok(());
    };
    let root = root_of(&links);
    if !is_plain_path(&root) {
        return Err(Refused::bad(format!(
            "the alternate path <{}> is not a path of letters, digits, '-', '.', '_' and '~'",
            short(&root)
        )));
    }
    for link in &links {
        if !is_root_link(link) && object_path(&root, &link.target).is_none() {
            return Err(Refused::bad(format!(
                "link <{}> is not an object or object instance{}",
                short(&link.target),
                if root == "/" {
                    String::new()
                } else {
                    format!(" under {root}")
                }
            )));
        }
    }
    Ok(())
}

fn check_binding(b: &str) -> Result<(), Refused> {
    let mut seen = String::new();
    for c in b.chars() {
        if !BINDING_LETTERS.contains(c) || seen.contains(c) {
            return Err(Refused::bad(format!(
                "binding `b={}` is not a set of the letters U, M, H, T, S, N and Q",
                short(b)
            )));
        }
        seen.push(c);
    }
    if seen.is_empty() {
        return Err(Refused::bad("`b` needs a value, e.g. `b=U`".into()));
    }
    Ok(())
}

/// Whether `path` is `/` or `/segment/...` of unreserved characters (RFC 3986), so
/// that the manager's request URIs can be built from it as they are.
fn is_plain_path(path: &str) -> bool {
    path == "/"
        || path.strip_prefix('/').is_some_and(|rest| {
            rest.trim_end_matches('/').split('/').all(|segment| {
                !segment.is_empty()
                    && segment.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
                    })
            })
        })
}

/// Whether `link` is the root link (`rt="oma.lwm2m"`), which names the alternate path.
fn is_root_link(link: &Link) -> bool {
    link.resource_types().any(|rt| rt == "oma.lwm2m")
}

/// The alternate path: the root link's target, `/` without one.
fn root_of(links: &[Link]) -> String {
    links
        .iter()
        .find(|l| is_root_link(l))
        .map_or_else(|| "/".to_string(), |l| l.target.clone())
}

/// The object or object-instance path a link target names under `root`.
fn object_path(root: &str, target: &str) -> Option<LwPath> {
    let rest = target.strip_prefix(root.trim_end_matches('/'))?;
    let path: LwPath = rest.parse().ok()?;
    (path.depth() <= 2).then_some(path)
}

fn short(s: &str) -> String {
    crate::codec::truncated(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_rd::Owner;
    use std::net::{IpAddr, Ipv4Addr};

    fn registration(attrs: &[(&str, Option<&str>)], links: &str) -> Registration {
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        Registration {
            id: 4,
            ep: "dev-1".into(),
            sector: None,
            base: "coap://127.0.0.1:40000".into(),
            lifetime: 300,
            expires_at: 1300,
            attrs: attrs
                .iter()
                .map(|(n, v)| (n.to_string(), v.map(str::to_string)))
                .collect(),
            links: links.into(),
            owner: Owner::Address(ip),
            peer_key: ip,
        }
    }

    #[test]
    fn a_leshan_registration_reads_as_client_info() {
        let r = registration(
            &[("lwm2m", Some("1.1")), ("b", Some("UQ"))],
            r#"</>;rt="oma.lwm2m";ct="60 110 112 11542",</1>;ver=1.1,</1/0>,</3/0>,</3303>"#,
        );
        let info = ClientInfo::of(&r);
        assert_eq!(info.version, "1.1");
        assert_eq!(info.binding, "UQ");
        assert!(info.queue_mode);
        assert_eq!(info.formats, vec![60, 110, 112, 11542]);
        assert_eq!(
            info.objects,
            vec![
                LwPath::object(1),
                LwPath::instance(1, 0),
                LwPath::instance(3, 0),
                LwPath::object(3303)
            ]
        );
        assert!(info.has_object(3303) && !info.has_object(5));
        let plain = ClientInfo::of(&registration(&[], "</3/0>"));
        assert_eq!(
            (plain.version.as_str(), plain.binding.as_str()),
            ("1.0", "U")
        );
        assert!(!plain.queue_mode);
    }

    #[test]
    fn an_alternate_path_prefixes_the_objects() {
        let r = registration(&[], r#"</lwm2m>;rt="oma.lwm2m",</lwm2m/3/0>,</lwm2m/1/0>"#);
        let info = ClientInfo::of(&r);
        assert_eq!(info.root, "/lwm2m");
        assert_eq!(
            info.objects,
            vec![LwPath::instance(3, 0), LwPath::instance(1, 0)]
        );
        assert!(check([], br#"</lwm2m>;rt="oma.lwm2m",</lwm2m/3/0>"#, true).is_ok());
        let e = check([], br#"</lwm2m>;rt="oma.lwm2m",</3/0>"#, true).unwrap_err();
        assert!(e.message.contains("under /lwm2m"), "{}", e.message);
        for root in ["</a?b>", "</a//b>", "<x>", "</a%2fb>", "</a b>"] {
            let body = format!(r#"{root};rt="oma.lwm2m",</3/0>"#);
            let e = check([], body.as_bytes(), true).unwrap_err();
            assert!(
                e.message.contains("alternate path"),
                "{root}: {}",
                e.message
            );
        }
    }

    #[test]
    fn lwm2m_parameters_and_bodies_are_checked() {
        let ok = check(
            ["ep=a", "lt=60", "lwm2m=1.1", "b=U", "Q"],
            b"</1/0>,</3/0>",
            true,
        );
        assert!(ok.is_ok());
        for (query, body, code, says) in [
            (
                &["lwm2m=9.9"][..],
                &b""[..],
                Code::PRECONDITION_FAILED,
                "not supported",
            ),
            (&["b=X"], b"", Code::BAD_REQUEST, "binding"),
            (&["b=UU"], b"", Code::BAD_REQUEST, "binding"),
            (&["b="], b"", Code::BAD_REQUEST, "needs a value"),
            (&["ep=a"], b"</temp>", Code::BAD_REQUEST, "not an object"),
            (&["ep=a"], b"</3/0/1>", Code::BAD_REQUEST, "not an object"),
            (&["ep=a"], b"</70000>", Code::BAD_REQUEST, "not an object"),
        ] {
            let e = check(query.iter().copied(), body, true).unwrap_err();
            assert_eq!(e.code, code, "{query:?}");
            assert!(e.message.contains(says), "{query:?}: {}", e.message);
        }
        assert!(check(["lwm2m=1.1"], b"", false).is_err());
        // Not link-format at all: left to the directory's own 4.00.
        assert!(check([], b"</3/0", true).is_ok());
    }
}

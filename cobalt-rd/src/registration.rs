//! One registration as the directory keeps and stores it, who owns it, and the
//! parsing of the registration interface's query parameters (RFC 9176 §5.3).

use crate::error::RdError;
use crate::limits::RdLimits;
use cobalt::server::{Credential, PeerIdentity};
use cobalt_proto::link_format;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// The lifetime of a registration that gives no `lt`: 90,000 s (25 h, RFC 9176 §5.3).
pub const DEFAULT_LIFETIME: u32 = 90_000;

/// Who may update or remove a registration: the credential that created it over
/// DTLS or TLS, else the address budget it came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Owner {
    /// The PSK identity of the registering peer.
    Psk(Vec<u8>),
    /// The verified certificate subject of the registering peer.
    Certificate(String),
    /// The address key ([`AddressKey`](cobalt_proto::address::AddressKey)) of a peer
    /// that proved no credential (plain `coap`).
    Address(IpAddr),
}

impl Owner {
    /// The owner a request from `identity` acts as; `address_key` is the key of its
    /// source address.
    pub fn of(identity: &PeerIdentity, address_key: IpAddr) -> Owner {
        match identity.credential() {
            Some(Credential::PskIdentity(id)) => Owner::Psk(id.clone()),
            Some(Credential::Certificate { subject }) => Owner::Certificate(subject.clone()),
            None => Owner::Address(address_key),
        }
    }
}

/// A registration: the endpoint's name and attributes, its links, its lifetime as an
/// absolute wall-clock expiry, and its owner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Registration {
    /// The number in the registration resource's path, `/rd/<id>`.
    pub id: u64,
    /// The endpoint name (`ep`).
    pub ep: String,
    /// The sector (`d`), if one was given.
    pub sector: Option<String>,
    /// The base URI the endpoint's relative links resolve against.
    pub base: String,
    /// The lifetime in seconds (`lt`).
    pub lifetime: u32,
    /// When it expires: seconds since the Unix epoch (wall clock).
    pub expires_at: u64,
    /// Endpoint attributes other than `ep`, `d`, `lt` and `base` (`et` among them), in
    /// the order given; `None` for an attribute without a value.
    pub attrs: Vec<(String, Option<String>)>,
    /// The registered links, as link-format text.
    pub links: String,
    /// Who registered it.
    pub owner: Owner,
    /// The address budget it counts against.
    pub peer_key: IpAddr,
}

impl Registration {
    /// The path of its registration resource.
    pub fn path(&self) -> String {
        format!("/rd/{}", self.id)
    }

    /// The value of endpoint attribute `name` as a lookup filter sees it: `ep`, `d`,
    /// `base`, `href` (the registration resource) or any other registered attribute.
    pub fn attr(&self, name: &str) -> Option<String> {
        match name {
            "ep" => Some(self.ep.clone()),
            "d" => self.sector.clone(),
            "base" => Some(self.base.clone()),
            "href" => Some(self.path()),
            "lt" => Some(self.lifetime.to_string()),
            _ => self
                .attrs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone().unwrap_or_default()),
        }
    }
}

/// The query parameters of a registration or update request, checked against the limits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RegistrationParams {
    /// `ep`.
    pub ep: Option<String>,
    /// `d`.
    pub sector: Option<String>,
    /// `lt`.
    pub lifetime: Option<u32>,
    /// `base`.
    pub base: Option<String>,
    /// Every other attribute.
    pub attrs: Vec<(String, Option<String>)>,
}

impl RegistrationParams {
    /// Parses the Uri-Query items of a registration (`ep=..&d=..&lt=..&base=..&et=..`).
    /// Anything malformed or over a limit is a 4.00 saying which parameter and why.
    pub fn parse<'a>(
        query: impl IntoIterator<Item = &'a str>,
        limits: &RdLimits,
    ) -> Result<RegistrationParams, RdError> {
        let mut p = RegistrationParams::default();
        for item in query {
            let (name, value) = match item.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (item, None),
            };
            if name.is_empty() || !name.bytes().all(is_attr_name_byte) {
                return Err(RdError::bad_request(format!(
                    "query parameter {:?} is not an attribute name (letters, digits, '-', '_', '.')",
                    truncated(name)
                )));
            }
            let required = |v: Option<&'a str>| -> Result<&'a str, RdError> {
                v.filter(|v| !v.is_empty())
                    .ok_or_else(|| RdError::bad_request(format!("`{name}` needs a value")))
            };
            match name {
                "ep" | "d" => {
                    let v = required(value)?;
                    if v.len() > limits.max_name_bytes {
                        return Err(RdError::bad_request(format!(
                            "`{name}` is {} bytes; at most {} are allowed",
                            v.len(),
                            limits.max_name_bytes
                        )));
                    }
                    let slot = if name == "ep" {
                        &mut p.ep
                    } else {
                        &mut p.sector
                    };
                    if slot.replace(v.to_string()).is_some() {
                        return Err(RdError::bad_request(format!("`{name}` is given twice")));
                    }
                }
                "lt" => {
                    let v = required(value)?;
                    let lt = v.parse::<u32>().ok().filter(|&lt| lt >= 1).ok_or_else(|| {
                        RdError::bad_request(format!(
                            "`lt={}` is not a lifetime: give whole seconds from 1 to 4294967295",
                            truncated(v)
                        ))
                    })?;
                    p.lifetime = Some(lt);
                }
                "base" => {
                    let v = required(value)?;
                    check_len(name, v, limits)?;
                    if !is_base_uri(v) {
                        return Err(RdError::bad_request(format!(
                            "`base={}` is not coap[s][+tcp|+ws]://host[:port]",
                            truncated(v)
                        )));
                    }
                    p.base = Some(v.trim_end_matches('/').to_string());
                }
                _ => {
                    if let Some(v) = value {
                        check_len(name, v, limits)?;
                    }
                    if p.attrs.len() >= limits.max_endpoint_attrs {
                        return Err(RdError::bad_request(format!(
                            "more than {} endpoint attributes",
                            limits.max_endpoint_attrs
                        )));
                    }
                    p.attrs.push((name.to_string(), value.map(str::to_string)));
                }
            }
        }
        Ok(p)
    }
}

/// Parses and checks a registration's link-format body: its size (4.13), its syntax
/// (4.00), its number of links (4.13) and every attribute's length (4.00). Returns
/// the links as the directory stores them.
pub fn parse_links(body: &[u8], limits: &RdLimits) -> Result<String, RdError> {
    if body.len() > limits.max_body_bytes {
        return Err(RdError::too_large(
            format!(
                "the link-format body is {} bytes; at most {} are accepted",
                body.len(),
                limits.max_body_bytes
            ),
            limits.max_body_bytes,
        ));
    }
    let text = std::str::from_utf8(body)
        .map_err(|e| RdError::bad_request(format!("the link-format body is not UTF-8: {e}")))?;
    if text.trim().is_empty() {
        return Ok(String::new());
    }
    let links = link_format::parse(text)
        .map_err(|e| RdError::bad_request(format!("malformed link-format: {e}")))?;
    if links.len() > limits.max_links {
        return Err(RdError::too_large(
            format!(
                "{} links in one registration; at most {} are accepted",
                links.len(),
                limits.max_links
            ),
            limits.max_body_bytes,
        ));
    }
    for link in &links {
        check_len("link target", &link.target, limits)?;
        for (name, value) in &link.attrs {
            check_len(name, name, limits)?;
            if let Some(v) = value {
                check_len(name, v, limits)?;
            }
        }
    }
    Ok(link_format::encode(&links))
}

fn check_len(name: &str, value: &str, limits: &RdLimits) -> Result<(), RdError> {
    if value.len() > limits.max_attr_bytes {
        return Err(RdError::bad_request(format!(
            "`{}` is {} bytes long; at most {} are allowed",
            truncated(name),
            value.len(),
            limits.max_attr_bytes
        )));
    }
    Ok(())
}

/// Whether `b` may appear in an attribute name (RFC 6690 `parmname`, without `*`).
fn is_attr_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'!' | b'#' | b'$' | b'+')
}

/// Whether `uri` is `scheme://authority` with a CoAP scheme and no path.
fn is_base_uri(uri: &str) -> bool {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return false;
    };
    let known = matches!(
        scheme,
        "coap" | "coaps" | "coap+tcp" | "coaps+tcp" | "coap+ws" | "coaps+ws"
    );
    let authority = rest.trim_end_matches('/');
    known
        && !authority.is_empty()
        && !authority
            .bytes()
            .any(|b| b == b'/' || b == b'?' || b == b'#' || b.is_ascii_whitespace())
}

/// At most 40 characters of `s`, for error messages about hostile input.
pub(crate) fn truncated(s: &str) -> String {
    match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt::Code;

    fn parse(q: &[&str]) -> Result<RegistrationParams, RdError> {
        RegistrationParams::parse(q.iter().copied(), &RdLimits::default())
    }

    #[test]
    fn the_owner_is_the_credential_else_the_address_key() {
        use cobalt::Scheme;
        use std::sync::Arc;
        let addr: std::net::SocketAddr = "192.0.2.1:40000".parse().unwrap();
        let key = addr.ip();
        let plain = PeerIdentity::new(Scheme::Coap, addr, None);
        assert_eq!(Owner::of(&plain, key), Owner::Address(key));
        let psk = PeerIdentity::new(
            Scheme::Coaps,
            addr,
            Some(Arc::new(Credential::PskIdentity(b"dev-1".to_vec()))),
        );
        assert_eq!(Owner::of(&psk, key), Owner::Psk(b"dev-1".to_vec()));
        let subject = "CN=dev-2,O=Example".to_string();
        let cert = Credential::Certificate {
            subject: subject.clone(),
        };
        let cert = PeerIdentity::new(Scheme::CoapsTcp, addr, Some(Arc::new(cert)));
        assert_eq!(Owner::of(&cert, key), Owner::Certificate(subject));
    }

    #[test]
    fn parses_the_registration_parameters() {
        let p = parse(&[
            "ep=node1",
            "d=floor2",
            "lt=300",
            "base=coap://[::1]:61616/",
            "et=oic.d.sensor",
            "x",
        ])
        .unwrap();
        assert_eq!(p.ep.as_deref(), Some("node1"));
        assert_eq!(p.sector.as_deref(), Some("floor2"));
        assert_eq!(p.lifetime, Some(300));
        assert_eq!(p.base.as_deref(), Some("coap://[::1]:61616"));
        assert_eq!(
            p.attrs,
            vec![
                ("et".into(), Some("oic.d.sensor".into())),
                ("x".into(), None)
            ]
        );
    }

    #[test]
    fn malformed_parameters_are_bad_requests_saying_which() {
        for (q, says) in [
            (&["lt=0"][..], "lt=0"),
            (&["lt=-5"], "lt=-5"),
            (&["lt=4294967296"], "lt=4294967296"),
            (&["base=http://x"], "base"),
            (&["base=coap://h/path"], "base"),
            (&["ep="], "`ep` needs a value"),
            (&["ep=a", "ep=b"], "twice"),
            (&["b a=1"], "not an attribute name"),
        ] {
            let e = parse(q).unwrap_err();
            assert_eq!(e.code, Code::BAD_REQUEST, "{q:?}");
            assert!(e.message.contains(says), "{q:?}: {}", e.message);
        }
        let long = format!("ep={}", "n".repeat(64));
        assert!(parse(&[&long]).unwrap_err().message.contains("64 bytes"));
        let long = format!("et={}", "n".repeat(256));
        assert_eq!(parse(&[&long]).unwrap_err().code, Code::BAD_REQUEST);
    }

    #[test]
    fn link_bodies_are_checked_for_size_syntax_count_and_lengths() {
        let limits = RdLimits {
            max_body_bytes: 64,
            max_links: 2,
            ..RdLimits::default()
        };
        assert_eq!(
            parse_links(b"</a>;rt=\"t\",</b>", &limits).unwrap(),
            "</a>;rt=\"t\",</b>"
        );
        let e = parse_links(&[b'x'; 65], &limits).unwrap_err();
        assert_eq!(
            (e.code, e.size1),
            (Code::REQUEST_ENTITY_TOO_LARGE, Some(64))
        );
        assert_eq!(
            parse_links(b"</a>,</b>,</c>", &limits).unwrap_err().code,
            Code::REQUEST_ENTITY_TOO_LARGE
        );
        let e = parse_links(b"</a;rt=x", &limits).unwrap_err();
        assert_eq!(e.code, Code::BAD_REQUEST);
        assert!(e.message.contains("malformed link-format"), "{}", e.message);
        let long = format!("</a>;rt=\"{}\"", "r".repeat(300));
        let limits = RdLimits::default();
        assert_eq!(
            parse_links(long.as_bytes(), &limits).unwrap_err().code,
            Code::BAD_REQUEST
        );
        assert_eq!(
            parse_links(&[0xff, 0xfe], &limits).unwrap_err().code,
            Code::BAD_REQUEST
        );
    }
}

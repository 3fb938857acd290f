//! Where a proxied request goes: the target URI taken from Proxy-Uri, or from
//! Proxy-Scheme with the Uri-* options (RFC 7252 §5.7.2, §6.5), or from a reverse
//! route's origin and the rest of the request's path; and the target written back as a
//! URI for the client.

use cobalt::proto::message::{opt, Code, Options};
use cobalt::proto::uri::{CoapUri, Scheme};
use cobalt::Response;
use std::fmt::Write as _;

/// Longest Proxy-Uri the option allows (RFC 7252 §5.10: 1 to 1034 bytes).
pub const MAX_PROXY_URI: usize = 1034;

/// Why a request names no target this proxy can serve, as the answer it gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The response code.
    pub code: Code,
    /// What happened and what to do.
    pub reason: String,
}

impl Refused {
    pub(crate) fn new(code: Code, reason: impl Into<String>) -> Refused {
        Refused {
            code,
            reason: reason.into(),
        }
    }

    /// The answer: the code with the reason as diagnostic payload.
    pub fn into_response(self) -> Response {
        Response::new(self.code).with_payload(self.reason)
    }
}

/// Whether `options` ask for forward proxying (Proxy-Uri or Proxy-Scheme).
pub fn is_proxy_request(options: &Options) -> bool {
    options.contains(opt::PROXY_URI) || options.contains(opt::PROXY_SCHEME)
}

/// The target of a forward-proxy request: from Proxy-Uri (which takes precedence over
/// the Uri-* options), else from Proxy-Scheme and Uri-Host, Uri-Port, Uri-Path and
/// Uri-Query. A Proxy-Uri over 1034 bytes is a bad option (4.02, RFC 7252 §5.4.1: an
/// option with a length outside its range is treated as unrecognised, and Proxy-Uri is
/// critical); one that is not a URI is a bad request (4.00); a scheme that is not a
/// CoAP scheme (`http`, ...) is not proxied here (5.05).
pub fn forward_target(options: &Options) -> Result<CoapUri, Refused> {
    if let Some(raw) = options.get(opt::PROXY_URI) {
        if raw.len() > MAX_PROXY_URI || raw.is_empty() {
            return Err(Refused::new(
                Code::BAD_OPTION,
                format!(
                    "Proxy-Uri of {} bytes; the option holds 1 to {MAX_PROXY_URI}",
                    raw.len()
                ),
            ));
        }
        let text = std::str::from_utf8(raw)
            .map_err(|_| Refused::new(Code::BAD_REQUEST, "Proxy-Uri is not UTF-8"))?;
        let Some((scheme, _)) = text.split_once("://") else {
            return Err(Refused::new(
                Code::BAD_REQUEST,
                format!("Proxy-Uri '{text}' is not an absolute URI (scheme://host/path)"),
            ));
        };
        scheme_of(scheme)?;
        return CoapUri::parse(text).map_err(|e| Refused::new(Code::BAD_REQUEST, e.to_string()));
    }
    let raw = options.get(opt::PROXY_SCHEME).unwrap_or_default();
    let scheme = std::str::from_utf8(raw)
        .map_err(|_| Refused::new(Code::BAD_REQUEST, "Proxy-Scheme is not UTF-8"))?;
    let scheme = scheme_of(scheme)?;
    let host = options
        .get(opt::URI_HOST)
        .and_then(|h| std::str::from_utf8(h).ok())
        .filter(|h| !h.is_empty())
        .ok_or_else(|| {
            Refused::new(
                Code::BAD_REQUEST,
                "Proxy-Scheme without Uri-Host: name the origin in Uri-Host (or send Proxy-Uri)",
            )
        })?;
    let port = match options.get_uint(opt::URI_PORT) {
        None => scheme.default_port(),
        Some(p) => u16::try_from(p).ok().filter(|p| *p != 0).ok_or_else(|| {
            Refused::new(Code::BAD_REQUEST, format!("Uri-Port {p} is not a port"))
        })?,
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Ok(CoapUri {
        scheme,
        host: host.to_string(),
        zone: None,
        port,
        path: options.uri_path().map(str::to_string).collect(),
        query: options.uri_query().map(str::to_string).collect(),
    })
}

/// The CoAP scheme `name`, or 5.05 saying it is not proxied.
fn scheme_of(name: &str) -> Result<Scheme, Refused> {
    name.parse::<Scheme>().map_err(|_| {
        Refused::new(
            Code::PROXYING_NOT_SUPPORTED,
            format!(
                "scheme '{name}' is not proxied here; targets are coap, coaps, coap+tcp, coaps+tcp, coap+ws and coaps+ws"
            ),
        )
    })
}

/// The target of a request to a reverse route: `origin` with the request's remaining
/// path segments appended and its query items after the origin's.
pub fn reverse_target(origin: &CoapUri, rest: &[&str], query: &[&str]) -> CoapUri {
    let mut target = origin.clone();
    target
        .path
        .extend(rest.iter().filter(|s| !s.is_empty()).map(|s| s.to_string()));
    target.query.extend(query.iter().map(|q| q.to_string()));
    target
}

/// `uri` written so that parsing it gives back the same segments: path segments and
/// query items percent-encoded where they hold a delimiter or anything outside
/// printable ASCII.
pub fn uri_string(uri: &CoapUri) -> String {
    let mut s = format!("{}://", uri.scheme.as_str());
    match (&uri.zone, uri.host.contains(':')) {
        (Some(zone), _) => write!(s, "[{}%25{zone}]", uri.host),
        (None, true) => write!(s, "[{}]", uri.host),
        (None, false) => write!(s, "{}", uri.host),
    }
    .expect("writing to a String");
    if uri.port != uri.scheme.default_port() {
        write!(s, ":{}", uri.port).expect("writing to a String");
    }
    for seg in &uri.path {
        s.push('/');
        encode_into(&mut s, seg, b"!$'()*+,;=:@&");
    }
    if uri.path.is_empty() {
        s.push('/');
    }
    for (i, q) in uri.query.iter().enumerate() {
        s.push(if i == 0 { '?' } else { '&' });
        encode_into(&mut s, q, b"!$'()*+,;=:@/?");
    }
    s
}

/// Appends `text` to `out`, percent-encoding every byte that is not unreserved
/// (RFC 3986) or in `allowed`.
fn encode_into(out: &mut String, text: &str, allowed: &[u8]) {
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || allowed.contains(&b) {
            out.push(char::from(b));
        } else {
            write!(out, "%{b:02X}").expect("writing to a String");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(number: u16, value: &str) -> Options {
        let mut o = Options::new();
        o.set(number, value.as_bytes());
        o
    }

    #[test]
    fn proxy_uri_names_the_target() {
        let t = forward_target(&with(opt::PROXY_URI, "coap+tcp://h.example:7/a/b?x=1")).unwrap();
        assert_eq!(
            (t.scheme, t.host.as_str(), t.port),
            (Scheme::CoapTcp, "h.example", 7)
        );
        assert_eq!(t.path, ["a", "b"]);
        assert_eq!(t.query, ["x=1"]);
    }

    #[test]
    fn proxy_scheme_takes_the_uri_options() {
        let mut o = with(opt::PROXY_SCHEME, "coap");
        o.set(opt::URI_HOST, b"192.0.2.1");
        o.set_uri_path("/s/t");
        let t = forward_target(&o).unwrap();
        assert_eq!((t.host.as_str(), t.port), ("192.0.2.1", 5683));
        assert_eq!(t.path, ["s", "t"]);
        let e = forward_target(&with(opt::PROXY_SCHEME, "coap")).unwrap_err();
        assert_eq!(e.code, Code::BAD_REQUEST);
    }

    #[test]
    fn bad_proxy_uris_get_the_rfc_codes() {
        let long = format!("coap://h/{}", "a".repeat(MAX_PROXY_URI));
        assert_eq!(
            forward_target(&with(opt::PROXY_URI, &long))
                .unwrap_err()
                .code,
            Code::BAD_OPTION
        );
        for (uri, code) in [
            ("http://example.org/", Code::PROXYING_NOT_SUPPORTED),
            ("gopher://x/", Code::PROXYING_NOT_SUPPORTED),
            ("coap://", Code::BAD_REQUEST),
            ("not a uri", Code::BAD_REQUEST),
            ("coap://h/#frag", Code::BAD_REQUEST),
            ("coap://h:99999/", Code::BAD_REQUEST),
        ] {
            assert_eq!(
                forward_target(&with(opt::PROXY_URI, uri)).unwrap_err().code,
                code,
                "{uri}"
            );
        }
        assert_eq!(
            forward_target(&with(opt::PROXY_SCHEME, "http"))
                .unwrap_err()
                .code,
            Code::PROXYING_NOT_SUPPORTED
        );
    }

    #[test]
    fn reverse_targets_append_path_and_query() {
        let origin = CoapUri::parse("coap://[::1]:5999/base?k=v").unwrap();
        let t = reverse_target(&origin, &["a", "b"], &["q=1"]);
        assert_eq!(uri_string(&t), "coap://[::1]:5999/base/a/b?k=v&q=1");
    }

    #[test]
    fn uri_strings_round_trip_odd_segments() {
        let mut t = CoapUri::parse("coaps://h/").unwrap();
        t.path = vec!["a/b".into(), "c?d".into(), "é %".into()];
        t.query = vec!["x=&y".into()];
        let again = CoapUri::parse(&uri_string(&t)).unwrap();
        assert_eq!(again.path, t.path);
        assert_eq!(again.query, t.query);
        assert_eq!(
            uri_string(&CoapUri::parse("coap://h").unwrap()),
            "coap://h/"
        );
    }
}

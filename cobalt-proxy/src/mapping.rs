//! RFC 8075 mappings between HTTP and CoAP: methods, status codes (§7), media types
//! and Content-Formats (§6.1, unknown formats as `application/coap-payload; cf=N`),
//! entity tags, and Max-Age / Cache-Control.

use cobalt::proto::message::Code;

/// The CoAP method for an HTTP method (RFC 8075 §6; FETCH and PATCH from RFC 8132),
/// or `None` for one a CoAP origin cannot be asked (answered 501).
pub fn coap_method(http: &str) -> Option<Code> {
    Some(match http {
        "GET" => Code::GET,
        "POST" => Code::POST,
        "PUT" => Code::PUT,
        "DELETE" => Code::DELETE,
        "FETCH" => Code::FETCH,
        "PATCH" => Code::PATCH,
        _ => return None,
    })
}

/// The HTTP status for a CoAP response code (RFC 8075 §7, Table 4): 2.01→201;
/// 2.02, 2.04 and 2.05→200 (204 when there is no body); 2.03→304 when the client sent
/// validators (else 200); 4.01→403 (CoAP's 4.01 carries no HTTP challenge), 4.02,
/// 4.05 and 4.08→400; 5.05→502; 5.08 Hop Limit Reached→508 Loop Detected; any other
/// 4.xx/5.xx the same number (4.04→404, 5.04→504), and an unknown success→200.
pub fn http_status(code: Code, has_body: bool, conditional: bool) -> u16 {
    match (code.class(), code.detail()) {
        (2, 1) => 201,
        (2, 3) if conditional => 304,
        (2, 2 | 4 | 5) if !has_body => 204,
        (2, _) => 200,
        (4, 1) => 403,
        (4, 2 | 5 | 8) => 400,
        (5, 5) => 502,
        (5, 8) => 508,
        (c @ (4 | 5), d) => u16::from(c) * 100 + u16::from(d),
        _ => 502,
    }
}

/// The Content-Formats this proxy names as media types, and their names.
const FORMATS: &[(u16, &str)] = &[
    (0, "text/plain; charset=utf-8"),
    (40, "application/link-format"),
    (41, "application/xml"),
    (42, "application/octet-stream"),
    (47, "application/exi"),
    (50, "application/json"),
    (60, "application/cbor"),
    (110, "application/senml+json"),
    (112, "application/senml+cbor"),
    (11542, "application/vnd.oma.lwm2m+tlv"),
    (11543, "application/vnd.oma.lwm2m+json"),
];

/// The media type for a Content-Format: its registered name, else
/// `application/coap-payload; cf=N` (RFC 8075 §6.1).
pub fn media_type(cf: u16) -> String {
    FORMATS.iter().find(|(n, _)| *n == cf).map_or_else(
        || format!("application/coap-payload; cf={cf}"),
        |(_, m)| (*m).to_string(),
    )
}

/// The Content-Format for a media type (`Content-Type` or one `Accept` entry):
/// parameters other than `charset=utf-8` (for text) and `cf` (for
/// `application/coap-payload`) make it unknown. `None` for an unknown type.
pub fn content_format(media: &str) -> Option<u16> {
    let mut parts = media.split(';').map(str::trim);
    let essence = parts.next()?.to_ascii_lowercase();
    let params: Vec<(String, String)> = parts
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (
                k.trim().to_ascii_lowercase(),
                v.trim().trim_matches('"').to_ascii_lowercase(),
            )
        })
        .collect();
    if essence == "application/coap-payload" {
        return match params.as_slice() {
            [(k, v)] if k == "cf" => v.parse().ok(),
            _ => None,
        };
    }
    let ok_params = params
        .iter()
        .all(|(k, v)| essence == "text/plain" && k == "charset" && v == "utf-8");
    if !ok_params {
        return None;
    }
    FORMATS
        .iter()
        .find(|(_, m)| m.split(';').next() == Some(essence.as_str()))
        .map(|(n, _)| *n)
}

/// A CoAP ETag as an HTTP entity tag: the bytes in hex, quoted (`"0a1b"`).
pub fn http_etag(etag: &[u8]) -> String {
    let mut s = String::with_capacity(etag.len() * 2 + 2);
    s.push('"');
    for b in etag {
        s.push_str(&format!("{b:02x}"));
    }
    s.push('"');
    s
}

/// The CoAP ETag of an HTTP entity tag written by [`http_etag`] (weak tags and tags
/// that are not 1 to 8 bytes of hex have no CoAP equivalent: `None`).
pub fn coap_etag(tag: &str) -> Option<Vec<u8>> {
    let hex = tag.trim().strip_prefix('"')?.strip_suffix('"')?;
    if hex.is_empty() || hex.len() % 2 != 0 || hex.len() > 16 {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_follow_rfc_8075_section_7() {
        for (code, body, cond, status) in [
            (Code::CREATED, false, false, 201),
            (Code::DELETED, false, false, 204),
            (Code::VALID, false, true, 304),
            (Code::CHANGED, true, false, 200),
            (Code::CHANGED, false, false, 204),
            (Code::CONTENT, true, false, 200),
            (Code::BAD_REQUEST, true, false, 400),
            (Code::UNAUTHORIZED, true, false, 403),
            (Code::BAD_OPTION, true, false, 400),
            (Code::NOT_FOUND, true, false, 404),
            (Code::METHOD_NOT_ALLOWED, true, false, 400),
            (Code::NOT_ACCEPTABLE, true, false, 406),
            (Code::REQUEST_ENTITY_INCOMPLETE, true, false, 400),
            (Code::PRECONDITION_FAILED, true, false, 412),
            (Code::REQUEST_ENTITY_TOO_LARGE, true, false, 413),
            (Code::UNSUPPORTED_CONTENT_FORMAT, true, false, 415),
            (Code::TOO_MANY_REQUESTS, true, false, 429),
            (Code::INTERNAL_SERVER_ERROR, true, false, 500),
            (Code::NOT_IMPLEMENTED, true, false, 501),
            (Code::BAD_GATEWAY, true, false, 502),
            (Code::SERVICE_UNAVAILABLE, true, false, 503),
            (Code::GATEWAY_TIMEOUT, true, false, 504),
            (Code::PROXYING_NOT_SUPPORTED, true, false, 502),
            (Code::new(5, 8), true, false, 508),
        ] {
            assert_eq!(http_status(code, body, cond), status, "{code}");
        }
    }

    #[test]
    fn media_types_and_content_formats_map_both_ways() {
        assert_eq!(content_format("application/json"), Some(50));
        assert_eq!(content_format("Text/Plain; charset=UTF-8"), Some(0));
        assert_eq!(content_format("text/plain"), Some(0));
        assert_eq!(content_format("text/plain; charset=latin1"), None);
        assert_eq!(
            content_format("application/coap-payload; cf=65000"),
            Some(65000)
        );
        assert_eq!(content_format("application/coap-payload"), None);
        assert_eq!(content_format("image/png"), None);
        assert_eq!(media_type(60), "application/cbor");
        assert_eq!(media_type(65000), "application/coap-payload; cf=65000");
        for (cf, _) in FORMATS {
            assert_eq!(content_format(&media_type(*cf)), Some(*cf));
        }
    }

    #[test]
    fn entity_tags_round_trip_and_weak_tags_do_not_map() {
        assert_eq!(http_etag(&[0x0a, 0xff]), "\"0aff\"");
        assert_eq!(coap_etag("\"0aff\""), Some(vec![0x0a, 0xff]));
        assert_eq!(coap_etag("W/\"0aff\""), None);
        assert_eq!(coap_etag("\"xyz\""), None);
        assert_eq!(
            coap_etag("\"00112233445566778899\""),
            None,
            "longer than 8 bytes"
        );
        assert_eq!(coap_method("PATCH"), Some(Code::PATCH));
        assert_eq!(coap_method("TRACE"), None);
    }
}

//! Requests this server refuses whatever resource they name, checked before uploads
//! and routing, the same over every transport (UDP, DTLS, TCP, TLS, WebSockets).

use super::carried::Carried;
use super::request::Response;
use cobalt_proto::blockwise::BERT_SZX;
use cobalt_proto::message::{opt, Code, Message};

/// The answer to a request that must not reach a resource, if it is one of these:
/// - Proxy-Uri or Proxy-Scheme, unless `proxying` (a layer of the server declared
///   that it handles them, see [`Layer::options`](super::Layer::options)): 5.05
///   Proxying Not Supported (RFC 7252 §5.7.2), since this server is then not a
///   forward proxy and must not serve such a request locally;
/// - Block1 or Block2 with SZX 7 where BERT is not in use (`bert` false: always over
///   UDP and DTLS, and over a connection whose server did not announce BERT):
///   4.00 Bad Request (RFC 7959 §2.2 reserves the value; RFC 8323 §6 gives it to BERT).
///
/// `carried` tells which options `request` has.
pub(crate) fn refusal(
    request: &Message,
    carried: Carried,
    bert: bool,
    proxying: bool,
) -> Option<Response> {
    let proxy = carried.may_have(opt::PROXY_URI) || carried.may_have(opt::PROXY_SCHEME);
    if proxy && !proxying && refused_as_proxy_request(request) {
        return Some(
            Response::new(Code::PROXYING_NOT_SUPPORTED)
                .with_payload("this server is not a proxy; send the request to the origin server"),
        );
    }
    for (number, name) in [(opt::BLOCK1, "Block1"), (opt::BLOCK2, "Block2")] {
        let reserved = carried
            .block(request, number)
            .is_some_and(|b| b.szx == BERT_SZX);
        if reserved && !bert {
            return Some(Response::new(Code::BAD_REQUEST).with_payload(format!(
                "{name} with SZX 7 is reserved (BERT is only for CoAP over TCP and WebSockets when announced)"
            )));
        }
    }
    None
}

/// Whether `request` carries Proxy-Uri or Proxy-Scheme.
fn refused_as_proxy_request(request: &Message) -> bool {
    let o = &request.options;
    o.contains(opt::PROXY_URI) || o.contains(opt::PROXY_SCHEME)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_proto::message::{BlockValue, MessageType};

    fn get() -> Message {
        let mut m = Message::new(MessageType::Confirmable, Code::GET, 1);
        m.options.set_uri_path("/large");
        m
    }

    #[test]
    fn proxy_requests_are_refused_with_5_05() {
        let mut m = get();
        m.options.set(opt::PROXY_URI, &b"coap://example.org/x"[..]);
        assert_eq!(
            refusal(&m, Carried::of(&m.options), false, false)
                .unwrap()
                .code,
            Code::PROXYING_NOT_SUPPORTED
        );
        let mut m = get();
        m.options.set(opt::PROXY_SCHEME, &b"coap"[..]);
        assert_eq!(
            refusal(&m, Carried::of(&m.options), true, false)
                .unwrap()
                .code,
            Code::PROXYING_NOT_SUPPORTED
        );
        assert!(refusal(&get(), Carried::of(&get().options), false, false).is_none());
    }

    #[test]
    fn proxy_requests_pass_when_a_layer_proxies() {
        let mut m = get();
        m.options.set(opt::PROXY_URI, &b"coap://example.org/x"[..]);
        assert!(refusal(&m, Carried::of(&m.options), false, true).is_none());
    }

    #[test]
    fn szx_7_is_refused_unless_bert() {
        for number in [opt::BLOCK1, opt::BLOCK2] {
            let mut m = get();
            m.options
                .set_uint(number, BlockValue::new(1, false, 7).unwrap().encode());
            assert_eq!(
                refusal(&m, Carried::of(&m.options), false, true)
                    .unwrap()
                    .code,
                Code::BAD_REQUEST
            );
            assert!(refusal(&m, Carried::of(&m.options), true, false).is_none());
            m.options
                .set_uint(number, BlockValue::new(1, false, 6).unwrap().encode());
            assert!(refusal(&m, Carried::of(&m.options), false, false).is_none());
        }
    }
}

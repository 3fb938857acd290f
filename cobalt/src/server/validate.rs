//! Requests this server refuses whatever resource they name, checked before uploads
//! and routing, the same over every transport (UDP, DTLS, TCP, TLS, WebSockets).

use super::request::Response;
use cobalt_proto::blockwise::BERT_SZX;
use cobalt_proto::message::{opt, BlockValue, Code, Message};

/// The answer to a request that must not reach a resource, if it is one of these:
/// - Proxy-Uri or Proxy-Scheme, unless `proxying` (a layer of the server declared
///   that it handles them, see [`Layer::options`](super::Layer::options)): 5.05
///   Proxying Not Supported (RFC 7252 §5.7.2), since this server is then not a
///   forward proxy and must not serve such a request locally;
/// - Block1 or Block2 with SZX 7 where BERT is not in use (`bert` false: always over
///   UDP and DTLS, and over a connection whose server did not announce BERT):
///   4.00 Bad Request (RFC 7959 §2.2 reserves the value; RFC 8323 §6 gives it to BERT).
pub(crate) fn refusal(request: &Message, bert: bool, proxying: bool) -> Option<Response> {
    let o = &request.options;
    if !proxying && (o.contains(opt::PROXY_URI) || o.contains(opt::PROXY_SCHEME)) {
        return Some(
            Response::new(Code::PROXYING_NOT_SUPPORTED)
                .with_payload("this server is not a proxy; send the request to the origin server"),
        );
    }
    for (number, name) in [(opt::BLOCK1, "Block1"), (opt::BLOCK2, "Block2")] {
        let reserved = o
            .get_uint(number)
            .and_then(BlockValue::decode)
            .is_some_and(|b| b.szx == BERT_SZX);
        if reserved && !bert {
            return Some(Response::new(Code::BAD_REQUEST).with_payload(format!(
                "{name} with SZX 7 is reserved (BERT is only for CoAP over TCP and WebSockets when announced)"
            )));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_proto::message::MessageType;

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
            refusal(&m, false, false).unwrap().code,
            Code::PROXYING_NOT_SUPPORTED
        );
        let mut m = get();
        m.options.set(opt::PROXY_SCHEME, &b"coap"[..]);
        assert_eq!(
            refusal(&m, true, false).unwrap().code,
            Code::PROXYING_NOT_SUPPORTED
        );
        assert!(refusal(&get(), false, false).is_none());
    }

    #[test]
    fn proxy_requests_pass_when_a_layer_proxies() {
        let mut m = get();
        m.options.set(opt::PROXY_URI, &b"coap://example.org/x"[..]);
        assert!(refusal(&m, false, true).is_none());
    }

    #[test]
    fn szx_7_is_refused_unless_bert() {
        for number in [opt::BLOCK1, opt::BLOCK2] {
            let mut m = get();
            m.options
                .set_uint(number, BlockValue::new(1, false, 7).unwrap().encode());
            assert_eq!(refusal(&m, false, true).unwrap().code, Code::BAD_REQUEST);
            assert!(refusal(&m, true, false).is_none());
            m.options
                .set_uint(number, BlockValue::new(1, false, 6).unwrap().encode());
            assert!(refusal(&m, false, false).is_none());
        }
    }
}

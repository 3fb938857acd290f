//! RFC 8613 Appendix C's protected messages, and the error cases of §8.

use super::*;
use crate::context::tests::{c1_client, c2_client, c3_client, unhex};
use cobalt_proto::message::codec::{decode, encode};

/// The client's context of a test vector with the sequence number at 20.
fn client_at_20(material: Material) -> SecurityContext {
    SecurityContext::with_sequence(material, SenderSequence::in_memory(20), false).unwrap()
}

/// Appendix C.4's unprotected request: GET coap://localhost/tv1.
const TV1_REQUEST: &str = "44015d1f00003974396c6f63616c686f737483747631";

fn protect_tv1(material: Material) -> (Vec<u8>, RequestBinding) {
    let client = client_at_20(material);
    let mut request = decode(&unhex(TV1_REQUEST)).unwrap();
    let binding = client.protect_request(&mut request).unwrap();
    (encode(&request), binding)
}

#[test]
fn c4_request_with_master_salt() {
    let (wire, binding) = protect_tv1(c1_client());
    assert_eq!(
        hex(&wire),
        "44025d1f00003974396c6f63616c686f7374620914ff612f1092f1776f1c1668b3825e"
    );
    assert_eq!(binding.partial_iv, [0x14]);
    assert_eq!(binding.kid, b"");
}

#[test]
fn c5_request_without_master_salt() {
    let (wire, _) = protect_tv1(c2_client());
    assert_eq!(
        hex(&wire),
        "44025d1f00003974396c6f63616c686f737463091400ff4ed339a5a379b0b8bc731fffb0"
    );
}

#[test]
fn c6_request_with_id_context() {
    let (wire, _) = protect_tv1(c3_client());
    assert_eq!(
        hex(&wire),
        "44025d1f00003974396c6f63616c686f73746b19140837cbf3210017a2d3ff72cd7273fd331ac45cffbe55c3"
    );
}

/// The server's side of C.1 with the request of C.4 unprotected.
fn server_with_tv1_request() -> (SecurityContext, RequestBinding) {
    let server = SecurityContext::new(c1_client().reversed()).unwrap();
    let (wire, _) = protect_tv1(c1_client());
    let mut request = decode(&wire).unwrap();
    let option = OscoreOption::decode(request.options.get(OSCORE).unwrap()).unwrap();
    assert!(server.matches(option.kid.as_deref().unwrap(), None));
    let binding = server.unprotect_request(&mut request, &option).unwrap();
    assert_eq!(encode(&request), unhex(TV1_REQUEST));
    (server, binding)
}

/// Appendix C.7's unprotected response: 2.05 "Hello World!".
const HELLO: &str = "64455d1f00003974ff48656c6c6f20576f726c6421";

#[test]
fn c7_response_with_the_request_nonce() {
    let (server, binding) = server_with_tv1_request();
    let mut response = decode(&unhex(HELLO)).unwrap();
    server
        .protect_response(&mut response, &binding, false)
        .unwrap();
    assert_eq!(
        hex(&encode(&response)),
        "64445d1f0000397490ffdbaad1e9a7e7b2a813d3c31524378303cdafae119106"
    );
    // And the client reads it.
    let client = client_at_20(c1_client());
    assert_eq!(client.unprotect_response(&mut response, &binding), Ok(None));
    assert_eq!(encode(&response), unhex(HELLO));
}

#[test]
fn c8_response_with_its_own_partial_iv() {
    let (server, binding) = server_with_tv1_request();
    let mut response = decode(&unhex(HELLO)).unwrap();
    server
        .protect_response(&mut response, &binding, true)
        .unwrap();
    assert_eq!(
        hex(&encode(&response)),
        "64445d1f00003974920100ff4d4c13669384b67354b2b6175ff4b8658c666a6cf88e"
    );
    let client = client_at_20(c1_client());
    assert_eq!(
        client.unprotect_response(&mut response, &binding),
        Ok(Some(0))
    );
    assert_eq!(encode(&response), unhex(HELLO));
}

#[test]
fn a_replayed_request_is_refused_with_4_01() {
    let server = SecurityContext::new(c1_client().reversed()).unwrap();
    let (wire, _) = protect_tv1(c1_client());
    let first = decode(&wire).unwrap();
    let option = OscoreOption::decode(first.options.get(OSCORE).unwrap()).unwrap();
    server
        .unprotect_request(&mut first.clone(), &option)
        .unwrap();
    let err = server
        .unprotect_request(&mut first.clone(), &option)
        .unwrap_err();
    assert!(matches!(err, RequestError::Replay));
    let answer = err.into_response();
    assert_eq!(answer.code, Code::UNAUTHORIZED);
    assert_eq!(answer.payload, b"Replay detected");
    assert!(!answer.options.contains(OSCORE), "errors go unprotected");
}

#[test]
fn a_wrong_key_gives_4_00_and_a_tampered_response_is_refused() {
    let mut wrong = c1_client().reversed();
    wrong.master_secret[0] ^= 1;
    let server = SecurityContext::new(wrong).unwrap();
    let (wire, binding) = protect_tv1(c1_client());
    let mut request = decode(&wire).unwrap();
    let option = OscoreOption::decode(request.options.get(OSCORE).unwrap()).unwrap();
    let err = server.unprotect_request(&mut request, &option).unwrap_err();
    assert_eq!(err.into_response().code, Code::BAD_REQUEST);

    let (server, _) = server_with_tv1_request();
    let mut response = decode(&unhex(HELLO)).unwrap();
    server
        .protect_response(&mut response, &binding, false)
        .unwrap();
    let last = response.payload.len() - 1;
    response.payload[last] ^= 1;
    let client = client_at_20(c1_client());
    assert_eq!(
        client.unprotect_response(&mut response, &binding),
        Err(ResponseError::Decrypt)
    );
}

#[test]
fn after_a_restart_the_first_request_is_answered_with_an_echo() {
    let server = SecurityContext::with_sequence(
        c1_client().reversed(),
        SenderSequence::in_memory(100),
        true,
    )
    .unwrap();
    let client = SecurityContext::new(c1_client()).unwrap();
    let request = decode(&unhex(TV1_REQUEST)).unwrap();
    let mut first = request.clone();
    let binding = client.protect_request(&mut first).unwrap();
    let option = OscoreOption::decode(first.options.get(OSCORE).unwrap()).unwrap();
    let err = server.unprotect_request(&mut first, &option).unwrap_err();
    let mut challenge = err.into_response();
    assert_eq!(challenge.code, Code::CHANGED, "the challenge is protected");
    assert_eq!(
        client.unprotect_response(&mut challenge, &binding),
        Ok(Some(100))
    );
    assert_eq!(challenge.code, Code::UNAUTHORIZED);
    let echo = challenge.options.get(opt::ECHO).unwrap().to_vec();

    // The client repeats with the Echo: served, and the window starts there.
    let mut again = request.clone();
    again.options.set(opt::ECHO, &echo);
    client.protect_request(&mut again).unwrap();
    let option = OscoreOption::decode(again.options.get(OSCORE).unwrap()).unwrap();
    let mut replay = again.clone();
    server.unprotect_request(&mut again, &option).unwrap();
    assert_eq!(again.options.uri_path_string(), "/tv1");
    assert!(!again.options.contains(opt::ECHO));
    assert!(matches!(
        server.unprotect_request(&mut replay, &option),
        Err(RequestError::Replay)
    ));
}

#[test]
fn observe_travels_inside_and_outside() {
    let client = SecurityContext::new(c1_client()).unwrap();
    let server = SecurityContext::new(c1_client().reversed()).unwrap();
    let mut request = decode(&unhex(TV1_REQUEST)).unwrap();
    request.options.set_uint(opt::OBSERVE, 0);
    let binding = client.protect_request(&mut request).unwrap();
    assert_eq!(request.code, Code::FETCH);
    assert_eq!(request.options.observe(), Some(0));
    let option = OscoreOption::decode(request.options.get(OSCORE).unwrap()).unwrap();
    server.unprotect_request(&mut request, &option).unwrap();
    assert_eq!(
        (request.code, request.options.observe()),
        (Code::GET, Some(0))
    );

    let mut notification = decode(&unhex(HELLO)).unwrap();
    notification.options.set_uint(opt::OBSERVE, 7);
    server
        .protect_response(&mut notification, &binding, true)
        .unwrap();
    assert_eq!(notification.code, Code::CONTENT);
    assert_eq!(notification.options.observe(), Some(7));
    assert_eq!(
        client.unprotect_response(&mut notification, &binding),
        Ok(Some(0))
    );
    assert_eq!(notification.code, Code::CONTENT);
    assert_eq!(notification.payload, b"Hello World!");
}

#[test]
fn malformed_options_and_requests_without_kid_are_4_02() {
    let server = SecurityContext::new(c1_client().reversed()).unwrap();
    let mut request = decode(&unhex(TV1_REQUEST)).unwrap();
    let option = OscoreOption {
        partial_iv: vec![1],
        ..OscoreOption::default()
    };
    let err = server.unprotect_request(&mut request, &option).unwrap_err();
    assert_eq!(err.into_response().code, Code::BAD_OPTION);
}

proptest::proptest! {
    /// Whatever arrives with the OSCORE option (any value, any payload), the server
    /// answers with an error and never panics; an option that decodes encodes to
    /// bytes that decode to it again.
    #[test]
    fn hostile_requests_are_refused_without_panic(
        value in proptest::collection::vec(proptest::num::u8::ANY, 0..24),
        payload in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
    ) {
        let server = SecurityContext::new(c1_client().reversed()).unwrap();
        if let Ok(option) = OscoreOption::decode(&value) {
            proptest::prop_assert_eq!(OscoreOption::decode(&option.encode()), Ok(option.clone()));
            let mut request = Message::new(cobalt_proto::message::MessageType::Confirmable, Code::POST, 1);
            request.payload = payload.clone();
            let kid = option.kid.clone().unwrap_or_default();
            if server.matches(&kid, option.kid_context.as_deref()) {
                proptest::prop_assert!(server.unprotect_request(&mut request, &option).is_err());
            }
        }
        let client = SecurityContext::new(c1_client()).unwrap();
        let binding = RequestBinding { kid: vec![], partial_iv: vec![1] };
        let mut response = Message::new(cobalt_proto::message::MessageType::Acknowledgement, Code::CHANGED, 1);
        response.options.set(OSCORE, &value);
        response.payload = payload;
        proptest::prop_assert!(client.unprotect_response(&mut response, &binding).is_err());
    }
}

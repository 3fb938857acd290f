//! EDHOC against the RFC 9529 test vectors (trace 2: method 3, cipher suite 2), Cobalt's
//! initiator against its responder over UDP on loopback (explicit message_3 and the
//! combined request), and the responder against hostile clients: wrong credentials,
//! malformed messages, message_1 floods, amplification, the bound on contexts.

use super::*;
use crate::layer::{Oscore, RequireOscore};
use crate::option::{OscoreOption, EDHOC, OSCORE};
use crate::security::SecurityContext;
use crate::target::UriPattern;
use cobalt::proto::message::codec::{decode, encode};
use cobalt::proto::message::{Code, Message, MessageType, Token};
use cobalt::server::{get, Server};
use cobalt::{Client, Scheme, ServerHandle};
use lakers::{EDHOCMethod, EDHOCSuite, EdhocInitiator, EdhocMessageBuffer};
use proptest::prelude::*;
use std::net::{IpAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn unhex(s: &str) -> Vec<u8> {
    crate::context::unhex(s).unwrap()
}

fn array(s: &str) -> [u8; 32] {
    unhex(s).try_into().unwrap()
}

/// RFC 9529 §3 (trace 2), as both sides see it.
mod trace_2 {
    pub const MESSAGE_1: &str =
        "0382060258208af6f430ebe18d34184017a9a11bf511c8dff8f834730b96c1b7c8dbca2fc3b637";
    pub const Y: &str = "e2f4126777205e853b437d6eaca1e1f753cdcc3e2c69fa884b0a1a640977e418";
    pub const G_Y: &str = "419701d7f00a26c2dc587a36dd752549f33763c893422c8ea0f955a13a4ff5d5";
    pub const R: &str = "72cc4761dbd4c78f758931aa589d348d1ef874a7e303ede2f140dcf3e6aa4aac";
    pub const CRED_R: &str = "a2026b6578616d706c652e65647508a101a501020241322001215820bbc34960526ea4d32e940cad2a234148ddc21791a12afbcbac93622046dd44f02258204519e257236b2a0ce2023f0931f1f386ca7afda64fcde0108c224c51eabf6072";
    pub const CRED_I: &str = "a2027734322d35302d33312d46462d45462d33372d33322d333908a101a5010202412b2001215820ac75e9ece3e50bfc8ed60399889522405c47bf16df96660a41298cb4307f7eb62258206e5de611388a4b8a8211334ac7d37ecb52a387d257e6db3c2a93df21ff3affc8";
    pub const MESSAGE_2: &str = "582b419701d7f00a26c2dc587a36dd752549f33763c893422c8ea0f955a13a4ff5d59862a1eef9e0e7e1886fcd";
    pub const MESSAGE_3: &str = "52e562097bc417dd5919485ac7891ffd90a9fc";
    pub const MESSAGE_4: &str = "4828c966b7ca304f83";
    pub const OSCORE_SECRET: &str = "f9868f6a3aca78a05d1485b35030b162";
    pub const OSCORE_SALT: &str = "ada24c7dbfc85eeb";
}

/// The RustCrypto backend with the responder's ephemeral key fixed to the trace's.
#[derive(Debug)]
struct FixedEphemeral(Crypto);

impl lakers::CryptoTrait for FixedEphemeral {
    fn sha256_digest(
        &mut self,
        message: &lakers::BytesMaxBuffer,
        message_len: usize,
    ) -> lakers::BytesHashLen {
        self.0.sha256_digest(message, message_len)
    }
    fn hkdf_expand(
        &mut self,
        prk: &lakers::BytesHashLen,
        info: &lakers::BytesMaxInfoBuffer,
        info_len: usize,
        length: usize,
    ) -> lakers::BytesMaxBuffer {
        self.0.hkdf_expand(prk, info, info_len, length)
    }
    fn hkdf_extract(
        &mut self,
        salt: &lakers::BytesHashLen,
        ikm: &lakers::BytesP256ElemLen,
    ) -> lakers::BytesHashLen {
        self.0.hkdf_extract(salt, ikm)
    }
    fn aes_ccm_encrypt_tag_8(
        &mut self,
        key: &lakers::BytesCcmKeyLen,
        iv: &lakers::BytesCcmIvLen,
        ad: &[u8],
        plaintext: &lakers::BufferPlaintext3,
    ) -> lakers::BufferCiphertext3 {
        self.0.aes_ccm_encrypt_tag_8(key, iv, ad, plaintext)
    }
    fn aes_ccm_decrypt_tag_8(
        &mut self,
        key: &lakers::BytesCcmKeyLen,
        iv: &lakers::BytesCcmIvLen,
        ad: &[u8],
        ciphertext: &lakers::BufferCiphertext3,
    ) -> Result<lakers::BufferPlaintext3, lakers::EDHOCError> {
        self.0.aes_ccm_decrypt_tag_8(key, iv, ad, ciphertext)
    }
    fn p256_ecdh(
        &mut self,
        private_key: &lakers::BytesP256ElemLen,
        public_key: &lakers::BytesP256ElemLen,
    ) -> lakers::BytesP256ElemLen {
        self.0.p256_ecdh(private_key, public_key)
    }
    fn get_random_byte(&mut self) -> u8 {
        self.0.get_random_byte()
    }
    fn p256_generate_key_pair(&mut self) -> (lakers::BytesP256ElemLen, lakers::BytesP256ElemLen) {
        (array(trace_2::Y), array(trace_2::G_Y))
    }
}

#[test]
fn rfc_9529_trace_2_gives_its_messages_and_oscore_context() {
    use trace_2::*;
    let cred_r = Ccs::parse(&unhex(CRED_R)).unwrap();
    let cred_i = Ccs::parse(&unhex(CRED_I)).unwrap();
    let responder = lakers::EdhocResponder::new(
        FixedEphemeral(crypto()),
        EDHOCMethod::StatStat,
        array(R),
        cred_r.lakers(),
    );
    let message_1 = EdhocMessageBuffer::new_from_slice(&unhex(MESSAGE_1)).unwrap();
    let (processed, c_i, ead_1) = responder.process_message_1(&message_1).unwrap();
    assert_eq!(c_i.as_slice(), [0x37], "C_I = -24");
    assert!(ead_1.is_none());
    // C_R = -8, ID_CRED_R by kid (0x32), as the trace sends it.
    let (c_r, rest) = split_connection_id(&[0x27]).unwrap();
    assert!(rest.is_empty());
    let conn_id = lakers::ConnId::from_slice(&c_r).unwrap();
    let (waiting, message_2) = processed
        .prepare_message_2(CredentialStyle::ByKeyId.lakers(), Some(conn_id), &None)
        .unwrap();
    assert_eq!(message_2.as_slice(), unhex(MESSAGE_2));
    let message_3 = unhex(MESSAGE_3);
    let (whole, after) = split_message(&message_3).unwrap();
    assert_eq!((whole.len(), after.len()), (message_3.len(), 0));
    let (processing, id_cred_i, _) = waiting
        .parse_message_3(&EdhocMessageBuffer::new_from_slice(whole).unwrap())
        .unwrap();
    assert!(cred_i.is_named_by(&id_cred_i));
    assert!(!cred_r.is_named_by(&id_cred_i));
    let (processed, _) = processing.verify_message_3(cred_i.lakers()).unwrap();
    let (mut done, message_4) = processed.prepare_message_4(&None).unwrap();
    assert_eq!(message_4.as_slice(), unhex(MESSAGE_4));
    let material = oscore_material(&mut done, &c_r, c_i.as_slice());
    assert_eq!(material.master_secret, unhex(OSCORE_SECRET));
    assert_eq!(material.master_salt, unhex(OSCORE_SALT));
    // The responder receives with its own identifier and sends with the initiator's.
    assert_eq!(
        (material.recipient_id, material.sender_id),
        (vec![0x27], vec![0x37])
    );
    assert_eq!(material.id_context, None);
}

#[test]
fn connection_identifiers_and_messages_split_as_rfc_9528_encodes_them() {
    assert_eq!(
        split_connection_id(&[0x37, 9]),
        Some((vec![0x37], &[9][..]))
    );
    assert_eq!(
        split_connection_id(&[0x42, 0xff, 0x01, 7]),
        Some((vec![0xff, 0x01], &[7][..]))
    );
    // A one-byte string that should have been an integer, a truncated string, an
    // identifier longer than an OSCORE ID may be, a text string: not identifiers.
    assert_eq!(split_connection_id(&[0x41, 0x05]), None);
    assert_eq!(split_connection_id(&[0x43, 0x01]), None);
    assert_eq!(split_connection_id(&[0x48, 1, 2, 3, 4, 5, 6, 7, 8]), None);
    assert_eq!(split_connection_id(&[0x61, b'a']), None);
    for id in [vec![0x05], vec![0x2a], vec![0xff, 0x00]] {
        let encoded = encode_connection_id(&id);
        assert_eq!(split_connection_id(&encoded), Some((id, &[][..])));
    }
    assert_eq!(
        split_message(&[0x58, 2, 1, 2, 3]),
        Some((&[0x58, 2, 1, 2][..], &[3][..]))
    );
    assert_eq!(split_message(&[0x58, 9, 1]), None);
    assert_eq!(split_message(&[0x01]), None);
    let error = error_message("no");
    assert_eq!(error, [0x01, 0x62, b'n', b'o']);
    assert_eq!(error_text(&error).as_deref(), Some("no"));
    assert_eq!(error_text(&[0x02, 0x60]), None);
}

/// A server with an EDHOC responder as `server` that knows `client` (label
/// "edhoc-client"): /hello answers only requests protected under that context.
async fn start(responder: impl Into<Arc<EdhocResponder>>) -> ServerHandle {
    Server::new()
        .route(
            "/hello",
            get(|| async { "hello through EDHOC" })
                .layer(RequireOscore::contexts(["edhoc-client"])),
        )
        .layer(Oscore::new().edhoc(responder))
        .shards(1)
        .bind("127.0.0.1:0")
        .await
        .unwrap()
}

struct Pair {
    server: EdhocIdentity,
    client: EdhocIdentity,
}

fn pair(server_style: CredentialStyle) -> Pair {
    Pair {
        server: EdhocIdentity::generate("server", b"\x0a", server_style),
        client: EdhocIdentity::generate("client", b"\x0b", CredentialStyle::ByKeyId),
    }
}

impl Pair {
    fn responder(&self) -> EdhocResponder {
        EdhocResponder::new(self.server.clone())
            .client("edhoc-client", self.client.credential().clone())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cobalt_initiator_and_responder_agree_on_an_oscore_context() {
    for (style, completion) in [
        (CredentialStyle::ByKeyId, Completion::Message4),
        (CredentialStyle::ByValue, Completion::Message4),
        (CredentialStyle::ByKeyId, Completion::Combined),
    ] {
        let keys = pair(style);
        let responder = Arc::new(keys.responder());
        let server = start(responder.clone()).await;
        let addr = server.local_addr(Scheme::Coap).unwrap();
        let origin = format!("coap://{addr}");
        let plain = Client::new();
        let established = establish(
            &plain,
            &origin,
            &keys.client,
            keys.server.credential(),
            completion,
        )
        .await
        .unwrap();
        assert_eq!(established.context().name(), origin);
        assert_eq!(
            established.awaits_combined_request(),
            completion == Completion::Combined
        );
        // With the combined request, the server still waits for message_3.
        let expected = match completion {
            Completion::Message4 => (0, 1),
            Completion::Combined => (1, 0),
        };
        assert_eq!(responder.counts(), expected);
        let pattern = UriPattern::parse(&format!("{origin}/*")).unwrap();
        let client = Client::new().layer(Oscore::new().protect_edhoc(pattern, established));
        for _ in 0..2 {
            let r = client.get(&format!("{origin}/hello")).await.unwrap();
            assert_eq!(
                (r.code, r.text_payload().as_str()),
                (Code::CONTENT, "hello through EDHOC"),
                "{style:?} {completion:?}"
            );
        }
        assert_eq!(responder.counts(), (0, 1));
        // Unprotected, the resource refuses.
        let r = plain.get(&format!("{origin}/hello")).await.unwrap();
        assert_eq!(r.code, Code::UNAUTHORIZED);
        server.shutdown(Duration::ZERO).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_credential_fails_on_either_side() {
    let keys = pair(CredentialStyle::ByKeyId);
    let server = start(keys.responder()).await;
    let origin = format!("coap://{}", server.local_addr(Scheme::Coap).unwrap());
    let client = Client::new();
    // A client the server does not know: message_3 is refused.
    let stranger = EdhocIdentity::generate("stranger", b"\x0b", CredentialStyle::ByValue);
    let e = establish(
        &client,
        &origin,
        &stranger,
        keys.server.credential(),
        Completion::Message4,
    )
    .await
    .unwrap_err();
    match &e {
        EdhocError::Refused { step, code, why } => {
            assert_eq!((*step, *code), ("message_3", Code::BAD_REQUEST));
            assert!(why.contains("not one this server knows"), "{why}");
        }
        other => panic!("{other}"),
    }
    // A client that names a known client's key ID but holds another key: message_3
    // does not verify.
    let impostor = EdhocIdentity::generate("client", b"\x0b", CredentialStyle::ByKeyId);
    let e = establish(
        &client,
        &origin,
        &impostor,
        keys.server.credential(),
        Completion::Message4,
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("does not verify"), "{e}");
    // A server with another credential than the client expects (same kid).
    let impostor = EdhocIdentity::generate("server", b"\x0a", CredentialStyle::ByKeyId);
    let e = establish(
        &client,
        &origin,
        &keys.client,
        impostor.credential(),
        Completion::Message4,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            e,
            EdhocError::Invalid {
                step: "message_2",
                ..
            }
        ),
        "{e}"
    );
    server.shutdown(Duration::ZERO).await;
}

/// A fresh, valid message_1 from a lakers initiator.
fn message_1() -> Vec<u8> {
    let initiator = EdhocInitiator::new(crypto(), EDHOCMethod::StatStat, EDHOCSuite::CipherSuite2);
    let c_i = lakers::ConnId::from_slice(&[0x05]).unwrap();
    let (_, message_1) = initiator.prepare_message_1(Some(c_i), &None).unwrap();
    message_1.as_slice().to_vec()
}

fn ip(last: u8) -> IpAddr {
    IpAddr::from([192, 0, 2, last])
}

#[test]
fn message_1_floods_are_bounded_per_address_and_in_total() {
    let keys = pair(CredentialStyle::ByKeyId);
    let limits = EdhocLimits {
        pending_per_address: 2,
        pending: 3,
        pending_for: Duration::from_secs(10),
        established: 4,
    };
    let responder = keys.responder().limits(limits);
    let now = Instant::now();
    let none = |_: &[u8]| false;
    let m1 = message_1();
    let len = m1.len() + 30;
    assert!(responder.message_1(ip(1), len, &m1, none, now).is_ok());
    assert!(responder.message_1(ip(1), len, &m1, none, now).is_ok());
    let refused = responder.message_1(ip(1), len, &m1, none, now).unwrap_err();
    assert_eq!(refused.code, Code::SERVICE_UNAVAILABLE, "{}", refused.why);
    assert!(refused.why.contains("this address"), "{}", refused.why);
    assert!(responder.message_1(ip(2), len, &m1, none, now).is_ok());
    let refused = responder.message_1(ip(3), len, &m1, none, now).unwrap_err();
    assert!(refused.why.contains("in progress"), "{}", refused.why);
    assert_eq!(responder.counts(), (3, 0));
    let response = refused.clone().into_response();
    assert_eq!(response.code, Code::SERVICE_UNAVAILABLE);
    assert_eq!(refused.within(10).why.len(), 9, "cut to fit 3 × 10 bytes");
    // Sessions that never got message_3 are forgotten after pending_for.
    let later = now + Duration::from_secs(11);
    assert!(responder.message_1(ip(3), len, &m1, none, later).is_ok());
    assert_eq!(responder.counts(), (1, 0));
}

#[test]
fn message_2_stays_within_three_times_the_request() {
    let keys = pair(CredentialStyle::ByValue);
    let responder = keys.responder();
    let m1 = message_1();
    let none = |_: &[u8]| false;
    // A request just as large as message_1 with `true` and a minimal CoAP header: by
    // value would be more than 3× as large, so the server names its credential by key ID.
    let small = m1.len() + 1 + 4 + 1;
    let message_2 = responder
        .message_1(ip(1), small, &m1, none, Instant::now())
        .unwrap();
    assert!(
        message_2.len() + 4 + 8 + 3 <= 3 * small,
        "{} bytes",
        message_2.len()
    );
    assert!(message_2.len() < keys.server.credential().bytes().len());
    // A larger request (a long token and URI) gets the credential by value.
    let large = 3 * small;
    let message_2 = responder
        .message_1(ip(2), large, &m1, none, Instant::now())
        .unwrap();
    assert!(message_2.len() > keys.server.credential().bytes().len());
    assert!(message_2.len() + 4 + 8 + 3 <= 3 * large);
}

#[test]
fn connection_identifiers_avoid_those_in_use() {
    let keys = pair(CredentialStyle::ByKeyId);
    let responder = keys.responder();
    let m1 = message_1();
    // Every one-byte identifier is taken by another context: two bytes then.
    let taken = |id: &[u8]| id.len() == 1;
    for _ in 0..3 {
        responder
            .message_1(ip(9), 80, &m1, taken, Instant::now())
            .unwrap();
    }
    let ids = responder.pending_from(ip(9));
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().all(|id| id.len() == 2), "{ids:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever a client sends as message_1 or message_3, the responder answers
    /// without panicking, and a bad message_3 ends its session.
    #[test]
    fn malformed_messages_are_refused(junk in proptest::collection::vec(any::<u8>(), 0..300), flip in 0usize..40) {
        let keys = pair(CredentialStyle::ByKeyId);
        let responder = keys.responder();
        let none = |_: &[u8]| false;
        let now = Instant::now();
        let _ = responder.message_1(ip(1), 1000, &junk, none, now);
        let mut m1 = message_1();
        let at = flip % m1.len();
        m1[at] ^= 0x55;
        let _ = responder.message_1(ip(2), 1000, &m1, none, now);
        responder.message_1(ip(3), 1000, &message_1(), none, now).unwrap();
        let c_r = responder.pending_from(ip(3)).remove(0);
        let refused = responder.message_3(ip(3), &c_r, &junk, now).unwrap_err();
        prop_assert_eq!(refused.code, Code::BAD_REQUEST);
        prop_assert!(responder.pending_from(ip(3)).is_empty());
        let _ = responder.combined(ip(3), &c_r, &junk, now);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever a server answers to message_1, the client's side of lakers on this
    /// backend refuses it without panicking (junk, or a real message_2 with a byte
    /// changed).
    #[test]
    fn malformed_answers_to_the_client_are_refused(
        junk in proptest::collection::vec(any::<u8>(), 0..300),
        flip in 0usize..200,
    ) {
        let keys = pair(CredentialStyle::ByKeyId);
        let responder = keys.responder();
        let attempt = |message_2: &[u8]| -> bool {
            let mut initiator =
                EdhocInitiator::new(crypto(), EDHOCMethod::StatStat, EDHOCSuite::CipherSuite2);
            initiator.set_identity(keys.client.private_key(), keys.client.credential().lakers());
            let (waiting, _) = initiator
                .prepare_message_1(lakers::ConnId::from_slice(&[0x05]), &None)
                .unwrap();
            let Ok(buffer) = EdhocMessageBuffer::new_from_slice(message_2) else {
                return false;
            };
            let Ok((processing, _, _, _)) = super::guarded(|| waiting.parse_message_2(&buffer)) else {
                return false;
            };
            processing.verify_message_2(keys.server.credential().lakers()).is_ok()
        };
        prop_assert!(!attempt(&junk));
        let mut message_2 = responder
            .message_1(ip(1), 1000, &message_1(), |_| false, Instant::now())
            .unwrap();
        let at = flip % message_2.len();
        message_2[at] ^= 0x20;
        // Another client's message_2 does not verify for this one, changed or not.
        prop_assert!(!attempt(&message_2));
    }
}

#[test]
fn message_3_from_another_address_is_not_taken() {
    let keys = pair(CredentialStyle::ByKeyId);
    let responder = keys.responder();
    let none = |_: &[u8]| false;
    let now = Instant::now();
    responder
        .message_1(ip(1), 1000, &message_1(), none, now)
        .unwrap();
    let c_r = responder.pending_from(ip(1)).remove(0);
    let refused = responder
        .message_3(ip(2), &c_r, &[0x41, 0], now)
        .unwrap_err();
    assert!(refused.why.contains("this address"), "{}", refused.why);
    assert_eq!(
        responder.counts(),
        (1, 0),
        "the session still waits for its client"
    );
}

/// A client's half of EDHOC done by hand up to message_3, for the combined request.
struct Half {
    context: SecurityContext,
    c_r: Vec<u8>,
    message_3: Vec<u8>,
}

fn exchange(socket: &UdpSocket, message: &Message) -> Message {
    socket.send(&encode(message)).unwrap();
    let mut buf = [0u8; 1500];
    let n = socket.recv(&mut buf).unwrap();
    decode(&buf[..n]).unwrap()
}

fn edhoc_post(mid: u16, payload: Vec<u8>) -> Message {
    let mut request = Message::new(MessageType::Confirmable, Code::POST, mid);
    request.token = Token::new(&mid.to_be_bytes()).unwrap();
    request.options.set_uri_path("/.well-known/edhoc");
    request.payload = payload;
    request
}

fn half(socket: &UdpSocket, keys: &Pair) -> Half {
    let mut initiator =
        EdhocInitiator::new(crypto(), EDHOCMethod::StatStat, EDHOCSuite::CipherSuite2);
    initiator.set_identity(keys.client.private_key(), keys.client.credential().lakers());
    let c_i = vec![0x2c];
    let (waiting, m1) = initiator
        .prepare_message_1(lakers::ConnId::from_slice(&c_i), &None)
        .unwrap();
    let mut payload = vec![0xf5];
    payload.extend_from_slice(m1.as_slice());
    let answer = exchange(socket, &edhoc_post(1, payload));
    assert_eq!(answer.code, Code::CHANGED);
    let m2 = EdhocMessageBuffer::new_from_slice(&answer.payload).unwrap();
    let (processing, c_r, _, _) = waiting.parse_message_2(&m2).unwrap();
    let processed = processing
        .verify_message_2(keys.server.credential().lakers())
        .unwrap();
    let (waiting, m3, _) = processed
        .prepare_message_3(CredentialStyle::ByKeyId.lakers(), &None)
        .unwrap();
    let mut done = waiting.completed_without_message_4().unwrap();
    let c_r = c_r.as_slice().to_vec();
    let material = oscore_material(&mut done, &c_i, &c_r);
    Half {
        context: SecurityContext::new(material).unwrap(),
        c_r,
        message_3: m3.as_slice().to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_combined_request_completes_edhoc_and_is_answered_under_oscore() {
    let keys = pair(CredentialStyle::ByValue);
    let server = start(keys.responder()).await;
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .connect(server.local_addr(Scheme::Coap).unwrap())
        .unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let half = half(&socket, &keys);
    let mut request = Message::new(MessageType::Confirmable, Code::GET, 7);
    request.token = Token::new(&[7]).unwrap();
    request.options.set_uri_path("/hello");
    let binding = half.context.protect_request(&mut request).unwrap();
    let kid = OscoreOption::decode(request.options.get(OSCORE).unwrap())
        .unwrap()
        .kid;
    assert_eq!(kid.as_deref(), Some(&half.c_r[..]));
    let mut payload = half.message_3.clone();
    payload.extend_from_slice(&request.payload);
    request.payload = payload;
    request.options.push(EDHOC, []);
    let mut answer = exchange(&socket, &request);
    assert!(answer.options.contains(OSCORE), "{answer:?}");
    half.context
        .unprotect_response(&mut answer, &binding)
        .unwrap();
    assert_eq!(answer.code, Code::CONTENT);
    assert_eq!(answer.payload, b"hello through EDHOC");

    // The same message_3 again: the session is done, so EDHOC refuses it.
    request.mid = 8;
    request.token = Token::new(&[8]).unwrap();
    let again = exchange(&socket, &request);
    assert_eq!(again.code, Code::BAD_REQUEST, "{again:?}");
    assert!(!again.options.contains(OSCORE));
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_to_the_edhoc_resource_get_edhoc_errors() {
    let keys = pair(CredentialStyle::ByKeyId);
    let server = start(keys.responder()).await;
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .connect(server.local_addr(Scheme::Coap).unwrap())
        .unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    for (mid, payload) in [
        (20, vec![]),
        (21, vec![0xf5, 0x03, 0x02]),
        (22, vec![0x61, b'x']),
        (23, vec![0x05, 0x41, 0x00]),
    ] {
        let request = edhoc_post(mid, payload.clone());
        let answer = exchange(&socket, &request);
        assert_eq!(answer.code, Code::BAD_REQUEST, "{payload:?}: {answer:?}");
        assert_eq!(answer.options.content_format(), Some(EDHOC_CBOR_SEQ));
        assert!(error_text(&answer.payload).is_some(), "{answer:?}");
        // Not even an error answer amplifies more than 3×.
        assert!(
            encode(&answer).len() <= 3 * encode(&request).len(),
            "{} bytes for {}",
            encode(&answer).len(),
            encode(&request).len()
        );
    }
    let mut get = edhoc_post(24, vec![]);
    get.code = Code::GET;
    assert_eq!(exchange(&socket, &get).code, Code::METHOD_NOT_ALLOWED);
    // The EDHOC option without OSCORE.
    let mut plain = Message::new(MessageType::Confirmable, Code::GET, 25);
    plain.options.set_uri_path("/hello");
    plain.options.push(EDHOC, []);
    assert_eq!(exchange(&socket, &plain).code, Code::BAD_OPTION);
    server.shutdown(Duration::ZERO).await;
}

#[test]
fn the_least_recently_used_context_makes_room() {
    let keys = pair(CredentialStyle::ByKeyId);
    let responder = keys.responder().limits(EdhocLimits {
        established: 2,
        ..EdhocLimits::default()
    });
    let now = Instant::now();
    let mut kids: Vec<Vec<u8>> = Vec::new();
    for n in 0..3u8 {
        // The responder's half through its API, the client's with lakers.
        let mut initiator =
            EdhocInitiator::new(crypto(), EDHOCMethod::StatStat, EDHOCSuite::CipherSuite2);
        initiator.set_identity(keys.client.private_key(), keys.client.credential().lakers());
        let (waiting, m1) = initiator
            .prepare_message_1(lakers::ConnId::from_slice(&[0x10 + n]), &None)
            .unwrap();
        let m2 = responder
            .message_1(ip(n), 1000, m1.as_slice(), |_| false, now)
            .unwrap();
        let (processing, c_r, _, _) = waiting
            .parse_message_2(&EdhocMessageBuffer::new_from_slice(&m2).unwrap())
            .unwrap();
        let processed = processing
            .verify_message_2(keys.server.credential().lakers())
            .unwrap();
        let (_, m3, _) = processed
            .prepare_message_3(CredentialStyle::ByKeyId.lakers(), &None)
            .unwrap();
        let c_r = c_r.as_slice().to_vec();
        let (context, _) = responder
            .message_3(ip(n), &c_r, m3.as_slice(), now)
            .unwrap();
        assert_eq!(context.name(), "edhoc-client");
        if n == 1 {
            // The first is used after the second was made: the second goes.
            assert!(responder.context(&kids[0]).is_some());
        }
        kids.push(c_r);
    }
    assert_eq!(responder.counts(), (0, 2));
    assert!(responder.context(&kids[0]).is_some());
    assert!(responder.context(&kids[1]).is_none());
    assert!(responder.context(&kids[2]).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_files_set_up_edhoc_on_both_sides() {
    use crate::credentials::Credentials;
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("cobalt-edhoc-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let keys = pair(CredentialStyle::ByKeyId);
    let own = |name: &str, identity: &EdhocIdentity| {
        let key = dir.join(format!("{name}.cosekey"));
        std::fs::write(&key, identity.private_key_cose()).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        serde_json::json!({"suite": 2, "method": 3, "own_cred_style": "by-key-id",
            "own_cred": identity.credential().to_json(),
            "private_key_file": format!("{name}.cosekey")})
    };
    let server_file = serde_json::json!({
        "coap://127.0.0.1/*": {"edhoc-oscore": own("server", &keys.server)},
        ":edhoc-client": {"edhoc-oscore": {"suite": 2, "method": 3,
            "peer_cred": keys.client.credential().to_json()}},
    });
    let server_creds = Credentials::parse(&server_file.to_string(), &dir).unwrap();
    let server = Server::new()
        .route(
            "/hello",
            get(|| async { "hello through EDHOC" })
                .layer(RequireOscore::contexts(["edhoc-client"])),
        )
        .layer(server_creds.oscore().unwrap())
        .shards(1)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::Coap).unwrap();
    let mut entry = own("client", &keys.client);
    entry["peer_cred"] = keys.server.credential().to_json();
    let client_file = serde_json::json!({ format!("coap://{addr}/*"): {"edhoc-oscore": entry} });
    let client_creds = Credentials::parse(&client_file.to_string(), &dir).unwrap();
    let uri = cobalt::proto::uri::CoapUri::parse(&format!("coap://{addr}/hello")).unwrap();
    let plain = Client::new();
    let layer = client_creds
        .client_oscore(&plain, &uri)
        .await
        .unwrap()
        .unwrap();
    let r = Client::new()
        .layer(layer)
        .get(&format!("coap://{addr}/hello"))
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "hello through EDHOC");
    server.shutdown(Duration::ZERO).await;
    std::fs::remove_dir_all(dir).unwrap();
}

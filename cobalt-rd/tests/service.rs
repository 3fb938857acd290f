//! The directory over UDP: discovery, the registration interface, lookups, hostile
//! input beside a legitimate endpoint, simple registration, and a restart on redb.

use cobalt::{content_format, Client, Code, Response, Scheme, Server, ServerHandle};
use cobalt_rd::{
    lookup_at, MemoryStore, RdClient, RdLimits, RedbStore, RegistrationStore, ResourceDirectory,
};
use cobalt_test_support::temp::TempDir;
use std::sync::Arc;
use std::time::Duration;

async fn start(
    store: Arc<dyn RegistrationStore>,
    limits: RdLimits,
) -> (ResourceDirectory, ServerHandle, String) {
    let rd = ResourceDirectory::open(store, limits).await.unwrap();
    let server = rd.install(Server::new()).bind("[::]:0").await.unwrap();
    let port = server.local_addr(Scheme::Coap).unwrap().port();
    (rd, server, format!("coap://127.0.0.1:{port}"))
}

async fn post(client: &Client, uri: &str, body: &str) -> Response {
    client
        .request(Code::POST, uri)
        .content_format(content_format::LINK_FORMAT)
        .payload(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn discovery_registration_lookup_update_and_removal() {
    let (_rd, server, origin) = start(Arc::new(MemoryStore::new()), RdLimits::default()).await;
    let client = Client::new();

    let core = client
        .get(&format!("{origin}/.well-known/core?rt=core.rd*"))
        .await
        .unwrap();
    let text = core.text_payload();
    for want in [
        "</rd>",
        "</rd-lookup/ep>",
        "</rd-lookup/res>",
        "core.rd-lookup-res",
        "ct=40",
    ] {
        assert!(text.contains(want), "discovery lacks {want}: {text}");
    }
    assert_eq!(
        RdClient::discover(&client, &origin).await.unwrap(),
        format!("{origin}/rd")
    );

    let created = post(
        &client,
        &format!("{origin}/rd?ep=node1&lt=300&et=oic.d.sensor"),
        "</temp>;rt=\"temperature\";obs",
    )
    .await;
    assert_eq!(created.code, Code::CREATED, "{}", created.text_payload());
    let location = created.options.location_path_string().unwrap();
    assert_eq!(location, "/rd/0");

    let res = client
        .get(&format!("{origin}/rd-lookup/res?rt=temp*"))
        .await
        .unwrap();
    assert_eq!(
        res.options.content_format(),
        Some(content_format::LINK_FORMAT)
    );
    let text = res.text_payload();
    assert!(
        text.starts_with("<coap://127.0.0.1:")
            && text.contains("/temp>;rt=\"temperature\";obs;anchor="),
        "{text}"
    );
    let eps = lookup_at(
        &client,
        &format!("{origin}/rd-lookup/ep"),
        &[("et", "oic.d.*")],
    )
    .await
    .unwrap();
    assert_eq!((eps.len(), eps[0].get("ep")), (1, Some("node1")));
    assert!(eps[0].get("lt").is_none());

    let updated = client
        .post(&format!("{origin}{location}?lt=600"), Vec::new())
        .await
        .unwrap();
    assert_eq!(updated.code, Code::CHANGED);
    let replaced = post(&client, &format!("{origin}{location}"), "</hum>").await;
    assert_eq!(replaced.code, Code::CHANGED);
    let res = client
        .get(&format!("{origin}/rd-lookup/res"))
        .await
        .unwrap()
        .text_payload();
    assert!(res.contains("/hum>") && !res.contains("/temp>"), "{res}");

    assert_eq!(
        client
            .delete(&format!("{origin}{location}"))
            .await
            .unwrap()
            .code,
        Code::DELETED
    );
    assert_eq!(
        client
            .delete(&format!("{origin}{location}"))
            .await
            .unwrap()
            .code,
        Code::NOT_FOUND
    );
    assert_eq!(
        client
            .get(&format!("{origin}/rd-lookup/ep"))
            .await
            .unwrap()
            .text_payload(),
        ""
    );
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn an_observed_lookup_notifies_registrations_and_removals() {
    let (_rd, server, origin) = start(Arc::new(MemoryStore::new()), RdLimits::default()).await;
    let client = Client::new();
    let mut lookup = client
        .observe(&format!("{origin}/rd-lookup/res?rt=temperature"))
        .await
        .unwrap();
    let first = lookup.next().await.unwrap().unwrap();
    assert_eq!(first.text_payload(), "");
    let created = post(
        &client,
        &format!("{origin}/rd?ep=obs1"),
        "</t>;rt=\"temperature\",</h>",
    )
    .await;
    let mut text = String::new();
    while !text.contains("/t>") {
        text = lookup.next().await.unwrap().unwrap().text_payload();
    }
    assert!(!text.contains("/h>"), "{text}");
    post(
        &client,
        &format!("{origin}/rd?ep=obs2"),
        "</t2>;rt=\"temperature\"",
    )
    .await;
    while !text.contains("/t2>") {
        text = lookup.next().await.unwrap().unwrap().text_payload();
    }
    let location = created.options.location_path_string().unwrap();
    assert_eq!(
        client
            .delete(&format!("{origin}{location}"))
            .await
            .unwrap()
            .code,
        Code::DELETED
    );
    while text.contains("/t>") {
        text = lookup.next().await.unwrap().unwrap().text_payload();
    }
    assert!(text.contains("/t2>"), "{text}");
    lookup.cancel().await.unwrap();
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn hostile_endpoints_get_the_rfc_codes_and_a_legitimate_one_keeps_being_served() {
    let limits = RdLimits {
        max_body_bytes: 2048,
        max_per_peer: 20,
        ..RdLimits::default()
    };
    let (_rd, server, origin) = start(Arc::new(MemoryStore::new()), limits).await;
    let port = origin.rsplit(':').next().unwrap();
    let client = Client::new();
    // The legitimate endpoint speaks from another address budget (IPv6 loopback).
    let legit_origin = format!("coap://[::1]:{port}");
    let mut legit = RdClient::new(Client::new(), &format!("{legit_origin}/rd"), "legit")
        .lifetime(600)
        .links("</ok>;rt=\"ok\"");
    let served = |legit: &mut RdClient| {
        let mut legit = legit.clone();
        let lookup = format!("{origin}/rd-lookup/res?rt=ok");
        async move {
            legit.update().await.unwrap();
            let links = Client::new().get(&lookup).await.unwrap().text_payload();
            assert!(
                links.contains("/ok>"),
                "the legitimate endpoint is no longer listed: {links}"
            );
        }
    };
    let location = legit.register().await.unwrap().to_string();
    assert!(location.starts_with(&legit_origin));

    // Oversized link-format: 4.13 with Size1.
    let big = format!("</x>;title=\"{}\"", "a".repeat(3000));
    let r = post(&client, &format!("{origin}/rd?ep=big"), &big).await;
    assert_eq!(
        r.code,
        Code::REQUEST_ENTITY_TOO_LARGE,
        "{}",
        r.text_payload()
    );
    assert_eq!(
        r.options
            .get_uint(cobalt::proto::message::option::number::SIZE1),
        Some(2048)
    );
    served(&mut legit).await;

    // Malformed link-format and attributes: 4.00 saying what.
    for (uri, body, says) in [
        (
            "/rd?ep=m1",
            "</a>;rt=\"ok\",</b>;rt=\"ok\",</c>;rt=\"ok\",</d>;rt=\"ok\",</e;rt=x",
            "malformed link-format",
        ),
        ("/rd?ep=m2&lt=never", "</a>", "lt=never"),
        ("/rd?lt=60", "</a>", "ep=NAME"),
        ("/rd?ep=m3&base=ftp://h", "</a>", "base"),
    ] {
        let r = post(&client, &format!("{origin}{uri}"), body).await;
        assert_eq!(r.code, Code::BAD_REQUEST, "{uri}");
        assert!(
            r.text_payload().contains(says),
            "{uri}: {}",
            r.text_payload()
        );
    }
    let long_ep = format!("/rd?ep={}", "e".repeat(64));
    assert_eq!(
        post(&client, &format!("{origin}{long_ep}"), "</a>")
            .await
            .code,
        Code::BAD_REQUEST
    );
    served(&mut legit).await;

    // Updating or removing another endpoint's registration: 4.03; it stays.
    let path = location.trim_start_matches(&legit_origin);
    let r = client
        .post(&format!("{origin}{path}?base=coap://evil"), Vec::new())
        .await
        .unwrap();
    assert_eq!(r.code, Code::FORBIDDEN);
    assert_eq!(
        client
            .delete(&format!("{origin}{path}"))
            .await
            .unwrap()
            .code,
        Code::FORBIDDEN
    );
    assert_eq!(
        post(&client, &format!("{origin}/rd?ep=legit"), "</evil>")
            .await
            .code,
        Code::FORBIDDEN
    );
    served(&mut legit).await;

    // A flood of registrations from one address (10^5 scaled down to the budget of 20):
    // 5.03 with Max-Age after the budget, the directory stays bounded.
    let mut refused = 0;
    for i in 0..100 {
        let r = post(&client, &format!("{origin}/rd?ep=flood{i}"), "</f>").await;
        match r.code {
            Code::CREATED => {}
            Code::SERVICE_UNAVAILABLE => {
                assert_eq!(r.options.max_age(), 60);
                refused += 1;
            }
            other => panic!("registration {i} answered {other}"),
        }
    }
    assert_eq!(refused, 80);
    served(&mut legit).await;
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn simple_registration_fetches_the_senders_well_known_core() {
    use cobalt::proto::message::{codec, MessageType};
    let (rd, server, origin) = start(Arc::new(MemoryStore::new()), RdLimits::default()).await;
    let rd_addr: std::net::SocketAddr = origin.trim_start_matches("coap://").parse().unwrap();
    // The endpoint: one UDP socket that sends the simple registration and then serves
    // its /.well-known/core from the same address, as RFC 9176 §5.1 requires.
    let endpoint = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let at = endpoint.local_addr().unwrap();
    let mut post =
        cobalt::proto::message::Message::new(MessageType::Confirmable, Code::POST, 0x5151);
    post.token = cobalt::proto::message::Token::new(&[7]).unwrap();
    post.options.set_uri_path("/.well-known/rd");
    post.options.set_uri_query("ep=simple1&lt=120");
    endpoint
        .send_to(&codec::encode(&post), rd_addr)
        .await
        .unwrap();
    let (mut acked, mut served) = (false, false);
    let mut buf = [0u8; 1500];
    while !(acked && served) {
        let (n, from) = tokio::time::timeout(Duration::from_secs(10), endpoint.recv_from(&mut buf))
            .await
            .unwrap()
            .unwrap();
        let m = codec::decode(&buf[..n]).unwrap();
        if m.mid == 0x5151 && m.mtype == MessageType::Acknowledgement {
            assert_eq!(m.code, Code::CHANGED);
            acked = true;
        } else if m.code == Code::GET {
            assert_eq!(m.options.uri_path_string(), "/.well-known/core");
            let mut answer = cobalt::proto::message::Message::new(
                MessageType::Acknowledgement,
                Code::CONTENT,
                m.mid,
            );
            answer.token = m.token;
            answer
                .options
                .set_uint(cobalt::proto::message::option::number::CONTENT_FORMAT, 40);
            answer.payload = b"</sensors/light>;rt=\"light-lux\"".to_vec();
            endpoint
                .send_to(&codec::encode(&answer), from)
                .await
                .unwrap();
            served = true;
        }
    }
    let client = Client::new();
    let mut found = String::new();
    for _ in 0..100 {
        found = client
            .get(&format!("{origin}/rd-lookup/res?rt=light-lux"))
            .await
            .unwrap()
            .text_payload();
        if !found.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        found,
        format!("<coap://{at}/sensors/light>;rt=\"light-lux\";anchor=\"coap://{at}\"")
    );
    assert_eq!(rd.len().await, 1);
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn simple_registrations_in_progress_are_bounded() {
    let limits = RdLimits {
        max_simple_fetches: 0,
        ..RdLimits::default()
    };
    let (rd, server, origin) = start(Arc::new(MemoryStore::new()), limits).await;
    let r = Client::new()
        .post(&format!("{origin}/.well-known/rd?ep=many"), Vec::new())
        .await
        .unwrap();
    assert_eq!(
        (r.code, r.options.max_age()),
        (Code::SERVICE_UNAVAILABLE, 60)
    );
    let r = Client::new()
        .post(
            &format!("{origin}/.well-known/rd?ep=x&base=coap://h"),
            Vec::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        r.code,
        Code::BAD_REQUEST,
        "simple registration takes no base"
    );
    assert!(rd.is_empty().await);
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn a_restart_on_redb_keeps_registrations_and_their_owners() {
    let data = TempDir::new("rd-restart");
    let client = Client::new();
    let (location, old_origin) = {
        let store = Arc::new(RedbStore::open(data.path()).unwrap());
        let (_rd, server, origin) = start(store, RdLimits::default()).await;
        let r = post(
            &client,
            &format!("{origin}/rd?ep=persistent&lt=3600&d=lab"),
            "</temp>;rt=\"t\"",
        )
        .await;
        assert_eq!(r.code, Code::CREATED);
        server.shutdown(Duration::ZERO).await;
        (r.options.location_path_string().unwrap(), origin)
    };
    let store = Arc::new(RedbStore::open(data.path()).unwrap());
    let (rd, server, origin) = start(store, RdLimits::default()).await;
    assert_ne!(origin, old_origin);
    assert_eq!(rd.len().await, 1);
    let eps = client
        .get(&format!("{origin}/rd-lookup/ep?d=lab"))
        .await
        .unwrap()
        .text_payload();
    assert!(
        eps.starts_with(&format!("<{location}>;ep=persistent;d=lab")),
        "{eps}"
    );
    // The same client (same address) still owns it; new registrations get new ids.
    assert_eq!(
        client
            .post(&format!("{origin}{location}"), Vec::new())
            .await
            .unwrap()
            .code,
        Code::CHANGED
    );
    let r = post(&client, &format!("{origin}/rd?ep=second"), "</x>").await;
    assert_ne!(r.options.location_path_string().unwrap(), location);
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn over_dtls_only_the_registering_psk_identity_may_change_a_registration() {
    use cobalt::transport::credentials::PskStore;
    let rd = ResourceDirectory::open(Arc::new(MemoryStore::new()), RdLimits::default())
        .await
        .unwrap();
    let keys = PskStore::new()
        .with("alice", b"secret-a".to_vec())
        .with("mallory", b"secret-m".to_vec());
    let server = rd
        .install(Server::new())
        .psk(keys)
        .listen(Scheme::Coaps, "127.0.0.1:0")
        .start()
        .await
        .unwrap();
    let origin = format!("coaps://{}", server.local_addr(Scheme::Coaps).unwrap());
    let alice = Client::new().with_psk("alice", b"secret-a".to_vec());
    let mallory = Client::new().with_psk("mallory", b"secret-m".to_vec());

    let mut registration =
        RdClient::new(alice.clone(), &format!("{origin}/rd"), "alice-sensor").lifetime(600);
    let location = registration.register().await.unwrap().to_string();
    // Same address, other identity: refused.
    let r = mallory
        .post(&format!("{location}?lt=1"), Vec::new())
        .await
        .unwrap();
    assert_eq!(r.code, Code::FORBIDDEN, "{}", r.text_payload());
    assert_eq!(
        mallory.delete(&location).await.unwrap().code,
        Code::FORBIDDEN
    );
    assert_eq!(
        post(&mallory, &format!("{origin}/rd?ep=alice-sensor"), "</x>")
            .await
            .code,
        Code::FORBIDDEN
    );
    // The identity that registered may, from any address (a new client, new port).
    let alice_again = Client::new().with_psk("alice", b"secret-a".to_vec());
    let r = alice_again
        .post(&format!("{location}?lt=900"), Vec::new())
        .await
        .unwrap();
    assert_eq!(r.code, Code::CHANGED);
    registration.remove().await.unwrap();
    assert!(rd.is_empty().await);
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn rd_client_registers_again_when_the_directory_lost_its_registration() {
    let (rd, server, origin) = start(Arc::new(MemoryStore::new()), RdLimits::default()).await;
    let client = Client::new();
    let mut registration =
        RdClient::new(client.clone(), &format!("{origin}/rd"), "phoenix").links("</a>");
    let first = registration.register().await.unwrap().to_string();
    // The directory forgets it (as after a restart without storage).
    assert_eq!(client.delete(&first).await.unwrap().code, Code::DELETED);
    registration.update().await.unwrap();
    let second = registration.location().unwrap().to_string();
    assert_ne!(first, second);
    assert_eq!(rd.len().await, 1);
    let eps = lookup_at(
        &client,
        &format!("{origin}/rd-lookup/ep"),
        &[("ep", "phoenix")],
    )
    .await
    .unwrap();
    assert_eq!(eps.len(), 1);
    server.shutdown(Duration::ZERO).await;
}

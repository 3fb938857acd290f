//! The Mbed TLS backend in memory: a client and a server table joined by a loop that
//! carries their datagrams, with the client's address changed at will (a NAT
//! rebinding) and records forged or replayed from other addresses.

use super::*;

const SERVER: &str = "192.0.2.1:5684";
const NODE: &[u8] = &[0xc0, 0xba];

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn keys() -> Arc<PskStore> {
    Arc::new(PskStore::new().with("device-1", "secretPSK"))
}

fn server(cid: Option<CidConfig>) -> MbedtlsDtls {
    MbedtlsDtls::server(keys(), cid, DtlsConfig::default()).unwrap()
}

fn client(key: &str, cid: bool) -> MbedtlsDtls {
    MbedtlsDtls::client(&ClientPsk::new("device-1", key), cid, DtlsConfig::default()).unwrap()
}

fn node_cid() -> Option<CidConfig> {
    Some(CidConfig {
        len: 6,
        node_id: NODE.to_vec(),
    })
}

/// The two tables and what went between them.
struct Link {
    client: MbedtlsDtls,
    server: MbedtlsDtls,
    /// The client's source address now.
    from: SocketAddr,
    /// What the server's endpoint got: (peer address, datagram).
    at_server: Vec<(SocketAddr, Vec<u8>)>,
    /// The moves the server reported (`poll_address_update`).
    moves: Vec<AddressUpdate>,
    /// What the client's endpoint got.
    at_client: Vec<Vec<u8>>,
    /// Records the client sent (the last datagram of each `pump`).
    sent_by_client: Vec<Vec<u8>>,
    /// Server records addressed elsewhere than `from`.
    misdirected: Vec<Transmit>,
}

impl Link {
    fn new(client: MbedtlsDtls, server: MbedtlsDtls) -> Link {
        Link {
            client,
            server,
            from: addr("198.51.100.7:40000"),
            at_server: Vec::new(),
            moves: Vec::new(),
            at_client: Vec::new(),
            sent_by_client: Vec::new(),
            misdirected: Vec::new(),
        }
    }

    /// Carries datagrams both ways until both are quiet.
    fn pump(&mut self, now: Instant) {
        for _ in 0..64 {
            let mut moved = false;
            while let Some(t) = self.client.poll_transmit() {
                assert_eq!(t.peer, addr(SERVER));
                self.sent_by_client.push(t.bytes.clone());
                self.deliver_to_server(now, self.from, &t.bytes);
                moved = true;
            }
            while let Some(t) = self.server.poll_transmit() {
                moved = true;
                if t.peer != self.from {
                    self.misdirected.push(t);
                    continue;
                }
                let got = self.client.handle_datagram(now, addr(SERVER), &t.bytes);
                self.at_client.extend(got);
            }
            if !moved {
                return;
            }
        }
        panic!("the tables kept talking");
    }

    fn deliver_to_server(&mut self, now: Instant, from: SocketAddr, bytes: &[u8]) {
        let got = self.server.handle_datagram(now, from, bytes);
        self.moves
            .extend(std::iter::from_fn(|| self.server.poll_address_update()));
        self.at_server.extend(got.into_iter().map(|d| (from, d)));
    }

    fn send(&mut self, now: Instant, data: &[u8]) {
        self.client.encrypt(now, addr(SERVER), data);
        self.pump(now);
    }

    fn connected(now: Instant, cid: bool) -> Link {
        let mut link = Link::new(client("secretPSK", cid), server(node_cid()));
        link.send(now, b"first");
        assert_eq!(link.at_server.len(), 1, "the first datagram arrives");
        link
    }
}

#[test]
fn psk_handshake_carries_data_both_ways_with_the_mandatory_suite() {
    let now = Instant::now();
    let mut link = Link::connected(now, false);
    let from = link.from;
    assert_eq!(link.at_server[0], (from, b"first".to_vec()));
    assert_eq!(
        link.server.stats().hello_verify_sent,
        1,
        "a cookie exchange first"
    );
    assert_eq!(
        link.server.credential(from).as_deref(),
        Some(&Credential::PskIdentity(b"device-1".to_vec()))
    );
    let suite = link.server.cipher(from).unwrap();
    assert!(suite.contains("PSK") && suite.contains("CCM-8"), "{suite}");
    link.server.encrypt(now, from, b"answer");
    link.pump(now);
    assert_eq!(link.at_client, vec![b"answer".to_vec()]);
    assert!(!link.client.uses_cid(addr(SERVER)), "not asked for");
}

#[test]
fn the_server_grants_a_cid_that_starts_with_the_node_id() {
    let now = Instant::now();
    let mut link = Link::connected(now, true);
    let cid = link.server.cid_of(link.from).unwrap().to_vec();
    assert_eq!(cid.len(), 6);
    assert_eq!(&cid[..2], NODE);
    assert!(link.client.uses_cid(addr(SERVER)));
    // The client's records carry it (type 25).
    link.send(now, b"second");
    let last = link.sent_by_client.last().unwrap();
    assert_eq!(last[0], TLS12_CID);
    assert_eq!(&last[11..17], &cid[..]);
}

#[test]
fn a_rebinding_client_keeps_its_session_without_a_new_handshake() {
    let now = Instant::now();
    let mut link = Link::connected(now, true);
    let first = link.from;
    for port in [40001, 40002] {
        let before = link.from;
        link.from = SocketAddr::new(first.ip(), port);
        link.send(now, b"after rebinding");
        // The move is reported once, and the session is known at its new address.
        assert_eq!(
            link.moves.last(),
            Some(&AddressUpdate {
                from: before,
                to: link.from
            })
        );
        assert_eq!(
            link.at_server.last().unwrap(),
            &(link.from, b"after rebinding".to_vec())
        );
        assert!(
            link.server.cid_of(before).is_none(),
            "nothing at the old address"
        );
        assert!(link.server.poll_address_update().is_none());
        // Answers (and notifications) go to the new address.
        link.server.encrypt(now, link.from, b"notification");
        link.pump(now);
        assert_eq!(link.at_client.last().unwrap(), b"notification");
    }
    assert_eq!(link.moves.len(), 2);
    assert!(link.misdirected.is_empty());
    let stats = link.server.stats();
    assert_eq!(stats.handshakes, 1, "no new handshake");
    assert_eq!(stats.address_updates, 2);
    assert_eq!(link.client.stats().handshakes, 1);
}

#[test]
fn a_forged_record_from_another_address_does_not_move_the_session() {
    let now = Instant::now();
    let mut link = Link::connected(now, true);
    let home = link.from;
    link.client.encrypt(now, addr(SERVER), b"genuine");
    let mut forged = link.client.poll_transmit().unwrap().bytes;
    let last = forged.len() - 1;
    forged[last] ^= 0x01; // the CCM_8 tag no longer matches
    link.deliver_to_server(now, addr("203.0.113.9:5555"), &forged);
    assert_eq!(link.at_server.len(), 1, "nothing from the forged record");
    assert!(
        link.server.credential(home).is_some(),
        "the session stays at home"
    );
    assert!(link.moves.is_empty(), "nothing moved");
    assert_eq!(link.server.stats().address_updates, 0);
    assert_eq!(link.server.stats().address_updates_refused, 1);
    // The session still works from its address.
    link.send(now, b"still here");
    assert_eq!(
        link.at_server.last().unwrap(),
        &(home, b"still here".to_vec())
    );
}

#[test]
fn a_replayed_record_from_another_address_does_not_move_the_session() {
    let now = Instant::now();
    let mut link = Link::connected(now, true);
    let home = link.from;
    link.send(now, b"genuine");
    let genuine = link.sent_by_client.last().unwrap().clone();
    let before = link.at_server.len();
    link.deliver_to_server(now, addr("203.0.113.9:5556"), &genuine);
    assert_eq!(link.at_server.len(), before, "a replay carries nothing");
    assert!(
        link.server.credential(home).is_some(),
        "the session stays at home"
    );
    assert!(link.moves.is_empty(), "nothing moved");
    assert_eq!(link.server.stats().address_updates, 0);
    assert_eq!(link.server.stats().address_updates_refused, 1);
}

#[test]
fn an_authentic_but_older_record_from_another_address_does_not_move_the_session() {
    let now = Instant::now();
    let mut link = Link::connected(now, true);
    let home = link.from;
    link.client.encrypt(now, addr(SERVER), b"older");
    let older = link.client.poll_transmit().unwrap().bytes;
    link.send(now, b"newer"); // accepted from home first
    link.deliver_to_server(now, addr("203.0.113.9:5557"), &older);
    assert!(
        link.server.credential(home).is_some(),
        "the session stays at home"
    );
    assert!(link.moves.is_empty(), "nothing moved");
    assert_eq!(link.server.stats().address_updates_refused, 1);
    assert!(link.at_server.iter().all(|(_, d)| d != b"older"));
}

#[test]
fn without_a_cid_a_new_address_is_a_stranger() {
    let now = Instant::now();
    let mut link = Link::connected(now, false);
    let home = link.from;
    link.from = addr("198.51.100.7:40009");
    link.client.encrypt(now, addr(SERVER), b"lost");
    link.pump(now);
    assert!(link.at_server.iter().all(|(_, d)| d != b"lost"));
    assert!(
        link.server.credential(home).is_some(),
        "the session stays at home"
    );
    assert!(link.moves.is_empty(), "nothing moved");
}

#[test]
fn a_wrong_key_fails_the_handshake_on_both_sides() {
    let now = Instant::now();
    let mut link = Link::new(client("not the key", true), server(node_cid()));
    link.send(now, b"never");
    assert!(link.at_server.is_empty());
    let failed = std::iter::from_fn(|| link.client.poll_event())
        .any(|e| matches!(e, DtlsEvent::HandshakeFailed { .. }));
    assert!(failed, "the client learns of it");
    assert_eq!(link.server.stats().sessions, 0);
}

#[test]
fn handshake_flights_are_retransmitted_on_the_timer_and_given_up() {
    let start = Instant::now();
    let mut c = client("secretPSK", true);
    c.encrypt(start, addr(SERVER), b"hello?");
    assert!(c.poll_transmit().is_some(), "the ClientHello");
    let at = c.poll_timeout().expect("a retransmission timer");
    assert!(at > start);
    c.handle_timeout(at);
    assert!(
        c.poll_transmit().is_some(),
        "sent again when the timer fires"
    );
    let end = start + DtlsConfig::default().handshake_timeout;
    c.handle_timeout(end);
    let failed = std::iter::from_fn(|| c.poll_event())
        .any(|e| matches!(e, DtlsEvent::HandshakeFailed { .. }));
    assert!(failed);
    assert_eq!(c.session_count(), 0);
}

#[test]
fn hostile_datagrams_are_dropped_without_state() {
    let now = Instant::now();
    let mut link = Link::connected(now, true);
    let cid = link.server.cid_of(link.from).unwrap().to_vec();
    let stranger = addr("203.0.113.10:1");
    let mut cid_record = vec![TLS12_CID, 0xfe, 0xfd, 0, 1, 0, 0, 0, 0, 0, 9];
    cid_record.extend_from_slice(&cid);
    cid_record.extend_from_slice(&[0, 40]);
    cid_record.extend_from_slice(&[0xaa; 40]);
    let inputs: Vec<Vec<u8>> = vec![
        vec![],
        vec![22; 12],
        cid_record[..14].to_vec(), // cut inside the CID
        cid_record.clone(),        // a known CID, garbage inside
        vec![22, 0xfe, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 1, 0, 0], // a ClientHello cut short
        fragment_of_a_client_hello(),
        (0..200u8).collect(),
    ];
    for input in &inputs {
        let got = link.server.handle_datagram(now, stranger, input);
        assert!(got.is_empty());
    }
    assert_eq!(link.server.stats().sessions, 1);
    assert_eq!(link.server.stats().handshaking, 0);
    assert_eq!(link.server.stats().address_updates, 0);
}

#[test]
fn close_all_sends_close_notify_and_the_peer_ends_its_session() {
    let now = Instant::now();
    let mut link = Link::connected(now, true);
    link.client.close_all();
    link.pump(now);
    assert_eq!(link.client.session_count(), 0);
    assert_eq!(
        link.server.session_count(),
        0,
        "the server heard close_notify"
    );
}

#[test]
fn cid_settings_out_of_range_are_refused_with_a_reason() {
    let long = CidConfig {
        len: 2,
        node_id: vec![1, 2, 3],
    };
    let e = MbedtlsDtls::server(keys(), Some(long), DtlsConfig::default()).unwrap_err();
    assert!(e.to_string().contains("does not fit"), "{e}");
    let zero = CidConfig {
        len: 0,
        node_id: vec![],
    };
    assert!(MbedtlsDtls::server(keys(), Some(zero), DtlsConfig::default()).is_err());
}

#[test]
fn a_late_copy_of_the_clienthello_does_not_restart_an_established_session() {
    let now = Instant::now();
    let mut link = Link::connected(now, true);
    let home = link.from;
    // The client's second ClientHello (the one with the cookie), replayed.
    let hello = link.sent_by_client[1].clone();
    assert!(is_client_hello(&hello) && hello_random(&hello).is_some());
    link.deliver_to_server(now, home, &hello);
    link.pump(now);
    let stats = link.server.stats();
    assert_eq!((stats.sessions, stats.handshaking), (1, 0));
    assert!(link.server.cid_of(home).is_some(), "the same session");
    link.send(now, b"still the same session");
    assert_eq!(
        link.at_server.last().unwrap(),
        &(home, b"still the same session".to_vec())
    );
}

#[test]
fn a_new_clienthello_from_the_address_starts_a_new_session() {
    let now = Instant::now();
    let mut link = Link::connected(now, true);
    let old_cid = link.server.cid_of(link.from).unwrap().to_vec();
    // The device restarted: a new client table, the same address.
    link.client = client("secretPSK", true);
    link.send(now, b"after restart");
    assert_eq!(link.at_server.last().unwrap().1, b"after restart");
    assert_eq!(link.server.stats().handshakes, 2);
    assert_eq!(link.server.stats().sessions, 1, "the old session is gone");
    assert_ne!(link.server.cid_of(link.from).unwrap(), &old_cid[..]);
}

#[test]
fn a_client_handshakes_again_when_the_server_lost_its_session() {
    let now = Instant::now();
    let mut link = Link::connected(now, true);
    link.server = server(node_cid()); // restarted: knows no session
    link.send(now, b"request");
    assert_eq!(
        link.at_server.len(),
        1,
        "records for the lost session go nowhere"
    );
    link.send(now, b"request"); // the first resend
    assert_eq!(
        link.at_server.last().unwrap().1,
        b"request",
        "carried by a new session"
    );
    assert_eq!(link.client.stats().handshakes, 2);
}

/// A server with a certificate (EC P-256, from a throwaway CA) and an OpenSSL client
/// that verifies it: `TLS_ECDHE_ECDSA_WITH_AES_128_CCM_8`, with a CID.
#[cfg(feature = "openssl")]
#[test]
fn an_openssl_client_verifies_the_server_certificate_over_ecdhe_ecdsa_ccm_8() {
    use crate::transport::credentials::test_credentials::TestCredentials;
    use crate::transport::credentials::ClientCredentials;
    use crate::transport::dtls::OpensslDtls;
    let now = Instant::now();
    let pki = TestCredentials::generate("mbedtls-cert");
    let server_cert = X509Credentials {
        ca_pem: None,
        ..pki.server.clone()
    };
    let mut server =
        MbedtlsDtls::server_with(None, Some(&server_cert), node_cid(), DtlsConfig::default())
            .unwrap();
    let trust = X509Credentials {
        cert_chain_pem: Vec::new(),
        key_pem: Vec::new(),
        ca_pem: Some(pki.ca_pem.clone()),
        server_name: None,
    };
    let mut client =
        OpensslDtls::client_with(&ClientCredentials::X509(trust), DtlsConfig::default()).unwrap();
    let (from, to) = (addr("127.0.0.1:40000"), addr("127.0.0.1:5684"));
    client.encrypt(now, to, b"over a certificate");
    assert_eq!(
        carry(&mut client, &mut server),
        vec![b"over a certificate".to_vec()]
    );
    assert_eq!(
        client.cipher(to),
        Some("ECDHE-ECDSA-AES128-CCM8"),
        "RFC 7252's certificate suite"
    );
    assert_eq!(server.credential(from), None, "the client is anonymous");
}

#[test]
fn certificates_that_do_not_parse_are_refused_with_a_reason() {
    let garbage = X509Credentials {
        cert_chain_pem: b"-----BEGIN CERTIFICATE-----".to_vec(),
        key_pem: Vec::new(),
        ca_pem: None,
        server_name: None,
    };
    let e =
        MbedtlsDtls::server_with(None, Some(&garbage), None, DtlsConfig::default()).unwrap_err();
    assert!(e.to_string().contains("PEM"), "{e}");
}

/// An OpenSSL client with `auth` against `server` (a server table of either
/// backend) from 127.0.0.1:40000: what the server got of one datagram.
#[cfg(feature = "openssl")]
fn openssl_certificate_client(
    server: &mut dyn DtlsBackend,
    auth: crate::transport::credentials::X509Credentials,
) -> Vec<Vec<u8>> {
    use crate::transport::credentials::ClientCredentials;
    use crate::transport::dtls::OpensslDtls;
    let mut client =
        OpensslDtls::client_with(&ClientCredentials::X509(auth), DtlsConfig::default()).unwrap();
    client.encrypt(
        Instant::now(),
        addr("127.0.0.1:5684"),
        b"with a client certificate",
    );
    carry(&mut client, server)
}

/// With a CA, the server asks for a client certificate: one that chains to the CA
/// is the session's credential, named as the OpenSSL backend names it.
#[cfg(feature = "openssl")]
#[test]
fn a_client_certificate_that_chains_to_the_ca_is_the_credential() {
    use crate::transport::credentials::test_credentials::TestCredentials;
    use crate::transport::dtls::OpensslDtls;
    let pki = TestCredentials::generate("mbedtls-client-cert");
    assert!(pki.server.ca_pem.is_some(), "the server trusts the CA");
    let from = addr("127.0.0.1:40000");
    let mut server =
        MbedtlsDtls::server_with(None, Some(&pki.server), node_cid(), DtlsConfig::default())
            .unwrap();
    let got = openssl_certificate_client(&mut server, pki.client.clone());
    assert_eq!(got, vec![b"with a client certificate".to_vec()]);
    let credential = server.credential(from).expect("a verified certificate");
    let Credential::Certificate { subject } = credential.as_ref() else {
        panic!("{credential:?}");
    };
    assert!(subject.contains("CN="), "{subject}");
    let mut openssl =
        OpensslDtls::server_with(None, Some(&pki.server), DtlsConfig::default()).unwrap();
    openssl_certificate_client(&mut openssl, pki.client.clone());
    assert_eq!(
        openssl.credential(from),
        Some(credential),
        "as OpenSSL names it"
    );
}

/// Mbed TLS is built without a clock here: the validity dates are checked by a
/// callback of ours; an expired client certificate (and one of another CA, and
/// none at all) gets no session.
#[cfg(feature = "openssl")]
#[test]
fn client_certificates_of_another_ca_expired_or_missing_get_no_session() {
    use crate::transport::credentials::test_credentials::TestCredentials;
    let pki = TestCredentials::generate("mbedtls-client-ca");
    let other = TestCredentials::generate("another-ca");
    let expired = TestCredentials::generate_expired("expired-ca");
    // The client trusts the server's CA in every case; only its own certificate
    // differs.
    let trusting_the_server = |x: &X509Credentials| X509Credentials {
        ca_pem: Some(pki.ca_pem.clone()),
        ..x.clone()
    };
    let no_certificate = X509Credentials {
        cert_chain_pem: Vec::new(),
        key_pem: Vec::new(),
        ..pki.client.clone()
    };
    for (what, client, server_trusts) in [
        (
            "another CA",
            trusting_the_server(&other.client),
            &pki.ca_pem,
        ),
        (
            "expired",
            trusting_the_server(&expired.client),
            &expired.ca_pem,
        ),
        ("no certificate", no_certificate, &pki.ca_pem),
    ] {
        let server_x509 = X509Credentials {
            ca_pem: Some(server_trusts.clone()),
            ..pki.server.clone()
        };
        let mut server =
            MbedtlsDtls::server_with(None, Some(&server_x509), None, DtlsConfig::default())
                .unwrap();
        let got = openssl_certificate_client(&mut server, client);
        assert!(got.is_empty(), "{what}");
        assert_eq!(server.stats().sessions, 0, "{what}");
        assert_eq!(server.stats().handshake_failures, 1, "{what}");
    }
}

/// Carries datagrams between a client and a server table (of either backend) at
/// 127.0.0.1:40000 and :5684 until both are quiet; returns what the server got.
fn carry(client: &mut dyn DtlsBackend, server: &mut dyn DtlsBackend) -> Vec<Vec<u8>> {
    let now = Instant::now();
    let (from, to) = (addr("127.0.0.1:40000"), addr("127.0.0.1:5684"));
    let mut got = Vec::new();
    for _ in 0..32 {
        let mut moved = false;
        while let Some(t) = client.poll_transmit() {
            got.extend(server.handle_datagram(now, from, &t.bytes));
            moved = true;
        }
        while let Some(t) = server.poll_transmit() {
            client.handle_datagram(now, to, &t.bytes);
            moved = true;
        }
        if !moved {
            break;
        }
    }
    got
}

/// An Mbed TLS client with a certificate, against an OpenSSL server and an Mbed TLS
/// server (with a CID) that require one: both name the client by its subject.
#[cfg(feature = "openssl")]
#[test]
fn an_mbedtls_client_with_a_certificate_is_verified_by_both_backends() {
    use crate::transport::credentials::test_credentials::TestCredentials;
    use crate::transport::credentials::ClientCredentials;
    use crate::transport::dtls::OpensslDtls;
    let pki = TestCredentials::generate("mbedtls-client");
    let auth = ClientCredentials::X509(pki.client.clone());
    let (from, to) = (addr("127.0.0.1:40000"), addr("127.0.0.1:5684"));
    let mut openssl =
        OpensslDtls::server_with(None, Some(&pki.server), DtlsConfig::default()).unwrap();
    let mut mbedtls =
        MbedtlsDtls::server_with(None, Some(&pki.server), node_cid(), DtlsConfig::default())
            .unwrap();
    let servers: [&mut dyn DtlsBackend; 2] = [&mut openssl, &mut mbedtls];
    let mut subjects = Vec::new();
    for server in servers {
        let mut client = MbedtlsDtls::client_with(&auth, true, DtlsConfig::default()).unwrap();
        client.encrypt(Instant::now(), to, b"signed");
        assert_eq!(carry(&mut client, server), vec![b"signed".to_vec()]);
        let credential = server.credential(from).expect("a verified certificate");
        assert!(matches!(
            credential.as_ref(),
            Credential::Certificate { .. }
        ));
        subjects.push(credential);
        assert!(client.cipher(to).unwrap().contains("ECDHE-ECDSA"));
    }
    assert_eq!(subjects[0], subjects[1]);
    assert!(mbedtls.cid_of(from).is_some(), "with a CID");
}

/// An Mbed TLS client refuses a server whose certificate is of another CA, or not
/// for the name it expects; without a CA it cannot be made.
#[cfg(feature = "openssl")]
#[test]
fn an_mbedtls_client_refuses_a_server_it_cannot_verify() {
    use crate::transport::credentials::test_credentials::TestCredentials;
    use crate::transport::credentials::ClientCredentials;
    use crate::transport::dtls::OpensslDtls;
    let pki = TestCredentials::generate("mbedtls-server-check");
    let other = TestCredentials::generate("another-ca");
    let to = addr("127.0.0.1:5684");
    let another_ca = X509Credentials {
        ca_pem: Some(other.ca_pem.clone()),
        ..pki.client.clone()
    };
    let another_name = X509Credentials {
        server_name: Some("elsewhere.example".into()),
        ..pki.client.clone()
    };
    for (what, auth) in [("another CA", another_ca), ("another name", another_name)] {
        let mut server = OpensslDtls::server_with(
            None,
            Some(&X509Credentials {
                ca_pem: None,
                ..pki.server.clone()
            }),
            DtlsConfig::default(),
        )
        .unwrap();
        let mut client =
            MbedtlsDtls::client_with(&ClientCredentials::X509(auth), false, DtlsConfig::default())
                .unwrap();
        client.encrypt(Instant::now(), to, b"x");
        assert!(carry(&mut client, &mut server).is_empty(), "{what}");
        let failed = std::iter::from_fn(|| client.poll_event())
            .any(|e| matches!(e, DtlsEvent::HandshakeFailed { .. }));
        assert!(failed, "{what}");
    }
    let no_ca = X509Credentials {
        ca_pem: None,
        ..pki.client.clone()
    };
    let e = MbedtlsDtls::client_with(
        &ClientCredentials::X509(no_ca),
        false,
        DtlsConfig::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("CA"), "{e}");
}

/// Mbed TLS's server sends no alert when a required client certificate is missing:
/// the table sends one, so that the client fails at once, not at its timeout.
#[cfg(feature = "openssl")]
#[test]
fn a_client_without_a_required_certificate_is_told_at_once() {
    use crate::transport::credentials::test_credentials::TestCredentials;
    use crate::transport::credentials::ClientCredentials;
    let pki = TestCredentials::generate("mbedtls-no-client-cert");
    let mut server =
        MbedtlsDtls::server_with(None, Some(&pki.server), None, DtlsConfig::default()).unwrap();
    let anonymous = X509Credentials {
        cert_chain_pem: Vec::new(),
        key_pem: Vec::new(),
        ..pki.client.clone()
    };
    let mut client = MbedtlsDtls::client_with(
        &ClientCredentials::X509(anonymous),
        false,
        DtlsConfig::default(),
    )
    .unwrap();
    client.encrypt(Instant::now(), addr("127.0.0.1:5684"), b"x");
    assert!(carry(&mut client, &mut server).is_empty());
    let events: Vec<DtlsEvent> = std::iter::from_fn(|| client.poll_event()).collect();
    assert!(
        matches!(&events[..], [DtlsEvent::HandshakeFailed { reason, .. }] if reason.contains("alert")),
        "{events:?}"
    );
    assert_eq!(server.stats().handshake_failures, 1);
}

#[test]
fn utc_civil_times_of_some_known_instants() {
    use super::ffi::civil_utc;
    assert_eq!(civil_utc(0), (1970, 1, 1, 0, 0, 0));
    assert_eq!(civil_utc(951_782_400), (2000, 2, 29, 0, 0, 0));
    assert_eq!(civil_utc(1_798_761_599), (2026, 12, 31, 23, 59, 59));
    assert_eq!(civil_utc(4_107_542_400), (2100, 3, 1, 0, 0, 0));
}

#[test]
fn a_full_table_refuses_an_anonymous_newcomer_but_not_a_key_holder() {
    // Room for one session; the holder is active (not stale).
    let config = DtlsConfig {
        max_sessions: 1,
        ..DtlsConfig::default()
    };
    let now = Instant::now();
    let mut link = Link::new(
        client("secretPSK", true),
        MbedtlsDtls::server(keys(), node_cid(), config.clone()).unwrap(),
    );
    link.send(now, b"first");
    let first = link.from;
    // Another key holder from another port: takes the place only if the first is
    // stale or anonymous; it is neither, so it is refused.
    link.client = client("secretPSK", true);
    link.from = addr("198.51.100.7:40100");
    link.send(now, b"second");
    assert_eq!(link.server.stats().refused, 1);
    assert!(
        link.server.cid_of(first).is_some(),
        "the active session stays"
    );
    // Once the first is stale, a newcomer takes its place.
    let later = now + config.stale_after;
    link.client = client("secretPSK", true);
    link.from = addr("198.51.100.7:40200");
    link.send(later, b"third");
    assert_eq!(link.at_server.last().unwrap().1, b"third");
    assert!(
        link.server.cid_of(first).is_none(),
        "the stale session gave way"
    );
}

/// The first 10 bytes of a 100-byte ClientHello, as a fragment (RFC 6347 §4.2.3).
fn fragment_of_a_client_hello() -> Vec<u8> {
    let mut r = vec![22, 0xfe, 0xfd, 0, 0, 0, 0, 0, 0, 0, 1, 0, 22];
    r.extend_from_slice(&[1, 0, 0, 100, 0, 0, 0, 0, 0, 0, 0, 10]);
    r.extend_from_slice(&[0xfe, 0xfd, 1, 2, 3, 4, 5, 6, 7, 8]);
    r
}

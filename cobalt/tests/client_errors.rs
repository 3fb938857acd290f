//! What the client reports when a request cannot be answered: a closed port is
//! reported at once as [`Error::Unreachable`] ("port not open", from the kernel's ICMP
//! error) instead of after the retransmissions, over UDP and DTLS, IPv4 and IPv6.

use cobalt::Scheme;
use cobalt::{Client, Error};
use std::time::Duration;

/// A UDP port on `ip` that nothing listens on (bound a moment ago, then closed).
fn closed_port(ip: &str) -> std::net::SocketAddr {
    std::net::UdpSocket::bind(format!("{ip}:0"))
        .unwrap()
        .local_addr()
        .unwrap()
}

#[tokio::test]
async fn a_closed_port_is_reported_at_once_not_as_a_timeout() {
    let v4 = closed_port("127.0.0.1");
    let v6 = closed_port("[::1]");
    let client = Client::new();
    for (uri, peer) in [
        (format!("coap://{v4}/x"), v4),
        (format!("coap://{v6}/x"), v6),
    ] {
        // The deadline is far beyond how long the kernel takes to answer: the error
        // must be the ICMP one, not the deadline.
        let e = client
            .request(cobalt::Code::GET, &uri)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .unwrap_err();
        match &e {
            Error::Unreachable { peer: p, reason } => {
                assert_eq!(*p, peer);
                assert!(reason.starts_with("port not open"), "{reason}");
            }
            other => panic!("{uri}: expected Unreachable, got {other:?}"),
        }
        assert!(e.to_string().contains("port not open"), "{e}");
    }
    // DTLS: the handshake's first flight meets the closed port.
    #[cfg(feature = "openssl")]
    {
        let e = client
            .with_psk("alice", "secretPSK")
            .request(cobalt::Code::GET, &format!("coaps://{v4}/x"))
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Unreachable { .. }), "{e:?}");
    }
    // The client still works for a server that is there.
    let server = cobalt::Server::new()
        .route("/x", cobalt::server::get(|| async { "here" }))
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let r = client
        .get(&format!(
            "coap://{}/x",
            server.local_addr(Scheme::Coap).unwrap()
        ))
        .await
        .unwrap();
    assert_eq!(r.text_payload(), "here");
}

/// Without the `openssl` feature, DTLS and TLS requests fail with an error that names
/// the feature; plain CoAP works.
#[cfg(not(feature = "openssl"))]
#[tokio::test]
async fn without_openssl_secure_schemes_name_the_missing_feature() {
    let client = Client::new().with_psk("alice", "secretPSK");
    for uri in ["coaps://127.0.0.1:9/x", "coaps+tcp://127.0.0.1:9/x"] {
        match client.get(uri).await {
            Err(Error::Unsupported(m @ cobalt::Unsupported::Feature { .. })) => {
                assert!(m.to_string().contains("`openssl` feature"), "{m}")
            }
            other => panic!("{uri}: expected Unsupported, got {other:?}"),
        }
    }
}

/// Returned from `main`, an error prints as `Error: {:?}`: that must read as the
/// message, not as the enum's fields.
#[test]
fn errors_read_well_when_returned_from_main() {
    let peer: std::net::SocketAddr = "192.0.2.1:5683".parse().unwrap();
    for e in [
        Error::Timeout {
            peer,
            retransmissions: 4,
        },
        Error::Unreachable {
            peer,
            reason: "port not open".into(),
        },
        Error::ObservationLost { peer, attempts: 3 },
        Error::Deadline(Duration::from_secs(5)),
    ] {
        assert_eq!(format!("{e:?}"), e.to_string());
        assert!(!format!("{e:?}").contains('{'), "{e:?}");
    }
}

//! The credentials in OpenSSL contexts (DTLS and TLS alike).

use super::{ClientPsk, PskStore, X509Credentials};
use openssl::error::ErrorStack;
use openssl::pkey::PKey;
use openssl::ssl::{SslContextBuilder, SslRef};
use std::net::SocketAddr;
use std::sync::Arc;

/// Loads this side's certificate chain and key, and the CA store for the peer's
/// certificate, into a context (DTLS or TLS).
pub(crate) fn load_x509(
    b: &mut SslContextBuilder,
    creds: &X509Credentials,
) -> Result<(), ErrorStack> {
    if !creds.cert_chain_pem.is_empty() {
        let mut chain = openssl::x509::X509::stack_from_pem(&creds.cert_chain_pem)?.into_iter();
        if let Some(leaf) = chain.next() {
            b.set_certificate(&leaf)?;
        }
        for extra in chain {
            b.add_extra_chain_cert(extra)?;
        }
        let key = PKey::private_key_from_pem(&creds.key_pem)?;
        b.set_private_key(&key)?;
        b.check_private_key()?;
    }
    if let Some(ca) = &creds.ca_pem {
        let mut store = openssl::x509::store::X509StoreBuilder::new()?;
        for cert in openssl::x509::X509::stack_from_pem(ca)? {
            store.add_cert(cert)?;
        }
        b.set_verify_cert_store(store.build())?;
    }
    Ok(())
}

/// Checks that certificate credentials can serve this table's suites: the DTLS
/// certificate suites are ECDHE-ECDSA only ([`CIPHERS`](crate::transport::dtls::CIPHERS)), so the key must be an EC key
/// on P-256. The error names the key found and says what to use instead, so a server
/// refuses such a certificate at start rather than failing every handshake.
pub fn check_certificate(creds: &X509Credentials) -> Result<(), String> {
    use openssl::nid::Nid;
    use openssl::pkey::Id;
    let key = PKey::private_key_from_pem(&creds.key_pem)
        .map_err(|e| format!("the private key does not parse as PEM: {e}"))?;
    let found = match key.id() {
        Id::EC => match key.ec_key().ok().and_then(|k| k.group().curve_name()) {
            Some(Nid::X9_62_PRIME256V1) => return Ok(()),
            Some(nid) => format!(
                "an EC key on {}",
                nid.short_name().unwrap_or("another curve")
            ),
            None => "an EC key on an unnamed curve".into(),
        },
        Id::RSA => format!("an RSA key ({} bits)", key.bits()),
        Id::ED25519 => "an Ed25519 key".into(),
        _ => "a key of another type".into(),
    };
    Err(format!(
        "it has {found}, but the DTLS certificate suites (ECDHE-ECDSA with AES-128-CCM8 or \
         -GCM) need an EC key on P-256: make one with `openssl ecparam -name prime256v1 \
         -genkey -noout -out server.key` and a certificate for it"
    ))
}

#[cfg(all(test, feature = "openssl"))]
mod certificate_check {
    use super::*;
    use crate::transport::credentials::test_credentials::TestCredentials;

    #[test]
    fn only_p256_keys_serve_the_dtls_suites() {
        let pki = TestCredentials::generate("check");
        assert_eq!(check_certificate(&pki.server), Ok(()));
        let rsa = openssl::rsa::Rsa::generate(2048).unwrap();
        let rsa = X509Credentials {
            key_pem: PKey::from_rsa(rsa)
                .unwrap()
                .private_key_to_pem_pkcs8()
                .unwrap(),
            ..pki.server.clone()
        };
        let e = check_certificate(&rsa).unwrap_err();
        assert!(
            e.contains("RSA key (2048 bits)") && e.contains("prime256v1"),
            "{e}"
        );
        let group = openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::SECP384R1).unwrap();
        let p384 = X509Credentials {
            key_pem: PKey::from_ec_key(openssl::ec::EcKey::generate(&group).unwrap())
                .unwrap()
                .private_key_to_pem_pkcs8()
                .unwrap(),
            ..pki.server
        };
        let e = check_certificate(&p384).unwrap_err();
        assert!(e.contains("secp384r1"), "{e}");
        let garbage = X509Credentials {
            key_pem: b"not a key".to_vec(),
            ..p384
        };
        assert!(check_certificate(&garbage)
            .unwrap_err()
            .contains("does not parse"));
    }
}

/// Makes a (D)TLS server context look pre-shared keys up in `keys` by identity.
pub(crate) fn set_psk_server(b: &mut SslContextBuilder, keys: Arc<PskStore>) {
    b.set_psk_server_callback(move |ssl, identity, psk| {
        let key = identity.and_then(|id| keys.get(id));
        match key {
            Some(k) if k.len() <= psk.len() => {
                if let Some(id) = identity {
                    // OpenSSL does not keep it for TLS 1.3 external PSKs.
                    crate::transport::identity::remember_psk_identity(ssl, id);
                }
                psk[..k.len()].copy_from_slice(k);
                Ok(k.len())
            }
            // Unknown identity: OpenSSL answers with an unknown_psk_identity alert.
            _ => Err(ErrorStack::get()),
        }
    });
}

/// Makes a (D)TLS client context authenticate with `psk`.
pub(crate) fn set_psk_client(b: &mut SslContextBuilder, psk: ClientPsk) {
    b.set_psk_client_callback(move |_ssl, _hint, identity, key| {
        // The identity is written as a NUL-terminated string.
        if psk.identity.len() >= identity.len() || psk.key.len() > key.len() {
            return Err(ErrorStack::get());
        }
        identity[..psk.identity.len()].copy_from_slice(&psk.identity);
        identity[psk.identity.len()] = 0;
        key[..psk.key.len()].copy_from_slice(&psk.key);
        Ok(psk.key.len())
    });
}

/// Makes a client session check that the server's certificate names `name` (a host
/// name, also sent as SNI, or an IP address), or without a name the address `peer`.
pub(crate) fn expect_peer_name(
    ssl: &mut SslRef,
    name: Option<&str>,
    peer: SocketAddr,
) -> Result<(), ErrorStack> {
    match name.map(|n| (n, n.parse::<std::net::IpAddr>())) {
        Some((_, Ok(ip))) => ssl.param_mut().set_ip(ip),
        Some((host, Err(_))) => {
            ssl.set_hostname(host)?;
            ssl.param_mut().set_host(host)
        }
        None => ssl.param_mut().set_ip(peer.ip()),
    }
}

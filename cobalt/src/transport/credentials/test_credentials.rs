//! For tests: a throwaway PKI (`cobalt_test_support::pki`) as [`X509Credentials`].
//! Cobalt's integration tests include this file too (`tests/common/mod.rs`), whose
//! parent module imports `X509Credentials` as this one's does.

use super::X509Credentials;
use cobalt_test_support::pki::{Issued, TestPki};

/// A throwaway PKI as credentials: the server's and the client's, each trusting the
/// CA for the other's certificate.
pub struct TestCredentials {
    /// The CA certificate (PEM).
    pub ca_pem: Vec<u8>,
    /// A server certificate for `localhost`, 127.0.0.1 and ::1.
    pub server: X509Credentials,
    /// A client certificate.
    pub client: X509Credentials,
}

impl TestCredentials {
    /// A fresh CA named `cn` and certificates valid for 30 days.
    pub fn generate(cn: &str) -> TestCredentials {
        Self::from_pki(&TestPki::generate(cn).unwrap())
    }

    /// Like [`TestCredentials::generate`], but the certificates expired yesterday.
    pub fn generate_expired(cn: &str) -> TestCredentials {
        Self::from_pki(&TestPki::generate_expired(cn).unwrap())
    }

    /// `pki`'s CA and certificates.
    pub fn from_pki(pki: &TestPki) -> TestCredentials {
        let of = |issued: &Issued| X509Credentials {
            cert_chain_pem: issued.cert_pem.clone(),
            key_pem: issued.key_pem.clone(),
            ca_pem: Some(pki.ca_pem.clone()),
            server_name: None,
        };
        TestCredentials {
            ca_pem: pki.ca_pem.clone(),
            server: of(&pki.server),
            client: of(&pki.client),
        }
    }
}

//! The TLS side of CoAP → HTTPS: which certificate authorities the proxy trusts for
//! `https` origins ([`HttpsTrust`]: the Mozilla roots of `webpki-roots` and CA files
//! the operator adds), and the handshake, whose failures become 5.02 answers that say
//! what went wrong. Certificates are always verified (name and chain); there is no
//! switch to turn that off.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use std::path::Path;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// The certificate authorities an `https` origin's certificate must chain to: by
/// default the Mozilla root program's (`webpki-roots`), plus any added from PEM files
/// (`cobalt proxy --http-ca FILE`) for origins with a private CA.
#[derive(Debug, Clone)]
pub struct HttpsTrust {
    webpki_roots: bool,
    added: Vec<CertificateDer<'static>>,
}

impl Default for HttpsTrust {
    /// The webpki roots, nothing added.
    fn default() -> Self {
        HttpsTrust {
            webpki_roots: true,
            added: Vec::new(),
        }
    }
}

/// A CA file or PEM text that gives no usable certificate authority.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadCa(String);

impl HttpsTrust {
    /// Only the authorities added with [`with_pem`](Self::with_pem) or
    /// [`with_pem_file`](Self::with_pem_file), not the webpki roots: for a proxy
    /// that reaches origins of one private PKI alone.
    pub fn added_only() -> Self {
        HttpsTrust {
            webpki_roots: false,
            added: Vec::new(),
        }
    }

    /// Also trusts every certificate in the PEM text `pem` (`-----BEGIN
    /// CERTIFICATE-----` blocks; other blocks are skipped). Refused when it holds
    /// none, or one that is not a CA certificate a chain can end in.
    pub fn with_pem(mut self, pem: &[u8], source: &str) -> Result<Self, BadCa> {
        let mut found = 0;
        let mut check = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| BadCa(format!("{source}: not readable as PEM: {e}")))?;
            check.add(cert.clone()).map_err(|e| {
                BadCa(format!(
                    "{source}: certificate {} is not usable as a trust anchor: {e}",
                    found + 1
                ))
            })?;
            self.added.push(cert);
            found += 1;
        }
        if found == 0 {
            return Err(BadCa(format!(
                "{source}: no '-----BEGIN CERTIFICATE-----' block; give the CA's certificate in PEM"
            )));
        }
        Ok(self)
    }

    /// Also trusts every certificate in the PEM file at `path` (see
    /// [`with_pem`](Self::with_pem)).
    pub fn with_pem_file(self, path: &Path) -> Result<Self, BadCa> {
        let pem = std::fs::read(path)
            .map_err(|e| BadCa(format!("cannot read CA file {}: {e}", path.display())))?;
        self.with_pem(&pem, &path.display().to_string())
    }

    /// The authorities added to the default set (or to none).
    pub fn added(&self) -> usize {
        self.added.len()
    }

    /// The TLS client settings: these roots, TLS 1.2 and 1.3, ALPN `http/1.1`.
    pub(crate) fn client_config(&self) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        if self.webpki_roots {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        for cert in &self.added {
            // Checked when added.
            let _ = roots.add(cert.clone());
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

/// Runs the TLS handshake with `host` (a DNS name or an address, which the
/// certificate must name) over `tcp`. A failure says what failed, and for a
/// certificate that does not verify, how to trust its CA (the proxy answers it 5.02 /
/// 502).
pub(crate) async fn handshake(
    config: Arc<ClientConfig>,
    host: &str,
    port: u16,
    tcp: TcpStream,
) -> Result<TlsStream<TcpStream>, String> {
    let name = ServerName::try_from(host.to_string()).map_err(|_| {
        format!("https://{host}:{port}: '{host}' is not a name or address TLS can verify")
    })?;
    TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| tls_failure(host, port, &e))
}

/// What a failed handshake with `host:port` says, from the I/O error tokio-rustls
/// gives (a [`rustls::Error`] inside when TLS itself failed). Short: a server sends
/// an unverified client at most three times its request, diagnostic included.
fn tls_failure(host: &str, port: u16, e: &std::io::Error) -> String {
    let tls = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    let hint = match tls {
        Some(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer | rustls::CertificateError::BadSignature,
        )) => " (add its CA: --http-ca)",
        Some(_) => "",
        None => " (during the handshake)",
    };
    format!("TLS with {host}:{port}: {e}{hint}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_without_a_certificate_is_refused_with_its_source() {
        let e = HttpsTrust::default()
            .with_pem(b"not pem at all", "ca.pem")
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("ca.pem: no '-----BEGIN CERTIFICATE"),
            "{e}"
        );
        let e = HttpsTrust::default()
            .with_pem_file(Path::new("/nonexistent/ca.pem"))
            .unwrap_err();
        assert!(e.to_string().contains("cannot read CA file"), "{e}");
    }

    #[test]
    fn a_ca_certificate_in_pem_is_added() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let pem = params.self_signed(&key).unwrap().pem();
        let trust = HttpsTrust::added_only()
            .with_pem(format!("{pem}{pem}").as_bytes(), "two.pem")
            .unwrap();
        assert_eq!(trust.added(), 2);
        assert_eq!(trust.client_config().alpn_protocols, [b"http/1.1".to_vec()]);
    }

    #[test]
    fn a_garbled_certificate_is_not_a_trust_anchor() {
        let pem = b"-----BEGIN CERTIFICATE-----\nAAECAwQF\n-----END CERTIFICATE-----\n";
        let e = HttpsTrust::default().with_pem(pem, "bad.pem").unwrap_err();
        assert!(
            e.to_string().contains("not usable as a trust anchor"),
            "{e}"
        );
    }

    #[test]
    fn certificate_failures_say_how_to_trust_the_ca() {
        let e = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let text = tls_failure("h.example", 8443, &e);
        assert!(text.contains("h.example:8443"), "{text}");
        assert!(text.contains("UnknownIssuer"), "{text}");
        assert!(text.contains("--http-ca"), "{text}");
        let expired = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::Expired),
        );
        assert!(!tls_failure("h", 443, &expired).contains("--http-ca"));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(tls_failure("h", 443, &reset).contains("during the handshake"));
    }
}

//! A throwaway PKI: a CA and EC P-256 certificates it signed for a server and a
//! client, made in memory at run time with OpenSSL, as PEM; and the same written to
//! files for peers that read them ([`PkiFiles`]).

use crate::temp::TempDir;
use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::error::ErrorStack;
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::{
    BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
};
use openssl::x509::{X509NameBuilder, X509};
use std::path::Path;

/// A certificate the CA issued and its private key.
#[derive(Debug, Clone, Default)]
pub struct Issued {
    /// The certificate (PEM).
    pub cert_pem: Vec<u8>,
    /// Its private key (PKCS#8 PEM).
    pub key_pem: Vec<u8>,
}

/// A CA and the certificates it issued.
#[derive(Debug, Clone)]
pub struct TestPki {
    /// The CA certificate (PEM).
    pub ca_pem: Vec<u8>,
    /// A certificate for `localhost`, 127.0.0.1 and ::1, for a server.
    pub server: Issued,
    /// A certificate for a client.
    pub client: Issued,
}

/// Validity of the certificates: from `.0` to `.1` days from now.
type Days = (i64, i64);

fn ec_key() -> Result<PKey<Private>, ErrorStack> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
    PKey::from_ec_key(EcKey::generate(&group)?)
}

fn certificate(
    cn: &str,
    key: &PKey<Private>,
    issuer: Option<(&X509, &PKey<Private>)>,
    valid: Days,
) -> Result<X509, ErrorStack> {
    let mut name = X509NameBuilder::new()?;
    name.append_entry_by_text("CN", cn)?;
    let name = name.build();
    let mut b = X509::builder()?;
    b.set_version(2)?;
    let mut serial = BigNum::new()?;
    serial.rand(64, MsbOption::MAYBE_ZERO, false)?;
    let serial = serial.to_asn1_integer()?;
    b.set_serial_number(&serial)?;
    b.set_subject_name(&name)?;
    b.set_issuer_name(issuer.map_or(&name, |(c, _)| c.subject_name()))?;
    b.set_pubkey(key)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let day = 24 * 3600;
    let (from, until) = (
        Asn1Time::from_unix(now + valid.0 * day)?,
        Asn1Time::from_unix(now + valid.1 * day)?,
    );
    b.set_not_before(&from)?;
    b.set_not_after(&until)?;
    match issuer {
        None => {
            b.append_extension(BasicConstraints::new().critical().ca().build()?)?;
            b.append_extension(KeyUsage::new().key_cert_sign().crl_sign().build()?)?;
        }
        Some((ca, _)) => {
            let san = SubjectAlternativeName::new()
                .dns("localhost")
                .ip("127.0.0.1")
                .ip("::1")
                .build(&b.x509v3_context(Some(ca), None))?;
            b.append_extension(san)?;
            let usage = ExtendedKeyUsage::new()
                .server_auth()
                .client_auth()
                .build()?;
            b.append_extension(usage)?;
        }
    }
    b.sign(issuer.map_or(key, |(_, k)| k), MessageDigest::sha256())?;
    Ok(b.build())
}

impl TestPki {
    /// Makes a fresh CA (`cn` names it) with one server and one client certificate,
    /// valid from a day ago for 30 days: backdated, as CAs do, so that a verifier whose
    /// clock is a moment behind the generator's (a stepped clock, a second boundary)
    /// does not find them "not yet valid".
    pub fn generate(cn: &str) -> Result<TestPki, ErrorStack> {
        TestPki::valid(cn, (-1, 30))
    }

    /// Like [`TestPki::generate`], but the server and client certificates expired
    /// yesterday.
    pub fn generate_expired(cn: &str) -> Result<TestPki, ErrorStack> {
        TestPki::valid(cn, (-30, -1))
    }

    fn valid(cn: &str, valid: Days) -> Result<TestPki, ErrorStack> {
        let ca_key = ec_key()?;
        let ca = certificate(cn, &ca_key, None, (-1, 30))?;
        let issue = |who: &str| -> Result<Issued, ErrorStack> {
            let key = ec_key()?;
            let cert = certificate(&format!("{cn} {who}"), &key, Some((&ca, &ca_key)), valid)?;
            Ok(Issued {
                cert_pem: cert.to_pem()?,
                key_pem: key.private_key_to_pem_pkcs8()?,
            })
        };
        Ok(TestPki {
            ca_pem: ca.to_pem()?,
            server: issue("server")?,
            client: issue("client")?,
        })
    }

    /// Writes ca.pem, server.pem, server.key, client.pem and client.key to `dir`.
    pub fn write_to(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        for (name, pem) in [
            ("ca.pem", &self.ca_pem),
            ("server.pem", &self.server.cert_pem),
            ("server.key", &self.server.key_pem),
            ("client.pem", &self.client.cert_pem),
            ("client.key", &self.client.key_pem),
        ] {
            std::fs::write(dir.join(name), pem)?;
        }
        Ok(())
    }
}

/// A fresh [`TestPki`] written to a temporary directory (removed on drop), for peers
/// that read PEM files.
#[derive(Debug)]
pub struct PkiFiles {
    /// The certificates and keys.
    pub pki: TestPki,
    dir: TempDir,
}

impl PkiFiles {
    /// Generates the PKI (the CA named `cn`) and writes it (see [`TestPki::write_to`]).
    pub fn new(cn: &str) -> PkiFiles {
        let pki = TestPki::generate(cn).expect("generate a test PKI");
        let dir = TempDir::new("pki");
        pki.write_to(dir.path()).expect("write the test PKI");
        PkiFiles { pki, dir }
    }

    /// The path of one of the files (`ca.pem`, `server.key`, ...), as a string.
    pub fn path(&self, name: &str) -> String {
        self.dir.file(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openssl::stack::Stack;
    use openssl::x509::store::X509StoreBuilder;
    use openssl::x509::X509StoreContext;

    /// Whether `cert_pem` verifies against `ca_pem` now.
    fn verifies(ca_pem: &[u8], cert_pem: &[u8]) -> bool {
        let mut store = X509StoreBuilder::new().unwrap();
        store.add_cert(X509::from_pem(ca_pem).unwrap()).unwrap();
        let store = store.build();
        let cert = X509::from_pem(cert_pem).unwrap();
        let mut ctx = X509StoreContext::new().unwrap();
        ctx.init(&store, &cert, &Stack::new().unwrap(), |c| c.verify_cert())
            .unwrap()
    }

    #[test]
    fn certificates_verify_against_their_own_ca_only() {
        let pki = TestPki::generate("one").unwrap();
        let other = TestPki::generate("two").unwrap();
        assert!(verifies(&pki.ca_pem, &pki.server.cert_pem));
        assert!(verifies(&pki.ca_pem, &pki.client.cert_pem));
        assert!(!verifies(&other.ca_pem, &pki.server.cert_pem));
        let expired = TestPki::generate_expired("old").unwrap();
        assert!(!verifies(&expired.ca_pem, &expired.server.cert_pem));
        let key = PKey::private_key_from_pem(&pki.server.key_pem).unwrap();
        let cert = X509::from_pem(&pki.server.cert_pem).unwrap();
        assert!(cert.public_key().unwrap().public_eq(&key));
    }

    #[test]
    fn files_are_written_and_removed_with_their_directory() {
        let files = PkiFiles::new("files");
        let ca = std::fs::read(files.path("ca.pem")).unwrap();
        assert_eq!(ca, files.pki.ca_pem);
        let key = std::fs::read(files.path("client.key")).unwrap();
        assert_eq!(key, files.pki.client.key_pem);
        let dir = Path::new(&files.path("ca.pem"))
            .parent()
            .unwrap()
            .to_path_buf();
        drop(files);
        assert!(!dir.exists());
    }
}

//! Credentials for the secure schemes, shared by DTLS (`coaps`) and TLS (`coaps+tcp`,
//! `coaps+ws`): pre-shared keys ([`PskStore`] on a server, [`ClientPsk`] on a client)
//! and X.509 certificates ([`X509Credentials`]); [`ClientCredentials`] is what a client
//! authenticates with.
//!
//! # PSK key files
//!
//! [`PskStore::parse`] and [`PskStore::load`] read one `identity:key` per line:
//!
//! ```text
//! # comments and blank lines are ignored
//! sensor-17:0x000102030405060708090a0b0c0d0e0f   # 0x then hex digits: raw key bytes
//! Client_identity:secretPSK                      # anything else: the text's bytes
//! ```
//!
//! The identity ends at the first `:` (so it cannot contain one) and leading/trailing
//! spaces around both parts are trimmed; a `#` after whitespace starts a comment.
//! Identities are at most 128 bytes, keys 1 to 64 bytes.

use crate::error::CredentialsError;
use std::collections::HashMap;
use std::path::Path;

#[cfg(feature = "openssl")]
mod context;
#[cfg(all(test, feature = "openssl"))]
pub(crate) mod test_credentials;
#[cfg(feature = "openssl")]
pub use self::context::check_certificate;
#[cfg(feature = "openssl")]
pub(crate) use self::context::{expect_peer_name, load_x509, set_psk_client, set_psk_server};

/// Longest PSK identity accepted.
pub const MAX_IDENTITY: usize = 128;
/// Longest PSK accepted.
pub const MAX_KEY: usize = 64;

/// Pre-shared keys of a server, by identity.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PskStore {
    keys: HashMap<Vec<u8>, Vec<u8>>,
}

impl std::fmt::Debug for PskStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PskStore")
            .field("identities", &self.keys.len())
            .finish()
    }
}

impl PskStore {
    /// An empty store.
    pub fn new() -> PskStore {
        PskStore::default()
    }

    /// Adds (or replaces) the key of `identity`.
    pub fn insert(&mut self, identity: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) {
        self.keys.insert(identity.into(), key.into());
    }

    /// Adds a key, builder style.
    pub fn with(mut self, identity: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> PskStore {
        self.insert(identity, key);
        self
    }

    /// The key of `identity`.
    pub fn get(&self, identity: &[u8]) -> Option<&[u8]> {
        self.keys.get(identity).map(Vec::as_slice)
    }

    /// Number of identities.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the store has no identity.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Parses `identity:key` lines (see the [module docs](self) for the format); a
    /// malformed line is [`CredentialsError::PskLine`] with its number.
    pub fn parse(text: &str) -> Result<PskStore, CredentialsError> {
        let mut store = PskStore::new();
        for (n, raw) in text.lines().enumerate() {
            let bad = |reason: String| CredentialsError::PskLine {
                path: None,
                line: n + 1,
                reason,
            };
            let line = strip_comment(raw).trim();
            if line.is_empty() {
                continue;
            }
            let (identity, key) = line
                .split_once(':')
                .ok_or_else(|| bad("expected identity:key".into()))?;
            let (identity, key) = (identity.trim(), key.trim());
            let key = parse_key(key).map_err(bad)?;
            if identity.is_empty() || identity.len() > MAX_IDENTITY {
                return Err(bad(format!(
                    "the identity must be 1 to {MAX_IDENTITY} bytes"
                )));
            }
            store.insert(identity.as_bytes(), key);
        }
        Ok(store)
    }

    /// Reads a key file (see [`PskStore::parse`]): [`CredentialsError::Read`] when it
    /// cannot be read, [`CredentialsError::PskLine`] (naming the file) for a bad line.
    pub fn load(path: impl AsRef<Path>) -> Result<PskStore, CredentialsError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| CredentialsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        PskStore::parse(&text).map_err(|e| match e {
            CredentialsError::PskLine { line, reason, .. } => CredentialsError::PskLine {
                path: Some(path.to_path_buf()),
                line,
                reason,
            },
            other => other,
        })
    }
}

fn strip_comment(line: &str) -> &str {
    if line.trim_start().starts_with('#') {
        return "";
    }
    match line.find(" #").or_else(|| line.find("\t#")) {
        Some(i) => &line[..i],
        None => line,
    }
}

/// A key as written in a key file or on the command line: `0x` and hex digits for
/// raw bytes, otherwise the text's bytes.
pub fn parse_key(key: &str) -> Result<Vec<u8>, String> {
    let bytes = match key.strip_prefix("0x").or_else(|| key.strip_prefix("0X")) {
        Some(hex) => decode_hex(hex)?,
        None => key.as_bytes().to_vec(),
    };
    if bytes.is_empty() || bytes.len() > MAX_KEY {
        return Err(format!("the key must be 1 to {MAX_KEY} bytes"));
    }
    Ok(bytes)
}

fn decode_hex(hex: &str) -> Result<Vec<u8>, String> {
    if !hex.len().is_multiple_of(2) {
        return Err("odd number of hex digits in the key".into());
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(|| format!("'{hex}' is not hexadecimal"))
        })
        .collect()
}

/// A client's pre-shared key.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ClientPsk {
    /// The identity sent to the server.
    pub identity: Vec<u8>,
    /// The key.
    pub key: Vec<u8>,
}

impl std::fmt::Debug for ClientPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientPsk")
            .field("identity", &String::from_utf8_lossy(&self.identity))
            .field("key", &"<redacted>")
            .finish()
    }
}

impl ClientPsk {
    /// A PSK from an identity and key bytes.
    pub fn new(identity: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> ClientPsk {
        ClientPsk {
            identity: identity.into(),
            key: key.into(),
        }
    }
}

/// X.509 credentials in PEM: this side's certificate (chain) and key, and the CA
/// certificates the peer's certificate must chain to.
///
/// A server with `ca_pem` requires a client certificate; a client verifies the
/// server's certificate against `ca_pem` and checks that it names `server_name` (or,
/// without one, the server's IP address).
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct X509Credentials {
    /// This side's certificate, then any intermediates (PEM). Optional for a client.
    pub cert_chain_pem: Vec<u8>,
    /// The private key of the certificate (PEM; EC P-256 for the ECDHE-ECDSA suites).
    pub key_pem: Vec<u8>,
    /// Trusted CA certificates for the peer's certificate (PEM).
    pub ca_pem: Option<Vec<u8>>,
    /// The name the server's certificate must carry (client side); without it the
    /// server's IP address must be in its subjectAltName.
    pub server_name: Option<String>,
}

impl std::fmt::Debug for X509Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("X509Credentials")
            .field("cert_chain_pem", &self.cert_chain_pem.len())
            .field("key_pem", &"<redacted>")
            .field("ca", &self.ca_pem.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// How a client authenticates a DTLS or TLS session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClientCredentials {
    /// A pre-shared key.
    Psk(ClientPsk),
    /// Certificates.
    X509(X509Credentials),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_file_format() {
        let store =
            PskStore::parse("# keys\n\nalice:secretPSK\n  bob : 0x00ff10  # hex\nc3:0Xab\n")
                .unwrap();
        assert_eq!(store.len(), 3);
        assert_eq!(store.get(b"alice"), Some(&b"secretPSK"[..]));
        assert_eq!(store.get(b"bob"), Some(&[0, 255, 16][..]));
        assert_eq!(store.get(b"c3"), Some(&[0xab][..]));
        for (text, line) in [
            ("nocolon", 1),
            ("a:b\na:0x123", 2),
            ("a:0xzz", 1),
            (":key", 1),
        ] {
            match PskStore::parse(text) {
                Err(CredentialsError::PskLine {
                    path: None,
                    line: l,
                    ..
                }) => assert_eq!(l, line),
                other => panic!("{text:?}: {other:?}"),
            }
        }
        assert!(PskStore::parse("a:").is_err());
    }

    #[test]
    fn key_file_errors_name_the_file() {
        let dir = std::env::temp_dir().join(format!("cobalt-psk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("keys.txt");
        std::fs::write(&file, "alice:secretPSK\nbob\n").unwrap();
        let err = PskStore::load(&file).unwrap_err();
        assert!(
            matches!(&err, CredentialsError::PskLine { path: Some(p), line: 2, .. } if p == &file),
            "{err:?}"
        );
        assert!(err.to_string().contains("keys.txt: line 2"), "{err}");
        let missing = dir.join("missing.txt");
        let err = PskStore::load(&missing).unwrap_err();
        assert!(
            matches!(&err, CredentialsError::Read { path, .. } if path == &missing),
            "{err:?}"
        );
        let err: crate::Error = err.into();
        assert!(err.to_string().contains("missing.txt"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

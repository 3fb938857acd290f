//! The credential flags (`--psk-identity`, `--psk-key`, `--ca`, `--cert`, `--key`, ...)
//! for DTLS and TLS, shared by the request commands (`cobalt get coaps://...`) and
//! `cobalt bench coaps://...`.

use clap::Args;
use cobalt::transport::credentials::{parse_key, ClientCredentials, ClientPsk, X509Credentials};
use std::path::{Path, PathBuf};

/// How a client authenticates to a `coaps://` (DTLS), `coaps+tcp://` or `coaps+ws://`
/// (TLS) server.
#[derive(Debug, Default, Args)]
pub struct DtlsArgs {
    /// PSK identity for coaps:// (DTLS 1.2), coaps+tcp:// and coaps+ws:// (TLS).
    #[arg(long, value_name = "ID", requires = "psk_key")]
    pub psk_identity: Option<String>,
    /// Pre-shared key for coaps://, coaps+tcp://, coaps+ws://: `0x` and hex digits, or text.
    #[arg(long, value_name = "KEY", requires = "psk_identity")]
    pub psk_key: Option<String>,
    /// CA certificate(s) (PEM) the server's certificate must chain to; uses
    /// certificates instead of a PSK. Without it, coaps+tcp:// and coaps+ws:// trust
    /// the system's CAs (coaps:// needs it or a PSK).
    #[arg(
        long = "ca",
        visible_alias = "dtls-ca",
        value_name = "FILE",
        conflicts_with = "psk_identity"
    )]
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM, with any intermediates), with --key.
    #[arg(
        long = "cert",
        visible_alias = "dtls-cert",
        value_name = "FILE",
        requires = "key",
        conflicts_with = "psk_identity"
    )]
    pub cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(
        long = "key",
        visible_alias = "dtls-key",
        value_name = "FILE",
        requires = "cert"
    )]
    pub key: Option<PathBuf>,
    /// Name the server's certificate must carry (default: the URI's host for TLS, the
    /// server's IP address for DTLS).
    #[arg(long, value_name = "NAME")]
    pub server_name: Option<String>,
}

impl DtlsArgs {
    /// True when any credential flag was given.
    pub fn given(&self) -> bool {
        self.psk_identity.is_some()
            || self.psk_key.is_some()
            || self.ca.is_some()
            || self.cert.is_some()
            || self.server_name.is_some()
    }

    /// The credentials the flags name (reading the PEM files), or `None` without any;
    /// the error is a one-line message naming the flag.
    pub fn client_auth(&self) -> Result<Option<ClientCredentials>, String> {
        if let (Some(id), Some(key)) = (&self.psk_identity, &self.psk_key) {
            let key = parse_key(key).map_err(|e| format!("--psk-key: {e}"))?;
            return Ok(Some(ClientCredentials::Psk(ClientPsk::new(
                id.as_bytes(),
                key,
            ))));
        }
        if !self.given() {
            return Ok(None);
        }
        let read =
            |p: &Path| std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()));
        let read_opt = |p: &Option<PathBuf>| p.as_deref().map(read).transpose();
        Ok(Some(ClientCredentials::X509(X509Credentials {
            cert_chain_pem: read_opt(&self.cert)?.unwrap_or_default(),
            key_pem: read_opt(&self.key)?.unwrap_or_default(),
            ca_pem: read_opt(&self.ca)?,
            server_name: self.server_name.clone(),
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psk_in_hex_or_text() {
        let a = DtlsArgs {
            psk_identity: Some("alice".into()),
            psk_key: Some("0x0102".into()),
            ..DtlsArgs::default()
        };
        assert!(a.given());
        assert_eq!(
            a.client_auth().unwrap(),
            Some(ClientCredentials::Psk(ClientPsk::new("alice", vec![1, 2])))
        );
        let bad = DtlsArgs {
            psk_key: Some("0xzz".into()),
            ..a
        };
        assert!(bad.client_auth().unwrap_err().starts_with("--psk-key:"));
        assert_eq!(DtlsArgs::default().client_auth().unwrap(), None);
        assert!(!DtlsArgs::default().given());
    }

    #[test]
    fn a_missing_ca_file_names_it() {
        let a = DtlsArgs {
            ca: Some("/nonexistent/ca.pem".into()),
            ..DtlsArgs::default()
        };
        let e = a.client_auth().unwrap_err();
        assert!(e.contains("cannot read /nonexistent/ca.pem"), "{e}");
    }
}

//! The DTLS credential flags (`--psk-identity`, `--psk-key`, `--dtls-ca`, ...) shared by
//! the request commands (`cobalt get coaps://...`) and `cobalt bench coaps://...`.

use clap::Args;
use cobalt::transport::dtls::{parse_key, ClientPsk, DtlsClientAuth, X509Credentials};
use std::path::{Path, PathBuf};

/// How a client authenticates to a `coaps://` server.
#[derive(Debug, Default, Args)]
pub struct DtlsArgs {
    /// PSK identity for coaps:// (DTLS 1.2).
    #[arg(long, value_name = "ID", requires = "psk_key")]
    pub psk_identity: Option<String>,
    /// Pre-shared key for coaps://: `0x` and hex digits, or text.
    #[arg(long, value_name = "KEY", requires = "psk_identity")]
    pub psk_key: Option<String>,
    /// CA certificate(s) (PEM) the coaps:// server's certificate must chain to; uses
    /// certificates (ECDHE-ECDSA) instead of a PSK.
    #[arg(long, value_name = "FILE", conflicts_with = "psk_identity")]
    pub dtls_ca: Option<PathBuf>,
    /// Client certificate (PEM, with any intermediates) for coaps://, with --dtls-ca.
    #[arg(long, value_name = "FILE", requires_all = ["dtls_ca", "dtls_key"])]
    pub dtls_cert: Option<PathBuf>,
    /// Private key (PEM) of --dtls-cert.
    #[arg(long, value_name = "FILE", requires = "dtls_cert")]
    pub dtls_key: Option<PathBuf>,
    /// Name the server's certificate must carry (default: the server's IP address).
    #[arg(long, value_name = "NAME", requires = "dtls_ca")]
    pub server_name: Option<String>,
}

impl DtlsArgs {
    /// True when any credential flag was given.
    pub fn given(&self) -> bool {
        self.psk_identity.is_some() || self.psk_key.is_some() || self.dtls_ca.is_some()
    }

    /// The credentials the flags name (reading the PEM files), or `None` without any;
    /// the error is a one-line message naming the flag.
    pub fn client_auth(&self) -> Result<Option<DtlsClientAuth>, String> {
        if let (Some(id), Some(key)) = (&self.psk_identity, &self.psk_key) {
            let key = parse_key(key).map_err(|e| format!("--psk-key: {e}"))?;
            return Ok(Some(DtlsClientAuth::Psk(ClientPsk::new(
                id.as_bytes(),
                key,
            ))));
        }
        let Some(ca) = &self.dtls_ca else {
            return Ok(None);
        };
        let read =
            |p: &Path| std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()));
        Ok(Some(DtlsClientAuth::X509(X509Credentials {
            cert_chain_pem: self
                .dtls_cert
                .as_deref()
                .map(read)
                .transpose()?
                .unwrap_or_default(),
            key_pem: self
                .dtls_key
                .as_deref()
                .map(read)
                .transpose()?
                .unwrap_or_default(),
            ca_pem: Some(read(ca)?),
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
            Some(DtlsClientAuth::Psk(ClientPsk::new("alice", vec![1, 2])))
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
            dtls_ca: Some("/nonexistent/ca.pem".into()),
            ..DtlsArgs::default()
        };
        let e = a.client_auth().unwrap_err();
        assert!(e.contains("cannot read /nonexistent/ca.pem"), "{e}");
    }
}

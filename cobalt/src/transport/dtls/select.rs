//! Making a server's DTLS table on the Mbed TLS backend, or saying why this build
//! cannot.

use super::{CidConfig, DtlsBackend, DtlsConfig};
use crate::error::Unsupported;
use crate::transport::credentials::{ClientCredentials, PskStore, X509Credentials};
use crate::{Error, Result};
use std::sync::Arc;

/// A server table on Mbed TLS with `keys` and/or `x509` (with its CA, client
/// certificates are required), granting `cid`.
#[cfg(feature = "mbedtls")]
pub(crate) fn mbedtls_server(
    keys: Option<Arc<PskStore>>,
    x509: Option<&X509Credentials>,
    cid: Option<CidConfig>,
    config: DtlsConfig,
) -> Result<Box<dyn DtlsBackend>> {
    let table = super::MbedtlsDtls::server_with(keys, x509, cid, config)
        .map_err(|e| Error::Unsupported(Unsupported::Argument(e.to_string())))?;
    Ok(Box::new(table))
}

/// This build has no Mbed TLS backend.
#[cfg(not(feature = "mbedtls"))]
pub(crate) fn mbedtls_server(
    _keys: Option<Arc<PskStore>>,
    _x509: Option<&X509Credentials>,
    _cid: Option<CidConfig>,
    _config: DtlsConfig,
) -> Result<Box<dyn DtlsBackend>> {
    Err(Error::Unsupported(Unsupported::Feature {
        scheme: cobalt_proto::uri::Scheme::Coaps,
        needs: "the `mbedtls` feature (the DTLS backend with the Connection ID)",
    }))
}

/// A client table on Mbed TLS that asks servers for a Connection ID, authenticating
/// with `auth` (a pre-shared key, or a certificate with the CA of the server's).
#[cfg(feature = "mbedtls")]
pub(crate) fn mbedtls_client(
    auth: &ClientCredentials,
    config: DtlsConfig,
) -> Result<Box<dyn DtlsBackend>> {
    let table = super::MbedtlsDtls::client_with(auth, true, config)
        .map_err(|e| Error::Unsupported(Unsupported::Argument(e.to_string())))?;
    Ok(Box::new(table))
}

/// This build has no Mbed TLS backend.
#[cfg(not(feature = "mbedtls"))]
pub(crate) fn mbedtls_client(
    _auth: &ClientCredentials,
    _config: DtlsConfig,
) -> Result<Box<dyn DtlsBackend>> {
    Err(Error::Unsupported(Unsupported::Feature {
        scheme: cobalt_proto::uri::Scheme::Coaps,
        needs: "the `mbedtls` feature (the DTLS backend with the Connection ID)",
    }))
}

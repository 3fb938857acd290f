//! Fatal alerts a server sends unprotected (epoch 0), where the peer has no keys
//! with it yet, so that a handshake that cannot succeed fails at once on the peer's
//! side instead of at its timeout. Shared by both backends.

/// `handshake_failure`: no acceptable set of security parameters (here also: no
/// client certificate where one is required). Only the Mbed TLS backend sends it.
#[cfg(feature = "mbedtls")]
pub(crate) const HANDSHAKE_FAILURE: u8 = 40;
/// `decrypt_error`: the peer's Finished did not decrypt or verify.
pub(crate) const DECRYPT_ERROR: u8 = 51;
/// The alert a server refusing a new session sends (no alert says "full").
pub(crate) const INTERNAL_ERROR: u8 = 80;

/// A fatal alert in epoch 0 (unprotected, as before ChangeCipherSpec). The sequence
/// number is far above any the handshake used so the peer's replay window takes it.
pub(crate) fn plaintext_alert(description: u8) -> Vec<u8> {
    let mut r = vec![21, 0xfe, 0xfd, 0, 0];
    r.extend_from_slice(&[0x00, 0x00, 0xff, 0xff, 0xff, 0xff]); // sequence number
    r.extend_from_slice(&[0, 2, 2, description]); // length, level fatal, description
    r
}

//! The crypto backend lakers runs on: its RustCrypto backend with the operating
//! system's random numbers, made safe for hostile input. That backend panics on a
//! public key that is not a point of P-256 (lakers issue 93) and on a ciphertext
//! shorter than its tag; both come straight from the peer (G_X in message_1, G_Y in
//! message_2, CIPHERTEXT_3 and CIPHERTEXT_4). Here such a key gives a random shared
//! secret, so the exchange fails where the peer's MAC is checked, and such a
//! ciphertext fails to decrypt.

use lakers::{
    BufferCiphertext3, BufferPlaintext3, BytesCcmIvLen, BytesCcmKeyLen, BytesHashLen,
    BytesMaxBuffer, BytesMaxInfoBuffer, BytesP256ElemLen, CryptoTrait, EDHOCError, AES_CCM_TAG_LEN,
};
use rand_core::RngCore;

type RustCrypto = lakers_crypto_rustcrypto::Crypto<rand_core::OsRng>;

/// lakers' RustCrypto backend that refuses what would make it panic.
#[derive(Debug)]
pub(crate) struct Backend(RustCrypto);

impl Backend {
    pub(crate) fn new() -> Backend {
        Backend(RustCrypto::new(rand_core::OsRng))
    }
}

/// Whether `x` is the x coordinate of a point of P-256.
pub(crate) fn is_p256_point(x: &[u8; 32]) -> bool {
    use p256::elliptic_curve::point::DecompressPoint;
    bool::from(p256::AffinePoint::decompress(x.into(), 1.into()).is_some())
}

impl CryptoTrait for Backend {
    fn sha256_digest(&mut self, message: &BytesMaxBuffer, message_len: usize) -> BytesHashLen {
        self.0.sha256_digest(message, message_len)
    }

    fn hkdf_expand(
        &mut self,
        prk: &BytesHashLen,
        info: &BytesMaxInfoBuffer,
        info_len: usize,
        length: usize,
    ) -> BytesMaxBuffer {
        self.0.hkdf_expand(prk, info, info_len, length)
    }

    fn hkdf_extract(&mut self, salt: &BytesHashLen, ikm: &BytesP256ElemLen) -> BytesHashLen {
        self.0.hkdf_extract(salt, ikm)
    }

    fn aes_ccm_encrypt_tag_8(
        &mut self,
        key: &BytesCcmKeyLen,
        iv: &BytesCcmIvLen,
        ad: &[u8],
        plaintext: &BufferPlaintext3,
    ) -> BufferCiphertext3 {
        self.0.aes_ccm_encrypt_tag_8(key, iv, ad, plaintext)
    }

    fn aes_ccm_decrypt_tag_8(
        &mut self,
        key: &BytesCcmKeyLen,
        iv: &BytesCcmIvLen,
        ad: &[u8],
        ciphertext: &BufferCiphertext3,
    ) -> Result<BufferPlaintext3, EDHOCError> {
        if ciphertext.len < AES_CCM_TAG_LEN {
            return Err(EDHOCError::MacVerificationFailed);
        }
        self.0.aes_ccm_decrypt_tag_8(key, iv, ad, ciphertext)
    }

    fn p256_ecdh(
        &mut self,
        private_key: &BytesP256ElemLen,
        public_key: &BytesP256ElemLen,
    ) -> BytesP256ElemLen {
        if !is_p256_point(public_key) {
            let mut unknowable = [0; 32];
            rand_core::OsRng.fill_bytes(&mut unknowable);
            return unknowable;
        }
        self.0.p256_ecdh(private_key, public_key)
    }

    fn get_random_byte(&mut self) -> u8 {
        self.0.get_random_byte()
    }

    fn p256_generate_key_pair(&mut self) -> (BytesP256ElemLen, BytesP256ElemLen) {
        self.0.p256_generate_key_pair()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_point_or_a_short_ciphertext_fails_without_a_panic() {
        let mut backend = Backend::new();
        let (private, public) = backend.p256_generate_key_pair();
        assert!(is_p256_point(&public));
        // About half of all x coordinates are on the curve; find one that is not.
        let off_curve = (0u8..=255)
            .map(|n| {
                let mut x = [0u8; 32];
                x[31] = n;
                x
            })
            .find(|x| !is_p256_point(x))
            .expect("some small x is off the curve");
        let a = backend.p256_ecdh(&private, &off_curve);
        let b = backend.p256_ecdh(&private, &off_curve);
        assert_ne!(a, b, "a random secret each time");
        let short = BufferCiphertext3::new_from_slice(&[1, 2, 3]).unwrap();
        assert_eq!(
            backend.aes_ccm_decrypt_tag_8(&[0; 16], &[0; 13], &[], &short),
            Err(EDHOCError::MacVerificationFailed)
        );
    }
}

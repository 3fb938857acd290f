//! A security context's static part (RFC 8613 §3): the input material, the keys and
//! Common IV derived from it with HKDF-SHA256, and the cryptographic operations that
//! use them (nonce construction, the AAD of §5.4, AES-CCM-16-64-128).

use crate::cbor;
use aes::Aes128;
use ccm::aead::{Aead, KeyInit, Payload};
use ccm::consts::{U13, U8};
use ccm::Ccm;
use hkdf::Hkdf;
use sha2::Sha256;

/// The COSE algorithm number of AES-CCM-16-64-128, the only AEAD algorithm supported
/// (RFC 8613 §3.2.1 makes it the mandatory one).
pub const AES_CCM_16_64_128: i64 = 10;
/// Key length of AES-CCM-16-64-128.
pub const KEY_LEN: usize = 16;
/// Nonce length of AES-CCM-16-64-128.
pub const NONCE_LEN: usize = 13;
/// Authentication tag length of AES-CCM-16-64-128.
pub const TAG_LEN: usize = 8;
/// The longest Sender or Recipient ID this algorithm allows (nonce length − 6).
pub const MAX_ID_LEN: usize = NONCE_LEN - 6;
/// The longest Partial IV (five bytes: sequence numbers below 2^40).
pub const MAX_PIV_LEN: usize = 5;
/// The first sequence number that cannot be used (RFC 8613 §7.2.1).
pub const SEQUENCE_LIMIT: u64 = 1 << 40;

type AesCcm = Ccm<Aes128, U8, U13>;

/// What two endpoints share to talk OSCORE (RFC 8613 §3.2), from one endpoint's side.
#[derive(Clone, PartialEq, Eq)]
pub struct Material {
    /// The Master Secret.
    pub master_secret: Vec<u8>,
    /// The Master Salt (empty when none).
    pub master_salt: Vec<u8>,
    /// This endpoint's Sender ID.
    pub sender_id: Vec<u8>,
    /// The peer's Sender ID, this endpoint's Recipient ID.
    pub recipient_id: Vec<u8>,
    /// The ID Context, if any.
    pub id_context: Option<Vec<u8>>,
    /// Size of the replay window in sequence numbers (RFC 8613 §3.2.2; 32 by default).
    pub replay_window: u32,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Material")
            .field("sender_id", &hex(&self.sender_id))
            .field("recipient_id", &hex(&self.recipient_id))
            .field("id_context", &self.id_context.as_deref().map(hex))
            .finish_non_exhaustive()
    }
}

/// Lower-case hex of `bytes` (for names and messages).
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of lower-case or upper-case hex `s`; `None` if it is not hex.
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// Why material cannot make a security context.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaterialError {
    /// An ID is longer than the nonce allows.
    #[error("the {which} ID is {len} bytes; AES-CCM-16-64-128 allows at most {MAX_ID_LEN}")]
    IdTooLong {
        /// "Sender" or "Recipient".
        which: &'static str,
        /// Its length.
        len: usize,
    },
    /// Sender and Recipient ID are the same.
    #[error("the Sender and Recipient ID are the same; each side needs its own")]
    SameIds,
    /// The master secret is empty.
    #[error("the master secret is empty")]
    EmptySecret,
    /// The replay window is 0 or too large.
    #[error("a replay window of {0} is not supported; use 1 to 64")]
    Window(u32),
}

impl Material {
    /// Material with no salt, no ID context and the default replay window (32).
    pub fn new(master_secret: &[u8], sender_id: &[u8], recipient_id: &[u8]) -> Material {
        Material {
            master_secret: master_secret.to_vec(),
            master_salt: Vec::new(),
            sender_id: sender_id.to_vec(),
            recipient_id: recipient_id.to_vec(),
            id_context: None,
            replay_window: 32,
        }
    }

    /// This material with a Master Salt.
    pub fn with_salt(mut self, salt: &[u8]) -> Material {
        self.master_salt = salt.to_vec();
        self
    }

    /// This material with an ID Context.
    pub fn with_id_context(mut self, id_context: &[u8]) -> Material {
        self.id_context = Some(id_context.to_vec());
        self
    }

    /// The peer's side of the same context: Sender and Recipient ID swapped.
    pub fn reversed(&self) -> Material {
        Material {
            sender_id: self.recipient_id.clone(),
            recipient_id: self.sender_id.clone(),
            ..self.clone()
        }
    }

    /// Checks the material and derives the keys from it.
    pub fn derive(&self) -> Result<Keys, MaterialError> {
        for (which, id) in [
            ("Sender", &self.sender_id),
            ("Recipient", &self.recipient_id),
        ] {
            if id.len() > MAX_ID_LEN {
                return Err(MaterialError::IdTooLong {
                    which,
                    len: id.len(),
                });
            }
        }
        if self.sender_id == self.recipient_id {
            return Err(MaterialError::SameIds);
        }
        if self.master_secret.is_empty() {
            return Err(MaterialError::EmptySecret);
        }
        if !(1..=64).contains(&self.replay_window) {
            return Err(MaterialError::Window(self.replay_window));
        }
        let hkdf = Hkdf::<Sha256>::new(Some(&self.master_salt), &self.master_secret);
        let expand = |id: &[u8], kind: &str, out: &mut [u8]| {
            let mut info = Vec::with_capacity(32);
            cbor::array(&mut info, 5);
            cbor::bytes(&mut info, id);
            match &self.id_context {
                Some(c) => cbor::bytes(&mut info, c),
                None => cbor::null(&mut info),
            }
            cbor::int(&mut info, AES_CCM_16_64_128);
            cbor::text(&mut info, kind);
            cbor::int(&mut info, out.len() as i64);
            hkdf.expand(&info, out)
                .expect("key and IV lengths are far below HKDF-SHA256's limit");
        };
        let mut keys = Keys {
            sender_key: [0; KEY_LEN],
            recipient_key: [0; KEY_LEN],
            common_iv: [0; NONCE_LEN],
        };
        expand(&self.sender_id, "Key", &mut keys.sender_key);
        expand(&self.recipient_id, "Key", &mut keys.recipient_key);
        expand(&[], "IV", &mut keys.common_iv);
        Ok(keys)
    }
}

/// The keys and Common IV derived from [`Material`] (RFC 8613 §3.2.1).
#[derive(Clone, PartialEq, Eq)]
pub struct Keys {
    /// Encrypts what this endpoint sends.
    pub sender_key: [u8; KEY_LEN],
    /// Decrypts what the peer sends.
    pub recipient_key: [u8; KEY_LEN],
    /// Mixed into every nonce.
    pub common_iv: [u8; NONCE_LEN],
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(..)")
    }
}

/// Why a ciphertext was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the message does not decrypt with this context (wrong key, or altered on the way)")]
pub struct DecryptError;

impl Keys {
    /// The AEAD nonce for the Partial IV `piv` generated by the endpoint whose Sender
    /// ID is `id_piv` (RFC 8613 §5.2). Both must fit ([`MAX_PIV_LEN`], [`MAX_ID_LEN`]).
    pub fn nonce(&self, id_piv: &[u8], piv: &[u8]) -> [u8; NONCE_LEN] {
        debug_assert!(id_piv.len() <= MAX_ID_LEN && piv.len() <= MAX_PIV_LEN);
        let mut nonce = [0u8; NONCE_LEN];
        nonce[0] = id_piv.len() as u8;
        nonce[1 + MAX_ID_LEN - id_piv.len()..1 + MAX_ID_LEN].copy_from_slice(id_piv);
        nonce[NONCE_LEN - piv.len()..].copy_from_slice(piv);
        for (n, iv) in nonce.iter_mut().zip(self.common_iv) {
            *n ^= iv;
        }
        nonce
    }

    /// Encrypts `plaintext` with the Sender Key.
    pub fn seal(&self, nonce: &[u8; NONCE_LEN], aad: &[u8], plaintext: &[u8]) -> Vec<u8> {
        AesCcm::new(&self.sender_key.into())
            .encrypt(
                nonce.into(),
                Payload {
                    msg: plaintext,
                    aad,
                },
            )
            .expect("AES-CCM encrypts any message shorter than 2^64 bytes")
    }

    /// Decrypts and verifies `ciphertext` with the Recipient Key.
    pub fn open(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        ciphertext: &[u8],
    ) -> Result<Vec<u8>, DecryptError> {
        AesCcm::new(&self.recipient_key.into())
            .decrypt(
                nonce.into(),
                Payload {
                    msg: ciphertext,
                    aad,
                },
            )
            .map_err(|_| DecryptError)
    }
}

/// The Additional Authenticated Data of a message protected for the request with
/// `request_kid` and `request_piv` (RFC 8613 §5.4): the COSE Enc_structure around the
/// external_aad, with no Class I options.
pub fn aad(request_kid: &[u8], request_piv: &[u8]) -> Vec<u8> {
    let mut external = Vec::with_capacity(16 + request_kid.len() + request_piv.len());
    cbor::array(&mut external, 5);
    cbor::int(&mut external, 1);
    cbor::array(&mut external, 1);
    cbor::int(&mut external, AES_CCM_16_64_128);
    cbor::bytes(&mut external, request_kid);
    cbor::bytes(&mut external, request_piv);
    cbor::bytes(&mut external, &[]);
    let mut aad = Vec::with_capacity(external.len() + 14);
    cbor::array(&mut aad, 3);
    cbor::text(&mut aad, "Encrypt0");
    cbor::bytes(&mut aad, &[]);
    cbor::bytes(&mut aad, &external);
    aad
}

/// The Partial IV of sequence number `seq`: its big-endian bytes without leading
/// zeros, one zero byte for 0 (RFC 8613 §6.1). `seq` must be below [`SEQUENCE_LIMIT`].
pub fn partial_iv(seq: u64) -> Vec<u8> {
    let bytes = seq.to_be_bytes();
    let skip = bytes.iter().take_while(|b| **b == 0).count().min(7);
    bytes[skip..].to_vec()
}

/// The sequence number a Partial IV stands for.
pub fn sequence_number(piv: &[u8]) -> u64 {
    piv.iter().fold(0, |n, b| (n << 8) | u64::from(*b))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Hex to bytes, for test vectors.
    pub(crate) fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    const SECRET: &str = "0102030405060708090a0b0c0d0e0f10";
    const SALT: &str = "9e7ca92223786340";

    /// RFC 8613 Appendix C.1.1: the client's context, with a Master Salt.
    pub(crate) fn c1_client() -> Material {
        Material::new(&unhex(SECRET), &[], &[0x01]).with_salt(&unhex(SALT))
    }

    /// RFC 8613 Appendix C.2.1: the client's context, without a Master Salt.
    pub(crate) fn c2_client() -> Material {
        Material::new(&unhex(SECRET), &[0x00], &[0x01])
    }

    /// RFC 8613 Appendix C.3.1: the client's context, with an ID Context.
    pub(crate) fn c3_client() -> Material {
        c1_client().with_id_context(&unhex("37cbf3210017a2d3"))
    }

    fn check(material: &Material, sender_key: &str, recipient_key: &str, common_iv: &str) {
        let keys = material.derive().unwrap();
        assert_eq!(hex(&keys.sender_key), sender_key);
        assert_eq!(hex(&keys.recipient_key), recipient_key);
        assert_eq!(hex(&keys.common_iv), common_iv);
        // The server's side is the same context reversed.
        let server = material.reversed().derive().unwrap();
        assert_eq!(server.sender_key, keys.recipient_key);
        assert_eq!(server.recipient_key, keys.sender_key);
        assert_eq!(server.common_iv, keys.common_iv);
    }

    #[test]
    fn c1_key_derivation_with_master_salt() {
        let material = c1_client();
        check(
            &material,
            "f0910ed7295e6ad4b54fc793154302ff",
            "ffb14e093c94c9cac9471648b4f98710",
            "4622d4dd6d944168eefb54987c",
        );
        let keys = material.derive().unwrap();
        // Sender nonce and recipient nonce with Partial IV 0.
        assert_eq!(hex(&keys.nonce(&[], &[0])), "4622d4dd6d944168eefb54987c");
        assert_eq!(hex(&keys.nonce(&[1], &[0])), "4722d4dd6d944169eefb54987c");
    }

    #[test]
    fn c2_key_derivation_without_master_salt() {
        let material = c2_client();
        check(
            &material,
            "321b26943253c7ffb6003b0b64d74041",
            "e57b5635815177cd679ab4bcec9d7dda",
            "be35ae297d2dace910c52e99f9",
        );
        let keys = material.derive().unwrap();
        assert_eq!(hex(&keys.nonce(&[0], &[0])), "bf35ae297d2dace910c52e99f9");
        assert_eq!(hex(&keys.nonce(&[1], &[0])), "bf35ae297d2dace810c52e99f9");
    }

    #[test]
    fn c3_key_derivation_with_id_context() {
        check(
            &c3_client(),
            "af2a1300a5e95788b356336eeecd2b92",
            "e39a0c7c77b43f03b4b39ab9a268699f",
            "2ca58fb85ff1b81c0b7181b85e",
        );
    }

    #[test]
    fn aad_of_request_with_empty_kid() {
        // RFC 8613 Appendix C.4: kid empty, Partial IV 0x14.
        assert_eq!(
            hex(&aad(&[], &[0x14])),
            "8368456e63727970743040488501810a40411440"
        );
    }

    #[test]
    fn partial_iv_is_minimal() {
        assert_eq!(partial_iv(0), [0]);
        assert_eq!(partial_iv(20), [0x14]);
        assert_eq!(partial_iv(0x1_0000), [1, 0, 0]);
        assert_eq!(sequence_number(&partial_iv(0xff_ffff_ffff)), 0xff_ffff_ffff);
    }

    #[test]
    fn material_is_checked() {
        let same = Material::new(b"secret", b"a", b"a");
        assert_eq!(same.derive(), Err(MaterialError::SameIds));
        let long = Material::new(b"secret", b"12345678", b"a");
        assert!(matches!(
            long.derive(),
            Err(MaterialError::IdTooLong { .. })
        ));
        let mut window = Material::new(b"secret", b"a", b"b");
        window.replay_window = 0;
        assert_eq!(window.derive(), Err(MaterialError::Window(0)));
    }

    #[test]
    fn wrong_key_does_not_open() {
        let keys = c1_client().derive().unwrap();
        let server = c1_client().reversed().derive().unwrap();
        let nonce = keys.nonce(&[], &[5]);
        let sealed = keys.seal(&nonce, b"aad", b"hello");
        assert_eq!(server.open(&nonce, b"aad", &sealed).unwrap(), b"hello");
        assert_eq!(keys.open(&nonce, b"aad", &sealed), Err(DecryptError));
        assert_eq!(server.open(&nonce, b"other", &sealed), Err(DecryptError));
    }
}

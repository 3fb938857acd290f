//! AES for Mbed TLS on the CPU's AES instructions (x86-64 AES-NI). This build of
//! Mbed TLS has only its portable table-free software AES, which took about a tenth
//! of a `coaps` server's CPU time per request (CCM_8 runs the block cipher about
//! ten times per small record). `mbedtls-rs-sys` lets a program replace the block
//! cipher ([`hook_aes`]); AES-128 (every suite here) runs on AES-NI where the CPU
//! has it, other key sizes and CPUs on Mbed TLS's software AES as before.
//!
//! The state lives in Mbed TLS's per-context work area, which its cipher layer
//! copies byte for byte: it holds the round keys themselves, no pointers.

use mbedtls_rs_sys::hook::aes::{hook_aes, AesBlock, MbedtlsAes, SoftAesState};
use mbedtls_rs_sys::hook::{WorkArea, WorkAreaMemory};
use mbedtls_rs_sys::{MbedtlsError, MBEDTLS_ERR_AES_BAD_INPUT_DATA};

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// A context's state in its work area.
enum State {
    /// Not keyed yet.
    Empty,
    /// AES-128 round keys for AES-NI: the encryption schedule, or (`dec`) the one
    /// for the equivalent inverse cipher.
    #[cfg(target_arch = "x86_64")]
    Ni128 { keys: [__m128i; 11], dec: bool },
    /// Mbed TLS's software AES.
    Soft(SoftAesState),
}

/// The block cipher Mbed TLS calls through the hook.
struct AesNi;

fn bad_input() -> MbedtlsError {
    MbedtlsError::new(MBEDTLS_ERR_AES_BAD_INPUT_DATA)
}

/// Whether this CPU runs the AES-NI path.
fn has_aes_ni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes") && std::arch::is_x86_feature_detected!("sse2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl AesNi {
    fn key(memory: &mut WorkAreaMemory, key: &[u8], dec: bool) -> Result<(), MbedtlsError> {
        #[cfg(target_arch = "x86_64")]
        if let (Ok(key), true) = (<&[u8; 16]>::try_from(key), has_aes_ni()) {
            // SAFETY: the CPU has AES-NI (checked above).
            let keys = unsafe {
                let enc = ni::expand_128(key);
                if dec {
                    ni::inverse_schedule(&enc)
                } else {
                    enc
                }
            };
            // SAFETY: `init` emplaced a `State` (alignment 16, as the work area
            // allows).
            *unsafe { memory.cast_mut::<State>() } = State::Ni128 { keys, dec };
            return Ok(());
        }
        let soft = if dec {
            SoftAesState::new_dec(key)?
        } else {
            SoftAesState::new_enc(key)?
        };
        // SAFETY: as above.
        *unsafe { memory.cast_mut::<State>() } = State::Soft(soft);
        Ok(())
    }

    fn crypt(
        memory: &mut WorkAreaMemory,
        block: &mut AesBlock,
        dec: bool,
    ) -> Result<(), MbedtlsError> {
        // SAFETY: `init` emplaced a `State`.
        match unsafe { memory.cast_mut::<State>() } {
            State::Empty => Err(bad_input()),
            #[cfg(target_arch = "x86_64")]
            State::Ni128 { keys, dec: keyed } if *keyed == dec => {
                // SAFETY: a `Ni128` state exists only where the CPU has AES-NI.
                unsafe {
                    if dec {
                        ni::decrypt(keys, block)
                    } else {
                        ni::encrypt(keys, block)
                    }
                }
                Ok(())
            }
            #[cfg(target_arch = "x86_64")]
            State::Ni128 { .. } => Err(bad_input()),
            State::Soft(soft) if dec => soft.decrypt(block),
            State::Soft(soft) => soft.encrypt(block),
        }
    }
}

impl MbedtlsAes for AesNi {
    fn init(&self, memory: &mut WorkAreaMemory) {
        // SAFETY: the work area holds nothing that needs dropping (plain data).
        unsafe { memory.cast_mut_maybe::<State>() }.write(State::Empty);
    }

    fn free(&self, memory: &mut WorkAreaMemory) {
        // Plain data: wiping it frees (and clears) the round keys.
        memory.fill(0);
    }

    fn set_enc_key(&self, memory: &mut WorkAreaMemory, key: &[u8]) -> Result<(), MbedtlsError> {
        AesNi::key(memory, key, false)
    }

    fn set_dec_key(&self, memory: &mut WorkAreaMemory, key: &[u8]) -> Result<(), MbedtlsError> {
        AesNi::key(memory, key, true)
    }

    fn encrypt(
        &self,
        memory: &mut WorkAreaMemory,
        block: &mut AesBlock,
    ) -> Result<(), MbedtlsError> {
        AesNi::crypt(memory, block, false)
    }

    fn decrypt(
        &self,
        memory: &mut WorkAreaMemory,
        block: &mut AesBlock,
    ) -> Result<(), MbedtlsError> {
        AesNi::crypt(memory, block, true)
    }
}

/// Puts AES-NI under Mbed TLS's AES where the CPU has it. Must run before Mbed TLS
/// keys any AES context (the PSA and DRBG setup included).
pub(super) fn install() {
    static AES: AesNi = AesNi;
    if has_aes_ni() {
        // SAFETY: called once, before any Mbed TLS AES use (see `ffi::init_psa`);
        // the implementation is a static.
        unsafe { hook_aes(Some(&AES)) };
    }
}

#[cfg(target_arch = "x86_64")]
mod ni {
    use std::arch::x86_64::*;

    /// One step of the AES-128 key expansion with `assist` (the
    /// `aeskeygenassist` of the previous round key).
    #[target_feature(enable = "aes,sse2")]
    fn expand_step(key: __m128i, assist: __m128i) -> __m128i {
        let assist = _mm_shuffle_epi32::<0xff>(assist);
        let mut key = key;
        key = _mm_xor_si128(key, _mm_slli_si128::<4>(key));
        key = _mm_xor_si128(key, _mm_slli_si128::<4>(key));
        key = _mm_xor_si128(key, _mm_slli_si128::<4>(key));
        _mm_xor_si128(key, assist)
    }

    /// The AES-128 encryption round keys of `key` (FIPS-197 §5.2).
    #[target_feature(enable = "aes,sse2")]
    pub(super) fn expand_128(key: &[u8; 16]) -> [__m128i; 11] {
        let mut k = [_mm_setzero_si128(); 11];
        // SAFETY: 16 readable bytes; the load is unaligned.
        k[0] = unsafe { _mm_loadu_si128(key.as_ptr().cast()) };
        macro_rules! round {
            ($i:literal, $rcon:literal) => {
                k[$i] = expand_step(k[$i - 1], _mm_aeskeygenassist_si128::<$rcon>(k[$i - 1]));
            };
        }
        round!(1, 0x01);
        round!(2, 0x02);
        round!(3, 0x04);
        round!(4, 0x08);
        round!(5, 0x10);
        round!(6, 0x20);
        round!(7, 0x40);
        round!(8, 0x80);
        round!(9, 0x1b);
        round!(10, 0x36);
        k
    }

    /// The round keys of the equivalent inverse cipher (FIPS-197 §5.3.5).
    #[target_feature(enable = "aes,sse2")]
    pub(super) fn inverse_schedule(enc: &[__m128i; 11]) -> [__m128i; 11] {
        let mut d = [_mm_setzero_si128(); 11];
        d[0] = enc[10];
        for i in 1..10 {
            d[i] = _mm_aesimc_si128(enc[10 - i]);
        }
        d[10] = enc[0];
        d
    }

    #[target_feature(enable = "aes,sse2")]
    pub(super) fn encrypt(k: &[__m128i; 11], block: &mut [u8; 16]) {
        // SAFETY: 16 bytes, unaligned loads and stores.
        let mut b = unsafe { _mm_loadu_si128(block.as_ptr().cast()) };
        b = _mm_xor_si128(b, k[0]);
        for key in &k[1..10] {
            b = _mm_aesenc_si128(b, *key);
        }
        b = _mm_aesenclast_si128(b, k[10]);
        // SAFETY: as above.
        unsafe { _mm_storeu_si128(block.as_mut_ptr().cast(), b) };
    }

    #[target_feature(enable = "aes,sse2")]
    pub(super) fn decrypt(d: &[__m128i; 11], block: &mut [u8; 16]) {
        // SAFETY: 16 bytes, unaligned loads and stores.
        let mut b = unsafe { _mm_loadu_si128(block.as_ptr().cast()) };
        b = _mm_xor_si128(b, d[0]);
        for key in &d[1..10] {
            b = _mm_aesdec_si128(b, *key);
        }
        b = _mm_aesdeclast_si128(b, d[10]);
        // SAFETY: as above.
        unsafe { _mm_storeu_si128(block.as_mut_ptr().cast(), b) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A work area as Mbed TLS gives one (16-byte aligned).
    #[repr(C, align(16))]
    struct Area([u8; 512]);

    fn keyed(key: &[u8], dec: bool) -> Area {
        let mut area = Area([0; 512]);
        AesNi.init(&mut area.0);
        if dec {
            AesNi.set_dec_key(&mut area.0, key).unwrap();
        } else {
            AesNi.set_enc_key(&mut area.0, key).unwrap();
        }
        area
    }

    #[test]
    fn the_fips_197_example_vector_both_ways() {
        // FIPS-197 Appendix C.1 (AES-128).
        let key: Vec<u8> = (0u8..16).collect();
        let plain: AesBlock = [
            0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd,
            0xee, 0xff,
        ];
        let cipher: AesBlock = [
            0x69, 0xc4, 0xe0, 0xd8, 0x6a, 0x7b, 0x04, 0x30, 0xd8, 0xcd, 0xb7, 0x80, 0x70, 0xb4,
            0xc5, 0x5a,
        ];
        let mut block = plain;
        AesNi
            .encrypt(&mut keyed(&key, false).0, &mut block)
            .unwrap();
        assert_eq!(block, cipher);
        AesNi.decrypt(&mut keyed(&key, true).0, &mut block).unwrap();
        assert_eq!(block, plain);
    }

    #[test]
    fn it_agrees_with_the_software_aes_on_random_keys_and_blocks() {
        use rand::RngCore;
        let mut rng = rand::rng();
        for key_len in [16, 24, 32] {
            for _ in 0..200 {
                let mut key = vec![0u8; key_len];
                rng.fill_bytes(&mut key);
                let mut block = [0u8; 16];
                rng.fill_bytes(&mut block);
                let mut expected = block;
                SoftAesState::new_enc(&key)
                    .unwrap()
                    .encrypt(&mut expected)
                    .unwrap();
                let mut got = block;
                AesNi.encrypt(&mut keyed(&key, false).0, &mut got).unwrap();
                assert_eq!(got, expected, "{key_len}-byte key");
                AesNi.decrypt(&mut keyed(&key, true).0, &mut got).unwrap();
                assert_eq!(got, block);
            }
        }
    }

    #[test]
    fn an_unkeyed_or_wrong_direction_context_is_an_error() {
        let mut area = Area([0; 512]);
        AesNi.init(&mut area.0);
        assert!(AesNi.encrypt(&mut area.0, &mut [0; 16]).is_err());
        assert!(AesNi.set_enc_key(&mut area.0, &[0; 5]).is_err());
        if has_aes_ni() {
            let mut enc = keyed(&[1; 16], false);
            assert!(AesNi.decrypt(&mut enc.0, &mut [0; 16]).is_err());
        }
    }
}

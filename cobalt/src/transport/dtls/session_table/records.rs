//! The record protection of an established server session with an AES-128-CCM_8
//! suite (RFC 6655, RFC 7252's mandatory `TLS_PSK_WITH_AES_128_CCM_8` and
//! `TLS_ECDHE_ECDSA_WITH_AES_128_CCM_8`), done here once OpenSSL has finished the
//! handshake, so that the session no longer holds an `SSL`.
//!
//! An OpenSSL `SSL` keeps about 60 KiB after its DTLS handshake (the handshake
//! message buffer, which DTLS keeps for retransmissions, a datagram buffer between
//! its record layers, three record layers, the connection itself), and every record
//! goes through its BIO and record layer. What an established session needs is two
//! AES key schedules, two sequence numbers, a replay window and the server's last
//! flight (in case the client did not get it): about 1 KiB.
//!
//! The keys come from the handshake's master secret and randoms (the TLS 1.2 key
//! expansion, RFC 5246 §6.3, SHA-256 PRF); the record format and nonce are RFC 5288
//! §3 / RFC 6655 §3 in DTLS 1.2 (RFC 6347 §4.1): the explicit nonce is the record's
//! epoch and sequence number, the additional data the sequence number, type,
//! version and plaintext length.

use ccm::aead::generic_array::GenericArray;
use ccm::aead::AeadInPlace;
use ccm::consts::{U12, U8};
use ccm::{Ccm, KeyInit};
use openssl::hash::MessageDigest;
use openssl::pkey::PKey;
use openssl::sign::Signer;
use openssl::ssl::SslRef;

type Aes128Ccm8 = Ccm<aes::Aes128Enc, U8, U12>;

/// The DTLS record header: type, version, epoch, sequence number, length.
const HEADER: usize = 13;
/// The explicit part of the nonce (epoch and sequence number) before the ciphertext.
const EXPLICIT_NONCE: usize = 8;
/// The CCM_8 tag after it.
const TAG: usize = 8;
/// DTLS 1.2 on the wire.
const VERSION: [u8; 2] = [0xfe, 0xfd];
/// The largest plaintext of a record (RFC 6347 §4.1: 2^14).
const MAX_PLAINTEXT: usize = 1 << 14;
/// The largest record sequence number (48 bits).
const MAX_SEQ: u64 = (1 << 48) - 1;
/// The epoch of a session's first (and here only) handshake's keys.
const EPOCH: u16 = 1;

const CHANGE_CIPHER_SPEC: u8 = 20;
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;

/// What the records of one received datagram held.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Opened {
    /// The application data, one entry per record.
    pub(super) data: Vec<Vec<u8>>,
    /// The peer closed the session (close_notify, or a fatal alert), with why.
    pub(super) closed: Option<String>,
    /// The peer sent its last handshake flight again: it did not get ours.
    pub(super) flight_again: bool,
    /// Records dropped: not authentic, replayed, of another epoch, or malformed.
    pub(super) dropped: u64,
}

/// The record layer of an established server session (see the module docs).
pub(super) struct ServerRecords {
    /// The suite's name (OpenSSL's).
    cipher: &'static str,
    /// Protects what the server sends (server_write_key, server_write_IV).
    write: Aes128Ccm8,
    write_salt: [u8; 4],
    /// The next sequence number to send in [`EPOCH`].
    next_write_seq: u64,
    /// Opens what the client sends (client_write_key, client_write_IV).
    read: Aes128Ccm8,
    read_salt: [u8; 4],
    /// The replay window (RFC 6347 §4.1.2.6): the highest sequence number accepted
    /// and a bit for each of the 63 below it.
    highest_read: u64,
    seen: u64,
    /// The server's last flight (ChangeCipherSpec and Finished), sent again when
    /// the client sends its own again; dropped once the client sends data.
    last_flight: Vec<Vec<u8>>,
}

impl std::fmt::Debug for ServerRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerRecords")
            .field("next_write_seq", &self.next_write_seq)
            .field("highest_read", &self.highest_read)
            .finish_non_exhaustive()
    }
}

/// The TLS 1.2 PRF with SHA-256 (RFC 5246 §5), `out.len()` bytes.
fn prf_sha256(secret: &[u8], label: &[u8], seed: &[&[u8]], out: &mut [u8]) -> Option<()> {
    let key = PKey::hmac(secret).ok()?;
    let hmac = |parts: &[&[u8]]| -> Option<Vec<u8>> {
        let mut s = Signer::new(MessageDigest::sha256(), &key).ok()?;
        for p in parts {
            s.update(p).ok()?;
        }
        s.sign_to_vec().ok()
    };
    let mut label_seed: Vec<&[u8]> = vec![label];
    label_seed.extend_from_slice(seed);
    let mut a = hmac(&label_seed)?; // A(1)
    let mut filled = 0;
    while filled < out.len() {
        let mut parts: Vec<&[u8]> = vec![&a];
        parts.extend_from_slice(&label_seed);
        let block = hmac(&parts)?;
        let n = block.len().min(out.len() - filled);
        out[filled..filled + n].copy_from_slice(&block[..n]);
        filled += n;
        a = hmac(&[&a])?;
    }
    Some(())
}

/// `epoch << 48 | sequence number` of a record header.
fn epoch_seq(header: &[u8]) -> u64 {
    header[3..11]
        .iter()
        .fold(0u64, |acc, b| acc << 8 | u64::from(*b))
}

/// The records of a datagram: (header, fragment) pairs, up to the first malformed one.
fn records(datagram: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let mut rest = datagram;
    std::iter::from_fn(move || {
        let header = rest.get(..HEADER)?;
        let len = usize::from(u16::from_be_bytes([header[11], header[12]]));
        let fragment = rest.get(HEADER..HEADER + len)?;
        rest = &rest[HEADER + len..];
        Some((header, fragment))
    })
}

impl ServerRecords {
    /// The record layer of `ssl`'s session, whose handshake (a server's, the first
    /// on this `SSL`) just completed with an AES-128-CCM_8 suite. `received` is the
    /// datagram that completed it, `sent` what the server has sent in the session's
    /// epoch so far (its last flight among them). `None` when the session is not
    /// one this layer can take over (another suite, or state it cannot read).
    pub(super) fn take_over(ssl: &SslRef, received: &[u8], sent: &[Vec<u8>]) -> Option<Self> {
        let cipher = ssl.current_cipher()?;
        if !cipher.name().ends_with("AES128-CCM8") {
            return None;
        }
        let session = ssl.session()?;
        let mut master = [0u8; 48];
        if session.master_key(&mut master) != master.len() {
            return None;
        }
        let (mut client_random, mut server_random) = ([0u8; 32], [0u8; 32]);
        if ssl.client_random(&mut client_random) != 32
            || ssl.server_random(&mut server_random) != 32
        {
            return None;
        }
        // client_write_key, server_write_key, client_write_IV, server_write_IV.
        let mut block = [0u8; 40];
        prf_sha256(
            &master,
            b"key expansion",
            &[&server_random, &client_random],
            &mut block,
        )?;
        // The sequence numbers OpenSSL used in the epoch: ours go on after them; the
        // client's handshake records (its Finished) count as seen.
        let in_epoch = |header: &&[u8]| header[3..5] == EPOCH.to_be_bytes();
        let sent_seq = sent
            .iter()
            .flat_map(|d| records(d))
            .map(|(h, _)| h)
            .filter(in_epoch)
            .map(|h| epoch_seq(h) & MAX_SEQ)
            .max()?;
        let received_seq = records(received)
            .map(|(h, _)| h)
            .filter(|h| h[0] == HANDSHAKE && in_epoch(h))
            .map(|h| epoch_seq(h) & MAX_SEQ)
            .max()
            .unwrap_or(0);
        let last_flight = sent
            .iter()
            .filter(|d| records(d).any(|(h, _)| h[0] == CHANGE_CIPHER_SPEC || in_epoch(&h)))
            .cloned()
            .collect();
        Some(ServerRecords {
            cipher: cipher.name(),
            write: Aes128Ccm8::new(GenericArray::from_slice(&block[16..32])),
            write_salt: block[36..40].try_into().ok()?,
            next_write_seq: sent_seq + 1,
            read: Aes128Ccm8::new(GenericArray::from_slice(&block[..16])),
            read_salt: block[32..36].try_into().ok()?,
            highest_read: received_seq,
            seen: u64::MAX,
            last_flight,
        })
    }

    /// The suite's name (OpenSSL's).
    pub(super) fn cipher(&self) -> &'static str {
        self.cipher
    }

    /// The server's last flight, to send again.
    pub(super) fn last_flight(&self) -> &[Vec<u8>] {
        &self.last_flight
    }

    /// Protects `plaintext` as one application-data record, or says why not.
    pub(super) fn seal(&mut self, plaintext: &[u8]) -> Result<Vec<u8>, &'static str> {
        self.seal_record(APPLICATION_DATA, plaintext)
    }

    /// A close_notify alert, protected.
    pub(super) fn close_notify(&mut self) -> Option<Vec<u8>> {
        self.seal_record(ALERT, &[1, 0]).ok()
    }

    fn seal_record(&mut self, content_type: u8, plaintext: &[u8]) -> Result<Vec<u8>, &'static str> {
        if plaintext.len() > MAX_PLAINTEXT {
            return Err("the datagram is larger than a DTLS record holds");
        }
        if self.next_write_seq > MAX_SEQ {
            return Err("the session used up its record sequence numbers");
        }
        let seq = u64::from(EPOCH) << 48 | self.next_write_seq;
        self.next_write_seq += 1;
        let seq_bytes = seq.to_be_bytes();
        let length = (EXPLICIT_NONCE + plaintext.len() + TAG) as u16;
        let mut record = Vec::with_capacity(HEADER + usize::from(length));
        record.push(content_type);
        record.extend_from_slice(&VERSION);
        record.extend_from_slice(&seq_bytes);
        record.extend_from_slice(&length.to_be_bytes());
        record.extend_from_slice(&seq_bytes); // the explicit nonce
        record.extend_from_slice(plaintext);
        let aad = additional_data(seq_bytes, content_type, plaintext.len());
        let nonce = nonce(self.write_salt, seq_bytes);
        let body = &mut record[HEADER + EXPLICIT_NONCE..];
        let tag = self
            .write
            .encrypt_in_place_detached(GenericArray::from_slice(&nonce), &aad, body)
            .map_err(|_| "the record could not be encrypted")?;
        record.extend_from_slice(&tag);
        Ok(record)
    }

    /// Opens the records of one datagram from the client.
    pub(super) fn open(&mut self, datagram: &[u8]) -> Opened {
        let mut opened = Opened::default();
        for (header, fragment) in records(datagram) {
            if opened.closed.is_some() {
                break;
            }
            let content_type = header[0];
            let seq = epoch_seq(header);
            if header[3..5] == [0, 0] {
                // Unprotected: the rest of a flight the client sent again (its
                // Finished, in this epoch, is what counts), or an alert of no weight.
                continue;
            }
            if header[3..5] != EPOCH.to_be_bytes()
                || fragment.len() < EXPLICIT_NONCE + TAG
                || fragment.len() > EXPLICIT_NONCE + MAX_PLAINTEXT + TAG
                || !self.fresh(seq & MAX_SEQ)
            {
                // Another epoch, a record too short or long, or a replay.
                opened.dropped += 1;
                continue;
            }
            let (explicit, rest) = fragment.split_at(EXPLICIT_NONCE);
            let (ciphertext, tag) = rest.split_at(rest.len() - TAG);
            let seq_bytes = seq.to_be_bytes();
            let aad = additional_data(seq_bytes, content_type, ciphertext.len());
            let explicit: [u8; 8] = explicit.try_into().unwrap_or_default();
            let nonce = nonce(self.read_salt, explicit);
            let mut plaintext = ciphertext.to_vec();
            if self
                .read
                .decrypt_in_place_detached(
                    GenericArray::from_slice(&nonce),
                    &aad,
                    &mut plaintext,
                    GenericArray::from_slice(tag),
                )
                .is_err()
            {
                opened.dropped += 1;
                continue;
            }
            self.mark_seen(seq & MAX_SEQ);
            match content_type {
                APPLICATION_DATA => {
                    self.last_flight = Vec::new(); // the client has ours
                    opened.data.push(plaintext);
                }
                ALERT => match plaintext.as_slice() {
                    [_, 0] => opened.closed = Some("the peer closed the session".into()),
                    [2, description] => {
                        opened.closed = Some(format!("the peer sent fatal alert {description}"))
                    }
                    _ => {} // a warning
                },
                // Its Finished again (ours was lost), while we still have ours;
                // anything later (a renegotiation) is not done here.
                HANDSHAKE if !self.last_flight.is_empty() => opened.flight_again = true,
                _ => opened.dropped += 1,
            }
        }
        opened
    }

    /// Whether `seq` is new to the replay window.
    fn fresh(&self, seq: u64) -> bool {
        if seq > self.highest_read {
            return true;
        }
        let back = self.highest_read - seq;
        back < 64 && self.seen & (1 << back) == 0
    }

    fn mark_seen(&mut self, seq: u64) {
        if seq > self.highest_read {
            let shift = seq - self.highest_read;
            self.seen = if shift >= 64 { 0 } else { self.seen << shift };
            self.seen |= 1;
            self.highest_read = seq;
        } else {
            self.seen |= 1 << (self.highest_read - seq);
        }
    }
}

/// The CCM nonce: the 4-byte salt (write IV) and the 8-byte explicit nonce.
fn nonce(salt: [u8; 4], explicit: [u8; 8]) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[..4].copy_from_slice(&salt);
    n[4..].copy_from_slice(&explicit);
    n
}

/// The additional data of an AEAD record (RFC 5246 §6.2.3.3, with DTLS's epoch and
/// sequence number): sequence number, type, version, plaintext length.
fn additional_data(seq: [u8; 8], content_type: u8, plaintext_len: usize) -> [u8; 13] {
    let mut aad = [0u8; 13];
    aad[..8].copy_from_slice(&seq);
    aad[8] = content_type;
    aad[9..11].copy_from_slice(&VERSION);
    aad[11..].copy_from_slice(&(plaintext_len as u16).to_be_bytes());
    aad
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prf_gives_the_published_test_vector() {
        // A published TLS 1.2 PRF (SHA-256) test vector, as `openssl kdf TLS1-PRF`
        // computes it too: 100 bytes, the first 16 and the last 5 compared.
        let secret = hex("9bbe436ba940f017b17652849a71db35");
        let seed = hex("a0ba9f936cda311827a6f796ffd5198c");
        let mut out = [0u8; 100];
        prf_sha256(&secret, b"test label", &[&seed], &mut out).unwrap();
        assert_eq!(
            out[..16],
            hex("e3f229ba727be17b8d122620557cd453")[..],
            "{out:02x?}"
        );
        assert_eq!(out[95..], hex("0187347b66")[..]);
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn pair() -> ServerRecords {
        ServerRecords {
            cipher: "PSK-AES128-CCM8",
            write: Aes128Ccm8::new(GenericArray::from_slice(&[7; 16])),
            write_salt: [1, 2, 3, 4],
            next_write_seq: 1,
            read: Aes128Ccm8::new(GenericArray::from_slice(&[7; 16])),
            read_salt: [1, 2, 3, 4],
            highest_read: 0,
            seen: u64::MAX,
            last_flight: vec![b"flight".to_vec()],
        }
    }

    #[test]
    fn sealed_records_open_once_and_a_flipped_bit_fails() {
        // One layer whose read keys are its write keys opens its own records.
        let mut r = pair();
        let record = r.seal(b"hello").unwrap();
        assert_eq!(record.len(), HEADER + EXPLICIT_NONCE + 5 + TAG);
        assert_eq!(&record[..5], &[APPLICATION_DATA, 0xfe, 0xfd, 0, 1]);
        let mut forged = record.clone();
        forged[HEADER + EXPLICIT_NONCE] ^= 1;
        assert_eq!(r.open(&forged).dropped, 1);
        let opened = r.open(&record);
        assert_eq!(opened.data, vec![b"hello".to_vec()]);
        assert!(r.last_flight().is_empty(), "the client has our flight");
        assert_eq!(r.open(&record).dropped, 1, "a replay");
    }

    #[test]
    fn the_replay_window_takes_late_records_once() {
        let mut r = pair();
        let records: Vec<Vec<u8>> = (0..70).map(|i| r.seal(&[i]).unwrap()).collect();
        assert_eq!(r.open(&records[69]).data.len(), 1);
        assert_eq!(r.open(&records[10]).data.len(), 1, "63 back: in the window");
        assert_eq!(r.open(&records[10]).dropped, 1, "seen");
        assert_eq!(r.open(&records[4]).dropped, 1, "65 back: too old");
        let both: Vec<u8> = [records[20].clone(), records[21].clone()].concat();
        assert_eq!(r.open(&both).data, vec![vec![20], vec![21]]);
    }

    #[test]
    fn alerts_and_a_resent_finished_are_told_apart() {
        let mut r = pair();
        let finished = r.seal_record(HANDSHAKE, b"finished").unwrap();
        assert!(r.open(&finished).flight_again);
        let warning = r.seal_record(ALERT, &[1, 90]).unwrap();
        assert_eq!(r.open(&warning), Opened::default());
        let close = r.close_notify().unwrap();
        assert_eq!(
            r.open(&close).closed.as_deref(),
            Some("the peer closed the session")
        );
    }

    #[test]
    fn garbage_and_other_epochs_are_dropped_without_a_panic() {
        let mut r = pair();
        for junk in [&[][..], &[23, 0xfe, 0xfd][..], &[23; 13][..], &[23; 40][..]] {
            assert!(r.open(junk).data.is_empty());
        }
        let mut epoch2 = r.seal(b"x").unwrap();
        epoch2[4] = 2;
        assert_eq!(r.open(&epoch2).dropped, 1);
        assert!(r.seal(&vec![0; MAX_PLAINTEXT + 1]).is_err());
        r.next_write_seq = MAX_SEQ + 1;
        assert!(r.seal(b"x").is_err(), "sequence numbers used up");
    }
}

//! A client's guess that the server lost its DTLS session (restart, eviction): DTLS 1.2
//! has no way to say so, and records for a session the server does not know are
//! dropped in silence. Shared by both backends.

use super::DtlsConfig;
use std::collections::VecDeque;

/// Fingerprints of unanswered datagrams a client session remembers.
const UNANSWERED_KEPT: usize = 8;

/// The datagrams a client sent over a session since the server was last heard from,
/// by fingerprint, with how often each was sent again.
#[derive(Debug, Default)]
pub(crate) struct Unanswered(VecDeque<(u64, u32)>);

impl Unanswered {
    /// The server was heard from: nothing is unanswered.
    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    /// Before sending `plaintext` over an established session: whether the server
    /// seems to have lost the session. That is the case when the same datagram (a
    /// CoAP retransmission) goes out for the `rehandshake_after_resends`-th time
    /// again and nothing has been heard from the server since it first went out.
    /// Otherwise counts the datagram.
    pub(crate) fn presumed_lost(&mut self, plaintext: &[u8], config: &DtlsConfig) -> bool {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        plaintext.hash(&mut h);
        let fingerprint = h.finish();
        if let Some((_, resends)) = self.0.iter_mut().find(|(f, _)| *f == fingerprint) {
            *resends += 1;
            return *resends >= config.rehandshake_after_resends.max(1);
        }
        if self.0.len() >= UNANSWERED_KEPT {
            self.0.pop_front();
        }
        self.0.push_back((fingerprint, 0));
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_resend_without_an_answer_means_lost() {
        let config = DtlsConfig::default();
        let mut u = Unanswered::default();
        assert!(!u.presumed_lost(b"request", &config), "first sending");
        assert!(!u.presumed_lost(b"other", &config), "another datagram");
        assert!(u.presumed_lost(b"request", &config), "first resend");
        u.clear();
        assert!(!u.presumed_lost(b"request", &config), "heard from since");
    }

    #[test]
    fn a_later_resend_can_be_asked_for() {
        let config = DtlsConfig {
            rehandshake_after_resends: 2,
            ..DtlsConfig::default()
        };
        let mut u = Unanswered::default();
        assert!(!u.presumed_lost(b"request", &config), "first sending");
        assert!(!u.presumed_lost(b"request", &config), "first resend");
        assert!(u.presumed_lost(b"request", &config), "second resend");
    }

    #[test]
    fn only_a_few_fingerprints_are_kept() {
        let config = DtlsConfig::default();
        let mut u = Unanswered::default();
        for i in 0..100u32 {
            assert!(!u.presumed_lost(&i.to_be_bytes(), &config));
        }
        assert_eq!(u.0.len(), UNANSWERED_KEPT);
    }
}

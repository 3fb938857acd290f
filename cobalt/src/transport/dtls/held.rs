//! What a session holds for its peer until its handshake ends: the plaintext the
//! application sent meanwhile, oldest first and bounded. Shared by both backends.

use std::collections::VecDeque;

/// Plaintext waiting for a session's handshake to end.
#[derive(Debug, Default)]
pub(crate) struct Held(VecDeque<Vec<u8>>);

impl Held {
    /// Keeps `plaintext` to send once the handshake ends; with `max` (at least one)
    /// already held, the oldest goes.
    pub(crate) fn push(&mut self, plaintext: &[u8], max: usize) {
        if self.0.len() >= max.max(1) {
            self.0.pop_front();
        }
        self.0.push_back(plaintext.to_vec());
    }

    /// The oldest plaintext held, to send now.
    pub(crate) fn pop(&mut self) -> Option<Vec<u8>> {
        self.0.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_goes_beyond_the_bound() {
        let mut held = Held::default();
        for b in [1u8, 2, 3] {
            held.push(&[b], 2);
        }
        assert_eq!(held.pop(), Some(vec![2]));
        assert_eq!(held.pop(), Some(vec![3]));
        assert_eq!(held.pop(), None);
        held.push(&[4], 0);
        held.push(&[5], 0);
        assert_eq!(held.pop(), Some(vec![5]), "a bound of 0 holds one");
    }
}

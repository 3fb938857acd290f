//! Budgets of state that peers create in the server role, and who is refused when one
//! runs out.
//!
//! The convention (the same for every kind of state): a peer over its own budget gets
//! **4.29 Too Many Requests** (RFC 8516), and a server-wide bound gets **5.03 Service
//! Unavailable** — both with Max-Age, the time after which to try again — and only the
//! peers that cause it are refused. Near a server-wide bound a peer is refused while it
//! holds at least as much as is still free ([`fair_share_exceeded`]): heavy holders stop
//! first, and the room that is left stays open to peers that hold little. With `k`
//! peers growing as fast as they can, each ends up with at most `bound / (k + 1)`, and
//! as much stays free for everyone else.

use crate::message::{Code, Message, MessageType};

/// Why a peer's request for more state was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The peer is over its own budget: 4.29.
    PeerBudget,
    /// A server-wide bound is reached (and the peer holds at least its share): 5.03.
    ServerBound,
}

impl Refusal {
    /// The answer: 4.29 or 5.03 with Max-Age `max_age` and a short payload that says
    /// what ran out (`what`, e.g. "observers"). Its type and message ID are the
    /// endpoint's to set.
    pub fn answer(self, what: &str, max_age: u32) -> Message {
        // Short: the answer goes to a peer whose address may be unverified.
        let (code, text) = match self {
            Refusal::PeerBudget => (Code::TOO_MANY_REQUESTS, format!("too many {what} here")),
            Refusal::ServerBound => (Code::SERVICE_UNAVAILABLE, format!("server full: {what}")),
        };
        let mut m = Message::new(MessageType::Acknowledgement, code, 0);
        m.options.set_uint(crate::message::opt::MAX_AGE, max_age);
        m.payload = text.into_bytes();
        m
    }
}

/// True when a peer holding `held` must not get `more` while `used` of `bound` are
/// taken: the bound would be passed, or the peer already holds at least what would be
/// left free.
pub fn fair_share_exceeded(held: usize, more: usize, used: usize, bound: usize) -> bool {
    let free = bound.saturating_sub(used);
    more > free || (held > 0 && held >= free - more)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fair_share_keeps_room_for_light_peers() {
        // 100 slots, nothing used: anyone gets one.
        assert!(!fair_share_exceeded(0, 1, 0, 100));
        // 60 used, this peer holds 40 of them: 40 left, it holds as much: refused.
        assert!(fair_share_exceeded(40, 1, 60, 100));
        // A peer holding nothing gets in until the very end.
        assert!(!fair_share_exceeded(0, 1, 99, 100));
        assert!(fair_share_exceeded(0, 1, 100, 100));
        // Bytes: 10 more for a peer holding 5, with 20 free: 10 left after, 5 < 10.
        assert!(!fair_share_exceeded(5, 10, 80, 100));
        assert!(fair_share_exceeded(11, 10, 80, 100));
    }

    #[test]
    fn refusals_say_what_ran_out_and_when_to_retry() {
        let m = Refusal::PeerBudget.answer("uploads", 30);
        assert_eq!(m.code, Code::TOO_MANY_REQUESTS);
        assert_eq!(m.options.get_uint(crate::message::opt::MAX_AGE), Some(30));
        assert_eq!(m.payload, b"too many uploads here");
        let m = Refusal::ServerBound.answer("observers", 5);
        assert_eq!(m.code, Code::SERVICE_UNAVAILABLE);
        assert_eq!(m.payload, b"server full: observers");
    }
}

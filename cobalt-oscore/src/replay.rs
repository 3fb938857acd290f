//! The replay window of a Recipient Context (RFC 8613 §7.4): which sequence numbers
//! of the peer's requests were seen, a sliding bitmap of up to 64.

/// Why a request's sequence number is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// Seen before, or older than the window reaches.
    #[error("replay detected: this sequence number was seen or is older than the window")]
    Replayed,
    /// The window's state was lost (a restart): the peer must prove freshness with an
    /// Echo first (RFC 8613 Appendix B.1.2).
    #[error("the replay window is not initialised yet (after a restart): freshness needs an Echo")]
    Unknown,
}

/// What a window knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Its state was lost: nothing is accepted until it is initialised.
    Unknown,
    /// A fresh context: nothing seen yet, every sequence number is new.
    Empty,
    /// `highest` is the highest seen; bit `i` of `seen` says whether `highest - i` was.
    Seen { highest: u64, seen: u64 },
}

/// A replay window of `size` sequence numbers (1 to 64; RFC 8613's default is 32).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayWindow {
    size: u32,
    state: State,
}

impl ReplayWindow {
    /// A window for a fresh context: every sequence number is new.
    pub fn new(size: u32) -> ReplayWindow {
        ReplayWindow {
            size: size.clamp(1, 64),
            state: State::Empty,
        }
    }

    /// A window whose state was lost (after a restart): it refuses everything with
    /// [`ReplayError::Unknown`] until [`ReplayWindow::initialize`].
    pub fn unknown(size: u32) -> ReplayWindow {
        ReplayWindow {
            state: State::Unknown,
            ..ReplayWindow::new(size)
        }
    }

    /// Whether the window knows nothing (a restart).
    pub fn is_unknown(&self) -> bool {
        self.state == State::Unknown
    }

    /// Whether `seq` would be accepted (nothing is recorded: call
    /// [`ReplayWindow::accept`] once the message verified).
    pub fn check(&self, seq: u64) -> Result<(), ReplayError> {
        match self.state {
            State::Unknown => Err(ReplayError::Unknown),
            State::Empty => Ok(()),
            State::Seen { highest, .. } if seq > highest => Ok(()),
            State::Seen { highest, seen } => {
                let age = highest - seq;
                if age >= u64::from(self.size) || seen & (1 << age) != 0 {
                    Err(ReplayError::Replayed)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Records `seq` as seen (after [`ReplayWindow::check`] and verification).
    pub fn accept(&mut self, seq: u64) {
        self.state = match self.state {
            State::Unknown | State::Empty => State::Seen {
                highest: seq,
                seen: 1,
            },
            State::Seen { highest, seen } if seq > highest => {
                let shift = seq - highest;
                State::Seen {
                    highest: seq,
                    seen: if shift >= 64 { 1 } else { (seen << shift) | 1 },
                }
            }
            State::Seen { highest, seen } => State::Seen {
                highest,
                seen: seen | 1u64.checked_shl((highest - seq) as u32).unwrap_or(0),
            },
        };
    }

    /// Initialises a window whose state was lost from `seq`, a sequence number proven
    /// fresh by an Echo: everything up to it counts as seen.
    pub fn initialize(&mut self, seq: u64) {
        self.state = State::Seen {
            highest: seq,
            seen: u64::MAX,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_sequence_number_is_accepted_once() {
        let mut window = ReplayWindow::new(32);
        for seq in [5, 3, 40, 39, 9] {
            assert_eq!(window.check(seq), Ok(()), "{seq}");
            window.accept(seq);
            assert_eq!(window.check(seq), Err(ReplayError::Replayed), "{seq}");
        }
        // 5 and 3 are now older than 40 - 32; 9 was accepted while still inside.
        assert_eq!(window.check(8), Err(ReplayError::Replayed));
        assert_eq!(window.check(20), Ok(()));
        window.accept(1000);
        assert_eq!(window.check(999), Ok(()));
        assert_eq!(window.check(40), Err(ReplayError::Replayed));
    }

    #[test]
    fn a_lost_window_waits_for_an_echo() {
        let mut window = ReplayWindow::unknown(32);
        assert!(window.is_unknown());
        assert_eq!(window.check(7), Err(ReplayError::Unknown));
        window.initialize(7);
        assert_eq!(window.check(7), Err(ReplayError::Replayed));
        assert_eq!(window.check(6), Err(ReplayError::Replayed));
        assert_eq!(window.check(8), Ok(()));
    }
}

//! Sender sequence numbers that survive a restart (RFC 8613 §7.5.1): before a number
//! is used, a limit beyond it is written to `sequence.json` (write-ahead, a stride at
//! a time), and a restarted process starts at that limit, so no nonce is used twice.
//! The file is aiocoap's: `{"next-to-send": N, "received": "unknown"}` (Cobalt does
//! not persist replay windows; after a restart they recover with an Echo).

use crate::context::SEQUENCE_LIMIT;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The file name in a context directory.
pub const SEQUENCE_FILE: &str = "sequence.json";

/// How many sequence numbers are reserved by the first write by default.
pub const DEFAULT_STRIDE: u64 = 64;

/// The most sequence numbers one write reserves: the stride doubles with each write
/// up to this (as aiocoap's chunks do), so that a busy context writes (and syncs) its
/// file rarely, while a restart skips at most this many numbers.
pub const MAX_STRIDE: u64 = 4096;

/// Why a sequence number cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum SequenceError {
    /// All 2^40 sequence numbers of this context were used: it needs new material.
    #[error("the sender sequence numbers of this context are used up; derive a new context")]
    Exhausted,
    /// The write-ahead to the sequence file failed: sending would risk reusing a nonce
    /// after a restart.
    #[error("cannot persist the sender sequence number to {path}: {source}; check that the directory is writable")]
    Persist {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The sequence file exists but is not understood.
    #[error(
        "{path} is not a sequence file ({reason}); remove it only if this context was never used"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The sender sequence of one context: the next number and, when persisted, the file
/// and the limit written to it.
#[derive(Debug)]
pub struct SenderSequence {
    next: u64,
    /// Numbers below this may be used without writing (the file says to start here).
    reserved: u64,
    stride: u64,
    file: Option<PathBuf>,
}

/// The content of a sequence file.
#[derive(serde::Serialize, serde::Deserialize)]
struct Persisted {
    #[serde(rename = "next-to-send")]
    next_to_send: u64,
    #[serde(default)]
    received: Option<serde_json::Value>,
}

impl SenderSequence {
    /// A sequence kept in memory only, starting at `next` (for tests and contexts whose
    /// material is never reused after a restart).
    pub fn in_memory(next: u64) -> SenderSequence {
        SenderSequence {
            next,
            reserved: SEQUENCE_LIMIT,
            stride: 0,
            file: None,
        }
    }

    /// The sequence persisted in `dir/sequence.json`, reserving `stride` numbers (at
    /// least 1) with the first write and twice as many with each next one, up to
    /// [`MAX_STRIDE`]; the flag says whether the file existed (then the peer's
    /// replay window state is unknown: the context was used before). A missing file
    /// is written at once, so that the next load knows the context was used even if
    /// this process never sends a number of its own (a server that answers with its
    /// clients' nonces).
    pub fn load(dir: &Path, stride: u64) -> Result<(SenderSequence, bool), SequenceError> {
        let path = dir.join(SEQUENCE_FILE);
        let (next, existed) = match std::fs::read(&path) {
            Ok(bytes) => {
                let persisted: Persisted =
                    serde_json::from_slice(&bytes).map_err(|e| SequenceError::Corrupt {
                        path: path.clone(),
                        reason: e.to_string(),
                    })?;
                (persisted.next_to_send, true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                write_atomically(&path, 0).map_err(|source| SequenceError::Persist {
                    path: path.clone(),
                    source,
                })?;
                (0, false)
            }
            Err(source) => return Err(SequenceError::Persist { path, source }),
        };
        let sequence = SenderSequence {
            next,
            reserved: next,
            stride: stride.max(1),
            file: Some(path),
        };
        Ok((sequence, existed))
    }

    /// The next sequence number to use, written ahead to the file when it passes what
    /// was reserved.
    pub fn take(&mut self) -> Result<u64, SequenceError> {
        let seq = self.next;
        if seq >= SEQUENCE_LIMIT {
            return Err(SequenceError::Exhausted);
        }
        if seq >= self.reserved {
            let reserve = (seq + self.stride).min(SEQUENCE_LIMIT);
            if let Some(path) = &self.file {
                write_atomically(path, reserve).map_err(|source| SequenceError::Persist {
                    path: path.clone(),
                    source,
                })?;
            }
            self.reserved = reserve;
            self.stride = (self.stride * 2).min(MAX_STRIDE.max(self.stride));
        }
        self.next = seq + 1;
        Ok(seq)
    }

    /// The next number [`SenderSequence::take`] returns.
    pub fn peek(&self) -> u64 {
        self.next
    }
}

/// Writes `next_to_send` to `path` through a temporary file, synced and renamed.
fn write_atomically(path: &Path, next_to_send: u64) -> std::io::Result<()> {
    let persisted = Persisted {
        next_to_send,
        received: Some(serde_json::Value::from("unknown")),
    };
    let json = serde_json::to_vec(&persisted).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("json.tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(&json)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cobalt-oscore-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_restart_never_reuses_a_number() {
        let dir = dir("restart");
        let (mut first, existed) = SenderSequence::load(&dir, 10).unwrap();
        assert!(!existed);
        assert!(
            dir.join(SEQUENCE_FILE).exists(),
            "the next load knows it was used"
        );
        let used: Vec<u64> = (0..13).map(|_| first.take().unwrap()).collect();
        assert_eq!(used, (0..13).collect::<Vec<_>>());
        // Crash: the file says where to go on, past everything used.
        drop(first);
        let (mut second, existed) = SenderSequence::load(&dir, 10).unwrap();
        assert!(existed);
        let next = second.take().unwrap();
        assert!(next >= 13, "{next} was used before the restart");
        // Reserved: 10 (stride 10), then 10 + 20 = 30 when 10 was taken.
        assert_eq!(next, 30);
        // aiocoap reads the same file: 30 + 10 reserved after the restart.
        let text = std::fs::read_to_string(dir.join(SEQUENCE_FILE)).unwrap();
        assert!(text.contains("\"next-to-send\":40"), "{text}");
        // The stride doubles up to MAX_STRIDE: 40 + 20 after 40 is taken.
        for _ in 31..=40 {
            second.take().unwrap();
        }
        let text = std::fs::read_to_string(dir.join(SEQUENCE_FILE)).unwrap();
        assert!(text.contains("\"next-to-send\":60"), "{text}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn corrupt_file_and_exhaustion_are_errors() {
        let dir = dir("corrupt");
        std::fs::write(dir.join(SEQUENCE_FILE), b"{").unwrap();
        assert!(matches!(
            SenderSequence::load(&dir, 10),
            Err(SequenceError::Corrupt { .. })
        ));
        let mut last = SenderSequence::in_memory(SEQUENCE_LIMIT - 1);
        assert_eq!(last.take().unwrap(), SEQUENCE_LIMIT - 1);
        assert!(matches!(last.take(), Err(SequenceError::Exhausted)));
        std::fs::remove_dir_all(dir).unwrap();
    }
}

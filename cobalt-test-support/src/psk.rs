//! The pre-shared key the tests use, and a keys file (`IDENTITY:KEY` lines, the
//! format of `cobalt serve --psk-file`) holding it.

use crate::temp::TempDir;
use std::path::PathBuf;

/// The PSK identity.
pub const IDENTITY: &str = "alice";
/// The key (as text).
pub const KEY: &str = "secretPSK";

/// Writes `keys.txt` with `IDENTITY:KEY` into `dir`; returns its path.
pub fn keys_file(dir: &TempDir) -> PathBuf {
    dir.write("keys.txt", format!("{IDENTITY}:{KEY}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keys_file_holds_the_identity_and_key() {
        let dir = TempDir::new("psk");
        let text = std::fs::read_to_string(keys_file(&dir)).unwrap();
        assert_eq!(text, "alice:secretPSK\n");
    }
}

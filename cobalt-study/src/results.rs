//! What one run produced, and the results file: one JSON object per line, appended as
//! runs finish, so an interrupted study resumes where it stopped.

use crate::case::Case;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::fs::OpenOptions;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};

/// Per-direction link counters of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkCounters {
    /// Packets offered.
    pub packets: u64,
    /// Dropped by the full queue.
    pub drops_queue: u64,
    /// Dropped by the loss process.
    pub drops_loss: u64,
    /// Most bytes queued.
    pub peak_queue: u64,
}

/// The outcome of one [`Case`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// The case.
    pub case: Case,
    /// Its key.
    pub key: String,
    /// The seed used.
    pub seed: u64,
    /// Flow completion time of each client that finished, seconds.
    pub fct: Vec<f64>,
    /// Clients that did not finish within the run's limit.
    pub unfinished: usize,
    /// Retransmissions per client (CoAP requests over UDP; TCP data segments).
    pub retransmissions: Vec<u64>,
    /// Unnecessary retransmissions per client (see [`crate::retx`]).
    pub unnecessary: Vec<u64>,
    /// TCP SYN and SYN-ACK retransmissions per client.
    pub handshake_retransmissions: Vec<u64>,
    /// Exchanges that timed out (after MAX_RETRANSMIT) and were repeated.
    pub failures: u64,
    /// Link counters, client to server.
    pub up: LinkCounters,
    /// Link counters, server to client.
    pub down: LinkCounters,
    /// Wall-clock seconds the run took.
    pub wall_s: f64,
    /// Seconds of (virtual or real) time the run covered.
    pub span_s: f64,
}

/// Keys of the runs already in `path` (none if it does not exist).
pub fn done_keys(path: &Path) -> io::Result<HashSet<String>> {
    Ok(load(path)?.into_iter().map(|r| r.key).collect())
}

/// `path` with `.gz` appended: where [`compress`] keeps a results file.
pub fn compressed(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".gz");
    PathBuf::from(name)
}

/// Every result in `path`, or in its [`compressed`] copy where `path` does not exist;
/// lines that do not parse (a run cut off while writing) are skipped.
pub fn load(path: &Path) -> io::Result<Vec<RunResult>> {
    let reader: Box<dyn BufRead> = match std::fs::File::open(path) {
        Ok(f) => Box::new(io::BufReader::new(f)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            match std::fs::File::open(compressed(path)) {
                Ok(f) => Box::new(io::BufReader::new(GzDecoder::new(f))),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(e),
            }
        }
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for line in reader.lines() {
        if let Ok(r) = serde_json::from_str::<RunResult>(&line?) {
            out.push(r);
        }
    }
    Ok(out)
}

/// Writes the [`compressed`] copy of `path` (for results too large to keep as text).
pub fn compress(path: &Path) -> io::Result<PathBuf> {
    let to = compressed(path);
    let mut input = io::BufReader::new(std::fs::File::open(path)?);
    let mut gz = GzEncoder::new(std::fs::File::create(&to)?, Compression::best());
    io::copy(&mut input, &mut gz)?;
    gz.finish()?.sync_all()?;
    Ok(to)
}

/// Appends one result as a line and flushes it to disk.
pub fn append(path: &Path, result: &RunResult) -> io::Result<()> {
    let mut f = OpenOptions::new().create(true).append(true).open(path)?;
    let mut line = serde_json::to_string(result).map_err(io::Error::other)?;
    line.push('\n');
    f.write_all(line.as_bytes())?;
    f.sync_data()
}

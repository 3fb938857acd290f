//! Byte streams for the simulator: what happens to the bytes of a stream node's
//! connections (RFC 8323) between two nodes.
//!
//! A stream is reliable and in order, but not message-preserving: every write is cut
//! into chunks of random sizes, each delayed at random (never overtaking the one
//! before), and a read takes every chunk that has arrived, so one read may carry
//! pieces of several writes and one write may take several reads. A close arrives
//! after the bytes written before it; a reset drops what is in flight and ends both
//! directions at once.

use super::link::Nanos;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;

/// How the [`Streams`] cut and delay bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamConfig {
    /// Chunks are 1 to this many bytes long.
    pub max_chunk: usize,
    /// Each chunk is delayed by at least this many milliseconds…
    pub min_delay_ms: u64,
    /// …and at most this many (never overtaking the chunk before it).
    pub max_delay_ms: u64,
}

impl Default for StreamConfig {
    /// Chunks of up to 64 bytes, 1 to 50 ms.
    fn default() -> StreamConfig {
        StreamConfig {
            max_chunk: 64,
            min_delay_ms: 1,
            max_delay_ms: 50,
        }
    }
}

/// What a read of a stream yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// The stream's writer.
    pub from: SocketAddr,
    /// Its reader.
    pub to: SocketAddr,
    /// The bytes that arrived (possibly none, when only the end did).
    pub bytes: Vec<u8>,
    /// The stream ended after them.
    pub eof: bool,
}

#[derive(Debug)]
enum Chunk {
    Data(Vec<u8>),
    End,
}

/// One direction of a stream.
#[derive(Debug, Default)]
struct Pipe {
    chunks: VecDeque<(Nanos, Chunk)>,
    /// When the last chunk arrives (the next cannot arrive before).
    last: Nanos,
    /// Closed by its writer: nothing more is written.
    closed: bool,
}

/// The streams between the simulation's nodes, one per (writer, reader) pair.
#[derive(Debug)]
pub struct Streams {
    cfg: StreamConfig,
    rng: StdRng,
    pipes: BTreeMap<(SocketAddr, SocketAddr), Pipe>,
}

impl Streams {
    /// No streams yet; randomness follows from `seed`.
    pub fn new(cfg: StreamConfig, seed: u64) -> Streams {
        Streams {
            cfg,
            rng: StdRng::seed_from_u64(seed),
            pipes: BTreeMap::new(),
        }
    }

    /// How bytes are cut and delayed from now on.
    pub fn set_config(&mut self, cfg: StreamConfig) {
        self.cfg = cfg;
    }

    /// Streams with bytes or an end still on their way, or open.
    pub fn len(&self) -> usize {
        self.pipes.len()
    }

    /// True when no stream is open or in flight.
    pub fn is_empty(&self) -> bool {
        self.pipes.is_empty()
    }

    fn delay(&mut self) -> Nanos {
        let lo = self.cfg.min_delay_ms;
        let hi = self.cfg.max_delay_ms.max(lo);
        self.rng.random_range(lo..=hi) * 1_000_000
    }

    /// Opens the streams both ways between `a` and `b`, dropping any earlier ones.
    pub fn open(&mut self, a: SocketAddr, b: SocketAddr) {
        self.pipes.insert((a, b), Pipe::default());
        self.pipes.insert((b, a), Pipe::default());
    }

    /// `from` writes `bytes` to `to` at `now` (dropped when no stream is open).
    pub fn write(&mut self, now: Nanos, from: SocketAddr, to: SocketAddr, bytes: &[u8]) {
        let mut rest = bytes;
        while !rest.is_empty() {
            let len = self
                .rng
                .random_range(1..=self.cfg.max_chunk.max(1))
                .min(rest.len());
            let (chunk, tail) = rest.split_at(len);
            rest = tail;
            let delay = self.delay();
            let Some(pipe) = self.pipes.get_mut(&(from, to)).filter(|p| !p.closed) else {
                return;
            };
            pipe.last = pipe.last.max(now + delay);
            pipe.chunks
                .push_back((pipe.last, Chunk::Data(chunk.to_vec())));
        }
    }

    /// `from` closes its stream to `to` at `now`: the end arrives after the bytes.
    pub fn close(&mut self, now: Nanos, from: SocketAddr, to: SocketAddr) {
        let delay = self.delay();
        if let Some(pipe) = self.pipes.get_mut(&(from, to)).filter(|p| !p.closed) {
            pipe.closed = true;
            pipe.last = pipe.last.max(now + delay);
            pipe.chunks.push_back((pipe.last, Chunk::End));
        }
    }

    /// Ends the stream from `from` to `to` after a delay without its ever having been
    /// open (a refused connection).
    pub fn refuse(&mut self, now: Nanos, from: SocketAddr, to: SocketAddr) {
        self.pipes.insert((from, to), Pipe::default());
        self.close(now, from, to);
    }

    /// Resets the streams between `a` and `b` at `now`: what is in flight is lost
    /// and both ends read the end at once.
    pub fn reset(&mut self, now: Nanos, a: SocketAddr, b: SocketAddr) {
        for key in [(a, b), (b, a)] {
            if let Some(pipe) = self.pipes.get_mut(&key) {
                pipe.chunks.clear();
                pipe.chunks.push_back((now, Chunk::End));
                pipe.closed = true;
                pipe.last = now;
            }
        }
    }

    /// When something arrives next.
    pub fn next_event(&self) -> Option<Nanos> {
        self.pipes
            .values()
            .filter_map(|p| p.chunks.front().map(|c| c.0))
            .min()
    }

    /// Every stream's arrivals up to `now`, one read per stream (in writer, reader
    /// order); a stream whose end was read is gone.
    pub fn poll(&mut self, now: Nanos, out: &mut Vec<Read>) {
        for (&(from, to), pipe) in self.pipes.iter_mut() {
            let mut read = Read {
                from,
                to,
                bytes: Vec::new(),
                eof: false,
            };
            while pipe.chunks.front().is_some_and(|c| c.0 <= now) {
                match pipe.chunks.pop_front().map(|c| c.1) {
                    Some(Chunk::Data(bytes)) => read.bytes.extend_from_slice(&bytes),
                    Some(Chunk::End) => read.eof = true,
                    None => break,
                }
            }
            if !read.bytes.is_empty() || read.eof {
                out.push(read);
            }
        }
        self.pipes.retain(|_, p| !(p.closed && p.chunks.is_empty()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn writes_are_cut_delayed_in_order_and_coalesced() {
        let (a, b) = (addr("10.0.0.1:1"), addr("10.0.0.2:2"));
        let cfg = StreamConfig {
            max_chunk: 7,
            min_delay_ms: 1,
            max_delay_ms: 40,
        };
        let mut s = Streams::new(cfg, 3);
        s.open(a, b);
        // 40 writes of 25 bytes, 5 ms apart.
        let sent: Vec<u8> = (0..1000).map(|i| (i % 251) as u8).collect();
        let writes: Vec<usize> = (1..40).map(|w| w * 25).collect();
        for (i, w) in sent.chunks(25).enumerate() {
            s.write(i as u64 * 5_000_000, a, b, w);
        }
        s.close(200_000_000, a, b);
        let (mut got, mut reads, mut eof, mut at) = (Vec::new(), Vec::new(), false, 0);
        let mut out = Vec::new();
        while let Some(t) = s.next_event() {
            assert!(t >= at, "time runs forward");
            at = t;
            s.poll(t, &mut out);
            for r in out.drain(..) {
                assert!(!eof, "nothing after the end");
                assert_eq!((r.from, r.to), (a, b));
                got.extend_from_slice(&r.bytes);
                reads.push(got.len());
                eof = r.eof;
            }
        }
        assert_eq!(got, sent, "reliable and in order");
        assert!(eof);
        assert_eq!(s.len(), 1, "only b's direction is left, open");
        // Some write took several reads, and some read carried parts of several writes.
        let split = reads.iter().any(|r| !writes.contains(r) && *r < 1000);
        let coalesced = reads
            .windows(2)
            .any(|w| writes.iter().any(|x| w[0] < *x && *x < w[1]));
        assert!(split && coalesced, "reads end at {reads:?}");
    }

    #[test]
    fn a_reset_drops_what_is_in_flight_and_ends_both_ways() {
        let (a, b) = (addr("10.0.0.1:1"), addr("10.0.0.2:2"));
        let mut s = Streams::new(StreamConfig::default(), 1);
        s.open(a, b);
        s.write(0, a, b, b"lost");
        s.reset(1, a, b);
        s.write(2, b, a, b"too late");
        let mut out = Vec::new();
        s.poll(5, &mut out);
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|r| r.eof && r.bytes.is_empty()));
        assert!(s.is_empty());
    }
}

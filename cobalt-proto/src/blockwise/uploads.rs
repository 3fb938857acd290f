//! Block1 uploads (RFC 7959 §2.5): bodies arriving block by block are reassembled
//! per peer and resource, in order, within a size limit, before the handler runs once
//! with the whole body. Q-Block1 uploads (RFC 9177, [`Uploads::handle_qblock1`]) are
//! reassembled in any order by a [`QBlock1Body`] each and count in the same budgets. Over CoAP over TCP and WebSockets the blocks may be BERT
//! blocks (RFC 8323 §6) when the server announced BERT; they are checked the same way
//! (a non-final BERT block must be a multiple of 1024 bytes, every block must start
//! where the body received so far ends).

//!
//! The same table serves a datagram shard and the connections of a stream listener:
//! it is fed requests with an explicit `now` and answers with messages whose type and
//! message ID are the caller's to set.

use super::qblock::{self, QBlock1Body, QBlockError, Received, MAX_PAYLOADS};
use super::{check_block, BlockError, BERT_SZX};
use crate::address::{AddressKey, AddressPrefix};
use crate::budget::{fair_share_exceeded, Refusal};
use crate::message::{opt, BlockValue, Code, Message, MessageType};
use crate::settings::{within, Param, Settings};
use crate::tables::shrink_when_sparse;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The bounds of an [`Uploads`] table; the allowed values are those of
/// [`UploadLimits::params`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields, default)
)]
pub struct UploadLimits {
    /// Largest body reassembled; larger uploads get 4.13 with Size1.
    pub max_body: usize,
    /// Uploads in progress in the table; near it, peers holding at least what is still
    /// free get 5.03.
    pub max_uploads: usize,
    /// Uploads one client IP address (IPv6: one prefix, see [`crate::address`]) may
    /// hold; beyond it 4.29.
    pub max_uploads_per_ip: usize,
    /// Uploads one client address and port may hold; beyond it 4.29.
    pub max_uploads_per_peer: usize,
    /// Bytes the uploads and kept answers may hold together; near it, peers holding at
    /// least what is still free get 5.03.
    pub max_upload_memory: usize,
    /// Bytes the uploads and kept answers of one IP address (IPv6: one prefix) may
    /// hold; beyond it 4.29.
    pub max_upload_memory_per_ip: usize,
    /// An upload without a block for this long is dropped.
    #[cfg_attr(feature = "serde", serde(with = "crate::settings::duration"))]
    pub upload_idle_timeout: Duration,
    /// Max-Age (seconds) of the 4.29 and 5.03 answers.
    pub refusal_max_age: u32,
}

impl Default for UploadLimits {
    /// 1 MiB bodies; 1,000 uploads, 32 per IP address and 4 per address and port;
    /// 64 MiB in all and 4 MiB per IP address; 60 s idle; Max-Age 10 s.
    fn default() -> Self {
        UploadLimits {
            max_body: 1 << 20,
            max_uploads: 1000,
            max_uploads_per_ip: 32,
            max_uploads_per_peer: 4,
            max_upload_memory: 64 << 20,
            max_upload_memory_per_ip: 4 << 20,
            upload_idle_timeout: Duration::from_secs(60),
            refusal_max_age: 10,
        }
    }
}

impl Settings for UploadLimits {
    /// Every parameter with what it does and the values allowed, in file order.
    fn params(&self) -> Vec<Param> {
        let secs = Duration::from_secs;
        vec![
            Param::new("max_body", "Largest request body reassembled from Block1 blocks, in bytes; larger uploads get 4.13.", "1 to 1073741824", (1..=1 << 30).contains(&self.max_body)),
            Param::new("max_uploads", "Block1 uploads in progress per shard (UDP) or listener (TCP, TLS, WebSockets); near it, addresses holding at least what is still free get 5.03 with Max-Age, and at it the heaviest address's oldest upload makes room for an address holding less.", "0 or more", true),
            Param::new("max_uploads_per_ip", "Uploads in progress one client IP address (IPv6: prefix of endpoint.ipv6_budget_prefix) may hold per shard or listener; beyond it 4.29 with Max-Age.", "1 to 1000000", (1..=1_000_000).contains(&self.max_uploads_per_ip)),
            Param::new("max_uploads_per_peer", "Uploads in progress one client address and port may hold per shard or listener; beyond it 4.29 with Max-Age.", "1 to max_uploads_per_ip", (1..=self.max_uploads_per_ip).contains(&self.max_uploads_per_peer)),
            Param::new("max_upload_memory", "Bytes the uploads in progress (and answers kept for their Block2 follow-ups) of one shard or listener may hold together; near it, addresses holding at least what is still free get 5.03 with Max-Age.", "1024 to 68719476736", (1024..=64 << 30).contains(&self.max_upload_memory)),
            Param::new("max_upload_memory_per_ip", "Bytes the uploads in progress of one client IP address (IPv6: prefix of endpoint.ipv6_budget_prefix) may hold per shard or listener; beyond it 4.29 with Max-Age.", "max_body to max_upload_memory", (self.max_body..=self.max_upload_memory).contains(&self.max_upload_memory_per_ip)),
            Param::new("upload_idle_timeout", "An upload that receives no block for this long is dropped, on a timer of its own (looked for every quarter of it); its next block gets 4.08.", "1s to 1h", within(self.upload_idle_timeout, secs(1), secs(3600))),
            Param::new("refusal_max_age", "Max-Age (seconds) of the 4.29 and 5.03 answers given when a bound of this section is reached.", "0 to 86400", self.refusal_max_age <= 86_400),
        ]
    }
}

/// Where an [`Uploads`] table counts what it refuses and drops (for metrics).
pub trait UploadCounters: Send + Sync + std::fmt::Debug {
    /// An upload, or a block of one, was refused.
    fn refused(&self, refusal: Refusal);
    /// `n` uploads were dropped after the idle timeout.
    fn expired(&self, n: u64);
    /// An upload was dropped at a bound to make room for an address holding less.
    fn evicted(&self);
}

/// What to do with a request that carries Block1.
#[derive(Debug)]
pub enum UploadStep {
    /// More blocks expected: answer with this (2.31 Continue) now.
    Continue(Message),
    /// The upload cannot go on: answer with this (4.08, 4.13, 4.29, 5.03).
    Reject(Message),
    /// The last block arrived: run the handler with this body; echo `last` in Block1
    /// (Q-Block1 for a Q-Block1 upload).
    Complete {
        /// The whole body.
        body: Vec<u8>,
        /// The last block, echoed in Block1 of the answer.
        last: BlockValue,
    },
}

/// An upload (or kept answer) is identified by the peer and [`upload_key`].
type Key = (SocketAddr, Vec<u8>);

#[derive(Debug)]
struct Upload {
    body: Vec<u8>,
    szx: u8,
    touched: Instant,
}

/// A streamed upload: only the next expected offset is kept, never the body.
#[derive(Debug)]
struct Streamed {
    next: usize,
    touched: Instant,
}

/// A Q-Block1 upload (RFC 9177): blocks in any order, holes asked for again.
#[derive(Debug)]
struct QUpload {
    body: QBlock1Body,
    /// Bytes of the body counted in the ledger.
    counted: usize,
}

/// What [`Uploads::qblock1_missing`] says about a Q-Block1 upload.
#[derive(Debug, PartialEq)]
pub enum MissingBlocks {
    /// Nothing to ask for yet (or nothing is missing): keep waiting.
    NotYet,
    /// Blocks are missing and nothing arrived for NON_RECEIVE_TIMEOUT: answer the
    /// latest block's request with this 4.08 listing them.
    Ask(Message),
    /// The upload is gone (completed, refused, expired, evicted): nothing will be
    /// answered for it.
    Gone,
}

/// What one address (or one address and port) holds.
#[derive(Debug, Default, Clone, Copy)]
struct Holding {
    uploads: usize,
    bytes: usize,
}

/// Who holds how much: per address key (IPv4 address or IPv6 prefix), per address and
/// port, and in total.
#[derive(Debug, Default)]
struct Ledger {
    /// How IPv6 addresses are counted.
    prefix: AddressPrefix,
    per_ip: HashMap<AddressKey, Holding>,
    per_peer: HashMap<SocketAddr, usize>,
    total: Holding,
}

impl Ledger {
    fn key(&self, peer: SocketAddr) -> AddressKey {
        AddressKey::of(peer.ip(), self.prefix)
    }

    fn ip(&self, key: AddressKey) -> Holding {
        self.per_ip.get(&key).copied().unwrap_or_default()
    }

    fn peer(&self, peer: SocketAddr) -> usize {
        self.per_peer.get(&peer).copied().unwrap_or(0)
    }

    /// Adds (or, negative, gives back) uploads and bytes of `peer`.
    fn add(&mut self, peer: SocketAddr, uploads: isize, bytes: isize) {
        let apply = |v: &mut usize, d: isize| *v = v.saturating_add_signed(d);
        let key = self.key(peer);
        let h = self.per_ip.entry(key).or_default();
        apply(&mut h.uploads, uploads);
        apply(&mut h.bytes, bytes);
        if h.uploads == 0 && h.bytes == 0 {
            self.per_ip.remove(&key);
            shrink_when_sparse(&mut self.per_ip);
        }
        if uploads != 0 {
            let n = self.per_peer.entry(peer).or_default();
            apply(n, uploads);
            if *n == 0 {
                self.per_peer.remove(&peer);
                shrink_when_sparse(&mut self.per_peer);
            }
        }
        apply(&mut self.total.uploads, uploads);
        apply(&mut self.total.bytes, bytes);
    }

    /// The address holding the most uploads (`by_bytes`: bytes).
    fn heaviest(&self, by_bytes: bool) -> Option<(AddressKey, usize)> {
        self.per_ip
            .iter()
            .map(|(ip, h)| (*ip, if by_bytes { h.bytes } else { h.uploads }))
            .max_by_key(|(_, n)| *n)
    }
}

/// Uploads held now, for the metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UploadStats {
    /// Uploads in progress.
    pub uploads: usize,
    /// Bytes held by them and by kept answers.
    pub bytes: usize,
}

/// Uploads in progress in one shard (or one TCP or WebSocket listener, shared by its
/// connections), and the responses of finished uploads whose later Block2 blocks the
/// client may still ask for.
///
/// Bounded per client address and port, per IP address and in total, in uploads and
/// in bytes ([`UploadLimits`]): a peer over its own budget gets 4.29, and near a
/// total bound the peers holding at least what is still free get 5.03 — or, at the
/// bound itself, the heaviest address's oldest upload is dropped to make room for a
/// peer that holds less. Uploads idle for `upload_idle_timeout` are dropped by
/// [`Uploads::expire`], which the owner calls on a timer ([`Uploads::poll_timeout`]).
#[derive(Debug)]
pub struct Uploads {
    map: HashMap<Key, Upload>,
    /// After an upload the client asks for the rest of a large response with Block2
    /// requests that carry no body (RFC 7959 §3.3); those must not run the handler
    /// again, so the whole response is kept for them.
    answers: HashMap<Key, (Instant, Message)>,
    /// Streamed uploads.
    streams: HashMap<Key, Streamed>,
    /// Q-Block1 uploads (RFC 9177), counted with the others.
    qblocks: HashMap<Key, QUpload>,
    ledger: Ledger,
    bounds: UploadLimits,
    /// BERT blocks (SZX 7) are accepted (the server announced BERT in its CSM).
    bert: bool,
    counters: Arc<dyn UploadCounters>,
    /// When idle uploads are looked for next (while any are held).
    next_sweep: Option<Instant>,
}

impl Uploads {
    /// No uploads yet, within `limits`; refusals, expiries and evictions are counted
    /// in `counters`.
    pub fn new(limits: UploadLimits, counters: Arc<dyn UploadCounters>) -> Uploads {
        Uploads {
            map: HashMap::new(),
            answers: HashMap::new(),
            streams: HashMap::new(),
            qblocks: HashMap::new(),
            ledger: Ledger::default(),
            bounds: limits,
            bert: false,
            counters,
            next_sweep: None,
        }
    }

    /// Accepts BERT blocks (RFC 8323 §6) too: for a CoAP-over-TCP or -WebSocket
    /// listener that announces Block-Wise-Transfer.
    pub fn with_bert(mut self, bert: bool) -> Uploads {
        self.bert = bert;
        self
    }

    /// Counts IPv6 peers by `prefix` (default /64; [`crate::address`]) in the
    /// per-address budgets. Set it before the first upload.
    pub fn with_address_prefix(mut self, prefix: AddressPrefix) -> Uploads {
        self.ledger.prefix = prefix;
        self
    }

    /// Whether BERT blocks (SZX 7) are accepted.
    pub fn bert(&self) -> bool {
        self.bert
    }

    /// Forgets the uploads and kept answers of `peer` (its connection closed).
    pub fn forget_peer(&mut self, peer: SocketAddr) {
        let keys: Vec<Key> = self
            .map
            .keys()
            .chain(self.streams.keys())
            .chain(self.qblocks.keys())
            .chain(self.answers.keys())
            .filter(|(p, _)| *p == peer)
            .cloned()
            .collect();
        for k in keys {
            self.drop_key(&k);
        }
    }

    /// Uploads held now.
    pub fn stats(&self) -> UploadStats {
        UploadStats {
            uploads: self.ledger.total.uploads,
            bytes: self.ledger.total.bytes,
        }
    }

    /// Number of uploads in progress (reassembled or streamed).
    pub fn in_progress(&self) -> usize {
        self.map.len() + self.streams.len() + self.qblocks.len()
    }

    /// When [`Uploads::expire`] has something to look at.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_sweep
    }

    /// Drops uploads and kept answers idle for `upload_idle_timeout` (looked for every
    /// quarter of it, so one goes between 1 and 1.25 times the timeout after its last
    /// block).
    pub fn expire(&mut self, now: Instant) {
        if self.next_sweep.is_none_or(|t| t > now) {
            return;
        }
        let timeout = self.bounds.upload_idle_timeout;
        let idle = |t: Instant| now.saturating_duration_since(t) >= timeout;
        let stale: Vec<Key> = self
            .map
            .iter()
            .filter(|(_, u)| idle(u.touched))
            .map(|(k, _)| k.clone())
            .chain(
                self.streams
                    .iter()
                    .filter(|(_, s)| idle(s.touched))
                    .map(|(k, _)| k.clone()),
            )
            .chain(
                self.qblocks
                    .iter()
                    .filter(|(_, q)| idle(q.body.last_arrival()))
                    .map(|(k, _)| k.clone()),
            )
            .collect();
        if !stale.is_empty() {
            self.counters.expired(stale.len() as u64);
        }
        let old_answers: Vec<Key> = self
            .answers
            .iter()
            .filter(|(_, (t, _))| idle(*t))
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale.iter().chain(&old_answers) {
            self.drop_key(k);
        }
        self.next_sweep = None;
        self.schedule_sweep(now);
    }

    /// Sets the next sweep if something is held and none is set.
    fn schedule_sweep(&mut self, now: Instant) {
        let held = !(self.map.is_empty()
            && self.streams.is_empty()
            && self.qblocks.is_empty()
            && self.answers.is_empty());
        if !held {
            self.next_sweep = None;
        } else if self.next_sweep.is_none() {
            let every = (self.bounds.upload_idle_timeout / 4).max(Duration::from_millis(10));
            self.next_sweep = Some(now + every);
        }
    }

    /// Removes whatever is held under `key` (upload, streamed upload, kept answer).
    fn drop_key(&mut self, key: &Key) {
        if let Some(u) = self.map.remove(key) {
            self.ledger.add(key.0, -1, -(u.body.len() as isize));
            shrink_when_sparse(&mut self.map);
        }
        if self.streams.remove(key).is_some() {
            self.ledger.add(key.0, -1, 0);
            shrink_when_sparse(&mut self.streams);
        }
        self.drop_qblock(key);
        self.drop_answer(key);
    }

    fn drop_qblock(&mut self, key: &Key) {
        if let Some(q) = self.qblocks.remove(key) {
            self.ledger.add(key.0, -1, -(q.counted as isize));
            shrink_when_sparse(&mut self.qblocks);
        }
    }

    fn drop_upload(&mut self, key: &Key) {
        if let Some(u) = self.map.remove(key) {
            self.ledger.add(key.0, -1, -(u.body.len() as isize));
            shrink_when_sparse(&mut self.map);
        }
    }

    fn drop_answer(&mut self, key: &Key) {
        if let Some((_, m)) = self.answers.remove(key) {
            self.ledger.add(key.0, 0, -(m.payload.len() as isize));
            shrink_when_sparse(&mut self.answers);
        }
    }

    /// Room for one more upload of `peer`: refused past its own budgets (4.29), or
    /// near the total bound while it holds at least what is free (5.03); at the bound
    /// itself a peer holding less than the heaviest address gets that address's
    /// oldest upload's place.
    fn admit(&mut self, peer: SocketAddr) -> Result<(), Refusal> {
        let b = self.bounds.clone();
        let key = self.ledger.key(peer);
        let mine = self.ledger.ip(key);
        let refusal = if self.ledger.peer(peer) >= b.max_uploads_per_peer
            || mine.uploads >= b.max_uploads_per_ip
        {
            Some(Refusal::PeerBudget)
        } else if fair_share_exceeded(mine.uploads, 1, self.ledger.total.uploads, b.max_uploads)
            && !(self.ledger.total.uploads >= b.max_uploads && self.evict(key, false))
        {
            Some(Refusal::ServerBound)
        } else {
            None
        };
        match refusal {
            Some(r) => {
                self.counters.refused(r);
                Err(r)
            }
            None => Ok(()),
        }
    }

    /// Room for `more` bytes of `peer`, like [`Uploads::admit`] for bytes.
    fn admit_bytes(&mut self, peer: SocketAddr, more: usize) -> Result<(), Refusal> {
        let b = self.bounds.clone();
        let key = self.ledger.key(peer);
        let mine = self.ledger.ip(key);
        if mine.bytes + more > b.max_upload_memory_per_ip {
            self.counters.refused(Refusal::PeerBudget);
            return Err(Refusal::PeerBudget);
        }
        let max = b.max_upload_memory;
        while fair_share_exceeded(mine.bytes, more, self.ledger.total.bytes, max) {
            // At the bound, heavier addresses make room; otherwise this one is heavy.
            if self.ledger.total.bytes + more <= max || !self.evict(key, true) {
                self.counters.refused(Refusal::ServerBound);
                return Err(Refusal::ServerBound);
            }
        }
        Ok(())
    }

    /// Drops the oldest upload (or kept answer, `by_bytes`) of the address holding
    /// the most, if that is more than `key` holds; true if one was dropped.
    fn evict(&mut self, key: AddressKey, by_bytes: bool) -> bool {
        let Some((heavy, held)) = self.ledger.heaviest(by_bytes) else {
            return false;
        };
        let mine = self.ledger.ip(key);
        if held <= if by_bytes { mine.bytes } else { mine.uploads } {
            return false;
        }
        let answers = self
            .answers
            .iter()
            .filter(|_| by_bytes)
            .map(|(k, (t, _))| (k, *t));
        let oldest = self
            .map
            .iter()
            .map(|(k, u)| (k, u.touched))
            .chain(self.streams.iter().map(|(k, s)| (k, s.touched)))
            .chain(self.qblocks.iter().map(|(k, q)| (k, q.body.last_arrival())))
            .chain(answers)
            .filter(|(k, _)| self.ledger.key(k.0) == heavy)
            .min_by_key(|(_, t)| *t)
            .map(|(k, _)| k.clone());
        let Some(key) = oldest else {
            return false;
        };
        self.drop_key(&key);
        self.counters.evicted();
        true
    }

    fn refused(&self, r: Refusal) -> Message {
        r.answer("uploads", self.bounds.refusal_max_age)
    }

    /// Feeds one request carrying `block`.
    pub fn handle(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        req: &Message,
        block: BlockValue,
    ) -> UploadStep {
        if let Some(size1) = req.options.get_uint(opt::SIZE1) {
            if size1 as usize > self.bounds.max_body {
                return UploadStep::Reject(self.too_large());
            }
        }
        if block.szx == BERT_SZX && !self.bert {
            return UploadStep::Reject(bert_refused());
        }
        let key = (peer, upload_key(req));
        if block.num == 0 {
            if !block.more {
                return UploadStep::Complete {
                    body: req.payload.clone(),
                    last: block,
                };
            }
            // Starting again replaces an upload with the same key.
            self.drop_upload(&key);
            if let Err(r) = self.admit(peer) {
                return UploadStep::Reject(self.refused(r));
            }
            self.map.insert(
                key.clone(),
                Upload {
                    body: Vec::new(),
                    szx: block.szx,
                    touched: now,
                },
            );
            self.ledger.add(peer, 1, 0);
            self.schedule_sweep(now);
        }
        let Some(up) = self.map.get_mut(&key) else {
            return UploadStep::Reject(incomplete(
                "no upload in progress for this block; start with block 0",
            ));
        };
        // Blocks must come in order and (except the last) be full-sized; a client may
        // lower the size during the transfer (§2.5), which renumbers the blocks.
        if block.szx > up.szx {
            self.drop_upload(&key);
            return UploadStep::Reject(incomplete("block of a larger size than before"));
        }
        if let Err(e) = check_block(block, req.payload.len(), up.body.len(), self.bert) {
            self.drop_upload(&key);
            return UploadStep::Reject(incomplete(&e.to_string()));
        }
        if up.body.len() + req.payload.len() > self.bounds.max_body {
            self.drop_upload(&key);
            return UploadStep::Reject(self.too_large());
        }
        if let Err(r) = self.admit_bytes(peer, req.payload.len()) {
            self.drop_upload(&key);
            return UploadStep::Reject(self.refused(r));
        }
        let Some(up) = self.map.get_mut(&key) else {
            // Evicted to make room for itself: only when it is its address's oldest.
            return UploadStep::Reject(incomplete("upload dropped to make room"));
        };
        up.body.extend_from_slice(&req.payload);
        up.szx = block.szx;
        up.touched = now;
        self.ledger.add(peer, 0, req.payload.len() as isize);
        if block.more {
            let ack = BlockValue {
                more: true,
                ..block
            };
            let mut cont = answer(Code::CONTINUE);
            cont.options.set_uint(opt::BLOCK1, ack.encode());
            return UploadStep::Continue(cont);
        }
        let body = match self.map.remove(&key) {
            Some(u) => {
                self.ledger.add(peer, -1, -(u.body.len() as isize));
                shrink_when_sparse(&mut self.map);
                u.body
            }
            None => Vec::new(),
        };
        UploadStep::Complete { body, last: block }
    }

    /// Feeds one request carrying Q-Block1 `block` (RFC 9177): blocks are held in
    /// whatever order they come, 2.31 (Continue) answers the block that completes a
    /// set of MAX_PAYLOADS, the body is complete once every block up to the final one
    /// is held. The upload counts against the same budgets as a Block1 upload.
    /// `None`: the block was held and its set is not complete, nothing to answer now
    /// ([`Uploads::qblock1_missing`] says later whether blocks must be asked for).
    pub fn handle_qblock1(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        req: &Message,
        block: BlockValue,
    ) -> Option<UploadStep> {
        if let Some(size1) = req.options.get_uint(opt::SIZE1) {
            if size1 as usize > self.bounds.max_body {
                return Some(UploadStep::Reject(self.too_large()));
            }
        }
        if block.szx == BERT_SZX {
            let mut m = answer(Code::BAD_REQUEST);
            m.payload = b"Q-Block1 with SZX 7: BERT is for reliable transports".to_vec();
            return Some(UploadStep::Reject(m));
        }
        let key = (peer, upload_key(req));
        if block.offset() + req.payload.len() > self.bounds.max_body {
            // Before any budget is asked: a block past the limit is 4.13, not 4.29.
            self.drop_qblock(&key);
            return Some(UploadStep::Reject(self.too_large()));
        }
        if !self.qblocks.contains_key(&key) {
            if block.num == 0 && !block.more {
                return Some(UploadStep::Complete {
                    body: req.payload.clone(),
                    last: block,
                });
            }
            if let Err(r) = self.admit(peer) {
                return Some(UploadStep::Reject(self.refused(r)));
            }
            let body = QBlock1Body::new(self.bounds.max_body, now);
            self.qblocks
                .insert(key.clone(), QUpload { body, counted: 0 });
            self.ledger.add(peer, 1, 0);
            self.schedule_sweep(now);
        }
        let growth = self.qblocks[&key].body.growth(block, req.payload.len());
        if growth > 0 {
            if let Err(r) = self.admit_bytes(peer, growth) {
                self.drop_qblock(&key);
                return Some(UploadStep::Reject(self.refused(r)));
            }
        }
        let Some(up) = self.qblocks.get_mut(&key) else {
            // Evicted to make room for itself: only when it is its address's oldest.
            return Some(UploadStep::Reject(incomplete(
                "upload dropped to make room",
            )));
        };
        let received = up.body.receive(now, block, &req.payload);
        let buffered = up.body.buffered();
        let delta = buffered as isize - up.counted as isize;
        up.counted = buffered;
        self.ledger.add(peer, 0, delta);
        match received {
            Err(QBlockError::TooLarge { .. }) => {
                self.drop_qblock(&key);
                Some(UploadStep::Reject(self.too_large()))
            }
            Err(e @ QBlockError::Inconsistent) => {
                self.drop_qblock(&key);
                let mut m = answer(Code::BAD_REQUEST);
                m.payload = e.to_string().into_bytes();
                Some(UploadStep::Reject(m))
            }
            Ok(Received::Held | Received::Duplicate) => None,
            Ok(Received::SetComplete(last)) => {
                Some(UploadStep::Continue(qblock::continue_response(last)))
            }
            Ok(Received::Complete(body)) => {
                self.drop_qblock(&key);
                // Echo the final block, whichever block completed the body.
                let n = body.len().saturating_sub(1) / block.size();
                let last = BlockValue::new(n as u32, false, block.szx).unwrap_or(block);
                Some(UploadStep::Complete { body, last })
            }
        }
    }

    /// When the Q-Block1 upload of `peer` under `key` ([`upload_key`]) is due to ask
    /// for its missing blocks ([`Uploads::qblock1_missing`]); `None` while nothing is
    /// missing or there is no such upload.
    pub fn qblock1_due(&self, peer: SocketAddr, key: &[u8]) -> Option<Instant> {
        self.qblocks.get(&(peer, key.to_vec()))?.body.missing_due()
    }

    /// Whether the Q-Block1 upload of `peer` under `key` ([`upload_key`]) waits for
    /// blocks that went missing: once nothing arrived for NON_RECEIVE_TIMEOUT, the
    /// 4.08 (Request Entity Incomplete) listing up to MAX_PAYLOADS of them in at most
    /// `max_payload` bytes.
    pub fn qblock1_missing(
        &self,
        now: Instant,
        peer: SocketAddr,
        key: &[u8],
        max_payload: usize,
    ) -> MissingBlocks {
        let Some(up) = self.qblocks.get(&(peer, key.to_vec())) else {
            return MissingBlocks::Gone;
        };
        match up.body.missing_due() {
            Some(due) if due <= now => {
                let missing = up.body.missing(MAX_PAYLOADS as usize);
                MissingBlocks::Ask(qblock::incomplete_response(&missing, max_payload))
            }
            _ => MissingBlocks::NotYet,
        }
    }

    /// Checks that a block of a streamed upload comes in order; returns its offset, or
    /// the answer that ends the upload (4.08 for a gap, 4.29 or 5.03 when the peer or
    /// the server has too many open).
    pub fn stream_block(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        req: &Message,
        block: BlockValue,
    ) -> Result<usize, Message> {
        if block.szx == BERT_SZX && !self.bert {
            return Err(bert_refused());
        }
        let key = (peer, upload_key(req));
        if block.num == 0 {
            if self.streams.remove(&key).is_some() {
                self.ledger.add(peer, -1, 0);
            }
            check_block(block, req.payload.len(), 0, self.bert)
                .map_err(|e| incomplete(&e.to_string()))?;
            if block.more {
                if let Err(r) = self.admit(peer) {
                    return Err(self.refused(r));
                }
                let next = req.payload.len();
                self.streams.insert(key, Streamed { next, touched: now });
                self.ledger.add(peer, 1, 0);
                self.schedule_sweep(now);
            }
            return Ok(0);
        }
        let Some(expected) = self.streams.get(&key).map(|s| s.next) else {
            return Err(incomplete(
                "no upload in progress for this block; start with block 0",
            ));
        };
        if let Err(e) = check_block(block, req.payload.len(), expected, self.bert) {
            self.drop_key(&key);
            return Err(incomplete(&e.to_string()));
        }
        if block.more {
            let next = block.offset() + req.payload.len();
            self.streams.insert(key, Streamed { next, touched: now });
        } else if self.streams.remove(&key).is_some() {
            self.ledger.add(peer, -1, 0);
            shrink_when_sparse(&mut self.streams);
        }
        Ok(block.offset())
    }

    /// Keeps the whole response of an upload that was answered in blocks, if the
    /// budgets have room (otherwise the client's follow-ups run the handler again).
    pub fn keep_answer(&mut self, now: Instant, peer: SocketAddr, key: Vec<u8>, response: Message) {
        let key = (peer, key);
        self.drop_answer(&key);
        let b = &self.bounds;
        let (mine, total) = (self.ledger.ip(self.ledger.key(peer)), self.ledger.total);
        let n = response.payload.len();
        if self.answers.len() >= b.max_uploads
            || mine.bytes + n > b.max_upload_memory_per_ip
            || fair_share_exceeded(mine.bytes, n, total.bytes, b.max_upload_memory)
        {
            return;
        }
        self.ledger.add(peer, 0, n as isize);
        self.answers.insert(key, (now, response));
        self.schedule_sweep(now);
    }

    /// The block a Block2 follow-up of an upload asks for, cut by `slice` from the
    /// kept response, if there is one; the response is forgotten once its last block
    /// has been sent.
    pub fn answer_for(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        req: &Message,
        slice: impl FnOnce(&Message, Message) -> Message,
    ) -> Option<Message> {
        req.block2().filter(|b| b.num > 0)?;
        if req.options.contains(opt::BLOCK1) || !req.payload.is_empty() {
            return None;
        }
        let key = (peer, upload_key(req));
        let (at, resp) = self.answers.get_mut(&key)?;
        if now.duration_since(*at) >= self.bounds.upload_idle_timeout {
            self.drop_answer(&key);
            return None;
        }
        *at = now;
        let out = slice(req, resp.clone());
        if !out.block2().is_some_and(|b| b.more) {
            self.drop_answer(&key);
        }
        Some(out)
    }

    /// The whole response kept for `peer` under `key` ([`upload_key`] of its
    /// request) by [`Uploads::keep_answer`], while it is not idle past
    /// `upload_idle_timeout`: Q-Block2 blocks a client asks for again are cut from it.
    /// Unlike [`Uploads::answer_for`] it stays kept after its last block (any block
    /// may be asked for again) until it expires or another answer takes its place.
    pub fn kept_answer(&mut self, now: Instant, peer: SocketAddr, key: &[u8]) -> Option<&Message> {
        let key = (peer, key.to_vec());
        let (at, _) = self.answers.get(&key)?;
        if now.duration_since(*at) >= self.bounds.upload_idle_timeout {
            self.drop_answer(&key);
            return None;
        }
        let (at, resp) = self.answers.get_mut(&key)?;
        *at = now;
        Some(resp)
    }

    fn too_large(&self) -> Message {
        let max = self.bounds.max_body;
        let mut m = answer(Code::REQUEST_ENTITY_TOO_LARGE);
        m.options.set_uint(opt::SIZE1, max as u32);
        m.payload = format!("request body larger than {max} bytes").into_bytes();
        m
    }
}

/// An answer with `code`; its type and message ID are the caller's to set.
fn answer(code: Code) -> Message {
    Message::new(MessageType::Acknowledgement, code, 0)
}

fn incomplete(why: &str) -> Message {
    let mut m = answer(Code::REQUEST_ENTITY_INCOMPLETE);
    m.payload = why.as_bytes().to_vec();
    m
}

fn bert_refused() -> Message {
    let mut m = answer(Code::BAD_REQUEST);
    m.payload = BlockError::BertNotAnnounced.to_string().into_bytes();
    m
}

/// What distinguishes concurrent uploads from one peer: method, path and Request-Tag (RFC 9175).
pub fn upload_key(req: &Message) -> Vec<u8> {
    let mut k = vec![req.code.0];
    for seg in req.options.get_all(opt::URI_PATH) {
        k.push(b'/');
        k.extend_from_slice(seg);
    }
    if let Some(tag) = req.options.get(opt::REQUEST_TAG) {
        k.push(0);
        k.extend_from_slice(tag);
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// What a table counted.
    #[derive(Debug, Default)]
    struct Counted {
        refused_peer: AtomicU64,
        refused_server: AtomicU64,
        expired: AtomicU64,
        evicted: AtomicU64,
    }

    impl UploadCounters for Counted {
        fn refused(&self, refusal: Refusal) {
            let n = match refusal {
                Refusal::PeerBudget => &self.refused_peer,
                Refusal::ServerBound => &self.refused_server,
            };
            n.fetch_add(1, Ordering::Relaxed);
        }
        fn expired(&self, n: u64) {
            self.expired.fetch_add(n, Ordering::Relaxed);
        }
        fn evicted(&self) {
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A table within `limits`, and what it counts.
    fn counted(limits: UploadLimits) -> (Uploads, Arc<Counted>) {
        let counted = Arc::new(Counted::default());
        (Uploads::new(limits, counted.clone()), counted)
    }

    fn put(num: u32, more: bool, szx: u8, payload: &[u8]) -> (Message, BlockValue) {
        let mut m = Message::new(MessageType::Confirmable, Code::PUT, num as u16);
        m.options.set_uri_path("/up");
        let b = BlockValue::new(num, more, szx).unwrap();
        m.options.set_uint(opt::BLOCK1, b.encode());
        m.payload = payload.to_vec();
        (m, b)
    }

    fn peer() -> SocketAddr {
        "127.0.0.1:9".parse().unwrap()
    }

    /// A table with these bounds and no per-address ones.
    fn table(
        max_body: usize,
        max_uploads: usize,
        memory: usize,
        idle: Duration,
    ) -> (Uploads, Arc<Counted>) {
        let limits = UploadLimits {
            max_body,
            max_uploads,
            max_upload_memory: memory,
            max_upload_memory_per_ip: memory,
            max_uploads_per_ip: usize::MAX,
            max_uploads_per_peer: usize::MAX,
            upload_idle_timeout: idle,
            ..UploadLimits::default()
        };
        counted(limits)
    }

    #[test]
    fn in_order_blocks_reassemble() {
        let (mut u, _) = table(1000, 10, 1 << 20, Duration::from_secs(60));
        let now = Instant::now();
        let data: Vec<u8> = (0..40).collect();
        let (m, b) = put(0, true, 0, &data[..16]);
        assert!(
            matches!(u.handle(now, peer(), &m, b), UploadStep::Continue(r) if r.code == Code::CONTINUE)
        );
        let (m, b) = put(1, true, 0, &data[16..32]);
        assert!(matches!(
            u.handle(now, peer(), &m, b),
            UploadStep::Continue(_)
        ));
        let (m, b) = put(2, false, 0, &data[32..]);
        match u.handle(now, peer(), &m, b) {
            UploadStep::Complete { body, last } => {
                assert_eq!(body, data);
                assert_eq!(last.num, 2);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(u.in_progress(), 0);
    }

    #[test]
    fn gaps_and_oversize_are_rejected() {
        let (mut u, _) = table(40, 10, 1 << 20, Duration::from_secs(60));
        let now = Instant::now();
        let (m, b) = put(0, true, 0, &[0; 16]);
        u.handle(now, peer(), &m, b);
        let (m, b) = put(2, true, 0, &[0; 16]);
        assert!(
            matches!(u.handle(now, peer(), &m, b), UploadStep::Reject(r) if r.code == Code::REQUEST_ENTITY_INCOMPLETE)
        );
        let (m, b) = put(1, true, 0, &[0; 16]);
        assert!(
            matches!(u.handle(now, peer(), &m, b), UploadStep::Reject(_)),
            "upload was discarded"
        );

        for i in 0..2 {
            let (m, b) = put(i, true, 0, &[0; 16]);
            assert!(matches!(
                u.handle(now, peer(), &m, b),
                UploadStep::Continue(_)
            ));
        }
        let (m, b) = put(2, true, 0, &[0; 16]);
        match u.handle(now, peer(), &m, b) {
            UploadStep::Reject(r) => {
                assert_eq!(r.code, Code::REQUEST_ENTITY_TOO_LARGE);
                assert_eq!(r.options.get_uint(opt::SIZE1), Some(40));
            }
            other => panic!("{other:?}"),
        }
        let (mut m, b) = put(0, true, 0, &[0; 16]);
        m.options.set_uint(opt::SIZE1, 41);
        assert!(
            matches!(u.handle(now, peer(), &m, b), UploadStep::Reject(r) if r.code == Code::REQUEST_ENTITY_TOO_LARGE)
        );
    }

    #[test]
    fn kept_answer_serves_block2_follow_ups_until_the_last_block() {
        let (mut u, _) = table(1000, 10, 1 << 20, Duration::from_secs(60));
        let now = Instant::now();
        let (m, _) = put(0, false, 0, b"x");
        let mut resp = Message::new(MessageType::Acknowledgement, Code::CHANGED, 0);
        resp.payload = vec![1; 40];
        u.keep_answer(now, peer(), upload_key(&m), resp.clone());
        let follow = |num| {
            let mut f = Message::new(MessageType::Confirmable, Code::PUT, 9);
            f.options.set_uri_path("/up");
            f.options.set_uint(
                opt::BLOCK2,
                BlockValue::new(num, false, 0).unwrap().encode(),
            );
            f
        };
        let slice = |r: &Message, m| crate::blockwise::slice_response(r, m, 0);
        let first = u.answer_for(now, peer(), &follow(1), slice).unwrap();
        assert_eq!(first.payload, resp.payload[16..32]);
        let last = u.answer_for(now, peer(), &follow(2), slice).unwrap();
        assert_eq!(last.payload, resp.payload[32..]);
        assert_eq!(
            u.answer_for(now, peer(), &follow(2), slice),
            None,
            "forgotten after the last block"
        );
    }

    #[test]
    fn all_uploads_together_stay_within_the_memory_budget() {
        let (mut u, _) = table(1000, 10, 40, Duration::from_secs(60));
        let now = Instant::now();
        let other: SocketAddr = "192.0.2.1:10".parse().unwrap();
        for p in [peer(), other] {
            let (m, b) = put(0, true, 0, &[0; 16]);
            assert!(matches!(u.handle(now, p, &m, b), UploadStep::Continue(_)));
        }
        // 32 bytes held; 16 more would pass 40, and nobody holds more than this peer.
        let (m, b) = put(1, true, 0, &[0; 16]);
        assert!(
            matches!(u.handle(now, peer(), &m, b), UploadStep::Reject(r) if r.code == Code::SERVICE_UNAVAILABLE && r.options.max_age() == 10)
        );
        assert_eq!(
            u.stats(),
            UploadStats {
                uploads: 1,
                bytes: 16
            }
        );
    }

    #[test]
    fn idle_uploads_expire_on_their_own_timer() {
        let (mut u, c) = table(1000, 10, 1 << 20, Duration::from_secs(8));
        let t0 = Instant::now();
        assert_eq!(u.poll_timeout(), None, "nothing held, no timer");
        let (m, b) = put(0, true, 0, &[0; 16]);
        u.handle(t0, peer(), &m, b);
        let due = u.poll_timeout().expect("a timer once something is held");
        assert_eq!(due, t0 + Duration::from_secs(2));
        u.expire(due);
        assert_eq!(u.in_progress(), 1, "not idle long enough");
        let mut now = due;
        while u.in_progress() > 0 {
            now = u.poll_timeout().unwrap();
            u.expire(now);
        }
        assert!(now >= t0 + Duration::from_secs(8) && now <= t0 + Duration::from_secs(10));
        assert_eq!(u.poll_timeout(), None);
        assert_eq!(c.expired.load(Ordering::Relaxed), 1);
        assert_eq!(u.stats(), UploadStats::default());
        let (m, b) = put(1, true, 0, &[0; 16]);
        assert!(
            matches!(u.handle(now, peer(), &m, b), UploadStep::Reject(r) if r.code == Code::REQUEST_ENTITY_INCOMPLETE)
        );
    }

    fn limited(per_peer: usize, per_ip: usize, total: usize) -> (Uploads, Arc<Counted>) {
        let limits = UploadLimits {
            max_body: 4096,
            max_uploads: total,
            max_uploads_per_ip: per_ip,
            max_uploads_per_peer: per_peer,
            max_upload_memory: 1 << 20,
            max_upload_memory_per_ip: 1 << 20,
            upload_idle_timeout: Duration::from_secs(60),
            ..UploadLimits::default()
        };
        counted(limits)
    }

    fn start(u: &mut Uploads, now: Instant, from: SocketAddr, tag: u16) -> Code {
        let (mut m, b) = put(0, true, 0, &[7; 16]);
        m.options.set(opt::REQUEST_TAG, tag.to_be_bytes());
        match u.handle(now, from, &m, b) {
            UploadStep::Continue(r) | UploadStep::Reject(r) => r.code,
            UploadStep::Complete { .. } => Code::CHANGED,
        }
    }

    #[test]
    fn an_attacker_is_bounded_per_port_and_per_address_and_others_upload() {
        let (mut u, c) = limited(4, 32, 1000);
        let now = Instant::now();
        let attacker = |port: u16| SocketAddr::from(([192, 0, 2, 66], port));
        // 2,000 one-block uploads from one port: 4 taken, the rest 4.29.
        let codes: Vec<Code> = (0..2000)
            .map(|t| start(&mut u, now, attacker(1), t))
            .collect();
        assert_eq!(codes.iter().filter(|c| **c == Code::CONTINUE).count(), 4);
        assert!(codes[4..].iter().all(|c| *c == Code::TOO_MANY_REQUESTS));
        // From many ports: 32 for the address in all.
        for port in 2..2000 {
            start(&mut u, now, attacker(port), 0);
        }
        assert_eq!(u.in_progress(), 32);
        assert_eq!(u.stats().bytes, 32 * 16);
        // Someone else uploads meanwhile, to the end.
        let legit: SocketAddr = "198.51.100.7:5683".parse().unwrap();
        assert_eq!(start(&mut u, now, legit, 1), Code::CONTINUE);
        let (mut m, b) = put(1, false, 0, b"end");
        m.options.set(opt::REQUEST_TAG, 1u16.to_be_bytes());
        match u.handle(now, legit, &m, b) {
            UploadStep::Complete { body, .. } => assert_eq!(body.len(), 19),
            other => panic!("{other:?}"),
        }
        // The attacker's uploads expire and the memory comes back.
        let later = now + Duration::from_secs(80);
        u.expire(u.poll_timeout().unwrap().max(later));
        assert_eq!(u.in_progress(), 0);
        assert_eq!(u.stats(), UploadStats::default());
        assert!(u.map.capacity() <= 64 && u.ledger.per_peer.capacity() <= 64);
        assert!(c.refused_peer.load(Ordering::Relaxed) > 1900);
    }

    #[test]
    fn addresses_rotating_inside_one_ipv6_prefix_share_one_budget() {
        let (u, _) = limited(1000, 4, 1000);
        let mut u = u.with_address_prefix(AddressPrefix::SUBNET);
        let now = Instant::now();
        let at = |s: &str| SocketAddr::new(s.parse().unwrap(), 5683);
        for host in 1..=4 {
            let from = at(&format!("2001:db8::{host}"));
            assert_eq!(start(&mut u, now, from, 0), Code::CONTINUE);
        }
        assert_eq!(
            start(&mut u, now, at("2001:db8::ffff:5"), 0),
            Code::TOO_MANY_REQUESTS,
            "the next address of the same /64"
        );
        assert_eq!(
            start(&mut u, now, at("2001:db8:0:1::1"), 0),
            Code::CONTINUE,
            "the next /64"
        );
        // With /128 every address has its own budget.
        let (u, _) = limited(1000, 4, 1000);
        let mut u = u.with_address_prefix(AddressPrefix::HOST);
        for host in 1..=5 {
            let from = at(&format!("2001:db8::{host}"));
            assert_eq!(start(&mut u, now, from, 0), Code::CONTINUE);
        }
    }

    #[test]
    fn at_the_bound_heavy_addresses_are_refused_and_light_ones_get_room() {
        let (mut u, c) = limited(1000, 1000, 100);
        let t0 = Instant::now();
        let from = |ip: u8, port: u16| SocketAddr::from(([192, 0, 2, ip], port));
        // One address alone stops at half the bound (fair share).
        let mut taken = 0;
        while start(&mut u, t0, from(1, taken), 0) == Code::CONTINUE {
            taken += 1;
        }
        assert_eq!(taken, 50);
        // Near the bound an address holding a few is refused while it holds at least
        // what is left; addresses holding nothing fill it up.
        let t = t0 + Duration::from_secs(1);
        let mut second = 0;
        while start(&mut u, t, from(2, second), 0) == Code::CONTINUE {
            second += 1;
        }
        assert_eq!(second, 25);
        for ip in 3..=27 {
            assert_eq!(start(&mut u, t, from(ip, 1), 0), Code::CONTINUE, "{ip}");
        }
        assert_eq!(u.in_progress(), 100);
        // The heavy address is refused 5.03 ...
        assert_eq!(start(&mut u, t, from(1, 999), 0), Code::SERVICE_UNAVAILABLE);
        // ... a light one gets the place of the heavy address's oldest upload.
        assert_eq!(start(&mut u, t, from(28, 1), 0), Code::CONTINUE);
        assert_eq!(u.in_progress(), 100);
        assert_eq!(u.ledger.ip(u.ledger.key(from(1, 0))).uploads, 49);
        assert_eq!(c.evicted.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_bytes_of_one_address_are_bounded() {
        let limits = UploadLimits {
            max_body: 64,
            max_upload_memory: 1 << 20,
            max_upload_memory_per_ip: 64,
            ..UploadLimits::default()
        };
        let (mut u, _) = counted(limits);
        let now = Instant::now();
        let attacker = |port| SocketAddr::from(([192, 0, 2, 66], port));
        for port in 1..=4 {
            assert_eq!(start(&mut u, now, attacker(port), 0), Code::CONTINUE);
        }
        assert_eq!(start(&mut u, now, attacker(5), 0), Code::TOO_MANY_REQUESTS);
        assert_eq!(u.stats().bytes, 64);
        assert_eq!(start(&mut u, now, peer(), 0), Code::CONTINUE);
    }

    #[test]
    fn bert_blocks_are_taken_only_when_announced_and_checked() {
        let now = Instant::now();
        let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let (mut plain, _) = table(1 << 20, 10, 1 << 20, Duration::from_secs(60));
        let (m, b) = put(0, true, 7, &data[..2048]);
        assert!(
            matches!(plain.handle(now, peer(), &m, b), UploadStep::Reject(r) if r.code == Code::BAD_REQUEST)
        );
        let (u, _) = table(1 << 20, 10, 1 << 20, Duration::from_secs(60));
        let mut u = u.with_bert(true);
        let (m, b) = put(0, true, 7, &data[..2048]);
        assert!(
            matches!(u.handle(now, peer(), &m, b), UploadStep::Continue(r)
            if r.options.get_uint(opt::BLOCK1) == Some(BlockValue::new(0, true, 7).unwrap().encode()))
        );
        // NUM counts 1024-byte units: the next block starts at NUM 2.
        let (m, b) = put(2, true, 7, &data[2048..4096]);
        assert!(matches!(
            u.handle(now, peer(), &m, b),
            UploadStep::Continue(_)
        ));
        let (m, b) = put(4, false, 7, &data[4096..]);
        match u.handle(now, peer(), &m, b) {
            UploadStep::Complete { body, .. } => assert_eq!(body, data),
            other => panic!("{other:?}"),
        }
        // A non-final BERT block that is not a multiple of 1024 bytes ends the upload.
        let (m, b) = put(0, true, 7, &data[..2048]);
        u.handle(now, peer(), &m, b);
        let (m, b) = put(2, true, 7, &data[2048..3000]);
        assert!(
            matches!(u.handle(now, peer(), &m, b), UploadStep::Reject(r) if r.code == Code::REQUEST_ENTITY_INCOMPLETE)
        );
        assert_eq!(u.in_progress(), 0);
        // A hostile NUM far past the body received is a gap, not an allocation.
        let (m, b) = put(0, true, 7, &data[..1024]);
        u.handle(now, peer(), &m, b);
        let (m, b) = put(BlockValue::MAX_NUM, true, 7, &data[..1024]);
        assert!(
            matches!(u.handle(now, peer(), &m, b), UploadStep::Reject(r) if r.code == Code::REQUEST_ENTITY_INCOMPLETE)
        );
        u.forget_peer(peer());
        assert_eq!(u.in_progress(), 0);
    }
}

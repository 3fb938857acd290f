//! Block1 uploads (RFC 7959 §2.5): bodies arriving block by block are reassembled
//! per peer and resource, in order, within a size limit, before the handler runs once
//! with the whole body. Over CoAP over TCP and WebSockets the blocks may be BERT
//! blocks (RFC 8323 §6) when the server announced BERT; they are checked the same way
//! (a non-final BERT block must be a multiple of 1024 bytes, every block must start
//! where the body received so far ends).

use super::request::Response;
use cobalt_proto::blockwise::{check_block, BlockError, BERT_SZX};
use cobalt_proto::message::{opt, BlockValue, Code, Message};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// What to do with a request that carries Block1.
#[derive(Debug)]
pub(crate) enum UploadStep {
    /// More blocks expected: answer with this (2.31 Continue) now.
    Continue(Response),
    /// The upload cannot go on: answer with this (4.08, 4.13, 5.03).
    Reject(Response),
    /// The last block arrived: run the handler with this body; echo `last` in Block1.
    Complete { body: Vec<u8>, last: BlockValue },
}

#[derive(Debug)]
struct Upload {
    body: Vec<u8>,
    szx: u8,
    touched: Instant,
}

/// Uploads in progress in one shard (or one TCP or WebSocket listener, shared by its
/// connections), and the responses of finished uploads whose later Block2 blocks the
/// client may still ask for.
#[derive(Debug)]
pub(crate) struct Uploads {
    map: HashMap<(SocketAddr, Vec<u8>), Upload>,
    /// After an upload the client asks for the rest of a large response with Block2
    /// requests that carry no body (RFC 7959 §3.3); those must not run the handler
    /// again, so the whole response is kept for them.
    answers: HashMap<(SocketAddr, Vec<u8>), (Instant, Message)>,
    /// Streamed uploads: only the next expected offset is kept, never the body.
    streams: HashMap<(SocketAddr, Vec<u8>), (usize, Instant)>,
    max_body: usize,
    max_uploads: usize,
    /// Bytes all uploads and kept answers of this shard may hold together.
    max_memory: usize,
    idle_timeout: Duration,
    /// BERT blocks (SZX 7) are accepted (the server announced BERT in its CSM).
    bert: bool,
}

impl Uploads {
    pub(crate) fn new(
        max_body: usize,
        max_uploads: usize,
        max_memory: usize,
        idle_timeout: Duration,
    ) -> Uploads {
        Uploads {
            map: HashMap::new(),
            answers: HashMap::new(),
            streams: HashMap::new(),
            max_body,
            max_uploads,
            max_memory,
            idle_timeout,
            bert: false,
        }
    }

    /// Accepts BERT blocks (RFC 8323 §6) too: for a CoAP-over-TCP or -WebSocket
    /// listener that announces Block-Wise-Transfer.
    pub(crate) fn with_bert(mut self, bert: bool) -> Uploads {
        self.bert = bert;
        self
    }

    /// Whether BERT blocks (SZX 7) are accepted.
    pub(crate) fn bert(&self) -> bool {
        self.bert
    }

    /// Forgets the uploads and kept answers of `peer` (its connection closed).
    pub(crate) fn forget_peer(&mut self, peer: SocketAddr) {
        self.map.retain(|(p, _), _| *p != peer);
        self.answers.retain(|(p, _), _| *p != peer);
        self.streams.retain(|(p, _), _| *p != peer);
    }

    /// Number of uploads in progress.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Feeds one request carrying `block`.
    pub(crate) fn handle(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        req: &Message,
        block: BlockValue,
    ) -> UploadStep {
        if let Some(size1) = req.options.get_uint(opt::SIZE1) {
            if size1 as usize > self.max_body {
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
            if !self.map.contains_key(&key) && self.map.len() >= self.max_uploads {
                let timeout = self.idle_timeout;
                self.map
                    .retain(|_, u| now.duration_since(u.touched) < timeout);
                if self.map.len() >= self.max_uploads {
                    return UploadStep::Reject(
                        Response::new(Code::SERVICE_UNAVAILABLE)
                            .with_max_age(5)
                            .with_payload("too many uploads in progress; retry later"),
                    );
                }
            }
            self.map.insert(
                key.clone(),
                Upload {
                    body: Vec::new(),
                    szx: block.szx,
                    touched: now,
                },
            );
        }
        let Some(up) = self.map.get_mut(&key) else {
            return UploadStep::Reject(incomplete(
                "no upload in progress for this block; start with block 0",
            ));
        };
        // Blocks must come in order and (except the last) be full-sized; a client may
        // lower the size during the transfer (§2.5), which renumbers the blocks.
        if block.szx > up.szx {
            self.map.remove(&key);
            return UploadStep::Reject(incomplete("block of a larger size than before"));
        }
        if let Err(e) = check_block(block, req.payload.len(), up.body.len(), self.bert) {
            self.map.remove(&key);
            return UploadStep::Reject(incomplete(&e.to_string()));
        }
        if up.body.len() + req.payload.len() > self.max_body {
            self.map.remove(&key);
            return UploadStep::Reject(self.too_large());
        }
        if self.held() + req.payload.len() > self.max_memory {
            self.map.remove(&key);
            return UploadStep::Reject(
                Response::new(Code::SERVICE_UNAVAILABLE)
                    .with_max_age(5)
                    .with_payload("the server holds too much upload data now; retry later"),
            );
        }
        let Some(up) = self.map.get_mut(&key) else {
            return UploadStep::Reject(incomplete("upload vanished"));
        };
        up.body.extend_from_slice(&req.payload);
        up.szx = block.szx;
        up.touched = now;
        if block.more {
            let ack = BlockValue {
                more: true,
                ..block
            };
            return UploadStep::Continue(
                Response::new(Code::CONTINUE).with_option(opt::BLOCK1, encode(ack)),
            );
        }
        let up = self.map.remove(&key).map(|u| u.body).unwrap_or_default();
        UploadStep::Complete {
            body: up,
            last: block,
        }
    }

    /// Checks that a block of a streamed upload comes in order; returns its offset, or
    /// the answer that ends the upload (4.08 for a gap, 5.03 when too many are open).
    pub(crate) fn stream_block(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        req: &Message,
        block: BlockValue,
    ) -> Result<usize, Response> {
        if block.szx == BERT_SZX && !self.bert {
            return Err(bert_refused());
        }
        let key = (peer, upload_key(req));
        if block.num == 0 {
            if let Err(e) = check_block(block, req.payload.len(), 0, self.bert) {
                self.streams.remove(&key);
                return Err(incomplete(&e.to_string()));
            }
            if block.more {
                if !self.streams.contains_key(&key) && self.streams.len() >= self.max_uploads {
                    let timeout = self.idle_timeout;
                    self.streams
                        .retain(|_, (_, t)| now.duration_since(*t) < timeout);
                    if self.streams.len() >= self.max_uploads {
                        return Err(Response::new(Code::SERVICE_UNAVAILABLE)
                            .with_max_age(5)
                            .with_payload("too many uploads in progress; retry later"));
                    }
                }
                self.streams.insert(key, (req.payload.len(), now));
            }
            return Ok(0);
        }
        let Some(expected) = self.streams.get(&key).map(|(o, _)| *o) else {
            return Err(incomplete(
                "no upload in progress for this block; start with block 0",
            ));
        };
        if let Err(e) = check_block(block, req.payload.len(), expected, self.bert) {
            self.streams.remove(&key);
            return Err(incomplete(&e.to_string()));
        }
        if block.more {
            self.streams
                .insert(key, (block.offset() + req.payload.len(), now));
        } else {
            self.streams.remove(&key);
        }
        Ok(block.offset())
    }

    /// Bytes held by uploads in progress and kept answers.
    fn held(&self) -> usize {
        self.map.values().map(|u| u.body.len()).sum::<usize>()
            + self
                .answers
                .values()
                .map(|(_, m)| m.payload.len())
                .sum::<usize>()
    }

    /// Keeps the whole response of an upload that was answered in blocks.
    pub(crate) fn keep_answer(
        &mut self,
        now: Instant,
        peer: SocketAddr,
        key: Vec<u8>,
        response: Message,
    ) {
        if self.answers.len() >= self.max_uploads {
            let timeout = self.idle_timeout;
            self.answers
                .retain(|_, (t, _)| now.duration_since(*t) < timeout);
            if self.answers.len() >= self.max_uploads {
                return;
            }
        }
        if self.held() + response.payload.len() > self.max_memory {
            return; // the client's follow-ups will run the handler again instead
        }
        self.answers.insert((peer, key), (now, response));
    }

    /// The block a Block2 follow-up of an upload asks for, cut by `slice` from the
    /// kept response, if there is one; the response is forgotten once its last block
    /// has been sent.
    pub(crate) fn answer_for(
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
        let (at, resp) = self.answers.get(&key)?;
        if now.duration_since(*at) >= self.idle_timeout {
            self.answers.remove(&key);
            return None;
        }
        let out = slice(req, resp.clone());
        if !out.block2().is_some_and(|b| b.more) {
            self.answers.remove(&key);
        }
        Some(out)
    }

    fn too_large(&self) -> Response {
        Response::new(Code::REQUEST_ENTITY_TOO_LARGE)
            .with_option(opt::SIZE1, encode_u32(self.max_body as u32))
            .with_payload(format!("request body larger than {} bytes", self.max_body))
    }
}

fn incomplete(why: &str) -> Response {
    Response::new(Code::REQUEST_ENTITY_INCOMPLETE).with_payload(why)
}

fn bert_refused() -> Response {
    Response::new(Code::BAD_REQUEST).with_payload(BlockError::BertNotAnnounced.to_string())
}

/// The response to a request that carried `block1`: the acknowledgement of a block
/// taken by a streaming handler becomes 2.31 Continue, and the block is echoed in
/// Block1 (RFC 7959 §2.3).
pub(crate) fn acknowledge_block(mut response: Response, block1: Option<BlockValue>) -> Response {
    if let Some(b) = block1 {
        if b.more && response.code.is_success() {
            response = Response::new(Code::CONTINUE);
        }
        response.options.set(opt::BLOCK1, encode(b));
    }
    response
}

fn encode(b: BlockValue) -> Vec<u8> {
    encode_u32(b.encode())
}

fn encode_u32(v: u32) -> Vec<u8> {
    cobalt_proto::message::option::encode_uint(v)
}

/// What distinguishes concurrent uploads from one peer: method, path and Request-Tag (RFC 9175).
pub(crate) fn upload_key(req: &Message) -> Vec<u8> {
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
    use cobalt_proto::message::MessageType;

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

    #[test]
    fn in_order_blocks_reassemble() {
        let mut u = Uploads::new(1000, 10, 1 << 20, Duration::from_secs(60));
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
        assert_eq!(u.len(), 0);
    }

    #[test]
    fn gaps_and_oversize_are_rejected() {
        let mut u = Uploads::new(40, 10, 1 << 20, Duration::from_secs(60));
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
        let mut u = Uploads::new(1000, 10, 1 << 20, Duration::from_secs(60));
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
        let slice = |r: &Message, m| cobalt_proto::blockwise::slice_response(r, m, 0);
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
        let mut u = Uploads::new(1000, 10, 40, Duration::from_secs(60));
        let now = Instant::now();
        let other: SocketAddr = "127.0.0.1:10".parse().unwrap();
        for (p, expect_ok) in [(peer(), true), (other, true)] {
            let (m, b) = put(0, true, 0, &[0; 16]);
            assert_eq!(
                matches!(u.handle(now, p, &m, b), UploadStep::Continue(_)),
                expect_ok
            );
        }
        // 32 bytes held; 16 more would pass 40.
        let (m, b) = put(1, true, 0, &[0; 16]);
        assert!(
            matches!(u.handle(now, peer(), &m, b), UploadStep::Reject(r) if r.code == Code::SERVICE_UNAVAILABLE)
        );
    }

    #[test]
    fn upload_cap_evicts_idle_ones_first() {
        let mut u = Uploads::new(1000, 1, 1 << 20, Duration::from_secs(10));
        let t0 = Instant::now();
        let (m, b) = put(0, true, 0, &[0; 16]);
        u.handle(t0, peer(), &m, b);
        let other: SocketAddr = "127.0.0.1:10".parse().unwrap();
        assert!(
            matches!(u.handle(t0, other, &m, b), UploadStep::Reject(r) if r.code == Code::SERVICE_UNAVAILABLE)
        );
        assert!(matches!(
            u.handle(t0 + Duration::from_secs(11), other, &m, b),
            UploadStep::Continue(_)
        ));
    }

    #[test]
    fn bert_blocks_are_taken_only_when_announced_and_checked() {
        let now = Instant::now();
        let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let mut plain = Uploads::new(1 << 20, 10, 1 << 20, Duration::from_secs(60));
        let (m, b) = put(0, true, 7, &data[..2048]);
        assert!(
            matches!(plain.handle(now, peer(), &m, b), UploadStep::Reject(r) if r.code == Code::BAD_REQUEST)
        );
        let mut u = Uploads::new(1 << 20, 10, 1 << 20, Duration::from_secs(60)).with_bert(true);
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
        assert_eq!(u.len(), 0);
        // A hostile NUM far past the body received is a gap, not an allocation.
        let (m, b) = put(0, true, 7, &data[..1024]);
        u.handle(now, peer(), &m, b);
        let (m, b) = put(BlockValue::MAX_NUM, true, 7, &data[..1024]);
        assert!(
            matches!(u.handle(now, peer(), &m, b), UploadStep::Reject(r) if r.code == Code::REQUEST_ENTITY_INCOMPLETE)
        );
        u.forget_peer(peer());
        assert_eq!(u.len(), 0);
    }
}

//! Block1 uploads inside OSCORE (RFC 8613 §4.1.3.4: block-wise between the end
//! points is inner): each block is its own protected request, which the server's
//! protocol machine cannot put together, so the OSCORE layer does, before the request
//! is routed. Bounded: a fixed number of uploads at once, each up to a maximum body;
//! an upload left unfinished makes room for a new one after [`STALE_AFTER`].

use cobalt::proto::message::block::BlockValue;
use cobalt::proto::message::Code;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an unfinished upload is kept when another needs its place.
pub const STALE_AFTER: Duration = Duration::from_secs(60);

/// Which upload a block belongs to: the context, the peer, and the request's method,
/// URI and Request-Tag as one string.
pub(crate) type UploadKey = (String, SocketAddr, Vec<u8>);

/// An upload under way.
#[derive(Debug)]
struct Partial {
    body: Vec<u8>,
    started: Instant,
}

/// What to do with a block.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Taken: answer 2.31 Continue with this Block1.
    Continue(BlockValue),
    /// The last block: the request goes on with the whole body; its answer carries
    /// this Block1.
    Complete { body: Vec<u8>, last: BlockValue },
    /// Refused with this code and reason.
    Refuse(Code, &'static str),
}

/// The uploads under way, bounded in number and size.
#[derive(Debug)]
pub(crate) struct InnerUploads {
    table: Mutex<HashMap<UploadKey, Partial>>,
    max_uploads: usize,
    max_body: usize,
}

impl Default for InnerUploads {
    fn default() -> InnerUploads {
        InnerUploads::new(256, 64 * 1024)
    }
}

impl InnerUploads {
    /// At most `max_uploads` at once, each at most `max_body` bytes.
    pub(crate) fn new(max_uploads: usize, max_body: usize) -> InnerUploads {
        InnerUploads {
            table: Mutex::new(HashMap::new()),
            max_uploads,
            max_body,
        }
    }

    /// Takes block `block` of the upload `key`, carrying `payload`, at `now`.
    pub(crate) fn step(
        &self,
        key: UploadKey,
        block: BlockValue,
        payload: &[u8],
        now: Instant,
    ) -> Step {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if block.more && payload.len() != block.size() {
            table.remove(&key);
            return Step::Refuse(
                Code::BAD_REQUEST,
                "a Block1 block before the last must be full",
            );
        }
        if block.num == 0 {
            if !table.contains_key(&key) && table.len() >= self.max_uploads {
                table.retain(|_, p| now.saturating_duration_since(p.started) < STALE_AFTER);
                if table.len() >= self.max_uploads {
                    return Step::Refuse(
                        Code::SERVICE_UNAVAILABLE,
                        "too many uploads at once; try again later",
                    );
                }
            }
            table.insert(
                key.clone(),
                Partial {
                    body: Vec::new(),
                    started: now,
                },
            );
        }
        let Some(partial) = table.get_mut(&key) else {
            return Step::Refuse(
                Code::REQUEST_ENTITY_INCOMPLETE,
                "no upload under way for this block; start at block 0",
            );
        };
        if block.offset() != partial.body.len() {
            table.remove(&key);
            return Step::Refuse(
                Code::REQUEST_ENTITY_INCOMPLETE,
                "a Block1 block came out of order; start again at block 0",
            );
        }
        if partial.body.len() + payload.len() > self.max_body {
            table.remove(&key);
            return Step::Refuse(
                Code::REQUEST_ENTITY_TOO_LARGE,
                "the request body is larger than this server takes",
            );
        }
        partial.body.extend_from_slice(payload);
        if block.more {
            return Step::Continue(block);
        }
        let body = table.remove(&key).map(|p| p.body).unwrap_or_default();
        Step::Complete { body, last: block }
    }

    /// Uploads under way.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u8) -> UploadKey {
        ("ctx".into(), "127.0.0.1:5683".parse().unwrap(), vec![i])
    }

    fn block(num: u32, more: bool) -> BlockValue {
        BlockValue::new(num, more, 0).unwrap() // 16-byte blocks
    }

    #[test]
    fn blocks_in_order_make_the_body() {
        let uploads = InnerUploads::new(4, 100);
        let now = Instant::now();
        assert_eq!(
            uploads.step(key(1), block(0, true), &[1; 16], now),
            Step::Continue(block(0, true))
        );
        assert_eq!(
            uploads.step(key(1), block(1, true), &[2; 16], now),
            Step::Continue(block(1, true))
        );
        match uploads.step(key(1), block(2, false), &[3; 5], now) {
            Step::Complete { body, last } => {
                assert_eq!(body.len(), 37);
                assert_eq!((body[0], body[16], body[36]), (1, 2, 3));
                assert_eq!(last, block(2, false));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(uploads.len(), 0);
    }

    #[test]
    fn out_of_order_oversized_and_too_many_are_refused() {
        let uploads = InnerUploads::new(2, 40);
        let now = Instant::now();
        let code = |s: Step| match s {
            Step::Refuse(code, _) => code,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            code(uploads.step(key(1), block(1, true), &[0; 16], now)),
            Code::REQUEST_ENTITY_INCOMPLETE
        );
        uploads.step(key(1), block(0, true), &[0; 16], now);
        assert_eq!(
            code(uploads.step(key(1), block(2, true), &[0; 16], now)),
            Code::REQUEST_ENTITY_INCOMPLETE
        );
        assert_eq!(
            code(uploads.step(key(1), block(0, true), &[0; 3], now)),
            Code::BAD_REQUEST
        );
        uploads.step(key(1), block(0, true), &[0; 16], now);
        uploads.step(key(1), block(1, true), &[0; 16], now);
        assert_eq!(
            code(uploads.step(key(1), block(2, true), &[0; 16], now)),
            Code::REQUEST_ENTITY_TOO_LARGE
        );
        // Two under way fill the table; a third waits until one is stale.
        uploads.step(key(1), block(0, true), &[0; 16], now);
        uploads.step(key(2), block(0, true), &[0; 16], now);
        assert_eq!(
            code(uploads.step(key(3), block(0, true), &[0; 16], now)),
            Code::SERVICE_UNAVAILABLE
        );
        let later = now + STALE_AFTER;
        assert_eq!(
            uploads.step(key(3), block(0, true), &[0; 16], later),
            Step::Continue(block(0, true))
        );
        assert_eq!(uploads.len(), 1);
    }
}

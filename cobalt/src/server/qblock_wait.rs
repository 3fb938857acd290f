//! The Q-Block1 requests (RFC 9177) a server role keeps unanswered: a block that
//! does not complete its set gets no answer at once, but if blocks of its upload then
//! go missing and nothing arrives for NON_RECEIVE_TIMEOUT, the 4.08 (Request Entity
//! Incomplete) listing them answers the latest block's request (same token, as RFC
//! 9177 §4.4 asks). One request is kept per upload: a newer block of the same upload
//! takes its place and the older one is withheld ([`Session::withhold`]), so what is
//! kept is bounded by the upload table's budgets. Requests whose upload ended
//! (complete, refused, expired, evicted) are withheld at the next look. A kept CON
//! block gets its empty ACK at once.

use super::upload_table::UploadTable;
use cobalt_proto::blockwise::uploads::MissingBlocks;
use cobalt_proto::message::Message;
use cobalt_proto::session::{Inbound, Session};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Instant;

/// Largest list of missing blocks in one 4.08 (it holds at most MAX_PAYLOADS numbers
/// of up to 5 bytes each, far less than this).
const MAX_MISSING_PAYLOAD: usize = 512;

/// Q-Block1 requests kept for a later 4.08, per peer and upload key.
#[derive(Default)]
pub(crate) struct QBlockWaiting {
    waiting: HashMap<(SocketAddr, Vec<u8>), Inbound>,
    /// Something may be due: look at the next step.
    look: bool,
}

impl QBlockWaiting {
    /// A Q-Block1 block of `peer`'s upload `key` arrived as request `id`: it is
    /// answered with `answer` now, or kept (`None`) for a later 4.08. Either way the
    /// upload's previously kept request is withheld.
    pub(crate) fn block<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        (peer, key): (SocketAddr, Vec<u8>),
        id: Inbound,
        answer: Option<Message>,
    ) {
        let slot = (peer, key);
        if let Some(older) = self.waiting.remove(&slot) {
            withhold(session, now, older);
        }
        match answer {
            Some(m) => {
                if let Err(e) = session.respond(now, id, m) {
                    tracing::debug!(error = %e, "Q-Block1 answer not sent");
                }
            }
            None => {
                // A CON block is acknowledged at once: a client sending one block at
                // a time (libcoap over CON) waits for each ACK.
                session.acknowledge(&id);
                self.waiting.insert(slot, id);
            }
        }
        self.look = true;
    }

    /// An upload of `peer` may have ended: look at the next step.
    pub(crate) fn upload_ended(&mut self) {
        self.look |= !self.waiting.is_empty();
    }

    /// When the earliest kept request's 4.08 is due.
    pub(crate) fn poll_timeout(&self, uploads: &impl UploadTable) -> Option<Instant> {
        if self.waiting.is_empty() {
            return None;
        }
        self.waiting
            .keys()
            .filter_map(|(peer, key)| uploads.qblock1_due(*peer, key))
            .min()
    }

    /// A timer fired: look at the next step.
    pub(crate) fn handle_timeout(&mut self) {
        self.look |= !self.waiting.is_empty();
    }

    /// Whether [`QBlockWaiting::step`] has something to look at.
    pub(crate) fn has_work(&self) -> bool {
        self.look
    }

    /// Answers the kept requests whose missing blocks are due with 4.08 and withholds
    /// those whose upload ended.
    pub(crate) fn step<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        uploads: &mut impl UploadTable,
    ) {
        self.look = false;
        let mut done = Vec::new();
        for (peer, key) in self.waiting.keys() {
            let state = uploads.with(|u| u.qblock1_missing(now, *peer, key, MAX_MISSING_PAYLOAD));
            match state {
                MissingBlocks::NotYet => {}
                MissingBlocks::Ask(m) => done.push(((*peer, key.clone()), Some(m))),
                MissingBlocks::Gone => done.push(((*peer, key.clone()), None)),
            }
        }
        for (slot, ask) in done {
            let Some(id) = self.waiting.remove(&slot) else {
                continue;
            };
            match ask {
                Some(m) => {
                    if let Err(e) = session.respond(now, id, m) {
                        tracing::debug!(error = %e, "Q-Block1 4.08 not sent");
                    }
                }
                None => withhold(session, now, id),
            }
        }
        if self.waiting.capacity() > 64 && self.waiting.len() < self.waiting.capacity() / 4 {
            self.waiting.shrink_to_fit();
        }
    }
}

fn withhold<S: Session>(session: &mut S, now: Instant, id: Inbound) {
    if let Err(e) = session.withhold(now, id) {
        tracing::debug!(error = %e, "Q-Block1 request not withheld");
    }
}

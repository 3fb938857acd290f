//! Q-Block2 answers (RFC 9177) of a server role: a request carrying Q-Block2 whose
//! answer takes more than one block gets the block it asked for as its response and
//! the rest of the set (up to MAX_PAYLOADS blocks in all) at once after it, with the
//! request's token, CON for a CON request and NON for a NON one (§10); the next set
//! follows NON_TIMEOUT later, or at once when the client asks for it (Q-Block2 with
//! the M bit). The whole answer is kept in the upload table's kept answers (the
//! Block2 body store, bounded per address and in total), so that a client asking
//! again for the blocks it missed (one request may list several) is answered from it
//! without running the handler. Its ETag ties the blocks of one body together (one is
//! added when the handler gave none).
//!
//! A set that is due goes out only to a verified address (an unverified peer gets no
//! more than its requests allow); it is tried again [`UNVERIFIED_RETRY`] later while
//! its kept answer lasts. A body whose kept answer is gone (expired, evicted, another
//! answer under its key) is sent no further: the client asks for what it misses and
//! the handler answers again.

use super::intake::QBlock2Ask;
use super::upload_table::UploadTable;
use cobalt_proto::blockwise::qblock::{
    qblock2_block, qblock2_count, qblock2_etag, MAX_PAYLOADS, NON_TIMEOUT,
};
use cobalt_proto::message::{opt, Code, Message, MessageType, Token};
use cobalt_proto::session::{Inbound, Session, SessionError};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long a due set waits when its peer's address is not verified yet.
pub(crate) const UNVERIFIED_RETRY: Duration = Duration::from_millis(250);

/// Bodies being sent at most at once (each also needs a kept answer, which the upload
/// table's budgets bound per address and in total; this bounds the schedule itself).
const MAX_BURSTS: usize = 4096;

/// One body being sent in sets.
struct Burst {
    /// The token its blocks carry (the request's).
    token: Token,
    /// The next block to send.
    next: u32,
    /// The first block past the current set.
    set_end: u32,
    /// Block size exponent.
    szx: u8,
    /// CON blocks (the request was CON).
    confirmable: bool,
    /// When the next blocks go out.
    due: Instant,
}

/// The Q-Block2 bodies a role is sending, per peer and request key.
#[derive(Default)]
pub(crate) struct QBlock2Sender {
    bursts: HashMap<(SocketAddr, Vec<u8>), Burst>,
    /// Something may be due: look at the next step.
    look: bool,
}

impl QBlock2Sender {
    /// Answers the Q-Block2 request `id` of `peer` (`ask`) whose whole answer is
    /// `full`: with the first block asked for, the other blocks asked for after it,
    /// and, for a first request or one with the M bit, the rest of the set, the later
    /// sets scheduled. A body of one block is the caller's (it needs no burst); a
    /// request for blocks past the body gets 4.02. `kept`: `full` comes from the
    /// kept answers; otherwise it is kept there if the budgets have room.
    pub(crate) fn answer<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        (id, peer): (Inbound, SocketAddr),
        ask: &QBlock2Ask,
        uploads: &mut impl UploadTable,
        full: Option<Message>,
    ) -> Result<(), SessionError> {
        let szx = ask.szx;
        // The blocks asked for that the body has, each once, and whether to go on.
        let (blocks, count) = {
            let cut = |full: &Message| {
                let mut nums: Vec<u32> = Vec::with_capacity(ask.asked.len());
                for b in &ask.asked {
                    if !nums.contains(&b.num) {
                        nums.push(b.num);
                    }
                }
                let blocks: Vec<Message> = nums
                    .iter()
                    .filter_map(|n| qblock2_block(full, *n, szx))
                    .collect();
                (blocks, qblock2_count(full.payload.len(), szx))
            };
            match full {
                Some(mut full) => {
                    if !full.options.contains(opt::ETAG) {
                        full.options.set(opt::ETAG, qblock2_etag(&full));
                    }
                    let cut = cut(&full);
                    uploads.with(|u| u.keep_answer(now, peer, ask.key.clone(), full));
                    cut
                }
                None => match uploads.with(|u| u.kept_answer(now, peer, &ask.key).map(cut)) {
                    Some(cut) => cut,
                    None => {
                        let mut gone = Message::new(
                            MessageType::Acknowledgement,
                            Code::SERVICE_UNAVAILABLE,
                            0,
                        );
                        gone.payload = b"Q-Block2 body no longer kept: ask from block 0".to_vec();
                        return session.respond(now, id, gone);
                    }
                },
            }
        };
        let mut blocks = blocks.into_iter();
        let Some(first) = blocks.next() else {
            let mut bad = Message::new(MessageType::Acknowledgement, Code::BAD_OPTION, 0);
            bad.payload = b"Q-Block2 asks for blocks past the end of the body".to_vec();
            return session.respond(now, id, bad);
        };
        session.respond(now, id, first)?;
        for block in blocks {
            // An unverified address gets these when it asks again (or from the burst).
            if let Err(e) = session.send_block(now, peer, ask.token.clone(), block, ask.confirmable)
            {
                tracing::debug!(error = %e, "Q-Block2 block not sent");
            }
        }
        if let Some(from) = ask.rest_from() {
            let next = from + 1;
            let slot = (peer, ask.key.clone());
            let kept = uploads.with(|u| u.kept_answer(now, peer, &ask.key).is_some());
            if next < count
                && kept
                && (self.bursts.len() < MAX_BURSTS || self.bursts.contains_key(&slot))
            {
                self.bursts.insert(
                    slot,
                    Burst {
                        token: ask.token.clone(),
                        next,
                        set_end: from.saturating_add(MAX_PAYLOADS),
                        szx,
                        confirmable: ask.confirmable,
                        due: now,
                    },
                );
                self.look = true;
            }
        }
        Ok(())
    }

    /// Whether a Q-Block2 request of `peer` (`ask`) is a follow-up that the kept
    /// answer can serve: it asks for blocks other than the first alone.
    pub(crate) fn serves_from_kept(
        &self,
        now: Instant,
        peer: SocketAddr,
        ask: &QBlock2Ask,
        uploads: &mut impl UploadTable,
    ) -> bool {
        ask.is_follow_up() && uploads.with(|u| u.kept_answer(now, peer, &ask.key).is_some())
    }

    /// When the earliest set is due.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.bursts.values().map(|b| b.due).min()
    }

    /// A timer fired: look at the next step.
    pub(crate) fn handle_timeout(&mut self) {
        self.look |= !self.bursts.is_empty();
    }

    /// Whether [`QBlock2Sender::step`] has something to look at.
    pub(crate) fn has_work(&self) -> bool {
        self.look
    }

    /// Sends the sets that are due and schedules the next ones; bodies whose kept
    /// answer is gone, or that were sent to the end, are done.
    pub(crate) fn step<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        uploads: &mut impl UploadTable,
    ) {
        self.look = false;
        let due: Vec<(SocketAddr, Vec<u8>)> = self
            .bursts
            .iter()
            .filter(|(_, b)| b.due <= now)
            .map(|(slot, _)| slot.clone())
            .collect();
        for slot in due {
            let (peer, key) = &slot;
            let Some(burst) = self.bursts.get_mut(&slot) else {
                continue;
            };
            if !session.is_verified(now, *peer) {
                burst.due = now + UNVERIFIED_RETRY;
                continue;
            }
            let (next, set_end, szx) = (burst.next, burst.set_end, burst.szx);
            let cut = uploads.with(|u| {
                u.kept_answer(now, *peer, key).map(|full| {
                    let end = set_end.min(qblock2_count(full.payload.len(), szx));
                    let blocks: Vec<Message> = (next..end)
                        .filter_map(|n| qblock2_block(full, n, szx))
                        .collect();
                    (blocks, qblock2_count(full.payload.len(), szx))
                })
            });
            let Some((blocks, count)) = cut else {
                self.bursts.remove(&slot);
                continue;
            };
            let mut sent = next;
            for block in blocks {
                let token = burst.token.clone();
                if session
                    .send_block(now, *peer, token, block, burst.confirmable)
                    .is_err()
                {
                    break;
                }
                sent += 1;
            }
            if sent < set_end.min(count) {
                // The address lost its verification on the way: try again later.
                burst.next = sent;
                burst.due = now + UNVERIFIED_RETRY;
            } else if sent >= count {
                self.bursts.remove(&slot);
            } else {
                burst.next = sent;
                burst.set_end = sent.saturating_add(MAX_PAYLOADS);
                burst.due = now + NON_TIMEOUT;
            }
        }
        if self.bursts.capacity() > 64 && self.bursts.len() < self.bursts.capacity() / 4 {
            self.bursts.shrink_to_fit();
        }
    }

    /// Bodies being sent.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.bursts.len()
    }
}

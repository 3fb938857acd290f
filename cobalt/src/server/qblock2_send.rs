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
//!
//! A notification to an observer that registered with Q-Block2 goes the same way
//! ([`QBlock2Sender::notify_rest`]): its block 0 is the notification (the fan-out's),
//! the rest follows under the registration's token, and the body is kept for the
//! observer's requests for missing blocks.

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
    /// Answers the Q-Block2 request `id` of `peer` (`ask`): with the first block asked
    /// for, the other blocks asked for after it, and, for a first request or one with
    /// the M bit, the rest of that set at once and the later sets scheduled. `full` is
    /// the handler's whole answer (kept if the budgets have room; its first set goes
    /// out either way), or `None` to serve the request from the kept answer. A body of
    /// one block is the caller's (it needs no burst); a request for blocks past the
    /// body gets 4.02.
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
        let rest_from = ask.rest_from();
        // The blocks to send now: those asked for, then the rest of the set asked for
        // with the M bit; each once, those the body has.
        let cut = |full: &Message| {
            let count = qblock2_count(full.payload.len(), szx);
            let mut nums: Vec<u32> = Vec::with_capacity(MAX_PAYLOADS as usize);
            let set = rest_from.map_or(0..0, |from| from..from.saturating_add(MAX_PAYLOADS));
            for n in ask.asked.iter().map(|b| b.num).chain(set) {
                if n < count && !nums.contains(&n) {
                    nums.push(n);
                }
            }
            let blocks: Vec<(u32, Message)> = nums
                .iter()
                .filter_map(|n| Some((*n, qblock2_block(full, *n, szx)?)))
                .collect();
            (blocks, count)
        };
        let (blocks, count, kept) = match full {
            Some(mut full) => {
                if !full.options.contains(opt::ETAG) {
                    full.options.set(opt::ETAG, qblock2_etag(&full));
                }
                let (blocks, count) = cut(&full);
                let kept = uploads.with(|u| {
                    u.keep_answer(now, peer, ask.key.clone(), full);
                    u.kept_answer(now, peer, &ask.key).is_some()
                });
                (blocks, count, kept)
            }
            None => match uploads.with(|u| u.kept_answer(now, peer, &ask.key).map(cut)) {
                Some((blocks, count)) => (blocks, count, true),
                None => {
                    let mut gone =
                        Message::new(MessageType::Acknowledgement, Code::SERVICE_UNAVAILABLE, 0);
                    gone.payload = b"Q-Block2 body no longer kept: ask from block 0".to_vec();
                    return session.respond(now, id, gone);
                }
            },
        };
        let mut blocks = blocks.into_iter();
        let Some((_, first)) = blocks.next() else {
            let mut bad = Message::new(MessageType::Acknowledgement, Code::BAD_OPTION, 0);
            bad.payload = b"Q-Block2 asks for blocks past the end of the body".to_vec();
            return session.respond(now, id, bad);
        };
        session.respond(now, id, first)?;
        self.follow(session, now, peer, ask, blocks, count, kept);
        Ok(())
    }

    /// Sends the other blocks of a notification whose first block went out as a
    /// Q-Block2 notification (RFC 9177 §4.4): the rest of its first set at once, the
    /// later sets scheduled, with the registration's token; the whole body is kept for
    /// the observer's requests for missing blocks.
    pub(crate) fn notify_rest<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        peer: SocketAddr,
        ask: &QBlock2Ask,
        full: Message,
        uploads: &mut impl UploadTable,
    ) {
        let count = qblock2_count(full.payload.len(), ask.szx);
        let blocks: Vec<(u32, Message)> = (1..count.min(MAX_PAYLOADS))
            .filter_map(|n| Some((n, qblock2_block(&full, n, ask.szx)?)))
            .collect();
        let kept = uploads.with(|u| {
            u.keep_answer(now, peer, ask.key.clone(), full);
            u.kept_answer(now, peer, &ask.key).is_some()
        });
        self.follow(session, now, peer, ask, blocks.into_iter(), count, kept);
    }

    /// Sends `blocks` after the first block of an answer to `ask` of `peer` and, when
    /// the answer's rest is asked for, schedules the sets after them (while the whole
    /// answer is `kept`); the body has `count` blocks.
    #[allow(clippy::too_many_arguments)]
    fn follow<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        peer: SocketAddr,
        ask: &QBlock2Ask,
        blocks: impl Iterator<Item = (u32, Message)>,
        count: u32,
        kept: bool,
    ) {
        let (szx, rest_from) = (ask.szx, ask.rest_from());
        // The first block not sent for want of a verified address, if any.
        let mut unsent = None;
        for (num, block) in blocks {
            let token = ask.token.clone();
            if let Err(e) = session.send_block(now, peer, token, block, ask.confirmable) {
                tracing::debug!(error = %e, "Q-Block2 block not sent");
                unsent = unsent.or(rest_from.filter(|from| num > *from).map(|_| num));
            }
        }
        let Some(from) = rest_from else {
            return;
        };
        let set_end = from.saturating_add(MAX_PAYLOADS);
        let (next, set_end, due) = match unsent {
            // Tried again once the address is verified (the blocks asked for by
            // number, if any, are the client's to ask for again).
            Some(n) => (n, set_end, now + UNVERIFIED_RETRY),
            _ => (
                set_end,
                set_end.saturating_add(MAX_PAYLOADS),
                now + NON_TIMEOUT,
            ),
        };
        // This request's sets replace those of an earlier one for the same body.
        let slot = (peer, ask.key.clone());
        self.bursts.remove(&slot);
        if next < count && kept && self.bursts.len() < MAX_BURSTS {
            let burst = Burst {
                token: ask.token.clone(),
                next,
                set_end,
                szx,
                confirmable: ask.confirmable,
                due,
            };
            self.bursts.insert(slot, burst);
            self.look = true;
        }
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

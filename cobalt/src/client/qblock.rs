//! The client's Q-Block2 downloads (RFC 9177) over UDP and DTLS
//! ([`RequestBuilder::q_block`](super::RequestBuilder::q_block)): the request asks
//! with Q-Block2 and the server sends the body in sets of up to MAX_PAYLOADS blocks
//! under its token. The blocks are collected in whatever order they come; once a set
//! is complete the next one is asked for at once (Q-Block2 with the M bit), and when
//! nothing new arrives for NON_RECEIVE_TIMEOUT the missing blocks are asked for, up
//! to MAX_PAYLOADS of them in one request (or the next set, when none below the
//! highest is missing). After MAX_RETRANSMIT such rounds without a new block the
//! download fails with [`BlockError::Incomplete`]. The ETag of the first block must be
//! that of every other ([`BlockError::Changed`]: libcoap's server gives a body a new
//! ETag when it takes a request for missing blocks as a new request, which happens
//! on lossy paths; ask again). A server that answers without
//! Q-Block2 (whole, or in Block2 blocks) is followed as a plain request.

use super::route::{CancelGuard, Route, Sent};
use super::MAX_BODY;
use crate::error::BlockError;
use crate::runtime::notifications;
use crate::server::Response;
use crate::{Error, Result};
use cobalt_proto::blockwise::qblock::{
    QBlock1Body, Received, MAX_PAYLOADS, MAX_RETRANSMIT, NON_RECEIVE_TIMEOUT, Q_BLOCK2,
};
use cobalt_proto::message::{opt, option::encode_uint, BlockValue, Message, Token};
use cobalt_proto::observe::is_fresh;
use std::time::Instant;

/// Requests of one download whose answers are listened to at once: the first (the
/// server's later sets come under its token) and the latest few.
const MAX_LISTENING: usize = 4;

/// Blocks buffered per request before the collector takes them (more are dropped and
/// asked for again): a server may send a set twice when it answers a request for it
/// and also goes on by itself.
const BUFFERED: usize = 256;

/// One request of the download and the channel its answers arrive on.
struct Listening<'a> {
    /// The blocks it asked for (with the M bit: the rest of that set): once they
    /// have all arrived (under any token: a server
    /// may send them under the first request's) it is forgotten, which also frees
    /// its place among the requests the endpoint has outstanding to the server
    /// (NSTART).
    asked: Vec<u32>,
    channel: Channel<'a>,
}

/// Where a request's answers arrive.
enum Channel<'a> {
    /// A request of the download's own.
    Own {
        answers: notifications::Receiver<Result<Message>>,
        /// Forgets the request at the endpoint when the download is done.
        _guard: CancelGuard,
        /// What the client's layers keep for its answers.
        sent: Option<Sent>,
    },
    /// An observation's notifications: the blocks of a Q-Block2 notification come
    /// under the registration's token.
    Observation {
        answers: &'a mut notifications::Receiver<Result<Message>>,
        sent: Option<&'a mut Sent>,
    },
}

impl Channel<'_> {
    fn answers(&mut self) -> &mut notifications::Receiver<Result<Message>> {
        match self {
            Channel::Own { answers, .. } => answers,
            Channel::Observation { answers, .. } => answers,
        }
    }

    fn sent(&mut self) -> Option<&mut Sent> {
        match self {
            Channel::Own { sent, .. } => sent.as_mut(),
            Channel::Observation { sent, .. } => sent.as_deref_mut(),
        }
    }
}

/// Downloads the answer to `request` (a GET or FETCH without Block2) with Q-Block2
/// in blocks of size exponent `szx` over `route` (a datagram route).
pub(crate) async fn download(route: &Route, request: Message, szx: u8) -> Result<Response> {
    let mut template = request;
    template.options.remove(Q_BLOCK2);
    template.options.remove(opt::BLOCK2);
    // One Request-Tag for every request of the download (RFC 9175): a server (libcoap)
    // ties the requests for further blocks to the body it is sending by it.
    if !template.options.contains(opt::REQUEST_TAG) {
        template
            .options
            .set(opt::REQUEST_TAG, rand::random::<u32>().to_be_bytes());
    }
    let first = listen(route, &template, szx, &[(0, true)])?;
    collect(route, &template, szx, vec![first], None).await
}

/// Asks an observation's registration `registration` (over a datagram route) for
/// its notifications in Q-Block2 blocks of size exponent `szx` (RFC 9177 §4.4), with
/// a Request-Tag that the requests for missing blocks repeat.
pub(crate) fn ask_notifications_in_qblock2(registration: &mut Message, szx: u8) {
    // Q-Block2 in place of Block2 (RFC 9177 §4: not both in one request).
    registration.options.remove(opt::BLOCK2);
    if let Some(first) = BlockValue::new(0, false, szx) {
        registration.options.set_uint(Q_BLOCK2, first.encode());
    }
    if !registration.options.contains(opt::REQUEST_TAG) {
        registration
            .options
            .set(opt::REQUEST_TAG, rand::random::<u32>().to_be_bytes());
    }
}

/// Completes a notification of the observation registered with `registration` that
/// came as a Q-Block2 block (`block`, the message `arrived` already past the
/// layers): its other blocks arrive on the observation's channel `answers`, the
/// missing ones are asked for as for a download (without Observe, with the
/// registration's Request-Tag).
pub(crate) async fn complete_notification(
    route: &Route,
    registration: &Message,
    (arrived, block): (Message, BlockValue),
    answers: &mut notifications::Receiver<Result<Message>>,
    sent: Option<&mut Sent>,
) -> Result<Response> {
    let mut template = registration.clone();
    template.options.remove(opt::OBSERVE);
    template.options.remove(Q_BLOCK2);
    template.options.remove(opt::BLOCK2);
    let notes = Listening {
        asked: (0..MAX_PAYLOADS).collect(),
        channel: Channel::Observation { answers, sent },
    };
    collect(
        route,
        &template,
        block.szx,
        vec![notes],
        Some((arrived, block)),
    )
    .await
}

/// Sends a Q-Block2 request like `template` for `blocks` (number, M bit) in blocks of
/// size exponent `szx` and listens to its answers.
fn listen(
    route: &Route,
    template: &Message,
    szx: u8,
    blocks: &[(u32, bool)],
) -> Result<Listening<'static>> {
    let mut m = template.clone();
    m.token = Token::EMPTY;
    for &(num, more) in blocks {
        let block = BlockValue::new(num, more, szx)
            .ok_or(Error::BlockTransfer(BlockError::TooManyBlocks))?;
        m.options.push(Q_BLOCK2, encode_uint(block.encode()));
    }
    let (tx, answers) = notifications::queue(BUFFERED);
    let (guard, sent) = route.observe(m, tx)?;
    // A block asked for with the M bit brings the rest of its set.
    let asked = blocks
        .iter()
        .flat_map(|&(n, more)| {
            n..if more {
                n.saturating_add(MAX_PAYLOADS)
            } else {
                n + 1
            }
        })
        .collect();
    Ok(Listening {
        asked,
        channel: Channel::Own {
            answers,
            _guard: guard,
            sent,
        },
    })
}

/// Collects the blocks of a Q-Block2 body from the requests `listening` (the first
/// one's token carries the server's later sets) and asks for the next sets and the
/// missing blocks with requests like `template`; `arrived` is a block already taken.
/// A body whose ETag changes on the way fails with [`BlockError::Changed`], except
/// when completing a notification (`arrived` given): a newer one (by its Observe
/// number) is collected instead, and blocks of older ones are dropped.
async fn collect(
    route: &Route,
    template: &Message,
    szx: u8,
    mut listening: Vec<Listening<'_>>,
    mut arrived: Option<(Message, BlockValue)>,
) -> Result<Response> {
    let notification = arrived.is_some();
    let listen = |blocks: &[(u32, bool)]| listen(route, template, szx, blocks);
    let mut body: Option<QBlock1Body> = None;
    // The first block's message (its code and options make the response) and ETag.
    let mut head: Option<Message> = None;
    let mut rounds = 0;
    // The first block of the latest set asked for with the M bit.
    let mut continued = 0;
    loop {
        let (message, block) = match arrived.take() {
            Some(taken) => taken,
            None => match next_block(route, &mut listening).await {
                Next::Block(message, block) => (message, block),
                Next::Other(message) => {
                    // Not a Q-Block2 block: a whole answer, an error, or Block2 blocks.
                    drop(listening);
                    return route.fetch_rest(template.clone(), message).await;
                }
                Next::Failed(Some(e)) if body.is_none() && listening.is_empty() => return Err(e),
                Next::Failed(_) => continue,
                Next::Refused(e) => return Err(e),
                Next::Silence => {
                    // Nothing new for NON_RECEIVE_TIMEOUT: ask for what is missing.
                    rounds += 1;
                    if rounds > MAX_RETRANSMIT {
                        let missing = body
                            .as_ref()
                            .map_or(1, |b| b.missing(usize::MAX).len().max(1));
                        return Err(Error::BlockTransfer(BlockError::Incomplete {
                            missing,
                            rounds: MAX_RETRANSMIT,
                        }));
                    }
                    let asked: Vec<(u32, bool)> = match &body {
                        None => vec![(0, true)],
                        Some(b) => {
                            let total = head.as_ref().and_then(|h| blocks_in(h, szx));
                            let missing = missing_of(b, total);
                            if missing.is_empty() {
                                // Nothing missing below the highest and no size given:
                                // the rest from the next block on.
                                vec![(b.highest().map_or(0, |h| h + 1), true)]
                            } else {
                                missing.into_iter().map(|n| (n, false)).collect()
                            }
                        }
                    };
                    add_listening(&mut listening, listen(&asked)?);
                    continue;
                }
            },
        };
        let changed = head
            .as_ref()
            .filter(|h| h.options.get(opt::ETAG) != message.options.get(opt::ETAG));
        if let Some(h) = changed {
            if !notification {
                return Err(Error::BlockTransfer(BlockError::Changed));
            }
            let now = Instant::now();
            let newer = match (h.options.observe(), message.options.observe()) {
                (Some(v1), Some(v2)) => is_fresh(v1, now, v2, now),
                _ => false,
            };
            if !newer {
                // A block of an older notification, late.
                continue;
            }
            // A newer notification overtook this one: that one is collected instead.
            (body, head, rounds, continued) = (None, None, 0, 0);
            listening.truncate(1);
        }
        let collector = body.get_or_insert_with(|| QBlock1Body::new(MAX_BODY, Instant::now()));
        let received = collector
            .receive(Instant::now(), block, &message.payload)
            .map_err(|e| Error::BlockTransfer(BlockError::QBlock(e)))?;
        let mut head_message = head.take().unwrap_or_else(|| {
            let mut h = message.clone();
            h.payload.clear();
            h
        });
        match received {
            Received::Complete(whole) => {
                head_message.payload = whole;
                return Ok(Response::from_message(head_message));
            }
            Received::Duplicate => {}
            Received::Held | Received::SetComplete(_) => {
                rounds = 0;
                let next_set = block.num + 1;
                let set_done = block.more
                    && next_set.is_multiple_of(MAX_PAYLOADS)
                    && collector.highest() == Some(block.num)
                    && collector.missing(1).is_empty();
                if set_done && next_set > continued {
                    // A whole set arrived: ask for the next one at once.
                    continued = next_set;
                    add_listening(&mut listening, listen(&[(next_set, true)])?);
                }
            }
        }
        head = Some(head_message);
        // Requests whose blocks have all come (or are past the body's end) are done;
        // the first stays: the server's later sets come under its token.
        let total = head.as_ref().and_then(|h| blocks_in(h, szx));
        let mut index = 0;
        listening.retain(|l| {
            index += 1;
            let done = |n: &u32| collector.has(*n) || total.is_some_and(|t| *n >= t);
            index == 1 || !l.asked.iter().all(done)
        });
    }
}

/// How many blocks of size exponent `szx` the body of `head` (a block carrying
/// Size2, as every Q-Block2 block should) has.
fn blocks_in(head: &Message, szx: u8) -> Option<u32> {
    let size = head.options.get_uint(opt::SIZE2)? as usize;
    u32::try_from(size.div_ceil(16 << szx.min(6))).ok()
}

/// Up to MAX_PAYLOADS numbers of blocks `body` misses: below the highest received,
/// and above it up to `total` blocks when the body's size is known.
fn missing_of(body: &QBlock1Body, total: Option<u32>) -> Vec<u32> {
    let mut missing = body.missing(MAX_PAYLOADS as usize);
    if let Some(total) = total {
        let after = body.highest().map_or(0, |h| h + 1);
        let room = MAX_PAYLOADS as usize - missing.len();
        missing.extend((after..total).take(room));
    }
    missing
}

/// Adds a request's channel, forgetting the oldest but the first when there are
/// [`MAX_LISTENING`].
fn add_listening<'a>(listening: &mut Vec<Listening<'a>>, new: Listening<'a>) {
    if listening.len() >= MAX_LISTENING {
        listening.remove(1);
    }
    listening.push(new);
}

/// What [`next_block`] found.
enum Next {
    /// A Q-Block2 block of a successful answer, past the layers.
    Block(Message, BlockValue),
    /// An answer without Q-Block2 (whole, an error, or Block2 blocks), past the layers.
    Other(Message),
    /// A request whose answer failed (with the error) or whose channel closed: it is
    /// forgotten; the others go on, and a round asks again.
    Failed(Option<Error>),
    /// An answer the option check or the layers refused: the download fails.
    Refused(Error),
    /// Nothing arrived for NON_RECEIVE_TIMEOUT.
    Silence,
}

/// The next answer of the download, checked and passed through the client's layers.
async fn next_block(route: &Route, listening: &mut Vec<Listening<'_>>) -> Next {
    let next = tokio::time::timeout(NON_RECEIVE_TIMEOUT, next_answer(listening)).await;
    let (i, answer) = match next {
        Ok(Some(x)) => x,
        Ok(None) | Err(_) => return Next::Silence,
    };
    let mut message = match answer {
        Some(Ok(m)) => m,
        failed => {
            listening.remove(i);
            return Next::Failed(failed.and_then(Result::err));
        }
    };
    // Q-Block2 is this module's: taken out before the option check and the layers.
    let qblock2 = message.options.get_uint(Q_BLOCK2);
    message.options.remove(Q_BLOCK2);
    if let Err(e) = route.receive(listening[i].channel.sent(), &mut message) {
        return Next::Refused(e);
    }
    match qblock2
        .and_then(BlockValue::decode)
        .filter(|_| message.code.is_success())
    {
        Some(block) => Next::Block(message, block),
        None => Next::Other(message),
    }
}

/// The next answer on any of the download's channels: the channel's index and the
/// answer, `None` for a channel that closed. With no channel left it waits (for the
/// caller's timeout, which asks again).
async fn next_answer(listening: &mut [Listening<'_>]) -> Option<(usize, Option<Result<Message>>)> {
    if listening.is_empty() {
        return std::future::pending().await;
    }
    let waits = listening
        .iter_mut()
        .map(|l| Box::pin(l.channel.answers().recv()));
    let (answer, i, _) = futures_util::future::select_all(waits).await;
    Some((i, answer))
}

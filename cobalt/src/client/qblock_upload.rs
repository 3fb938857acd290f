//! The client's Q-Block1 uploads (RFC 9177) over UDP and DTLS
//! ([`RequestBuilder::q_block`](super::RequestBuilder::q_block) on a request whose
//! body is larger than one block): the body goes out in sets of up to MAX_PAYLOADS
//! blocks (NON for a NON request, CON for a CON one), every block a request of its
//! own with the same Request-Tag and Size1. The next set follows the server's 2.31
//! (Continue) for the set at once, or NON_TIMEOUT after the set without one. A 4.08
//! (Request Entity Incomplete) listing missing blocks (a CBOR sequence of block
//! numbers, RFC 9177 §5) gets those blocks again; when the whole body is out and
//! nothing comes back for NON_RECEIVE_TIMEOUT + NON_TIMEOUT, the last block is sent
//! again to ask for the server's word. After MAX_RETRANSMIT such rounds in a row
//! (silence, or the same list of missing blocks: the server took nothing new) the
//! upload fails with [`BlockError::UploadIncomplete`].
//! The answer to the upload is the first answer that is neither 2.31 nor a 4.08 with
//! a list of missing blocks; a 4.02 (Bad Option) before any 2.31 means that the
//! server does not know Q-Block1, and the request goes again in Block1 blocks.
//!
//! The answers to a block's request are listened to only while it is among the
//! latest few sent (bounded, whatever the body's size): the server answers the
//! latest block it received (RFC 9177 §4.4).

use super::route::Route;
use crate::error::BlockError;
use crate::runtime::notifications;
use crate::server::Response;
use crate::{Error, Result};
use cobalt_proto::blockwise::qblock::{
    missing_blocks, qblock2_count, MAX_PAYLOADS, MAX_RETRANSMIT, MISSING_BLOCKS_CBOR_SEQ,
    NON_RECEIVE_TIMEOUT, NON_TIMEOUT, Q_BLOCK1,
};
use cobalt_proto::message::{
    opt, option::encode_uint, BlockValue, Code, Message, MessageType, Token,
};
use std::future::Future;
use std::pin::Pin;

/// Block requests whose answers are listened to at once (the oldest is forgotten
/// when another is sent): two sets, and the blocks sent again after a 4.08.
const LISTENED: usize = 3 * MAX_PAYLOADS as usize;

/// The answer to one block's request: `None` when none will come (the request was
/// forgotten); the answer with the Q-Block1 value it carried, taken out.
pub(crate) type BlockAnswer<'a> =
    Pin<Box<dyn Future<Output = Option<Result<(Message, Option<u32>)>>> + Send + 'a>>;

/// How an upload ended.
#[derive(Debug)]
pub(crate) enum Uploaded {
    /// The server's answer to the whole body.
    Answer(Message),
    /// The server does not know Q-Block1 (4.02 before it took a set).
    NotSupported,
}

/// Uploads `request`'s body with Q-Block1 in blocks of size exponent `szx` over
/// `route` (a datagram route), and completes an answer in Block2 blocks.
pub(crate) async fn upload(route: &Route, request: Message, szx: u8) -> Result<Response> {
    let mut template = request.clone();
    template.payload.clear();
    let answer = upload_via(request.clone(), szx, |block| send_block(route, block)).await?;
    match answer {
        Uploaded::Answer(answer) => {
            template.options.remove(opt::SIZE1);
            template.options.remove(Q_BLOCK1);
            route.fetch_rest(template, answer).await
        }
        Uploaded::NotSupported => route.send_whole(request, Some(szx)).await,
    }
}

/// Sends one block's request over `route`; its answer passes the client's layers
/// with its Q-Block1 option (this module's) taken out first.
fn send_block(route: &Route, block: Message) -> Result<BlockAnswer<'_>> {
    let (tx, mut answers) = notifications::queue(1);
    let (guard, mut sent) = route.observe(block, tx)?;
    Ok(Box::pin(async move {
        let _forget_when_dropped = guard;
        let mut answer = match answers.recv().await? {
            Ok(m) => m,
            Err(e) => return Some(Err(e)),
        };
        if answer.code == Code::EMPTY {
            // A CON block's ACK (the endpoint ends such a block's exchange at it).
            return Some(Ok((answer, None)));
        }
        let qblock1 = answer.options.get_uint(Q_BLOCK1);
        answer.options.remove(Q_BLOCK1);
        Some(
            route
                .receive(sent.as_mut(), &mut answer)
                .map(|()| (answer, qblock1)),
        )
    }))
}

/// The upload itself, over any way of sending a block: `send` sends one block's
/// request and returns its answer (which may never come).
pub(crate) async fn upload_via<'a, S>(request: Message, szx: u8, mut send: S) -> Result<Uploaded>
where
    S: FnMut(Message) -> Result<BlockAnswer<'a>>,
{
    let mut template = request;
    let body = std::mem::take(&mut template.payload);
    let confirmable = template.mtype != MessageType::NonConfirmable;
    let size = 16usize << szx.min(6);
    let total = qblock2_count(body.len(), szx);
    BlockValue::new(total - 1, false, szx)
        .ok_or(Error::BlockTransfer(BlockError::TooManyBlocks))?;
    // No Block1 or Block2 beside Q-Block1 (RFC 9177 §4.1: not mixed in a request).
    template.options.remove(opt::BLOCK1);
    template.options.remove(opt::BLOCK2);
    template.options.remove(Q_BLOCK1);
    template
        .options
        .set_uint(opt::SIZE1, u32::try_from(body.len()).unwrap_or(u32::MAX));
    // One Request-Tag for every block of the body (RFC 9175, RFC 9177 §4.4).
    if !template.options.contains(opt::REQUEST_TAG) {
        template
            .options
            .set(opt::REQUEST_TAG, rand::random::<u32>().to_be_bytes());
    }
    let block = |num: u32| -> Result<Message> {
        let mut m = template.clone();
        m.token = Token::EMPTY;
        let value = BlockValue::new(num, num + 1 < total, szx)
            .ok_or(Error::BlockTransfer(BlockError::TooManyBlocks))?;
        m.options.push(Q_BLOCK1, encode_uint(value.encode()));
        let start = num as usize * size;
        m.payload = body[start..(start + size).min(body.len())].to_vec();
        Ok(m)
    };
    let mut listening: Vec<(u32, BlockAnswer<'a>)> = Vec::new();
    let mut send_blocks = |listening: &mut Vec<_>, nums: &[u32]| -> Result<()> {
        for &num in nums {
            if listening.len() >= LISTENED {
                drop(listening.remove(0));
            }
            listening.push((num, send(block(num)?)?));
        }
        Ok(())
    };
    // The first block not sent yet, and whether the server took a set (2.31).
    let mut next;
    let mut continued = false;
    let mut rounds = 0u32;
    // The blocks the latest 4.08 listed, and how many.
    let mut last_listed: Vec<u32> = Vec::new();
    // Blocks sent again for 4.08s so far.
    let mut resent = 0u64;
    // The blocks of the latest set acknowledged (CON).
    let mut acked_in_set: Vec<u32> = Vec::new();
    let mut missing_last = 1usize;
    let first_set = MAX_PAYLOADS.min(total);
    send_blocks(&mut listening, &(0..first_set).collect::<Vec<_>>())?;
    next = first_set;
    loop {
        let wait = if next < total {
            NON_TIMEOUT
        } else {
            NON_RECEIVE_TIMEOUT + NON_TIMEOUT
        };
        let answer = tokio::time::timeout(wait, next_answer(&mut listening)).await;
        let Ok((i, answer)) = answer else {
            if next < total && confirmable {
                // CON blocks are the endpoint's to deliver (or to fail): the next set
                // waits for the ACKs of this one.
                continue;
            }
            if next < total {
                // No 2.31 for the set within NON_TIMEOUT: on with the next one.
                let end = next.saturating_add(MAX_PAYLOADS).min(total);
                send_blocks(&mut listening, &(next..end).collect::<Vec<_>>())?;
                next = end;
                continue;
            }
            // The whole body is out and the server says nothing: ask again with the
            // last block.
            rounds += 1;
            if rounds > MAX_RETRANSMIT {
                return Err(Error::BlockTransfer(BlockError::UploadIncomplete {
                    missing: missing_last,
                    rounds: MAX_RETRANSMIT,
                }));
            }
            send_blocks(&mut listening, &[total - 1])?;
            continue;
        };
        let (num, _) = listening.remove(i);
        let (message, qblock1) = match answer {
            None => continue,
            Some(Err(e)) => return Err(e),
            Some(Ok(a)) => a,
        };
        if message.code == Code::EMPTY {
            // A CON block acknowledged (RFC 9177 §4.4: over CON the server
            // acknowledges every block and sends no 2.31): once the whole latest set
            // is, the next one goes.
            let set_start = next.saturating_sub(1) / MAX_PAYLOADS * MAX_PAYLOADS;
            acked_in_set.retain(|n| (set_start..next).contains(n));
            if (set_start..next).contains(&num) && !acked_in_set.contains(&num) {
                acked_in_set.push(num);
                if acked_in_set.len() as u32 == next - set_start && next < total {
                    let end = next.saturating_add(MAX_PAYLOADS).min(total);
                    send_blocks(&mut listening, &(next..end).collect::<Vec<_>>())?;
                    next = end;
                }
            }
            continue;
        }
        if message.code == Code::CONTINUE {
            // A set taken: the next one at once (a 2.31 for an older set changes
            // nothing).
            let set_end = qblock1.and_then(BlockValue::decode).map(|b| b.num);
            continued = true;
            rounds = 0;
            if set_end.is_some_and(|n| n.saturating_add(1) == next) && next < total {
                let end = next.saturating_add(MAX_PAYLOADS).min(total);
                send_blocks(&mut listening, &(next..end).collect::<Vec<_>>())?;
                next = end;
            }
            continue;
        }
        if message.code == Code::REQUEST_ENTITY_INCOMPLETE {
            if let Some(missing) = listed_missing(&message, next) {
                // A list that changed: the server took blocks since the last one.
                if missing == last_listed {
                    rounds += 1;
                } else {
                    rounds = 1;
                }
                missing_last = missing.len();
                // Lists that keep changing are bounded too: each block is sent again
                // at most MAX_RETRANSMIT times on average.
                resent = resent.saturating_add(missing.len() as u64);
                if rounds > MAX_RETRANSMIT || resent > u64::from(total) * u64::from(MAX_RETRANSMIT)
                {
                    return Err(Error::BlockTransfer(BlockError::UploadIncomplete {
                        missing: missing_last,
                        rounds: MAX_RETRANSMIT,
                    }));
                }
                send_blocks(&mut listening, &missing)?;
                last_listed = missing;
                continue;
            }
        }
        if message.code == Code::BAD_OPTION && !continued {
            return Ok(Uploaded::NotSupported);
        }
        return Ok(Uploaded::Answer(message));
    }
}

/// The blocks a 4.08 lists as missing (at most MAX_PAYLOADS of them, below `sent`,
/// in order and each once); `None` when it lists none usable (then it is the
/// upload's answer).
fn listed_missing(answer: &Message, sent: u32) -> Option<Vec<u32>> {
    let cbor_seq = answer.options.content_format() == Some(MISSING_BLOCKS_CBOR_SEQ);
    if !cbor_seq {
        return None;
    }
    let mut missing = missing_blocks(&answer.payload)?;
    missing.retain(|&n| n < sent);
    missing.sort_unstable();
    missing.dedup();
    missing.truncate(MAX_PAYLOADS as usize);
    (!missing.is_empty()).then_some(missing)
}

/// The next answer among the block requests listened to: its index and the answer.
/// With none listened to it waits (for the caller's timeout).
async fn next_answer<'a>(
    listening: &mut [(u32, BlockAnswer<'a>)],
) -> (usize, Option<Result<(Message, Option<u32>)>>) {
    if listening.is_empty() {
        return std::future::pending().await;
    }
    let waits = listening.iter_mut().map(|(_, answer)| answer);
    let (answer, i, _) = futures_util::future::select_all(waits).await;
    (i, answer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_proto::blockwise::qblock::{
        continue_response, incomplete_response, QBlock1Body, Received,
    };
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::sync::{Arc, Mutex};
    use std::time::Instant;
    use tokio::time::Instant as VirtualInstant;

    const SZX: u8 = 2; // 64-byte blocks

    fn body(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn put(payload: Vec<u8>, mtype: MessageType) -> Message {
        let mut m = Message::new(mtype, Code::PUT, 0);
        m.options.push(opt::URI_PATH, "upload");
        m.payload = payload;
        m
    }

    /// A Q-Block1 server in virtual time (RFC 9177 §4.4 as the server role does it,
    /// with the same body collector): 2.31 for a complete set, 2.04 for the whole
    /// body, and a 4.08 listing the missing blocks NON_RECEIVE_TIMEOUT after the
    /// latest block when nothing newer came. `loss` of the blocks and of the answers
    /// is dropped.
    struct Sim {
        body: QBlock1Body,
        rng: StdRng,
        loss: f64,
        /// Answers 2.31 for complete sets.
        continues: bool,
        /// How long a CON block's ACK takes (without 2.31s).
        ack_delay: std::time::Duration,
        /// Blocks received (lost ones not), with their virtual time.
        received: Vec<(u32, VirtualInstant)>,
        /// Blocks of requests seen, counting the latest.
        seq: u64,
        done: Option<Vec<u8>>,
        /// What every request's Request-Tag and Size1 were.
        tags: Vec<(Option<Vec<u8>>, Option<u32>)>,
    }

    fn sim(seed: u64, loss: f64) -> Arc<Mutex<Sim>> {
        Arc::new(Mutex::new(Sim {
            body: QBlock1Body::new(1 << 20, Instant::now()),
            rng: StdRng::seed_from_u64(seed),
            loss,
            continues: true,
            ack_delay: std::time::Duration::ZERO,
            received: Vec::new(),
            seq: 0,
            done: None,
            tags: Vec::new(),
        }))
    }

    fn answered(mut m: Message) -> Option<Result<(Message, Option<u32>)>> {
        let q = m.options.get_uint(Q_BLOCK1);
        m.options.remove(Q_BLOCK1);
        Some(Ok((m, q)))
    }

    /// The server's handling of one block's request: its answer, if any comes.
    fn serve(server: &Arc<Mutex<Sim>>, request: Message) -> Result<BlockAnswer<'static>> {
        let mut s = server.lock().unwrap();
        s.tags.push((
            request.options.get(opt::REQUEST_TAG).map(<[u8]>::to_vec),
            request.options.get_uint(opt::SIZE1),
        ));
        let loss = s.loss;
        if s.rng.random_bool(loss) {
            return Ok(Box::pin(std::future::pending()));
        }
        let block = request
            .options
            .get_uint(Q_BLOCK1)
            .and_then(BlockValue::decode)
            .expect("every request carries Q-Block1");
        s.received.push((block.num, VirtualInstant::now()));
        s.seq += 1;
        let answer_lost = s.rng.random_bool(loss);
        let acked = request.mtype == MessageType::Confirmable && block.more && !s.continues;
        let answer = if s.done.is_some() {
            Some(Message::new(MessageType::NonConfirmable, Code::CHANGED, 0))
        } else {
            match s.body.receive(Instant::now(), block, &request.payload) {
                Ok(Received::Complete(whole)) => {
                    s.done = Some(whole);
                    Some(Message::new(MessageType::NonConfirmable, Code::CHANGED, 0))
                }
                Ok(Received::SetComplete(last)) if s.continues => Some(continue_response(last)),
                // Over CON without 2.31 (libcoap): the ACK is the block's answer.
                Ok(_) if acked => Some(Message::empty_ack(0)),
                Ok(_) => None,
                Err(e) => panic!("the client sent an inconsistent block: {e}"),
            }
        };
        if answer_lost {
            return Ok(Box::pin(std::future::pending()));
        }
        if let Some(a) = answer {
            let delay = if a.code == Code::EMPTY {
                s.ack_delay
            } else {
                std::time::Duration::ZERO
            };
            return Ok(Box::pin(async move {
                tokio::time::sleep(delay).await;
                answered(a)
            }));
        }
        let me = s.seq;
        let server = server.clone();
        Ok(Box::pin(async move {
            tokio::time::sleep(NON_RECEIVE_TIMEOUT).await;
            let missing = {
                let s = server.lock().unwrap();
                let latest = s.seq == me && s.done.is_none();
                if latest {
                    s.body.missing(MAX_PAYLOADS as usize)
                } else {
                    Vec::new()
                }
            };
            if missing.is_empty() {
                return std::future::pending().await;
            }
            answered(incomplete_response(&missing, 512))
        }))
    }

    async fn run(server: &Arc<Mutex<Sim>>, request: Message) -> Result<Uploaded> {
        upload_via(request, SZX, |m| serve(server, m)).await
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_goes_up_in_sets_once_without_loss_nonstop_with_continues() {
        for mtype in [MessageType::NonConfirmable, MessageType::Confirmable] {
            let data = body(105 * 64 - 10);
            let server = sim(1, 0.0);
            let started = VirtualInstant::now();
            let answer = run(&server, put(data.clone(), mtype)).await.unwrap();
            let Uploaded::Answer(answer) = answer else {
                panic!("not an answer: {answer:?}");
            };
            assert_eq!(answer.code, Code::CHANGED);
            let s = server.lock().unwrap();
            assert_eq!(s.done.as_deref(), Some(&data[..]));
            let nums: Vec<u32> = s.received.iter().map(|r| r.0).collect();
            assert_eq!(
                nums,
                (0..105).collect::<Vec<_>>(),
                "each block once, in order"
            );
            // Every set followed its 2.31 at once.
            assert_eq!(started.elapsed(), std::time::Duration::ZERO);
            // One Request-Tag, and Size1 on every block.
            let tag = s.tags[0].0.clone();
            assert!(tag.is_some());
            assert!(s
                .tags
                .iter()
                .all(|t| t.0 == tag && t.1 == Some(data.len() as u32)));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn without_continues_the_sets_go_non_timeout_apart() {
        let data = body(35 * 64);
        let server = sim(2, 0.0);
        server.lock().unwrap().continues = false;
        let started = VirtualInstant::now();
        let answer = run(&server, put(data.clone(), MessageType::NonConfirmable))
            .await
            .unwrap();
        assert!(matches!(answer, Uploaded::Answer(ref m) if m.code == Code::CHANGED));
        let s = server.lock().unwrap();
        assert_eq!(s.done.as_deref(), Some(&data[..]));
        let at = |n: u32| s.received.iter().find(|r| r.0 == n).unwrap().1 - started;
        assert_eq!(at(9), std::time::Duration::ZERO);
        assert_eq!(at(10), NON_TIMEOUT);
        assert_eq!(at(20), NON_TIMEOUT * 2);
        assert_eq!(at(34), NON_TIMEOUT * 3);
    }

    #[tokio::test(start_paused = true)]
    async fn con_sets_follow_the_acks_of_the_set_before() {
        let data = body(35 * 64 - 1);
        let server = sim(4, 0.0);
        server.lock().unwrap().continues = false;
        let started = VirtualInstant::now();
        let answer = run(&server, put(data.clone(), MessageType::Confirmable))
            .await
            .unwrap();
        assert!(matches!(answer, Uploaded::Answer(ref m) if m.code == Code::CHANGED));
        {
            let s = server.lock().unwrap();
            assert_eq!(s.done.as_deref(), Some(&data[..]));
            let nums: Vec<u32> = s.received.iter().map(|r| r.0).collect();
            assert_eq!(
                nums,
                (0..35).collect::<Vec<_>>(),
                "each block once, in order"
            );
        }
        assert_eq!(
            started.elapsed(),
            std::time::Duration::ZERO,
            "no NON_TIMEOUT"
        );
        // ACKs slower than NON_TIMEOUT: the next set still waits for them.
        let server = sim(5, 0.0);
        let ack_delay = NON_TIMEOUT * 3 / 2;
        {
            let mut s = server.lock().unwrap();
            s.continues = false;
            s.ack_delay = ack_delay;
        }
        let started = VirtualInstant::now();
        let answer = run(&server, put(data.clone(), MessageType::Confirmable))
            .await
            .unwrap();
        assert!(matches!(answer, Uploaded::Answer(ref m) if m.code == Code::CHANGED));
        let s = server.lock().unwrap();
        assert_eq!(s.received.len(), 35, "each block once");
        let at = |n: u32| s.received.iter().find(|r| r.0 == n).unwrap().1 - started;
        assert_eq!(at(10), ack_delay);
        assert_eq!(at(20), ack_delay * 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_arrives_whole_through_loss_both_ways() {
        let data = body(60 * 64 + 17);
        let mut whole = 0;
        for seed in 0..20 {
            let server = sim(seed, 0.2);
            let answer = run(&server, put(data.clone(), MessageType::NonConfirmable)).await;
            let s = server.lock().unwrap();
            match answer {
                Ok(Uploaded::Answer(m)) => {
                    assert_eq!(m.code, Code::CHANGED, "seed {seed}");
                    assert_eq!(s.done.as_deref(), Some(&data[..]), "seed {seed}");
                    whole += 1;
                }
                // The 2.04 itself lost MAX_RETRANSMIT + 1 times (0.2^5), or rounds
                // without progress: rare at 20% both ways.
                Err(Error::BlockTransfer(BlockError::UploadIncomplete { .. })) => {}
                other => panic!("seed {seed}: {other:?}"),
            }
        }
        assert!(whole >= 19, "{whole} of 20 uploads complete");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_server_ends_the_upload_after_max_retransmit_rounds() {
        let server = sim(3, 1.0);
        let started = VirtualInstant::now();
        let err = run(&server, put(body(30 * 64), MessageType::NonConfirmable))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::BlockTransfer(BlockError::UploadIncomplete { rounds, .. })
                    if rounds == MAX_RETRANSMIT
            ),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("Q-Block1 upload incomplete"),
            "{err}"
        );
        // Three sets NON_TIMEOUT apart, then MAX_RETRANSMIT + 1 waits for an answer.
        let waited = NON_TIMEOUT * 2 + (NON_RECEIVE_TIMEOUT + NON_TIMEOUT) * (MAX_RETRANSMIT + 1);
        assert_eq!(started.elapsed(), waited);
        // The last block was sent again once per round.
        assert_eq!(
            server.lock().unwrap().tags.len(),
            30 + MAX_RETRANSMIT as usize
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_without_qblock1_and_other_answers_end_the_upload() {
        let refusing = |code: Code| {
            move |_m: Message| -> Result<BlockAnswer<'static>> {
                let m = Message::new(MessageType::NonConfirmable, code, 0);
                Ok(Box::pin(std::future::ready(answered(m))))
            }
        };
        let request = || put(body(300), MessageType::NonConfirmable);
        let got = upload_via(request(), SZX, refusing(Code::BAD_OPTION)).await;
        assert!(matches!(got, Ok(Uploaded::NotSupported)), "{got:?}");
        let got = upload_via(request(), SZX, refusing(Code::UNAUTHORIZED)).await;
        assert!(
            matches!(got, Ok(Uploaded::Answer(ref m)) if m.code == Code::UNAUTHORIZED),
            "{got:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_listing_ever_other_missing_blocks_is_given_up_on() {
        // Every answer is a 4.08 listing a block other than the one before it.
        let turn = Arc::new(Mutex::new(0u32));
        let sent = Arc::new(Mutex::new(0usize));
        let (t, n) = (turn.clone(), sent.clone());
        let hostile = move |_m: Message| -> Result<BlockAnswer<'static>> {
            *n.lock().unwrap() += 1;
            let mut turn = t.lock().unwrap();
            *turn += 1;
            let m = incomplete_response(&[*turn % 2], 512);
            Ok(Box::pin(std::future::ready(answered(m))))
        };
        let got = upload_via(put(body(3 * 64), MessageType::NonConfirmable), SZX, hostile).await;
        assert!(
            matches!(
                got,
                Err(Error::BlockTransfer(BlockError::UploadIncomplete { .. }))
            ),
            "{got:?}"
        );
        // Three blocks, each sent again at most MAX_RETRANSMIT times, plus one.
        assert!(*sent.lock().unwrap() <= 3 + 3 * MAX_RETRANSMIT as usize + 1);
    }

    #[test]
    fn hostile_missing_lists_are_bounded_or_taken_as_the_answer() {
        // Numbers past what was sent, repeated, unordered, too many: bounded.
        let listed: Vec<u32> = (0..40).rev().chain([5, 5, 1_000_000]).collect();
        let m = incomplete_response(&listed, 512);
        assert_eq!(
            listed_missing(&m, 30),
            Some((0..MAX_PAYLOADS).collect::<Vec<_>>())
        );
        // Not a CBOR sequence of unsigned integers, or without the content format.
        let mut garbage = incomplete_response(&[1], 512);
        garbage.payload = vec![0x61, b'x'];
        assert_eq!(listed_missing(&garbage, 30), None);
        let mut plain = incomplete_response(&[1], 512);
        plain.options.remove(opt::CONTENT_FORMAT);
        assert_eq!(listed_missing(&plain, 30), None);
        // Only blocks not sent yet: nothing to send again.
        assert_eq!(listed_missing(&incomplete_response(&[31], 512), 30), None);
    }
}

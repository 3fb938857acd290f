//! What happens to a request before a handler runs, the same over UDP (a shard) and
//! over TCP or WebSockets (a connection): a request no resource may see is refused
//! (proxy requests, a reserved block size; see [`refusal`]), a Block2 follow-up of a finished upload is
//! answered from the kept response, a block for a streaming upload handler is checked
//! for order, and Block1 and Q-Block1 (RFC 9177) blocks are reassembled into the body.

use super::carried::Carried;
use super::handler::BoxedChunkHandler;
use super::tree::ResourceTree;
use super::validate::refusal;
use super::{Executor, Response};
use cobalt_proto::blockwise::qblock::{qblock2_asked, Q_BLOCK1, Q_BLOCK2};
use cobalt_proto::blockwise::uploads::{upload_key, UploadStep, Uploads};
use cobalt_proto::message::{opt, BlockValue, Code, Message, MessageType, Token};
use std::net::SocketAddr;
use std::time::Instant;

/// One block of an upload to a streaming handler
/// ([`MethodRouter::stream_upload`](super::MethodRouter::stream_upload)).
pub(crate) struct StreamedBlock {
    /// The request, Block1 removed; its payload is the block's data.
    pub request: Message,
    /// Byte offset of the block in the whole body.
    pub offset: usize,
    /// The block is the last (or the body came in one piece).
    pub last: bool,
    /// The request's Block1, echoed in the answer.
    pub block: Option<BlockValue>,
    /// The resource's streaming handler and where it runs.
    pub handler: BoxedChunkHandler,
    /// Where the handler runs.
    pub executor: Executor,
}

/// What to do with a request.
pub(crate) enum Intake {
    /// Answer at once with this (a kept answer's block, 2.31 Continue, 4.00, 4.08,
    /// 4.13 with Size1, 5.03, 5.05).
    Answer(Message),
    /// A Q-Block1 block was taken: answer with this now (2.31 Continue, or the
    /// refusal that ended the upload), or, with `None`, keep the request unanswered
    /// until the upload's missing blocks are asked for with 4.08 (a newer block of
    /// the same upload takes its place; the older one is withheld).
    QBlock {
        /// The upload's key ([`upload_key`]).
        key: Vec<u8>,
        /// The answer due now, if any.
        answer: Option<Message>,
    },
    /// Hand one block to a streaming upload handler.
    Streamed(StreamedBlock),
    /// Run the resource's handler with this request, its body reassembled.
    Handle {
        /// The request (Block1 removed when it completed an upload).
        request: Message,
        /// The last block of a completed upload, echoed in the answer in this option
        /// (Block1, or Q-Block1 for a Q-Block1 upload).
        block1: Option<(u16, BlockValue)>,
        /// The upload's key, to keep a large answer for Block2 follow-ups.
        upload: Option<Vec<u8>>,
    },
}

/// Takes a request from `peer` in, whose options are `carried`: `slice` cuts a Block2
/// block out of a kept answer; `proxying`: a layer handles proxy requests (see
/// [`refusal`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn intake(
    uploads: &mut Uploads,
    tree: &ResourceTree,
    proxying: bool,
    now: Instant,
    peer: SocketAddr,
    mut request: Message,
    carried: Carried,
    slice: impl FnOnce(&Message, Message) -> Message,
) -> Intake {
    if let Some(refused) = refusal(&request, carried, uploads.bert(), proxying) {
        return Intake::Answer(refused.into_message());
    }
    // Only a Block2 follow-up is answered from a kept answer.
    if carried.may_have(opt::BLOCK2) {
        if let Some(block) = uploads.answer_for(now, peer, &request, slice) {
            return Intake::Answer(block);
        }
    }
    if let Some(value) = carried.uint(&request.options, Q_BLOCK1) {
        return qblock1(uploads, now, peer, request, value);
    }
    let block1 = carried.block(&request, opt::BLOCK1);
    if let Some((handler, executor)) = tree.stream_route(&request) {
        let block = block1;
        let offset = match block {
            Some(b) => match uploads.stream_block(now, peer, &request, b) {
                Ok(offset) => offset,
                Err(answer) => return Intake::Answer(answer),
            },
            None => 0,
        };
        request.options.remove(opt::BLOCK1);
        return Intake::Streamed(StreamedBlock {
            request,
            offset,
            last: !block.is_some_and(|b| b.more),
            block,
            handler,
            executor,
        });
    }
    let Some(block) = block1 else {
        return Intake::Handle {
            request,
            block1: None,
            upload: None,
        };
    };
    match uploads.handle(now, peer, &request, block) {
        UploadStep::Continue(answer) | UploadStep::Reject(answer) => Intake::Answer(answer),
        UploadStep::Complete { body, last } => {
            let key = upload_key(&request);
            request.payload = body;
            request.options.remove(opt::BLOCK1);
            Intake::Handle {
                request,
                block1: Some((opt::BLOCK1, last)),
                upload: Some(key),
            }
        }
    }
}

/// A request carrying Q-Block1 `value` (RFC 9177): its block is reassembled with the
/// others of its upload (any order; see [`Uploads::handle_qblock1`]). Q-Block1 with
/// Block1, or a value that is no block, gets 4.00.
fn qblock1(
    uploads: &mut Uploads,
    now: Instant,
    peer: SocketAddr,
    mut request: Message,
    value: u32,
) -> Intake {
    let key = upload_key(&request);
    let block = BlockValue::decode(value).filter(|_| !request.options.contains(opt::BLOCK1));
    let Some(block) = block else {
        let mut m = Message::new(MessageType::Acknowledgement, Code::BAD_REQUEST, 0);
        m.payload = b"Q-Block1 is not a block number, or comes with Block1".to_vec();
        return Intake::QBlock {
            key,
            answer: Some(m),
        };
    };
    match uploads.handle_qblock1(now, peer, &request, block) {
        None => Intake::QBlock { key, answer: None },
        Some(UploadStep::Continue(answer) | UploadStep::Reject(answer)) => Intake::QBlock {
            key,
            answer: Some(answer),
        },
        Some(UploadStep::Complete { body, last }) => {
            request.payload = body;
            request.options.remove(Q_BLOCK1);
            Intake::Handle {
                request,
                block1: Some((Q_BLOCK1, last)),
                upload: Some(key),
            }
        }
    }
}

/// The response to a request that carried `block1` in option `number` (Block1 or
/// Q-Block1): the acknowledgement of a block taken by a streaming handler becomes 2.31
/// Continue, and the block is echoed (RFC 7959 §2.3, RFC 9177 §4.4).
pub(crate) fn acknowledge_block(
    mut response: Response,
    block1: Option<(u16, BlockValue)>,
) -> Response {
    if let Some((number, b)) = block1 {
        if b.more && response.code.is_success() {
            response = Response::new(Code::CONTINUE);
        }
        response.options.set_uint(number, b.encode());
    }
    response
}

/// What a request carrying Q-Block2 (RFC 9177) asks for.
pub(crate) struct QBlock2Ask {
    /// The blocks asked for, in the order given (at most MAX_ASKED_BLOCKS).
    pub asked: Vec<BlockValue>,
    /// Block size exponent of the answer's blocks: the first asked for, at most the
    /// server's.
    pub szx: u8,
    /// The request's [`upload_key`]: where its whole answer is kept.
    pub key: Vec<u8>,
    /// The request's token, carried by every block.
    pub token: Token,
    /// The request was CON: the blocks after the first are CON too.
    pub confirmable: bool,
}

impl QBlock2Ask {
    /// A follow-up asks for blocks other than the first alone (the ones a client
    /// missed, or the next set): served from the kept answer when there is one.
    pub fn is_follow_up(&self) -> bool {
        self.asked.len() > 1 || self.asked.first().is_some_and(|b| b.num > 0)
    }

    /// The block after which the rest of the body is sent (in sets): a first request
    /// (block 0 alone) or a block asked for with the M bit; `None` when only the
    /// blocks listed are wanted.
    pub fn rest_from(&self) -> Option<u32> {
        if let Some(b) = self.asked.iter().find(|b| b.more) {
            return Some(b.num);
        }
        (!self.is_follow_up()).then_some(0)
    }
}

/// A request asking for its answer in Q-Block2 blocks (RFC 9177): what it asks for,
/// its Q-Block2 options removed and the first value moved to Block2 (unless it has
/// Block2 too), so that the handler sees it like a Block2 request; `max_szx` is the
/// server's largest block size. `None` without Q-Block2.
/// `carried` tells the request's options, and learns of the Block2 put in.
pub(crate) fn take_qblock2(
    request: &mut Message,
    carried: &mut Carried,
    max_szx: u8,
) -> Option<Box<QBlock2Ask>> {
    let value = carried.uint(&request.options, Q_BLOCK2)?;
    carried.add(opt::BLOCK2);
    Some(take_qblock2_asked(request, value, max_szx))
}

#[cold]
fn take_qblock2_asked(request: &mut Message, value: u32, max_szx: u8) -> Box<QBlock2Ask> {
    let asked = qblock2_asked(request);
    request.options.remove(Q_BLOCK2);
    if !request.options.contains(opt::BLOCK2) && BlockValue::decode(value).is_some() {
        request.options.set_uint(opt::BLOCK2, value & !0x8);
    }
    Box::new(QBlock2Ask {
        szx: asked.first().map_or(max_szx, |b| b.szx.min(max_szx)),
        asked,
        key: upload_key(request),
        token: request.token.clone(),
        confirmable: request.mtype == MessageType::Confirmable,
    })
}

/// The answer to a Q-Block2 request: a body that fits in its first block is a whole
/// Q-Block2 transfer of one block, so its Block2 becomes Q-Block2 (which is also how a
/// client such as libcoap learns that this server takes Q-Block1 uploads). A longer
/// body goes out in Q-Block2 sets ([`QBlock2Sender`](super::qblock2_send::QBlock2Sender)).
pub(crate) fn answer_in_qblock2(answer: &mut Message) {
    if let Some(b) = answer.block2().filter(|b| b.num == 0 && !b.more) {
        answer.options.remove(opt::BLOCK2);
        answer.options.set_uint(Q_BLOCK2, b.encode());
    }
}

//! The client's block-wise transfers (RFC 7959), over any transport: uploading a
//! body in Block1 blocks and completing a representation from Block2 blocks. Over CoAP
//! over TCP and WebSockets the blocks may be BERT blocks (RFC 8323 §6). Both take the
//! exchange of one request for one response as a function, so the same code runs over
//! UDP, DTLS, TCP and WebSockets.

use crate::error::BlockError;
use crate::server::Response;
use crate::{Error, Result};
use cobalt_proto::blockwise::{check_block, next_block2, upload_continues, BlockSize};
use cobalt_proto::message::{opt, BlockValue, Code, Message};
use std::future::Future;

/// Largest body the client reassembles from blocks (16 MiB).
pub const MAX_BODY: usize = 16 << 20;

/// Uploads a body in Block1 blocks of `size` (BERT blocks included), following the
/// server if it asks for smaller blocks (RFC 7959 §2.5: the block it acknowledged
/// counts whole, the next ones are smaller). Returns the final response
/// and the request to use for fetching further Block2 blocks of it.
pub(crate) async fn upload_via<F, Fut>(
    request: Message,
    mut size: BlockSize,
    mut exchange: F,
) -> Result<(Message, Message)>
where
    F: FnMut(Message) -> Fut,
    Fut: Future<Output = Result<Message>>,
{
    let body = request.payload.clone();
    let mut template = request;
    template.payload.clear();
    let mut offset = 0usize;
    loop {
        let (block, range) = size
            .block_at(body.len(), offset)
            .ok_or(Error::BlockTransfer(BlockError::TooManyBlocks))?;
        let mut req = template.clone();
        req.options.set_uint(opt::BLOCK1, block.encode());
        if offset == 0 {
            req.options.set_uint(opt::SIZE1, body.len() as u32);
        }
        req.payload = body[range.clone()].to_vec();
        let mut resp = exchange(req).await?;
        if resp.code != Code::CONTINUE || !block.more {
            // The acknowledgement of the last block means nothing to the caller.
            resp.options.remove(opt::BLOCK1);
            template.options.remove(opt::BLOCK1);
            template.options.remove(opt::SIZE1);
            return Ok((resp, template));
        }
        let ack = resp.block1();
        let Some((next, next_size)) = upload_continues(size, block, range, ack) else {
            return Err(Error::BlockTransfer(BlockError::WrongAcknowledgement {
                sent: block.num,
                acknowledged: ack.map_or(0, |a| a.num),
            }));
        };
        size = next_size;
        offset = next;
    }
}

/// Completes a representation whose first block is `first`, fetching the following
/// blocks with `exchange` (asking with `request`, without Observe). Every block is
/// checked: it must start where the body so far ends and, unless it is the last, be
/// whole; BERT blocks (SZX 7) are accepted only when `bert` (over a connection on
/// which both ends announced it).
/// Whether `response` is the first block of a body with more blocks to fetch.
pub(crate) fn is_first_of_more(response: &Message) -> bool {
    response.code.is_success() && response.block2().is_some_and(|b| b.more)
}

pub(crate) async fn fetch_rest_via<F, Fut>(
    mut request: Message,
    first: Message,
    bert: bool,
    mut exchange: F,
) -> Result<Response>
where
    F: FnMut(Message) -> Fut,
    Fut: Future<Output = Result<Message>>,
{
    request.options.remove(opt::OBSERVE);
    let Some(mut block) = first.block2().filter(|_| is_first_of_more(&first)) else {
        return Ok(Response::from_message(first));
    };
    checked(block, &first, 0, bert)?;
    let etag = first.options.get(opt::ETAG).map(<[u8]>::to_vec);
    let mut whole = Response::from_message(first);
    while block.more {
        if whole.payload.len() > MAX_BODY {
            return Err(Error::BlockTransfer(BlockError::TooLarge {
                limit: MAX_BODY,
            }));
        }
        let next = next_block2(whole.payload.len(), block)
            .ok_or(Error::BlockTransfer(BlockError::TooManyBlocks))?;
        let mut req = request.clone();
        req.options.set_uint(opt::BLOCK2, next.encode());
        let part = exchange(req).await?;
        if !part.code.is_success() {
            return Err(Error::BlockTransfer(BlockError::Refused {
                code: part.code,
                block: next.num,
            }));
        }
        if part.options.get(opt::ETAG).map(<[u8]>::to_vec) != etag {
            return Err(Error::BlockTransfer(BlockError::Changed));
        }
        block = part
            .block2()
            .ok_or(Error::BlockTransfer(BlockError::MissingBlock2))?;
        checked(block, &part, whole.payload.len(), bert)?;
        whole.payload.extend_from_slice(&part.payload);
    }
    whole.options.remove(opt::BLOCK2);
    Ok(whole)
}

fn checked(block: BlockValue, part: &Message, received: usize, bert: bool) -> Result<()> {
    check_block(block, part.payload.len(), received, bert).map_err(|error| {
        Error::BlockTransfer(BlockError::Invalid {
            block: block.num,
            error,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_proto::blockwise::slice_response_sized;
    use cobalt_proto::message::MessageType;
    use std::sync::{Arc, Mutex};

    fn body(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8).collect()
    }

    fn content(payload: Vec<u8>) -> Message {
        let mut m = Message::new(MessageType::Acknowledgement, Code::CONTENT, 0);
        m.payload = payload;
        m
    }

    /// A server that serves `full` in blocks of `size`.
    fn serving(
        full: Message,
        size: BlockSize,
    ) -> impl FnMut(Message) -> std::future::Ready<Result<Message>> {
        move |req| std::future::ready(Ok(slice_response_sized(&req, full.clone(), size)))
    }

    #[tokio::test]
    async fn bert_downloads_reassemble_and_need_bert() {
        let full = content(body(10_000));
        let size = BlockSize::Bert { units: 3 };
        let get = Message::new(MessageType::Confirmable, Code::GET, 0);
        let first = slice_response_sized(&get, full.clone(), size);
        let r = fetch_rest_via(
            get.clone(),
            first.clone(),
            true,
            serving(full.clone(), size),
        )
        .await
        .unwrap();
        assert_eq!(r.payload, full.payload);
        let err = fetch_rest_via(get, first, false, serving(full, size))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::BlockTransfer(_)), "{err:?}");
    }

    #[tokio::test]
    async fn hostile_blocks_end_the_download() {
        let get = Message::new(MessageType::Confirmable, Code::GET, 0);
        let block = |num, more, len: usize| {
            let mut m = content(vec![7; len]);
            m.options
                .set_uint(opt::BLOCK2, BlockValue::new(num, more, 7).unwrap().encode());
            m
        };
        // A non-final BERT block that is not a multiple of 1024 bytes.
        let err = fetch_rest_via(get.clone(), block(0, true, 1500), true, |_| async {
            Ok(block(1, false, 10))
        })
        .await
        .unwrap_err();
        assert!(matches!(err, Error::BlockTransfer(_)), "{err:?}");
        // A block that skips ahead.
        let err = fetch_rest_via(get, block(0, true, 2048), true, |_| async {
            Ok(block(9, false, 10))
        })
        .await
        .unwrap_err();
        assert!(matches!(err, Error::BlockTransfer(_)), "{err:?}");
    }

    #[tokio::test]
    async fn bert_uploads_send_the_body_once_in_order() {
        let data = body(7000);
        let mut put = Message::new(MessageType::Confirmable, Code::PUT, 0);
        put.payload = data.clone();
        let got = Arc::new(Mutex::new(Vec::new()));
        let seen = got.clone();
        let (last, _) = upload_via(put, BlockSize::Bert { units: 2 }, move |req| {
            let b = req.block1().unwrap();
            assert_eq!(b.szx, 7);
            let mut got = seen.lock().unwrap();
            check_block(b, req.payload.len(), got.len(), true).unwrap();
            got.extend_from_slice(&req.payload);
            let mut resp = Message::new(
                MessageType::Acknowledgement,
                if b.more {
                    Code::CONTINUE
                } else {
                    Code::CHANGED
                },
                0,
            );
            resp.options.set_uint(opt::BLOCK1, b.encode());
            std::future::ready(Ok(resp))
        })
        .await
        .unwrap();
        assert_eq!(last.code, Code::CHANGED);
        assert_eq!(*got.lock().unwrap(), data);
    }

    /// How a renegotiating server numbers its acknowledgement of a block when it asks
    /// for smaller ones.
    #[derive(Clone, Copy)]
    enum AckNum {
        /// The number of the block received, as sent (RFC 7959 Figure 6).
        Echoed,
        /// The offset of the block received, at the new size (Californium).
        Rescaled,
    }

    /// A server that takes every block whole and in order, and from the first block on
    /// asks for blocks of `szx` (a Block1 acknowledgement with that size); returns the
    /// body it reassembled and the blocks it saw.
    async fn upload_to_shrinking_server(
        data: &[u8],
        size: BlockSize,
        szx: u8,
        numbering: AckNum,
    ) -> Result<(Vec<u8>, Vec<BlockValue>)> {
        let mut put = Message::new(MessageType::Confirmable, Code::PUT, 0);
        put.payload = data.to_vec();
        let got = Arc::new(Mutex::new((Vec::new(), Vec::new())));
        let seen = got.clone();
        let (last, _) = upload_via(put, size, move |req| {
            let b = req.block1().unwrap();
            let mut g = seen.lock().unwrap();
            let (body, blocks) = &mut *g;
            blocks.push(b);
            let r = check_block(b, req.payload.len(), body.len(), b.szx == 7).map_err(|error| {
                Error::BlockTransfer(BlockError::Invalid {
                    block: b.num,
                    error,
                })
            });
            body.extend_from_slice(&req.payload);
            let ack = match numbering {
                AckNum::Echoed => BlockValue::new(b.num, b.more, szx.min(b.szx)),
                AckNum::Rescaled => BlockValue::new(
                    (b.offset() / (16 << szx.min(b.szx))) as u32,
                    b.more,
                    szx.min(b.szx),
                ),
            }
            .unwrap();
            let code = if b.more {
                Code::CONTINUE
            } else {
                Code::CHANGED
            };
            let mut resp = Message::new(MessageType::Acknowledgement, code, 0);
            resp.options.set_uint(opt::BLOCK1, ack.encode());
            std::future::ready(r.map(|()| resp))
        })
        .await?;
        assert_eq!(last.code, Code::CHANGED);
        let g = got.lock().unwrap();
        Ok((g.0.clone(), g.1.clone()))
    }

    #[tokio::test]
    async fn a_server_asking_for_smaller_blocks_is_followed_rfc7959_figure_6() {
        // 0/1/1024 acknowledged with 0/1/512: the first block counts at 1024 bytes, the
        // upload goes on with 2/1/512 (the issue seen with Californium: 1/1/512 → 4.08).
        let data = body(3000);
        for numbering in [AckNum::Echoed, AckNum::Rescaled] {
            let (got, blocks) = upload_to_shrinking_server(&data, BlockSize::Szx(6), 5, numbering)
                .await
                .unwrap();
            assert_eq!(got, data);
            let shown: Vec<(u32, u8)> = blocks.iter().map(|b| (b.num, b.szx)).collect();
            assert_eq!(shown, [(0, 6), (2, 5), (3, 5), (4, 5), (5, 5)]);
        }
        // Down to 16 bytes from 128 (Figure 6 itself: 0/1/128 → 0/1/32 → 4/1/32).
        let (got, blocks) =
            upload_to_shrinking_server(&body(200), BlockSize::Szx(3), 1, AckNum::Echoed)
                .await
                .unwrap();
        assert_eq!(got, body(200));
        assert_eq!((blocks[1].num, blocks[1].szx), (4, 1));
    }

    #[tokio::test]
    async fn a_server_asking_for_smaller_blocks_is_followed_from_bert() {
        // A BERT block is acknowledged whole; then 1024-byte blocks follow it.
        let data = body(7000);
        for numbering in [AckNum::Echoed, AckNum::Rescaled] {
            let (got, blocks) =
                upload_to_shrinking_server(&data, BlockSize::Bert { units: 4 }, 6, numbering)
                    .await
                    .unwrap();
            assert_eq!(got, data);
            let shown: Vec<(u32, u8)> = blocks.iter().map(|b| (b.num, b.szx)).collect();
            assert_eq!(shown, [(0, 7), (4, 6), (5, 6), (6, 6)]);
        }
    }

    #[tokio::test]
    async fn an_acknowledgement_of_another_block_ends_the_upload() {
        let mut put = Message::new(MessageType::Confirmable, Code::PUT, 0);
        put.payload = body(3000);
        let err = upload_via(put, BlockSize::Szx(6), |req| {
            let b = req.block1().unwrap();
            let mut resp = Message::new(MessageType::Acknowledgement, Code::CONTINUE, 0);
            let wrong = BlockValue::new(b.num + 3, true, 4).unwrap();
            resp.options.set_uint(opt::BLOCK1, wrong.encode());
            std::future::ready(Ok(resp))
        })
        .await
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("acknowledged block 3 while block 0 was sent"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_server_answering_smaller_blocks_than_asked_is_followed() {
        // The client asks for 1024-byte blocks; the server answers the first at 1024,
        // then in 256-byte blocks (RFC 7959 §2.4: the client takes the size it gets).
        let full = content(body(3000));
        let mut get = Message::new(MessageType::Confirmable, Code::GET, 0);
        get.options
            .set_uint(opt::BLOCK2, BlockValue::new(0, false, 6).unwrap().encode());
        let first = slice_response_sized(&get, full.clone(), BlockSize::Szx(6));
        let asked = Arc::new(Mutex::new(Vec::new()));
        let log = asked.clone();
        let r = fetch_rest_via(get, first, false, move |req| {
            log.lock().unwrap().push(req.block2().unwrap());
            std::future::ready(Ok(slice_response_sized(
                &req,
                full.clone(),
                BlockSize::Szx(4),
            )))
        })
        .await
        .unwrap();
        assert_eq!(r.payload, body(3000));
        let asked: Vec<(u32, u8)> = asked
            .lock()
            .unwrap()
            .iter()
            .map(|b| (b.num, b.szx))
            .collect();
        assert_eq!(asked[..3], [(1, 6), (5, 4), (6, 4)]);
    }
}

//! The client's block-wise transfers (RFC 7959), over any transport: uploading a
//! body in Block1 blocks and completing a representation from Block2 blocks. Over CoAP
//! over TCP and WebSockets the blocks may be BERT blocks (RFC 8323 §6). Both take the
//! exchange of one request for one response as a function, so the same code runs over
//! UDP, DTLS, TCP and WebSockets.

use super::MAX_BODY;
use crate::server::Response;
use crate::{Error, Result};
use cobalt_proto::blockwise::{check_block, BlockSize, BERT_SZX};
use cobalt_proto::message::{opt, BlockValue, Code, Message};
use std::future::Future;

/// Uploads a body in Block1 blocks of `size` (BERT blocks included), following the
/// server if it asks for smaller blocks (RFC 7959 §2.5). Returns the final response
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
            .ok_or_else(|| Error::BlockTransfer("body needs too many blocks".into()))?;
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
        let acked = resp.block1().unwrap_or(block);
        let acked_end = if acked.szx == BERT_SZX && block.szx == BERT_SZX {
            // A BERT block is acknowledged as a whole.
            range.end
        } else {
            if acked.szx < size.szx() {
                size = BlockSize::Szx(acked.szx);
            }
            (acked.num as usize + 1) * acked.size()
        };
        if acked_end <= offset {
            return Err(Error::BlockTransfer(format!(
                "server acknowledged block {} which does not advance the upload",
                acked.num
            )));
        }
        offset = acked_end.min(range.end);
    }
}

/// Completes a representation whose first block is `first`, fetching the following
/// blocks with `exchange` (asking with `request`, without Observe). Every block is
/// checked: it must start where the body so far ends and, unless it is the last, be
/// whole; BERT blocks (SZX 7) are accepted only when `bert` (over a connection on
/// which both ends announced it).
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
    let Some(mut block) = first.block2().filter(|b| b.more && first.code.is_success()) else {
        return Ok(Response::from_message(first));
    };
    checked(block, &first, 0, bert)?;
    let etag = first.options.get(opt::ETAG).map(<[u8]>::to_vec);
    let mut whole = Response::from_message(first);
    while block.more {
        if whole.payload.len() > MAX_BODY {
            return Err(Error::BlockTransfer(format!(
                "representation larger than {MAX_BODY} bytes"
            )));
        }
        let next = u32::try_from(whole.payload.len() / block.size())
            .ok()
            .and_then(|num| BlockValue::new(num, false, block.szx))
            .ok_or_else(|| Error::BlockTransfer("too many blocks".into()))?;
        let mut req = request.clone();
        req.options.set_uint(opt::BLOCK2, next.encode());
        let part = exchange(req).await?;
        if !part.code.is_success() {
            return Err(Error::BlockTransfer(format!(
                "server answered {} to block {}",
                part.code, next.num
            )));
        }
        if part.options.get(opt::ETAG).map(<[u8]>::to_vec) != etag {
            return Err(Error::BlockTransfer(
                "the representation changed during the transfer (ETag differs)".into(),
            ));
        }
        block = part
            .block2()
            .ok_or_else(|| Error::BlockTransfer("a block response lacks Block2".into()))?;
        checked(block, &part, whole.payload.len(), bert)?;
        whole.payload.extend_from_slice(&part.payload);
    }
    whole.options.remove(opt::BLOCK2);
    Ok(whole)
}

fn checked(block: BlockValue, part: &Message, received: usize, bert: bool) -> Result<()> {
    check_block(block, part.payload.len(), received, bert)
        .map_err(|e| Error::BlockTransfer(format!("block {}: {e}", block.num)))
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

    #[tokio::test]
    async fn a_server_asking_for_smaller_blocks_is_followed_from_bert() {
        let data = body(5000);
        let mut put = Message::new(MessageType::Confirmable, Code::PUT, 0);
        put.payload = data.clone();
        let got = Arc::new(Mutex::new(Vec::new()));
        let seen = got.clone();
        upload_via(put, BlockSize::Bert { units: 4 }, move |req| {
            let b = req.block1().unwrap();
            let mut got = seen.lock().unwrap();
            // Take only the first 1024 bytes of whatever comes, as a SZX 6 server would.
            assert_eq!(b.offset(), got.len());
            let take = req.payload.len().min(1024);
            got.extend_from_slice(&req.payload[..take]);
            let done = got.len() == 5000;
            let mut resp = Message::new(
                MessageType::Acknowledgement,
                if done { Code::CHANGED } else { Code::CONTINUE },
                0,
            );
            resp.options.set_uint(
                opt::BLOCK1,
                BlockValue::new((got.len() as u32 - 1) / 1024, !done, 6)
                    .unwrap()
                    .encode(),
            );
            std::future::ready(Ok(resp))
        })
        .await
        .unwrap();
        assert_eq!(*got.lock().unwrap(), data);
    }
}

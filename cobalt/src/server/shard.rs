//! The server role of one shard: dispatch into the resource tree, Block1 reassembly,
//! Block2 slicing, and the observation relations of the peers this shard owns.

use super::intake::{intake, Intake, StreamedBlock};
use super::limits::ServerLimits;
use super::observe::{Change, Observable, Relation, RelationKey, Relations};
use super::tree::ResourceTree;
use super::upload::{acknowledge_block, Uploads};
use super::{BoxFuture, Executor, Request, Response};
use cobalt_proto::blockwise::slice_response;
use cobalt_proto::endpoint::{Endpoint, ExchangeId};
use cobalt_proto::message::{opt, option::encode_uint, BlockValue, Code, Message, Token};
use futures_util::FutureExt;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;
use tokio::sync::mpsc;

/// A handler's answer that was not ready at once, coming back to the shard.
pub(crate) enum Completion {
    /// The response to a request.
    Reply {
        id: ExchangeId,
        response: Response,
        ctx: ReplyContext,
    },
    /// A notification for an observer.
    Notification {
        observable: u64,
        key: RelationKey,
        response: Response,
        confirmable: bool,
    },
}

/// What finishing a response needs to know about its request.
pub(crate) struct ReplyContext {
    /// The request's Block2 option, if any (for slicing).
    block2: Option<BlockValue>,
    /// Echo this in Block1 (the last block of an upload).
    block1: Option<BlockValue>,
    /// The peer and key of a finished upload, to keep a large answer for follow-ups.
    upload: Option<(SocketAddr, Vec<u8>)>,
    /// Register an observer if the response is a success.
    register: Option<(Observable, SocketAddr, Message)>,
}

/// The server role of a shard.
pub(crate) struct ServerShard {
    tree: Arc<ResourceTree>,
    limits: ServerLimits,
    observables: HashMap<u64, Observable>,
    relations: Relations,
    uploads: Uploads,
    completions: mpsc::UnboundedSender<Completion>,
    client: Option<crate::Client>,
}

impl ServerShard {
    pub(crate) fn new(
        tree: Arc<ResourceTree>,
        limits: ServerLimits,
        idle_timeout: std::time::Duration,
        completions: mpsc::UnboundedSender<Completion>,
        client: Option<crate::Client>,
    ) -> ServerShard {
        let observables = tree
            .observables()
            .into_iter()
            .map(|o| (o.id(), o))
            .collect();
        ServerShard {
            uploads: Uploads::new(
                limits.max_body,
                limits.max_uploads,
                limits.max_upload_memory,
                idle_timeout,
            ),
            tree,
            limits,
            observables,
            relations: Relations::default(),
            completions,
            client,
        }
    }

    /// Observe relations held by this shard (for metrics).
    pub(crate) fn observer_count(&self) -> usize {
        self.relations.len()
    }

    /// A new request from the endpoint.
    pub(crate) fn on_request(
        &mut self,
        ep: &mut Endpoint,
        now: Instant,
        id: ExchangeId,
        peer: SocketAddr,
        request: Message,
    ) {
        let observe = request.options.observe();
        if request.code == Code::GET && observe != Some(0) {
            // A GET with the token of an observation, without Observe=0, ends it (RFC 7641 §3.6).
            self.end_relation(&(peer, request.token));
        }
        let szx = self.limits.block_szx;
        let (request, block1, upload) = match intake(
            &mut self.uploads,
            &self.tree,
            now,
            peer,
            request,
            |req, kept| slice_response(req, kept, szx),
        ) {
            Intake::Answer(msg) => {
                let _ = ep.respond(now, id, msg);
                return;
            }
            Intake::Streamed(block) => {
                self.on_streamed_block(ep, now, id, peer, block);
                return;
            }
            Intake::Handle {
                request,
                block1,
                upload,
            } => (request, block1, upload.map(|key| (peer, key))),
        };
        let block2 = request.block2();
        let registration =
            (request.code == Code::GET && observe == Some(0)).then(|| request.clone());
        let routed = match self.tree.route(self.request(peer, request)) {
            Ok(x) => x,
            Err(resp) => {
                let ctx = ReplyContext {
                    block2,
                    block1,
                    upload,
                    register: None,
                };
                self.finish_reply(ep, now, id, resp, ctx);
                return;
            }
        };
        let ctx = ReplyContext {
            block2,
            block1,
            upload,
            register: routed
                .observable
                .zip(registration)
                .map(|(o, r)| (o, peer, r)),
        };
        self.run(ep, now, routed.future, &routed.executor, move |response| {
            Completion::Reply { id, response, ctx }
        });
    }

    /// Runs a handler: inline on this thread when it is ready at once, otherwise on its
    /// executor (or as a task here); either way its response comes back as the
    /// completion `then` makes of it.
    fn run(
        &mut self,
        ep: &mut Endpoint,
        now: Instant,
        fut: BoxFuture,
        executor: &Executor,
        then: impl FnOnce(Response) -> Completion + Send + 'static,
    ) {
        let pending = if executor.is_inline() {
            match run_inline(fut) {
                Ok(resp) => return self.on_completion(ep, now, then(resp)),
                Err(pending) => pending,
            }
        } else {
            guarded(fut)
        };
        let done = self.completions.clone();
        executor.spawn(pending, move |response| {
            let _ = done.send(then(response));
        });
    }

    /// One block of an upload to a streaming handler (checked for order by
    /// [`intake`]): handed to the handler without buffering, answered 2.31 Continue (or
    /// the final response).
    fn on_streamed_block(
        &mut self,
        ep: &mut Endpoint,
        now: Instant,
        id: ExchangeId,
        peer: SocketAddr,
        block: StreamedBlock,
    ) {
        let block2 = block.request.block2();
        let chunk = super::UploadChunk {
            request: self.request(peer, block.request),
            offset: block.offset,
            last: block.last,
        };
        let ctx = ReplyContext {
            block2,
            block1: block.block,
            upload: None,
            register: None,
        };
        self.run(
            ep,
            now,
            (block.handler)(chunk),
            &block.executor,
            move |response| Completion::Reply { id, response, ctx },
        );
    }

    fn request(&self, peer: SocketAddr, message: Message) -> Request {
        let mut r = Request::new(peer, message);
        r.client = self.client.clone();
        r
    }

    /// A handler's late answer.
    pub(crate) fn on_completion(&mut self, ep: &mut Endpoint, now: Instant, c: Completion) {
        match c {
            Completion::Reply { id, response, ctx } => {
                self.finish_reply(ep, now, id, response, ctx)
            }
            Completion::Notification {
                observable,
                key,
                response,
                confirmable,
            } => self.send_notification(ep, now, observable, key, response, confirmable),
        }
    }

    fn finish_reply(
        &mut self,
        ep: &mut Endpoint,
        now: Instant,
        id: ExchangeId,
        mut response: Response,
        ctx: ReplyContext,
    ) {
        if let Some((observable, peer, request)) = ctx.register {
            if response.code.is_success() && observable.observer_count() < self.limits.max_observers
            {
                let key = (peer, request.token);
                let relation = Relation {
                    request,
                    since_con: 0,
                    last_con: now,
                    last: None,
                };
                if self.relations.insert(observable.id(), key, relation) {
                    observable.observer_added();
                }
                response
                    .options
                    .set(opt::OBSERVE, encode_uint(observable.current_seq()));
            }
        }
        // A streamed block that was taken asks for the next one with 2.31.
        let response = acknowledge_block(response, ctx.block1);
        let mut block_req = Message::new(
            cobalt_proto::message::MessageType::Confirmable,
            Code::GET,
            0,
        );
        if let Some(b) = ctx.block2 {
            block_req.options.set(opt::BLOCK2, encode_uint(b.encode()));
        }
        let full = response.into_message();
        let block_size = 1usize << (self.limits.block_szx.min(6) + 4);
        if let Some((peer, key)) = ctx.upload {
            if full.payload.len() > block_size {
                self.uploads.keep_answer(now, peer, key, full.clone());
            }
        }
        // The endpoint holds back what an unverified peer may not get yet (RFC 9175 §2.4).
        let msg = slice_response(&block_req, full, self.limits.block_szx);
        let _ = ep.respond(now, id, msg);
    }

    /// An observable changed: produce a notification for each of its observers here.
    pub(crate) fn on_change(&mut self, ep: &mut Endpoint, now: Instant, change: Change) {
        let Some(observable) = self.observables.get(&change.observable).cloned() else {
            return;
        };
        if change.deleted {
            for ((peer, token), rel) in self.relations.take_all(change.observable) {
                observable.observer_removed();
                let gone = Response::new(Code::NOT_FOUND).into_message();
                let replaces = rel.last.filter(|(_, mid)| ep.is_unacknowledged(peer, *mid));
                ep.notify(now, peer, token, gone, true, replaces);
            }
            return;
        }
        let client = self.client.clone();
        let Some(relations) = self.relations.of(change.observable) else {
            return;
        };
        let mut work: Vec<(RelationKey, BoxFuture, Executor)> = Vec::new();
        for (key, rel) in relations.iter() {
            if change.filter.as_ref().is_some_and(|f| !f(key.0)) {
                continue;
            }
            let mut req = rel.request.clone();
            req.options.remove(opt::BLOCK2);
            let mut request = Request::new(key.0, req);
            request.client = client.clone();
            match self.tree.route(request) {
                Ok(r) => work.push((*key, r.future, r.executor)),
                Err(resp) => work.push((*key, Box::pin(async move { resp }), Executor::Inline)),
            }
        }
        let (observable, confirmable) = (change.observable, change.confirmable);
        for (key, fut, executor) in work {
            self.run(ep, now, fut, &executor, move |response| {
                Completion::Notification {
                    observable,
                    key,
                    response,
                    confirmable,
                }
            });
        }
    }

    fn send_notification(
        &mut self,
        ep: &mut Endpoint,
        now: Instant,
        observable: u64,
        key: RelationKey,
        mut response: Response,
        confirmable: bool,
    ) {
        let Some(handle) = self.observables.get(&observable).cloned() else {
            return;
        };
        let limits = &self.limits;
        let Some(rel) = self.relations.of(observable).and_then(|m| m.get_mut(&key)) else {
            return;
        };
        let (peer, token) = key;
        let success = response.code.is_success();
        if success {
            response
                .options
                .set(opt::OBSERVE, encode_uint(handle.current_seq()));
        }
        let con = confirmable
            || !success
            || rel.since_con + 1 >= limits.observe_con_every
            || now.duration_since(rel.last_con) >= limits.observe_con_interval;
        let replaces = rel.last.filter(|(_, mid)| ep.is_unacknowledged(peer, *mid));
        // A notification carries the first block; the client fetches the rest (RFC 7959 §3.4).
        let first_block = Message::new(
            cobalt_proto::message::MessageType::Confirmable,
            Code::GET,
            0,
        );
        let msg = slice_response(&first_block, response.into_message(), limits.block_szx);
        let last = ep.notify(now, peer, token, msg, con, replaces);
        rel.last = Some(last);
        if con {
            rel.since_con = 0;
            rel.last_con = now;
        } else {
            rel.since_con += 1;
        }
        if !success {
            // An error notification ends the relation (RFC 7641 §4.2).
            self.end_relation(&key);
        }
    }

    /// An answer or notification for `(peer, token)` could not be sent because the
    /// peer's address was never verified: an observation with that token ends.
    pub(crate) fn on_unverified(&mut self, peer: SocketAddr, token: Token) {
        self.end_relation(&(peer, token));
    }

    /// A confirmable notification (or separate response) was not acknowledged.
    pub(crate) fn on_delivery_failed(&mut self, id: ExchangeId) {
        if let Some(key) = self.relations.find_by_last(|_, (eid, _)| eid == id) {
            self.end_relation(&key);
        }
    }

    /// An RST matched no pending CON: it may reject a NON notification.
    pub(crate) fn on_unmatched_reset(&mut self, peer: SocketAddr, mid: u16) {
        if let Some(key) = self
            .relations
            .find_by_last(|k, (_, m)| k.0 == peer && m == mid)
        {
            self.end_relation(&key);
        }
    }

    fn end_relation(&mut self, key: &RelationKey) {
        if let Some(obs) = self.relations.remove(key) {
            if let Some(o) = self.observables.get(&obs) {
                o.observer_removed();
            }
        }
    }
}

/// Polls a handler once on the shard's thread; a handler that is not ready is
/// returned (wrapped to answer 5.00 if it panics later) to be spawned.
fn run_inline(fut: BoxFuture) -> Result<Response, BoxFuture> {
    let mut fut = AssertUnwindSafe(fut).catch_unwind();
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    match std::pin::Pin::new(&mut fut).poll(&mut cx) {
        Poll::Ready(r) => Ok(r.unwrap_or_else(|_| handler_panicked())),
        Poll::Pending => Err(Box::pin(async move {
            fut.await.unwrap_or_else(|_| handler_panicked())
        })),
    }
}

/// A handler future that answers 5.00 instead of unwinding into an executor.
pub(crate) fn guarded(fut: BoxFuture) -> BoxFuture {
    Box::pin(async move {
        AssertUnwindSafe(fut)
            .catch_unwind()
            .await
            .unwrap_or_else(|_| handler_panicked())
    })
}

fn handler_panicked() -> Response {
    tracing::error!("request handler panicked; answering 5.00");
    Response::new(Code::INTERNAL_SERVER_ERROR)
}

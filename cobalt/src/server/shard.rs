//! The server role of one shard: dispatch into the resource tree, Block1 reassembly,
//! Block2 slicing, and the observation relations of the peers this shard owns.

use super::fanout::{FanOut, FanOutStats, Producer, Production};
use super::intake::{acknowledge_block, intake, Intake, StreamedBlock};
use super::limits::ServerLimits;
use super::observe::Observable;
use super::tree::ResourceTree;
use super::{BoxFuture, Executor, Request, Response};
use crate::changes::ChangeInbox;
use crate::metrics::ShardSnapshot;
use crate::runtime::service::Service;
use cobalt_proto::blockwise::slice_response;
use cobalt_proto::blockwise::uploads::{UploadStats, Uploads};
use cobalt_proto::endpoint::{Endpoint, ExchangeId};
use cobalt_proto::message::{opt, option::encode_uint, BlockValue, Code, Message, Token};
use futures_util::FutureExt;
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
    /// A notification produced on an executor.
    Notification {
        production: Production,
        response: Response,
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
    /// Register an observer if the response is a success: the resource, the peer,
    /// the request and the version of the resource's state when the handler started.
    register: Option<(Observable, SocketAddr, Message, u64)>,
}

/// The server role of a shard.
pub(crate) struct ServerShard {
    tree: Arc<ResourceTree>,
    limits: ServerLimits,
    observers: FanOut,
    inbox: Arc<ChangeInbox>,
    uploads: Uploads,
    completions: mpsc::UnboundedSender<Completion>,
    client: Option<crate::Client>,
}

impl ServerShard {
    /// The server role of a shard serving `tree`, whose observable resources post
    /// their changes to `inbox`.
    pub(crate) fn new(
        tree: Arc<ResourceTree>,
        limits: ServerLimits,
        inbox: Arc<ChangeInbox>,
        completions: mpsc::UnboundedSender<Completion>,
        client: Option<crate::Client>,
    ) -> ServerShard {
        let budgets = tree.budgets();
        ServerShard {
            uploads: Uploads::new(limits.uploads.clone(), budgets.counters.clone()),
            observers: FanOut::new(
                tree.observables(),
                budgets.observers.clone(),
                limits.clone(),
            ),
            inbox,
            tree,
            limits,
            completions,
            client,
        }
    }

    /// The fan-out's counters and backlog, and the uploads' (for metrics).
    fn stats(&self) -> (FanOutStats, usize, UploadStats) {
        (
            self.observers.stats(),
            self.observers.backlog(),
            self.uploads.stats(),
        )
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
        if let Some(resp) = run_handler(fut, executor, &self.completions, then) {
            self.on_completion(ep, now, resp);
        }
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

    fn finish_reply(
        &mut self,
        ep: &mut Endpoint,
        now: Instant,
        id: ExchangeId,
        mut response: Response,
        ctx: ReplyContext,
    ) {
        if let Some((observable, peer, request, version)) = ctx.register {
            if response.code.is_success() {
                let key = (peer, request.token);
                match self
                    .observers
                    .register(&observable, key, request, now, version)
                {
                    Ok(()) => response
                        .options
                        .set(opt::OBSERVE, encode_uint(observable.current_seq())),
                    Err(refusal) => {
                        response = Response::from_message(
                            refusal.answer("observers", self.limits.uploads.refusal_max_age),
                        )
                    }
                }
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
}

impl Service for ServerShard {
    type Completion = Completion;

    /// Observe relations held by this shard (for metrics).
    fn observer_count(&self) -> usize {
        self.observers.len()
    }

    /// Where this shard's observable resources post their changes.
    fn changes(&self) -> Arc<ChangeInbox> {
        self.inbox.clone()
    }

    /// Takes the changes posted to the inbox.
    fn take_changes(&mut self) {
        self.observers.on_changes(self.inbox.take());
    }

    /// Whether notifications wait to be sent: call `step`.
    fn has_work(&self) -> bool {
        self.observers.has_work()
    }

    /// Sends up to `observe_batch` notifications (running GET handlers as needed).
    fn step(&mut self, ep: &mut Endpoint, now: Instant) {
        let mut runner = Runner {
            tree: &self.tree,
            client: &self.client,
            completions: &self.completions,
        };
        self.observers
            .step(ep, &mut runner, now, self.limits.observe_batch.max(1));
    }

    /// Datagrams from `peers` were handled: observers waiting for an ACK may go on.
    fn on_heard(&mut self, ep: &Endpoint, peers: &[SocketAddr]) {
        for p in peers {
            self.observers.on_heard(ep, *p);
        }
    }

    /// The next time `handle_timeout` has something to do.
    fn poll_timeout(&self) -> Option<Instant> {
        match (self.observers.poll_timeout(), self.uploads.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Paced observers that are due get their notification; idle uploads expire.
    fn handle_timeout(&mut self, now: Instant) {
        self.observers.handle_timeout(now);
        self.uploads.expire(now);
    }

    /// A new request from the endpoint.
    fn on_request(
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
            self.observers.end(&(peer, request.token));
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
        let token = request.token;
        let mut ctx = ReplyContext {
            block2,
            block1,
            upload,
            register: None,
        };
        let routed = match self.tree.route(self.request(peer, request)) {
            Ok(x) => x,
            Err(resp) => return self.finish_reply(ep, now, id, resp, ctx),
        };
        if let Some((o, r)) = routed.observable.zip(registration) {
            // Refused at once when the budget has no room: no handler run.
            if let Err(refusal) = self.observers.check(&(peer, token)) {
                let resp = Response::from_message(
                    refusal.answer("observers", self.limits.uploads.refusal_max_age),
                );
                return self.finish_reply(ep, now, id, resp, ctx);
            }
            let version = self.observers.version(o.id());
            ctx.register = Some((o, peer, r, version));
        }
        self.run(ep, now, routed.future, &routed.executor, move |response| {
            Completion::Reply { id, response, ctx }
        });
    }

    /// A handler's late answer.
    fn on_completion(&mut self, ep: &mut Endpoint, now: Instant, c: Completion) {
        match c {
            Completion::Reply { id, response, ctx } => {
                self.finish_reply(ep, now, id, response, ctx)
            }
            Completion::Notification {
                production,
                response,
            } => self.observers.produced(ep, now, production, response),
        }
    }

    /// A confirmable notification (or separate response) was not acknowledged.
    fn on_delivery_failed(&mut self, id: ExchangeId) {
        self.observers.on_delivery_failed(id);
    }

    /// An RST matched no pending CON: it may reject a NON notification.
    fn on_unmatched_reset(&mut self, peer: SocketAddr, mid: u16) {
        self.observers.on_unmatched_reset(peer, mid);
    }

    /// An answer or notification for `(peer, token)` could not be sent because the
    /// peer's address was never verified: an observation with that token ends.
    fn on_unverified(&mut self, peer: SocketAddr, token: Token) {
        self.observers.end(&(peer, token));
    }

    fn report(&self, snapshot: ShardSnapshot) -> ShardSnapshot {
        let (fanout, backlog, uploads) = self.stats();
        snapshot.with_server_role(
            fanout.productions,
            fanout.deferred,
            backlog,
            uploads.uploads,
            uploads.bytes,
        )
    }
}

/// Runs GET handlers for notifications the way the shard runs every handler.
struct Runner<'a> {
    tree: &'a ResourceTree,
    client: &'a Option<crate::Client>,
    completions: &'a mpsc::UnboundedSender<Completion>,
}

impl Producer for Runner<'_> {
    fn produce(
        &mut self,
        peer: SocketAddr,
        request: Message,
        production: Production,
    ) -> Option<(Response, Production)> {
        let mut req = Request::new(peer, request).watch_peer(production.peer_read.clone());
        req.client = self.client.clone();
        let (fut, executor) = match self.tree.route(req) {
            Ok(r) => (r.future, r.executor),
            Err(resp) => return Some((resp, production)),
        };
        let ready = run_handler(fut, &executor, self.completions, move |response| {
            Completion::Notification {
                production,
                response,
            }
        });
        match ready {
            Some(Completion::Notification {
                production,
                response,
            }) => Some((response, production)),
            _ => None,
        }
    }
}

/// Runs a handler: inline on this thread when it is ready at once (returning the
/// completion `then` makes of its answer), otherwise on its executor (or as a task
/// here), its completion coming back through `completions`.
fn run_handler(
    fut: BoxFuture,
    executor: &Executor,
    completions: &mpsc::UnboundedSender<Completion>,
    then: impl FnOnce(Response) -> Completion + Send + 'static,
) -> Option<Completion> {
    let pending = if executor.is_inline() {
        match run_inline(fut) {
            Ok(resp) => return Some(then(resp)),
            Err(pending) => pending,
        }
    } else {
        guarded(fut)
    };
    let done = completions.clone();
    executor.spawn(pending, move |response| {
        let _ = done.send(then(response));
    });
    None
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

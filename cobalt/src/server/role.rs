//! The server role, written once over the protocol [`Session`]: dispatch into the
//! resource tree, Block1 reassembly, Block2 slicing, and observe relations with their
//! notifications. A datagram shard runs one over its
//! [`Endpoint`](cobalt_proto::endpoint::Endpoint) (the relations and uploads of the
//! peers the shard owns); a stream listener runs one per connection over its
//! [`Connection`](cobalt_proto::session::stream::Connection) (the connection's
//! relations; uploads shared by the listener's connections). What differs between the
//! transports (block sizes, BERT, confirmable notifications and their ACKs) is the
//! session's.

use super::carried::Carried;
use super::fanout::{FanOut, FanOutStats, Producer, Production, Subscriber};
use super::handoff::run_handler;
use super::intake::{
    acknowledge_block, answer_in_qblock2, intake, take_qblock2, Intake, QBlock2Ask, StreamedBlock,
};
use super::layer::{Front, Layers, ObserverExtras, Passed};
use super::limits::ServerLimits;
use super::observe::Observable;
use super::qblock2_send::QBlock2Sender;
use super::qblock_wait::QBlockWaiting;
use super::routes::CurrentTree;
use super::stream::StreamShared;
use super::tree::Routed;
use super::upload_table::{ConnectionUploads, UploadTable};
use super::{BoxFuture, Executor, Request, Response, UploadChunk};
use crate::changes::ChangeInbox;
use crate::metrics::ShardSnapshot;
use crate::runtime::service::Service;
use crate::transport::identity::Credential;
use cobalt_proto::blockwise::qblock::{qblock2_count, Q_BLOCK2};
use cobalt_proto::blockwise::uploads::Uploads;
use cobalt_proto::endpoint::Event;
use cobalt_proto::message::{opt, option::encode_uint, BlockValue, Code, Message};
use cobalt_proto::observe::relations::RelationKey;
use cobalt_proto::session::{BlockLimits, Inbound, Session, SessionError, SessionEvent};
use cobalt_proto::uri::Scheme;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// Ids of the stream connections' change subscriptions.
static NEXT_SUBSCRIBER: AtomicU64 = AtomicU64::new(1);

/// A handler's answer that was not ready at once, coming back to the role.
pub(crate) enum Completion {
    /// The response to a request.
    Reply {
        id: Inbound,
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
    /// Who asked.
    peer: SocketAddr,
    /// The request's Block2 option, if any (for slicing).
    block2: Option<BlockValue>,
    /// The request asked with Q-Block2 (boxed: rare): a one-block answer carries
    /// Q-Block2, a longer one goes out in Q-Block2 sets on a datagram shard.
    qblock2: Option<Box<QBlock2Ask>>,
    /// Echo this block in this option, Block1 or Q-Block1 (the last block of an
    /// upload, or a streamed block).
    block1: Option<(u16, BlockValue)>,
    /// The key of a finished upload, to keep a large answer for Block2 follow-ups.
    upload: Option<Vec<u8>>,
    /// Register an observer if the response is a success: the resource, the request
    /// and the version of the resource's state when the handler started (boxed: rare,
    /// and the context moves with every handler run).
    register: Option<Box<Registration>>,
    /// The request passed the server's layers: their answer hooks run (boxed: only
    /// on servers with layers).
    layered: Option<Box<Passed>>,
}

/// A registering request as routed, and what to keep of its observer beyond it.
type Registering = (Message, Option<ObserverExtras>);

/// A request past the server's layers: its routing and, for a registration, what to
/// keep of it.
type LayeredRoute = (Result<Routed, Response>, Option<Box<Registering>>);

/// An observer to register if its answer is a success.
struct Registration {
    /// The resource observed.
    observable: Observable,
    /// The registering request as it left the layers.
    request: Message,
    /// The version of the resource's state when the handler started.
    version: u64,
    /// What to keep of the observer beyond its request (a credential, extensions).
    extras: Option<ObserverExtras>,
}

/// The server role over a session, keeping its uploads in `U`.
pub(crate) struct ServerRole<U> {
    /// The routes, refreshed before each request and each batch of notifications.
    tree: CurrentTree,
    limits: ServerLimits,
    blocks: BlockLimits,
    observers: FanOut,
    inbox: Arc<ChangeInbox>,
    uploads: U,
    completions: mpsc::UnboundedSender<Box<Completion>>,
    client: Option<Arc<crate::Client>>,
    /// Handlers handed off the loop whose answers have not come back.
    away: usize,
    /// The server's layers, outermost first.
    layers: Layers,
    /// The transport served (for the peers' identities).
    scheme: Scheme,
    /// A layer handles proxy requests: they are not refused with 5.05.
    proxying: bool,
    /// Q-Block1 requests kept unanswered for a later 4.08 (datagram shards only).
    qblocks: QBlockWaiting,
    /// Q-Block2 bodies being sent in sets (datagram shards only: a stream is
    /// reliable and answers Q-Block2 requests in Block2 blocks).
    qblock2: Option<QBlock2Sender>,
}

/// The role of a datagram shard.
pub(crate) type ShardRole = ServerRole<Uploads>;

/// The role of one stream connection.
pub(crate) type ConnectionRole = ServerRole<ConnectionUploads>;

impl ShardRole {
    /// The role of a shard serving `tree`, whose observable resources post their
    /// changes to `inbox`; `client` is the shard's client for handlers.
    pub(crate) fn for_shard(
        tree: CurrentTree,
        limits: ServerLimits,
        inbox: Arc<ChangeInbox>,
        completions: mpsc::UnboundedSender<Box<Completion>>,
        client: Option<crate::Client>,
        front: Front,
    ) -> ShardRole {
        // One reference count per request instead of cloning the client's handles.
        let client = client.map(Arc::new);
        let budgets = tree.budgets();
        let blocks = BlockLimits {
            szx: limits.block_szx,
            max_bert_block: 0,
        };
        ServerRole {
            uploads: budgets.uploads(limits.uploads.clone()),
            observers: FanOut::new(
                tree.observables(),
                None,
                budgets.observers.clone(),
                limits.clone(),
                blocks,
            )
            .with_layers(front.layers.clone(), front.scheme),
            blocks,
            inbox,
            tree,
            limits,
            completions,
            client,
            away: 0,
            proxying: front.layers.proxies(),
            layers: front.layers,
            scheme: front.scheme,
            qblocks: QBlockWaiting::default(),
            qblock2: Some(QBlock2Sender::default()),
        }
    }
}

impl ConnectionRole {
    /// The role of a new connection of a listener with `peer`: its observed resources
    /// post their changes to an inbox of its own while it observes them.
    pub(crate) fn for_connection(
        shared: &StreamShared,
        peer: SocketAddr,
        completions: mpsc::UnboundedSender<Box<Completion>>,
    ) -> ConnectionRole {
        let inbox = Arc::new(ChangeInbox::default());
        let limits = shared.limits.clone();
        let blocks = BlockLimits {
            szx: limits.block_szx,
            max_bert_block: shared.max_bert_block,
        };
        let subscriber = Subscriber {
            id: NEXT_SUBSCRIBER.fetch_add(1, Ordering::Relaxed),
            peer,
            inbox: inbox.clone(),
        };
        let tree = shared.routes.serve();
        let budget = tree.budgets().observers.clone();
        ServerRole {
            observers: FanOut::new(Vec::new(), Some(subscriber), budget, limits.clone(), blocks)
                .with_layers(shared.front.layers.clone(), shared.front.scheme),
            uploads: shared.uploads.for_peer(peer),
            tree,
            blocks,
            inbox,
            limits,
            completions,
            client: None,
            away: 0,
            proxying: shared.front.layers.proxies(),
            layers: shared.front.layers.clone(),
            scheme: shared.front.scheme,
            qblocks: QBlockWaiting::default(),
            qblock2: None,
        }
    }
}

impl<U: UploadTable> ServerRole<U> {
    /// Runs a handler: inline when it is ready at once, otherwise on its executor (or
    /// as a task here); either way its response comes back as the completion `then`
    /// makes of it.
    fn run<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        fut: BoxFuture,
        executor: &Executor,
        then: impl FnOnce(Response) -> Completion + Send + 'static,
    ) {
        match run_handler(fut, executor, &self.completions, then) {
            Some(done) => self.complete(session, now, done),
            None => self.away += 1,
        }
    }

    /// One block of an upload to a streaming handler (checked for order by
    /// [`intake`]): handed to the handler without buffering, answered 2.31 Continue (or
    /// the final response).
    fn on_streamed_block<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        id: Inbound,
        peer: SocketAddr,
        credential: Option<&Arc<Credential>>,
        block: StreamedBlock,
    ) {
        let mut ctx = ReplyContext {
            peer,
            block2: block.request.block2(),
            qblock2: None,
            block1: block.block.map(|b| (opt::BLOCK1, b)),
            upload: None,
            register: None,
            layered: None,
        };
        let mut request = self.request(peer, credential, block.request);
        if let Some(answer) = self.enter_layers(&mut request, &mut ctx) {
            return self.finish_reply(session, now, id, answer, ctx);
        }
        let chunk = UploadChunk {
            request,
            offset: block.offset,
            last: block.last,
        };
        let answer = self.wrap_answer(&ctx, (block.handler)(chunk));
        self.run(session, now, answer, &block.executor, move |response| {
            Completion::Reply { id, response, ctx }
        });
    }

    #[inline]
    fn request(
        &self,
        peer: SocketAddr,
        credential: Option<&Arc<Credential>>,
        message: Message,
    ) -> Request {
        let mut r = Request::new(peer, message);
        r.set_identity(self.scheme, credential.cloned());
        r.client = self.client.clone();
        self.tree.link(&mut r);
        r
    }

    /// Passes `request` through the server's layers (nothing to do without layers);
    /// the answer of a layer that stopped it, if one did.
    #[inline(always)]
    fn enter_layers(&self, request: &mut Request, ctx: &mut ReplyContext) -> Option<Response> {
        if self.layers.is_empty() {
            return None;
        }
        self.pass_layers(request, ctx)
    }

    /// Passes a request through the server's layers and routes it: the routing and,
    /// for a registration, what to keep of it as it left the layers (an unwrapped
    /// request, say); `Err` is the answer of a layer that stopped it. Whether it
    /// registers is decided on the request as it left the layers: an OSCORE request
    /// is a FETCH outside and the GET it registers with only inside.
    #[cold]
    fn route_layered(
        &self,
        peer: SocketAddr,
        credential: Option<&Arc<Credential>>,
        message: Message,
        ctx: &mut ReplyContext,
    ) -> Result<LayeredRoute, Response> {
        let mut request = self.request(peer, credential, message);
        if let Some(answer) = self.pass_layers(&mut request, ctx) {
            return Err(answer);
        }
        let registers = request.method() == Code::GET && request.options().observe() == Some(0);
        let registration =
            registers.then(|| Box::new((request.message().clone(), ObserverExtras::of(&request))));
        Ok((self.tree.route(request), registration))
    }

    /// [`ServerRole::enter_layers`] on a server with layers.
    #[cold]
    fn pass_layers(&self, request: &mut Request, ctx: &mut ReplyContext) -> Option<Response> {
        let (passed, answer) = self.layers.enter(request);
        ctx.layered = Some(Box::new(passed));
        answer
    }

    /// The handler's answer wrapped by the layers the request passed.
    #[inline]
    fn wrap_answer(&self, ctx: &ReplyContext, answer: BoxFuture) -> BoxFuture {
        match &ctx.layered {
            Some(passed) => self.layers.wrap(passed, answer),
            None => answer,
        }
    }

    /// The answer to a registration that the budget refuses (4.29 or 5.03).
    fn refused(&self, refusal: crate::server::budget::Refusal) -> Response {
        Response::from_message(refusal.answer("observers", self.limits.uploads.refusal_max_age))
    }

    fn finish_reply<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        id: Inbound,
        mut response: Response,
        ctx: ReplyContext,
    ) {
        let peer = ctx.peer;
        let mut registered: Option<RelationKey> = None;
        if let Some(registration) = ctx.register {
            let Registration {
                observable,
                mut request,
                version,
                extras,
            } = *registration;
            if let Some(ask) = ctx.qblock2.as_deref().filter(|_| self.qblock2.is_some()) {
                // Its notifications go as Q-Block2 sets too (RFC 9177 §4.4).
                mark_qblock2(&mut request, ask.szx);
            }
            if response.code.is_success() {
                let key = (peer, request.token.clone());
                // An address not yet verified may be forged: its registration holds
                // nothing until the endpoint has sent this answer (Event::Verified).
                let taken = if session.is_verified(now, peer) {
                    self.observers
                        .register(&observable, key.clone(), request, now, version)
                } else {
                    self.observers.await_verification(
                        &observable,
                        key.clone(),
                        request,
                        now,
                        version,
                    )
                };
                match taken {
                    Ok(()) => {
                        response
                            .options
                            .set(opt::OBSERVE, encode_uint(observable.current_seq()));
                        if let Some(extras) = extras {
                            self.observers.keep_extras(key.clone(), extras);
                        }
                        registered = Some(key);
                    }
                    Err(refusal) => response = self.refused(refusal),
                }
            }
        }
        if let Some(passed) = &ctx.layered {
            self.layers.leave(passed, &mut response);
        }
        // A streamed block that was taken asks for the next one with 2.31.
        let full = acknowledge_block(response, ctx.block1).into_message();
        if let Some(ask) = ctx.qblock2.as_deref() {
            if self.qblock2.is_some() && qblock2_count(full.payload.len(), ask.szx) > 1 {
                return self.answer_qblock2(session, now, (id, peer), ask, Some(full), registered);
            }
        }
        let kept = ctx.upload.map(|key| (key, full.clone()));
        // The endpoint holds back what an unverified peer may not get yet (RFC 9175 §2.4).
        let mut out = session.slice(peer, ctx.block2, full, self.blocks);
        if ctx.qblock2.is_some() {
            answer_in_qblock2(&mut out);
        }
        if let Some((key, full)) = kept {
            if out.block2().is_some_and(|b| b.more) {
                // More blocks to come: keep the whole for the client's Block2 follow-ups.
                self.uploads.with(|u| u.keep_answer(now, peer, key, full));
            }
        }
        if !respond(session, now, id, out) {
            if let Some(key) = registered {
                self.observers.end(&key);
            }
        }
    }

    /// Answers a Q-Block2 request with the blocks it asks for and the sets after them
    /// ([`QBlock2Sender::answer`]): `full` is the handler's whole answer, or `None` to
    /// serve a follow-up from the kept one. An answer that cannot be sent ends the
    /// observation it `registered`.
    #[cold]
    fn answer_qblock2<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        to: (Inbound, SocketAddr),
        ask: &QBlock2Ask,
        full: Option<Message>,
        registered: Option<RelationKey>,
    ) {
        let Some(sender) = self.qblock2.as_mut() else {
            return;
        };
        if let Err(e) = sender.answer(session, now, to, ask, &mut self.uploads, full) {
            tracing::debug!(error = %e, "Q-Block2 answer not sent");
            if let Some(key) = registered {
                self.observers.end(&key);
            }
        }
    }

    /// A handler's answer, ready at once or back from an executor.
    #[inline]
    fn complete<S: Session>(&mut self, session: &mut S, now: Instant, done: Completion) {
        match done {
            Completion::Reply { id, response, ctx } => {
                self.finish_reply(session, now, id, response, ctx)
            }
            Completion::Notification {
                production,
                response,
            } => self.notification_produced(session, now, production, response),
        }
    }

    /// A notification's answer came back: out of line, so that [`Self::complete`] stays
    /// small enough to be inlined on the request path.
    #[inline(never)]
    fn notification_produced<S: Session>(
        &mut self,
        session: &mut S,
        now: Instant,
        production: Production,
        response: Response,
    ) {
        self.observers.produced(session, now, production, response);
        self.send_qblock2_sets(session, now);
    }

    /// Sends the other blocks of the notifications that went out as Q-Block2 sets.
    fn send_qblock2_sets<S: Session>(&mut self, session: &mut S, now: Instant) {
        let sets = self.observers.take_qblock2_sets();
        let Some(sender) = self.qblock2.as_mut() else {
            return;
        };
        for set in sets {
            sender.notify_rest(
                session,
                now,
                set.peer,
                &set.ask,
                set.full,
                &mut self.uploads,
            );
        }
    }
}

/// Sends a response; one the transport cannot take (too large for the connection) is
/// replaced by 5.00. True if it was sent.
fn respond<S: Session>(session: &mut S, now: Instant, id: Inbound, msg: Message) -> bool {
    match session.respond(now, id.clone(), msg) {
        Ok(()) => true,
        Err(SessionError::Send(e)) => {
            tracing::debug!(?id, error = %e, "cannot send response; answering 5.00");
            let mut err = Response::new(Code::INTERNAL_SERVER_ERROR);
            err.payload = b"response too large".to_vec();
            let _ = session.respond(now, id, err.into_message());
            false
        }
        Err(e) => {
            tracing::debug!(?id, error = %e, "response not sent");
            false
        }
    }
}

impl<S: Session, U: UploadTable> Service<S> for ServerRole<U> {
    /// A handler's late answer, boxed on its way back (see [`run_handler`]).
    type Completion = Box<Completion>;

    fn on_request(
        &mut self,
        session: &mut S,
        now: Instant,
        id: Inbound,
        peer: SocketAddr,
        credential: Option<&Arc<Credential>>,
        request: Message,
    ) {
        self.tree.refresh();
        let mut carried = Carried::of(&request.options);
        let observe = carried.uint(&request.options, opt::OBSERVE);
        let registers = request.code == Code::GET && observe == Some(0);
        if !registers {
            // Another request with the token of an observation ends it (RFC 7641 §3.6);
            // a registration with it replaces it once answered.
            self.observers.end(&(peer, request.token.clone()));
        }
        let blocks = self.blocks;
        let (tree, proxying) = (&self.tree, self.proxying);
        let step = self.uploads.with(|uploads| {
            intake(
                uploads,
                tree,
                proxying,
                now,
                peer,
                request,
                carried,
                |req, kept| session.slice(peer, req.block2(), kept, blocks),
            )
        });
        let (request, block1, upload) = match step {
            Intake::Answer(msg) => {
                respond(session, now, id, msg);
                return;
            }
            Intake::Streamed(block) => {
                self.on_streamed_block(session, now, id, peer, credential, block);
                return;
            }
            Intake::QBlock { key, answer } => {
                self.qblocks.block(session, now, (peer, key), id, answer);
                return;
            }
            Intake::Handle {
                request,
                block1,
                upload,
            } => (request, block1, upload),
        };
        let mut request = request;
        let qblock2 = take_qblock2(&mut request, &mut carried, self.blocks.szx);
        if let Some(ask) = qblock2.as_deref() {
            let kept = self
                .qblock2
                .as_ref()
                .is_some_and(|q| q.serves_from_kept(now, peer, ask, &mut self.uploads));
            if kept {
                return self.answer_qblock2(session, now, (id, peer), ask, None, None);
            }
        }
        if upload.is_some() {
            self.qblocks.upload_ended();
        }
        let token = request.token.clone();
        let mut ctx = ReplyContext {
            peer,
            block2: carried.block(&request, opt::BLOCK2),
            qblock2,
            block1,
            upload,
            register: None,
            layered: None,
        };
        // Without layers the request goes straight to routing (built in place: this
        // is every request's path).
        let mut registration: Option<Box<Registering>> = None;
        let routed = if self.layers.is_empty() {
            if registers {
                let extras = ObserverExtras::of_credential(credential);
                registration = Some(Box::new((request.clone(), extras)));
            }
            self.tree.route(self.request(peer, credential, request))
        } else {
            match self.route_layered(peer, credential, request, &mut ctx) {
                Ok((routed, kept)) => {
                    registration = kept;
                    routed
                }
                Err(answer) => return self.finish_reply(session, now, id, answer, ctx),
            }
        };
        let routed = match routed {
            Ok(x) => x,
            Err(resp) => return self.finish_reply(session, now, id, resp, ctx),
        };
        if let Some(observable) = routed.observable {
            if let Some(kept) = registration {
                // Refused at once when the budget has no room: no handler run.
                if let Err(refusal) = self.observers.check(&(peer, token)) {
                    let resp = self.refused(refusal);
                    return self.finish_reply(session, now, id, resp, ctx);
                }
                let (request, extras) = *kept;
                let version = self.observers.version(observable.id());
                ctx.register = Some(Box::new(Registration {
                    observable,
                    request,
                    version,
                    extras,
                }));
            }
        }
        let answer = self.wrap_answer(&ctx, routed.future);
        self.run(session, now, answer, &routed.executor, move |response| {
            Completion::Reply { id, response, ctx }
        });
    }

    /// A handler's late answer.
    fn on_completion(&mut self, session: &mut S, now: Instant, done: Box<Completion>) {
        self.away = self.away.saturating_sub(1);
        self.complete(session, now, *done);
    }

    /// An undelivered confirmable notification, an RST rejecting a NON one, or an
    /// answer withheld from an unverified address ends the relation concerned.
    fn on_event(&mut self, event: SessionEvent) {
        match event {
            SessionEvent::Endpoint(Event::ResponseFailed { id, .. }) => {
                self.observers.on_delivery_failed(id)
            }
            SessionEvent::Endpoint(Event::UnmatchedReset { peer, mid }) => {
                self.observers.on_unmatched_reset(peer, mid)
            }
            SessionEvent::Endpoint(Event::Unverified { peer, token, .. }) => {
                self.observers.end(&(peer, token))
            }
            SessionEvent::Endpoint(Event::Verified { peer, token, .. }) => {
                self.observers.verified(&(peer, token))
            }
            _ => {}
        }
    }

    fn changes(&self) -> Arc<ChangeInbox> {
        self.inbox.clone()
    }

    fn take_changes(&mut self) {
        self.observers.on_changes(self.inbox.take());
    }

    fn has_work(&self) -> bool {
        self.observers.has_work()
            || self.qblocks.has_work()
            || self.qblock2.as_ref().is_some_and(QBlock2Sender::has_work)
    }

    /// Sends up to `observe_batch` notifications (running GET handlers as needed).
    fn step(&mut self, session: &mut S, now: Instant) {
        if self.qblocks.has_work() {
            self.qblocks.step(session, now, &mut self.uploads);
        }
        if let Some(sender) = self.qblock2.as_mut().filter(|q| q.has_work()) {
            sender.step(session, now, &mut self.uploads);
        }
        self.tree.refresh();
        let mut runner = Runner {
            tree: &self.tree,
            scheme: self.scheme,
            client: &self.client,
            completions: &self.completions,
            away: &mut self.away,
        };
        self.observers
            .step(session, &mut runner, now, self.limits.observe_batch.max(1));
        self.send_qblock2_sets(session, now);
    }

    /// Observers waiting for an ACK from `peers` may go on.
    fn on_heard(&mut self, session: &S, peers: &[SocketAddr]) {
        for p in peers {
            self.observers.on_heard(session, *p);
        }
    }

    /// Its observe relations follow it; a Block1 upload in progress starts over (the
    /// peer's next block is answered as for a new upload).
    fn on_moved(&mut self, from: SocketAddr, to: SocketAddr) {
        self.observers.move_observer(from, to);
        self.uploads.with(|u| u.forget_peer(from));
    }

    fn poll_timeout(&self) -> Option<Instant> {
        [
            self.observers.poll_timeout(),
            self.uploads.poll_timeout(),
            self.qblocks.poll_timeout(&self.uploads),
            self.qblock2.as_ref().and_then(QBlock2Sender::poll_timeout),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Paced observers that are due get their notification; idle uploads expire; kept
    /// Q-Block1 requests and Q-Block2 sets are looked at in the next step.
    fn handle_timeout(&mut self, now: Instant) {
        self.observers.handle_timeout(now);
        self.uploads.expire(now);
        self.qblocks.handle_timeout();
        if let Some(sender) = self.qblock2.as_mut() {
            sender.handle_timeout();
        }
    }

    fn busy(&self) -> bool {
        self.away > 0
    }

    fn observer_count(&self) -> usize {
        self.observers.len()
    }

    fn report(&self, snapshot: ShardSnapshot) -> ShardSnapshot {
        let fanout: FanOutStats = self.observers.stats();
        let uploads = self.uploads.stats();
        snapshot.with_server_role(
            fanout.productions,
            fanout.deferred,
            self.observers.backlog(),
            uploads.uploads,
            uploads.bytes,
        )
    }
}

/// Runs GET handlers for notifications the way the role runs every handler.
struct Runner<'a> {
    tree: &'a CurrentTree,
    scheme: Scheme,
    client: &'a Option<Arc<crate::Client>>,
    completions: &'a mpsc::UnboundedSender<Box<Completion>>,
    away: &'a mut usize,
}

impl Producer for Runner<'_> {
    fn produce(
        &mut self,
        peer: SocketAddr,
        request: Message,
        extras: Option<&ObserverExtras>,
        production: Production,
    ) -> Option<(Response, Production)> {
        let credential = extras.and_then(|e| e.credential.clone());
        let mut req = Request::new(peer, request)
            .with_identity(self.scheme, credential)
            .watch_peer(production.peer_read.clone());
        if let Some(e) = extras {
            *req.extensions_mut() = e.extensions.clone();
        }
        req.client = self.client.clone();
        self.tree.link(&mut req);
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
            _ => {
                *self.away += 1;
                None
            }
        }
    }
}

#[cfg(test)]
#[path = "role_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "qblock_tests.rs"]
mod qblock_tests;

/// Marks an observer's registration as asking for Q-Block2 blocks of size exponent
/// `szx`, so that the fan-out sends its notifications as Q-Block2 sets.
#[cold]
fn mark_qblock2(registration: &mut Message, szx: u8) {
    if let Some(block) = BlockValue::new(0, false, szx) {
        registration.options.set_uint(Q_BLOCK2, block.encode());
    }
}

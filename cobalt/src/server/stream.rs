//! The server role of one CoAP-over-TCP or -WebSocket connection (RFC 8323): dispatch
//! into the resource tree, Block1 reassembly in the listener's shared [`Uploads`],
//! Block2 slicing (BERT where both ends announced it), and the connection's observe
//! relations, as the [`StreamService`] of its connection: the stream driver
//! (`runtime::listener`) feeds it events and runs the
//! handler futures it hands out; it never touches the transport itself, so every link
//! (TCP, WebSocket, TLS under either) gets the same behaviour.
//!
//! Handlers run on their resource's executor: inline ones on the connection's task,
//! the others on their pool or threads, the answer coming back to the connection. At
//! most one
//! notification per relation is being produced at a time: a change that arrives
//! meanwhile produces one more notification afterwards, from the state then current.

use super::intake::{acknowledge_block, intake, Intake};
use super::observe::Observable;
use super::shard::guarded;
use super::stream_observe::StreamRelations;
use super::tree::ResourceTree;
use super::{BoxFuture, Executor, Request, Response, ServerLimits, UploadChunk};
use crate::changes::ChangeInbox;
use crate::runtime::service::{StreamService, Work};
use cobalt_proto::blockwise::uploads::Uploads;
use cobalt_proto::blockwise::{slice_response_sized, BlockSize};
use cobalt_proto::message::option::encode_uint;
use cobalt_proto::message::{opt, BlockValue, Code, Message, MessageType, TcpMessage, Token};
use cobalt_proto::tcp_connection::{SendError, TcpConnection};
use futures_util::FutureExt;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

/// What one listener's connections share.
pub(crate) struct StreamShared {
    /// The resources.
    pub tree: Arc<ResourceTree>,
    /// Observers, uploads, block size.
    pub limits: ServerLimits,
    /// Uploads in progress and kept answers of all connections: one set of budgets
    /// (`limits.uploads.max_uploads`, `max_upload_memory`, per address) for the listener,
    /// however many connections it has. Idle ones expire on a timer task.
    pub uploads: Arc<Mutex<Uploads>>,
    /// Largest BERT block sent, in bytes.
    pub max_bert_block: usize,
    /// Observe relations on all connections of the listener (a gauge for metrics).
    pub observers: Arc<AtomicU64>,
}

impl StreamShared {
    /// The shared state of a listener whose connections announce BERT when `bert`.
    pub(crate) fn new(
        tree: Arc<ResourceTree>,
        limits: ServerLimits,
        bert: bool,
        max_bert_block: usize,
    ) -> StreamShared {
        let uploads =
            Uploads::new(limits.uploads.clone(), tree.budgets().counters.clone()).with_bert(bert);
        let uploads = Arc::new(Mutex::new(uploads));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(expire_uploads(Arc::downgrade(&uploads)));
        }
        StreamShared {
            tree,
            limits,
            uploads,
            max_bert_block,
            observers: Arc::default(),
        }
    }

    fn uploads(&self) -> MutexGuard<'_, Uploads> {
        self.uploads.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Drops the listener's idle uploads on their timer, until the listener is gone.
async fn expire_uploads(uploads: Weak<Mutex<Uploads>>) {
    loop {
        let next = {
            let Some(uploads) = uploads.upgrade() else {
                return;
            };
            let mut u = uploads.lock().unwrap_or_else(|e| e.into_inner());
            u.expire(Instant::now());
            u.poll_timeout()
        };
        // Nothing held: look again in a second (the timer starts with the first upload).
        let wake = next.unwrap_or_else(|| Instant::now() + std::time::Duration::from_secs(1));
        tokio::time::sleep_until(wake.into()).await;
    }
}

/// A handler's answer, back at the connection.
pub(crate) struct Done {
    token: Token,
    job: Job,
    response: Response,
}

/// A running handler.
type Pending = Pin<Box<dyn Future<Output = Done> + Send>>;

/// The handlers running on one connection, run by its driver.
type Handlers = Work<Done>;

enum Job {
    /// The response to a request.
    Reply(ReplyContext),
    /// A notification for the relation with the token.
    Notification {
        observable: u64,
        /// The Block2 option of the registration: notifications use its size.
        asked: Option<BlockValue>,
    },
}

/// What finishing a response needs to know about its request.
struct ReplyContext {
    /// The request's Block2, for slicing.
    block2: Option<BlockValue>,
    /// Echoed in Block1: the last block of an upload, or a streamed block.
    block1: Option<BlockValue>,
    /// The key of a finished upload, to keep a large answer for Block2 follow-ups.
    upload: Option<Vec<u8>>,
    /// A GET with Observe=0 of an observable resource.
    register: Option<(Observable, Message)>,
}

/// The server side of one connection.
pub(crate) struct StreamServer {
    shared: Arc<StreamShared>,
    peer: SocketAddr,
    relations: StreamRelations,
    inbox: Arc<ChangeInbox>,
    /// Relations whose notification is being produced; `true`: another change came.
    producing: HashMap<Token, bool>,
}

impl StreamServer {
    /// The server side of a new connection with `peer`.
    pub(crate) fn new(shared: Arc<StreamShared>, peer: SocketAddr) -> StreamServer {
        let budget = shared.tree.budgets().observers.clone();
        let relations = StreamRelations::new(peer, shared.observers.clone(), budget);
        StreamServer {
            inbox: relations.inbox(),
            shared,
            peer,
            relations,
            producing: HashMap::new(),
        }
    }
}

impl StreamService for StreamServer {
    type Completion = Done;

    fn changes(&self) -> Arc<ChangeInbox> {
        self.inbox.clone()
    }

    fn relations(&self) -> usize {
        self.relations.len()
    }

    fn on_request(
        &mut self,
        conn: &mut TcpConnection,
        handlers: &mut Handlers,
        token: Token,
        message: TcpMessage,
    ) {
        let now = Instant::now();
        // A new request with a relation's token ends it (RFC 7641 §3.6, §4.1); a GET
        // with Observe=0 registers again when it is answered.
        self.relations.end(&token);
        let request = Message::from(message);
        let observe = request.options.observe();
        let step = {
            let shared = &self.shared;
            let mut uploads = shared.uploads();
            intake(
                &mut uploads,
                &shared.tree,
                now,
                self.peer,
                request,
                |req, kept| Message::from(self.cut(conn, req.block2(), kept)),
            )
        };
        let (request, block1, upload) = match step {
            Intake::Answer(msg) => {
                self.respond(conn, token, TcpMessage::from(msg));
                return;
            }
            Intake::Streamed(block) => {
                let ctx = ReplyContext {
                    block2: block.request.block2(),
                    block1: block.block,
                    upload: None,
                    register: None,
                };
                let chunk = UploadChunk {
                    request: Request::new(self.peer, block.request),
                    offset: block.offset,
                    last: block.last,
                };
                let future = on_executor((block.handler)(chunk), &block.executor);
                handlers.push(pending(token, Job::Reply(ctx), future));
                return;
            }
            Intake::Handle {
                request,
                block1,
                upload,
            } => (request, block1, upload),
        };
        let registration =
            (request.code == Code::GET && observe == Some(0)).then(|| request.clone());
        let mut ctx = ReplyContext {
            block2: request.block2(),
            block1,
            upload,
            register: None,
        };
        match self.shared.tree.route(Request::new(self.peer, request)) {
            Ok(routed) => {
                ctx.register = routed.observable.zip(registration);
                let future = on_executor(routed.future, &routed.executor);
                handlers.push(pending(token, Job::Reply(ctx), future));
            }
            Err(response) => self.finish_reply(conn, token, response, ctx),
        }
    }

    fn on_completion(&mut self, conn: &mut TcpConnection, handlers: &mut Handlers, done: Done) {
        match done.job {
            Job::Reply(ctx) => self.finish_reply(conn, done.token, done.response, ctx),
            Job::Notification { observable, asked } => {
                let again = self.producing.remove(&done.token) == Some(true);
                self.send_notification(conn, done.token, observable, asked, done.response);
                if again {
                    self.produce(handlers, done.token, observable);
                }
            }
        }
    }

    /// Resources observed here changed: start a notification for each relation (4.04
    /// and the end of the relation for a deleted resource).
    fn on_changes(&mut self, conn: &mut TcpConnection, handlers: &mut Handlers) {
        for (observable, change) in self.inbox.take() {
            let deleted = change.deleted;
            for (token, _) in self.relations.of(observable) {
                if deleted {
                    self.relations.end(&token);
                    let _ = conn.notify(Instant::now(), token, TcpMessage::new(Code::NOT_FOUND));
                } else {
                    self.produce(handlers, token, observable);
                }
            }
        }
    }
}

impl StreamServer {
    /// Runs the GET handler for a notification of the relation with `token`, unless
    /// one is running already (then it runs once more when that one is done).
    fn produce(&mut self, handlers: &mut Handlers, token: Token, observable: u64) {
        if let Some(again) = self.producing.get_mut(&token) {
            *again = true;
            return;
        }
        let Some(mut request) = self.relations.request(&token, observable).cloned() else {
            return;
        };
        let asked = request.block2();
        request.options.remove(opt::BLOCK2);
        let future: BoxFuture = match self.shared.tree.route(Request::new(self.peer, request)) {
            Ok(routed) => on_executor(routed.future, &routed.executor),
            Err(response) => Box::pin(async move { response }),
        };
        self.producing.insert(token, false);
        handlers.push(pending(
            token,
            Job::Notification { observable, asked },
            future,
        ));
    }

    fn send_notification(
        &mut self,
        conn: &mut TcpConnection,
        token: Token,
        observable: u64,
        asked: Option<BlockValue>,
        mut response: Response,
    ) {
        // The relation may have ended, or been replaced, while the handler ran.
        let Some(handle) = self.relations.get(&token, observable) else {
            return;
        };
        let success = response.code.is_success();
        if success {
            response
                .options
                .set(opt::OBSERVE, encode_uint(handle.current_seq()));
        }
        // A notification carries the first block; the client fetches the rest (RFC 7959 §3.4).
        let first = asked.map(|b| BlockValue { num: 0, ..b });
        let msg = self.cut(conn, first, response.into_message());
        let sent = match conn.notify(Instant::now(), token, msg) {
            Err(SendError::TooLarge { .. }) => {
                let _ = conn.notify(
                    Instant::now(),
                    token,
                    TcpMessage::new(Code::INTERNAL_SERVER_ERROR),
                );
                false
            }
            r => r.is_ok(),
        };
        if !sent || !success {
            // An error notification ends the relation (RFC 7641 §4.2).
            self.relations.end(&token);
        }
    }

    fn finish_reply(
        &mut self,
        conn: &mut TcpConnection,
        token: Token,
        mut response: Response,
        ctx: ReplyContext,
    ) {
        let mut registered = false;
        if let Some((observable, request)) = ctx.register {
            if response.code.is_success() {
                let limits = &self.shared.limits;
                match self.relations.register(&observable, token, request, limits) {
                    Ok(()) => {
                        response
                            .options
                            .set(opt::OBSERVE, encode_uint(observable.current_seq()));
                        registered = true;
                    }
                    Err(refusal) => {
                        response = Response::from_message(
                            refusal.answer("observers", limits.uploads.refusal_max_age),
                        )
                    }
                }
            }
        }
        let full = acknowledge_block(response, ctx.block1).into_message();
        let out = self.cut(conn, ctx.block2, full.clone());
        if let Some(key) = ctx.upload {
            // More blocks to come: keep the whole for the client's Block2 follow-ups.
            if out
                .options
                .get_uint(opt::BLOCK2)
                .and_then(BlockValue::decode)
                .is_some_and(|b| b.more)
            {
                self.shared
                    .uploads()
                    .keep_answer(Instant::now(), self.peer, key, full);
            }
        }
        if !self.respond(conn, token, out) && registered {
            self.relations.end(&token);
        }
    }

    /// Sends a response; one the peer cannot take is replaced by 5.00. True if sent.
    fn respond(&self, conn: &mut TcpConnection, token: Token, msg: TcpMessage) -> bool {
        match conn.respond(Instant::now(), token, msg) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(peer = %self.peer, error = %e, "cannot send response; answering 5.00");
                let mut err = TcpMessage::new(Code::INTERNAL_SERVER_ERROR);
                err.payload = b"response too large".to_vec();
                let _ = conn.respond(Instant::now(), token, err);
                false
            }
        }
    }

    /// The message to send for `msg`: whole when it fits the peer's Max-Message-Size
    /// and no block was asked for, else the block asked for (`asked`, or the first),
    /// of the largest size that fits — BERT when both ends announced it.
    fn cut(&self, conn: &TcpConnection, asked: Option<BlockValue>, msg: Message) -> TcpMessage {
        let whole = TcpMessage::from(msg);
        let limit = conn.peer_max_message_size() as usize;
        if asked.is_none() && conn.frame_len(&whole) <= limit {
            return whole;
        }
        let room = conn
            .framing()
            .block_room(limit as u32, &whole, opt::BLOCK2, opt::SIZE2);
        let bert = conn.bert();
        let limits = &self.shared.limits;
        let size = BlockSize::fitting(room, bert, limits.block_szx, self.shared.max_bert_block)
            .unwrap_or(BlockSize::Szx(0));
        let mut request = Message::new(MessageType::Confirmable, Code::GET, 0);
        if let Some(b) = asked {
            request.options.set_uint(opt::BLOCK2, b.encode());
        }
        TcpMessage::from(slice_response_sized(&request, Message::from(whole), size))
    }
}

impl Drop for StreamServer {
    fn drop(&mut self) {
        // The connection is gone: its unfinished uploads and kept answers too.
        self.shared.uploads().forget_peer(self.peer);
    }
}

/// A handler future that answers 5.00 instead of unwinding, tagged for its return.
/// The handler `future` run on `executor`: as it is for an inline resource (the
/// connection's task polls it), otherwise spawned there with its answer sent back.
fn on_executor(future: BoxFuture, executor: &Executor) -> BoxFuture {
    if executor.is_inline() {
        return future;
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    executor.spawn(guarded(future), move |response| {
        let _ = tx.send(response);
    });
    Box::pin(async move {
        rx.await.unwrap_or_else(|_| {
            tracing::error!("executor dropped a handler; answering 5.00");
            Response::new(Code::INTERNAL_SERVER_ERROR)
        })
    })
}

fn pending(token: Token, job: Job, future: BoxFuture) -> Pending {
    Box::pin(guarded(future).map(move |response| Done {
        token,
        job,
        response,
    }))
}

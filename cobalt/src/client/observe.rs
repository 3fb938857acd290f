//! An observation (RFC 7641) on the client side: a stream of fresh notifications, over
//! UDP or DTLS (through the client's driver) or over CoAP over TCP or WebSockets
//! (through the pooled connection, RFC 8323 §7) — one [`Route`] either way.

use super::blockwise::is_first_of_more;
use super::qblock;
use super::route::{echo_challenge, CancelGuard, Route, Sent};
use crate::runtime::notifications;
use crate::server::Response;
use crate::{Error, Result};
use cobalt_proto::blockwise::qblock::Q_BLOCK2;
use cobalt_proto::message::{codec, opt, BlockValue, Message};
use cobalt_proto::observe::is_fresh;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long past a notification's Max-Age the client waits before re-registering.
const REREGISTER_GRACE: Duration = Duration::from_secs(5);

/// Re-registrations in a row without a notification before an observation gives up
/// (see [`Observation::max_reregistrations`]).
pub const MAX_REREGISTRATIONS: u32 = 3;

/// Why and how often an [`Observation`] registered again; see
/// [`Observation::on_reregister`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reregistration {
    /// What happened, in words (e.g. "no notification from 192.0.2.1:5683 for 65 s").
    pub reason: String,
    /// This attempt's number since the last notification, from 1.
    pub attempt: u32,
    /// Attempts allowed before the observation ends with [`Error::ObservationLost`].
    pub max: u32,
}

/// A callback told about each re-registration.
struct Hook(Box<dyn FnMut(&Reregistration) + Send + Sync>);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

/// Notifications of an observed resource.
///
/// - The first item is the registration's response.
/// - Over UDP and DTLS, notifications that arrive out of order are dropped (RFC 7641
///   §3.4: a sequence number that is not newer, unless 128 s have passed). Over TCP
///   and WebSockets, which deliver in order, every notification is passed on.
/// - A notification larger than one block is completed block by block (RFC 7959 §3.4;
///   BERT blocks over TCP and WebSockets). An observation of a request built with
///   [`RequestBuilder::q_block`](crate::RequestBuilder::q_block) over UDP or DTLS asks
///   for its notifications in Q-Block2 sets (RFC 9177 §4.4): their blocks are collected
///   under the registration's token and the missing ones asked for, as for a Q-Block2
///   download; a newer notification that overtakes one still being collected is
///   collected in its place.
/// - If nothing arrives for Max-Age plus a few seconds, the client registers again; after
///   [`MAX_REREGISTRATIONS`] such attempts in a row without a notification (the server
///   went away, or forgot the relation) the observation ends with
///   [`Error::ObservationLost`]. [`Observation::on_reregister`] is told about each.
/// - Over TCP and WebSockets, when the connection is lost the client registers again
///   once on a new connection; if that fails, or the new connection is lost before a
///   notification arrives, the observation ends with the error.
/// - A response without Observe (an error, or a server that does not observe) ends it.
/// - The registration and each notification pass the client's layers
///   ([`Client::layer`](crate::Client::layer)), which see them with the exchange of the
///   registration; a layer that refuses one ends the observation with
///   [`Error::LayerRefused`].
///
/// Ending the relation when the observation is dropped: over UDP the next notification
/// is answered with RST (reactive). Over TCP and WebSockets, which have no RST, the
/// client sends the deregistering GET with Observe=1 and the observation's token in
/// the background, without waiting for its answer, and forgets the token.
/// [`Observation::cancel`] ends it proactively and returns the server's answer.
#[derive(Debug)]
pub struct Observation {
    relation: Relation,
    rx: notifications::Receiver<Result<Message, Error>>,
    on_reregister: Option<Hook>,
}

impl Observation {
    pub(crate) fn register(route: Route, request: Message) -> Result<Observation> {
        let (tx, rx) = notifications::queue(BUFFERED_NOTIFICATIONS);
        Ok(Observation {
            relation: Relation::register(route, request, tx, None)?,
            rx,
            on_reregister: None,
        })
    }

    /// How many times in a row the client registers again when nothing arrives for
    /// Max-Age (plus a grace of a few seconds) before the observation ends with
    /// [`Error::ObservationLost`]. Default [`MAX_REREGISTRATIONS`]; 0 ends it at the
    /// first silence.
    pub fn max_reregistrations(mut self, n: u32) -> Observation {
        self.relation.max_reregistrations = u16::try_from(n).unwrap_or(u16::MAX);
        self
    }

    /// Calls `hook` whenever the client registers again (a silent relation, a lost
    /// connection), e.g. to tell a person what is going on.
    pub fn on_reregister(
        mut self,
        hook: impl FnMut(&Reregistration) + Send + Sync + 'static,
    ) -> Observation {
        self.on_reregister = Some(Hook(Box::new(hook)));
        self
    }

    /// The next fresh notification; `None` once the relation has ended.
    pub async fn next(&mut self) -> Option<Result<Response>> {
        // Only the wait and a block-wise completion are awaited here; what to do with
        // what arrived is decided in `Relation::take`, so that a waiting `next` holds
        // little.
        while !self.relation.ended {
            let wait = self.relation.wait();
            let arrived = tokio::time::timeout(wait, self.rx.recv()).await.ok();
            match self.relation.take(arrived, wait) {
                Step::Wait => {}
                Step::End => return None,
                Step::Give(answer) => return Some(answer),
                Step::Register(report) => {
                    if let (Some(Hook(hook)), Some(report)) = (&mut self.on_reregister, &report) {
                        hook(report);
                    }
                    if let Err(e) = self.reregister() {
                        return Some(self.relation.end(e));
                    }
                }
                Step::Complete(completion) => return Some(self.complete(completion).await),
            }
        }
        None
    }

    /// The rest of a notification that came in blocks. Boxed: the block-wise
    /// exchange is a large future that would otherwise take room in every waiting
    /// [`Observation::next`] (a client may hold many observations; few
    /// notifications come in blocks).
    fn complete(
        &mut self,
        completion: Completion,
    ) -> Pin<Box<dyn Future<Output = Result<Response>> + Send + '_>> {
        let Observation { relation, rx, .. } = self;
        let request = relation.request();
        match completion {
            Completion::Rest(first) => {
                Box::pin(async move { relation.route.fetch_rest(request?, first).await })
            }
            Completion::QBlocks(first, block) => Box::pin(async move {
                let request = request?;
                qblock::complete_notification(
                    &relation.route,
                    &request,
                    (first, block),
                    rx,
                    relation.sent.as_deref_mut(),
                )
                .await
            }),
        }
    }

    /// Turns the observation into a [`futures_core::Stream`].
    pub fn into_stream(self) -> impl futures_core::Stream<Item = Result<Response>> {
        futures_util::stream::unfold(self, |mut o| async move { o.next().await.map(|r| (r, o)) })
    }

    /// Ends the relation proactively with a GET carrying Observe=1 and the
    /// relation's token (RFC 7641 §3.6), and returns the server's answer.
    pub async fn cancel(self) -> Result<Response> {
        self.relation.cancel().await
    }

    fn reregister(&mut self) -> Result<()> {
        let (tx, rx) = notifications::queue(BUFFERED_NOTIFICATIONS);
        self.relation.reregister(tx)?;
        self.rx = rx; // what the old relation queued is dropped with it
        Ok(())
    }
}

/// What one observation keeps between notifications, whoever reads them: an
/// [`Observation`] (a queue of its own) or an
/// [`ObservationSet`](super::ObservationSet) (one queue for all of its members).
#[derive(Debug)]
pub(crate) struct Relation {
    pub(crate) route: Route,
    /// The registration, encoded: a client may hold many relations, and the bytes
    /// take some 30 bytes where the message took 120. Shared where another
    /// relation's registration has the same bytes (an
    /// [`ObservationSet`](super::ObservationSet) of many servers' same resource:
    /// the token is not in them, the server's address is not when the URI names it
    /// by its IP address).
    request: Arc<[u8]>,
    /// Keeps the relation; dropping it ends the relation.
    guard: CancelGuard,
    /// The registration as it left the client's layers (`None` without layers; boxed:
    /// most clients have none, and a client may hold many observations).
    pub(crate) sent: Option<Box<Sent>>,
    /// When the last fresh notification arrived (`None` before the first of this
    /// registration), and its Observe number in `last_seq`: two fields, not an
    /// `Option<(u32, Instant)>`, so that the number fits beside the counters
    /// below (a client may hold many relations).
    last_at: Option<Instant>,
    last_seq: u32,
    /// The last notification's Max-Age, in seconds.
    max_age: u32,
    /// Silent re-registrations since the last notification.
    reregistrations: u16,
    /// At most this many ([`Observation::max_reregistrations`], up to 65,535).
    pub(crate) max_reregistrations: u16,
    ended: bool,
    /// Registered again after a lost connection, and no notification since.
    recovering: bool,
}

impl Relation {
    /// Registers with `request` (Observe=0) on `route`; what arrives goes to
    /// `answers`. The registration is kept encoded, in `like`'s bytes where they are
    /// the same.
    pub(crate) fn register(
        route: Route,
        request: Message,
        answers: notifications::Sender<Result<Message>>,
        like: Option<&Arc<[u8]>>,
    ) -> Result<Relation> {
        let bytes = codec::encode(&request);
        let encoded = match like {
            Some(like) if **like == *bytes => like.clone(),
            _ => bytes.into(),
        };
        let (guard, sent) = route.observe(request, answers)?;
        Ok(Relation {
            route,
            request: encoded,
            guard,
            sent: sent.map(Box::new),
            last_at: None,
            last_seq: 0,
            max_age: 60,
            reregistrations: 0,
            max_reregistrations: MAX_REREGISTRATIONS as u16,
            ended: false,
            recovering: false,
        })
    }

    /// The registration, encoded (to share with relations of the same).
    pub(crate) fn encoded_request(&self) -> &Arc<[u8]> {
        &self.request
    }

    /// The registration.
    pub(crate) fn request(&self) -> Result<Message> {
        Ok(codec::decode(&self.request)?)
    }

    /// Whether the relation has ended (nothing more comes).
    pub(crate) fn ended(&self) -> bool {
        self.ended
    }

    /// How long to wait for the next notification before registering again.
    pub(crate) fn wait(&self) -> Duration {
        Duration::from_secs(u64::from(self.max_age)) + REREGISTER_GRACE
    }

    /// What to do with what `arrived` (`None`: nothing within `wait`; `Some(None)`:
    /// the queue ended).
    pub(crate) fn take(
        &mut self,
        arrived: Option<Option<Result<Message>>>,
        wait: Duration,
    ) -> Step {
        let Some(item) = arrived else {
            let peer = self.route.peer();
            if self.reregistrations >= self.max_reregistrations {
                let attempts = u32::from(self.reregistrations);
                return Step::Give(self.end(Error::ObservationLost { peer, attempts }));
            }
            self.reregistrations += 1;
            tracing::debug!(route = ?self.route, "no notification within Max-Age; registering again");
            return Step::Register(Some(Reregistration {
                reason: format!("no notification from {peer} for {} s", wait.as_secs()),
                attempt: u32::from(self.reregistrations),
                max: u32::from(self.max_reregistrations),
            }));
        };
        let stream = self.route.is_stream();
        let qblock2;
        let msg = match item {
            // Over a stream the channel closes, or reports the connection's end,
            // when the connection is lost: register again on a new one, once.
            None | Some(Err(Error::Connection(_))) if stream && !self.recovering => {
                tracing::debug!(route = ?self.route, "connection lost; registering again");
                self.recovering = true;
                return Step::Register(Some(Reregistration {
                    reason: format!("the connection to {} was lost", self.route.peer()),
                    attempt: 1,
                    max: 1,
                }));
            }
            None => {
                self.ended = true;
                return Step::End;
            }
            Some(Err(e)) => return Step::Give(self.end(e)),
            Some(Ok(mut msg)) => {
                // Q-Block2 is the completion's: taken out before the option check.
                qblock2 = msg.options.get_uint(Q_BLOCK2).and_then(BlockValue::decode);
                msg.options.remove(Q_BLOCK2);
                if let Err(e) = self.route.receive(self.sent.as_deref_mut(), &mut msg) {
                    return Step::Give(self.end(e));
                }
                msg
            }
        };
        if self.last_at.is_none() {
            let request = match self.request() {
                Ok(request) => request,
                Err(e) => return Step::Give(self.end(e)),
            };
            if let Some(retry) = echo_challenge(&request, &msg) {
                // The server wants proof of our address first (RFC 9175): register again with its Echo.
                self.request = codec::encode(&retry).into();
                return Step::Register(None);
            }
        }
        let Some(seq) = msg.options.observe() else {
            self.ended = true;
            return whole(msg, qblock2);
        };
        let now = Instant::now();
        let fresh = self
            .last_at
            .is_none_or(|t1| is_fresh(self.last_seq, t1, seq, now));
        if !stream && !fresh {
            return Step::Wait;
        }
        self.last_at = Some(now);
        self.last_seq = seq;
        self.recovering = false;
        self.reregistrations = 0;
        self.max_age = msg.options.max_age();
        whole(msg, qblock2)
    }

    /// Ends the relation with `e`.
    pub(crate) fn end(&mut self, e: Error) -> Result<Response> {
        self.ended = true;
        Err(e)
    }

    /// Registers again, what arrives going to `answers` from now on; dropping the
    /// old guard ends the silent relation.
    pub(crate) fn reregister(
        &mut self,
        answers: notifications::Sender<Result<Message>>,
    ) -> Result<()> {
        let (guard, sent) = self.route.observe(self.request()?, answers)?;
        self.guard = guard;
        self.sent = sent.map(Box::new);
        self.last_at = None;
        Ok(())
    }

    /// Ends the relation proactively with a GET carrying Observe=1 and the
    /// relation's token (RFC 7641 §3.6), and returns the server's answer.
    pub(crate) async fn cancel(self) -> Result<Response> {
        let mut message = self.request()?;
        message.options.set_uint(opt::OBSERVE, 1);
        let answer = self.route.deregister(self.guard, message).await?;
        Ok(Response::from_message(answer))
    }
}

/// The notification `first` as a response when it is whole, or what completes it:
/// Block2 blocks fetched one by one, or the other blocks of a Q-Block2 set (`qblock2`,
/// its block) collected from the observation's queue.
fn whole(first: Message, qblock2: Option<BlockValue>) -> Step {
    if let Some(block) = qblock2.filter(|b| b.more || b.num > 0) {
        if first.code.is_success() {
            return Step::Complete(Completion::QBlocks(first, block));
        }
    }
    if !is_first_of_more(&first) {
        return Step::Give(Ok(Response::from_message(first)));
    }
    Step::Complete(Completion::Rest(first))
}

/// What the reader of a [`Relation`] does next.
#[derive(Debug)]
pub(crate) enum Step {
    /// Wait for the next notification.
    Wait,
    /// The relation has ended.
    End,
    /// Return this.
    Give(Result<Response>),
    /// Register again (reporting this re-registration, if given).
    Register(Option<Reregistration>),
    /// Return the notification this completes.
    Complete(Completion),
}

/// A notification that came in blocks, to be completed.
#[derive(Debug)]
pub(crate) enum Completion {
    /// Its first Block2 block: fetch the others.
    Rest(Message),
    /// One block of a Q-Block2 set: collect the others from the queue.
    QBlocks(Message, BlockValue),
}

/// Notifications buffered for an observer that does not keep up.
const BUFFERED_NOTIFICATIONS: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    fn future_size<F: Future>(_: &F) -> usize {
        std::mem::size_of::<F>()
    }

    /// A client may hold many observations, each waiting in `next` most of the time
    /// (in a task of its own, as a mashup does): what they hold while they wait is
    /// paid once per observation. (With the block-wise completion inline, a waiting
    /// `next` took 2.7 KB; the observation with a dispatched registration 0.5 KB.)
    #[tokio::test]
    async fn a_waiting_observation_holds_little() {
        let client = crate::Client::new();
        let opening = client.observe("coap://127.0.0.1:9/x");
        assert!(future_size(&opening) <= 64, "{}", future_size(&opening));
        let mut observation = opening.await.unwrap();
        assert!(std::mem::size_of::<Observation>() <= 400);
        let waiting = observation.next();
        assert!(future_size(&waiting) <= 256, "{}", future_size(&waiting));
    }
}

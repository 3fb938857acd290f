//! An observation (RFC 7641) on the client side: a stream of fresh notifications.

use super::{fetch_rest, CancelGuard, Client};
use crate::runtime::driver::{Command, ReplyTo};
use crate::server::Response;
use crate::{Error, Result};
use cobalt_proto::message::{opt, Message};
use cobalt_proto::observe::is_fresh;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// How long past a notification's Max-Age the client waits before re-registering.
const REREGISTER_GRACE: Duration = Duration::from_secs(5);

/// Notifications of an observed resource.
///
/// - The first item is the registration's response.
/// - Notifications that arrive out of order are dropped (RFC 7641 §3.4: a sequence
///   number that is not newer, unless 128 s have passed).
/// - A notification larger than one block is completed block by block (RFC 7959 §3.4).
/// - If nothing arrives for Max-Age plus a few seconds, the client registers again.
/// - A response without Observe (an error, or a server that does not observe) ends it.
///
/// Dropping the observation ends the relation reactively: the next notification is
/// answered with RST. [`Observation::cancel`] ends it proactively.
#[derive(Debug)]
pub struct Observation {
    client: Client,
    peer: SocketAddr,
    request: Message,
    rx: mpsc::Receiver<Result<Message, Error>>,
    guard: CancelGuard,
    last: Option<(u32, Instant)>,
    max_age: Duration,
    ended: bool,
}

impl Observation {
    pub(crate) fn register(
        client: Client,
        peer: SocketAddr,
        request: Message,
    ) -> Result<Observation> {
        let (rx, guard) = start(&client, peer, request.clone())?;
        Ok(Observation {
            client,
            peer,
            request,
            rx,
            guard,
            last: None,
            max_age: Duration::from_secs(60),
            ended: false,
        })
    }

    /// The next fresh notification; `None` once the relation has ended.
    pub async fn next(&mut self) -> Option<Result<Response>> {
        while !self.ended {
            let wait = self.max_age + REREGISTER_GRACE;
            let item = match tokio::time::timeout(wait, self.rx.recv()).await {
                Err(_) => {
                    tracing::debug!(peer = %self.peer, "no notification within Max-Age; registering again");
                    if let Err(e) = self.reregister() {
                        self.ended = true;
                        return Some(Err(e));
                    }
                    continue;
                }
                Ok(item) => item,
            };
            let msg = match item {
                None => {
                    self.ended = true;
                    return None;
                }
                Some(Err(e)) => {
                    self.ended = true;
                    return Some(Err(e));
                }
                Some(Ok(msg)) => msg,
            };
            if self.last.is_none() {
                if let Some(retry) = super::echo_challenge(&self.request, &msg) {
                    // The server wants proof of our address first (RFC 9175): register again with its Echo.
                    self.request = retry;
                    if let Err(e) = self.reregister() {
                        self.ended = true;
                        return Some(Err(e));
                    }
                    continue;
                }
            }
            let Some(seq) = msg.options.observe() else {
                self.ended = true;
                return Some(fetch_rest(&self.client, self.peer, self.request.clone(), msg).await);
            };
            let now = Instant::now();
            if !self.last.is_none_or(|(v1, t1)| is_fresh(v1, t1, seq, now)) {
                continue;
            }
            self.last = Some((seq, now));
            self.max_age = Duration::from_secs(u64::from(msg.options.max_age()));
            return Some(fetch_rest(&self.client, self.peer, self.request.clone(), msg).await);
        }
        None
    }

    /// Turns the observation into a [`futures_core::Stream`].
    pub fn into_stream(self) -> impl futures_core::Stream<Item = Result<Response>> {
        futures_util::stream::unfold(self, |mut o| async move { o.next().await.map(|r| (r, o)) })
    }

    /// Ends the relation proactively with a GET carrying Observe=1 and the
    /// relation's token (RFC 7641 §3.6), and returns the server's answer.
    pub async fn cancel(mut self) -> Result<Response> {
        let mut message = self.request.clone();
        message.options.set_uint(opt::OBSERVE, 1);
        let new_key = self.client.next_key();
        let (tx, rx) = oneshot::channel();
        self.guard.armed = false;
        self.guard
            .driver
            .send(Command::Deregister {
                key: self.guard.key,
                new_key,
                message,
                reply: ReplyTo::Once(tx),
            })
            .map_err(|_| Error::Shutdown)?;
        let msg = rx.await.map_err(|_| Error::Shutdown)??;
        Ok(Response::from_message(msg))
    }

    fn reregister(&mut self) -> Result<()> {
        let (rx, guard) = start(&self.client, self.peer, self.request.clone())?;
        self.rx = rx;
        self.guard = guard; // dropping the old guard cancels the silent relation
        self.last = None;
        Ok(())
    }
}

type Started = (mpsc::Receiver<Result<Message, Error>>, CancelGuard);

/// Notifications buffered for an observer that does not keep up.
const BUFFERED_NOTIFICATIONS: usize = 64;

fn start(client: &Client, peer: SocketAddr, request: Message) -> Result<Started> {
    let driver = client.driver_for(&peer)?;
    let key = client.next_key();
    let (tx, rx) = mpsc::channel(BUFFERED_NOTIFICATIONS);
    driver
        .send(Command::Request {
            key,
            peer,
            message: request,
            reply: ReplyTo::Stream(tx),
        })
        .map_err(|_| Error::Shutdown)?;
    Ok((
        rx,
        CancelGuard {
            driver,
            key,
            armed: true,
        },
    ))
}

//! What the application asks of a shard's driver ([`Command`]), and where the answers
//! to its requests go ([`ReplyTo`]).

use crate::Error;
use cobalt_proto::message::Message;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Where the result of a client request goes.
pub(crate) enum ReplyTo {
    /// A single response.
    Once(oneshot::Sender<Result<Message, Error>>),
    /// Every response (observe notifications) until cancelled. Bounded: when the
    /// observer does not keep up, newer notifications are dropped (an observer only
    /// needs the latest state eventually, RFC 7641 §1.3), so memory stays bounded.
    Stream(mpsc::Sender<Result<Message, Error>>),
}

/// What the application asks of a shard.
pub(crate) enum Command {
    /// Send a request; `key` lets the caller cancel it.
    Request {
        key: u64,
        peer: SocketAddr,
        message: Message,
        reply: ReplyTo,
    },
    /// Forget a request (timeout in the caller, dropped observation).
    Cancel { key: u64 },
    /// End an observation proactively: GET with Observe=1 and the relation's token
    /// (RFC 7641 §3.6); the response goes to `reply` under `new_key`.
    Deregister {
        key: u64,
        new_key: u64,
        message: Message,
        reply: ReplyTo,
    },
    /// Stop: answer what is in progress (up to the grace period), then exit.
    Shutdown { grace: Duration },
}

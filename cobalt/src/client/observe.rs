//! An observation (RFC 7641) as a stream of notifications.

use super::CancelGuard;
use crate::server::Response;
use crate::{Error, Result};
use cobalt_proto::message::Message;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// Notifications of an observed resource. The first item is the registration's
/// response. Dropping the observation ends the relation: the next notification is
/// answered with RST.
#[derive(Debug)]
pub struct Observation {
    rx: mpsc::UnboundedReceiver<Result<Message, Error>>,
    _guard: CancelGuard,
}

impl Observation {
    pub(crate) fn new(
        rx: mpsc::UnboundedReceiver<Result<Message, Error>>,
        guard: CancelGuard,
    ) -> Observation {
        Observation { rx, _guard: guard }
    }

    /// The next notification; `None` when the relation has ended (the server answered
    /// without Observe, with an error code, or the endpoint shut down).
    pub async fn next(&mut self) -> Option<Result<Response>> {
        self.rx.recv().await.map(|r| r.map(Response::from_message))
    }
}

impl futures_core::Stream for Observation {
    type Item = Result<Response>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx
            .poll_recv(cx)
            .map(|o| o.map(|r| r.map(Response::from_message)))
    }
}

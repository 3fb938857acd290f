//! A limit on how long a handler may take to answer.

use crate::server::{BoxFuture, Layer, Request, Response};
use cobalt_proto::message::Code;
use std::time::Duration;

/// Answers 5.03 Service Unavailable, with Max-Age and a payload saying why, when a
/// handler has not answered within a duration; the handler's future is dropped then.
///
/// Why 5.03: the server itself could not produce the answer in time, a temporary
/// condition, which RFC 7252 §5.9.3.4 gives to 5.03 (Max-Age says when to try again).
/// 5.04 Gateway Timeout is for a proxy whose upstream did not answer (§5.9.3.5); a
/// proxy's handler can answer it itself.
///
/// The clock is tokio's: the handler runs on a tokio runtime (the shard's, the
/// connection's or its executor's), and tests may pause and advance it.
///
/// ```
/// use cobalt::server::{get, layers::Timeout, Server};
/// use std::time::Duration;
///
/// let server = Server::new()
///     .route("/slow", get(|| async { "late" }).layer(Timeout::new(Duration::from_secs(2))));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Timeout {
    after: Duration,
    max_age: u32,
}

impl Timeout {
    /// Gives handlers `after` to answer; the 5.03 says Max-Age 1 s.
    pub fn new(after: Duration) -> Timeout {
        Timeout { after, max_age: 1 }
    }

    /// The Max-Age of the 5.03, in seconds (when the client may try again).
    pub fn max_age(mut self, seconds: u32) -> Timeout {
        self.max_age = seconds;
        self
    }
}

impl Layer for Timeout {
    fn around(&self, _: &Request, answer: BoxFuture) -> BoxFuture {
        let Timeout { after, max_age } = *self;
        Box::pin(async move {
            match tokio::time::timeout(after, answer).await {
                Ok(response) => response,
                Err(_) => Response::new(Code::SERVICE_UNAVAILABLE)
                    .with_max_age(max_age)
                    .with_payload(format!("the handler did not answer within {after:?}")),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_proto::message::{Message, MessageType};

    fn request() -> Request {
        Request::new(
            "127.0.0.1:1".parse().unwrap(),
            Message::new(MessageType::Confirmable, Code::GET, 1),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_handler_is_answered_5_03_and_a_timely_one_passes() {
        let layer = Timeout::new(Duration::from_secs(2)).max_age(5);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let never: BoxFuture = Box::pin(async move {
            let _ = rx.await;
            Response::text("too late")
        });
        let late = layer.around(&request(), never).await; // the paused clock jumps 2 s
        assert_eq!(late.code, Code::SERVICE_UNAVAILABLE);
        assert_eq!(
            late.options.get_uint(cobalt_proto::message::opt::MAX_AGE),
            Some(5)
        );
        drop(tx);

        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let waits: BoxFuture = Box::pin(async move {
            let _ = rx.await;
            Response::text("on time")
        });
        let answer = tokio::spawn(layer.around(&request(), waits));
        tokio::time::advance(Duration::from_millis(1999)).await;
        tx.send(()).unwrap();
        let answer = answer.await.unwrap();
        assert_eq!(answer.code, Code::CONTENT);
        assert_eq!(answer.payload, b"on time");
    }
}

//! A limit on the handlers in flight.

use crate::server::{BoxFuture, Layer, Request, Response};
use cobalt_proto::message::Code;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Lets at most `max` handlers run at once (over every shard and connection of the
/// server, or of the resource it is given to); a request beyond that is answered 5.03
/// Service Unavailable with Max-Age at once, its handler never polled. A handler
/// counts from its routing until its answer is ready or it is dropped.
///
/// ```
/// use cobalt::server::{get, layers::ConcurrencyLimit, Server};
///
/// let server = Server::new()
///     .layer(ConcurrencyLimit::new(1000))
///     .route("/hello", get(|| async { "hello" }));
/// ```
#[derive(Debug, Clone)]
pub struct ConcurrencyLimit {
    max: usize,
    max_age: u32,
    in_flight: Arc<AtomicUsize>,
}

impl ConcurrencyLimit {
    /// At most `max` handlers at once (at least 1); the 5.03 says Max-Age 1 s.
    pub fn new(max: usize) -> ConcurrencyLimit {
        ConcurrencyLimit {
            max: max.max(1),
            max_age: 1,
            in_flight: Arc::default(),
        }
    }

    /// The Max-Age of the 5.03, in seconds.
    pub fn max_age(mut self, seconds: u32) -> ConcurrencyLimit {
        self.max_age = seconds;
        self
    }

    /// Handlers running now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// A place among the handlers in flight, given back when dropped.
struct Permit(Arc<AtomicUsize>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Layer for ConcurrencyLimit {
    fn around(&self, _: &Request, answer: BoxFuture) -> BoxFuture {
        let taken = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            });
        if taken.is_err() {
            let busy = Response::new(Code::SERVICE_UNAVAILABLE)
                .with_max_age(self.max_age)
                .with_payload(format!(
                    "{} requests are being handled; try again",
                    self.max
                ));
            return Box::pin(std::future::ready(busy));
        }
        let permit = Permit(self.in_flight.clone());
        Box::pin(async move {
            let _permit = permit;
            answer.await
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

    #[tokio::test]
    async fn beyond_the_limit_answers_5_03_until_a_handler_finishes() {
        let layer = ConcurrencyLimit::new(2).max_age(3);
        let mut gates = Vec::new();
        let mut running = Vec::new();
        for _ in 0..2 {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            gates.push(tx);
            let handler: BoxFuture = Box::pin(async move {
                let _ = rx.await;
                Response::text("done")
            });
            running.push(tokio::spawn(layer.around(&request(), handler)));
        }
        assert_eq!(layer.in_flight(), 2);
        let refused = layer
            .around(&request(), Box::pin(async { Response::text("x") }))
            .await;
        assert_eq!(refused.code, Code::SERVICE_UNAVAILABLE);
        assert_eq!(
            refused
                .options
                .get_uint(cobalt_proto::message::opt::MAX_AGE),
            Some(3)
        );
        gates.remove(0).send(()).unwrap();
        assert_eq!(running.remove(0).await.unwrap().code, Code::CONTENT);
        assert_eq!(layer.in_flight(), 1);
        let admitted = layer
            .around(&request(), Box::pin(async { Response::text("x") }))
            .await;
        assert_eq!(admitted.code, Code::CONTENT);
        // A handler dropped before answering gives its place back.
        let left = running.remove(0);
        left.abort();
        assert!(left.await.unwrap_err().is_cancelled());
        assert_eq!(layer.in_flight(), 0);
    }
}

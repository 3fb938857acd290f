//! How a handler's future is run: polled once where the request was taken (the
//! shard's thread or the connection's task), and only if it is not ready then handed
//! to its resource's executor, its answer coming back through a queue. A handler that
//! panics answers 5.00 instead of unwinding into the driver or an executor.

use super::{BoxFuture, Executor, Response};
use cobalt_proto::message::Code;
use futures_util::FutureExt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::task::Poll;
use tokio::sync::mpsc;

/// Runs a handler: inline when it is ready at once (returning what `then` makes of
/// its answer), otherwise on its executor (or as a task here), what `then` makes of
/// its answer coming back through `done`, boxed (a queue allocates its slots in
/// blocks, and there is one queue per stream connection: a pointer per slot keeps an
/// idle connection small).
#[inline]
pub(crate) fn run_handler<C: Send + 'static>(
    fut: BoxFuture,
    executor: &Executor,
    done: &mpsc::UnboundedSender<Box<C>>,
    then: impl FnOnce(Response) -> C + Send + 'static,
) -> Option<C> {
    let pending = if executor.is_inline() {
        match run_inline(fut) {
            Ok(resp) => return Some(then(resp)),
            Err(pending) => pending,
        }
    } else {
        guarded(fut)
    };
    let done = done.clone();
    executor.spawn(pending, move |response| {
        let _ = done.send(Box::new(then(response)));
    });
    None
}

/// Polls a handler once; a handler that is not ready is returned (wrapped to answer
/// 5.00 if it panics later) to be spawned.
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

//! How the answers of Python handlers get back to the threads whose requests they
//! answer, in batches: one wake-up of such a thread per batch rather than per answer.
//!
//! A request for a Python handler is taken on a shard thread (or a connection's
//! task), whose handler future waits for its answer. Sent one by one from the event
//! loop's thread, each answer would wake that thread by itself; on a busy machine
//! the thread then runs at once, handles that one answer and sleeps again, and the
//! loop and the shard take turns per request. Instead, the answers given while the
//! loop handles a batch of requests are held (see [`Held`]) and handed over at the
//! end of the batch to each waiting thread's [`Pump`], a task on that thread's
//! runtime, woken once, that completes the waiting futures there.

use cobalt::Response;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{oneshot, Notify};

/// Where one request's answer goes: the future of its handler.
pub type Responder = oneshot::Sender<Response>;

/// A thread's reply pump: answers queued from other threads, and a task on the
/// thread's runtime that passes them on to the handler futures waiting there.
pub struct Pump {
    queue: Mutex<Vec<(Responder, Response)>>,
    wake: Notify,
    /// The pump's task runs (it ends with its runtime).
    running: AtomicBool,
}

thread_local! {
    /// This thread's pump, made by the first request taken here.
    static THREAD_PUMP: RefCell<Option<Arc<Pump>>> = const { RefCell::new(None) };
}

impl Pump {
    /// The pump of this thread's runtime, its task started on first use; `None`
    /// outside a tokio runtime (answers then go straight to their futures).
    pub fn current() -> Option<Arc<Pump>> {
        THREAD_PUMP.with(|slot| {
            let mut slot = slot.borrow_mut();
            if let Some(pump) = slot.as_ref().filter(|p| p.running.load(Ordering::Acquire)) {
                return Some(pump.clone());
            }
            let runtime = tokio::runtime::Handle::try_current().ok()?;
            let pump = Arc::new(Pump {
                queue: Mutex::new(Vec::new()),
                wake: Notify::new(),
                running: AtomicBool::new(true),
            });
            runtime.spawn(PumpTask(pump.clone()).run());
            *slot = Some(pump.clone());
            Some(pump)
        })
    }

    /// Queues `answers` for this pump's thread and wakes its task (once, however
    /// many there are).
    pub fn deliver(&self, answers: impl IntoIterator<Item = (Responder, Response)>) {
        if !self.running.load(Ordering::Acquire) {
            // The runtime is gone, and with it the futures that waited.
            return;
        }
        let was_empty = {
            let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            let was_empty = queue.is_empty();
            queue.extend(answers);
            was_empty
        };
        if was_empty {
            // A queue that was not empty has a wake-up pending already.
            self.wake.notify_one();
        }
    }
}

/// A pump's task. Dropping it (its runtime shut down, or never ran it) marks the pump
/// stopped, so that the thread's next request makes a new one.
struct PumpTask(Arc<Pump>);

impl PumpTask {
    async fn run(self) {
        let pump = &self.0;
        loop {
            pump.wake.notified().await;
            let answers =
                std::mem::take(&mut *pump.queue.lock().unwrap_or_else(|e| e.into_inner()));
            for (responder, response) in answers {
                // A future that stopped waiting (its exchange ended) drops it.
                let _ = responder.send(response);
            }
        }
    }
}

impl Drop for PumpTask {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
        self.0
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// An answer on its way: to its request's future, through that thread's pump if it
/// has one.
pub struct Reply {
    /// The future that waits for it.
    pub responder: Responder,
    /// The answer.
    pub response: Response,
    /// The pump of the future's thread (none outside a tokio runtime).
    pub pump: Option<Arc<Pump>>,
}

impl Reply {
    /// Hands the answer over now.
    pub fn send(self) {
        match self.pump {
            Some(pump) => pump.deliver([(self.responder, self.response)]),
            None => {
                let _ = self.responder.send(self.response);
            }
        }
    }
}

/// The answers given while the event loop handles a batch: held from `hold` to
/// `release`, and then handed over with one wake-up per pump. Outside a batch an
/// answer goes at once.
#[derive(Default)]
pub struct Held {
    batch: Mutex<Option<Vec<Reply>>>,
}

impl Held {
    /// From now on, answers wait for `release`.
    pub fn hold(&self) {
        let mut batch = self.batch.lock().unwrap_or_else(|e| e.into_inner());
        if batch.is_none() {
            *batch = Some(Vec::new());
        }
    }

    /// Sends `reply`, or keeps it for `release` while a batch is held.
    pub fn send(&self, reply: Reply) {
        let mut batch = self.batch.lock().unwrap_or_else(|e| e.into_inner());
        match batch.as_mut() {
            Some(held) => held.push(reply),
            None => {
                drop(batch);
                reply.send();
            }
        }
    }

    /// Hands over what was held, each pump's answers at once, and stops holding.
    pub fn release(&self) {
        let Some(held) = self.batch.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let mut held = held.into_iter().peekable();
        while let Some(first) = held.next() {
            let Some(pump) = first.pump else {
                let _ = first.responder.send(first.response);
                continue;
            };
            // Consecutive answers for the same thread (the common case: one shard)
            // go in one delivery.
            let mut run = vec![(first.responder, first.response)];
            while let Some(next) =
                held.next_if(|r| r.pump.as_ref().is_some_and(|p| Arc::ptr_eq(p, &pump)))
            {
                run.push((next.responder, next.response));
            }
            pump.deliver(run);
        }
    }
}

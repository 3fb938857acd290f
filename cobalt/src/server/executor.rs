//! Per-resource executors (the paper's business-logic stage): where a resource's
//! handlers run. The default is inline on the shard thread that received the request;
//! a resource (and every resource below it, unless they choose otherwise) can run on
//! its own async pool, on a pool of threads that may block, or one request at a time.

use super::request::{BoxFuture, Response};
use std::io;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

type Job = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Where handlers run. Cheap to clone; the threads stop when the last clone is dropped.
#[derive(Clone, Default)]
pub enum Executor {
    /// On the shard thread, run to completion when possible (the default).
    #[default]
    Inline,
    /// On a multi-threaded async pool of its own: handlers of such a resource run
    /// concurrently, off the shard threads.
    Pool(Arc<AsyncPool>),
    /// On dedicated threads, each running one handler at a time to completion: for
    /// handlers that block (files, databases, computation). With one thread, handlers
    /// of the resource never overlap (mutual exclusion, as the thesis's single-thread
    /// executor).
    Threads(Arc<ThreadPool>),
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Executor::Inline => write!(f, "Inline"),
            Executor::Pool(_) => write!(f, "Pool"),
            Executor::Threads(p) => write!(f, "Threads({})", p.threads),
        }
    }
}

impl Executor {
    /// An async pool with `threads` worker threads.
    pub fn pool(threads: usize) -> io::Result<Executor> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("cobalt-pool")
            .enable_all()
            .build()?;
        Ok(Executor::Pool(Arc::new(AsyncPool { rt: Some(rt) })))
    }

    /// `threads` threads that each run one handler at a time and may block.
    pub fn blocking(threads: usize) -> io::Result<Executor> {
        ThreadPool::new(threads.max(1)).map(|p| Executor::Threads(Arc::new(p)))
    }

    /// One handler at a time, in arrival order, on a thread of its own.
    pub fn exclusive() -> io::Result<Executor> {
        Executor::blocking(1)
    }

    /// Runs `fut` here and hands its response to `done` (from the executor's thread).
    /// `Inline` is handled by the shard itself and is not accepted here.
    pub(crate) fn spawn(&self, fut: BoxFuture, done: impl FnOnce(Response) + Send + 'static) {
        match self {
            Executor::Inline => {
                tokio::spawn(async move { done(fut.await) });
            }
            Executor::Pool(p) => {
                if let Some(rt) = &p.rt {
                    rt.spawn(async move { done(fut.await) });
                }
            }
            Executor::Threads(p) => p.submit(Box::pin(async move { done(fut.await) })),
        }
    }

    /// True for the default, inline execution.
    pub fn is_inline(&self) -> bool {
        matches!(self, Executor::Inline)
    }
}

/// A tokio multi-thread runtime owned by an executor.
pub struct AsyncPool {
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for AsyncPool {
    fn drop(&mut self) {
        // May be dropped from inside another runtime (a shard thread): do not block.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Threads that each run one job at a time to completion.
pub struct ThreadPool {
    queue: Mutex<mpsc::Sender<Job>>,
    threads: usize,
}

impl ThreadPool {
    fn new(threads: usize) -> io::Result<ThreadPool> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads {
            let rx = rx.clone();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            std::thread::Builder::new()
                .name(format!("cobalt-exec-{i}"))
                .spawn(move || loop {
                    let job = {
                        let Ok(rx) = rx.lock() else { return };
                        rx.recv_timeout(Duration::from_secs(3600))
                    };
                    match job {
                        Ok(job) => {
                            rt.block_on(job);
                        }
                        Err(mpsc::RecvTimeoutError::Timeout) => continue,
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                })?;
        }
        Ok(ThreadPool {
            queue: Mutex::new(tx),
            threads,
        })
    }

    fn submit(&self, job: Job) {
        if let Ok(q) = self.queue.lock() {
            let _ = q.send(job);
        }
    }
}

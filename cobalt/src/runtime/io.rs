//! How a shard's datagrams come and go: through a socket the shard owns
//! (`SO_REUSEPORT` mode, the default), or through the paper's stages — receiver
//! threads hand datagrams to protocol workers, sender threads send their answers —
//! over one shared socket, for systems without `SO_REUSEPORT`.

pub use crate::metrics::StageCounters;
use crate::runtime::wake::SocketWaker;
use crate::transport::{mmsg, udp};
use cobalt_proto::endpoint::Transmit;
use std::net::{SocketAddr, UdpSocket as StdSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc;

/// A datagram handed from a receiver thread to a protocol worker.
pub(crate) struct Inbound {
    pub peer: SocketAddr,
    pub bytes: Vec<u8>,
    pub truncated: bool,
}

/// A shard's I/O.
pub(crate) enum ShardIo {
    /// The shard owns this socket, registered with the runtime for reading only
    /// (see [`ShardIo::socket`]).
    Socket {
        socket: AsyncFd<StdSocket>,
        rbuf: Box<mmsg::RecvBatch>,
    },
    /// The only socket on its port (one shard, no listener sharing the port): a
    /// datagram sent to its address reaches this shard and no other, so the shard waits
    /// in a blocking receive on it, as a bare `recvmmsg` responder does, instead of in
    /// the runtime's poller (whose wake-up ran in the kernel for every datagram in and
    /// out), and other threads wake it with a datagram ([`SocketWaker`]). While the
    /// shard must wait for tasks of its runtime too, a duplicate of the socket is
    /// registered with the runtime for reading (`polled`).
    Lone {
        socket: StdSocket,
        rbuf: Box<mmsg::RecvBatch>,
        /// The duplicate registered with the runtime, while the shard waits there.
        polled: Option<AsyncFd<StdSocket>>,
        /// Sends the wake datagrams; `wake` is it as a task waker.
        waker: Arc<SocketWaker>,
        wake: Waker,
        /// The socket's receive timeout now (`SO_RCVTIMEO`; `None`: none, wait forever).
        timeout: Option<Duration>,
    },
    /// Receiver threads feed `inbound`; `outbound` goes to sender threads.
    Staged {
        inbound: mpsc::Receiver<Inbound>,
        outbound: std::sync::mpsc::Sender<Vec<Transmit>>,
    },
}

/// What woke the shard up.
pub(crate) enum Input {
    /// The owned socket has datagrams, or (`errors`) ICMP errors in its error queue
    /// (client sockets, see [`crate::transport::udp::report_unreachable`]).
    Readable { errors: bool },
    /// A datagram from a receiver thread.
    Datagram(Inbound),
    /// No more input will come.
    Closed,
}

impl ShardIo {
    /// Registers `socket` with the current runtime for reading (and its error queue)
    /// only. Registered for writing too, every datagram sent would wake the poller once
    /// the kernel frees its buffer (EPOLLOUT), and the shard's next wait would return at
    /// once with nothing to read; a full send buffer, rare, is waited for with a
    /// registration of its own ([`wait_writable`]).
    pub(crate) fn socket(socket: StdSocket) -> std::io::Result<ShardIo> {
        socket.set_nonblocking(true)?;
        Ok(ShardIo::Socket {
            socket: register(socket, Interest::READABLE | Interest::ERROR)?,
            rbuf: Box::default(),
        })
    }

    /// Prepares `socket`, the only one on its port, for a shard that waits in a
    /// blocking receive on it ([`ShardIo::Lone`]); sends and other receives do not block.
    pub(crate) fn lone(socket: StdSocket) -> std::io::Result<ShardIo> {
        socket.set_nonblocking(false)?;
        socket.set_read_timeout(None)?;
        let waker = SocketWaker::new(socket.local_addr()?)?;
        Ok(ShardIo::Lone {
            socket,
            rbuf: Box::default(),
            polled: None,
            wake: Waker::from(waker.clone()),
            waker,
            timeout: None,
        })
    }

    /// The shard's own socket, if it has one.
    pub(crate) fn own_socket(&self) -> Option<&StdSocket> {
        match self {
            ShardIo::Socket { socket, .. } => Some(socket.get_ref()),
            ShardIo::Lone { socket, .. } => Some(socket),
            ShardIo::Staged { .. } => None,
        }
    }

    /// Receives a batch without waiting; returns how many datagrams it holds (see
    /// [`ShardIo::received`]). `WouldBlock` when none is there.
    pub(crate) fn receive(&mut self) -> std::io::Result<usize> {
        match self {
            ShardIo::Socket { socket, rbuf } => {
                let fd = socket.as_raw_fd();
                // Through the registration: `WouldBlock` clears its readiness.
                socket.try_io(Interest::READABLE, |_| mmsg::recv_batch(fd, rbuf))
            }
            ShardIo::Lone {
                socket,
                rbuf,
                polled,
                ..
            } => match polled {
                Some(polled) => polled.try_io(Interest::READABLE, |s| {
                    mmsg::recv_batch(s.as_raw_fd(), rbuf)
                }),
                None => mmsg::recv_batch(socket.as_raw_fd(), rbuf),
            },
            ShardIo::Staged { .. } => Err(std::io::ErrorKind::WouldBlock.into()),
        }
    }

    /// The senders of the first `n` datagrams of the batch received last, wake
    /// datagrams ([`SocketWaker`]) included.
    pub(crate) fn senders(&self, n: usize) -> &[Option<SocketAddr>] {
        match self {
            ShardIo::Socket { rbuf, .. } | ShardIo::Lone { rbuf, .. } => rbuf.senders(n),
            ShardIo::Staged { .. } => &[],
        }
    }

    /// Datagram `i` of the batch received last: sender, bytes, and whether it was cut
    /// short. `None` past the batch and for a wake datagram ([`SocketWaker`]).
    pub(crate) fn received(&self, i: usize) -> Option<(SocketAddr, &[u8], bool)> {
        match self {
            ShardIo::Socket { rbuf, .. } => rbuf.get(i),
            ShardIo::Lone { rbuf, waker, .. } => rbuf
                .get(i)
                .filter(|(peer, bytes, _)| !waker.is_wake(*peer, bytes)),
            ShardIo::Staged { .. } => None,
        }
    }

    /// Reads the socket's error queue (ICMP errors) into `errors`.
    pub(crate) fn take_errors(&mut self, errors: &mut Vec<(SocketAddr, std::io::Error)>) {
        match self {
            ShardIo::Socket { socket, .. } => {
                let fd = socket.as_raw_fd();
                // Returns WouldBlock once the queue is empty, which clears the error readiness.
                let _ = socket.try_io(Interest::ERROR, |_| udp::take_errors(fd, errors));
            }
            ShardIo::Lone { socket, polled, .. } => {
                let fd = socket.as_raw_fd();
                let _ = match polled {
                    Some(polled) => {
                        polled.try_io(Interest::ERROR, |_| udp::take_errors(fd, errors))
                    }
                    None => udp::take_errors(fd, errors),
                };
            }
            ShardIo::Staged { .. } => {}
        }
    }

    /// For a [`ShardIo::Lone`] socket: what wakes the shard from a blocking receive,
    /// and that waker as a task waker for the queues the shard polls before it blocks.
    pub(crate) fn waker(&self) -> Option<(&SocketWaker, &Waker)> {
        match self {
            ShardIo::Lone { waker, wake, .. } => Some((waker, wake)),
            _ => None,
        }
    }

    /// For a [`ShardIo::Lone`] socket: receives a batch, waiting up to `wait` (for
    /// ever with `None`) for its first datagram; `WouldBlock` when none came. The
    /// socket's registration with the runtime, if any, is dropped first.
    pub(crate) fn receive_waiting(&mut self, wait: Option<Duration>) -> std::io::Result<usize> {
        let ShardIo::Lone {
            socket,
            rbuf,
            polled,
            timeout,
            ..
        } = self
        else {
            return self.receive();
        };
        // Registered, every datagram would still wake the poller in the kernel.
        *polled = None;
        if let Some(new) = receive_timeout(*timeout, wait) {
            socket.set_read_timeout(new)?;
            *timeout = new;
        }
        mmsg::recv_batch_blocking(socket.as_raw_fd(), rbuf)
    }

    /// Waits for input.
    pub(crate) async fn next(&mut self) -> Input {
        match self {
            ShardIo::Lone { socket, polled, .. } => {
                if polled.is_none() {
                    match socket
                        .try_clone()
                        .and_then(|dup| register(dup, Interest::READABLE | Interest::ERROR))
                    {
                        Ok(registered) => *polled = Some(registered),
                        Err(e) => {
                            tracing::error!(error = %e, "cannot register socket");
                            return Input::Closed;
                        }
                    }
                }
                let Some(polled) = polled else {
                    return Input::Closed;
                };
                match polled.ready(Interest::READABLE | Interest::ERROR).await {
                    Ok(ready) => Input::Readable {
                        errors: ready.ready().is_error(),
                    },
                    Err(_) => Input::Closed,
                }
            }
            ShardIo::Socket { socket, .. } => {
                // A pending socket error wakes only ERROR interest, not READABLE.
                match socket.ready(Interest::READABLE | Interest::ERROR).await {
                    Ok(ready) => Input::Readable {
                        errors: ready.ready().is_error(),
                    },
                    Err(_) => Input::Closed,
                }
            }
            ShardIo::Staged { inbound, .. } => match inbound.recv().await {
                Some(d) => Input::Datagram(d),
                None => Input::Closed,
            },
        }
    }
}

/// The receive timeout to set for a blocking receive that must return within `wait`
/// (`None`: whenever), on a socket whose timeout is `current`; `None` to leave it. A
/// timeout is changed only when it would wait past `wait`, or return before half of
/// it (or of the timeout that would replace it); it is set to three quarters of
/// `wait` (whole milliseconds, at least one), so that a deadline that stays put costs
/// a few changes, and one that keeps its distance none.
fn receive_timeout(current: Option<Duration>, wait: Option<Duration>) -> Option<Option<Duration>> {
    const MS: Duration = Duration::from_millis(1);
    /// Without a deadline, a timeout this long or longer is left as it is.
    const IDLE: Duration = Duration::from_secs(1);
    let Some(wait) = wait else {
        return match current {
            Some(c) if c < IDLE => Some(None),
            _ => None,
        };
    };
    let ms = (wait.as_millis() * 3 / 4).clamp(1, u128::from(u32::MAX));
    let new = Duration::from_millis(ms as u64);
    match current {
        Some(c) if c <= wait.max(MS) && c >= new.min(wait / 2) => None,
        _ => Some(Some(new)),
    }
}

/// Waits until `socket`'s send buffer has room, through a registration of a
/// duplicate of it for writing made for this wait alone.
pub(crate) async fn wait_writable(socket: &StdSocket) -> std::io::Result<()> {
    let writer = register(socket.try_clone()?, Interest::WRITABLE)?;
    writer.writable().await.map(drop)
}

/// `socket` registered with the current runtime for `interest`.
fn register(socket: StdSocket, interest: Interest) -> std::io::Result<AsyncFd<StdSocket>> {
    // SAFETY: the socket owns its descriptor, which stays open and the same until the
    // socket is dropped with the AsyncFd; nothing replaces the socket inside it.
    unsafe { AsyncFd::register_with_interest(socket, interest) }.map_err(|e| e.into_parts().1)
}

/// The stage configuration of single-socket mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stages {
    /// Threads receiving from the socket.
    pub receivers: usize,
    /// Threads sending to the socket.
    pub senders: usize,
    /// Protocol workers (each owns the state of the peers hashed to it).
    pub workers: usize,
    /// Datagrams queued per worker; beyond it a confirmable request is answered
    /// 5.03 Service Unavailable by the receiver thread and anything else is dropped.
    pub queue: usize,
}

impl Default for Stages {
    fn default() -> Self {
        Stages {
            receivers: 1,
            senders: 1,
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            queue: 4096,
        }
    }
}

/// The running receiver and sender threads.
pub(crate) struct StageThreads {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl StageThreads {
    /// Stops the receivers and senders (the senders once their queue is drained).
    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Starts the stages over `socket`, returning each worker's I/O and the threads.
pub(crate) fn start_stages(
    socket: StdSocket,
    stages: Stages,
    counters: Arc<StageCounters>,
) -> std::io::Result<(Vec<ShardIo>, StageThreads)> {
    socket.set_nonblocking(false)?;
    // Receivers wake up now and then to notice a stop.
    socket.set_read_timeout(Some(Duration::from_millis(100)))?;
    let stop = Arc::new(AtomicBool::new(false));
    let (out_tx, out_rx) = std::sync::mpsc::channel::<Vec<Transmit>>();
    let out_rx = Arc::new(Mutex::new(out_rx));
    let mut inboxes = Vec::new();
    let mut ios = Vec::new();
    for _ in 0..stages.workers.max(1) {
        let (tx, rx) = mpsc::channel(stages.queue.max(1));
        inboxes.push(tx);
        ios.push(ShardIo::Staged {
            inbound: rx,
            outbound: out_tx.clone(),
        });
    }
    drop(out_tx);
    let mut threads = Vec::new();
    for i in 0..stages.receivers.max(1) {
        let (sock, stop, inboxes, counters) = (
            socket.try_clone()?,
            stop.clone(),
            inboxes.clone(),
            counters.clone(),
        );
        threads.push(
            std::thread::Builder::new()
                .name(format!("cobalt-recv-{i}"))
                .spawn(move || receive_loop(sock, stop, inboxes, counters))?,
        );
    }
    for i in 0..stages.senders.max(1) {
        let (sock, out_rx) = (socket.try_clone()?, out_rx.clone());
        threads.push(
            std::thread::Builder::new()
                .name(format!("cobalt-send-{i}"))
                .spawn(move || send_loop(sock, out_rx))?,
        );
    }
    Ok((ios, StageThreads { stop, threads }))
}

fn worker_for(peer: &SocketAddr, workers: usize) -> usize {
    use std::collections::hash_map::DefaultHasher;
    use std::hash::{BuildHasher, BuildHasherDefault};
    // A fixed hasher: the same peer always goes to the same worker.
    let h = BuildHasherDefault::<DefaultHasher>::default().hash_one(peer);
    (h % workers as u64) as usize
}

fn receive_loop(
    socket: StdSocket,
    stop: Arc<AtomicBool>,
    inboxes: Vec<mpsc::Sender<Inbound>>,
    counters: Arc<StageCounters>,
) {
    let mut batch = Box::<mmsg::RecvBatch>::default();
    let fd = socket.as_raw_fd();
    while !stop.load(Ordering::Relaxed) {
        let n = match mmsg::recv_batch_blocking(fd, &mut batch) {
            Ok(n) => n,
            Err(e) if mmsg::nothing_received(&e) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "receive failed");
                continue;
            }
        };
        for i in 0..n {
            let Some((peer, bytes, truncated)) = batch.get(i) else {
                continue;
            };
            let inbox = &inboxes[worker_for(&peer, inboxes.len())];
            let item = Inbound {
                peer,
                bytes: bytes.to_vec(),
                truncated,
            };
            if let Err(mpsc::error::TrySendError::Full(item)) = inbox.try_send(item) {
                counters.overload.fetch_add(1, Ordering::Relaxed);
                if let Some(reply) = cobalt_proto::endpoint::overload_reply(&item.bytes, 2) {
                    let _ = socket.send_to(&reply, peer);
                }
            }
        }
    }
}

fn send_loop(socket: StdSocket, queue: Arc<Mutex<std::sync::mpsc::Receiver<Vec<Transmit>>>>) {
    let fd = socket.as_raw_fd();
    loop {
        let batch = {
            let Ok(q) = queue.lock() else { return };
            match q.recv() {
                Ok(b) => b,
                Err(_) => return, // every worker is gone
            }
        };
        let mut sent = 0;
        while sent < batch.len() {
            let pending = batch[sent..].iter();
            match mmsg::send_batch(fd, pending.map(|t| (t.peer, t.bytes.as_slice()))) {
                Ok(n) => sent += n.max(1),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_micros(50))
                }
                Err(_) => sent += 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_socket_with_room_is_writable_at_once_and_stays_readable() {
        let socket = StdSocket::bind("127.0.0.1:0").unwrap();
        let to = socket.local_addr().unwrap();
        let waited = tokio::time::timeout(Duration::from_secs(5), wait_writable(&socket)).await;
        assert!(matches!(waited, Ok(Ok(()))), "{waited:?}");
        // The duplicate made for the wait is gone; the shard's registration works.
        let mut io = ShardIo::socket(socket).unwrap();
        let sender = StdSocket::bind("127.0.0.1:0").unwrap();
        sender.send_to(b"x", to).unwrap();
        let input = tokio::time::timeout(Duration::from_secs(5), io.next()).await;
        assert!(
            matches!(input, Ok(Input::Readable { errors: false })),
            "a datagram makes the socket readable"
        );
    }

    #[test]
    fn the_receive_timeout_changes_only_when_it_would_oversleep_or_return_early() {
        let ms = Duration::from_millis;
        assert_eq!(receive_timeout(None, Some(ms(1000))), Some(Some(ms(750))));
        assert_eq!(receive_timeout(Some(ms(750)), Some(ms(900))), None);
        assert_eq!(receive_timeout(Some(ms(750)), Some(ms(1400))), None);
        assert_eq!(
            receive_timeout(Some(ms(750)), Some(ms(749))),
            Some(Some(ms(561))),
            "it would wait past the deadline"
        );
        assert_eq!(
            receive_timeout(Some(ms(750)), Some(ms(1600))),
            Some(Some(ms(1200))),
            "it would return before half the wait"
        );
        assert_eq!(receive_timeout(Some(ms(1)), Some(ms(0))), None);
        assert_eq!(receive_timeout(None, Some(ms(1))), Some(Some(ms(1))));
        assert_eq!(
            receive_timeout(Some(ms(1)), Some(Duration::from_micros(2_400))),
            None,
            "one millisecond is as close as it gets"
        );
        assert_eq!(receive_timeout(Some(ms(5)), None), Some(None));
        assert_eq!(receive_timeout(Some(ms(2000)), None), None);
        assert_eq!(receive_timeout(None, None), None);
    }

    #[test]
    fn a_lone_socket_blocks_until_a_datagram_and_drops_the_wake_datagrams() {
        let socket = StdSocket::bind("127.0.0.1:0").unwrap();
        let to = socket.local_addr().unwrap();
        let mut io = ShardIo::lone(socket).unwrap();
        let waited = io.receive_waiting(Some(Duration::from_millis(20)));
        assert!(
            matches!(&waited, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "nothing came within the wait: {waited:?}"
        );
        let (waker, wake) = io.waker().unwrap();
        waker.sleeping();
        wake.wake_by_ref();
        let sender = StdSocket::bind("127.0.0.1:0").unwrap();
        sender.send_to(b"ping", to).unwrap();
        let mut got = Vec::new();
        while got.is_empty() {
            let n = io.receive_waiting(Some(Duration::from_secs(5))).unwrap();
            got.extend((0..n).filter_map(|i| io.received(i).map(|(p, b, _)| (p, b.to_vec()))));
        }
        assert_eq!(got, vec![(sender.local_addr().unwrap(), b"ping".to_vec())]);
    }

    #[test]
    fn a_peer_always_maps_to_the_same_worker() {
        let p: SocketAddr = "10.0.0.1:4000".parse().unwrap();
        let w = worker_for(&p, 7);
        for _ in 0..10 {
            assert_eq!(worker_for(&p, 7), w);
        }
        let spread: std::collections::HashSet<usize> = (0..200u16)
            .map(|port| worker_for(&SocketAddr::from(([10, 0, 0, 1], 4000 + port)), 7))
            .collect();
        assert_eq!(spread.len(), 7, "peers spread over all workers");
    }
}

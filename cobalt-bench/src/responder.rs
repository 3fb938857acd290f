//! The raw floor responder behind `cobalt bench-responder`.
//!
//! One blocking UDP socket, `recvmmsg`/`sendmmsg` in batches of 64, and no CoAP stack:
//! every CON request gets a piggybacked ACK 2.05 "hello world" with its MID and token,
//! every NON request a NON 2.05, a CoAP ping (empty CON) an RST. Anything else is
//! dropped. It is the physical floor that real servers are compared against.

use cobalt::transport::mmsg;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Largest request accepted; longer ones are truncated by the kernel and dropped.
const MAX_DATAGRAM: usize = 1500;
/// Response payload.
const PAYLOAD: &[u8] = b"hello world";
/// Largest response: header, 8-byte token, Content-Format option, marker, payload.
pub const MAX_RESPONSE: usize = 4 + 8 + 1 + 1 + PAYLOAD.len();

/// Something the serve loop polls to know when to return.
pub trait StopFlag {
    /// True when the loop should return.
    fn stop(&self) -> bool;
}

impl StopFlag for AtomicBool {
    fn stop(&self) -> bool {
        self.load(Ordering::Relaxed)
    }
}

/// A responder serving a loopback port on a thread of its own, until stopped: the
/// target of a step run in-process (tests, a quick check of the generator).
#[derive(Debug)]
pub struct Background {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<std::io::Result<u64>>,
}

impl Background {
    /// Binds a free port on 127.0.0.1 and starts serving it.
    pub fn start() -> std::io::Result<Background> {
        let sock = UdpSocket::bind("127.0.0.1:0")?;
        let addr = sock.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || serve(&sock, &*flag));
        Ok(Background { addr, stop, thread })
    }

    /// The address it serves.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving; returns the number of requests answered.
    pub fn stop(self) -> std::io::Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the responder thread panicked")))
    }
}

/// Builds the response to `req` into `out`; returns its length, or `None` to drop it.
/// `non_mid` supplies MIDs for NON responses.
pub fn respond(req: &[u8], out: &mut [u8; MAX_RESPONSE], non_mid: &mut u16) -> Option<usize> {
    if req.len() < 4 || req[0] >> 6 != 1 {
        return None;
    }
    let tkl = (req[0] & 0x0f) as usize;
    if tkl > 8 || req.len() < 4 + tkl {
        return None;
    }
    let mtype = (req[0] >> 4) & 0b11;
    let code = req[1];
    if code == 0 {
        // CoAP ping (empty CON): answer with RST; empty NON/ACK/RST: drop.
        if mtype == 0 && tkl == 0 {
            out[..4].copy_from_slice(&[0x70, 0, req[2], req[3]]);
            return Some(4);
        }
        return None;
    }
    if code >> 5 != 0 {
        return None; // a response, not a request
    }
    let (rtype, mid) = match mtype {
        0 => (2u8, [req[2], req[3]]),
        1 => {
            *non_mid = non_mid.wrapping_add(1);
            (1u8, non_mid.to_be_bytes())
        }
        _ => return None,
    };
    out[0] = 0x40 | (rtype << 4) | tkl as u8;
    out[1] = 0x45; // 2.05 Content
    out[2..4].copy_from_slice(&mid);
    out[4..4 + tkl].copy_from_slice(&req[4..4 + tkl]);
    let mut n = 4 + tkl;
    out[n] = 0xc0; // Content-Format (12) = 0 text/plain, zero-length uint
    out[n + 1] = 0xff;
    n += 2;
    out[n..n + PAYLOAD.len()].copy_from_slice(PAYLOAD);
    Some(n + PAYLOAD.len())
}

/// Serves requests on `sock` until `stop` says so; returns the number answered.
///
/// The socket is switched to blocking mode with a 100 ms receive timeout so that `stop`
/// is polled regularly. Datagrams move in batches through the runtime's
/// [`cobalt::transport::mmsg`].
pub fn serve(sock: &UdpSocket, stop: &dyn StopFlag) -> std::io::Result<u64> {
    sock.set_nonblocking(false)?;
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    let fd = sock.as_raw_fd();
    let mut batch = Box::<mmsg::RecvBatch>::default();
    let mut responses = vec![([0u8; MAX_RESPONSE], 0usize, None::<SocketAddr>); mmsg::BATCH];
    let mut non_mid: u16 = std::process::id() as u16;
    let mut answered = 0u64;
    while !stop.stop() {
        let n = match mmsg::recv_batch_blocking(fd, &mut batch) {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                Some(
                    libc::EAGAIN
                    | libc::EINTR
                    | libc::ECONNREFUSED
                    | libc::EHOSTUNREACH
                    | libc::ENETUNREACH,
                ) => continue,
                _ => return Err(e),
            },
        };
        let mut out = 0usize;
        for i in 0..n {
            let Some((peer, req, truncated)) = batch.get(i) else {
                continue;
            };
            if truncated || req.len() > MAX_DATAGRAM {
                continue;
            }
            let (buf, len, to) = &mut responses[out];
            let Some(rlen) = respond(req, buf, &mut non_mid) else {
                continue;
            };
            (*len, *to) = (rlen, Some(peer));
            out += 1;
        }
        let mut done = 0usize;
        while done < out {
            let msgs = responses[done..out]
                .iter()
                .filter_map(|(buf, len, to)| Some(((*to)?, &buf[..*len])));
            match mmsg::send_batch(fd, msgs) {
                Ok(sent) if sent > 0 => {
                    done += sent;
                    answered += sent as u64;
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => wait_writable(fd),
                // This destination failed (e.g. an ICMP error): skip it.
                _ => done += 1,
            }
        }
    }
    Ok(answered)
}

/// Waits (up to 100 ms) until `fd` can take another datagram.
fn wait_writable(fd: std::os::fd::RawFd) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 100) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn con_gets_piggybacked_ack() {
        let mut out = [0u8; MAX_RESPONSE];
        let mut mid = 0;
        let req = [
            0x42, 0x01, 0x12, 0x34, 0xaa, 0xbb, 0xb5, b'h', b'e', b'l', b'l', b'o',
        ];
        let n = respond(&req, &mut out, &mut mid).unwrap();
        let m = cobalt_proto::message::decode(&out[..n]).unwrap();
        assert_eq!(m.mtype, cobalt_proto::message::MessageType::Acknowledgement);
        assert_eq!(m.code, cobalt_proto::message::Code::CONTENT);
        assert_eq!(m.mid, 0x1234);
        assert_eq!(m.token.as_bytes(), &[0xaa, 0xbb]);
        assert_eq!(m.payload, b"hello world");
        assert_eq!(m.options.content_format(), Some(0));
    }

    #[test]
    fn non_gets_non_and_ping_gets_rst() {
        let mut out = [0u8; MAX_RESPONSE];
        let mut mid = 7;
        let n = respond(&[0x51, 0x01, 0, 9, 0x33], &mut out, &mut mid).unwrap();
        let m = cobalt_proto::message::decode(&out[..n]).unwrap();
        assert_eq!(m.mtype, cobalt_proto::message::MessageType::NonConfirmable);
        assert_eq!((m.mid, m.token.as_bytes()), (8, &[0x33][..]));
        let n = respond(&[0x40, 0x00, 0, 9], &mut out, &mut mid).unwrap();
        assert_eq!(&out[..n], &[0x70, 0, 0, 9]);
    }

    #[test]
    fn junk_is_dropped() {
        let mut out = [0u8; MAX_RESPONSE];
        let mut mid = 0;
        for junk in [
            &[][..],
            &[0x40, 0x01, 0],
            &[0x80, 0x01, 0, 0],
            &[0x49, 0x01, 0, 0],
            &[0x44, 0x01, 0, 0, 1],
            &[0x60, 0x45, 0, 0],
            &[0x40, 0x45, 0, 0],
            &[0x50, 0x00, 0, 0],
        ] {
            assert_eq!(respond(junk, &mut out, &mut mid), None, "{junk:?}");
        }
    }
}

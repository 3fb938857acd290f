//! `cobalt bench-responder`: the raw floor responder.
//!
//! One blocking UDP socket, `recvmmsg`/`sendmmsg` in batches of 64, and no CoAP stack:
//! every CON request gets a piggybacked ACK 2.05 "hello world" with its MID and token,
//! every NON request a NON 2.05, a CoAP ping (empty CON) an RST. Anything else is
//! dropped. It is the physical floor that real servers are compared against.

use super::sys::{errno, install_sigint_handler, interrupted};
use clap::Args;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Datagrams per `recvmmsg`/`sendmmsg` call.
pub const BATCH: usize = 64;
/// Largest request accepted; longer ones are truncated by the kernel and dropped.
const MAX_DATAGRAM: usize = 1500;
/// Response payload.
const PAYLOAD: &[u8] = b"hello world";
/// Largest response: header, 8-byte token, Content-Format option, marker, payload.
const MAX_RESPONSE: usize = 4 + 8 + 1 + 1 + PAYLOAD.len();

/// Arguments of `cobalt bench-responder`.
#[derive(Debug, Args)]
pub struct ResponderArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:5683")]
    pub bind: String,

    /// Socket receive buffer in bytes (the kernel caps it at net.core.rmem_max); a
    /// large one absorbs the first burst of thousands of clients. 0 keeps the default.
    #[arg(long, default_value_t = 4 << 20)]
    pub rcvbuf: usize,
}

/// Runs the responder until Ctrl-C; returns the exit code.
pub fn main(args: ResponderArgs) -> i32 {
    let sock = match UdpSocket::bind(&args.bind) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cobalt bench-responder: cannot bind {}: {e}", args.bind);
            return 2;
        }
    };
    if args.rcvbuf > 0 {
        let size = args.rcvbuf.min(i32::MAX as usize) as libc::c_int;
        // SAFETY: valid socket and option value.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            eprintln!(
                "cobalt bench-responder: cannot set SO_RCVBUF: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    install_sigint_handler();
    let addr = sock
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or(args.bind);
    eprintln!(
        "cobalt bench-responder: listening on {addr} (pid {}), Ctrl-C to stop",
        std::process::id()
    );
    struct Interrupt;
    impl StopFlag for Interrupt {
        fn stop(&self) -> bool {
            interrupted()
        }
    }
    match serve(&sock, &Interrupt) {
        Ok(n) => {
            eprintln!("cobalt bench-responder: answered {n} requests");
            0
        }
        Err(e) => {
            eprintln!("cobalt bench-responder: {e}");
            1
        }
    }
}

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
/// is polled regularly.
pub fn serve(sock: &UdpSocket, stop: &dyn StopFlag) -> std::io::Result<u64> {
    sock.set_nonblocking(false)?;
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    let fd = sock.as_raw_fd();
    let mut rbufs = vec![[0u8; MAX_DATAGRAM]; BATCH];
    let mut sbufs = vec![[0u8; MAX_RESPONSE]; BATCH];
    // SAFETY (zeroed): sockaddr_storage, iovec and mmsghdr are plain C structs for which
    // all-zero is a valid value; the pointers are filled in below.
    let mut names: Vec<libc::sockaddr_storage> = vec![unsafe { std::mem::zeroed() }; BATCH];
    let mut riov: Vec<libc::iovec> = vec![unsafe { std::mem::zeroed() }; BATCH];
    let mut rmsgs: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; BATCH];
    let mut siov: Vec<libc::iovec> = vec![unsafe { std::mem::zeroed() }; BATCH];
    let mut smsgs: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; BATCH];
    for i in 0..BATCH {
        riov[i].iov_base = rbufs[i].as_mut_ptr().cast();
        riov[i].iov_len = MAX_DATAGRAM;
    }
    let mut non_mid: u16 = std::process::id() as u16;
    let mut answered = 0u64;
    while !stop.stop() {
        for i in 0..BATCH {
            let h = &mut rmsgs[i].msg_hdr;
            h.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut riov[i];
            h.msg_iovlen = 1;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
            h.msg_flags = 0;
            rmsgs[i].msg_len = 0;
        }
        // SAFETY: every header points at live buffers owned by this function.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                rmsgs.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            match errno() {
                libc::EAGAIN
                | libc::EINTR
                | libc::ECONNREFUSED
                | libc::EHOSTUNREACH
                | libc::ENETUNREACH => continue,
                _ => return Err(std::io::Error::last_os_error()),
            }
        }
        let mut out = 0usize;
        for i in 0..n as usize {
            let len = rmsgs[i].msg_len as usize;
            let truncated = rmsgs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            if truncated || len > MAX_DATAGRAM {
                continue;
            }
            let Some(rlen) = respond(&rbufs[i][..len], &mut sbufs[out], &mut non_mid) else {
                continue;
            };
            siov[out].iov_base = sbufs[out].as_mut_ptr().cast();
            siov[out].iov_len = rlen;
            let h = &mut smsgs[out].msg_hdr;
            h.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = rmsgs[i].msg_hdr.msg_namelen;
            h.msg_iov = &mut siov[out];
            h.msg_iovlen = 1;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
            h.msg_flags = 0;
            out += 1;
        }
        let mut done = 0usize;
        while done < out {
            // SAFETY: headers [done, out) point at live buffers and addresses.
            let r =
                unsafe { libc::sendmmsg(fd, smsgs[done..].as_mut_ptr(), (out - done) as u32, 0) };
            if r > 0 {
                done += r as usize;
                answered += r as u64;
            } else if errno() == libc::EINTR {
                continue;
            } else {
                done += 1; // this destination failed (e.g. ICMP error); skip it
            }
        }
    }
    Ok(answered)
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

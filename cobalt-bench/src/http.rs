//! HTTP/1.1 mode for `http://` URIs, to compare a CoAP server with an HTTP one under the
//! same load: each virtual client owns one TCP connection (keep-alive, the default) or
//! opens a new one per request (`--no-keepalive`, `Connection: close`).
//!
//! It runs on the same engine as the CoAP generator ([`crate::engine`]): a few OS
//! threads, one epoll loop each over non-blocking sockets, one request in flight per
//! client, no retries, closed loop or open loop (`--rate`). A refused connection counts
//! as an error and its request as lost at the timeout; a malformed response, or a
//! connection that breaks mid-response, counts as an error and ends the exchange.

use crate::engine::StepShared;
use crate::engine::{self, Exchanges, Generator};
use crate::poll::{Epoll, Waiter};
use crate::stats::{AnswerCode, Recorder};
use crate::sys::{errno, now_ns};
use crate::target::Target;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Largest response header block accepted.
const MAX_HEAD: usize = 16 * 1024;
/// Largest response (head and body) accepted.
const MAX_RESPONSE: usize = 16 * 1024 * 1024;
/// Events fetched per `epoll_wait`.
const MAX_EVENTS: usize = 512;

/// Encodes the HTTP/1.1 request every client sends.
pub fn request_bytes(t: &Target, method: &str, keepalive: bool, payload: Option<&str>) -> Vec<u8> {
    let host = if t.host.contains(':') {
        format!("[{}]", t.host)
    } else {
        t.host.clone()
    };
    let mut r = format!(
        "{method} {} HTTP/1.1\r\nHost: {host}:{}\r\nUser-Agent: cobalt-bench\r\n",
        t.raw_path, t.port
    );
    if !keepalive {
        r.push_str("Connection: close\r\n");
    }
    let body = payload.unwrap_or("");
    if payload.is_some() || method == "POST" || method == "PUT" {
        r.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    r.push_str("\r\n");
    r.push_str(body);
    r.into_bytes()
}

/// How far a buffered response has arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parse {
    /// More bytes are needed.
    Incomplete,
    /// A whole response occupies the first `len` bytes; `close` when the connection
    /// cannot be reused.
    Complete {
        /// Bytes of the response.
        len: usize,
        /// The server will not take another request on this connection.
        close: bool,
        /// The final status code (only 2xx counts as completed).
        status: u16,
    },
    /// Not a valid HTTP/1.x response.
    Invalid,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Parses the response at the start of `buf`; `eof` tells whether the server has
/// closed its side (which ends a body without length). 1xx responses are skipped.
pub fn parse_response(buf: &[u8], eof: bool) -> Parse {
    let mut start = 0usize;
    loop {
        let rest = &buf[start..];
        let Some(hend) = find(&rest[..rest.len().min(MAX_HEAD + 4)], b"\r\n\r\n") else {
            return if rest.len() > MAX_HEAD || eof {
                Parse::Invalid
            } else {
                Parse::Incomplete
            };
        };
        let Ok(head) = std::str::from_utf8(&rest[..hend]) else {
            return Parse::Invalid;
        };
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or("");
        let sb = status_line.as_bytes();
        if sb.len() < 12 || !status_line.starts_with("HTTP/1.") || sb[8] != b' ' {
            return Parse::Invalid;
        }
        let http10 = sb[7] == b'0';
        let Some(status) = status_line
            .get(9..12)
            .filter(|d| d.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|d| d.parse::<u16>().ok())
        else {
            return Parse::Invalid;
        };
        let mut content_length: Option<usize> = None;
        let mut chunked = false;
        let mut close = http10;
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                return Parse::Invalid;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                let Ok(n) = value.parse::<usize>() else {
                    return Parse::Invalid;
                };
                if content_length.is_some_and(|m| m != n) || n > MAX_RESPONSE {
                    return Parse::Invalid;
                }
                content_length = Some(n);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value
                    .rsplit(',')
                    .next()
                    .is_some_and(|v| v.trim().eq_ignore_ascii_case("chunked"));
            } else if name.eq_ignore_ascii_case("connection") {
                for token in value.split(',').map(str::trim) {
                    if token.eq_ignore_ascii_case("close") {
                        close = true;
                    } else if token.eq_ignore_ascii_case("keep-alive") {
                        close = false;
                    }
                }
            }
        }
        let body = start + hend + 4;
        if (100..200).contains(&status) && status != 101 {
            start = body;
            continue;
        }
        if status == 204 || status == 304 {
            return Parse::Complete {
                len: body,
                close,
                status,
            };
        }
        if chunked {
            return match chunked_len(&buf[body..]) {
                Ok(Some(n)) => Parse::Complete {
                    len: body + n,
                    close,
                    status,
                },
                Ok(None) if !eof && buf.len() <= MAX_RESPONSE => Parse::Incomplete,
                _ => Parse::Invalid,
            };
        }
        if let Some(n) = content_length {
            return if buf.len() >= body + n {
                Parse::Complete {
                    len: body + n,
                    close,
                    status,
                }
            } else if eof {
                Parse::Invalid
            } else {
                Parse::Incomplete
            };
        }
        // No length: the body runs until the server closes.
        return if eof {
            Parse::Complete {
                len: buf.len(),
                close: true,
                status,
            }
        } else if buf.len() > MAX_RESPONSE {
            Parse::Invalid
        } else {
            Parse::Incomplete
        };
    }
}

/// Length of a complete chunked body at the start of `b`, `Ok(None)` if incomplete.
fn chunked_len(b: &[u8]) -> Result<Option<usize>, ()> {
    let mut i = 0usize;
    loop {
        let Some(le) = find(&b[i..], b"\r\n") else {
            return if b.len() - i > 1024 {
                Err(())
            } else {
                Ok(None)
            };
        };
        let line = std::str::from_utf8(&b[i..i + le]).map_err(|_| ())?;
        let hex = line.split(';').next().unwrap_or("").trim();
        if hex.is_empty() || hex.len() > 15 {
            return Err(());
        }
        let size = usize::from_str_radix(hex, 16).map_err(|_| ())?;
        i += le + 2;
        if size == 0 {
            // Trailer fields, then an empty line.
            loop {
                let Some(le) = find(&b[i..], b"\r\n") else {
                    return Ok(None);
                };
                i += le + 2;
                if le == 0 {
                    return Ok(Some(i));
                }
            }
        }
        let end = i
            .checked_add(size)
            .and_then(|e| e.checked_add(2))
            .ok_or(())?;
        if b.len() < end {
            return Ok(None);
        }
        if &b[end - 2..end] != b"\r\n" {
            return Err(());
        }
        i = end;
    }
}

/// The socket address in C form.
fn sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// Sets a socket option (failures are ignored: the options only tune the connection).
fn set_option<T>(fd: &OwnedFd, level: i32, name: i32, value: &T) {
    // SAFETY: an open socket, and a value of the size given.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
}

/// Where a connection is in its exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No connection.
    Closed,
    /// Non-blocking connect in progress.
    Connecting,
    /// Request partly written.
    Writing,
    /// Waiting for (the rest of) the response.
    Reading,
    /// Keep-alive connection with nothing in flight.
    Open,
}

struct Conn {
    fd: Option<OwnedFd>,
    state: State,
    /// Bumped for every new connection; events carry it so that stale ones are ignored.
    generation: u32,
    written: usize,
    buf: Vec<u8>,
    /// Epoll currently also watches for writability.
    want_out: bool,
}

/// Runs one thread's share of an HTTP step on the shared engine
/// ([`crate::engine::run_thread`]).
pub(crate) fn run_thread(
    shared: &StepShared,
    clients: usize,
    keepalive: bool,
    interval_ns: Option<u64>,
) -> Result<Recorder, String> {
    engine::run_thread(shared, interval_ns, || {
        Ok(HttpClients {
            epoll: Epoll::new()?,
            conns: (0..clients)
                .map(|_| Conn {
                    fd: None,
                    state: State::Closed,
                    generation: 0,
                    written: 0,
                    buf: Vec::new(),
                    want_out: false,
                })
                .collect(),
            keepalive,
            target: shared.target,
            request: shared.template.clone(),
            waiter: Waiter::new(),
            events: vec![libc::epoll_event { events: 0, u64: 0 }; MAX_EVENTS],
        })
    })
}

/// One thread's HTTP clients: a TCP connection each, one epoll set over them.
struct HttpClients {
    epoll: Epoll,
    conns: Vec<Conn>,
    keepalive: bool,
    target: SocketAddr,
    request: Vec<u8>,
    waiter: Waiter,
    events: Vec<libc::epoll_event>,
}

impl Generator for HttpClients {
    fn clients(&self) -> usize {
        self.conns.len()
    }

    /// Reuses client `i`'s connection if it is open, else connects.
    fn start(&mut self, i: usize, _t: u64) -> Result<bool, String> {
        let c = &mut self.conns[i];
        c.buf.clear();
        c.written = 0;
        if c.state == State::Open {
            c.state = State::Writing;
            return Ok(self.write_request(i));
        }
        self.close(i, true);
        self.connect(i)
    }

    fn lost(&mut self, i: usize) {
        self.close(i, true);
    }

    fn poll(&mut self, wait_ns: u64, ex: &mut Exchanges) -> Result<(), String> {
        let n = self.waiter.wait(self.epoll.0, &mut self.events, wait_ns);
        let t = now_ns();
        for k in 0..n {
            let ev = self.events[k].u64;
            let idx = (ev & 0xffff_ffff) as usize;
            let generation = (ev >> 32) as u32;
            if self
                .conns
                .get(idx)
                .is_some_and(|c| c.generation == generation && c.fd.is_some())
            {
                self.on_event(idx, t, ex);
            }
        }
        Ok(())
    }
}

impl HttpClients {
    /// Closes client `i`'s connection; `abort` resets it instead of leaving a TIME_WAIT
    /// socket behind on this side.
    fn close(&mut self, i: usize, abort: bool) {
        let c = &mut self.conns[i];
        if let Some(fd) = c.fd.take() {
            if abort {
                let lg = libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                };
                set_option(&fd, libc::SOL_SOCKET, libc::SO_LINGER, &lg);
            }
            drop(fd); // closing also removes it from the epoll set
        }
        c.state = State::Closed;
        c.want_out = false;
        c.buf.clear();
    }

    fn epoll_set(&mut self, i: usize, op: i32, want_out: bool) -> bool {
        let c = &mut self.conns[i];
        let Some(fd) = c.fd.as_ref() else {
            return false;
        };
        c.want_out = want_out;
        let token = (u64::from(c.generation) << 32) | i as u64;
        self.epoll.set(op, fd.as_raw_fd(), want_out, token)
    }

    /// Opens client `i`'s connection and, once connected, writes its request; false
    /// when that failed (the request is lost at its timeout).
    fn connect(&mut self, i: usize) -> Result<bool, String> {
        let target = self.target;
        let family = if target.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        // SAFETY: plain socket creation.
        let fd = unsafe {
            libc::socket(
                family,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            let e = errno();
            if e == libc::EMFILE || e == libc::ENFILE {
                return Err(
                    "out of file descriptors opening HTTP connections; raise the limit \
                     with `ulimit -n`"
                        .into(),
                );
            }
            return Ok(false);
        }
        // SAFETY: fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        set_option(
            &fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &(1 as libc::c_int),
        );
        let (ss, len) = sockaddr(&target);
        // SAFETY: `ss` holds a valid address of `len` bytes.
        let r = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&ss as *const libc::sockaddr_storage).cast(),
                len,
            )
        };
        let c = &mut self.conns[i];
        c.generation = c.generation.wrapping_add(1);
        c.fd = Some(fd);
        let ok = if r == 0 {
            c.state = State::Writing;
            self.epoll_set(i, libc::EPOLL_CTL_ADD, false) && self.write_request(i)
        } else if errno() == libc::EINPROGRESS {
            c.state = State::Connecting;
            self.epoll_set(i, libc::EPOLL_CTL_ADD, true)
        } else {
            // Refused at once: the request counts as lost at its timeout.
            false
        };
        if !ok {
            self.close(i, true);
        }
        Ok(ok)
    }

    /// Writes what is left of client `i`'s request; false when the connection broke
    /// (closed; the request never left, so it counts as lost at its timeout, with no
    /// immediate retry, which could spin on a server that resets).
    fn write_request(&mut self, i: usize) -> bool {
        loop {
            let c = &mut self.conns[i];
            let Some(fd) = c.fd.as_ref() else {
                return true;
            };
            if c.written >= self.request.len() {
                c.state = State::Reading;
                if c.want_out {
                    self.epoll_set(i, libc::EPOLL_CTL_MOD, false);
                }
                return true;
            }
            let rest = &self.request[c.written..];
            // SAFETY: valid socket and buffer; MSG_NOSIGNAL avoids SIGPIPE.
            let n = unsafe {
                libc::send(
                    fd.as_raw_fd(),
                    rest.as_ptr().cast(),
                    rest.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if n > 0 {
                c.written += n as usize;
                continue;
            }
            let e = errno();
            if n < 0 && e == libc::EINTR {
                continue;
            }
            if n < 0 && e == libc::EAGAIN {
                if !c.want_out {
                    self.epoll_set(i, libc::EPOLL_CTL_MOD, true);
                }
                return true;
            }
            self.close(i, true);
            return false;
        }
    }

    fn on_event(&mut self, i: usize, t: u64, ex: &mut Exchanges) {
        match self.conns[i].state {
            State::Connecting => {
                let Some(fd) = self.conns[i].fd.as_ref() else {
                    return;
                };
                let mut err: libc::c_int = 0;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                // SAFETY: valid socket; `err`/`len` are writable.
                let r = unsafe {
                    libc::getsockopt(
                        fd.as_raw_fd(),
                        libc::SOL_SOCKET,
                        libc::SO_ERROR,
                        (&mut err as *mut libc::c_int).cast(),
                        &mut len,
                    )
                };
                if r != 0 || err != 0 {
                    // Refused or unreachable: lost at the timeout, like an ICMP error.
                    self.close(i, true);
                    ex.error(t);
                    return;
                }
                self.conns[i].state = State::Writing;
                if !self.write_request(i) {
                    ex.error(t);
                }
            }
            State::Writing => {
                if !self.write_request(i) {
                    ex.error(t);
                }
            }
            State::Reading | State::Open => self.read_response(i, t, ex),
            State::Closed => {}
        }
    }

    fn read_response(&mut self, i: usize, t: u64, ex: &mut Exchanges) {
        let mut eof = false;
        loop {
            let c = &mut self.conns[i];
            let Some(fd) = c.fd.as_ref() else { return };
            if c.buf.len() > MAX_RESPONSE {
                break;
            }
            let old = c.buf.len();
            c.buf.resize(old + 16 * 1024, 0);
            // SAFETY: the spare 16 KiB at the end of `buf` are writable.
            let n = unsafe {
                libc::recv(
                    fd.as_raw_fd(),
                    c.buf[old..].as_mut_ptr().cast(),
                    16 * 1024,
                    0,
                )
            };
            let e = errno();
            c.buf.truncate(old + n.max(0) as usize);
            if n > 0 {
                if (n as usize) < 16 * 1024 {
                    break; // drained for now
                }
                continue;
            }
            if n == 0 {
                eof = true;
                break;
            }
            if e == libc::EAGAIN || e == libc::EINTR {
                break;
            }
            // Connection reset mid-exchange.
            self.close(i, true);
            ex.failed(i, t);
            return;
        }
        let c = &self.conns[i];
        if !ex.outstanding(i) {
            if eof || !c.buf.is_empty() {
                // The server closed an idle keep-alive connection, or sent unsolicited bytes.
                let junk = !c.buf.is_empty();
                self.close(i, !eof);
                if junk {
                    ex.error(t);
                }
            }
            return;
        }
        match parse_response(&c.buf, eof) {
            Parse::Incomplete => {}
            Parse::Complete { len, close, status } => {
                let extra = c.buf.len() > len;
                ex.answered(i, AnswerCode::Http(status), t);
                if close || eof || !self.keepalive || extra {
                    self.close(i, !eof);
                    if extra {
                        ex.error(t);
                    }
                } else {
                    let c = &mut self.conns[i];
                    c.state = State::Open;
                    c.buf.clear();
                }
            }
            Parse::Invalid => {
                self.close(i, true);
                ex.failed(i, t);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::parse_uri;

    #[test]
    fn request_line_and_headers() {
        let t = parse_uri("http://127.0.0.1:8080/a?b=1").unwrap();
        let r = String::from_utf8(request_bytes(&t, "GET", true, None)).unwrap();
        assert_eq!(
            r,
            "GET /a?b=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: cobalt-bench\r\n\r\n"
        );
        let t = parse_uri("http://[::1]/").unwrap();
        let r = String::from_utf8(request_bytes(&t, "POST", false, Some("hi"))).unwrap();
        assert!(r.starts_with("POST / HTTP/1.1\r\nHost: [::1]:80\r\n"));
        assert!(r.contains("Connection: close\r\n") && r.ends_with("Content-Length: 2\r\n\r\nhi"));
    }

    #[test]
    fn content_length_responses() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
        assert_eq!(
            parse_response(r, false),
            Parse::Complete {
                len: r.len(),
                close: false,
                status: 200
            }
        );
        assert_eq!(parse_response(&r[..r.len() - 1], false), Parse::Incomplete);
        assert_eq!(parse_response(&r[..r.len() - 1], true), Parse::Invalid);
        assert_eq!(parse_response(&r[..10], false), Parse::Incomplete);
        let r = b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(
            parse_response(r, false),
            Parse::Complete {
                len: r.len(),
                close: true,
                status: 200
            }
        );
        let r = b"HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 1\r\n\r\nxEXTRA";
        assert_eq!(
            parse_response(r, false),
            Parse::Complete {
                len: r.len() - 5,
                close: true,
                status: 404
            }
        );
    }

    #[test]
    fn chunked_until_eof_and_continue() {
        let r = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n";
        assert_eq!(
            parse_response(r, false),
            Parse::Complete {
                len: r.len(),
                close: false,
                status: 200
            }
        );
        for cut in [50, r.len() - 1, r.len() - 3] {
            assert_eq!(parse_response(&r[..cut], false), Parse::Incomplete, "{cut}");
        }
        let r = b"HTTP/1.1 200 OK\r\n\r\nbody until close";
        assert_eq!(parse_response(r, false), Parse::Incomplete);
        assert_eq!(
            parse_response(r, true),
            Parse::Complete {
                len: r.len(),
                close: true,
                status: 200
            }
        );
        let r = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n";
        assert_eq!(
            parse_response(r, false),
            Parse::Complete {
                len: r.len(),
                close: false,
                status: 204
            }
        );
    }

    #[test]
    fn garbage_is_invalid() {
        for g in [
            &b"SSH-2.0-OpenSSH\r\n\r\n"[..],
            b"HTTP/1.1 2x0 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n",
            b"\xff\xfe\r\n\r\n",
        ] {
            assert_eq!(parse_response(g, false), Parse::Invalid, "{g:?}");
        }
        assert_eq!(parse_response(b"", true), Parse::Invalid);
        assert_eq!(
            parse_response(&[b'a'; MAX_HEAD + 10], false),
            Parse::Invalid
        );
    }
}

//! The engine of `cobalt bench-http-responder`: a minimal HTTP/1.1 responder for CoAP-vs-HTTP runs.
//!
//! One tokio current-thread runtime, one task per connection, no HTTP library: every
//! request (any method and path) gets `200 OK` with the body "hello world", the same
//! payload `cobalt serve` returns on `/benchmark`. Connections are kept alive (HTTP/1.1
//! default, pipelining included) unless the request says `Connection: close` or is
//! HTTP/1.0 without `Connection: keep-alive`. It is the HTTP counterpart of
//! `cobalt bench-responder`, used by `bench/http-compare.sh`.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Largest request head accepted; a longer one closes the connection.
const MAX_HEAD: usize = 16 * 1024;
const BODY: &str = "hello world";
/// Accept backlog requested from the kernel.
const BACKLOG: u32 = 4096;

/// Accepts connections on `listener` and answers them, one task each, until the
/// future is dropped (the caller selects it against Ctrl-C).
pub async fn accept_loop(listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(connection(stream));
            }
            // EMFILE and the like: back off briefly rather than spin.
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
        }
    }
}

/// Binds with a deep accept backlog (the kernel caps it at net.core.somaxconn), so that
/// thousands of clients opening a connection per request do not overflow it and wait
/// for SYN retransmissions.
pub fn listen(bind: &str) -> std::io::Result<TcpListener> {
    let addr: std::net::SocketAddr = bind
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// What one parsed request head tells the connection loop.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    /// Bytes of head plus body to consume from the buffer.
    len: usize,
    /// Whether to close the connection after answering.
    close: bool,
}

/// Parses one request head at the start of `buf`: `Ok(None)` if incomplete,
/// `Err(())` if malformed.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, ()> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if buf.len() > MAX_HEAD {
            Err(())
        } else {
            Ok(None)
        };
    };
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| ())?;
    let mut lines = head.split("\r\n");
    let request_line = lines.next().ok_or(())?;
    let version = request_line.rsplit(' ').next().ok_or(())?;
    let mut close = version != "HTTP/1.1";
    let mut body = 0usize;
    for line in lines {
        let (name, value) = line.split_once(':').ok_or(())?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("connection") {
            if value.eq_ignore_ascii_case("close") {
                close = true;
            } else if value.eq_ignore_ascii_case("keep-alive") {
                close = false;
            }
        } else if name.eq_ignore_ascii_case("content-length") {
            body = value.parse().map_err(|_| ())?;
        }
    }
    let len = end + 4 + body;
    Ok(if buf.len() >= len {
        Some(Head { len, close })
    } else {
        None
    })
}

fn response(close: bool) -> Vec<u8> {
    let connection = if close { "close" } else { "keep-alive" };
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: {connection}\r\n\r\n{BODY}",
        BODY.len()
    )
    .into_bytes()
}

/// Serves one connection until the peer closes it or asks to.
async fn connection(mut stream: TcpStream) {
    let keep = response(false);
    let close = response(true);
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut out: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut done = false;
        let mut used = 0;
        loop {
            match parse_head(&buf[used..]) {
                Ok(Some(head)) => {
                    used += head.len;
                    if head.close {
                        out.extend_from_slice(&close);
                        done = true;
                        break;
                    }
                    out.extend_from_slice(&keep);
                }
                Ok(None) => break,
                Err(()) => {
                    out.extend_from_slice(
                        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    done = true;
                    break;
                }
            }
        }
        buf.drain(..used);
        if !out.is_empty() {
            if stream.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        if done {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_keepalive_close_and_partial_heads() {
        let get = b"GET /benchmark HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(
            parse_head(get),
            Ok(Some(Head {
                len: get.len(),
                close: false
            }))
        );
        let closing = b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n";
        assert!(parse_head(closing).unwrap().unwrap().close);
        let old = b"GET / HTTP/1.0\r\n\r\n";
        assert!(parse_head(old).unwrap().unwrap().close);
        assert_eq!(parse_head(b"GET / HTTP/1.1\r\nHost"), Ok(None));
        let post = b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nab";
        assert_eq!(parse_head(post), Ok(None));
        assert_eq!(parse_head(b"GET / HTTP/1.1\r\nbad header\r\n\r\n"), Err(()));
    }
}

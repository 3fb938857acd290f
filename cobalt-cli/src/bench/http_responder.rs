//! `cobalt bench-http-responder`: a minimal HTTP/1.1 server answering every request
//! with 200 "hello world", keep-alive by default, so that `bench/http-compare.sh` can
//! put CoAP and HTTP side by side with the same load generator (the paper's §III-B).
//! One current-thread tokio runtime (one core), a task per connection.

use clap::Args;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Arguments of `cobalt bench-http-responder`.
#[derive(Debug, Args)]
pub struct HttpResponderArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub bind: String,
}

/// Largest request head accepted; a longer one closes the connection.
const MAX_HEAD: usize = 8 * 1024;

/// Runs until killed; returns the exit code.
pub fn main(args: HttpResponderArgs) -> i32 {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cobalt bench-http-responder: {e}");
            return 1;
        }
    };
    rt.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(&args.bind).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!(
                    "cobalt bench-http-responder: cannot listen on {}: {e}",
                    args.bind
                );
                return 2;
            }
        };
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(serve(stream));
        }
    })
}

/// Answers requests on one connection until the peer closes it or asks to.
async fn serve(mut stream: tokio::net::TcpStream) {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let Some(end) = find_head_end(&buf) else {
            if buf.len() > MAX_HEAD {
                return;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let close = head.contains("\r\nconnection: close") || head.starts_with("get / http/1.0");
        let reply: &[u8] = if close {
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello world"
        } else {
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n\r\nhello world"
        };
        if stream.write_all(reply).await.is_err() || close {
            return;
        }
        // Requests carry no body here (GET); drop the head and go on.
        buf.drain(..end + 4);
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_end_is_found() {
        assert_eq!(
            find_head_end(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET"),
            Some(23)
        );
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n"), None);
    }
}

//! `GET /metrics` over HTTP/1.1 for `cobalt proxy`: the server's counters and the
//! proxy's, in the Prometheus text format.

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// What renders the exposition on each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// A running metrics endpoint; stops when dropped.
#[derive(Debug)]
pub struct MetricsEndpoint {
    local_addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsEndpoint {
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `GET /metrics` on `addr` with what `render` returns (404 elsewhere), one
/// connection at a time per scraper, each bounded by a 5 s header timeout.
pub async fn serve_metrics(addr: SocketAddr, render: Render) -> std::io::Result<MetricsEndpoint> {
    let listener = TcpListener::bind(addr).await?;
    let local_addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let render = render.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let render = render.clone();
                    async move {
                        let mut r = hyper::Response::new(Full::new(Bytes::new()));
                        if req.uri().path() == "/metrics" {
                            *r.body_mut() = Full::new(Bytes::from(render()));
                            r.headers_mut().insert(
                                hyper::header::CONTENT_TYPE,
                                hyper::header::HeaderValue::from_static(
                                    "text/plain; version=0.0.4",
                                ),
                            );
                        } else {
                            *r.status_mut() = hyper::StatusCode::NOT_FOUND;
                        }
                        Ok::<_, Infallible>(r)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(5))
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(MetricsEndpoint { local_addr, task })
}

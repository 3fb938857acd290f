//! A Cobalt server for peers that observe and upload over `coap+tcp` and `coap+ws`
//! ([`Observed`]), and what the peers' output shows.

use crate::stream::{body, eventually, Transport, Value};
use cobalt::proto::tcp_connection::TcpConfig;
use cobalt::server::{put, MethodRouter, Request, UploadChunk};
use cobalt::transport::limits::TcpServerLimits;
use cobalt::{Code, Server, ServerHandle};
use cobalt_test_support::peers::aiocoap;
use cobalt_test_support::temp::TempDir;
use std::path::Path;
use std::time::Duration;

/// A server with an observable `/obs` (ticking while the test runs), a large
/// observable `/big-obs`, and `/store` that keeps what is PUT to it; its TCP
/// Max-Message-Size is 8192, so that larger bodies must come in (BERT) blocks.
pub struct Observed {
    pub server: ServerHandle,
    pub value: Value,
    pub big: Value,
    pub stored: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    /// Lengths of the blocks PUT to `/chunks` (a streaming handler).
    pub chunks: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    ticker: tokio::task::JoinHandle<()>,
}

impl Observed {
    pub async fn start(transport: Transport) -> Observed {
        let value = Value::new(b"tick 0");
        let big = Value::new(&body(9000));
        let stored = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let keep = stored.clone();
        let chunks = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = chunks.clone();
        let server = Server::new()
            .route(
                "/chunks",
                MethodRouter::default().stream_upload(Code::PUT, move |chunk: UploadChunk| {
                    log.lock().unwrap().push(chunk.data().len());
                    let code = if chunk.last {
                        Code::CHANGED
                    } else {
                        Code::CONTINUE
                    };
                    async move { code }
                }),
            )
            .route("/obs", value.resource())
            .route("/big-obs", big.resource())
            .route(
                "/store",
                put(move |req: Request| {
                    *keep.lock().unwrap() = req.payload().to_vec();
                    let n = req.payload().len();
                    async move { (Code::CHANGED, format!("stored {n} bytes")) }
                }),
            );
        let limits = TcpServerLimits {
            connection: TcpConfig {
                max_message_size: 8192,
                ..Default::default()
            },
            ..Default::default()
        };
        let server = transport.bind(server, limits).await;
        let ticking = value.clone();
        let ticker = tokio::spawn(async move {
            for i in 1.. {
                tokio::time::sleep(Duration::from_millis(200)).await;
                ticking.set(format!("tick {i}").as_bytes());
            }
        });
        Observed {
            server,
            value,
            big,
            stored,
            chunks,
            ticker,
        }
    }

    pub fn uri(&self, scheme: &str, path: &str) -> String {
        format!(
            "{scheme}://{}{path}",
            self.server.local_addr(scheme.parse().unwrap()).unwrap()
        )
    }

    pub async fn stop(self) {
        self.ticker.abort();
        let (value, big) = (self.value.observable.clone(), self.big.observable.clone());
        eventually("observers gone with their connections", || {
            value.observer_count() == 0 && big.observer_count() == 0
        })
        .await;
        self.server.shutdown(Duration::ZERO).await;
    }
}

/// Distinct "tick N" payloads in `out`, in order.
pub fn ticks(out: &str) -> Vec<u32> {
    let mut v: Vec<u32> = out
        .split("tick ")
        .skip(1)
        .filter_map(|t| {
            t.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .ok()
        })
        .collect();
    v.dedup();
    v
}

/// Whether the lengths of an upload's blocks show BERT: every block but the last a
/// multiple of 1024 bytes, and at least one larger than 1024.
pub fn bert_blocks(lengths: &[usize]) -> bool {
    let (_, rest) = lengths.split_last().unwrap_or((&0, &[]));
    rest.iter().all(|l| l % 1024 == 0) && rest.iter().any(|&l| l > 1024)
}

/// aiocoap (0.4.17) observing a Cobalt server over `t` (`tests/peers/aiocoap_observe.py`
/// run by `python`: four notifications in order) and uploading 40 kB with
/// `aiocoap-client` (`client`), larger than the server's Max-Message-Size, so in BERT
/// blocks: byte-exact when reassembled, and as the streaming handler sees the blocks.
pub async fn aiocoap_observes_and_uploads(t: Transport, python: &Path, client: &Path) {
    let server = Observed::start(t).await;
    let script = aiocoap::script("aiocoap_observe.py").display().to_string();
    let out = crate::run(python, &[&script, &server.uri(t.scheme(), "/obs"), "4"]).await;
    let seen = ticks(&out.stdout);
    assert_eq!(seen.len(), 4, "{out}");
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    let dir = TempDir::new("aiocoap-upload");
    let data: Vec<u8> = body(40_000).iter().map(|b| b'a' + b % 26).collect();
    let file = format!("@{}", dir.write("body.txt", &data).display());
    for path in ["/store", "/chunks"] {
        let uri = server.uri(t.scheme(), path);
        crate::run(client, &["-m", "PUT", "--payload", &file, &uri])
            .await
            .ok();
    }
    assert!(*server.stored.lock().unwrap() == data);
    let chunks = server.chunks.lock().unwrap().clone();
    assert_eq!(chunks.iter().sum::<usize>(), 40_000, "{chunks:?}");
    assert!(bert_blocks(&chunks), "{chunks:?}");
    server.stop().await;
}

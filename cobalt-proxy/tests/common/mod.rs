//! A counting CoAP origin shared by the proxy's tests.

#![allow(dead_code)]

use cobalt::proto::message::opt;
use cobalt::server::{get, post, Observable, Request, Response};
use cobalt::{Code, Scheme, Server, ServerHandle};
use cobalt_proxy::HOP_LIMIT;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long the tests' proxies wait for an origin: long enough that a loaded machine
/// (a full test run on two cores) never turns a slow answer into 5.04 / 504. Only a
/// check of a silent origin uses a proxy of its own that waits [`IMPATIENT`].
pub const PATIENT: Duration = Duration::from_secs(30);

/// How long a proxy that is asked only for a silent origin waits (then 5.04 / 504).
pub const IMPATIENT: Duration = Duration::from_millis(300);

/// What the origin counts.
#[derive(Default)]
pub struct Counts {
    pub requests: AtomicUsize,
    /// Tokens of the observe registrations seen (a retransmitted registration may
    /// run the handler twice with the same token).
    pub registrations: std::sync::Mutex<std::collections::HashSet<Vec<u8>>>,
    pub with_hop_limit: AtomicUsize,
    /// Requests for `/slow-count` (answered after 200 ms).
    pub slow_requests: AtomicUsize,
}

pub struct Origin {
    pub server: ServerHandle,
    pub addr: SocketAddr,
    pub counts: Arc<Counts>,
    pub temp: Observable,
    /// The value the next notification of `/temp` carries.
    pub value: Arc<AtomicUsize>,
}

pub async fn origin() -> Origin {
    let counts = Arc::new(Counts::default());
    let temp = Observable::new();
    let value = Arc::new(AtomicUsize::new(1));
    let (c1, c2, c3) = (counts.clone(), counts.clone(), counts.clone());
    let v = value.clone();
    let server = Server::new()
        .route(
            "/count",
            get(move |req: Request| {
                let counts = c1.clone();
                async move {
                    counts.requests.fetch_add(1, Ordering::SeqCst);
                    if req.options().contains(HOP_LIMIT) {
                        counts.with_hop_limit.fetch_add(1, Ordering::SeqCst);
                    }
                    if req.options().get_all(opt::ETAG).any(|e| e == b"v1") {
                        return Response::new(Code::VALID).with_etag(b"v1").with_max_age(10);
                    }
                    Response::text("counted").with_etag(b"v1").with_max_age(10)
                }
            }),
        )
        .route(
            "/temp",
            get(move |req: Request| {
                let counts = c2.clone();
                let v = v.clone();
                async move {
                    if req.options().observe() == Some(0) {
                        let token = req.message().token.as_bytes().to_vec();
                        counts.registrations.lock().unwrap().insert(token);
                    }
                    format!("t{}", v.load(Ordering::SeqCst))
                }
            })
            .observable(&temp),
        )
        .route(
            "/large",
            get(move || {
                c3.requests.fetch_add(1, Ordering::SeqCst);
                async {
                    Response::content((0..5000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>())
                }
            }),
        )
        .route(
            "/slow-count",
            get({
                let counts = counts.clone();
                move || {
                    let counts = counts.clone();
                    async move {
                        counts.slow_requests.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        "slowly counted"
                    }
                }
            }),
        )
        .route(
            "/echo",
            post(|req: Request| async move { (Code::CHANGED, req.payload().to_vec()) }),
        )
        .route(
            "/silent",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                "too late"
            }),
        )
        .shards(1)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    let addr = server.local_addr(Scheme::Coap).unwrap();
    Origin {
        server,
        addr,
        counts,
        temp,
        value,
    }
}

/// An HTTPS origin on loopback: every request is answered 200 `text/plain` "over
/// TLS". Its certificate names `san` only and is signed by a CA made for it
/// ([`HttpsOrigin::ca_pem`]), which no proxy trusts unless told to.
pub struct HttpsOrigin {
    pub addr: SocketAddr,
    /// The CA's certificate in PEM.
    pub ca_pem: String,
    serving: tokio::task::JoinHandle<()>,
}

impl Drop for HttpsOrigin {
    fn drop(&mut self) {
        self.serving.abort();
    }
}

pub async fn https_origin(san: &str) -> HttpsOrigin {
    use hyper_util::rt::TokioIo;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    // A name of its own: a CA is found by its name, then its signature checked.
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("test CA of {addr}"));
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![san.to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let serving = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // A client that refuses the certificate ends the handshake here.
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let answer = hyper::service::service_fn(|_req| async {
                    hyper::Response::builder()
                        .header("content-type", "text/plain")
                        .body(http_body_util::Full::new(bytes::Bytes::from("over TLS")))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), answer)
                    .await;
            });
        }
    });
    HttpsOrigin {
        addr,
        ca_pem: ca_cert.pem(),
        serving,
    }
}

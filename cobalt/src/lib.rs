//! Cobalt: a CoAP (RFC 7252) server and client for IoT cloud services.
//!
//! ```no_run
//! use cobalt::server::{get, post, Observable, Request};
//! use cobalt::{Client, Code, Scheme, Server};
//!
//! # async fn demo() -> cobalt::Result<()> {
//! // A server: resources are async handlers; `temp` can be observed (RFC 7641).
//! let temp = Observable::new();
//! let server = Server::new()
//!     .route("/hello", get(|| async { "hello world" }))
//!     .route("/echo", post(|r: Request| async move { (Code::CHANGED, r.payload().to_vec()) }))
//!     .route("/temp", get(|| async { "21.5" }).observable(&temp))
//!     .listen(Scheme::Coap, "[::]:5683")
//!     .listen(Scheme::CoapTcp, "[::]:5683")
//!     .start()
//!     .await?;
//!
//! // A client: one for every scheme; errors say what happened and what to try.
//! let client = Client::new();
//! let hello = client.get("coap://127.0.0.1/hello").await?;
//! println!("{} {}", hello.code, hello.text_payload());
//! let mut observation = client.observe("coap+tcp://127.0.0.1/temp").await?;
//! if let Some(n) = observation.next().await {
//!     println!("{}", n?.text_payload());
//! }
//! observation.cancel().await?;
//! server.shutdown(std::time::Duration::from_secs(1)).await;
//! # Ok(()) }
//! ```
//!
//! This page is the guide: [serving](#serving),
//! [routes, state and extractors](#routes-state-and-extractors), [requests](#requests),
//! [observe](#observe), [block-wise transfers](#block-wise-transfers),
//! [where handlers run](#where-handlers-run), [transports and credentials](#transports-and-credentials),
//! [protection](#protection), [configuration](#configuration) and the
//! [architecture](#architecture). The `cobalt` command (`cobalt-cli`) is built on this
//! crate; `examples/` holds a minimal server, client and observer to copy from.
//!
//! # Serving
//!
//! A [`Server`] is a resource tree ([`Server::route`]) and the listeners it is served on
//! ([`Server::listen`], one per [`Scheme`]); [`Server::start`] opens them all, or fails
//! saying which one cannot be opened and leaves nothing running. [`Server::bind`] is the
//! plain UDP case: `listen(Scheme::Coap, addr).start()`.
//!
//! ```no_run
//! use cobalt::server::{get, post, Request};
//! use cobalt::{Code, Scheme, Server};
//!
//! # async fn run() -> cobalt::Result<()> {
//! let server = Server::new()
//!     .route("/hello", get(|| async { "hello world" }).rt("greeting"))
//!     .route("/echo", post(|req: Request| async move { (Code::CHANGED, req.payload().to_vec()) }))
//!     .bind("[::]:5683")
//!     .await?;
//! assert!(server.local_addr(Scheme::Coap).is_some());
//! assert_eq!(server.local_addr(Scheme::CoapTcp), None);
//! server.wait().await;
//! # Ok(()) }
//! ```
//!
//! Handlers are async functions of nothing, of the [`Request`], or of its parts (see
//! [routes, state and extractors](#routes-state-and-extractors)), answering
//! anything [`server::IntoResponse`]: a string, bytes, a `(Code, body)` pair or a
//! [`Response`]. A handler that is ready on its first poll is answered inline, piggybacked
//! on the ACK, without leaving the shard's thread; one that takes longer than
//! `separate_ack_delay` (1 s) gets an empty ACK and its answer goes out later as a
//! confirmable separate response. A handler that panics is answered 5.00 and the server
//! keeps serving. Unknown paths get 4.04 (or the [`Server::fallback`]'s answer), other
//! methods 4.05, and `/.well-known/core` (RFC 6690) is generated from the tree, with
//! query filters.
//!
//! [`ServerHandle::shutdown`] stops reading, lets handlers in progress answer for a grace
//! period, and releases every socket and connection.
//!
//! # Routes, state and extractors
//!
//! A route's path may have parameters: `{name}` matches any one segment and a last
//! `{*name}` the remaining ones (zero or more). Where several routes match, the one
//! whose segments match best from the left serves: literal text before a parameter
//! before a wildcard. [`Server::fallback`] answers what no route matches (instead of
//! 4.04; a forward proxy is a fallback).
//!
//! Handlers take up to four arguments, each taken from the request, in the spirit of
//! axum: [`server::State`] (a clone of what [`Server::with_state`] gave),
//! [`server::extract::Path`] (the parameters, parsed: `Path<u32>`, `Path<(String,
//! u32)>`; one that does not parse is answered 4.00 saying which), [`server::extract::Query`],
//! [`server::Routes`], and last the body ([`server::extract::Text`],
//! [`server::extract::Payload`]) or the [`Request`] itself ([`Request::param`] reads a
//! parameter). A handler asking for `State` of another type than the server's is
//! answered 5.00 naming both types, and logged as an error.
//!
//! Routes change while the server serves: [`server::Routes`] (from
//! [`ServerHandle::routes`], or a handler argument) inserts and removes resources, and
//! every shard and connection serves the change from its next request on.
//! `/.well-known/core` lists the routes with a concrete path, those added at run time
//! included; an observable resource added at run time notifies its observers, and one
//! removed tells them it is gone. Matching a static path takes no lock and no
//! allocation, whatever the edits.
//!
//! A small resource directory: POST creates `/rd/{n}`, which answers GET and removes
//! itself on DELETE.
//!
//! ```
//! use cobalt::server::extract::{Path, Text};
//! use cobalt::server::{get, post, IntoResponse, Request, Routes, State};
//! use cobalt::{Client, Code, Response, Scheme, Server};
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::sync::Arc;
//!
//! /// What the handlers share.
//! #[derive(Clone, Default)]
//! struct Directory {
//!     next: Arc<AtomicU32>,
//! }
//!
//! /// POST /rd: a registration resource at a new `/rd/{n}`.
//! async fn register(State(dir): State<Directory>, routes: Routes, Text(links): Text) -> Response {
//!     let path = format!("/rd/{}", dir.next.fetch_add(1, Ordering::Relaxed));
//!     let resource = get(move || std::future::ready(links.clone()))
//!         .delete(|routes: Routes, req: Request| async move {
//!             if routes.remove(&req.path()) { Code::DELETED } else { Code::NOT_FOUND }
//!         })
//!         .rt("core.rd-ep");
//!     match routes.insert(&path, resource) {
//!         Ok(()) => Response::created(&path),
//!         Err(e) => (Code::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> cobalt::Result<()> {
//! let server = Server::new()
//!     .with_state(Directory::default())
//!     .route("/rd", post(register))
//!     .route(
//!         "/sum/{a}/{b}",
//!         get(|Path((a, b)): Path<(u32, u32)>| async move { (a + b).to_string() }),
//!     )
//!     .fallback(get(|req: Request| async move { format!("nothing at {}", req.path()) }))
//!     .bind("127.0.0.1:0")
//!     .await?;
//! let base = format!("coap://{}", server.local_addr(Scheme::Coap).unwrap());
//! let client = Client::new();
//! assert_eq!(client.get(&format!("{base}/sum/2/40")).await?.text_payload(), "42");
//! let created = client.post(&format!("{base}/rd"), "</temp>").await?;
//! let at = created.options.location_path_string().unwrap();
//! assert_eq!(at, "/rd/0");
//! assert_eq!(client.get(&format!("{base}{at}")).await?.text_payload(), "</temp>");
//! let core = client.get(&format!("{base}/.well-known/core")).await?;
//! assert!(core.text_payload().contains("</rd/0>"));
//! assert_eq!(client.delete(&format!("{base}{at}")).await?.code, Code::DELETED);
//! let gone = client.get(&format!("{base}{at}")).await?;
//! assert_eq!(gone.text_payload(), "nothing at /rd/0");
//! server.shutdown(std::time::Duration::ZERO).await;
//! # Ok(()) }
//! ```
//!
//! # Requests
//!
//! [`Client`] is async; [`client::blocking::Client`] has the same constructors
//! (`Client::new()`, `Client::with_config(..)?`), the same requests, and an `observe(uri)?`
//! that returns an iterator of notifications.
//!
//! ```no_run
//! # async fn run() -> cobalt::Result<()> {
//! let client = cobalt::Client::new();
//! let r = client.get("coap://127.0.0.1/hello").await?;
//! println!("{} {}", r.code, r.text_payload());
//! let r = client
//!     .request(cobalt::Code::POST, "coap://127.0.0.1/echo")
//!     .payload("hi")
//!     .non_confirmable()
//!     .timeout(std::time::Duration::from_secs(5))
//!     .send()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Errors are typed ([`Error`]) so a program can match them: `Timeout { peer,
//! retransmissions }`, `Reset`, `Deadline`, `Unreachable`, `BadUri`, `Resolve`,
//! [`Error::BlockTransfer`] ([`BlockError`]), [`Error::Connection`] ([`ConnectionError`]),
//! [`Error::Tls`]/[`Error::Dtls`] ([`HandshakeFailure`]), [`Error::Credentials`]
//! (including a bad PSK file), `ObservationLost`, [`Error::Unsupported`]. Each message
//! says what happened and what to try, and `Error`'s `Debug` is that message, so a `main`
//! returning [`Result`] prints `Error: <what happened and what to try>`. The client's UDP
//! sockets ask the kernel for ICMP errors (`IP_RECVERR`/`IPV6_RECVERR`), so a request to a
//! port where nothing listens fails at once with `Unreachable` instead of after 93 s of
//! retransmissions.
//!
//! A single UDP client endpoint may send at most 65,536 messages to one server within
//! EXCHANGE_LIFETIME (RFC 7252 §4.4: message IDs must not be reused); beyond that the
//! client queues requests until IDs are free again. Spread heavy traffic to one server
//! over several clients.
//!
//! # Observe
//!
//! Both sides of RFC 7641:
//!
//! ```no_run
//! use cobalt::server::{get, Observable};
//! # async fn run() -> cobalt::Result<()> {
//! let temp = Observable::new();
//! let server = cobalt::Server::new()
//!     .route("/temp", get(|| async { "21.5" }).observable(&temp))
//!     .bind("[::]:5683")
//!     .await?;
//! temp.changed(); // every observer gets the GET handler's new answer
//! temp.changed_for(|peer| peer.ip().is_loopback()); // only some observers
//!
//! let mut obs = cobalt::Client::new().observe("coap://127.0.0.1/temp").await?;
//! while let Some(n) = obs.next().await {
//!     println!("{}", n?.text_payload());
//! }
//! # Ok(()) }
//! ```
//!
//! Notifications carry one sequence counter per resource (the resource decides the order,
//! 24-bit wrap); they are NON except every `observe_con_every`-th (20) or once per
//! `observe_con_interval` (24 h), or when asked ([`server::Observable::changed_confirmable`]).
//! Observers go away on RST, on a confirmable notification that is not acknowledged, on
//! GET with Observe=1, and when the resource is [`deleted`](server::Observable::deleted)
//! (they get 4.04).
//!
//! The client drops stale notifications (RFC 7641 §3.4), fetches the rest of a
//! notification larger than one block, re-registers when nothing arrives for Max-Age + 5 s
//! (at most 3 times in a row, [`Observation::max_reregistrations`], then it ends with
//! `Error::ObservationLost`; [`Observation::on_reregister`] hears about each attempt), and
//! [`cancel`](Observation::cancel)s with Observe=1; a dropped [`Observation`] answers the
//! next notification with RST over UDP and deregisters over TCP.
//! A client of many servers (a mashup of thousands of devices) puts its observations
//! in one [`ObservationSet`]: each member behaves as an `Observation`, and all are read
//! through one queue by one task, named by the caller's keys, with no task, boxed
//! future or queue per observation.
//!
//! **Fan-out.** `changed()` reaches each shard's inbox, and the inbox of each connection
//! that holds relations of the resource; an inbox keeps one pending change per resource. A change starts a *round* over the resource's observers;
//! changes during a round make one more round after it. Each notification is produced
//! from the state current when it is produced, so under a burst of changes the states in
//! between are skipped (RFC 7641 §4.5) and every observer ends with the latest. The GET
//! handler runs once per round for all observers whose registrations asked the same,
//! unless it calls [`Request::peer`] (then once per observer). A shard sends at most
//! `observe_batch` (256) notifications per turn of its loop and reads its socket between
//! turns, so a resource with 10,000 observers does not stop it from serving others (a
//! connection works the same way, between its reads). Per observer, nothing new is sent
//! while its last confirmable notification is unacknowledged, nor sooner than
//! `observe_min_interval` after the last one.
//!
//! **Bounds.** Relations are bounded per client IP address (`max_observers_per_ip`, 1,000,
//! over all transports together: 4.29 Too Many Requests with Max-Age) and per server
//! (`max_observers`, 100,000: near it, an address that holds at least what is still free
//! gets 5.03 with Max-Age). A refused registration gets no relation.
//!
//! Over `coap+tcp://` and `coap+ws://` (RFC 8323 §7) the same `Observable` and
//! `Client::observe` work: a relation belongs to its connection and ends with it, and a
//! notification larger than the peer's Max-Message-Size carries the first block.
//!
//! # Block-wise transfers
//!
//! RFC 7959: responses larger than a block are cut on the client's Block2 request (any
//! block number: random access; the client's size or the server's `block_szx`); the client
//! reassembles them and checks the ETag. Uploads are sent in Block1 blocks
//! ([`RequestBuilder::block_size`] or 1024 bytes) and reassembled by the server before the
//! handler runs, in order, up to `max_body` (4.13 with Size1 beyond, 4.08 for a gap;
//! Request-Tag keeps concurrent uploads apart). A server that asks for smaller blocks
//! (2.31 with a smaller SZX) is followed at the block number its size implies.
//!
//! Uploads in progress are bounded per peer (`max_uploads_per_peer`, 4), per IP address
//! (`max_uploads_per_ip`, 32, and `max_upload_memory_per_ip`, 4 MiB; 4.29 with Max-Age) and
//! in total (`max_uploads`, 1,000, and `max_upload_memory`, 64 MiB; 5.03 near them for the
//! addresses holding most). An upload that receives no block for `upload_idle_timeout`
//! (60 s) is dropped on a timer of its own.
//!
//! Uploads too large to buffer can be consumed block by block:
//!
//! ```no_run
//! use cobalt::server::{MethodRouter, UploadChunk};
//! use cobalt::{Code, Server};
//! # async fn run() -> cobalt::Result<()> {
//! let server = Server::new()
//!     .route(
//!         "/firmware",
//!         MethodRouter::default().stream_upload(Code::PUT, |chunk: UploadChunk| async move {
//!             println!("{} bytes", chunk.data().len());
//!             if chunk.last { Code::CHANGED } else { Code::CONTINUE }
//!         }),
//!     )
//!     .bind("[::]:5683")
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Over `coap+tcp://` and `coap+ws://` a body goes in one message when it fits the peer's
//! Max-Message-Size (from its CSM), else block-wise; where both sides announced
//! Block-Wise-Transfer, BERT (RFC 8323 §6) is used: SZX 7 blocks that are multiples of
//! 1024 bytes, as large as the peer's Max-Message-Size allows (the server caps them at
//! `max_bert_block`, 64 KiB).
//!
//! # Where handlers run
//!
//! The paper's per-resource business-logic stage: each resource runs its handlers on an
//! [`server::Executor`] (inline on the shard by default; children inherit the nearest
//! ancestor's choice).
//!
//! ```no_run
//! use cobalt::server::{get, Executor};
//! # async fn run() -> cobalt::Result<()> {
//! let server = cobalt::Server::new()
//!     .route("/fast", get(|| async { "inline on the shard thread" }))
//!     .route("/db/query", get(|| async { "runs on the blocking pool" }))
//!     .executor("/db", Executor::blocking(4)?) // children inherit
//!     .route("/counter", get(|| async { "one at a time" }).executor(Executor::exclusive()?))
//!     .bind("[::]:5683")
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! A handler can ask other CoAP services with [`Request::client`]: those requests go out
//! on the socket of the shard that received the request, so their responses come back to
//! it, and awaiting them resumes on the resource's executor. Over TCP, TLS and WebSockets
//! inline handlers run on the connection's task and the others on their executor.
//!
//! # Transports and credentials
//!
//! | URI scheme | transport | server | client |
//! |---|---|---|---|
//! | `coap://` | UDP (RFC 7252), one `SO_REUSEPORT` socket per shard | [`Scheme::Coap`] | [`Client`] |
//! | `coaps://` | DTLS 1.2 with a PSK or certificates (RFC 7252 §9) | [`Scheme::Coaps`] | [`Client::with_psk`], [`Client::with_x509`] |
//! | `coap+tcp://` | TCP (RFC 8323) | [`Scheme::CoapTcp`] | a pooled connection per server |
//! | `coaps+tcp://` | TLS 1.2/1.3 (RFC 8323 §8.2), ALPN `coap` | [`Scheme::CoapsTcp`] | as `coaps://`, or the system's CAs |
//! | `coap+ws://` | WebSockets (RFC 8323 §4) | [`Scheme::CoapWs`] | a pooled WebSocket per server |
//! | `coaps+ws://` | secure WebSockets | [`Scheme::CoapsWs`] | as `coaps+tcp://` |
//!
//! Block-wise transfers, observe, separate responses and deduplication work over each.
//! The secure schemes share one set of credentials ([`transport::credentials`]):
//! pre-shared keys ([`Server::psk`], from a key file with
//! [`PskStore::load`](transport::credentials::PskStore::load)) and certificates
//! ([`Server::x509`]); a client without credentials verifies a TLS server against the
//! system's CAs and the URI's host, like curl.
//!
//! ```no_run
//! use cobalt::transport::credentials::PskStore;
//! use cobalt::{Scheme, Server};
//! # async fn run() -> cobalt::Result<()> {
//! let keys = PskStore::load("keys.txt")?; // one `identity:key` per line
//! let server = Server::new()
//!     .psk(keys)
//!     .listen(Scheme::Coaps, "[::]:5684")
//!     .listen(Scheme::CoapsTcp, "[::]:5684")
//!     .start()
//!     .await?;
//! let client = cobalt::Client::new().with_psk("alice", "secretPSK");
//! let r = client.get("coaps://127.0.0.1/hello").await?;
//! # Ok(()) }
//! ```
//!
//! The WebSocket listener accepts HTTP/1.1 upgrades on `/.well-known/coap` with
//! subprotocol `coap` and answers anything else with an HTTP error (404, 400, 405, 426,
//! 431, 503 over its connection budgets). The limits of the connection-oriented listeners
//! are [`Server::tcp_limits`] and [`Server::ws_limits`] (connections in total and per
//! address, Max-Message-Size, which is also the WebSocket frame limit, handshake, idle
//! and write timeouts), those of DTLS [`Server::dtls_config`] (sessions, handshakes in
//! total and per address).
//!
//! The DTLS Connection ID (RFC 9146), which keeps a session when a client's address
//! changes (NAT rebinding), comes with a second DTLS backend on Mbed TLS 3.6 (feature
//! `mbedtls`; OpenSSL has none): a server grants CIDs when
//! [`DtlsConfig::cid_len`](transport::dtls::DtlsConfig::cid_len) is set (`[dtls]
//! cid_len = 6`, `cobalt serve --cid 6`), a client asks for one with
//! [`Client::with_dtls_cid`]. Both take pre-shared keys and/or certificates
//! (ECDHE-ECDSA, client certificates included); OpenSSL stays the backend where no
//! CID is asked for.
//!
//! Cargo features: `vendored-openssl` (default) builds OpenSSL from source for DTLS and
//! TLS; `openssl` uses the system's (libssl-dev); `mbedtls` (default) builds Mbed TLS
//! 3.6 from source for the DTLS Connection ID (cmake, ninja, clang and libclang); with
//! none (`default-features = false`) the crate is plain CoAP with no C dependency, and
//! the secure schemes fail with [`Error::Unsupported`] naming the feature.
//!
//! # Groups
//!
//! A server joins All-CoAP-Nodes with [`Server::join_multicast`] and answers requests
//! sent to the group as RFC 7252 §8 and draft-ietf-core-groupcomm-bis say (NON only,
//! after a random Leisure, no errors or empty answers unless No-Response asks; see
//! [`server::group`]). A client sends a NON request to a group with
//! [`RequestBuilder::multicast`] and gets every answer that came within the wait:
//!
//! ```no_run
//! use cobalt::server::{get, GroupConfig};
//! use cobalt::{Client, Server};
//! use std::time::Duration;
//! # async fn run() -> cobalt::Result<()> {
//! let groups = GroupConfig {
//!     interfaces: vec!["eth0".into()],
//!     ..GroupConfig::default()
//! };
//! let server = Server::new()
//!     .route("/hello", get(|| async { "hello" }))
//!     .join_multicast(groups)
//!     .bind("[::]:5683")
//!     .await?;
//! let answers = Client::new()
//!     .request(cobalt::Code::GET, "coap://224.0.1.187/hello")
//!     .multicast(Duration::from_secs(3))
//!     .await?;
//! for (from, response) in answers {
//!     println!("{from}: {}", response.text_payload());
//! }
//! # Ok(()) }
//! ```
//!
//! # Protection
//!
//! Everything from the network is treated as hostile: no state an unverified peer can
//! grow cheaply, no answer larger than three times what an unverified address sent, and
//! one peer's abuse does not deny service to others.
//!
//! - **Amplification** (RFC 9175 §2.4, `amplification_factor` 3; 0 turns it off): until
//!   an address is verified it gets at most 3 times the bytes of each request. A larger
//!   answer waits for one verification round trip (a CoAP ping, which every
//!   implementation answers with RST); the address then stays verified for
//!   `verified_lifetime` (10 min). An address that never answers gets 4.01 with Echo for a
//!   safe request. DTLS peers are exempt: the cookie exchange verified them.
//! - **Bounds per peer, no global lockout.** Requests in progress are bounded per peer
//!   (`max_exchanges_per_peer`, 32), per IP address (`max_exchanges_per_ip`, 10,000) and
//!   per shard (`max_server_exchanges`, 100,000): 4.29 with Max-Age over one's own bound,
//!   and at the shard's bound only addresses that already have requests in progress get
//!   5.03. Connections, DTLS handshakes and sessions have the same per-address budgets.
//! - **Deduplication and at-most-once.** A request with a non-safe method (POST, PUT,
//!   DELETE, PATCH, iPATCH) runs its handler at most once for all copies of it (same peer
//!   address and port, same message ID) that arrive within EXCHANGE_LIFETIME (247 s) of its
//!   answer, as long as it is among that peer's last `dedup_per_peer` (8) messages and the
//!   store has not had to drop it for `max_dedup_bytes` (16 MiB per shard, counted in
//!   `cobalt_dedup_evictions_total`). A duplicate CON gets the stored reply again, a
//!   duplicate NON is dropped; a copy arriving while its handler runs is always
//!   recognised. A safe request (GET, FETCH) may run again when a copy arrives after its
//!   answer (RFC 7252 §4.5); `dedup_rerun_safe = false` keeps those answers too. A peer
//!   retransmits only its outstanding confirmable messages, so a real duplicate is among
//!   its last few. Nobody is ever refused because of deduplication, and expiry is O(1)
//!   per entry.
//!
//! # Layers
//!
//! A [`server::Layer`] sits between the protocol and the resources, for what every
//! resource shares: authorisation, logging, time limits, object security (OSCORE), a
//! proxy. It sees each request before it is routed (and may change it, or answer it
//! itself), wraps the handler's answer (a future: time limits, permits), sees each
//! answer on its way out, and each notification once per observer. Give layers to the
//! server ([`Server::layer`], the first given is the outermost) or to one resource
//! ([`server::MethodRouter::layer`]). A server without layers does nothing more per
//! request.
//!
//! The request carries who sent it, [`Request::identity`]: the transport, the address
//! and, over DTLS and TLS, the PSK identity or the verified certificate's subject;
//! layers attach values for the handler in [`Request::extensions_mut`]. A layer that
//! handles an option the protocol does not know (OSCORE's 9, a private number)
//! declares it in [`Layer::options`](server::Layer::options), and the protocol
//! machines of every transport pass it instead of answering 4.02; declaring Proxy-Uri
//! makes the server hand proxy requests to the layers instead of answering 5.05.
//! Shipped in [`server::layers`]: [`AccessLog`](server::layers::AccessLog),
//! [`Timeout`](server::layers::Timeout) (5.03 after a duration),
//! [`ConcurrencyLimit`](server::layers::ConcurrencyLimit) (5.03 with Max-Age beyond N
//! handlers) and [`Authorize`](server::layers::Authorize) (4.01 without a credential,
//! 4.03 with one that is not allowed).
//!
//! ```
//! use cobalt::server::layers::{Authorize, PskAllowList, Timeout};
//! use cobalt::server::{get, Layer, Request, Response};
//! use cobalt::{Client, Code, Scheme, Server};
//! use std::time::Duration;
//!
//! /// Tells the handler which tenant asks, from the query; refuses requests without.
//! #[derive(Clone)]
//! struct Tenant(String);
//! struct Tenants;
//! impl Layer for Tenants {
//!     fn on_request(&self, request: &mut Request) -> Result<(), Response> {
//!         let Some(tenant) = request.query_param("tenant").map(str::to_string) else {
//!             return Err(Response::new(Code::BAD_REQUEST).with_payload("add ?tenant=NAME"));
//!         };
//!         request.extensions_mut().insert(Tenant(tenant));
//!         Ok(())
//!     }
//!     fn on_response(&self, _: &Request, response: &mut Response) {
//!         response.options.set_uint(cobalt::proto::message::opt::MAX_AGE, 0);
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> cobalt::Result<()> {
//! let hello = get(|req: Request| async move {
//!     let tenant = req.extensions().get::<Tenant>().map_or("?", |t| t.0.as_str()).to_string();
//!     format!("hello {tenant} over {}", req.identity().scheme())
//! });
//! let server = Server::new()
//!     .route("/hello", hello.layer(Timeout::new(Duration::from_secs(5))))
//!     .route("/admin", get(|| async { "secret" }))
//!     .layer(Tenants)
//!     .layer(Authorize::psk(PskAllowList::new().allow("/admin", ["operator"])))
//!     .shards(1)
//!     .bind("127.0.0.1:0")
//!     .await?;
//! let addr = server.local_addr(Scheme::Coap).unwrap();
//! let client = Client::new();
//! let r = client.get(&format!("coap://{addr}/hello?tenant=acme")).await?;
//! assert_eq!(r.text_payload(), "hello acme over coap");
//! assert_eq!(r.options.get_uint(cobalt::proto::message::opt::MAX_AGE), Some(0));
//! let r = client.get(&format!("coap://{addr}/hello")).await?;
//! assert_eq!(r.code, Code::BAD_REQUEST);
//! // No credential over plain CoAP: 4.01.
//! let r = client.get(&format!("coap://{addr}/admin?tenant=acme")).await?;
//! assert_eq!(r.code, Code::UNAUTHORIZED);
//! server.shutdown(Duration::ZERO).await;
//! # Ok(()) }
//! ```
//!
//! The same trait serves the client role: [`Client::layer`] (and
//! [`client::blocking::Client::layer`]) puts a layer around every message a client
//! sends and receives, over every transport. [`Layer::on_send`](server::Layer::on_send)
//! sees (and may change, or refuse) each request as it goes out: each block of a
//! block-wise transfer, the repeat with an Echo, each registration of an observation.
//! [`Layer::on_receive`](server::Layer::on_receive) sees (and may change, or refuse)
//! each response and each notification before the application does. A refusal ends the
//! call with [`Error::LayerRefused`], naming the layer. What a layer keeps between the
//! two hooks goes in the [`server::Exchange`]'s extensions (an OSCORE layer keeps its
//! Partial IV there; an observation keeps its registration's exchange for all its
//! notifications), and options the layers declare pass the client's check of the
//! answers' critical options. [`AccessLog`](server::layers::AccessLog) logs on both
//! roles. A client without layers does nothing more per request.
//!
//! ```
//! use cobalt::proto::message::Message;
//! use cobalt::server::{post, Exchange, Layer, Refusal, Request};
//! use cobalt::{Client, Error, Scheme, Server};
//! use std::time::Duration;
//!
//! /// Signs what it sends with a trailing byte sum and checks that the answer
//! /// repeats it; refuses to send empty payloads.
//! struct Checksum;
//!
//! #[derive(Clone, Copy)]
//! struct Sum(u8);
//!
//! impl Layer for Checksum {
//!     fn on_send(&self, exchange: &mut Exchange, request: &mut Message) -> Result<(), Refusal> {
//!         if request.payload.is_empty() {
//!             return Err(Refusal::new("nothing to sign; send a payload"));
//!         }
//!         let sum = request.payload.iter().fold(0u8, |s, b| s.wrapping_add(*b));
//!         exchange.extensions_mut().insert(Sum(sum));
//!         request.payload.push(sum);
//!         Ok(())
//!     }
//!     fn on_receive(
//!         &self,
//!         exchange: &mut Exchange,
//!         _request: &Message,
//!         response: &mut Message,
//!     ) -> Result<(), Refusal> {
//!         let Some(Sum(sum)) = exchange.extensions().get::<Sum>().copied() else {
//!             return Ok(());
//!         };
//!         match response.payload.pop() {
//!             Some(echoed) if echoed == sum => Ok(()),
//!             _ => Err(Refusal::new("the answer does not repeat the checksum")),
//!         }
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> cobalt::Result<()> {
//! let server = Server::new()
//!     .route("/echo", post(|req: Request| async move { req.payload().to_vec() }))
//!     .shards(1)
//!     .bind("127.0.0.1:0")
//!     .await?;
//! let uri = format!("coap://{}/echo", server.local_addr(Scheme::Coap).unwrap());
//! let client = Client::new().layer(Checksum);
//! assert_eq!(client.post(&uri, "hi").await?.payload, b"hi");
//! let refused = client.post(&uri, "").await.unwrap_err();
//! assert!(matches!(refused, Error::LayerRefused { .. }), "{refused}");
//! server.shutdown(Duration::ZERO).await;
//! # Ok(()) }
//! ```
//!
//! # Configuration
//!
//! All RFC 7252 §4.8 parameters are fields of [`EndpointConfig`] (defaults in parentheses):
//! `ack_timeout` (2 s), `ack_random_factor` (1.5), `max_retransmit` (4), `nstart` (1),
//! `max_latency` (100 s), `processing_delay` (2 s); derived: EXCHANGE_LIFETIME 247 s,
//! NON_LIFETIME 145 s. Server-role limits are [`server::ServerLimits`]. A whole server's
//! settings can come from one TOML file with environment and `--set` overrides
//! ([`config::Config`]: defaults < file < `COBALT_<SECTION>_<KEY>` < flags); out-of-range
//! values are refused naming the key and the range.
//!
//! ```no_run
//! use cobalt::config::Config;
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = Config::load(Some(std::path::Path::new("cobalt.toml")))?;
//! let server = cobalt::Server::new()
//!     .with_config(&config.server_settings())
//!     .bind(config.server.socket_addr())
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Confirmable messages are retransmitted on the timers of a per-peer congestion
//! controller (`congestion_control`): `default` (RFC 7252), `cocoa`, `cocoa-strong`,
//! `fasor` (the default, draft-ietf-core-fasor-02), `fasor-k` (Cobalt's FASOR keeping
//! the backed-off timer after retransmissions, Karn's rule) and `karn`. The choice and
//! its measurements are in `bench/congestion/` (the CoAP congestion-control study's
//! constrained link, emulated and in virtual time): FASOR-K, the default before, did
//! not hold up on the workloads it was not tuned on.
//!
//! The counters of every shard and listener are exported in the Prometheus text format
//! ([`metrics`]).
//!
//! # Architecture
//!
//! The protocol lives in the sans-IO crate [`cobalt_proto`] (no I/O, no threads, no
//! clock): the message codec, the [`Endpoint`](cobalt_proto::endpoint::Endpoint) with its
//! exchanges, deduplication, reliability, congestion control and notifications, and the
//! RFC 8323 connection machine; the server's Block1 upload table, its observe relation
//! table with the CON policy, and the budgets' refusal rule; and one simulator in which
//! all of these run over lossy datagram links and chunked stream links. This crate adds
//! the connectors ([`transport`]: bytes in, bytes out, nothing of resources), the
//! drivers ([`runtime`]: shard threads with a socket, an endpoint and a clock, and the
//! listeners whose tasks run RFC 8323 connections, each generic over the service it
//! runs), the [`Server`] with its resource tree, and the [`Client`]. The server role
//! (dispatch, Block1 reassembly, Block2 slicing, observe relations and their
//! notifications) is written once against the protocol surface
//! [`Session`](cobalt_proto::session::Session): a shard runs it over its endpoint, each
//! stream connection over its [`Connection`](cobalt_proto::session::stream::Connection);
//! what differs between the transports (block sizes and BERT, confirmable
//! notifications and their ACKs) is the session's. The modules import one
//! way: the resource tree, handlers, executors and [`server::Observable`] use no
//! transport or runtime module; an observable's changes reach the drivers through a
//! leaf module both import.
//!
//! **Shards.** By default the server runs one shard per core: a thread with its own
//! `SO_REUSEPORT` socket on the server port, its own endpoint, and the exchanges, dedup
//! entries, uploads and observe relations of the peers the kernel hashes to it. A request
//! goes socket → endpoint → handler → endpoint → socket on that thread (batches of up to 64
//! datagrams per `recvmmsg`/`sendmmsg`); only a handler that is not ready on its first poll
//! becomes a task, on the same thread. **Single-socket mode**
//! ([`Server::single_socket`]) is the paper's stage design for systems without
//! `SO_REUSEPORT`: receiver threads hash each datagram's sender to a protocol worker, and
//! a full worker queue answers 5.03 with Max-Age.
//!
//! **Timers.** Each endpoint keeps a FIFO for the one timer every confirmable request arms
//! (the separate-ACK deadline, always the same delay, so O(1) to arm and expire) and a heap
//! for retransmissions; moot timers are skipped when they fire. Due timers fire on every
//! turn of a shard's loop, however busy its socket.
#![warn(missing_docs)]

pub(crate) mod changes;
pub mod client;
pub mod config;
mod error;
pub mod metrics;
mod response;
pub mod runtime;
pub mod server;
mod trace;
pub mod transport;

pub use client::{Client, Observation, ObservationSet, RequestBuilder};
pub use cobalt_proto as proto;
pub use cobalt_proto::endpoint::EndpointConfig;
pub use cobalt_proto::message::{content_format, Code};
pub use cobalt_proto::uri::Scheme;
pub use error::{
    BlockError, ConnectionError, ConnectionErrorKind, CredentialsError, Error, HandshakeFailure,
    Result, Unsupported,
};
pub use server::{Request, Response, Server, ServerHandle};

/// The README's examples, compiled as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

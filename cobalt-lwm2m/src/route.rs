//! How the manager reaches a registered client.

use cobalt::Scheme;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

/// How the manager reaches one registered client: the server's own client for the
/// socket the registration arrived on (so requests leave from the address the
/// client registered with, and over its DTLS session for `coaps`), and the
/// client's address; and when it was last heard from, which a request to a client
/// in queue mode waits on.
#[derive(Clone)]
pub(crate) struct Route {
    pub(crate) client: cobalt::Client,
    pub(crate) peer: SocketAddr,
    pub(crate) scheme: Scheme,
    pub(crate) heard: Arc<watch::Sender<Instant>>,
}

impl Route {
    /// A route heard from now.
    pub(crate) fn new(client: cobalt::Client, peer: SocketAddr, scheme: Scheme) -> Route {
        Route {
            client,
            peer,
            scheme,
            heard: Arc::new(watch::channel(Instant::now()).0),
        }
    }
}

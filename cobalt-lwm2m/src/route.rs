//! How the manager reaches a registered client.

use cobalt::Scheme;
use std::net::SocketAddr;

/// How the manager reaches one registered client: the server's own client for the
/// socket the registration arrived on (so requests leave from the address the
/// client registered with, and over its DTLS session for `coaps`), and the
/// client's address.
#[derive(Clone)]
pub(crate) struct Route {
    pub(crate) client: cobalt::Client,
    pub(crate) peer: SocketAddr,
    pub(crate) scheme: Scheme,
}

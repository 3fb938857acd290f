//! What a handler receives ([`Request`]) and returns ([`BoxFuture`] of a
//! [`Response`], or anything [`IntoResponse`]).

pub use crate::response::{IntoResponse, Response};
use cobalt_proto::message::{Code, Message, Options};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The future a handler returns, boxed: the answer to a request, whenever it is ready.
pub type BoxFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send + 'static>>;

/// A request as a handler sees it.
#[derive(Debug, Clone)]
pub struct Request {
    peer: SocketAddr,
    message: Message,
    pub(crate) client: Option<crate::Client>,
    /// Set when the handler asks for the peer (its answer then depends on who asks).
    peer_read: Option<Arc<AtomicBool>>,
}

impl Request {
    /// Wraps a received message.
    pub fn new(peer: SocketAddr, message: Message) -> Request {
        Request {
            peer,
            message,
            client: None,
            peer_read: None,
        }
    }

    /// Sets `flag` when the handler asks for [`Request::peer`].
    pub(crate) fn watch_peer(mut self, flag: Arc<AtomicBool>) -> Request {
        self.peer_read = Some(flag);
        self
    }

    /// A client whose requests go out on the socket of the shard that received this
    /// request, so their responses come back to the same shard (thesis §8.3). Awaiting
    /// its responses inside the handler resumes on the resource's executor. Outside a
    /// server (a request built by hand) it is a fresh standalone client.
    pub fn client(&self) -> crate::Client {
        self.client.clone().unwrap_or_default()
    }

    /// Who sent it.
    ///
    /// For a notification, a handler that asks this is run for each observer; one that
    /// does not may run once for all observers that registered with the same request
    /// ([`Observable`](super::Observable)).
    pub fn peer(&self) -> SocketAddr {
        if let Some(flag) = &self.peer_read {
            flag.store(true, Ordering::Relaxed);
        }
        self.peer
    }

    /// The method (GET, POST, ...).
    pub fn method(&self) -> Code {
        self.message.code
    }

    /// The path with a leading `/`.
    pub fn path(&self) -> String {
        self.message.options.uri_path_string()
    }

    /// The Uri-Query items.
    pub fn query(&self) -> impl Iterator<Item = &str> {
        self.message.options.uri_query()
    }

    /// The value of `name=value` in the query, if present (`Some("")` for a bare `name`).
    pub fn query_param(&self, name: &str) -> Option<&str> {
        self.query().find_map(|q| match q.split_once('=') {
            Some((k, v)) if k == name => Some(v),
            None if q == name => Some(""),
            _ => None,
        })
    }

    /// The payload bytes.
    pub fn payload(&self) -> &[u8] {
        &self.message.payload
    }

    /// The payload as UTF-8 text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.message.payload).into_owned()
    }

    /// Content-Format of the payload.
    pub fn content_format(&self) -> Option<u16> {
        self.message.options.content_format()
    }

    /// The Accept option.
    pub fn accept(&self) -> Option<u16> {
        self.message.options.accept()
    }

    /// All options.
    pub fn options(&self) -> &Options {
        &self.message.options
    }

    /// The whole message.
    pub fn message(&self) -> &Message {
        &self.message
    }

    /// True if the request was confirmable.
    pub fn is_confirmable(&self) -> bool {
        self.message.mtype == cobalt_proto::message::MessageType::Confirmable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_proto::message::MessageType;

    #[test]
    fn query_params() {
        let mut m = Message::new(MessageType::Confirmable, Code::GET, 1);
        m.options.set_uri_query("a=1&flag");
        let req = Request::new("127.0.0.1:1".parse().unwrap(), m);
        assert_eq!(req.query_param("a"), Some("1"));
        assert_eq!(req.query_param("flag"), Some(""));
        assert_eq!(req.query_param("b"), None);
    }
}

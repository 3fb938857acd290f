//! What the client's layers see and how the exchange path runs them: the
//! [`Exchange`] a layer keeps its state in, the [`Refusal`] it answers with, and the
//! client's list of layers ([`ClientLayers`]). The layers are
//! [`Layer`](crate::server::Layer)s, the trait of both roles; the client knows them
//! through [`ClientHooks`], the part of the trait it calls, so that the client does not
//! depend on the server's types.

use crate::server::Extensions;
use crate::{Error, Result};
use cobalt_proto::message::option::HandledOptions;
use cobalt_proto::message::{Message, Token};
use cobalt_proto::uri::Scheme;
use std::net::SocketAddr;
use std::sync::Arc;

/// Why a client layer refused a request or a response
/// ([`Layer::on_send`](crate::server::Layer::on_send),
/// [`Layer::on_receive`](crate::server::Layer::on_receive)); the call ends with
/// [`Error::LayerRefused`] carrying it and the layer's
/// [`name`](crate::server::Layer::name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    reason: String,
}

impl Refusal {
    /// A refusal saying `reason` (what was wrong, and what to do about it).
    pub fn new(reason: impl Into<String>) -> Refusal {
        Refusal {
            reason: reason.into(),
        }
    }

    /// What was wrong.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

/// One request of a client and its answers, as the client's layers see it: the
/// server, the transport, the token once the request went out, and what the layers
/// keep between [`Layer::on_send`](crate::server::Layer::on_send) and
/// [`Layer::on_receive`](crate::server::Layer::on_receive). A new one for every
/// message sent (every block, every repeat), except that an observation keeps the one
/// of its registration for all its notifications (until it registers again).
#[derive(Debug)]
pub struct Exchange {
    peer: SocketAddr,
    scheme: Scheme,
    token: Option<Token>,
    extensions: Extensions,
}

impl Exchange {
    /// An exchange with `peer` over `scheme`, before its request goes out.
    pub(crate) fn new(peer: SocketAddr, scheme: Scheme) -> Exchange {
        Exchange {
            peer,
            scheme,
            token: None,
            extensions: Extensions::new(),
        }
    }

    /// The server's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The transport (`coap`, `coaps`, `coap+tcp`, ...).
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The request's token: `None` in [`Layer::on_send`](crate::server::Layer::on_send)
    /// (the protocol machine chooses it as the request goes out), the token the
    /// answers carry in [`Layer::on_receive`](crate::server::Layer::on_receive).
    pub fn token(&self) -> Option<&Token> {
        self.token.as_ref()
    }

    /// What the layers keep for this exchange.
    pub fn extensions(&self) -> &Extensions {
        &self.extensions
    }

    /// What the layers keep for this exchange, to change.
    pub fn extensions_mut(&mut self) -> &mut Extensions {
        &mut self.extensions
    }
}

/// The hooks of a [`Layer`](crate::server::Layer) that a client calls (every layer has
/// them; see the trait for what each does).
pub(crate) trait ClientHooks: Send + Sync + 'static {
    /// The option numbers the layer handles.
    fn options(&self) -> &[u16];

    /// Sees a request before it goes out.
    fn on_send(&self, exchange: &mut Exchange, request: &mut Message) -> Result<(), Refusal>;

    /// Sees a response or notification to `request`.
    fn on_receive(
        &self,
        exchange: &mut Exchange,
        request: &Message,
        response: &mut Message,
    ) -> Result<(), Refusal>;

    /// The layer's name in errors.
    fn name(&self) -> &'static str;
}

/// The layers of a client, outermost first, and the options they declare (none
/// without layers). Cheap to clone, and one pointer: every observation's route holds
/// a copy, and a client may hold thousands.
#[derive(Clone, Default)]
pub(crate) struct ClientLayers(Option<Arc<Layers>>);

/// The layers of [`ClientLayers`] when there are some.
struct Layers {
    list: Vec<Arc<dyn ClientHooks>>,
    /// The option numbers the layers declare: answers may carry them.
    handled: HandledOptions,
}

impl std::fmt::Debug for ClientLayers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientLayers({})", self.list().len())
    }
}

impl ClientLayers {
    /// Adds `layer` inside the others.
    pub(crate) fn push(&mut self, layer: Arc<dyn ClientHooks>) {
        let mut list = self.list().to_vec();
        list.push(layer);
        let handled = HandledOptions::new(list.iter().flat_map(|l| l.options().iter().copied()));
        self.0 = Some(Arc::new(Layers { list, handled }));
    }

    /// The layers, outermost first.
    fn list(&self) -> &[Arc<dyn ClientHooks>] {
        self.0.as_deref().map_or(&[], |l| &l.list)
    }

    /// Whether there are none (then the client does nothing more per message).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The option numbers the layers declare.
    pub(crate) fn handled(&self) -> &HandledOptions {
        static NONE: std::sync::LazyLock<HandledOptions> =
            std::sync::LazyLock::new(HandledOptions::default);
        self.0.as_deref().map_or(&NONE, |l| &l.handled)
    }

    /// Runs the send hooks, first to last, on `request`.
    pub(crate) fn send(&self, exchange: &mut Exchange, request: &mut Message) -> Result<()> {
        for layer in self.list() {
            layer
                .on_send(exchange, request)
                .map_err(|refusal| refused(layer.as_ref(), refusal))?;
        }
        Ok(())
    }

    /// Runs the receive hooks, last to first, on `response` to `request`.
    pub(crate) fn receive(
        &self,
        exchange: &mut Exchange,
        request: &Message,
        response: &mut Message,
    ) -> Result<()> {
        exchange.token = Some(response.token.clone());
        for layer in self.list().iter().rev() {
            layer
                .on_receive(exchange, request, response)
                .map_err(|refusal| refused(layer.as_ref(), refusal))?;
        }
        Ok(())
    }
}

/// The error of a call whose request or answer `layer` refused.
fn refused(layer: &dyn ClientHooks, refusal: Refusal) -> Error {
    Error::LayerRefused {
        layer: layer.name(),
        reason: refusal.reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_proto::message::{Code, MessageType};

    /// Appends its letter on send and receive; refuses a payload of "no".
    struct Letter(&'static str, u16);

    impl ClientHooks for Letter {
        fn options(&self) -> &[u16] {
            std::slice::from_ref(&self.1)
        }
        fn on_send(&self, _: &mut Exchange, request: &mut Message) -> Result<(), Refusal> {
            if request.payload == b"no" {
                return Err(Refusal::new("said no"));
            }
            request.payload.extend_from_slice(self.0.as_bytes());
            Ok(())
        }
        fn on_receive(
            &self,
            _: &mut Exchange,
            _: &Message,
            response: &mut Message,
        ) -> Result<(), Refusal> {
            response.payload.extend_from_slice(self.0.as_bytes());
            Ok(())
        }
        fn name(&self) -> &'static str {
            self.0
        }
    }

    #[test]
    fn layers_run_outermost_first_on_send_and_last_on_receive() {
        let mut layers = ClientLayers::default();
        assert!(layers.is_empty());
        assert!(layers.handled().numbers().is_empty());
        assert_eq!(std::mem::size_of::<ClientLayers>(), 8, "one pointer");
        layers.push(Arc::new(Letter("a", 65001)));
        layers.push(Arc::new(Letter("b", 9)));
        assert_eq!(layers.handled().numbers(), [9, 65001]);
        let peer: SocketAddr = "127.0.0.1:5683".parse().unwrap();
        let mut exchange = Exchange::new(peer, Scheme::Coap);
        let mut request = Message::new(MessageType::Confirmable, Code::GET, 1);
        layers.send(&mut exchange, &mut request).unwrap();
        assert_eq!(request.payload, b"ab");
        assert_eq!(exchange.token(), None);
        let mut response = Message::new(MessageType::Acknowledgement, Code::CONTENT, 1);
        response.token = Token::new(&[7]).unwrap();
        layers
            .receive(&mut exchange, &request, &mut response)
            .unwrap();
        assert_eq!(response.payload, b"ba");
        assert_eq!(exchange.token(), Some(&response.token));
        request.payload = b"no".to_vec();
        match layers.send(&mut exchange, &mut request) {
            Err(Error::LayerRefused { layer, reason }) => {
                assert_eq!((layer, reason.as_str()), ("a", "said no"));
            }
            other => panic!("{other:?}"),
        }
    }
}

//! Authorisation over the peer's identity.

use crate::server::{Layer, PeerIdentity, Request, Response};
use cobalt_proto::message::Code;

/// The decision of an [`Authorize`] layer: whether `identity` may make `request`.
type Check = dyn Fn(&PeerIdentity, &Request) -> bool + Send + Sync;

/// Lets a request through when a check of the peer's identity and the request says
/// so; otherwise answers 4.01 Unauthorized to a peer that proved no credential (it
/// may come back with one: a PSK or a client certificate) and 4.03 Forbidden to one
/// that did (its credential is not enough; RFC 7252 §5.9.2.2 and §5.9.2.4).
///
/// ```
/// use cobalt::server::{get, layers::{Authorize, PskAllowList}, Server};
///
/// // Any peer with a verified certificate from our CA may read /status.
/// let status = get(|| async { "ok" })
///     .layer(Authorize::new(|identity, _request| identity.certificate_subject().is_some()));
/// // Below /admin only the PSK identity "operator".
/// let server = Server::new()
///     .route("/status", status)
///     .route("/admin/reset", get(|| async { "reset" }))
///     .layer(Authorize::psk(PskAllowList::new().allow("/admin", ["operator"])));
/// ```
pub struct Authorize {
    check: Box<Check>,
}

impl std::fmt::Debug for Authorize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Authorize")
    }
}

impl Authorize {
    /// Lets through what `check` allows.
    pub fn new(
        check: impl Fn(&PeerIdentity, &Request) -> bool + Send + Sync + 'static,
    ) -> Authorize {
        Authorize {
            check: Box::new(check),
        }
    }

    /// Lets through what `list` allows.
    pub fn psk(list: PskAllowList) -> Authorize {
        Authorize::new(move |identity, request| list.allows(identity, &request.path()))
    }
}

impl Layer for Authorize {
    fn on_request(&self, request: &mut Request) -> Result<(), Response> {
        let identity = request.identity();
        if (self.check)(&identity, request) {
            return Ok(());
        }
        Err(if identity.is_authenticated() {
            Response::new(Code::FORBIDDEN).with_payload("this credential may not make this request")
        } else {
            Response::new(Code::UNAUTHORIZED).with_payload(
                "this request needs a credential: connect over coaps or coaps+tcp with a PSK or client certificate",
            )
        })
    }
}

/// PSK identities allowed per path prefix. A path is governed by the longest prefix
/// that names whole segments of it (`/admin` governs `/admin` and `/admin/x`, not
/// `/administrator`); paths under no prefix are open to everyone.
#[derive(Debug, Clone, Default)]
pub struct PskAllowList {
    /// (prefix without a trailing `/`, identities)
    rules: Vec<(String, Vec<Vec<u8>>)>,
}

impl PskAllowList {
    /// No rules: everything open.
    pub fn new() -> PskAllowList {
        PskAllowList::default()
    }

    /// Below `prefix`, only the PSK identities `identities` (added to those given
    /// for the same prefix before).
    pub fn allow<I: AsRef<[u8]>>(
        mut self,
        prefix: &str,
        identities: impl IntoIterator<Item = I>,
    ) -> PskAllowList {
        let prefix = prefix.trim_end_matches('/').to_string();
        let ids = identities.into_iter().map(|i| i.as_ref().to_vec());
        match self.rules.iter_mut().find(|(p, _)| *p == prefix) {
            Some((_, list)) => list.extend(ids),
            None => self.rules.push((prefix, ids.collect())),
        }
        self
    }

    /// Whether `identity` may reach `path`.
    pub fn allows(&self, identity: &PeerIdentity, path: &str) -> bool {
        let governing = self
            .rules
            .iter()
            .filter(|(prefix, _)| governs(prefix, path))
            .max_by_key(|(prefix, _)| prefix.len());
        match governing {
            None => true,
            Some((_, ids)) => identity
                .psk_identity()
                .is_some_and(|psk| ids.iter().any(|id| id == psk)),
        }
    }
}

/// Whether `prefix` (no trailing `/`; empty for the root) names whole leading
/// segments of `path`.
fn governs(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/') || prefix.is_empty(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::Credential;
    use cobalt_proto::message::{Message, MessageType};
    use cobalt_proto::uri::Scheme;
    use std::sync::Arc;

    fn request(path: &str, psk: Option<&str>) -> Request {
        let mut m = Message::new(MessageType::Confirmable, Code::GET, 1);
        m.options.set_uri_path(path);
        let credential = psk.map(|p| Arc::new(Credential::PskIdentity(p.as_bytes().to_vec())));
        Request::new("127.0.0.1:1".parse().unwrap(), m).with_identity(Scheme::Coaps, credential)
    }

    #[test]
    fn allow_list_governs_whole_segments_and_answers_4_01_or_4_03() {
        let layer = Authorize::psk(
            PskAllowList::new()
                .allow("/admin", ["operator"])
                .allow("/admin/keys", ["root"]),
        );
        let code = |path, psk| {
            layer
                .on_request(&mut request(path, psk))
                .err()
                .map(|r| r.code)
        };
        assert_eq!(code("/admin", Some("operator")), None);
        assert_eq!(code("/admin/reset", Some("operator")), None);
        assert_eq!(code("/admin/reset", Some("device")), Some(Code::FORBIDDEN));
        assert_eq!(code("/admin/reset", None), Some(Code::UNAUTHORIZED));
        // The longer prefix governs below it.
        assert_eq!(
            code("/admin/keys/1", Some("operator")),
            Some(Code::FORBIDDEN)
        );
        assert_eq!(code("/admin/keys/1", Some("root")), None);
        // Not a whole segment: open.
        assert_eq!(code("/administrator", None), None);
        assert_eq!(code("/public", None), None);
    }
}

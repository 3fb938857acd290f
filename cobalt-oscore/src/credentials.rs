//! One credentials file for all of Cobalt: OSCORE contexts, DTLS/TLS pre-shared keys
//! and certificates, in the JSON of aiocoap's credentials files (so one file serves
//! both), e.g.
//!
//! ```json
//! {
//!   "coap://sensor.example/*": {"oscore": {"basedir": "client1/for-sensor/"}},
//!   "coaps://gw.example/*": {"dtls": {"client-identity": {"ascii": "me"}, "psk": {"hex": "0102"}}},
//!   "coaps+tcp://cloud.example/*": {"tlscert": {"certfile": "ca.pem"}},
//!   ":client1": {"oscore": {"basedir": "server/from-client1/"}},
//!   ":gateway": {"dtls": {"client-identity": {"ascii": "gw"}, "psk": {"ascii": "secret"}}}
//! }
//! ```
//!
//! Keys that are URI patterns ([`UriPattern`]) say what a client uses for requests to
//! matching URIs; keys starting with `:` name what a server accepts (the label
//! becomes the OSCORE context's name, for [`RequireOscore::contexts`](crate::RequireOscore::contexts)).
//! Byte strings are `{"ascii": ...}`, `{"hex": ...}` or plain strings. A Cobalt
//! extension, `{"x509": {"cert": FILE, "key": FILE, "ca": FILE}}`, gives a client or
//! server certificate. An OSCORE `basedir` (aiocoap's older name `contextfile` is read
//! too) holds `settings.json` and/or `secret.json` (keys `sender-id`, `recipient-id`,
//! `secret`, `salt`, `id-context` with a `_hex` or `_ascii` suffix, and optional
//! `algorithm`, `kdf-hashfun`, `window`) and gets `sequence.json` and `lock`, as with
//! aiocoap. Relative paths are read from the credentials file's directory.
//!
//! EDHOC (RFC 9528) entries take aiocoap's `edhoc-oscore` form, with credentials in
//! the JSON shape of [`Ccs::from_json`]:
//!
//! ```json
//! {
//!   "coap://gw.example/*": {"edhoc-oscore": {"suite": 2, "method": 3,
//!       "own_cred_style": "by-key-id", "own_cred": {"14": {...}},
//!       "private_key_file": "me.cosekey", "peer_cred": {"14": {...}}}},
//!   ":sensor1": {"edhoc-oscore": {"suite": 2, "method": 3, "peer_cred": {"14": {...}}}}
//! }
//! ```
//!
//! A URI pattern with `peer_cred` makes a client run EDHOC with matching servers
//! ([`Credentials::client_oscore`]; message_3 goes in a request of its own unless
//! `"use_combined_edhoc": true` puts it in the first OSCORE request); a `:label` with `peer_cred` is a client a server
//! accepts (its contexts are named by the label). The first URI pattern with an own
//! credential is also the server's identity, as aiocoap takes its server identity from
//! its own origin's entry. `private_key_file` is a CBOR COSE_Key, as
//! `aiocoap-keygen` writes it, readable by its owner only; `private_key` gives the
//! COSE_Key in the file itself. Only suite 2 and method 3 are supported (what lakers
//! implements).

use crate::context::{unhex, Material, AES_CCM_16_64_128};
use crate::edhoc::credential::{private_key_from_cose, read_private_key};
use crate::edhoc::{
    establish, Ccs, Completion, CredentialStyle, EdhocError, EdhocIdentity, EdhocResponder,
};
use crate::layer::Oscore;
use crate::security::SecurityContext;
use crate::sequence::{SenderSequence, DEFAULT_STRIDE};
use crate::target::UriPattern;
use cobalt::proto::message::Message;
use cobalt::proto::uri::CoapUri;
use cobalt::transport::credentials::{ClientCredentials, ClientPsk, X509Credentials};
use cobalt::Scheme;
use serde_json::{Map, Value};
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why a credentials file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {what}")]
pub struct CredentialsError {
    file: PathBuf,
    what: String,
}

/// A client's `edhoc-oscore` entry for a URI pattern.
#[derive(Debug)]
struct EdhocClient {
    key: String,
    pattern: UriPattern,
    /// This endpoint's identity.
    identity: EdhocIdentity,
    /// The credential the server must authenticate with.
    server: Ccs,
    /// aiocoap's `use_combined_edhoc`.
    completion: Completion,
}

/// A loaded credentials file.
#[derive(Debug, Default)]
pub struct Credentials {
    /// OSCORE contexts a client protects requests with, by URI pattern (longest
    /// pattern first, as aiocoap matches the most specific).
    oscore_client: Vec<(String, UriPattern, Arc<SecurityContext>)>,
    /// OSCORE contexts a server accepts, by label.
    oscore_server: Vec<Arc<SecurityContext>>,
    /// DTLS/TLS credentials of a client, by URI pattern.
    transport_client: Vec<(String, UriPattern, ClientCredentials)>,
    /// PSKs a server accepts: (identity, key).
    server_psk: Vec<(Vec<u8>, Vec<u8>)>,
    /// A server's certificate, if one is given.
    server_x509: Option<X509Credentials>,
    /// EDHOC with servers a client talks to, by URI pattern (longest first).
    edhoc_client: Vec<EdhocClient>,
    /// A server's EDHOC identity: the first URI pattern's own credential.
    edhoc_identity: Option<EdhocIdentity>,
    /// The EDHOC clients a server accepts: (label, credential).
    edhoc_peers: Vec<(String, Ccs)>,
}

impl Credentials {
    /// Reads `file` and every OSCORE context directory it names, taking each
    /// directory's lock (so two processes never use one context; the contexts hold
    /// it until the last of their users is dropped).
    pub fn load(file: &Path) -> Result<Credentials, CredentialsError> {
        let error = |what: String| CredentialsError {
            file: file.to_path_buf(),
            what,
        };
        let text = std::fs::read_to_string(file).map_err(|e| error(format!("cannot read: {e}")))?;
        let base = file.parent().unwrap_or(Path::new("."));
        Credentials::parse(&text, base).map_err(error)
    }

    /// Reads the JSON `text`, with relative paths under `base`.
    pub fn parse(text: &str, base: &Path) -> Result<Credentials, String> {
        let root: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let Value::Object(entries) = root else {
            return Err("the file must be a JSON object of URI patterns and :labels".into());
        };
        let mut credentials = Credentials::default();
        for (key, value) in &entries {
            credentials
                .add(key, value, base)
                .map_err(|e| format!("entry {key:?}: {e}"))?;
        }
        let by_length = |k: &String| std::cmp::Reverse(k.len());
        credentials
            .oscore_client
            .sort_by_key(|(k, ..)| by_length(k));
        credentials
            .transport_client
            .sort_by_key(|(k, ..)| by_length(k));
        credentials.edhoc_client.sort_by_key(|c| by_length(&c.key));
        Ok(credentials)
    }

    fn add(&mut self, key: &str, value: &Value, base: &Path) -> Result<(), String> {
        let (kind, body) = single(value)?;
        let label = key.strip_prefix(':');
        let pattern = match label {
            Some(_) => None,
            None => Some(UriPattern::parse(key).map_err(|e| e.to_string())?),
        };
        match (kind, pattern) {
            ("oscore", pattern) => {
                let body = object(body)?;
                let dir = body
                    .get("basedir")
                    .or_else(|| body.get("contextfile"))
                    .and_then(Value::as_str)
                    .ok_or("an oscore entry needs \"basedir\": the context directory")?;
                let context = load_context_dir(&base.join(dir))?;
                match (label, pattern) {
                    (Some(label), _) => {
                        self.oscore_server.push(Arc::new(context.named(label)));
                    }
                    (None, Some(pattern)) => {
                        let context = Arc::new(context.named(key));
                        self.oscore_client.push((key.to_string(), pattern, context));
                    }
                    (None, None) => unreachable!("a key is a label or a pattern"),
                }
            }
            ("dtls", pattern) => {
                let body = object(body)?;
                let identity = bytes(body.get("client-identity"), "client-identity")?;
                let psk = bytes(body.get("psk"), "psk")?;
                match pattern {
                    Some(p) => self.transport_client.push((
                        key.to_string(),
                        p,
                        ClientCredentials::Psk(ClientPsk::new(identity, psk)),
                    )),
                    None => self.server_psk.push((identity, psk)),
                }
            }
            ("tlscert", Some(p)) => {
                let body = object(body)?;
                let ca = path(body, "certfile", base)?;
                let x509 = X509Credentials {
                    cert_chain_pem: Vec::new(),
                    key_pem: Vec::new(),
                    ca_pem: Some(read(&ca)?),
                    server_name: None,
                };
                self.transport_client
                    .push((key.to_string(), p, ClientCredentials::X509(x509)));
            }
            ("x509", pattern) => {
                let body = object(body)?;
                let optional = |name| {
                    body.contains_key(name)
                        .then(|| path(body, name, base).and_then(|p| read(&p)))
                        .transpose()
                };
                let x509 = X509Credentials {
                    cert_chain_pem: optional("cert")?.unwrap_or_default(),
                    key_pem: optional("key")?.unwrap_or_default(),
                    ca_pem: optional("ca")?,
                    server_name: body
                        .get("server-name")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                };
                match pattern {
                    Some(p) => self.transport_client.push((
                        key.to_string(),
                        p,
                        ClientCredentials::X509(x509),
                    )),
                    None => self.server_x509 = Some(x509),
                }
            }
            ("edhoc-oscore", pattern) => {
                let body = object(body)?;
                let completion = match body.get("use_combined_edhoc") {
                    Some(Value::Bool(true)) => Completion::Combined,
                    Some(Value::Bool(false)) | Some(Value::Null) | None => Completion::Message4,
                    Some(_) => return Err("use_combined_edhoc must be true or false".into()),
                };
                let (own, peer) = edhoc_entry(body, base)?;
                match (label, pattern, own, peer) {
                    (Some(label), _, None, Some(peer)) => {
                        self.edhoc_peers.push((label.to_string(), peer))
                    }
                    (Some(_), ..) => {
                        return Err("a :label edhoc-oscore entry names a client a server accepts: give its peer_cred only".into())
                    }
                    (None, Some(pattern), own, peer) => {
                        let Some(own) = own else {
                            return Err("an edhoc-oscore entry for a URI pattern needs own_cred, own_cred_style and private_key_file".into());
                        };
                        if self.edhoc_identity.is_none() {
                            self.edhoc_identity = Some(own.clone());
                        }
                        if let Some(server) = peer {
                            self.edhoc_client.push(EdhocClient {
                                key: key.to_string(),
                                pattern,
                                identity: own,
                                server,
                                completion,
                            });
                        }
                    }
                    (None, None, ..) => unreachable!("a key is a label or a pattern"),
                }
            }
            (other, _) => {
                return Err(format!(
                    "credential type {other:?} is not supported here (use oscore, edhoc-oscore, dtls, tlscert or x509)"
                ))
            }
        }
        Ok(())
    }

    /// The OSCORE layer these credentials make: the server contexts (`:label`
    /// entries) accepted and EDHOC taken from the clients they name, the client
    /// contexts used for matching URIs. `None` when the file has no OSCORE or EDHOC
    /// entry.
    pub fn oscore(&self) -> Option<Oscore> {
        self.layer(Oscore::new())
    }

    /// The EDHOC responder these credentials make: the server's identity and the
    /// clients it accepts (`None` without an identity or a client).
    pub fn edhoc_responder(&self) -> Option<EdhocResponder> {
        let identity = self.edhoc_identity.clone()?;
        if self.edhoc_peers.is_empty() {
            return None;
        }
        let mut responder = EdhocResponder::new(identity);
        for (label, credential) in &self.edhoc_peers {
            responder = responder.client(label.clone(), credential.clone());
        }
        Some(responder)
    }

    /// Client role: the OSCORE layer for requests to `uri`. When an `edhoc-oscore`
    /// entry matches `uri`, `client` runs EDHOC with the server first, and the context
    /// it gives protects the requests that entry matches. `None` when nothing applies.
    pub async fn client_oscore(
        &self,
        client: &cobalt::Client,
        uri: &CoapUri,
    ) -> Result<Option<Oscore>, EdhocError> {
        let Some(entry) = self
            .edhoc_client
            .iter()
            .find(|c| c.pattern.matches_uri(uri))
        else {
            return Ok(self.oscore());
        };
        let host = if uri.host.contains(':') {
            format!("[{}]", uri.host)
        } else {
            uri.host.clone()
        };
        let origin = format!("{}://{host}:{}", uri.scheme, uri.port);
        let established = establish(
            client,
            &origin,
            &entry.identity,
            &entry.server,
            entry.completion,
        )
        .await?;
        Ok(self.layer(Oscore::new().protect_edhoc(entry.pattern.clone(), established)))
    }

    /// `layer` with these credentials' contexts added; `None` if it would have none.
    fn layer(&self, mut layer: Oscore) -> Option<Oscore> {
        let edhoc = self.edhoc_responder();
        if self.oscore_client.is_empty()
            && self.oscore_server.is_empty()
            && edhoc.is_none()
            && !layer.protects_any()
        {
            return None;
        }
        if let Some(responder) = edhoc {
            layer = layer.edhoc(responder);
        }
        for context in &self.oscore_server {
            layer = layer.accept(context.clone());
        }
        for (_, pattern, context) in &self.oscore_client {
            layer = layer.protect(pattern.clone(), context.clone());
        }
        Some(layer)
    }

    /// The DTLS/TLS credentials a client uses for a request to `peer` over `scheme`
    /// (the most specific pattern that matches).
    pub fn client_transport(
        &self,
        scheme: Scheme,
        peer: SocketAddr,
        request: &Message,
    ) -> Option<&ClientCredentials> {
        self.transport_client
            .iter()
            .find(|(_, p, _)| p.matches(scheme, peer, request))
            .map(|(.., c)| c)
    }

    /// The DTLS/TLS credentials a client uses for `uri` (the most specific pattern
    /// that matches, host names compared as written).
    pub fn client_transport_for(&self, uri: &CoapUri) -> Option<&ClientCredentials> {
        self.transport_client
            .iter()
            .find(|(_, p, _)| p.matches_uri(uri))
            .map(|(.., c)| c)
    }

    /// The pre-shared keys a server accepts, (identity, key) (empty when none).
    pub fn server_psk(&self) -> &[(Vec<u8>, Vec<u8>)] {
        &self.server_psk
    }

    /// The server's certificate, if given.
    pub fn server_x509(&self) -> Option<&X509Credentials> {
        self.server_x509.as_ref()
    }
}

/// The one `{"type": body}` pair of an entry.
fn single(value: &Value) -> Result<(&str, &Value), String> {
    match value {
        Value::Object(m) if m.len() == 1 => {
            let (k, v) = m.iter().next().expect("one entry");
            Ok((k.as_str(), v))
        }
        _ => Err("an entry must be an object with exactly one key (its type)".into()),
    }
}

fn object(value: &Value) -> Result<&Map<String, Value>, String> {
    value
        .as_object()
        .ok_or_else(|| "expected a JSON object".to_string())
}

/// A byte string: `{"ascii": ...}`, `{"hex": ...}`, or a plain string (its UTF-8).
fn bytes(value: Option<&Value>, name: &str) -> Result<Vec<u8>, String> {
    match value {
        Some(Value::String(s)) => Ok(s.as_bytes().to_vec()),
        Some(Value::Object(m)) if m.len() == 1 => match m.iter().next() {
            Some((k, Value::String(s))) if k == "ascii" => Ok(s.as_bytes().to_vec()),
            Some((k, Value::String(s))) if k == "hex" => {
                unhex(&s.replace(['-', ' ', ':'], "")).ok_or(format!("{name}: bad hex"))
            }
            _ => Err(format!(
                "{name}: expected {{\"ascii\": ...}} or {{\"hex\": ...}}"
            )),
        },
        _ => Err(format!("{name} is missing")),
    }
}

fn path(body: &Map<String, Value>, name: &str, base: &Path) -> Result<PathBuf, String> {
    let p = body
        .get(name)
        .and_then(Value::as_str)
        .ok_or(format!("{name} (a file name) is missing"))?;
    Ok(base.join(p))
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// The own identity and the peer's credential of an `edhoc-oscore` entry.
fn edhoc_entry(
    body: &Map<String, Value>,
    base: &Path,
) -> Result<(Option<EdhocIdentity>, Option<Ccs>), String> {
    for (name, supported) in [("suite", 2), ("method", 3)] {
        match body.get(name).and_then(Value::as_i64) {
            Some(n) if n == supported => {}
            Some(n) => {
                return Err(format!(
                    "EDHOC {name} {n} is not supported (only {name} {supported})"
                ))
            }
            None => {
                return Err(format!(
                    "an edhoc-oscore entry needs \"{name}\": {supported}"
                ))
            }
        }
    }
    let unauthenticated = serde_json::json!({"unauthenticated": true});
    if [body.get("own_cred"), body.get("peer_cred")].contains(&Some(&unauthenticated)) {
        return Err("unauthenticated EDHOC is not supported: give the credentials".into());
    }
    let peer = body
        .get("peer_cred")
        .map(Ccs::from_json)
        .transpose()
        .map_err(|e| format!("peer_cred: {e}"))?;
    let own = match (
        body.get("own_cred"),
        body.get("own_cred_style").and_then(Value::as_str),
    ) {
        (None, None) => None,
        (Some(cred), Some(style)) => {
            let cred = Ccs::from_json(cred).map_err(|e| format!("own_cred: {e}"))?;
            let style = CredentialStyle::parse(style)?;
            let key = match (body.get("private_key_file"), body.get("private_key")) {
                (Some(Value::String(file)), None) => read_private_key(&base.join(file))?,
                (None, Some(key)) => {
                    private_key_from_cose(&crate::edhoc::credential::json_to_cbor(key)?)
                        .map_err(|e| format!("private_key: {e}"))?
                }
                _ => {
                    return Err(
                        "own_cred needs its key: private_key_file (a file name) or private_key"
                            .into(),
                    )
                }
            };
            Some(EdhocIdentity::new(key, cred, style)?)
        }
        _ => return Err("own_cred and own_cred_style (by-key-id or by-value) go together".into()),
    };
    Ok((own, peer))
}

/// Reads an aiocoap-style OSCORE context directory and takes its lock: the context,
/// with its sequence persisted in the directory, holding the lock.
pub fn load_context_dir(dir: &Path) -> Result<SecurityContext, String> {
    let mut data = Map::new();
    let mut found = false;
    for name in ["secret.json", "settings.json"] {
        let text = match std::fs::read_to_string(dir.join(name)) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("cannot read {}: {e}", dir.join(name).display())),
        };
        found = true;
        let Value::Object(entries) = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not JSON: {e}", dir.join(name).display()))?
        else {
            return Err(format!(
                "{} must be a JSON object",
                dir.join(name).display()
            ));
        };
        for (key, value) in entries {
            let (key, value) = if let Some(k) = key.strip_suffix("_hex") {
                let hex = value.as_str().ok_or(format!("{key} must be a string"))?;
                (
                    k.to_string(),
                    Value::from(unhex(hex).ok_or(format!("{key}: bad hex"))?),
                )
            } else if let Some(k) = key.strip_suffix("_ascii") {
                let s = value.as_str().ok_or(format!("{key} must be a string"))?;
                (k.to_string(), Value::from(s.as_bytes().to_vec()))
            } else {
                (key, value)
            };
            if data.insert(key.clone(), value).is_some() {
                return Err(format!("{key} is given twice in {}", dir.display()));
            }
        }
    }
    if !found {
        return Err(format!(
            "{} has neither settings.json nor secret.json",
            dir.display()
        ));
    }
    let id = |name: &str| -> Result<Vec<u8>, String> {
        match data.get(name) {
            Some(Value::Array(a)) => Ok(a
                .iter()
                .filter_map(|b| b.as_u64().map(|b| b as u8))
                .collect()),
            _ => Err(format!(
                "{name}_hex or {name}_ascii is missing in {}",
                dir.display()
            )),
        }
    };
    if let Some(alg) = data.get("algorithm") {
        let ok =
            alg.as_str() == Some("AES-CCM-16-64-128") || alg.as_i64() == Some(AES_CCM_16_64_128);
        if !ok {
            return Err(format!(
                "algorithm {alg} is not supported (only AES-CCM-16-64-128)"
            ));
        }
    }
    if let Some(hash) = data.get("kdf-hashfun") {
        if hash.as_str() != Some("sha256") {
            return Err(format!("kdf-hashfun {hash} is not supported (only sha256)"));
        }
    }
    let mut material = Material::new(&id("secret")?, &id("sender-id")?, &id("recipient-id")?);
    if data.contains_key("salt") {
        material.master_salt = id("salt")?;
    }
    if data.contains_key("id-context") {
        material.id_context = Some(id("id-context")?);
    }
    if let Some(window) = data.get("window") {
        material.replay_window = window
            .as_u64()
            .and_then(|w| u32::try_from(w).ok())
            .ok_or("window must be a number")?;
    }
    let lock = lock(dir)?;
    let (sequence, restarted) =
        SenderSequence::load(dir, DEFAULT_STRIDE).map_err(|e| e.to_string())?;
    let context = SecurityContext::with_sequence(material, sequence, restarted)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(context.holding(lock))
}

/// Takes the `lock` file of a context directory (an exclusive `flock`, as aiocoap's
/// filelock does): fails when another process uses the context.
fn lock(dir: &Path) -> Result<File, String> {
    use std::os::fd::AsRawFd;
    let path = dir.join("lock");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns; no memory is passed.
    let taken = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    if !taken {
        return Err(format!(
            "{} is in use by another process (its lock file is held); a context must never be used by two at once",
            dir.display()
        ));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cobalt-cred-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("ctx")).unwrap();
        dir
    }

    const SETTINGS: &str = r#"{"sender-id_hex": "01", "recipient-id_ascii": "c",
        "secret_hex": "0102030405060708090a0b0c0d0e0f10", "salt_hex": "9e7ca92223786340"}"#;

    #[test]
    fn an_aiocoap_file_loads_both_roles_and_transport_credentials() {
        let dir = dir("roles");
        std::fs::write(dir.join("ctx/settings.json"), SETTINGS).unwrap();
        let text = r#"{
            ":client1": {"oscore": {"contextfile": "ctx/"}},
            "coaps://127.0.0.1/*": {"dtls": {"client-identity": {"ascii": "me"}, "psk": {"hex": "01-02"}}},
            ":gw": {"dtls": {"client-identity": "gw", "psk": {"ascii": "key"}}}
        }"#;
        let c = Credentials::parse(text, &dir).unwrap();
        assert_eq!(c.oscore_server.len(), 1);
        let context = &c.oscore_server[0];
        assert_eq!(context.name(), "client1");
        assert_eq!(context.material().sender_id, [1]);
        assert_eq!(context.material().recipient_id, b"c");
        assert_eq!(context.material().master_salt.len(), 8);
        assert!(c.oscore().is_some());
        assert_eq!(c.server_psk(), [(b"gw".to_vec(), b"key".to_vec())]);
        let peer = "127.0.0.1:5684".parse().unwrap();
        let request = Message::new(
            cobalt::proto::message::MessageType::Confirmable,
            cobalt::Code::GET,
            1,
        );
        assert_eq!(
            c.client_transport(Scheme::Coaps, peer, &request),
            Some(&ClientCredentials::Psk(ClientPsk::new("me", vec![1, 2])))
        );
        // A second process (here: a second load) may not use the same context.
        let e = Credentials::parse(text, &dir).unwrap_err();
        assert!(e.contains("in use"), "{e}");
        drop(c);
        assert!(
            Credentials::parse(text, &dir).is_ok(),
            "the lock goes with the first"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn edhoc_entries_make_a_responder_and_client_entries() {
        use std::os::unix::fs::PermissionsExt;
        let dir = dir("edhoc");
        let server = EdhocIdentity::generate("s", b"\x0a", CredentialStyle::ByValue);
        let client = EdhocIdentity::generate("c", b"\x0b", CredentialStyle::ByKeyId);
        let key = dir.join("server.cosekey");
        std::fs::write(&key, server.private_key_cose()).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let text = serde_json::json!({
            "coap://127.0.0.1/*": {"edhoc-oscore": {"suite": 2, "method": 3,
                "own_cred_style": "by-value", "own_cred": server.credential().to_json(),
                "private_key_file": "server.cosekey",
                "peer_cred": client.credential().to_json()}},
            ":sensor": {"edhoc-oscore": {"suite": 2, "method": 3,
                "peer_cred": client.credential().to_json()}},
        })
        .to_string();
        let c = Credentials::parse(&text, &dir).unwrap();
        let responder = c.edhoc_responder().unwrap();
        assert_eq!(responder.identity().credential(), server.credential());
        assert_eq!(responder.identity().style(), CredentialStyle::ByValue);
        assert!(c.oscore().is_some(), "EDHOC alone makes a layer");
        let uri = CoapUri::parse("coap://127.0.0.1/x").unwrap();
        assert!(c.edhoc_client.iter().any(|e| e.pattern.matches_uri(&uri)));
        // The key in the file itself, as aiocoap's private_key.
        let inline = text.replace(
            "\"private_key_file\":\"server.cosekey\"",
            &format!(
                "\"private_key\": {{\"1\": 2, \"-1\": 1, \"-4\": {{\"hex\": \"{}\"}}}}",
                crate::context::hex(&server.private_key())
            ),
        );
        assert_ne!(inline, text);
        assert!(Credentials::parse(&inline, &dir)
            .unwrap()
            .edhoc_responder()
            .is_some());
        // A key others may read is refused.
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Credentials::parse(&text, &dir).unwrap_err();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn edhoc_mistakes_are_named() {
        let dir = dir("edhoc-mistakes");
        let e = |text: &str| Credentials::parse(text, &dir).unwrap_err();
        let peer = EdhocIdentity::generate("p", b"\x01", CredentialStyle::ByKeyId);
        let peer = peer.credential().to_json();
        let entry =
            |body: serde_json::Value| serde_json::json!({":c": {"edhoc-oscore": body}}).to_string();
        assert!(e(&entry(serde_json::json!({"suite": 1, "method": 3}))).contains("suite 1"));
        assert!(e(&entry(serde_json::json!({"suite": 2}))).contains("method"));
        assert!(e(&entry(
            serde_json::json!({"suite": 2, "method": 3, "peer_cred": {"unauthenticated": true}})
        ))
        .contains("unauthenticated"));
        assert!(e(&entry(
            serde_json::json!({"suite": 2, "method": 3, "peer_cred": peer, "own_cred": peer})
        ))
        .contains("go together"));
        let pattern = serde_json::json!({"coap://h/*": {"edhoc-oscore":
            {"suite": 2, "method": 3, "peer_cred": peer}}})
        .to_string();
        assert!(e(&pattern).contains("needs own_cred"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn mistakes_are_named() {
        let dir = dir("mistakes");
        let e = |text: &str| Credentials::parse(text, &dir).unwrap_err();
        assert!(e("[]").contains("JSON object"));
        assert!(e(r#"{"coap://h/*": {"oscore": {}}}"#).contains("basedir"));
        assert!(e(r#"{"coap://h/*": {"oscore": {"basedir": "ctx/"}}}"#).contains("neither"));
        assert!(e(r#"{"coap://h/*": {"magic": {}}}"#).contains("not supported"));
        assert!(e(r#"{"h/*": {"dtls": {}}}"#).contains("not a URI pattern"));
        std::fs::write(
            dir.join("ctx/settings.json"),
            SETTINGS.replace(
                "\"salt_hex\"",
                "\"algorithm\": \"AES-CCM-16-128-128\", \"salt_hex\"",
            ),
        )
        .unwrap();
        assert!(e(r#"{":a": {"oscore": {"basedir": "ctx"}}}"#).contains("not supported"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}

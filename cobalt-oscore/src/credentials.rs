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

use crate::context::{unhex, Material, AES_CCM_16_64_128};
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
            (other, _) => {
                return Err(format!(
                    "credential type {other:?} is not supported here (use oscore, dtls, tlscert or x509)"
                ))
            }
        }
        Ok(())
    }

    /// The OSCORE layer these credentials make: the server contexts (`:label`
    /// entries) accepted, the client contexts used for matching URIs. `None` when the
    /// file has no OSCORE entry.
    pub fn oscore(&self) -> Option<Oscore> {
        if self.oscore_client.is_empty() && self.oscore_server.is_empty() {
            return None;
        }
        let mut layer = Oscore::new();
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

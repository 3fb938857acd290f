//! EDHOC authentication credentials (RFC 9528 §3.5): a CCS, a CWT Claims Set holding a
//! P-256 public key in its `cnf` claim (RFC 8392), and an endpoint's identity, its CCS
//! with the private key. In a credentials file they take aiocoap's shape in JSON: the
//! ID_CRED map `{"14": CCS}`, with integer keys written as strings and byte strings as
//! `{"hex": ...}`, e.g.
//!
//! ```json
//! {"14": {"2": "server", "8": {"1": {"1": 2, "2": {"hex": "0a"}, "-1": 1,
//!        "-2": {"hex": "bbc3...44f0"}, "-3": {"hex": "4519...6072"}}}}}
//! ```
//!
//! A CCS is encoded with the canonical CBOR map order (shorter keys first), as aiocoap
//! does, so both ends hash the same bytes into the transcript.

use crate::cbor;
use p256::elliptic_curve::sec1::ToEncodedPoint;
use serde_json::Value;
use std::path::Path;

/// How an endpoint names its credential in its EDHOC message (ID_CRED_x, RFC 9528
/// §3.5.3): by its key ID, when the peer already has it, or the whole CCS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialStyle {
    /// `{4: kid}`: short; the peer must know the credential.
    ByKeyId,
    /// `{14: CCS}`: the credential itself.
    ByValue,
}

impl CredentialStyle {
    /// aiocoap's names: `by-key-id` or `by-value`.
    pub fn parse(name: &str) -> Result<CredentialStyle, String> {
        match name {
            "by-key-id" => Ok(CredentialStyle::ByKeyId),
            "by-value" => Ok(CredentialStyle::ByValue),
            other => Err(format!(
                "own_cred_style {other:?} is not known (use by-key-id or by-value)"
            )),
        }
    }

    pub(crate) fn lakers(self) -> lakers::CredentialTransfer {
        match self {
            CredentialStyle::ByKeyId => lakers::CredentialTransfer::ByReference,
            CredentialStyle::ByValue => lakers::CredentialTransfer::ByValue,
        }
    }
}

/// A CCS holding a P-256 key, as EDHOC's CRED_x: its encoded bytes, which both ends
/// hash, and what lakers reads from them (the key's x coordinate and the key ID).
#[derive(Clone, PartialEq)]
pub struct Ccs {
    bytes: Vec<u8>,
    parsed: lakers::Credential,
}

impl std::fmt::Debug for Ccs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ccs")
            .field("kid", &self.kid().map(crate::context::hex))
            .field("len", &self.bytes.len())
            .finish()
    }
}

impl Ccs {
    /// Reads an encoded CCS (a map with a subject (2) and a `cnf` (8) holding a COSE
    /// EC2 P-256 key with a key ID, as lakers needs).
    pub fn parse(bytes: &[u8]) -> Result<Ccs, String> {
        let parsed = lakers::Credential::parse_ccs(bytes).map_err(|e| {
            format!(
                "not a CCS with a P-256 key ({e:?}); expected {{2: subject, 8: {{1: COSE_Key}}}}, \
                 at most 192 bytes"
            )
        })?;
        if parsed.kid.is_none() {
            return Err("the CCS's COSE_Key has no key ID (2), which EDHOC needs".into());
        }
        if !parsed
            .public_key()
            .is_some_and(|x| super::backend::is_p256_point(&x))
        {
            return Err("the CCS's public key is not a point of P-256".into());
        }
        Ok(Ccs {
            bytes: bytes.to_vec(),
            parsed,
        })
    }

    /// Reads aiocoap's JSON shape of a credential by value, `{"14": CCS}` (see the
    /// module's documentation).
    pub fn from_json(value: &Value) -> Result<Ccs, String> {
        let Some(ccs) = value
            .as_object()
            .filter(|m| m.len() == 1)
            .and_then(|m| m.get("14"))
        else {
            return Err("a credential must be {\"14\": CCS} (a CCS by value)".into());
        };
        Ccs::parse(&json_to_cbor(ccs)?)
    }

    /// A CCS for `public_key` (SEC1 uncompressed point: 0x04, x, y) with a subject and
    /// a key ID, encoded as aiocoap encodes its own.
    pub fn for_key(subject: &str, kid: &[u8], x: &[u8; 32], y: &[u8; 32]) -> Ccs {
        let mut out = Vec::with_capacity(110);
        cbor::map(&mut out, 2);
        cbor::int(&mut out, 2);
        cbor::text(&mut out, subject);
        cbor::int(&mut out, 8);
        cbor::map(&mut out, 1);
        cbor::int(&mut out, 1);
        cbor::map(&mut out, 5);
        cbor::int(&mut out, 1); // kty: EC2
        cbor::int(&mut out, 2);
        cbor::int(&mut out, 2); // kid
        cbor::bytes(&mut out, kid);
        cbor::int(&mut out, -1); // crv: P-256
        cbor::int(&mut out, 1);
        cbor::int(&mut out, -2);
        cbor::bytes(&mut out, x);
        cbor::int(&mut out, -3);
        cbor::bytes(&mut out, y);
        Ccs::parse(&out).expect("a CCS this function encodes parses")
    }

    /// The credential by value in aiocoap's JSON shape, `{"14": CCS}` (what
    /// [`from_json`](Self::from_json) reads).
    pub fn to_json(&self) -> Value {
        serde_json::json!({ "14": cbor_to_json(&self.value()) })
    }

    /// The credential by value in CBOR diagnostic notation, `{14: CCS}`, as aiocoap's
    /// `.diag` credentials files write it.
    pub fn to_diag(&self) -> String {
        let mut out = String::from("{14: ");
        write_diag(&mut out, &self.value());
        out.push('}');
        out
    }

    fn value(&self) -> ciborium::Value {
        ciborium::from_reader(self.bytes.as_slice()).expect("a parsed CCS is CBOR")
    }

    /// The encoded CCS.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The key ID of its COSE_Key.
    pub fn kid(&self) -> Option<&[u8]> {
        self.parsed.kid.as_ref().map(|k| k.as_slice())
    }

    /// The x coordinate of its public key.
    pub fn public_key(&self) -> [u8; 32] {
        self.parsed
            .public_key()
            .expect("parsed as a CCS with an EC2 key")
    }

    /// The CCS as lakers takes it.
    pub(crate) fn lakers(&self) -> lakers::Credential {
        self.parsed
    }

    /// Whether `id_cred` (a peer's ID_CRED_x) names this credential, by key ID or by
    /// value.
    pub(crate) fn is_named_by(&self, id_cred: &lakers::IdCred) -> bool {
        let ours = if id_cred.reference_only() {
            self.parsed.by_kid()
        } else {
            self.parsed.by_value()
        };
        ours.is_ok_and(|ours| ours.as_full_value() == id_cred.as_full_value())
    }
}

/// This endpoint's EDHOC identity: its CCS, the private key of the CCS's public key, and
/// how it names the CCS in its messages.
#[derive(Clone)]
pub struct EdhocIdentity {
    private_key: [u8; 32],
    credential: Ccs,
    style: CredentialStyle,
}

impl std::fmt::Debug for EdhocIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdhocIdentity")
            .field("credential", &self.credential)
            .field("style", &self.style)
            .finish_non_exhaustive()
    }
}

impl EdhocIdentity {
    /// An identity from a private key (the P-256 scalar `d`) and its CCS; fails when the
    /// CCS holds another key.
    pub fn new(
        private_key: [u8; 32],
        credential: Ccs,
        style: CredentialStyle,
    ) -> Result<EdhocIdentity, String> {
        let secret = p256::SecretKey::from_slice(&private_key)
            .map_err(|_| "the private key is not a P-256 scalar".to_string())?;
        let point = secret.public_key().to_encoded_point(false);
        if point.x().map(|x| x.as_slice()) != Some(&credential.public_key()[..]) {
            return Err(
                "the private key does not belong to the public key in own_cred (a different key pair?)"
                    .into(),
            );
        }
        Ok(EdhocIdentity {
            private_key,
            credential,
            style,
        })
    }

    /// A new key pair and its CCS (subject and key ID as given).
    pub fn generate(subject: &str, kid: &[u8], style: CredentialStyle) -> EdhocIdentity {
        let secret = p256::SecretKey::random(&mut rand_core::OsRng);
        let point = secret.public_key().to_encoded_point(false);
        let coordinate = |c: Option<&p256::FieldBytes>| -> [u8; 32] {
            c.expect("an uncompressed point has both coordinates")
                .as_slice()
                .try_into()
                .expect("P-256 coordinates are 32 bytes")
        };
        let credential = Ccs::for_key(subject, kid, &coordinate(point.x()), &coordinate(point.y()));
        let private_key = secret.to_bytes().as_slice().try_into().expect("32 bytes");
        EdhocIdentity {
            private_key,
            credential,
            style,
        }
    }

    /// The CCS.
    pub fn credential(&self) -> &Ccs {
        &self.credential
    }

    /// How the CCS is named in this endpoint's messages.
    pub fn style(&self) -> CredentialStyle {
        self.style
    }

    /// This identity naming its credential another way.
    pub fn with_style(mut self, style: CredentialStyle) -> EdhocIdentity {
        self.style = style;
        self
    }

    pub(crate) fn private_key(&self) -> [u8; 32] {
        self.private_key
    }

    /// The private key as a COSE_Key (`{1: 2, -1: 1, -4: d}`), the CBOR aiocoap reads
    /// from a `private_key_file`.
    pub fn private_key_cose(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(40);
        cbor::map(&mut out, 3);
        cbor::int(&mut out, 1);
        cbor::int(&mut out, 2);
        cbor::int(&mut out, -1);
        cbor::int(&mut out, 1);
        cbor::int(&mut out, -4);
        cbor::bytes(&mut out, &self.private_key);
        out
    }
}

/// Reads a private key file as aiocoap writes it: a CBOR COSE_Key `{1: 2, -1: 1, -4:
/// d}` (EC2, P-256), readable by its owner only.
pub fn read_private_key(path: &Path) -> Result<[u8; 32], String> {
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{shown} is readable by others; a private key must be mode 0600 (chmod 600 {shown})"
        ));
    }
    if meta.len() > 1024 {
        return Err(format!("{shown} is too large for a COSE_Key"));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    private_key_from_cose(&bytes).map_err(|e| format!("{shown}: {e}"))
}

/// The `d` of an EC2 P-256 COSE_Key.
pub fn private_key_from_cose(bytes: &[u8]) -> Result<[u8; 32], String> {
    let value: ciborium::Value =
        ciborium::from_reader(bytes).map_err(|e| format!("not CBOR: {e}"))?;
    let ciborium::Value::Map(entries) = value else {
        return Err("a COSE_Key must be a CBOR map".into());
    };
    let get = |label: i64| {
        entries
            .iter()
            .find(|(k, _)| {
                k.as_integer()
                    .is_some_and(|k| i128::from(k) == label as i128)
            })
            .map(|(_, v)| v)
    };
    let int = |label| get(label).and_then(|v| v.as_integer()).map(i128::from);
    if int(1) != Some(2) || int(-1) != Some(1) {
        return Err("only EC2 (kty 2) keys on P-256 (crv 1) are supported".into());
    }
    get(-4)
        .and_then(|d| d.as_bytes())
        .and_then(|d| <[u8; 32]>::try_from(d.as_slice()).ok())
        .ok_or_else(|| "the COSE_Key needs its private part d (-4) as 32 bytes".to_string())
}

/// The JSON shape of a CBOR item (the inverse of [`json_to_cbor`] for what a CCS
/// holds).
fn cbor_to_json(value: &ciborium::Value) -> Value {
    use ciborium::Value as C;
    match value {
        C::Integer(n) => Value::from(i128::from(*n) as i64),
        C::Bytes(b) => serde_json::json!({ "hex": crate::context::hex(b) }),
        C::Text(t) => Value::from(t.as_str()),
        C::Bool(b) => Value::from(*b),
        C::Array(items) => Value::Array(items.iter().map(cbor_to_json).collect()),
        C::Map(pairs) => Value::Object(
            pairs
                .iter()
                .map(|(k, v)| {
                    let key = match k {
                        C::Integer(n) => i128::from(*n).to_string(),
                        C::Text(t) => t.clone(),
                        other => format!("{other:?}"),
                    };
                    (key, cbor_to_json(v))
                })
                .collect(),
        ),
        _ => Value::Null,
    }
}

/// CBOR diagnostic notation of a CBOR item (what a CCS holds).
fn write_diag(out: &mut String, value: &ciborium::Value) {
    use ciborium::Value as C;
    use std::fmt::Write;
    match value {
        C::Integer(n) => {
            let _ = write!(out, "{}", i128::from(*n));
        }
        C::Bytes(b) => {
            let _ = write!(out, "h'{}'", crate::context::hex(b));
        }
        C::Text(t) => {
            let _ = write!(out, "{}", Value::from(t.as_str()));
        }
        C::Bool(b) => {
            let _ = write!(out, "{b}");
        }
        C::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_diag(out, item);
            }
            out.push(']');
        }
        C::Map(pairs) => {
            out.push('{');
            for (i, (k, v)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_diag(out, k);
                out.push_str(": ");
                write_diag(out, v);
            }
            out.push('}');
        }
        _ => out.push_str("null"),
    }
}

/// CBOR from the JSON shape of a CBOR item: objects are maps (keys that are integers
/// written as strings become integers), `{"hex": ...}` and `{"ascii": ...}` are byte
/// strings, strings text, numbers integers. Maps come out in canonical order.
pub(crate) fn json_to_cbor(value: &Value) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    write_json(&mut out, value, 0)?;
    Ok(out)
}

fn write_json(out: &mut Vec<u8>, value: &Value, depth: usize) -> Result<(), String> {
    if depth > 8 {
        return Err("the credential is nested too deeply".into());
    }
    match value {
        Value::Bool(b) => cbor::boolean(out, *b),
        Value::Number(n) => cbor::int(
            out,
            n.as_i64().ok_or_else(|| format!("{n} is not an integer"))?,
        ),
        Value::String(s) => cbor::text(out, s),
        Value::Array(items) => {
            cbor::array(out, items.len());
            for item in items {
                write_json(out, item, depth + 1)?;
            }
        }
        Value::Object(m) if m.len() == 1 && (m.contains_key("hex") || m.contains_key("ascii")) => {
            let (kind, text) = m.iter().next().expect("one entry");
            let text = text
                .as_str()
                .ok_or_else(|| format!("{{\"{kind}\": ...}} needs a string"))?;
            let bytes = if kind == "hex" {
                crate::context::unhex(&text.replace([' ', ':', '-'], ""))
                    .ok_or_else(|| format!("bad hex: {text:?}"))?
            } else {
                text.as_bytes().to_vec()
            };
            cbor::bytes(out, &bytes);
        }
        Value::Object(m) => {
            let mut pairs = Vec::with_capacity(m.len());
            for (key, item) in m {
                let mut k = Vec::new();
                match key.parse::<i64>() {
                    Ok(n) => cbor::int(&mut k, n),
                    Err(_) => cbor::text(&mut k, key),
                }
                let mut v = Vec::new();
                write_json(&mut v, item, depth + 1)?;
                pairs.push((k, v));
            }
            // Canonical CBOR (RFC 7049 §3.9): shorter encoded keys first, then bytewise.
            pairs.sort_by(|a, b| (a.0.len(), &a.0).cmp(&(b.0.len(), &b.0)));
            cbor::map(out, pairs.len());
            for (k, v) in pairs {
                out.extend_from_slice(&k);
                out.extend_from_slice(&v);
            }
        }
        Value::Null => cbor::null(out),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRED_R of RFC 9529 §3 (trace 2).
    const CRED_R: &str = "a2026b6578616d706c652e65647508a101a501020241322001215820bbc34960526ea4d32e940cad2a234148ddc21791a12afbcbac93622046dd44f02258204519e257236b2a0ce2023f0931f1f386ca7afda64fcde0108c224c51eabf6072";

    fn unhex(s: &str) -> Vec<u8> {
        crate::context::unhex(s).unwrap()
    }

    #[test]
    fn the_json_shape_encodes_the_rfc_9529_credential_byte_for_byte() {
        let json: Value = serde_json::from_str(
            r#"{"14": {"8": {"1": {"-3": {"hex": "4519e257236b2a0ce2023f0931f1f386ca7afda64fcde0108c224c51eabf6072"},
                "1": 2, "2": {"hex": "32"}, "-1": 1,
                "-2": {"hex": "bbc34960526ea4d32e940cad2a234148ddc21791a12afbcbac93622046dd44f0"}}},
                "2": "example.edu"}}"#,
        )
        .unwrap();
        let ccs = Ccs::from_json(&json).unwrap();
        assert_eq!(ccs.bytes(), unhex(CRED_R));
        assert_eq!(ccs.kid(), Some(&[0x32][..]));
        assert_eq!(ccs.public_key()[..2], [0xbb, 0xc3]);
    }

    #[test]
    fn an_identity_checks_its_key_pair_and_round_trips_through_cose() {
        let one = EdhocIdentity::generate("one", b"\x01", CredentialStyle::ByKeyId);
        let other = EdhocIdentity::generate("other", b"\x02", CredentialStyle::ByKeyId);
        let d = private_key_from_cose(&one.private_key_cose()).unwrap();
        assert!(EdhocIdentity::new(d, one.credential().clone(), CredentialStyle::ByValue).is_ok());
        let e = EdhocIdentity::new(d, other.credential().clone(), CredentialStyle::ByValue)
            .unwrap_err();
        assert!(e.contains("does not belong"), "{e}");
        // for_key encodes as the JSON shape does (canonical order).
        let mut map = serde_json::Map::new();
        let ccs = one.credential();
        let hex = |b: &[u8]| crate::context::hex(b);
        let x = hex(&ccs.public_key());
        let y = hex(&ccs.bytes()[ccs.bytes().len() - 32..]);
        map.insert(
            "14".into(),
            serde_json::json!({"2": "one", "8": {"1": {"1": 2, "2": {"hex": "01"}, "-1": 1,
                "-2": {"hex": x}, "-3": {"hex": y}}}}),
        );
        assert_eq!(Ccs::from_json(&Value::Object(map)).unwrap(), *ccs);
        assert_eq!(Ccs::from_json(&ccs.to_json()).unwrap(), *ccs);
        let diag = ccs.to_diag();
        assert!(
            diag.starts_with("{14: {2: \"one\", 8: {1: {1: 2, 2: h'01', -1: 1, -2: h'"),
            "{diag}"
        );
    }

    #[test]
    fn malformed_credentials_and_keys_are_named() {
        let e = |v: Value| Ccs::from_json(&v).unwrap_err();
        assert!(e(serde_json::json!({"4": "x"})).contains("{\"14\": CCS}"));
        assert!(e(serde_json::json!({"14": {"2": "x"}})).contains("not a CCS"));
        assert!(e(serde_json::json!({"14": {"2": {"hex": "zz"}}})).contains("bad hex"));
        assert!(private_key_from_cose(&[0xff]).unwrap_err().contains("CBOR"));
        assert!(private_key_from_cose(&[0xa1, 0x01, 0x01])
            .unwrap_err()
            .contains("EC2"));
        let short = [0xa3, 0x01, 0x02, 0x20, 0x01, 0x23, 0x41, 0x00];
        assert!(private_key_from_cose(&short)
            .unwrap_err()
            .contains("32 bytes"));
    }
}

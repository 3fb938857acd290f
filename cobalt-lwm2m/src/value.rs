//! The one typed value model every content format decodes into and encodes from:
//! a list of [`Entry`]s, each a resource (or resource instance) path and its [`Value`].

use crate::path::LwPath;
use serde::Serialize;
use std::fmt;

/// The value of one resource or resource instance, typed as LwM2M 1.1 (Appendix C)
/// types them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", content = "value", rename_all = "lowercase")]
pub enum Value {
    /// A signed integer.
    Integer(i64),
    /// An unsigned integer (LwM2M 1.1).
    Unsigned(u64),
    /// A float.
    Float(f64),
    /// A boolean.
    Boolean(bool),
    /// UTF-8 text.
    String(String),
    /// Bytes (shown as hex in JSON).
    #[serde(serialize_with = "hex")]
    Opaque(Vec<u8>),
    /// Seconds since the Unix epoch.
    Time(i64),
    /// A link to an object instance (`object:instance`).
    #[serde(rename = "objlnk")]
    ObjectLink {
        /// The object id.
        object: u16,
        /// The instance id.
        instance: u16,
    },
}

fn hex<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&Hex(bytes))
}

/// Bytes printed as lowercase hex.
pub(crate) struct Hex<'a>(pub &'a [u8]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// The type of a resource, as an object's model declares it; what a decoder needs
/// to type untyped bytes or text (TLV, plain text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// [`Value::Integer`].
    Integer,
    /// [`Value::Unsigned`].
    Unsigned,
    /// [`Value::Float`].
    Float,
    /// [`Value::Boolean`].
    Boolean,
    /// [`Value::String`].
    String,
    /// [`Value::Opaque`].
    Opaque,
    /// [`Value::Time`].
    Time,
    /// [`Value::ObjectLink`].
    ObjectLink,
    /// An executable resource: it has no value.
    Execute,
}

impl Value {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            Value::Integer(_) => Kind::Integer,
            Value::Unsigned(_) => Kind::Unsigned,
            Value::Float(_) => Kind::Float,
            Value::Boolean(_) => Kind::Boolean,
            Value::String(_) => Kind::String,
            Value::Opaque(_) => Kind::Opaque,
            Value::Time(_) => Kind::Time,
            Value::ObjectLink { .. } => Kind::ObjectLink,
        }
    }

    /// The value as plain text (content format 0), as LwM2M writes it; `None` for
    /// opaque bytes, which go as content format 42.
    pub fn to_text(&self) -> Option<String> {
        Some(match self {
            Value::Integer(i) | Value::Time(i) => i.to_string(),
            Value::Unsigned(u) => u.to_string(),
            Value::Float(x) => x.to_string(),
            Value::Boolean(b) => u8::from(*b).to_string(),
            Value::String(s) => s.clone(),
            Value::ObjectLink { object, instance } => format!("{object}:{instance}"),
            Value::Opaque(_) => return None,
        })
    }

    /// Parses plain text as a value of `kind` (`None` when it is not one).
    pub fn from_text(text: &str, kind: Kind) -> Option<Value> {
        let t = text.trim();
        Some(match kind {
            Kind::Integer => Value::Integer(t.parse().ok()?),
            Kind::Time => Value::Time(t.parse().ok()?),
            Kind::Unsigned => Value::Unsigned(t.parse().ok()?),
            Kind::Float => Value::Float(t.parse().ok().filter(|x: &f64| x.is_finite())?),
            Kind::Boolean => match t {
                "1" | "true" => Value::Boolean(true),
                "0" | "false" => Value::Boolean(false),
                _ => return None,
            },
            Kind::String => Value::String(text.to_string()),
            Kind::ObjectLink => parse_object_link(t)?,
            Kind::Opaque | Kind::Execute => return None,
        })
    }
}

/// Parses `object:instance`.
pub(crate) fn parse_object_link(text: &str) -> Option<Value> {
    let (o, i) = text.split_once(':')?;
    Some(Value::ObjectLink {
        object: o.parse().ok()?,
        instance: i.parse().ok()?,
    })
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Opaque(bytes) => write!(f, "0x{}", Hex(bytes)),
            Value::String(s) => write!(f, "{s:?}"),
            other => f.write_str(&other.to_text().unwrap_or_default()),
        }
    }
}

/// One resource (or resource instance) and its value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    /// Where it is: a resource or resource-instance path.
    pub path: LwPath,
    /// What it holds.
    #[serde(flatten)]
    pub value: Value,
}

impl Entry {
    /// An entry.
    pub fn new(path: LwPath, value: Value) -> Entry {
        Entry { path, value }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trips_by_kind() {
        for (v, text) in [
            (Value::Integer(-5), "-5"),
            (Value::Unsigned(7), "7"),
            (Value::Float(1.5), "1.5"),
            (Value::Boolean(true), "1"),
            (Value::String("+02".into()), "+02"),
            (Value::Time(1_700_000_000), "1700000000"),
            (
                Value::ObjectLink {
                    object: 3,
                    instance: 0,
                },
                "3:0",
            ),
        ] {
            assert_eq!(v.to_text().as_deref(), Some(text));
            assert_eq!(Value::from_text(text, v.kind()), Some(v));
        }
        assert_eq!(Value::from_text("x", Kind::Integer), None);
        assert_eq!(Value::from_text("2", Kind::Boolean), None);
        assert_eq!(Value::from_text("NaN", Kind::Float), None);
        assert_eq!(Value::Opaque(vec![1]).to_text(), None);
    }

    #[test]
    fn entries_serialize_to_json_with_path_type_and_value() {
        let e = Entry::new(LwPath::resource(3, 0, 0), Value::Opaque(vec![0xab, 1]));
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"path":"/3/0/0","type":"opaque","value":"ab01"}"#
        );
        let e = Entry::new(
            LwPath::resource(1, 0, 10),
            Value::ObjectLink {
                object: 4,
                instance: 1,
            },
        );
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"path":"/1/0/10","type":"objlnk","value":{"object":4,"instance":1}}"#
        );
    }
}

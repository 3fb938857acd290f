//! SenML (RFC 8428) as LwM2M 1.1 uses it (§7.4.4, §7.4.5): a pack of records whose
//! base name and name join into a resource path, with the value in `v` (number),
//! `vs` (string), `vb` (boolean), `vd` (data, base64url in JSON, a byte string in
//! CBOR) or `vlo` (object link). Both encodings parse into the same [`Record`]s and
//! resolve into [`Entry`]s the same way.

use super::format::{kind_at, truncated, DecodeError, DecodeLimits, Format};
use crate::path::LwPath;
use crate::value::{parse_object_link, Entry, Kind, Value};
use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine;
use ciborium::value::Value as Cbor;
use serde::{Deserialize, Serialize};

/// A number as the encoding gave it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Number {
    Int(i128),
    Float(f64),
}

/// A record's value before typing.
#[derive(Debug, Clone, PartialEq)]
enum Raw {
    Number(Number),
    Text(String),
    Bool(bool),
    Data(Vec<u8>),
    Link(String),
}

/// One SenML record: base name (applies to it and the records after it), name, value.
#[derive(Debug, Default)]
struct Record {
    base_name: Option<String>,
    name: Option<String>,
    value: Option<Raw>,
}

/// Joins base names and names into paths and types the values.
fn resolve(format: Format, records: Vec<Record>) -> Result<Vec<Entry>, DecodeError> {
    let mut base = String::new();
    let mut entries = Vec::with_capacity(records.len());
    for (i, record) in records.into_iter().enumerate() {
        if let Some(bn) = record.base_name {
            base = bn;
        }
        let name = format!("{base}{}", record.name.as_deref().unwrap_or(""));
        let path: LwPath = name.parse().map_err(|_| {
            DecodeError::new(
                format,
                format!(
                    "record {i}: name {:?} is not a resource path",
                    truncated(&name)
                ),
            )
        })?;
        if !path.is_resource() {
            return Err(DecodeError::new(
                format,
                format!("record {i}: {path} is not a resource path"),
            ));
        }
        let raw = record
            .value
            .ok_or_else(|| DecodeError::new(format, format!("record {i} ({path}) has no value")))?;
        let value = typed(raw, kind_at(&path)).ok_or_else(|| {
            DecodeError::new(
                format,
                format!("record {i}: the value of {path} does not fit its type"),
            )
        })?;
        entries.push(Entry::new(path, value));
    }
    Ok(entries)
}

/// Types a raw value, following the model where it knows the resource.
fn typed(raw: Raw, kind: Option<Kind>) -> Option<Value> {
    let int = |n: Number| match n {
        Number::Int(i) => Some(i),
        Number::Float(x) if x.fract() == 0.0 && x.abs() < 9.0e18 => Some(x as i128),
        Number::Float(_) => None,
    };
    Some(match (raw, kind) {
        (Raw::Number(n), Some(Kind::Integer)) => Value::Integer(i64::try_from(int(n)?).ok()?),
        (Raw::Number(n), Some(Kind::Time)) => Value::Time(i64::try_from(int(n)?).ok()?),
        (Raw::Number(n), Some(Kind::Unsigned)) => Value::Unsigned(u64::try_from(int(n)?).ok()?),
        (Raw::Number(Number::Float(x)), Some(Kind::Float)) => Value::Float(x),
        (Raw::Number(Number::Int(i)), Some(Kind::Float)) => Value::Float(i as f64),
        (Raw::Number(Number::Int(i)), None) => match i64::try_from(i) {
            Ok(i) => Value::Integer(i),
            Err(_) => Value::Unsigned(u64::try_from(i).ok()?),
        },
        (Raw::Number(Number::Float(x)), None) => Value::Float(x),
        (Raw::Text(s), Some(Kind::String) | None) => Value::String(s),
        (Raw::Bool(b), Some(Kind::Boolean) | None) => Value::Boolean(b),
        (Raw::Data(d), Some(Kind::Opaque) | None) => Value::Opaque(d),
        (Raw::Link(l), Some(Kind::ObjectLink) | None) => parse_object_link(&l)?,
        _ => return None,
    })
}

/// Splits an entry into the record fields: the name and the raw value.
fn raw_of(entry: &Entry) -> Raw {
    match &entry.value {
        Value::Integer(i) | Value::Time(i) => Raw::Number(Number::Int(i128::from(*i))),
        Value::Unsigned(u) => Raw::Number(Number::Int(i128::from(*u))),
        Value::Float(x) => Raw::Number(Number::Float(*x)),
        Value::Boolean(b) => Raw::Bool(*b),
        Value::String(s) => Raw::Text(s.clone()),
        Value::Opaque(d) => Raw::Data(d.clone()),
        Value::ObjectLink { object, instance } => Raw::Link(format!("{object}:{instance}")),
    }
}

fn check_count(format: Format, n: usize, limits: &DecodeLimits) -> Result<(), DecodeError> {
    if n > limits.max_entries {
        return Err(DecodeError::new(
            format,
            format!("{n} records, more than the {} decoded", limits.max_entries),
        ));
    }
    Ok(())
}

/// A SenML-JSON record (unknown fields are ignored, as RFC 8428 allows for
/// fields without the `_` suffix it would have to refuse).
#[derive(Debug, Default, Serialize, Deserialize)]
struct JsonRecord {
    #[serde(skip_serializing_if = "Option::is_none")]
    bn: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    n: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    v: Option<serde_json::Number>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vs: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vb: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vd: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vlo: Option<String>,
}

/// Decodes SenML-JSON (content format 110).
pub(crate) fn decode_json(
    payload: &[u8],
    limits: &DecodeLimits,
) -> Result<Vec<Entry>, DecodeError> {
    let f = Format::SenmlJson;
    // serde_json bounds nesting (128 levels); the records are flat, so anything
    // nested is refused by the record type anyway.
    let records: Vec<JsonRecord> = serde_json::from_slice(payload)
        .map_err(|e| DecodeError::new(f, format!("not a SenML-JSON pack: {e}")))?;
    check_count(f, records.len(), limits)?;
    let mut out = Vec::with_capacity(records.len());
    for (i, r) in records.into_iter().enumerate() {
        let mut values = Vec::new();
        if let Some(v) = r.v {
            let n = match v.as_i64() {
                Some(i) => Number::Int(i128::from(i)),
                None => match v.as_u64() {
                    Some(u) => Number::Int(i128::from(u)),
                    None => Number::Float(v.as_f64().unwrap_or(f64::NAN)),
                },
            };
            values.push(Raw::Number(n));
        }
        if let Some(s) = r.vs {
            values.push(Raw::Text(s));
        }
        if let Some(b) = r.vb {
            values.push(Raw::Bool(b));
        }
        if let Some(d) = r.vd {
            let bytes = URL_SAFE_NO_PAD
                .decode(d.trim_end_matches('='))
                .or_else(|_| URL_SAFE.decode(&d))
                .map_err(|e| {
                    DecodeError::new(f, format!("record {i}: `vd` is not base64url: {e}"))
                })?;
            values.push(Raw::Data(bytes));
        }
        if let Some(l) = r.vlo {
            values.push(Raw::Link(l));
        }
        out.push(one_value(f, i, r.bn, r.n, values)?);
    }
    resolve(f, out)
}

/// The record with at most one value (SenML allows only one).
fn one_value(
    f: Format,
    i: usize,
    base_name: Option<String>,
    name: Option<String>,
    mut values: Vec<Raw>,
) -> Result<Record, DecodeError> {
    if values.len() > 1 {
        return Err(DecodeError::new(
            f,
            format!("record {i} has more than one value"),
        ));
    }
    Ok(Record {
        base_name,
        name,
        value: values.pop(),
    })
}

/// Encodes entries as SenML-JSON, one record per entry with its full path as name.
pub(crate) fn encode_json(entries: &[Entry]) -> Vec<u8> {
    let records: Vec<JsonRecord> = entries
        .iter()
        .map(|e| {
            let mut r = JsonRecord {
                n: Some(e.path.to_string()),
                ..JsonRecord::default()
            };
            match raw_of(e) {
                Raw::Number(Number::Int(i)) => {
                    r.v = i64::try_from(i)
                        .map(serde_json::Number::from)
                        .or_else(|_| u64::try_from(i).map(serde_json::Number::from))
                        .ok()
                }
                Raw::Number(Number::Float(x)) => r.v = serde_json::Number::from_f64(x),
                Raw::Text(s) => r.vs = Some(s),
                Raw::Bool(b) => r.vb = Some(b),
                Raw::Data(d) => r.vd = Some(URL_SAFE_NO_PAD.encode(d)),
                Raw::Link(l) => r.vlo = Some(l),
            }
            r
        })
        .collect();
    serde_json::to_vec(&records).unwrap_or_default()
}

/// SenML-CBOR labels (RFC 8428 §6) and LwM2M's `vlo`.
const BASE_NAME: i128 = -2;
const NAME: i128 = 0;
const VALUE: i128 = 2;
const STRING_VALUE: i128 = 3;
const BOOL_VALUE: i128 = 4;
const DATA_VALUE: i128 = 8;
const OBJECT_LINK: &str = "vlo";

/// Decodes SenML-CBOR (content format 112).
pub(crate) fn decode_cbor(
    payload: &[u8],
    limits: &DecodeLimits,
) -> Result<Vec<Entry>, DecodeError> {
    let f = Format::SenmlCbor;
    // The payload is bounded (DecodeLimits), and ciborium bounds nesting (256
    // levels) and grows collections as items arrive, not by declared lengths.
    let pack: Cbor = ciborium::de::from_reader(payload)
        .map_err(|e| DecodeError::new(f, format!("not CBOR: {e}")))?;
    let Cbor::Array(items) = pack else {
        return Err(DecodeError::new(f, "a SenML pack is an array of records"));
    };
    check_count(f, items.len(), limits)?;
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let Cbor::Map(fields) = item else {
            return Err(DecodeError::new(f, format!("record {i} is not a map")));
        };
        let text = |v: Cbor, what: &str| match v {
            Cbor::Text(s) => Ok(s),
            _ => Err(DecodeError::new(
                f,
                format!("record {i}: {what} is not text"),
            )),
        };
        let (mut bn, mut n, mut values) = (None, None, Vec::new());
        for (key, value) in fields {
            match key {
                Cbor::Integer(k) => match i128::from(k) {
                    BASE_NAME => bn = Some(text(value, "the base name")?),
                    NAME => n = Some(text(value, "the name")?),
                    VALUE => values.push(Raw::Number(match value {
                        Cbor::Integer(x) => Number::Int(i128::from(x)),
                        Cbor::Float(x) => Number::Float(x),
                        _ => {
                            return Err(DecodeError::new(
                                f,
                                format!("record {i}: `v` is not a number"),
                            ))
                        }
                    })),
                    STRING_VALUE => values.push(Raw::Text(text(value, "`vs`")?)),
                    BOOL_VALUE => match value {
                        Cbor::Bool(b) => values.push(Raw::Bool(b)),
                        _ => {
                            return Err(DecodeError::new(
                                f,
                                format!("record {i}: `vb` is not a boolean"),
                            ))
                        }
                    },
                    DATA_VALUE => match value {
                        Cbor::Bytes(d) => values.push(Raw::Data(d)),
                        _ => {
                            return Err(DecodeError::new(
                                f,
                                format!("record {i}: `vd` is not bytes"),
                            ))
                        }
                    },
                    _ => {}
                },
                Cbor::Text(k) if k == OBJECT_LINK => values.push(Raw::Link(text(value, "`vlo`")?)),
                _ => {}
            }
        }
        out.push(one_value(f, i, bn, n, values)?);
    }
    resolve(f, out)
}

/// Encodes entries as SenML-CBOR, one record per entry with its full path as name.
pub(crate) fn encode_cbor(entries: &[Entry]) -> Vec<u8> {
    let int = |k: i128| Cbor::Integer(i64::try_from(k).unwrap_or_default().into());
    let records: Vec<Cbor> = entries
        .iter()
        .map(|e| {
            let mut fields = vec![(int(NAME), Cbor::Text(e.path.to_string()))];
            fields.push(match raw_of(e) {
                Raw::Number(Number::Int(i)) => {
                    let v = ciborium::value::Integer::try_from(i).unwrap_or(0.into());
                    (int(VALUE), Cbor::Integer(v))
                }
                Raw::Number(Number::Float(x)) => (int(VALUE), Cbor::Float(x)),
                Raw::Text(s) => (int(STRING_VALUE), Cbor::Text(s)),
                Raw::Bool(b) => (int(BOOL_VALUE), Cbor::Bool(b)),
                Raw::Data(d) => (int(DATA_VALUE), Cbor::Bytes(d)),
                Raw::Link(l) => (Cbor::Text(OBJECT_LINK.into()), Cbor::Text(l)),
            });
            Cbor::Map(fields)
        })
        .collect();
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = ciborium::ser::into_writer(&Cbor::Array(records), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> DecodeLimits {
        DecodeLimits::default()
    }

    fn sample() -> Vec<Entry> {
        vec![
            Entry::new(LwPath::resource(3, 0, 0), Value::String("Leshan".into())),
            Entry::new(LwPath::resource(3, 0, 9), Value::Integer(87)),
            Entry::new(LwPath::resource(3, 0, 13), Value::Time(1_700_000_000)),
            Entry::new(LwPath::resource(3303, 0, 5700), Value::Float(21.5)),
            Entry::new(LwPath::resource(3303, 0, 5850), Value::Boolean(true)),
            Entry::new(
                LwPath::resource(3303, 0, 1),
                Value::Opaque(vec![0, 0xff, 7]),
            ),
            Entry::new(
                LwPath::resource_instance(3303, 0, 2, 1),
                Value::ObjectLink {
                    object: 3,
                    instance: 0,
                },
            ),
        ]
    }

    #[test]
    fn both_encodings_round_trip_every_value_type() {
        let entries = sample();
        assert_eq!(
            decode_json(&encode_json(&entries), &limits()).unwrap(),
            entries
        );
        assert_eq!(
            decode_cbor(&encode_cbor(&entries), &limits()).unwrap(),
            entries
        );
    }

    #[test]
    fn base_names_join_names_as_leshan_sends_them() {
        let body = br#"[{"bn":"/3/0/","n":"0","vs":"Leshan"},{"n":"9","v":87},
            {"n":"11/0","v":0},{"n":"13","v":1.7E9},{"bn":"/1/0/","n":"1","v":300}]"#;
        let got = decode_json(body, &limits()).unwrap();
        let paths: Vec<String> = got.iter().map(|e| e.path.to_string()).collect();
        assert_eq!(
            paths,
            ["/3/0/0", "/3/0/9", "/3/0/11/0", "/3/0/13", "/1/0/1"]
        );
        assert_eq!(got[3].value, Value::Time(1_700_000_000));
        assert_eq!(got[4].value, Value::Integer(300));
        // base64url data with or without padding
        let d = decode_json(
            br#"[{"n":"/5/0/0","vd":"AP8H"},{"n":"/5/0/1","vd":"AA=="}]"#,
            &limits(),
        );
        assert_eq!(d.unwrap()[1].value, Value::Opaque(vec![0]));
    }

    #[test]
    fn malformed_packs_are_errors_saying_what() {
        for (bad, says) in [
            (&br#"{"n":"/3/0/0"}"#[..], "not a SenML-JSON pack"),
            (br#"[{"n":"/3/0/0"}]"#, "has no value"),
            (br#"[{"n":"/3/0","vs":"x"}]"#, "not a resource path"),
            (br#"[{"n":"temp","v":1}]"#, "not a resource path"),
            (br#"[{"n":"/3/0/9","vs":"many"}]"#, "does not fit"),
            (br#"[{"n":"/3/0/9","v":1.5}]"#, "does not fit"),
            (br#"[{"n":"/3/0/0","vs":"a","v":1}]"#, "more than one value"),
            (br#"[{"n":"/5/0/0","vd":"!!"}]"#, "base64url"),
            (
                br#"[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]"#,
                "not a SenML-JSON pack",
            ),
        ] {
            let e = decode_json(bad, &limits()).unwrap_err();
            assert!(
                e.reason.contains(says),
                "{}: {e}",
                String::from_utf8_lossy(bad)
            );
        }
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(decode_json(deep.as_bytes(), &limits()).is_err());
    }

    #[test]
    fn hostile_cbor_is_bounded() {
        let small = DecodeLimits {
            max_entries: 3,
            ..limits()
        };
        let four = encode_cbor(&sample()[..4]);
        assert!(decode_cbor(&four, &small)
            .unwrap_err()
            .reason
            .contains("4 records"));
        for bad in [
            &[0x9b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff][..], // 2^64 items declared
            &[0x81, 0x5b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], // huge byte string
            &[0x81, 0x7a, 0xff, 0xff, 0xff, 0xff],                       // huge text
            &[0xa1, 0x00, 0x01],                                         // a map, not an array
            &[0x81, 0x01],                                               // a record that is no map
            &[0x81, 0xa1, 0x00, 0x01],                                   // name that is no text
            &[0xff],
        ] {
            assert!(decode_cbor(bad, &limits()).is_err(), "{bad:x?}");
        }
        let deep: Vec<u8> = std::iter::repeat_n(0x81, 10_000).chain([0x80]).collect();
        assert!(decode_cbor(&deep, &limits()).is_err());
        let mut x: u32 = 99;
        for _ in 0..2000 {
            let len = (x % 48) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (x >> 16) as u8
                })
                .collect();
            if let Ok(entries) = decode_cbor(&bytes, &small) {
                assert!(entries.len() <= 3);
            }
        }
    }
}

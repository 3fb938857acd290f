//! OMA-TLV (content format 11542, LwM2M 1.1 §7.4.3) decoding.
//!
//! Each TLV is a type byte (identifier kind in bits 7–6: object instance 00,
//! resource instance 01, multiple resource 10, resource 11; 16-bit identifier in bit 5,
//! length encoding in bits 4–3, a 3-bit length in bits 2–0), the identifier, the
//! length and the value. Object instances hold resources, multiple resources hold
//! resource instances; nothing nests deeper, so recursion is at most three levels.
//! Values carry no type: resources of the core objects are typed from the
//! [model](crate::model), others decode as opaque bytes.

use super::format::{kind_at, DecodeError, DecodeLimits, Format};
use crate::path::LwPath;
use crate::value::{Entry, Kind, Value};

/// The four identifier kinds of the type byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    ObjectInstance,
    ResourceInstance,
    Resource,
    MultipleResource,
}

/// One TLV: its kind, identifier and value bytes.
struct Tlv<'a> {
    level: Level,
    id: u16,
    value: &'a [u8],
}

fn error(reason: impl Into<String>) -> DecodeError {
    DecodeError::new(Format::Tlv, reason)
}

/// Splits `bytes` into its TLVs.
fn split(mut bytes: &[u8]) -> Result<Vec<Tlv<'_>>, DecodeError> {
    let mut out = Vec::new();
    while let Some((&ty, rest)) = bytes.split_first() {
        let level = match ty >> 6 {
            0 => Level::ObjectInstance,
            1 => Level::ResourceInstance,
            2 => Level::MultipleResource,
            _ => Level::Resource,
        };
        let id_len = if ty & 0x20 != 0 { 2 } else { 1 };
        let len_len = usize::from((ty >> 3) & 0x03);
        let header = id_len + len_len;
        if rest.len() < header {
            return Err(error("a TLV header runs past the end of the payload"));
        }
        let id = rest[..id_len]
            .iter()
            .fold(0u16, |n, b| (n << 8) | u16::from(*b));
        let len = if len_len == 0 {
            usize::from(ty & 0x07)
        } else {
            rest[id_len..header]
                .iter()
                .fold(0usize, |n, b| (n << 8) | usize::from(*b))
        };
        let rest = &rest[header..];
        if rest.len() < len {
            return Err(error(format!(
                "a TLV says {len} bytes of value, but {} are left",
                rest.len()
            )));
        }
        if id == u16::MAX {
            return Err(error("identifier 65535 is reserved"));
        }
        out.push(Tlv {
            level,
            id,
            value: &rest[..len],
        });
        bytes = &rest[len..];
    }
    Ok(out)
}

/// Decodes a TLV payload answering a read of `path`.
pub(crate) fn decode(
    path: &LwPath,
    payload: &[u8],
    limits: &DecodeLimits,
) -> Result<Vec<Entry>, DecodeError> {
    let mut entries = Vec::new();
    walk(*path, payload, 0, &mut entries, limits)?;
    Ok(entries)
}

/// Decodes the TLVs in `bytes` below `at`: `depth` 0 is the payload, 1 inside an
/// object instance, 2 inside a multiple resource.
fn walk(
    at: LwPath,
    bytes: &[u8],
    depth: u8,
    entries: &mut Vec<Entry>,
    limits: &DecodeLimits,
) -> Result<(), DecodeError> {
    for tlv in split(bytes)? {
        let allowed = match tlv.level {
            Level::ObjectInstance => depth == 0 && at.instance.is_none(),
            Level::Resource | Level::MultipleResource => depth <= 1,
            Level::ResourceInstance => depth == 2 || (depth == 0 && at.resource.is_some()),
        };
        if !allowed {
            return Err(error(format!(
                "a {:?} TLV (id {}) cannot appear below {at}",
                tlv.level, tlv.id
            )));
        }
        let mut child = at;
        match tlv.level {
            Level::ObjectInstance => {
                child.instance = Some(tlv.id);
                walk(child, tlv.value, 1, entries, limits)?;
            }
            Level::MultipleResource => {
                child.instance = Some(at.instance.unwrap_or(0));
                child.resource = Some(tlv.id);
                walk(child, tlv.value, 2, entries, limits)?;
            }
            Level::Resource | Level::ResourceInstance => {
                if tlv.level == Level::Resource {
                    child.instance = Some(at.instance.unwrap_or(0));
                    child.resource = Some(tlv.id);
                } else {
                    child.resource_instance = Some(tlv.id);
                }
                if entries.len() >= limits.max_entries {
                    return Err(error(format!(
                        "more than {} values in one payload",
                        limits.max_entries
                    )));
                }
                let value = typed(kind_at(&child), tlv.value, &child)?;
                entries.push(Entry::new(child, value));
            }
        }
    }
    Ok(())
}

/// The value of `bytes` as a resource of `kind` (opaque when the kind is unknown).
fn typed(kind: Option<Kind>, bytes: &[u8], path: &LwPath) -> Result<Value, DecodeError> {
    let wrong = |what: &str| error(format!("{path}: {} bytes are not {what}", bytes.len()));
    let int = || -> Result<i64, DecodeError> {
        Ok(match bytes.len() {
            1 => i64::from(bytes[0] as i8),
            2 => i64::from(i16::from_be_bytes([bytes[0], bytes[1]])),
            4 => i64::from(i32::from_be_bytes(
                bytes.try_into().map_err(|_| wrong("an integer"))?,
            )),
            8 => i64::from_be_bytes(bytes.try_into().map_err(|_| wrong("an integer"))?),
            _ => return Err(wrong("an integer (1, 2, 4 or 8 bytes)")),
        })
    };
    Ok(match kind {
        Some(Kind::Integer) => Value::Integer(int()?),
        Some(Kind::Time) => Value::Time(int()?),
        Some(Kind::Unsigned) => {
            if !matches!(bytes.len(), 1 | 2 | 4 | 8) {
                return Err(wrong("an unsigned integer (1, 2, 4 or 8 bytes)"));
            }
            Value::Unsigned(bytes.iter().fold(0u64, |n, b| (n << 8) | u64::from(*b)))
        }
        Some(Kind::Float) => match bytes.len() {
            4 => Value::Float(f64::from(f32::from_be_bytes(
                bytes.try_into().map_err(|_| wrong("a float"))?,
            ))),
            8 => Value::Float(f64::from_be_bytes(
                bytes.try_into().map_err(|_| wrong("a float"))?,
            )),
            _ => return Err(wrong("a float (4 or 8 bytes)")),
        },
        Some(Kind::Boolean) => match bytes {
            [0] => Value::Boolean(false),
            [1] => Value::Boolean(true),
            _ => return Err(wrong("a boolean (one byte, 0 or 1)")),
        },
        Some(Kind::String) => {
            Value::String(String::from_utf8(bytes.to_vec()).map_err(|_| wrong("UTF-8 text"))?)
        }
        Some(Kind::ObjectLink) => match bytes {
            [a, b, c, d] => Value::ObjectLink {
                object: u16::from_be_bytes([*a, *b]),
                instance: u16::from_be_bytes([*c, *d]),
            },
            _ => return Err(wrong("an object link (4 bytes)")),
        },
        Some(Kind::Opaque | Kind::Execute) | None => Value::Opaque(bytes.to_vec()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TLV with an 8-bit id and an 8-bit length.
    fn tlv(level: u8, id: u8, value: &[u8]) -> Vec<u8> {
        let mut v = vec![(level << 6) | 0x08, id, value.len() as u8];
        v.extend_from_slice(value);
        v
    }

    fn limits() -> DecodeLimits {
        DecodeLimits::default()
    }

    #[test]
    fn an_instance_with_single_and_multiple_resources_decodes_typed() {
        let mut body = tlv(3, 0, b"Leshan");
        body.extend(tlv(3, 9, &[87]));
        body.extend(tlv(2, 11, &tlv(1, 0, &[0])));
        body.extend(tlv(3, 13, &1_700_000_000i32.to_be_bytes()));
        let at = LwPath::instance(3, 0);
        let got = decode(&at, &body, &limits()).unwrap();
        assert_eq!(
            got,
            vec![
                Entry::new(LwPath::resource(3, 0, 0), Value::String("Leshan".into())),
                Entry::new(LwPath::resource(3, 0, 9), Value::Integer(87)),
                Entry::new(LwPath::resource_instance(3, 0, 11, 0), Value::Integer(0)),
                Entry::new(LwPath::resource(3, 0, 13), Value::Time(1_700_000_000)),
            ]
        );
        // An object read wraps the same in an object instance TLV.
        let wrapped = tlv(0, 0, &body);
        let got = decode(&LwPath::object(3), &wrapped, &limits()).unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(got[3].path, LwPath::resource(3, 0, 13));
        // Unknown objects decode as opaque.
        let got = decode(&LwPath::instance(3303, 0), &tlv(3, 1, &[1, 2]), &limits()).unwrap();
        assert_eq!(got[0].value, Value::Opaque(vec![1, 2]));
    }

    #[test]
    fn the_short_forms_of_id_and_length_decode() {
        // 16-bit id, length in the type byte (3 bytes).
        let body = [0b1110_0011, 0x00, 0x0e, b'+', b'0', b'2'];
        let got = decode(&LwPath::resource(3, 0, 14), &body, &limits()).unwrap();
        assert_eq!(got[0].value, Value::String("+02".into()));
        assert_eq!(got[0].path, LwPath::resource(3, 0, 14));
    }

    #[test]
    fn malformed_tlv_is_an_error_not_a_panic() {
        let at = LwPath::instance(3, 0);
        for bad in [
            &[0xc8][..],                  // header cut short
            &[0xc8, 0x00, 0x05, 1, 2],    // length past the end
            &[0xd0, 0x00, 0xff, 0xff, 1], // 16-bit length past the end
            &[0xe0, 0xff, 0xff],          // id 65535
            &[0xc8, 0x09, 0x03, 1, 2, 3], // 3-byte integer
            &[0xc8, 0x00, 0x01, 0xff],    // not UTF-8
            &[0x41, 0x00, 0x00],          // resource instance at the top of an instance read
        ] {
            assert!(decode(&at, bad, &limits()).is_err(), "{bad:?}");
        }
        // An object instance inside an object instance.
        let nested = tlv(0, 0, &tlv(0, 0, &tlv(3, 0, b"x")));
        assert!(decode(&LwPath::object(3), &nested, &limits()).is_err());
    }

    #[test]
    fn hostile_payloads_stay_within_the_limits() {
        let small = DecodeLimits {
            max_entries: 10,
            ..limits()
        };
        let many: Vec<u8> = (0..11).flat_map(|i| tlv(3, i, &[1])).collect();
        let e = decode(&LwPath::instance(3303, 0), &many, &small).unwrap_err();
        assert!(e.reason.contains("more than 10"), "{e}");
        // Pseudo-random bytes: errors or bounded results, never a panic.
        let mut x: u32 = 12345;
        for _ in 0..2000 {
            let len = (x % 64) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (x >> 16) as u8
                })
                .collect();
            if let Ok(entries) = decode(&LwPath::object(3), &bytes, &small) {
                assert!(entries.len() <= 10);
            }
        }
    }
}

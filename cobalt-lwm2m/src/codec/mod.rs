//! The content formats of LwM2M 1.1 payloads, decoded into and encoded from the
//! value model ([`Entry`], [`Value`]): SenML-JSON (110) and SenML-CBOR (112) both ways,
//! plain text (0) and opaque (42) for a single resource both ways, TLV (11542) for
//! reading.
//!
//! Payloads come from devices and are hostile: every decoder works within
//! [`DecodeLimits`] (payload size, entries, nesting) and answers anything malformed
//! with a [`DecodeError`] saying what, never a panic.

mod format;
mod senml;
mod tlv;

pub(crate) use format::truncated;
pub use format::{DecodeError, DecodeLimits, Format, UnknownFormat};

use crate::path::LwPath;
use crate::value::{Entry, Kind, Value};
use format::kind_at;

/// Decodes a payload in `format` that answers a request on `path`.
pub fn decode(
    format: Format,
    path: &LwPath,
    payload: &[u8],
    limits: &DecodeLimits,
) -> Result<Vec<Entry>, DecodeError> {
    if payload.len() > limits.max_payload_bytes {
        return Err(DecodeError::new(
            format,
            format!(
                "{} bytes, more than the {} decoded",
                payload.len(),
                limits.max_payload_bytes
            ),
        ));
    }
    match format {
        Format::Text => {
            let resource = single_resource(format, path)?;
            let text = std::str::from_utf8(payload)
                .map_err(|e| DecodeError::new(format, format!("not UTF-8: {e}")))?;
            let value = match kind_at(path) {
                Some(Kind::Opaque | Kind::Execute) | None => Value::String(text.to_string()),
                Some(kind) => Value::from_text(text, kind).ok_or_else(|| {
                    DecodeError::new(
                        format,
                        format!(
                            "{:?} is not a {kind:?} (the type of {path})",
                            truncated(text)
                        ),
                    )
                })?,
            };
            Ok(vec![Entry::new(resource, value)])
        }
        Format::Opaque => Ok(vec![Entry::new(
            single_resource(format, path)?,
            Value::Opaque(payload.to_vec()),
        )]),
        Format::Tlv => tlv::decode(path, payload, limits),
        Format::SenmlJson => senml::decode_json(payload, limits),
        Format::SenmlCbor => senml::decode_cbor(payload, limits),
    }
}

/// Encodes `entries` in `format` (not TLV: the manager reads TLV but writes SenML).
/// Text and opaque take exactly one entry (opaque only an opaque value).
pub fn encode(format: Format, entries: &[Entry]) -> Result<Vec<u8>, DecodeError> {
    let single = || match entries {
        [one] => Ok(one),
        _ => Err(DecodeError::new(
            format,
            format!("carries one resource value, not {}", entries.len()),
        )),
    };
    match format {
        Format::Text => single()?
            .value
            .to_text()
            .map(String::into_bytes)
            .ok_or_else(|| DecodeError::new(format, "opaque values go as opaque (42), not text")),
        Format::Opaque => match &single()?.value {
            Value::Opaque(bytes) => Ok(bytes.clone()),
            other => Err(DecodeError::new(
                format,
                format!("carries opaque bytes, not a {:?}", other.kind()),
            )),
        },
        Format::Tlv => Err(DecodeError::new(
            format,
            "the manager writes SenML-JSON, SenML-CBOR, text or opaque, not TLV",
        )),
        Format::SenmlJson => Ok(senml::encode_json(entries)),
        Format::SenmlCbor => Ok(senml::encode_cbor(entries)),
    }
}

fn single_resource(format: Format, path: &LwPath) -> Result<LwPath, DecodeError> {
    if path.is_resource() {
        Ok(*path)
    } else {
        Err(DecodeError::new(
            format,
            format!("carries one resource, but {path} is not a resource path"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_by_name_and_number() {
        for f in Format::ALL {
            assert_eq!(f.name().parse::<Format>(), Ok(f));
            assert_eq!(f.content_format().to_string().parse::<Format>(), Ok(f));
            assert_eq!(Format::from_content_format(f.content_format()), Some(f));
        }
        assert!("xml".parse::<Format>().is_err());
        assert_eq!(Format::from_content_format(40), None);
    }

    #[test]
    fn text_and_opaque_decode_one_resource_typed_by_the_model() {
        let limits = DecodeLimits::default();
        let time = LwPath::resource(3, 0, 13);
        let got = decode(Format::Text, &time, b"1700000000", &limits).unwrap();
        assert_eq!(got, vec![Entry::new(time, Value::Time(1_700_000_000))]);
        let name = LwPath::resource(3, 0, 0);
        let got = decode(Format::Text, &name, b"Leshan", &limits).unwrap();
        assert_eq!(got[0].value, Value::String("Leshan".into()));
        let unknown = LwPath::resource(3303, 0, 5700);
        let got = decode(Format::Text, &unknown, b"21.5", &limits).unwrap();
        assert_eq!(got[0].value, Value::String("21.5".into()));
        let e = decode(Format::Text, &time, b"soon", &limits).unwrap_err();
        assert!(e.reason.contains("Time"), "{e}");
        assert!(decode(Format::Text, &LwPath::instance(3, 0), b"x", &limits).is_err());
        assert!(decode(Format::Text, &name, &[0xff], &limits).is_err());
        let got = decode(Format::Opaque, &name, &[0, 1], &limits).unwrap();
        assert_eq!(got[0].value, Value::Opaque(vec![0, 1]));
        let small = DecodeLimits {
            max_payload_bytes: 4,
            ..limits
        };
        assert!(decode(Format::Opaque, &name, &[0; 5], &small).is_err());
    }

    #[test]
    fn text_and_opaque_encode_exactly_one_value() {
        let one = [Entry::new(
            LwPath::resource(3, 0, 14),
            Value::String("+02".into()),
        )];
        assert_eq!(encode(Format::Text, &one).unwrap(), b"+02");
        assert!(encode(Format::Opaque, &one).is_err());
        assert!(encode(Format::Text, &[]).is_err());
        assert!(encode(Format::Tlv, &one).is_err());
        let bytes = [Entry::new(
            LwPath::resource(3, 0, 0),
            Value::Opaque(vec![9]),
        )];
        assert_eq!(encode(Format::Opaque, &bytes).unwrap(), vec![9]);
        assert!(encode(Format::Text, &bytes).is_err());
    }
}

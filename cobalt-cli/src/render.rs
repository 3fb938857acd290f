//! How a response is shown to a person: the code and options first with `-i` (like
//! curl), JSON and CBOR pretty-printed with `--pretty` (CBOR in the diagnostic
//! notation of RFC 8949 §8), and binary payloads recognised so that they are not
//! dumped onto a terminal.

use cobalt::proto::message::{content_format, option, Code, Options};
use std::fmt::Write;

/// The code line and one line per option, then an empty line, as `-i` prints them
/// before the payload.
pub fn head(code: Code, options: &Options) -> String {
    let mut s = format!("{code}\n");
    for o in options.iter() {
        let _ = writeln!(
            s,
            "{}: {}",
            option::option_name(o.number),
            option::display_value(o.number, o.value)
        );
    }
    s.push('\n');
    s
}

/// Whether `bytes` would garble a terminal: not UTF-8, or control characters other
/// than tab, newline and carriage return.
pub fn is_binary(bytes: &[u8]) -> bool {
    std::str::from_utf8(bytes).is_err()
        || bytes
            .iter()
            .any(|&b| (b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r')) || b == 0x7f)
}

/// The payload pretty-printed when its Content-Format (or, without one, its content)
/// is JSON or CBOR; `None` when it is neither or does not parse.
pub fn pretty(content_format: Option<u16>, payload: &[u8]) -> Option<String> {
    let json = |p: &[u8]| {
        serde_json::from_slice::<serde_json::Value>(p)
            .ok()
            .and_then(|v| serde_json::to_string_pretty(&v).ok())
    };
    match content_format {
        Some(cf) if content_format::is_json(cf) => json(payload),
        Some(cf) if content_format::is_cbor(cf) => cbor_diagnostic(payload),
        Some(_) => None,
        None => json(payload),
    }
}

/// A CBOR item (or a sequence of items, one per line) in diagnostic notation.
pub fn cbor_diagnostic(mut bytes: &[u8]) -> Option<String> {
    let mut out = String::new();
    while !bytes.is_empty() {
        let value: ciborium::value::Value = ciborium::de::from_reader(&mut bytes).ok()?;
        if !out.is_empty() {
            out.push('\n');
        }
        diagnostic(&value, 0, &mut out);
    }
    (!out.is_empty()).then_some(out)
}

/// Deepest nesting printed; deeper items are shown as `...` (a hostile payload cannot
/// make the printer recurse without bound).
const MAX_DEPTH: usize = 64;

fn diagnostic(v: &ciborium::value::Value, depth: usize, out: &mut String) {
    use ciborium::value::Value;
    if depth > MAX_DEPTH {
        out.push_str("...");
        return;
    }
    let pad = |out: &mut String, d: usize| out.push_str(&"  ".repeat(d));
    match v {
        Value::Integer(i) => {
            let _ = write!(out, "{}", i128::from(*i));
        }
        Value::Bytes(b) => {
            out.push_str("h'");
            for x in b {
                let _ = write!(out, "{x:02x}");
            }
            out.push('\'');
        }
        Value::Float(f) if f.is_nan() => out.push_str("NaN"),
        Value::Float(f) if f.is_infinite() => {
            out.push_str(if *f > 0.0 { "Infinity" } else { "-Infinity" })
        }
        Value::Float(f) => {
            let _ = write!(out, "{f:?}");
        }
        Value::Text(t) => {
            let _ = write!(out, "{}", serde_json::Value::String(t.clone()));
        }
        Value::Bool(b) => {
            let _ = write!(out, "{b}");
        }
        Value::Null => out.push_str("null"),
        Value::Tag(tag, inner) => {
            let _ = write!(out, "{tag}(");
            diagnostic(inner, depth + 1, out);
            out.push(')');
        }
        Value::Array(items) if items.is_empty() => out.push_str("[]"),
        Value::Array(items) => {
            out.push_str("[\n");
            for (i, item) in items.iter().enumerate() {
                pad(out, depth + 1);
                diagnostic(item, depth + 1, out);
                out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
            }
            pad(out, depth);
            out.push(']');
        }
        Value::Map(entries) if entries.is_empty() => out.push_str("{}"),
        Value::Map(entries) => {
            out.push_str("{\n");
            for (i, (k, val)) in entries.iter().enumerate() {
                pad(out, depth + 1);
                diagnostic(k, depth + 1, out);
                out.push_str(": ");
                diagnostic(val, depth + 1, out);
                out.push_str(if i + 1 < entries.len() { ",\n" } else { "\n" });
            }
            pad(out, depth);
            out.push('}');
        }
        _ => out.push_str("undefined"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_lists_code_and_options_by_name() {
        let mut o = Options::new();
        o.set_uint(option::number::CONTENT_FORMAT, 50);
        o.set_uint(option::number::MAX_AGE, 60);
        o.push(option::number::ETAG, vec![0xab, 0x01]);
        assert_eq!(
            head(Code::CONTENT, &o),
            "2.05 Content\nETag: 0xab01\nContent-Format: 50 (application/json)\nMax-Age: 60\n\n"
        );
    }

    #[test]
    fn binary_is_recognised() {
        assert!(!is_binary(b"hello\tworld\r\n"));
        assert!(!is_binary("grüße".as_bytes()));
        assert!(is_binary(&[0xff, 0xfe]));
        assert!(is_binary(b"a\x00b"));
        assert!(is_binary(b"\x1b[31mred"));
    }

    #[test]
    fn json_and_cbor_are_pretty_printed() {
        let json = pretty(Some(50), br#"{"a":[1,2],"b":"x"}"#).unwrap();
        assert_eq!(
            json,
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": \"x\"\n}"
        );
        // SenML+JSON is JSON; without a Content-Format, JSON is recognised by content.
        assert!(pretty(Some(110), b"[{\"n\":\"t\"}]").is_some());
        assert!(pretty(None, b"{\"a\":1}").is_some());
        assert_eq!(pretty(Some(0), b"{\"a\":1}"), None);
        assert_eq!(pretty(Some(50), b"not json"), None);
        // {"t": 21.5, 1: h'0102', "l": [true, null]} then a second item: 7
        let cbor = [
            0xa3, 0x61, b't', 0xf9, 0x4d, 0x60, 0x01, 0x42, 0x01, 0x02, 0x61, b'l', 0x82, 0xf5,
            0xf6, 0x07,
        ];
        let text = pretty(Some(60), &cbor).unwrap();
        assert_eq!(
            text,
            "{\n  \"t\": 21.5,\n  1: h'0102',\n  \"l\": [\n    true,\n    null\n  ]\n}\n7"
        );
        assert_eq!(pretty(Some(112), &[0xff]), None, "malformed CBOR");
        // Deep nesting stays bounded.
        let deep: Vec<u8> = std::iter::repeat_n(0x81, 200).chain([0x01]).collect();
        assert!(cbor_diagnostic(&deep).is_none_or(|t| t.contains("...")));
    }
}

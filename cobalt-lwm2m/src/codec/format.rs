//! The content formats, the decoders' bounds and their errors.

use crate::model::resource_kind;
use crate::path::LwPath;
use crate::value::Kind;
use std::fmt;
use std::str::FromStr;

/// An LwM2M content format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// `text/plain` (0): one resource.
    Text,
    /// `application/octet-stream` (42): one opaque resource.
    Opaque,
    /// `application/vnd.oma.lwm2m+tlv` (11542): reads only.
    Tlv,
    /// `application/senml+json` (110).
    SenmlJson,
    /// `application/senml+cbor` (112).
    SenmlCbor,
}

impl Format {
    /// Every format, in the order [`Format::from_str`] lists them.
    pub const ALL: [Format; 5] = [
        Format::SenmlJson,
        Format::SenmlCbor,
        Format::Tlv,
        Format::Text,
        Format::Opaque,
    ];

    /// Its CoAP Content-Format number.
    pub fn content_format(self) -> u16 {
        match self {
            Format::Text => 0,
            Format::Opaque => 42,
            Format::Tlv => 11542,
            Format::SenmlJson => 110,
            Format::SenmlCbor => 112,
        }
    }

    /// The format with Content-Format number `cf`, if it is one of these.
    pub fn from_content_format(cf: u16) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.content_format() == cf)
    }

    /// Its short name: `json`, `cbor`, `tlv`, `text`, `opaque`.
    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Opaque => "opaque",
            Format::Tlv => "tlv",
            Format::SenmlJson => "json",
            Format::SenmlCbor => "cbor",
        }
    }

    /// Whether it carries only one resource value.
    pub fn is_single_value(self) -> bool {
        matches!(self, Format::Text | Format::Opaque)
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A format name that is not one of [`Format::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown format {0:?}: give json (SenML-JSON), cbor (SenML-CBOR), tlv, text or opaque, or a Content-Format number")]
pub struct UnknownFormat(pub String);

impl FromStr for Format {
    type Err = UnknownFormat;

    fn from_str(s: &str) -> Result<Format, UnknownFormat> {
        let by_name = Format::ALL.into_iter().find(|f| f.name() == s);
        let by_number = || s.parse().ok().and_then(Format::from_content_format);
        by_name
            .or_else(by_number)
            .ok_or_else(|| UnknownFormat(s.chars().take(40).collect()))
    }
}

/// The bounds a decoder keeps against hostile payloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Largest payload decoded, in bytes.
    pub max_payload_bytes: usize,
    /// Most entries (resource values) in one payload.
    pub max_entries: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_payload_bytes: 64 * 1024,
            max_entries: 1024,
        }
    }
}

/// A payload that could not be decoded (or values that cannot be encoded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{format} payload: {reason}")]
pub struct DecodeError {
    /// The format it was decoded as.
    pub format: Format,
    /// What is wrong with it.
    pub reason: String,
}

impl DecodeError {
    pub(crate) fn new(format: Format, reason: impl Into<String>) -> DecodeError {
        DecodeError {
            format,
            reason: reason.into(),
        }
    }
}

/// The declared type of the resource `path` names, where it is known.
pub(crate) fn kind_at(path: &LwPath) -> Option<Kind> {
    resource_kind(path.object, path.resource?)
}

/// At most 40 characters of `s`, for messages about hostile input.
pub(crate) fn truncated(s: &str) -> String {
    match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

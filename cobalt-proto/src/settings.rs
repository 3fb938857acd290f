//! What every settings type shares: the allowed values of each parameter, checked in
//! one place ([`Param`], [`check`]), and the human duration format (`"1500ms"`, `"2s"`,
//! `"1m30s"`, or a plain number of seconds) with, under the feature `serde`, the serde
//! helpers that read and write it.
//!
//! A settings type ([`Settings`]) lists its parameters once, in the order of its
//! configuration file section, each with its key, what it does, the values allowed and
//! whether its current value is one of them; its `validate` is [`check`] of that list,
//! and the commented configuration file is written from it.

use std::time::Duration;

/// One parameter of a settings type, as of one value of that type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    /// The key, as it appears in a configuration file.
    pub key: &'static str,
    /// What it does (one paragraph, for the configuration file).
    pub doc: &'static str,
    /// The values allowed, in words (`"1 to 1024"`, `"1ms to 600s"`).
    pub allowed: &'static str,
    /// Whether the current value is allowed.
    pub ok: bool,
}

impl Param {
    /// A parameter: its key, what it does, the values allowed and whether the current
    /// value is one of them.
    pub const fn new(
        key: &'static str,
        doc: &'static str,
        allowed: &'static str,
        ok: bool,
    ) -> Param {
        Param {
            key,
            doc,
            allowed,
            ok,
        }
    }
}

/// Why a value was refused: its key and the values allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The offending parameter's key.
    pub key: &'static str,
    /// What values are allowed.
    pub allowed: &'static str,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid value for `{}`: allowed {}",
            self.key, self.allowed
        )
    }
}

impl std::error::Error for ConfigError {}

/// A settings type: its parameters, each with its key, what it does and the values
/// allowed, checked against the current values.
pub trait Settings {
    /// Every parameter with what it does, the values allowed and whether the current
    /// value is one of them, in configuration file order.
    fn params(&self) -> Vec<Param>;

    /// Checks every value; the error names the first key whose value is not allowed,
    /// and the values allowed.
    fn validate(&self) -> Result<(), ConfigError> {
        check(&self.params())
    }
}

/// The first parameter whose value is not allowed, as an error.
pub fn check(params: &[Param]) -> Result<(), ConfigError> {
    match params.iter().find(|p| !p.ok) {
        Some(p) => Err(ConfigError {
            key: p.key,
            allowed: p.allowed,
        }),
        None => Ok(()),
    }
}

/// True when `d` lies between `min` and `max` (inclusive).
pub fn within(d: Duration, min: Duration, max: Duration) -> bool {
    (min..=max).contains(&d)
}

/// Parses a duration: `"2s"`, `"1500ms"`, `"1m30s"`, `"0.5s"` or a plain number of
/// seconds (`"2"`). Units: `ns`, `us`, `ms`, `s`, `m`, `h`, `d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = text.parse::<f64>() {
        return secs_to_duration(secs);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let unit_len = rest[number_len..]
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len() - number_len);
        let (number, unit) = (&rest[..number_len], rest[number_len..][..unit_len].trim());
        let bad =
            || format!("`{text}` is not a duration (examples: \"2s\", \"1500ms\", \"1m30s\")");
        let n: f64 = number.parse().map_err(|_| bad())?;
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86_400.0,
            _ => return Err(bad()),
        };
        total = total
            .checked_add(secs_to_duration(n * scale)?)
            .ok_or_else(bad)?;
        rest = &rest[number_len + unit_len..];
    }
    Ok(total)
}

/// A number of seconds as a duration; an error for negative, infinite or huge values.
pub fn secs_to_duration(secs: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{secs} s is not a valid duration"))
}

/// Writes a duration in the largest unit (up to hours) that keeps it exact: `"2s"`,
/// `"1500ms"`, `"24h"`.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    const UNITS: [(u128, &str); 5] = [
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
    ];
    for (size, unit) in UNITS {
        if nanos.is_multiple_of(size) {
            return format!("{}{unit}", nanos / size);
        }
    }
    format!("{nanos}ns")
}

/// Serde for a [`Duration`] in the human format: written as `"2s"`, read from such a
/// string or a number of seconds. Use with `#[serde(with = "...::duration")]`.
#[cfg(feature = "serde")]
pub mod duration {
    use serde::{de, Deserializer, Serializer};
    use std::time::Duration;

    /// Writes `d` as `"2s"`, `"1500ms"`.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_duration(*d))
    }

    /// Reads a duration string or a number of seconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        d.deserialize_any(Visitor)
    }

    pub(super) struct Visitor;

    impl de::Visitor<'_> for Visitor {
        type Value = Duration;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a duration such as \"2s\" or \"1500ms\", or a number of seconds")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
            super::parse_duration(v).map_err(E::custom)
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
            u64::try_from(v)
                .map(Duration::from_secs)
                .map_err(|_| E::custom("a duration cannot be negative"))
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
            Ok(Duration::from_secs(v))
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
            super::secs_to_duration(v).map_err(E::custom)
        }
    }
}

/// Serde for an optional [`Duration`] that is derived when unset: `"auto"` is `None`.
#[cfg(feature = "serde")]
pub mod auto_duration {
    use super::duration::Visitor as Inner;
    use serde::de;
    use serde::{Deserializer, Serializer};
    use std::time::Duration;

    /// Writes `None` as `"auto"`, a duration as [`duration`](super::duration) does.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::duration::serialize(d, s),
            None => s.serialize_str("auto"),
        }
    }

    /// Reads `"auto"` as `None`, anything else as [`duration`](super::duration) does.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        d.deserialize_any(Visitor)
    }

    struct Visitor;

    impl de::Visitor<'_> for Visitor {
        type Value = Option<Duration>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("\"auto\" or a duration such as \"2s\"")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            if v == "auto" {
                return Ok(None);
            }
            Inner.visit_str(v).map(Some)
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Inner.visit_i64(v).map(Some)
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Inner.visit_u64(v).map(Some)
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Inner.visit_f64(v).map(Some)
        }
    }
}

/// Serde for an optional [`Duration`] where zero means none (`0`, `"0s"`: never).
#[cfg(feature = "serde")]
pub mod zero_is_none {
    use serde::{Deserializer, Serializer};
    use std::time::Duration;

    /// Writes `None` as `"0s"`.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        super::duration::serialize(&d.unwrap_or_default(), s)
    }

    /// Reads a duration; zero is `None`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let d = super::duration::deserialize(d)?;
        Ok((!d.is_zero()).then_some(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_format() {
        let ok = [
            ("2s", Duration::from_secs(2)),
            ("1500ms", Duration::from_millis(1500)),
            ("1m30s", Duration::from_secs(90)),
            ("0.5s", Duration::from_millis(500)),
            ("2", Duration::from_secs(2)),
            ("0.25", Duration::from_millis(250)),
            ("24h", Duration::from_secs(86_400)),
            ("1d", Duration::from_secs(86_400)),
            ("10us", Duration::from_micros(10)),
            ("7ns", Duration::from_nanos(7)),
        ];
        for (text, d) in ok {
            assert_eq!(parse_duration(text), Ok(d), "{text}");
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
        for bad in ["", "s", "2x", "-1s", "1.2.3s", "-5", "1e300s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(format_duration(Duration::from_secs(86_400)), "24h");
        assert_eq!(format_duration(Duration::from_secs(7200)), "2h");
        assert_eq!(format_duration(Duration::from_secs(100)), "100s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::from_nanos(7)), "7ns");
        assert_eq!(format_duration(Duration::ZERO), "0s");
    }

    #[test]
    fn check_names_the_first_value_not_allowed() {
        let params = [
            Param::new("a", "A.", "1 to 2", true),
            Param::new("b", "B.", "3 to 4", false),
            Param::new("c", "C.", "5 to 6", false),
        ];
        let e = check(&params).unwrap_err();
        assert_eq!((e.key, e.allowed), ("b", "3 to 4"));
        assert_eq!(e.to_string(), "invalid value for `b`: allowed 3 to 4");
        assert_eq!(check(&params[..1]), Ok(()));
    }
}

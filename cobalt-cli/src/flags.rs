//! Validation of the numeric flags every command shares, so that no value (`inf`,
//! `nan`, `-1`, `1e300`) reaches a conversion that could panic: a bad value is a usage
//! error (exit code 2) that names the flag and the allowed range.

use std::time::Duration;

/// Largest number of seconds any duration flag accepts (about 11.5 days).
pub const MAX_SECONDS: f64 = 1e6;

/// Converts a seconds flag into a duration: finite, not negative, at most
/// [`MAX_SECONDS`], and above zero unless `allow_zero`.
pub fn seconds(name: &str, v: f64, allow_zero: bool) -> Result<Duration, String> {
    if !v.is_finite() || v < 0.0 || (!allow_zero && v == 0.0) || v > MAX_SECONDS {
        let low = if allow_zero { "0" } else { "above 0" };
        return Err(format!(
            "invalid --{name} {v:?}: expected a number of seconds from {low} to {MAX_SECONDS}"
        ));
    }
    Ok(Duration::from_secs_f64(v))
}

/// `--timeout` of the request commands, as clap parses it: seconds from 0 (no overall
/// limit) to [`MAX_SECONDS`].
pub fn timeout(v: &str) -> Result<f64, String> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|n| seconds("timeout", *n, true).is_ok())
        .ok_or_else(|| {
            format!("expected a number of seconds from 0 (no overall limit) to {MAX_SECONDS}")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_validation() {
        assert!(seconds("d", 0.0, false).is_err());
        assert!(seconds("d", 0.0, true).is_ok());
        for bad in [f64::NAN, f64::INFINITY, -1.0, 1e300, MAX_SECONDS * 2.0] {
            let e = seconds("d", bad, true).unwrap_err();
            assert!(e.starts_with("invalid --d"), "{e}");
        }
        assert_eq!(
            seconds("d", 1.5, false).unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(timeout("2.5"), Ok(2.5));
        assert_eq!(timeout("0"), Ok(0.0));
        for bad in ["inf", "NaN", "-1", "1e300", "abc", ""] {
            assert!(timeout(bad).is_err(), "{bad}");
        }
    }
}

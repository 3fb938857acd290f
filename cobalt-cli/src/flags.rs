//! Parsing and validation of flag values the commands share — seconds, hex bytes,
//! Content-Formats, CoAP options — so that no value (`inf`, `nan`, `-1`, `1e300`, a
//! number out of range) reaches a conversion that could panic: a bad value is a usage
//! error (exit code 2) that names the flag and the allowed range.

use cobalt::proto::message::{content_format, option, Token, MAX_TOKEN_LEN};
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

/// `--wait` of the request commands: seconds above 0, with or without a trailing `s`
/// (`3`, `3s`, `0.5s`).
pub fn wait(v: &str) -> Result<Duration, String> {
    let v = v.trim();
    v.strip_suffix('s')
        .unwrap_or(v)
        .parse::<f64>()
        .map_err(|_| format!("expected a number of seconds above 0 (`3` or `3s`), not {v:?}"))
        .and_then(|n| seconds("wait", n, false))
}

/// `--leisure` of `cobalt serve`: seconds from 0, with or without a trailing `s`.
pub fn leisure(v: &str) -> Result<Duration, String> {
    let v = v.trim();
    v.strip_suffix('s')
        .unwrap_or(v)
        .parse::<f64>()
        .map_err(|_| format!("expected a number of seconds from 0 (`1` or `0.5s`), not {v:?}"))
        .and_then(|n| seconds("leisure", n, true))
}

/// Bytes written as hex digits, with or without `0x` (`--etag`, `--if-match`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hex(pub Vec<u8>);

/// Parses [`Hex`]; an empty string is no bytes.
pub fn hex(v: &str) -> Result<Hex, String> {
    let digits = v
        .strip_prefix("0x")
        .or_else(|| v.strip_prefix("0X"))
        .unwrap_or(v);
    if !digits.len().is_multiple_of(2) {
        return Err("expected an even number of hex digits, e.g. 0x1f2e".into());
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| {
            digits
                .get(i..i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()
        .map(Hex)
        .ok_or_else(|| format!("`{v}` is not hexadecimal, e.g. 0x1f2e"))
}

/// Parses a token (`--token`): hex digits as for [`hex`], at most
/// [`MAX_TOKEN_LEN`] bytes.
pub fn token(v: &str) -> Result<Token, String> {
    let Hex(bytes) = hex(v)?;
    Token::new(&bytes).ok_or_else(|| {
        format!(
            "a token has at most {MAX_TOKEN_LEN} bytes, this one {}",
            bytes.len()
        )
    })
}

/// Parses a Content-Format flag (`-t`, `-A`): a number from 0 to 65535 or a media type
/// from the IANA registry.
pub fn content_format(v: &str) -> Result<u16, String> {
    if let Some(n) = content_format::parse(v) {
        return Ok(n);
    }
    if v.trim().parse::<i128>().is_ok() {
        return Err(format!(
            "{v} is out of range: a Content-Format is 0 to 65535"
        ));
    }
    let names: Vec<&str> = content_format::REGISTRY
        .iter()
        .filter_map(|(_, m)| m.split(';').next()?.split_once('/').map(|(_, sub)| sub))
        .collect();
    Err(format!(
        "unknown Content-Format `{v}`: use a number (0 to 65535) or a media type such as {}",
        names.join(", ")
    ))
}

/// A CoAP option given on the command line (`-O NUM,VALUE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawOption {
    /// The option number.
    pub number: u16,
    /// Its encoded value.
    pub value: Vec<u8>,
}

/// Parses `-O NUM,VALUE` (or `NAME,VALUE`, e.g. `Max-Age,60`), like libcoap's `-O`:
/// VALUE `0x` and hex digits is bytes, a decimal number for an option of uint format
/// is that number encoded, anything else is its text; `NUM` alone is an empty value.
pub fn coap_option(v: &str) -> Result<RawOption, String> {
    let (key, value) = v.split_once(',').unwrap_or((v, ""));
    let key = key.trim();
    let number = match key.parse::<u32>() {
        Ok(n) => u16::try_from(n)
            .map_err(|_| format!("option number {n} is out of range: 0 to 65535"))?,
        Err(_) => option::KNOWN_OPTIONS
            .iter()
            .find(|d| d.name.eq_ignore_ascii_case(key))
            .map(|d| d.number)
            .ok_or_else(|| {
                format!("unknown option `{key}`: use its number, e.g. -O 2049,text, or a name such as Max-Age")
            })?,
    };
    let uint = option::option_def(number).is_some_and(|d| d.format == option::OptionFormat::Uint);
    let value = if value.starts_with("0x") || value.starts_with("0X") {
        hex(value)?.0
    } else if let (true, Ok(n)) = (uint, value.parse::<u32>()) {
        option::encode_uint(n)
    } else {
        value.as_bytes().to_vec()
    };
    if value.len() > 1034 {
        return Err(format!(
            "the value of option {number} is longer than 1034 bytes"
        ));
    }
    Ok(RawOption { number, value })
}

/// An address to listen on, as `--bind` takes it: an IP address, an IPv6 address
/// with a zone (`fe80::1%eth0`, RFC 4007), or a host name (its first address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindAddr {
    /// The address.
    pub ip: std::net::IpAddr,
    /// The IPv6 zone (interface index); 0 without one.
    pub scope_id: u32,
}

impl BindAddr {
    /// The socket address of `port` on this address (with its zone).
    pub fn with_port(self, port: u16) -> std::net::SocketAddr {
        match self.ip {
            std::net::IpAddr::V6(ip) => {
                std::net::SocketAddrV6::new(ip, port, 0, self.scope_id).into()
            }
            ip => std::net::SocketAddr::new(ip, port),
        }
    }
}

/// Parses [`BindAddr`], resolving a host name or zone name.
pub fn bind_addr(v: &str) -> Result<BindAddr, String> {
    if let Ok(ip) = v.parse() {
        return Ok(BindAddr { ip, scope_id: 0 });
    }
    let addr = std::net::ToSocketAddrs::to_socket_addrs(&(v, 0))
        .map_err(|e| format!("cannot resolve `{v}`: {e}"))?
        .next()
        .ok_or_else(|| format!("`{v}` has no address"))?;
    let scope_id = match addr {
        std::net::SocketAddr::V6(a) => a.scope_id(),
        _ => 0,
    };
    Ok(BindAddr {
        ip: addr.ip(),
        scope_id,
    })
}

/// Parses `HOST:PORT` (a host name, an IP address, `[IPv6%zone]:PORT`) into its first
/// socket address (`--metrics`).
pub fn host_port(v: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    v.to_socket_addrs()
        .map_err(|e| format!("cannot resolve `{v}` (expected HOST:PORT): {e}"))?
        .next()
        .ok_or_else(|| format!("`{v}` has no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_waits_take_seconds_with_or_without_a_unit() {
        assert_eq!(wait("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(wait("0.5"), Ok(Duration::from_millis(500)));
        assert!(wait("0").is_err());
        assert!(wait("-1s").is_err());
        assert!(wait("nan").is_err());
        assert!(wait("3ms").is_err());
        assert_eq!(leisure("0"), Ok(Duration::ZERO));
        assert_eq!(leisure("0.25s"), Ok(Duration::from_millis(250)));
        assert!(leisure("inf").is_err());
    }

    #[test]
    fn binds_take_names_zones_and_addresses() {
        let b = bind_addr("127.0.0.1").unwrap();
        assert_eq!(b.with_port(5683), "127.0.0.1:5683".parse().unwrap());
        let b = bind_addr("localhost").unwrap();
        assert!(b.ip.is_loopback(), "{b:?}");
        let b = bind_addr("::1").unwrap();
        assert_eq!(b.with_port(1), "[::1]:1".parse().unwrap());
        // The loopback interface's zone by name: lo is index 1 on Linux.
        let b = bind_addr("fe80::1%lo").unwrap();
        assert_eq!(b.scope_id, 1, "{b:?}");
        match b.with_port(7) {
            std::net::SocketAddr::V6(a) => assert_eq!((a.port(), a.scope_id()), (7, 1)),
            other => panic!("{other}"),
        }
        assert!(bind_addr("no.such.host.invalid").is_err());
        assert_eq!(host_port("localhost:9100").map(|a| a.port()), Ok(9100));
        assert!(host_port("127.0.0.1").is_err());
    }

    #[test]
    fn tokens_are_hex_of_any_length_up_to_the_rfc_8974_maximum() {
        assert_eq!(token("0x0102").unwrap().as_bytes(), &[1, 2]);
        let long = token(&"ab".repeat(40)).unwrap();
        assert_eq!((long.len(), long.is_extended()), (40, true));
        assert!(token("0x123").unwrap_err().contains("even number"));
        assert!(token("zz").unwrap_err().contains("not hexadecimal"));
        let too_long = "00".repeat(MAX_TOKEN_LEN + 1);
        assert_eq!(
            token(&too_long).unwrap_err(),
            "a token has at most 65804 bytes, this one 65805"
        );
    }

    #[test]
    fn hex_content_formats_and_options() {
        assert_eq!(hex("0x01ff"), Ok(Hex(vec![1, 0xff])));
        assert_eq!(hex("abcd"), Ok(Hex(vec![0xab, 0xcd])));
        assert_eq!(hex(""), Ok(Hex(vec![])));
        for bad in ["0x1", "zz", "0xgg"] {
            assert!(hex(bad).is_err(), "{bad}");
        }
        assert_eq!(content_format("senml+cbor"), Ok(112));
        assert_eq!(content_format("65535"), Ok(65535));
        let e = content_format("65536").unwrap_err();
        assert!(e.contains("out of range"), "{e}");
        let e = content_format("nonsense").unwrap_err();
        assert!(e.contains("senml+json") && e.contains("cbor"), "{e}");
        let o = |n: u16, v: &[u8]| {
            Ok(RawOption {
                number: n,
                value: v.to_vec(),
            })
        };
        assert_eq!(coap_option("14,60"), o(14, &[60]));
        assert_eq!(coap_option("max-age,300"), o(14, &[1, 44]));
        assert_eq!(coap_option("2049,hello"), o(2049, b"hello"));
        assert_eq!(coap_option("4,0x0102"), o(4, &[1, 2]));
        assert_eq!(coap_option("5"), o(5, &[]));
        assert_eq!(coap_option("Uri-Query,a=1"), o(15, b"a=1"));
        for bad in ["65536,x", "-1,x", "Nope,1", "4,0xz", "1e300,x"] {
            assert!(coap_option(bad).is_err(), "{bad}");
        }
    }

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

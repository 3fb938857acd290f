//! The few CBOR items OSCORE's and EDHOC's fixed structures need (RFC 8949 §3): byte
//! and text strings, arrays, maps, small integers, booleans and null, written by hand
//! into a buffer.

/// Writes a major type with its argument (`major` in the top three bits).
fn head(out: &mut Vec<u8>, major: u8, argument: usize) {
    let major = major << 5;
    match argument {
        0..=23 => out.push(major | argument as u8),
        24..=0xff => out.extend_from_slice(&[major | 24, argument as u8]),
        0x100..=0xffff => {
            out.push(major | 25);
            out.extend_from_slice(&(argument as u16).to_be_bytes());
        }
        _ => {
            out.push(major | 26);
            out.extend_from_slice(&(argument as u32).to_be_bytes());
        }
    }
}

/// A byte string.
pub(crate) fn bytes(out: &mut Vec<u8>, value: &[u8]) {
    head(out, 2, value.len());
    out.extend_from_slice(value);
}

/// A text string.
pub(crate) fn text(out: &mut Vec<u8>, value: &str) {
    head(out, 3, value.len());
    out.extend_from_slice(value.as_bytes());
}

/// The head of an array of `len` items (the items follow).
pub(crate) fn array(out: &mut Vec<u8>, len: usize) {
    head(out, 4, len);
}

/// The head of a map of `len` pairs (the keys and values follow).
pub(crate) fn map(out: &mut Vec<u8>, len: usize) {
    head(out, 5, len);
}

/// The simple value true or false.
pub(crate) fn boolean(out: &mut Vec<u8>, value: bool) {
    out.push(if value { 0xf5 } else { 0xf4 });
}

/// An integer (negative ones as major type 1).
pub(crate) fn int(out: &mut Vec<u8>, value: i64) {
    if value >= 0 {
        head(out, 0, value as usize);
    } else {
        head(out, 1, (-1 - value) as usize);
    }
}

/// The simple value null.
pub(crate) fn null(out: &mut Vec<u8>) {
    out.push(0xf6);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_encode_as_rfc_8949_says() {
        let mut out = Vec::new();
        array(&mut out, 3);
        text(&mut out, "IV");
        bytes(&mut out, &[0x01]);
        int(&mut out, 10);
        int(&mut out, -10);
        null(&mut out);
        map(&mut out, 1);
        boolean(&mut out, true);
        bytes(&mut out, &[0; 30]);
        int(&mut out, 1000);
        assert_eq!(
            &out[..13],
            &[0x83, 0x62, b'I', b'V', 0x41, 0x01, 0x0a, 0x29, 0xf6, 0xa1, 0xf5, 0x58, 30]
        );
        assert_eq!(&out[out.len() - 3..], &[0x19, 0x03, 0xe8]);
    }
}

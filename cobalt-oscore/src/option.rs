//! The value of the OSCORE option (RFC 8613 §6.1): flag bits, Partial IV, kid
//! context and kid.

use crate::context::MAX_PIV_LEN;

/// CoAP option number of OSCORE (RFC 8613 §2).
pub const OSCORE: u16 = 9;

/// CoAP option number of EDHOC (RFC 9668 §3.1): the request is an EDHOC + OSCORE
/// combined request, its payload EDHOC message_3 followed by the OSCORE ciphertext.
/// Critical, empty.
pub const EDHOC: u16 = 21;

/// Flag bit: a kid follows.
const KID: u8 = 0x08;
/// Flag bit: a kid context follows.
const KID_CONTEXT: u8 = 0x10;
/// The low three bits: the Partial IV's length.
const PIV_LEN: u8 = 0x07;

/// The decoded OSCORE option: the compressed COSE header (RFC 8613 §6.1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OscoreOption {
    /// The Partial IV (empty when absent).
    pub partial_iv: Vec<u8>,
    /// The kid context, if present.
    pub kid_context: Option<Vec<u8>>,
    /// The kid (the sender's ID), if present.
    pub kid: Option<Vec<u8>>,
}

/// Why an OSCORE option value is malformed (answered 4.02 Bad Option, RFC 8613 §8.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    /// Reserved flag bits are set, or the Partial IV length is 6 or 7.
    #[error("the OSCORE option sets reserved flag bits or a Partial IV over 5 bytes")]
    Reserved,
    /// The value ends before what its flags announce.
    #[error("the OSCORE option is shorter than its flags announce")]
    Truncated,
    /// Bytes after a value without a kid.
    #[error("the OSCORE option has bytes beyond what its flags announce")]
    Trailing,
}

impl OscoreOption {
    /// The option value (empty when nothing is set, as in most responses).
    pub fn encode(&self) -> Vec<u8> {
        let mut flags = self.partial_iv.len() as u8 & PIV_LEN;
        if self.kid.is_some() {
            flags |= KID;
        }
        if self.kid_context.is_some() {
            flags |= KID_CONTEXT;
        }
        if flags == 0 {
            return Vec::new();
        }
        let mut out = vec![flags];
        out.extend_from_slice(&self.partial_iv);
        if let Some(context) = &self.kid_context {
            out.push(context.len() as u8);
            out.extend_from_slice(context);
        }
        if let Some(kid) = &self.kid {
            out.extend_from_slice(kid);
        }
        out
    }

    /// Reads an option value.
    pub fn decode(value: &[u8]) -> Result<OscoreOption, OptionError> {
        let Some((&flags, mut rest)) = value.split_first() else {
            return Ok(OscoreOption::default());
        };
        let piv_len = usize::from(flags & PIV_LEN);
        if flags & 0xe0 != 0 || piv_len > MAX_PIV_LEN {
            return Err(OptionError::Reserved);
        }
        let partial_iv = take(&mut rest, piv_len)?.to_vec();
        let kid_context = if flags & KID_CONTEXT != 0 {
            let (&len, tail) = rest.split_first().ok_or(OptionError::Truncated)?;
            rest = tail;
            Some(take(&mut rest, usize::from(len))?.to_vec())
        } else {
            None
        };
        let kid = if flags & KID != 0 {
            Some(std::mem::take(&mut rest).to_vec())
        } else {
            None
        };
        if !rest.is_empty() {
            return Err(OptionError::Trailing);
        }
        Ok(OscoreOption {
            partial_iv,
            kid_context,
            kid,
        })
    }
}

/// The first `n` bytes of `rest`, which then starts after them.
fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8], OptionError> {
    if rest.len() < n {
        return Err(OptionError::Truncated);
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_8613_examples_round_trip() {
        // §6.3 / Appendix C: Partial IV 0x14 and an empty kid; a kid context; nothing.
        let cases: [(&[u8], OscoreOption); 3] = [
            (
                &[0x09, 0x14],
                OscoreOption {
                    partial_iv: vec![0x14],
                    kid: Some(vec![]),
                    kid_context: None,
                },
            ),
            (
                &[
                    0x19, 0x14, 0x08, 0x37, 0xcb, 0xf3, 0x21, 0x00, 0x17, 0xa2, 0xd3,
                ],
                OscoreOption {
                    partial_iv: vec![0x14],
                    kid: Some(vec![]),
                    kid_context: Some(vec![0x37, 0xcb, 0xf3, 0x21, 0x00, 0x17, 0xa2, 0xd3]),
                },
            ),
            (&[], OscoreOption::default()),
        ];
        for (wire, option) in cases {
            assert_eq!(OscoreOption::decode(wire).unwrap(), option);
            assert_eq!(option.encode(), wire);
        }
    }

    #[test]
    fn malformed_values_are_refused() {
        assert_eq!(OscoreOption::decode(&[0x20]), Err(OptionError::Reserved));
        assert_eq!(
            OscoreOption::decode(&[0x06, 1, 2, 3, 4, 5, 6]),
            Err(OptionError::Reserved)
        );
        assert_eq!(
            OscoreOption::decode(&[0x02, 1]),
            Err(OptionError::Truncated)
        );
        assert_eq!(
            OscoreOption::decode(&[0x11, 1, 4, 1]),
            Err(OptionError::Truncated)
        );
        assert_eq!(
            OscoreOption::decode(&[0x01, 1, 2]),
            Err(OptionError::Trailing)
        );
    }
}

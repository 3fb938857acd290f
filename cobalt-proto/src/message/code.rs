//! Message types and codes (RFC 7252 §3, §12.1).

use std::fmt;

/// The message type carried in the header's T field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageType {
    /// Confirmable: retransmitted until acknowledged.
    Confirmable,
    /// Non-confirmable: sent once.
    NonConfirmable,
    /// Acknowledgement of a confirmable message.
    Acknowledgement,
    /// Reset: the receiver could not process a message.
    Reset,
}

impl MessageType {
    /// Decodes the two-bit T field.
    pub fn from_bits(bits: u8) -> MessageType {
        match bits & 0b11 {
            0 => MessageType::Confirmable,
            1 => MessageType::NonConfirmable,
            2 => MessageType::Acknowledgement,
            _ => MessageType::Reset,
        }
    }

    /// The two-bit T field.
    pub fn bits(self) -> u8 {
        match self {
            MessageType::Confirmable => 0,
            MessageType::NonConfirmable => 1,
            MessageType::Acknowledgement => 2,
            MessageType::Reset => 3,
        }
    }

    /// Short name as used in logs: CON, NON, ACK, RST.
    pub fn short_name(self) -> &'static str {
        match self {
            MessageType::Confirmable => "CON",
            MessageType::NonConfirmable => "NON",
            MessageType::Acknowledgement => "ACK",
            MessageType::Reset => "RST",
        }
    }
}

/// A message code: 3-bit class and 5-bit detail, written `c.dd`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Code(pub u8);

impl Code {
    /// 0.00: an empty message.
    pub const EMPTY: Code = Code(0x00);
    /// 0.01 GET.
    pub const GET: Code = Code(0x01);
    /// 0.02 POST.
    pub const POST: Code = Code(0x02);
    /// 0.03 PUT.
    pub const PUT: Code = Code(0x03);
    /// 0.04 DELETE.
    pub const DELETE: Code = Code(0x04);
    /// 0.05 FETCH (RFC 8132).
    pub const FETCH: Code = Code(0x05);
    /// 0.06 PATCH (RFC 8132).
    pub const PATCH: Code = Code(0x06);
    /// 0.07 iPATCH (RFC 8132).
    pub const IPATCH: Code = Code(0x07);
    /// 2.01 Created.
    pub const CREATED: Code = Code::new(2, 1);
    /// 2.02 Deleted.
    pub const DELETED: Code = Code::new(2, 2);
    /// 2.03 Valid.
    pub const VALID: Code = Code::new(2, 3);
    /// 2.04 Changed.
    pub const CHANGED: Code = Code::new(2, 4);
    /// 2.05 Content.
    pub const CONTENT: Code = Code::new(2, 5);
    /// 2.31 Continue (RFC 7959).
    pub const CONTINUE: Code = Code::new(2, 31);
    /// 4.00 Bad Request.
    pub const BAD_REQUEST: Code = Code::new(4, 0);
    /// 4.01 Unauthorized.
    pub const UNAUTHORIZED: Code = Code::new(4, 1);
    /// 4.02 Bad Option.
    pub const BAD_OPTION: Code = Code::new(4, 2);
    /// 4.03 Forbidden.
    pub const FORBIDDEN: Code = Code::new(4, 3);
    /// 4.04 Not Found.
    pub const NOT_FOUND: Code = Code::new(4, 4);
    /// 4.05 Method Not Allowed.
    pub const METHOD_NOT_ALLOWED: Code = Code::new(4, 5);
    /// 4.06 Not Acceptable.
    pub const NOT_ACCEPTABLE: Code = Code::new(4, 6);
    /// 4.08 Request Entity Incomplete (RFC 7959).
    pub const REQUEST_ENTITY_INCOMPLETE: Code = Code::new(4, 8);
    /// 4.12 Precondition Failed.
    pub const PRECONDITION_FAILED: Code = Code::new(4, 12);
    /// 4.13 Request Entity Too Large.
    pub const REQUEST_ENTITY_TOO_LARGE: Code = Code::new(4, 13);
    /// 4.15 Unsupported Content-Format.
    pub const UNSUPPORTED_CONTENT_FORMAT: Code = Code::new(4, 15);
    /// 4.29 Too Many Requests (RFC 8516).
    pub const TOO_MANY_REQUESTS: Code = Code::new(4, 29);
    /// 5.00 Internal Server Error.
    pub const INTERNAL_SERVER_ERROR: Code = Code::new(5, 0);
    /// 5.01 Not Implemented.
    pub const NOT_IMPLEMENTED: Code = Code::new(5, 1);
    /// 5.02 Bad Gateway.
    pub const BAD_GATEWAY: Code = Code::new(5, 2);
    /// 5.03 Service Unavailable.
    pub const SERVICE_UNAVAILABLE: Code = Code::new(5, 3);
    /// 5.04 Gateway Timeout.
    pub const GATEWAY_TIMEOUT: Code = Code::new(5, 4);
    /// 5.05 Proxying Not Supported.
    pub const PROXYING_NOT_SUPPORTED: Code = Code::new(5, 5);

    /// Builds a code from its class (0–7) and detail (0–31).
    pub const fn new(class: u8, detail: u8) -> Code {
        Code(((class & 0x7) << 5) | (detail & 0x1f))
    }

    /// The class (the `c` in `c.dd`).
    pub fn class(self) -> u8 {
        self.0 >> 5
    }

    /// The detail (the `dd` in `c.dd`).
    pub fn detail(self) -> u8 {
        self.0 & 0x1f
    }

    /// True for 0.00.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// True for a request code (class 0, detail 1–31).
    pub fn is_request(self) -> bool {
        self.class() == 0 && self.detail() != 0
    }

    /// True for a response code (classes 2–5).
    pub fn is_response(self) -> bool {
        (2..=5).contains(&self.class())
    }

    /// True for a success response (2.xx).
    pub fn is_success(self) -> bool {
        self.class() == 2
    }

    /// True for RFC 8323 signaling codes (7.xx).
    pub fn is_signaling(self) -> bool {
        self.class() == 7
    }

    /// The method name of a request code, or the reason phrase of a response code.
    pub fn name(self) -> &'static str {
        match self {
            Code::EMPTY => "Empty",
            Code::GET => "GET",
            Code::POST => "POST",
            Code::PUT => "PUT",
            Code::DELETE => "DELETE",
            Code::FETCH => "FETCH",
            Code::PATCH => "PATCH",
            Code::IPATCH => "iPATCH",
            Code::CREATED => "Created",
            Code::DELETED => "Deleted",
            Code::VALID => "Valid",
            Code::CHANGED => "Changed",
            Code::CONTENT => "Content",
            Code::CONTINUE => "Continue",
            Code::BAD_REQUEST => "Bad Request",
            Code::UNAUTHORIZED => "Unauthorized",
            Code::BAD_OPTION => "Bad Option",
            Code::FORBIDDEN => "Forbidden",
            Code::NOT_FOUND => "Not Found",
            Code::METHOD_NOT_ALLOWED => "Method Not Allowed",
            Code::NOT_ACCEPTABLE => "Not Acceptable",
            Code::REQUEST_ENTITY_INCOMPLETE => "Request Entity Incomplete",
            Code::PRECONDITION_FAILED => "Precondition Failed",
            Code::REQUEST_ENTITY_TOO_LARGE => "Request Entity Too Large",
            Code::UNSUPPORTED_CONTENT_FORMAT => "Unsupported Content-Format",
            Code::TOO_MANY_REQUESTS => "Too Many Requests",
            Code::INTERNAL_SERVER_ERROR => "Internal Server Error",
            Code::NOT_IMPLEMENTED => "Not Implemented",
            Code::BAD_GATEWAY => "Bad Gateway",
            Code::SERVICE_UNAVAILABLE => "Service Unavailable",
            Code::GATEWAY_TIMEOUT => "Gateway Timeout",
            Code::PROXYING_NOT_SUPPORTED => "Proxying Not Supported",
            _ => "Unknown",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_request() {
            write!(f, "{}", self.name())
        } else {
            write!(f, "{}.{:02} {}", self.class(), self.detail(), self.name())
        }
    }
}

impl fmt::Debug for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:02}", self.class(), self.detail())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_and_detail() {
        assert_eq!(Code::CONTENT.0, 0x45);
        assert_eq!(Code::NOT_FOUND.0, 0x84);
        assert_eq!(Code::SERVICE_UNAVAILABLE.class(), 5);
        assert_eq!(Code::SERVICE_UNAVAILABLE.detail(), 3);
        assert!(Code::GET.is_request());
        assert!(!Code::EMPTY.is_request());
        assert!(Code::CHANGED.is_response());
        assert_eq!(Code::CONTENT.to_string(), "2.05 Content");
        assert_eq!(Code::POST.to_string(), "POST");
    }

    #[test]
    fn type_bits_round_trip() {
        for b in 0..4 {
            assert_eq!(MessageType::from_bits(b).bits(), b);
        }
    }
}

//! The directory's answers to requests it refuses, and its storage errors.

use cobalt::proto::message::option::number;
use cobalt::{Code, Response};

/// A refused request: the RFC's response code, a diagnostic payload saying what was
/// wrong and what to do, and the Max-Age (5.03) or Size1 (4.13) that goes with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct RdError {
    /// The response code.
    pub code: Code,
    /// The diagnostic payload.
    pub message: String,
    /// Seconds after which a retry may succeed (sent as Max-Age with a 5.03).
    pub max_age: Option<u32>,
    /// The largest body accepted (sent as Size1 with a 4.13).
    pub size1: Option<usize>,
}

impl RdError {
    fn new(code: Code, message: String) -> RdError {
        RdError {
            code,
            message,
            max_age: None,
            size1: None,
        }
    }

    /// 4.00 Bad Request.
    pub fn bad_request(message: String) -> RdError {
        RdError::new(Code::BAD_REQUEST, message)
    }

    /// 4.03 Forbidden.
    pub fn forbidden(message: String) -> RdError {
        RdError::new(Code::FORBIDDEN, message)
    }

    /// 4.04 Not Found.
    pub fn not_found(message: String) -> RdError {
        RdError::new(Code::NOT_FOUND, message)
    }

    /// 4.13 Request Entity Too Large, with the largest accepted size.
    pub fn too_large(message: String, size1: usize) -> RdError {
        RdError {
            size1: Some(size1),
            ..RdError::new(Code::REQUEST_ENTITY_TOO_LARGE, message)
        }
    }

    /// 5.03 Service Unavailable, to be retried after `max_age` seconds.
    pub fn unavailable(message: String, max_age: u32) -> RdError {
        RdError {
            max_age: Some(max_age),
            ..RdError::new(Code::SERVICE_UNAVAILABLE, message)
        }
    }

    /// 5.00 Internal Server Error.
    pub fn internal(message: String) -> RdError {
        RdError::new(Code::INTERNAL_SERVER_ERROR, message)
    }

    /// The CoAP response that carries it.
    pub fn into_response(self) -> Response {
        let mut r = Response::new(self.code).with_payload(self.message);
        if let Some(age) = self.max_age {
            r = r.with_max_age(age);
        }
        if let Some(size) = self.size1 {
            let size = u32::try_from(size).unwrap_or(u32::MAX);
            r.options.set_uint(number::SIZE1, size);
        }
        r
    }
}

/// A registration store that failed to read or write.
#[derive(Debug, thiserror::Error)]
#[error("registration store: {0}")]
pub struct StoreError(pub String);

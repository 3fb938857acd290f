//! What answers a request: a [`Response`] (code, options, payload), made from anything
//! [`IntoResponse`]. Handlers return it, and the client hands it back.

use cobalt_proto::message::{content_format, opt, Code, Message, Options};

/// A response: code, options and payload. Type, MID and token are set by the endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Response code.
    pub code: Code,
    /// Options.
    pub options: Options,
    /// Payload.
    pub payload: Vec<u8>,
}

impl Response {
    /// A response with a code and nothing else.
    pub fn new(code: Code) -> Response {
        Response {
            code,
            options: Options::new(),
            payload: Vec::new(),
        }
    }

    /// 2.05 Content with a payload.
    pub fn content(payload: impl Into<Vec<u8>>) -> Response {
        Response::new(Code::CONTENT).with_payload(payload)
    }

    /// 2.05 Content, text/plain.
    pub fn text(text: impl Into<String>) -> Response {
        Response::content(text.into().into_bytes()).with_content_format(content_format::TEXT_PLAIN)
    }

    /// 2.01 Created with a Location-Path (and Location-Query after `?`).
    pub fn created(location: &str) -> Response {
        let mut r = Response::new(Code::CREATED);
        let (path, query) = location.split_once('?').unwrap_or((location, ""));
        for seg in path.split('/').filter(|s| !s.is_empty()) {
            r.options.push(opt::LOCATION_PATH, seg.as_bytes());
        }
        for q in query.split('&').filter(|s| !s.is_empty()) {
            r.options.push(opt::LOCATION_QUERY, q.as_bytes());
        }
        r
    }

    /// Sets the payload.
    pub fn with_payload(mut self, payload: impl Into<Vec<u8>>) -> Response {
        self.payload = payload.into();
        self
    }

    /// Sets Content-Format.
    pub fn with_content_format(mut self, cf: u16) -> Response {
        self.options.set_uint(opt::CONTENT_FORMAT, u32::from(cf));
        self
    }

    /// Sets Max-Age in seconds.
    pub fn with_max_age(mut self, seconds: u32) -> Response {
        self.options.set_uint(opt::MAX_AGE, seconds);
        self
    }

    /// Sets an ETag.
    pub fn with_etag(mut self, etag: &[u8]) -> Response {
        self.options.set(opt::ETAG, etag);
        self
    }

    /// Sets an arbitrary option value (replacing earlier ones).
    pub fn with_option(mut self, number: u16, value: impl AsRef<[u8]>) -> Response {
        self.options.set(number, value);
        self
    }

    /// The payload as UTF-8 text (lossy).
    pub fn text_payload(&self) -> String {
        String::from_utf8_lossy(&self.payload).into_owned()
    }

    /// Converts into a message for the endpoint.
    pub fn into_message(self) -> Message {
        let mut m = Message::new(
            cobalt_proto::message::MessageType::Acknowledgement,
            self.code,
            0,
        );
        m.options = self.options;
        m.payload = self.payload;
        m
    }

    /// Builds from a received message.
    pub fn from_message(m: Message) -> Response {
        Response {
            code: m.code,
            options: m.options,
            payload: m.payload,
        }
    }
}

/// Anything a handler may return.
pub trait IntoResponse {
    /// Converts into a response.
    fn into_response(self) -> Response;
}

impl IntoResponse for Response {
    fn into_response(self) -> Response {
        self
    }
}

impl IntoResponse for &'static str {
    fn into_response(self) -> Response {
        Response::text(self)
    }
}

impl IntoResponse for String {
    fn into_response(self) -> Response {
        Response::text(self)
    }
}

impl IntoResponse for Vec<u8> {
    fn into_response(self) -> Response {
        Response::content(self).with_content_format(content_format::OCTET_STREAM)
    }
}

impl IntoResponse for Code {
    fn into_response(self) -> Response {
        Response::new(self)
    }
}

impl<T: IntoResponse> IntoResponse for (Code, T) {
    fn into_response(self) -> Response {
        let mut r = self.1.into_response();
        r.code = self.0;
        r
    }
}

impl<T: IntoResponse, E: IntoResponse> IntoResponse for Result<T, E> {
    fn into_response(self) -> Response {
        match self {
            Ok(t) => t.into_response(),
            Err(e) => e.into_response(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions() {
        let r = "hi".into_response();
        assert_eq!((r.code, r.payload.as_slice()), (Code::CONTENT, &b"hi"[..]));
        assert_eq!(r.options.content_format(), Some(0));
        let r = (Code::CHANGED, "ok").into_response();
        assert_eq!(r.code, Code::CHANGED);
        let r: Result<&str, Code> = Err(Code::NOT_FOUND);
        assert_eq!(r.into_response().code, Code::NOT_FOUND);
        let r = Response::created("/a/b?x=1");
        assert_eq!(r.options.location_path_string().as_deref(), Some("/a/b"));
    }
}

//! One log line per answered request.

use crate::server::{Layer, Request, Response};
use std::time::Instant;

/// Logs every request that reaches routing when its answer is ready, at `debug`
/// level under the target `cobalt::access` (`cobalt serve --log-level debug`): peer,
/// its PSK identity or certificate subject when it proved one, method, path, code and
/// the microseconds from the layer to the answer. Costs one check of the log level
/// per request while that target is off.
///
/// ```
/// use cobalt::server::{get, layers::AccessLog, Server};
///
/// let server = Server::new()
///     .layer(AccessLog::new())
///     .route("/hello", get(|| async { "hello" }));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct AccessLog;

/// When the request entered the layer.
#[derive(Debug, Clone, Copy)]
struct Entered(Instant);

impl AccessLog {
    /// The access log.
    pub fn new() -> AccessLog {
        AccessLog
    }
}

impl Layer for AccessLog {
    fn on_request(&self, request: &mut Request) -> Result<(), Response> {
        if tracing::enabled!(target: "cobalt::access", tracing::Level::DEBUG) {
            request.extensions_mut().insert(Entered(Instant::now()));
        }
        Ok(())
    }

    fn on_response(&self, request: &Request, response: &mut Response) {
        let Some(Entered(at)) = request.extensions().get::<Entered>().copied() else {
            return;
        };
        let us = at.elapsed().as_micros();
        let identity = request.identity();
        let who = match (identity.psk_identity(), identity.certificate_subject()) {
            (Some(psk), _) => format!(" psk={}", String::from_utf8_lossy(psk)),
            (_, Some(subject)) => format!(" cert={subject}"),
            _ => String::new(),
        };
        tracing::debug!(
            target: "cobalt::access",
            "{}{who} {} {} {} {us}µs",
            identity.addr(),
            request.method(),
            request.path(),
            response.code
        );
    }
}

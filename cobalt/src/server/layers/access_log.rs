//! One log line per answered request, in both roles.

use crate::server::{Exchange, Layer, Refusal, Request, Response};
use cobalt_proto::message::Message;
use std::time::Instant;

/// Logs at `debug` level under the target `cobalt::access` (`cobalt serve
/// --log-level debug`), in both roles. Costs one check of the log level per request
/// while that target is off.
///
/// - On a server, every request that reaches routing when its answer is ready: peer,
///   its PSK identity or certificate subject when it proved one, method, path, code
///   and the microseconds from the layer to the answer.
/// - On a client, every response and notification as it arrives: scheme, server,
///   method, path, code, the Observe number of a notification, and the microseconds
///   since the request (for a notification: since the registration) went out.
///
/// ```
/// use cobalt::server::{get, layers::AccessLog, Server};
///
/// let server = Server::new()
///     .layer(AccessLog::new())
///     .route("/hello", get(|| async { "hello" }));
/// let client = cobalt::Client::new().layer(AccessLog::new());
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct AccessLog;

/// When the request entered the layer (server) or went out (client).
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

    fn on_send(&self, exchange: &mut Exchange, _: &mut Message) -> Result<(), Refusal> {
        if tracing::enabled!(target: "cobalt::access", tracing::Level::DEBUG) {
            exchange.extensions_mut().insert(Entered(Instant::now()));
        }
        Ok(())
    }

    fn on_receive(
        &self,
        exchange: &mut Exchange,
        request: &Message,
        response: &mut Message,
    ) -> Result<(), Refusal> {
        let Some(Entered(at)) = exchange.extensions().get::<Entered>().copied() else {
            return Ok(());
        };
        let us = at.elapsed().as_micros();
        let observe = match response.options.observe() {
            Some(seq) => format!(" observe={seq}"),
            None => String::new(),
        };
        tracing::debug!(
            target: "cobalt::access",
            "{}://{} {} {} -> {}{observe} {us}µs",
            exchange.scheme(),
            exchange.peer(),
            request.code,
            request.options.uri_path_string(),
            response.code
        );
        Ok(())
    }
}

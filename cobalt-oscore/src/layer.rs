//! OSCORE as a Cobalt [`Layer`], in both roles. A server's layer unprotects each
//! request that carries the OSCORE option before it is routed (the outer message
//! has no Uri-Path), protects its answer with the request's nonce, and protects each
//! notification with a Partial IV of its own; large answers go in inner Block2
//! blocks and inner Block1 uploads are put together before routing. A client's layer protects the requests whose URI matches a context and
//! verifies their answers and notifications.

use crate::context::hex;
use crate::edhoc::{EdhocContext, EdhocResponder};
use crate::option::{OscoreOption, EDHOC, OSCORE};
use crate::security::{RequestBinding, SecurityContext};
use crate::target::UriPattern;
use crate::uploads::{InnerUploads, Step, UploadKey};
use cobalt::proto::blockwise::{slice_asked, BlockSize};
use cobalt::proto::message::block::BlockValue;
use cobalt::proto::message::{opt, Code, Message};
use cobalt::server::{Exchange, Layer, Observer, Refusal, Request, Response};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The SZX of the inner blocks a server slices answers into (512 bytes), small
/// enough that a protected block still fits one 1024-byte outer payload.
const INNER_SZX: u8 = 5;

/// OSCORE for a server (contexts it accepts requests under) and a client (contexts
/// it protects requests with, by URI pattern). One value may serve both roles.
///
/// Block-wise transfers between the end points are inside the protection. A server
/// puts inner Block1 uploads together before routing, and slices answers over 512
/// bytes into inner Block2 blocks by running the handler again for each block the
/// client asks for: right for GET and FETCH, but an answer to another method is not
/// kept, so it must fit one block.
///
/// ```
/// use cobalt::server::{get, Server};
/// use cobalt_oscore::{Material, Oscore, RequireOscore, SecurityContext};
///
/// let material = Material::new(b"0123456789abcdef", b"S", b"C");
/// let server = Server::new()
///     .route("/secret", get(|| async { "42" }).layer(RequireOscore::any()))
///     .layer(Oscore::new().accept(SecurityContext::new(material).unwrap()));
/// ```
#[derive(Debug, Default, Clone)]
pub struct Oscore {
    /// Contexts requests may be protected under (server role).
    accepted: Vec<Arc<SecurityContext>>,
    /// Which requests are protected with which context (client role), first match.
    protected: Vec<Protecting>,
    /// Block1 uploads inside OSCORE being put together (server role).
    uploads: Arc<InnerUploads>,
    /// EDHOC at `/.well-known/edhoc`, and the contexts it made (server role).
    edhoc: Option<Arc<EdhocResponder>>,
}

/// What the OSCORE layer attaches to a request it unprotected (in the request's
/// [`Extensions`](cobalt::server::Extensions)): the context, for authorisation, and
/// what the answer is bound to.
#[derive(Debug, Clone)]
pub struct Protected {
    context: Arc<SecurityContext>,
    binding: RequestBinding,
    /// The inner Block2 option the client asked with.
    block2: Option<BlockValue>,
    /// The last inner Block1 of an upload put together, echoed in the answer.
    block1: Option<BlockValue>,
}

impl Protected {
    /// The context the request was protected under.
    pub fn context(&self) -> &Arc<SecurityContext> {
        &self.context
    }

    /// The name of that context ([`SecurityContext::named`]).
    pub fn context_name(&self) -> &str {
        self.context.name()
    }

    /// The kid of the request (the client's Sender ID).
    pub fn kid(&self) -> &[u8] {
        &self.binding.kid
    }

    /// The OSCORE request that `request` was, if it was one.
    pub fn of(request: &Request) -> Option<&Protected> {
        request.extensions().get::<Protected>()
    }
}

/// A client's context for the requests a pattern matches.
#[derive(Debug, Clone)]
struct Protecting {
    target: UriPattern,
    context: Arc<SecurityContext>,
    /// EDHOC message_3 that the first request carries in front of its OSCORE payload
    /// (the combined request of RFC 9668), until that request takes it.
    message_3: Option<Arc<Mutex<Option<Vec<u8>>>>>,
}

/// What a client keeps of a request it protected, for the answer.
#[derive(Debug, Clone)]
struct Sent {
    context: Arc<SecurityContext>,
    binding: RequestBinding,
    /// The sequence number of the last notification accepted (they must increase).
    last_notification: Option<u64>,
}

impl Oscore {
    /// No contexts yet.
    pub fn new() -> Oscore {
        Oscore::default()
    }

    /// Server role: requests protected under `context` are accepted.
    pub fn accept(mut self, context: impl Into<Arc<SecurityContext>>) -> Oscore {
        self.accepted.push(context.into());
        self
    }

    /// Client role: requests whose URI matches `target` are protected with `context`
    /// (the first pattern that matches wins; requests no pattern matches go plain).
    pub fn protect(
        mut self,
        target: UriPattern,
        context: impl Into<Arc<SecurityContext>>,
    ) -> Oscore {
        self.protected.push(Protecting {
            target,
            context: context.into(),
            message_3: None,
        });
        self
    }

    /// Client role: requests whose URI matches `target` are protected with the
    /// context EDHOC made ([`establish`](crate::edhoc::establish)); when the exchange
    /// ends with a combined request, the first of them carries EDHOC message_3.
    pub fn protect_edhoc(mut self, target: UriPattern, established: EdhocContext) -> Oscore {
        let (context, message_3) = established.into_parts();
        self.protected.push(Protecting {
            target,
            context: Arc::new(context),
            message_3: message_3.map(|m| Arc::new(Mutex::new(Some(m)))),
        });
        self
    }

    /// Whether a client context was given to [`protect`](Self::protect).
    pub(crate) fn protects_any(&self) -> bool {
        !self.protected.is_empty()
    }

    /// Server role: takes EDHOC (RFC 9528) at `/.well-known/edhoc`, and requests
    /// protected under the contexts it makes, also in EDHOC + OSCORE combined requests
    /// (RFC 9668).
    pub fn edhoc(mut self, responder: impl Into<Arc<EdhocResponder>>) -> Oscore {
        self.edhoc = Some(responder.into());
        self
    }

    /// The context a request with this OSCORE option is for: one given to
    /// [`accept`](Self::accept) or one EDHOC made.
    fn find(&self, option: &OscoreOption) -> Option<Arc<SecurityContext>> {
        let kid = option.kid.as_deref()?;
        if let Some(context) = self
            .accepted
            .iter()
            .find(|c| c.matches(kid, option.kid_context.as_deref()))
        {
            return Some(context.clone());
        }
        match (&self.edhoc, &option.kid_context) {
            (Some(edhoc), None) => edhoc.context(kid),
            _ => None,
        }
    }

    /// Whether a context given to [`accept`](Self::accept) has the Recipient ID `id`
    /// and no ID Context (EDHOC must not pick it).
    fn accepts_kid(&self, id: &[u8]) -> bool {
        self.accepted.iter().any(|c| c.matches(id, None))
    }

    /// The context of a combined request (RFC 9668): EDHOC message_3 at the start of
    /// the payload completes the session the kid names; the payload keeps the OSCORE
    /// ciphertext after it.
    fn combined(
        &self,
        request: &mut Request,
        option: &OscoreOption,
    ) -> Result<Arc<SecurityContext>, Response> {
        let (Some(edhoc), Some(kid)) = (&self.edhoc, option.kid.as_deref()) else {
            return Err(Response::new(Code::BAD_OPTION)
                .with_payload("this server takes no EDHOC + OSCORE combined requests"));
        };
        let from = request.peer().ip();
        let request_len = cobalt::proto::message::codec::encode(request.message()).len();
        let payload = std::mem::take(&mut request.message_mut().payload);
        let (context, ciphertext) = edhoc
            .combined(from, kid, &payload, Instant::now())
            .map_err(|refusal| {
                tracing::debug!(peer = %request.peer(), why = %refusal.why, "EDHOC combined request refused");
                refusal.within(request_len).into_response()
            })?;
        let message = request.message_mut();
        message.payload = ciphertext.to_vec();
        message.options.remove(EDHOC);
        Ok(context)
    }
}

/// Which upload a request's inner Block1 belongs to: its context, peer, method, URI
/// and Request-Tag.
fn upload_key(context: &SecurityContext, request: &Request) -> UploadKey {
    let mut what = vec![request.method().0];
    for o in request.options().iter() {
        if matches!(o.number, opt::URI_PATH | opt::URI_QUERY | opt::REQUEST_TAG) {
            what.extend_from_slice(&o.number.to_be_bytes());
            what.extend_from_slice(&(o.value.len() as u16).to_be_bytes());
            what.extend_from_slice(o.value);
        }
    }
    (context.name().to_string(), request.peer(), what)
}

/// A response from what [`SecurityContext`] answers.
fn answer(message: Message) -> Response {
    Response::from_message(message)
}

impl Layer for Oscore {
    fn options(&self) -> &[u16] {
        &[OSCORE, EDHOC]
    }

    fn on_request(&self, request: &mut Request) -> Result<(), Response> {
        if let Some(edhoc) = &self.edhoc {
            if EdhocResponder::is_for_edhoc(request) {
                return Err(edhoc.answer(request, |id| self.accepts_kid(id)));
            }
        }
        let Some(value) = request.options().get(OSCORE) else {
            if request.options().contains(EDHOC) {
                return Err(Response::new(Code::BAD_OPTION)
                    .with_payload("the EDHOC option needs an OSCORE-protected request"));
            }
            return Ok(());
        };
        let option = OscoreOption::decode(value)
            .map_err(|e| answer(crate::security::RequestError::BadOption(e).into_response()))?;
        let found = if request.options().contains(EDHOC) {
            Some(self.combined(request, &option)?)
        } else {
            self.find(&option)
        };
        let Some(context) = found else {
            tracing::debug!(
                peer = %request.peer(),
                kid = ?option.kid.as_deref().map(hex),
                "OSCORE request for an unknown context"
            );
            return Err(answer(
                crate::security::RequestError::NoContext.into_response(),
            ));
        };
        let binding = context
            .unprotect_request(request.message_mut(), &option)
            .map_err(|e| {
                tracing::debug!(peer = %request.peer(), context = context.name(), error = %e, "OSCORE request refused");
                answer(e.into_response())
            })?;
        if let Some(number) = request.options().first_bad_critical() {
            // A critical option inside that nobody here understands (RFC 7252 §5.4.1),
            // answered inside the protection like any answer to a verified request.
            let mut refusal = Response::new(Code::BAD_OPTION)
                .with_payload(format!("option {number} is not understood"))
                .into_message();
            let _ = context.protect_response(&mut refusal, &binding, false);
            return Err(answer(refusal));
        }
        let protect = |response: Response| {
            let mut message = response.into_message();
            let _ = context.protect_response(&mut message, &binding, false);
            answer(message)
        };
        let mut block1 = None;
        if let Some(block) = request.message().block1() {
            let key = upload_key(&context, request);
            let payload = std::mem::take(&mut request.message_mut().payload);
            match self.uploads.step(key, block, &payload, Instant::now()) {
                Step::Continue(block) => {
                    let mut go_on = Response::new(Code::CONTINUE);
                    go_on.options.set_uint(opt::BLOCK1, block.encode());
                    return Err(protect(go_on));
                }
                Step::Refuse(code, why) => {
                    return Err(protect(Response::new(code).with_payload(why)))
                }
                Step::Complete { body, last } => {
                    let message = request.message_mut();
                    message.payload = body;
                    message.options.remove(opt::BLOCK1);
                    block1 = Some(last);
                }
            }
        }
        let block2 = request.message().block2();
        request.extensions_mut().insert(Protected {
            context: context.clone(),
            binding,
            block2,
            block1,
        });
        Ok(())
    }

    fn on_response(&self, request: &Request, response: &mut Response) {
        let Some(protected) = Protected::of(request) else {
            return;
        };
        let mut whole = std::mem::replace(response, Response::new(Code::EMPTY)).into_message();
        if let Some(block1) = protected.block1 {
            whole.options.set_uint(opt::BLOCK1, block1.encode());
        }
        let mut block = slice_asked(protected.block2, whole, BlockSize::Szx(INNER_SZX));
        // With the request's nonce: it was just verified as new, so this cannot fail.
        let _ = protected
            .context
            .protect_response(&mut block, &protected.binding, false);
        *response = answer(block);
    }

    fn on_notification(&self, observer: &Observer<'_>, notification: &mut Response) {
        let Some(protected) = observer.extensions().get::<Protected>() else {
            return;
        };
        let whole = std::mem::replace(notification, Response::new(Code::EMPTY)).into_message();
        let mut block = slice_asked(None, whole, BlockSize::Szx(INNER_SZX));
        *notification = match protected.context.protect_response(
            &mut block,
            &protected.binding,
            true,
        ) {
            Ok(()) => answer(block),
            Err(e) => {
                // Without a fresh Partial IV nothing can be sent protected: the
                // observer is told (unprotected, which ends the relation).
                tracing::warn!(context = protected.context.name(), error = %e, "cannot protect a notification");
                Response::new(Code::INTERNAL_SERVER_ERROR).with_payload(e.to_string())
            }
        };
    }

    fn on_send(&self, exchange: &mut Exchange, request: &mut Message) -> Result<(), Refusal> {
        let Some(protecting) = self.protected.iter().find(|p| {
            p.target
                .matches(exchange.scheme(), exchange.peer(), request)
        }) else {
            return Ok(());
        };
        let context = &protecting.context;
        let binding = context
            .protect_request(request)
            .map_err(|e| Refusal::new(e.to_string()))?;
        let message_3 = protecting
            .message_3
            .as_ref()
            .and_then(|m| m.lock().unwrap_or_else(|e| e.into_inner()).take());
        if let Some(mut message_3) = message_3 {
            // RFC 9668 §3.2.1: message_3, then the OSCORE ciphertext; the EDHOC option.
            message_3.extend_from_slice(&request.payload);
            request.payload = message_3;
            request.options.push(EDHOC, []);
        }
        exchange.extensions_mut().insert(Sent {
            context: context.clone(),
            binding,
            last_notification: None,
        });
        Ok(())
    }

    fn on_receive(
        &self,
        exchange: &mut Exchange,
        _request: &Message,
        response: &mut Message,
    ) -> Result<(), Refusal> {
        let Some(sent) = exchange.extensions_mut().get_mut::<Sent>() else {
            return Ok(());
        };
        if !response.options.contains(OSCORE) {
            // The server could not process the request (RFC 8613 §8.2 answers those
            // errors unprotected): the application sees the error as it came.
            if response.code.class() >= 4 {
                return Ok(());
            }
            return Err(Refusal::new(
                "the server answered an OSCORE request with an unprotected success; ignored",
            ));
        }
        let notification = response.options.observe().is_some();
        let seq = sent
            .context
            .unprotect_response(response, &sent.binding)
            .map_err(|e| Refusal::new(format!("OSCORE context {}: {e}", sent.context.name())))?;
        if let (true, Some(seq)) = (notification, seq) {
            if sent.last_notification.is_some_and(|last| seq <= last) {
                return Err(Refusal::new(
                    "OSCORE notification replayed (its Partial IV is not newer than the last)",
                ));
            }
            sent.last_notification = Some(seq);
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        "oscore"
    }
}

/// Lets through only requests that came protected by OSCORE (under one of the named
/// contexts, if given): 4.01 Unauthorized to an unprotected request, 4.03 Forbidden
/// to one protected under another context. Put it on a resource (or a server, inside
/// an [`Oscore`] layer), so that it sees requests after the OSCORE layer unwrapped
/// them.
#[derive(Debug, Clone, Default)]
pub struct RequireOscore {
    /// `None`: any context.
    contexts: Option<Vec<String>>,
}

impl RequireOscore {
    /// Any OSCORE context will do.
    pub fn any() -> RequireOscore {
        RequireOscore::default()
    }

    /// Only the contexts with these names ([`SecurityContext::named`]).
    pub fn contexts<S: Into<String>>(names: impl IntoIterator<Item = S>) -> RequireOscore {
        RequireOscore {
            contexts: Some(names.into_iter().map(Into::into).collect()),
        }
    }
}

impl Layer for RequireOscore {
    fn on_request(&self, request: &mut Request) -> Result<(), Response> {
        match (Protected::of(request), &self.contexts) {
            (None, _) => Err(Response::new(Code::UNAUTHORIZED)
                .with_payload("this resource needs OSCORE: protect the request with a security context the server knows")),
            (Some(_), None) => Ok(()),
            (Some(p), Some(names)) if names.iter().any(|n| n == p.context_name()) => Ok(()),
            (Some(_), Some(_)) => Err(Response::new(Code::FORBIDDEN)
                .with_payload("this OSCORE context may not make this request")),
        }
    }

    fn name(&self) -> &'static str {
        "require-oscore"
    }
}

#[cfg(test)]
mod tests;

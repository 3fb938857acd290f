//! Handlers and per-method routing of one resource.

use super::request::{BoxFuture, IntoResponse, Request, Response};
use cobalt_proto::message::Code;
use std::future::Future;
use std::sync::Arc;

/// A type-erased handler.
pub type BoxedHandler = Arc<dyn Fn(Request) -> BoxFuture + Send + Sync>;

/// Something that can handle a request: an async function or closure taking up to four
/// arguments, each taken from the request, and returning anything [`IntoResponse`].
///
/// Every argument but the last is [`FromRequestParts`] (it reads the request: route
/// parameters, query, state, ...); the last one may also consume the request
/// ([`FromRequest`]: the [`Request`] itself, or its payload). When an argument cannot
/// be taken (a parameter that does not parse, a payload that is not UTF-8), the
/// handler does not run and the request is answered with that argument's refusal
/// (4.00 Bad Request with a payload saying why, for the extractors of
/// [`extract`](super::extract)). The type parameter only tells the shapes apart.
pub trait Handler<T>: Send + Sync + 'static {
    /// Erases the handler's type.
    fn into_boxed(self) -> BoxedHandler;
}

/// A handler argument taken from a request without consuming it.
pub trait FromRequestParts: Sized {
    /// The argument, or the answer to give instead of running the handler.
    fn from_request_parts(req: &Request) -> Result<Self, Response>;
}

/// A handler's last argument, which may consume the request. Everything
/// [`FromRequestParts`] is one; `M` only tells the two ways apart.
pub trait FromRequest<M = via::Parts>: Sized {
    /// The argument, or the answer to give instead of running the handler.
    fn from_request(req: Request) -> Result<Self, Response>;
}

/// How an argument is taken: the markers of [`FromRequest`]'s implementations.
pub mod via {
    /// Taken by reading the request ([`FromRequestParts`](super::FromRequestParts)).
    #[derive(Debug)]
    pub enum Parts {}
    /// Taken by consuming the request.
    #[derive(Debug)]
    pub enum Request {}
}

impl<T: FromRequestParts> FromRequest<via::Parts> for T {
    fn from_request(req: Request) -> Result<Self, Response> {
        T::from_request_parts(&req)
    }
}

impl FromRequest<via::Request> for Request {
    fn from_request(req: Request) -> Result<Self, Response> {
        Ok(req)
    }
}

impl<F, Fut, R> Handler<()> for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = R> + Send + 'static,
    R: IntoResponse,
{
    fn into_boxed(self) -> BoxedHandler {
        Arc::new(move |_req| {
            let fut = self();
            Box::pin(async move { fut.await.into_response() })
        })
    }
}

/// `Handler` for functions of `$part` arguments read from the request and a `$last`
/// one that may consume it.
macro_rules! handler_with_arguments {
    ($($part:ident),*; $last:ident) => {
        impl<F, Fut, R, M, $($part,)* $last> Handler<(M, $($part,)* $last,)> for F
        where
            F: Fn($($part,)* $last) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = R> + Send + 'static,
            R: IntoResponse,
            M: 'static,
            $($part: FromRequestParts + 'static,)*
            $last: FromRequest<M> + 'static,
        {
            #[allow(non_snake_case)]
            fn into_boxed(self) -> BoxedHandler {
                Arc::new(move |req: Request| {
                    $(
                        let $part = match $part::from_request_parts(&req) {
                            Ok(v) => v,
                            Err(refused) => return Box::pin(std::future::ready(refused)),
                        };
                    )*
                    let $last = match $last::from_request(req) {
                        Ok(v) => v,
                        Err(refused) => return Box::pin(std::future::ready(refused)),
                    };
                    let fut = self($($part,)* $last);
                    Box::pin(async move { fut.await.into_response() })
                })
            }
        }
    };
}

handler_with_arguments!(; A);
handler_with_arguments!(A; B);
handler_with_arguments!(A, B; C);
handler_with_arguments!(A, B, C; D);

/// One block of a streamed upload (see [`MethodRouter::stream_upload`]).
#[derive(Debug, Clone)]
pub struct UploadChunk {
    /// The request carrying this block (its payload is the block's data).
    pub request: Request,
    /// Byte offset of this block in the whole body.
    pub offset: usize,
    /// True for the last block: the handler's answer is then the final response.
    pub last: bool,
}

impl UploadChunk {
    /// The block's bytes.
    pub fn data(&self) -> &[u8] {
        self.request.payload()
    }
}

/// A type-erased streaming upload handler.
pub type BoxedChunkHandler = Arc<dyn Fn(UploadChunk) -> BoxFuture + Send + Sync>;

/// A resource: a handler per method, plus the link attributes that describe it in
/// `/.well-known/core` (RFC 6690).
#[derive(Clone, Default)]
pub struct MethodRouter {
    handlers: Vec<(Code, BoxedHandler)>,
    streams: Vec<(Code, BoxedChunkHandler)>,
    pub(crate) attrs: Vec<(String, Option<String>)>,
    pub(crate) hidden: bool,
    pub(crate) observable: Option<super::observe::Observable>,
    pub(crate) executor: Option<super::Executor>,
}

impl std::fmt::Debug for MethodRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let methods: Vec<Code> = self.handlers.iter().map(|(c, _)| *c).collect();
        let streamed: Vec<Code> = self.streams.iter().map(|(c, _)| *c).collect();
        f.debug_struct("MethodRouter")
            .field("methods", &methods)
            .field("streamed", &streamed)
            .field("attrs", &self.attrs)
            .finish()
    }
}

macro_rules! method_fns {
    ($($(#[$doc:meta])* $name:ident => $code:expr),* $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $name<H: Handler<T>, T>(handler: H) -> MethodRouter {
                MethodRouter::default().on($code, handler)
            }
        )*
        impl MethodRouter {
            $(
                $(#[$doc])*
                pub fn $name<H: Handler<T>, T>(self, handler: H) -> MethodRouter {
                    self.on($code, handler)
                }
            )*
        }
    };
}

method_fns! {
    /// Handle GET.
    get => Code::GET,
    /// Handle POST.
    post => Code::POST,
    /// Handle PUT.
    put => Code::PUT,
    /// Handle DELETE.
    delete => Code::DELETE,
    /// Handle FETCH (RFC 8132).
    fetch => Code::FETCH,
    /// Handle PATCH (RFC 8132).
    patch => Code::PATCH,
    /// Handle iPATCH (RFC 8132).
    ipatch => Code::IPATCH,
}

/// A resource answering any method with the same handler.
pub fn any<H: Handler<T>, T>(handler: H) -> MethodRouter {
    let boxed = handler.into_boxed();
    let mut r = MethodRouter::default();
    for code in [
        Code::GET,
        Code::POST,
        Code::PUT,
        Code::DELETE,
        Code::FETCH,
        Code::PATCH,
        Code::IPATCH,
    ] {
        r.handlers.push((code, boxed.clone()));
    }
    r
}

impl MethodRouter {
    /// Handle `method` with `handler` (replacing an earlier one).
    pub fn on<H: Handler<T>, T>(mut self, method: Code, handler: H) -> MethodRouter {
        self.handlers.retain(|(c, _)| *c != method);
        self.handlers.push((method, handler.into_boxed()));
        self
    }

    /// Handles uploads with `method` block by block, without buffering the body: the
    /// handler runs once per Block1 block, in order (a request without Block1 is one
    /// last block). For a block that is not the last, a success answer makes the server
    /// reply 2.31 Continue and any other answer ends the upload with it; the answer to
    /// the last block is the response. For bodies too large to hold in memory.
    pub fn stream_upload<F, Fut, R>(mut self, method: Code, handler: F) -> MethodRouter
    where
        F: Fn(UploadChunk) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: IntoResponse,
    {
        self.streams.retain(|(c, _)| *c != method);
        let boxed: BoxedChunkHandler = Arc::new(move |chunk| {
            let fut = handler(chunk);
            Box::pin(async move { fut.await.into_response() })
        });
        self.streams.push((method, boxed));
        self
    }

    /// The streaming upload handler for a method, if any.
    pub fn stream_handler(&self, method: Code) -> Option<&BoxedChunkHandler> {
        self.streams
            .iter()
            .find(|(c, _)| *c == method)
            .map(|(_, h)| h)
    }

    /// The methods this resource has a streaming upload handler for.
    pub(crate) fn streamed_methods(&self) -> impl Iterator<Item = Code> + '_ {
        self.streams.iter().map(|(c, _)| *c)
    }

    /// The handler for a method.
    pub fn handler(&self, method: Code) -> Option<&BoxedHandler> {
        self.handlers
            .iter()
            .find(|(c, _)| *c == method)
            .map(|(_, h)| h)
    }

    /// Adds a link attribute with a value (e.g. `rt`, `if`, `title`).
    pub fn attr(mut self, name: &str, value: &str) -> MethodRouter {
        self.attrs.push((name.to_string(), Some(value.to_string())));
        self
    }

    /// Adds a valueless link attribute (e.g. `obs`).
    pub fn flag(mut self, name: &str) -> MethodRouter {
        self.attrs.push((name.to_string(), None));
        self
    }

    /// Resource type (`rt`).
    pub fn rt(self, value: &str) -> MethodRouter {
        self.attr("rt", value)
    }

    /// Interface description (`if`).
    pub fn interface(self, value: &str) -> MethodRouter {
        self.attr("if", value)
    }

    /// Content-Format hint (`ct`).
    pub fn ct(self, cf: u16) -> MethodRouter {
        self.attr("ct", &cf.to_string())
    }

    /// Human-readable title.
    pub fn title(self, value: &str) -> MethodRouter {
        self.attr("title", value)
    }

    /// Makes the resource observable (RFC 7641): GET with Observe=0 registers the client,
    /// and every [`Observable::changed`](super::Observable::changed) sends it the GET
    /// handler's new answer. Adds `obs` to the resource's link.
    pub fn observable(mut self, handle: &super::Observable) -> MethodRouter {
        self.observable = Some(handle.clone());
        self.flag("obs")
    }

    /// Runs this resource's handlers (and those of resources below it that do not
    /// choose their own) on `executor` instead of inline on the shard thread.
    pub fn executor(mut self, executor: super::Executor) -> MethodRouter {
        self.executor = Some(executor);
        self
    }

    /// Replaces every handler `h` by `wrap(h)` and every streaming upload handler `s`
    /// by `wrap_stream(s)` (for [`MethodRouter::layer`]).
    pub(crate) fn wrap_handlers(
        &mut self,
        wrap: impl Fn(BoxedHandler) -> BoxedHandler,
        wrap_stream: impl Fn(BoxedChunkHandler) -> BoxedChunkHandler,
    ) {
        for (_, h) in &mut self.handlers {
            *h = wrap(h.clone());
        }
        for (_, s) in &mut self.streams {
            *s = wrap_stream(s.clone());
        }
    }

    /// Leaves the resource out of `/.well-known/core`.
    pub fn hidden(mut self) -> MethodRouter {
        self.hidden = true;
        self
    }
}

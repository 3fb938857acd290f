//! The resource set of the ETSI CoAP plugtest test descriptions (TD_COAP_CORE_*,
//! TD_COAP_LINK_*), so conformance drivers can be pointed at `cobalt serve --plugtest`.
//! `/separate` comes from the demo set.

use cobalt::proto::message::opt;
use cobalt::server::{get, IntoResponse, MethodRouter, Request};
use cobalt::{content_format, Code, Response, Server};
use std::sync::{Arc, Mutex};

/// Adds the plugtest resources.
pub fn routes(server: Server) -> Server {
    let server = server
        .route("/test", test_resource().title("Default test resource"))
        .route(
            "/seg1/seg2/seg3",
            get(|| async { "Long path resource" }).title("Long path resource"),
        )
        .route("/query", get(query).title("Resource accepting query parameters"))
        .route(
            "/location-query",
            MethodRouter::default()
                .post(|| async {
                    let mut r = Response::new(Code::CREATED);
                    r.options.push(opt::LOCATION_QUERY, &b"first=1"[..]);
                    r.options.push(opt::LOCATION_QUERY, &b"second=2"[..]);
                    r
                })
                .title("Perform POST transaction with responses containing several Location-Query options"),
        )
        .route(
            "/multi-format",
            get(multi_format)
                .title("Resource that exists in different content formats (text/plain utf8 and application/xml)")
                .attr("ct", "0 41"),
        )
        .route("/validate", validate_resource().title("Resource which varies"))
        .route(
            "/large-update",
            large_update().title("Large resource that can be updated using PUT method"),
        )
        .route(
            "/large-create",
            MethodRouter::default()
                .post(|req: Request| async move {
                    let _ = req;
                    Response::created("/location1/location2/location3")
                })
                .title("Large resource that can be created using POST method"),
        )
        .route("/create1", create_resource().title("Creates resource with If-None-Match"))
        .route(
            "/path",
            get(|| async {
                Response::content(&b"</path/sub1>,</path/sub2>,</path/sub3>"[..])
                    .with_content_format(content_format::LINK_FORMAT)
            })
            .title("Hierarchical link description entry")
            .ct(content_format::LINK_FORMAT),
        );
    let server = ["sub1", "sub2", "sub3"].iter().fold(server, |s, sub| {
        s.route(
            &format!("/path/{sub}"),
            get(|| async { "Hierarchical link description sub-resource" })
                .title("Hierarchical link description sub-resource"),
        )
    });
    [
        ("/link1", "Type1 Type2", "Link test resource"),
        ("/link2", "Type2 Type3", "Link test resource"),
        ("/link3", "Type1 Type3", "Link test resource"),
    ]
    .iter()
    .fold(server, |s, (path, rt, title)| {
        s.route(
            path,
            get(|| async { "Link test resource" })
                .rt(rt)
                .interface("If1")
                .title(title),
        )
    })
}

/// `/large-update`: a large text replaced by block-wise PUT (TD_COAP_BLOCK_02/03).
fn large_update() -> MethodRouter {
    let body = Arc::new(Mutex::new(super::demo::large_text(2048).into_bytes()));
    let read = body.clone();
    MethodRouter::default()
        .get(move || {
            let b = read.lock().unwrap_or_else(|e| e.into_inner()).clone();
            async move { Response::content(b).with_content_format(content_format::TEXT_PLAIN) }
        })
        .put(move |req: Request| {
            *body.lock().unwrap_or_else(|e| e.into_inner()) = req.payload().to_vec();
            async { Code::CHANGED }
        })
}

fn test_resource() -> MethodRouter {
    MethodRouter::default()
        .get(|| async { Response::text("Type: 0 (CON)\nCode: 1 (GET)") })
        .post(|req: Request| async move {
            let _ = req;
            Response::created("/location1/location2/location3")
        })
        .put(|req: Request| async move {
            if req.content_format().is_none() && !req.payload().is_empty() {
                return Code::BAD_REQUEST.into_response();
            }
            Code::CHANGED.into_response()
        })
        .delete(|| async { Code::DELETED })
}

async fn query(req: Request) -> Response {
    let items: Vec<&str> = req.query().collect();
    Response::text(format!("Query: {}", items.join("&")))
}

async fn multi_format(req: Request) -> Response {
    match req.accept() {
        None | Some(content_format::TEXT_PLAIN) => Response::text("Type: 0\nCode: 1\nMID: -"),
        Some(content_format::XML) => Response::content(&b"<msg type=\"CON\" code=\"GET\"/>"[..])
            .with_content_format(content_format::XML),
        Some(_) => Code::NOT_ACCEPTABLE.into_response(),
    }
}

/// `/validate`: a representation with an ETag that changes on every PUT (TD_COAP_CORE_21/22).
fn validate_resource() -> MethodRouter {
    #[derive(Debug)]
    struct State {
        version: u32,
        body: Vec<u8>,
    }
    let state = Arc::new(Mutex::new(State {
        version: 1,
        body: b"Validation test resource".to_vec(),
    }));
    let read = state.clone();
    MethodRouter::default()
        .get(move |req: Request| {
            let st = read.clone();
            async move {
                let st = st.lock().unwrap_or_else(|e| e.into_inner());
                let etag = st.version.to_be_bytes();
                if req.options().get_all(opt::ETAG).any(|t| t == etag) {
                    return Response::new(Code::VALID).with_etag(&etag);
                }
                Response::content(st.body.clone())
                    .with_content_format(content_format::TEXT_PLAIN)
                    .with_etag(&etag)
            }
        })
        .put(move |req: Request| {
            let st = state.clone();
            async move {
                let mut st = st.lock().unwrap_or_else(|e| e.into_inner());
                let current = st.version.to_be_bytes();
                let if_match: Vec<&[u8]> = req.options().get_all(opt::IF_MATCH).collect();
                if !if_match.is_empty() && !if_match.iter().any(|t| t.is_empty() || *t == current) {
                    return Code::PRECONDITION_FAILED.into_response();
                }
                st.version = st.version.wrapping_add(1);
                st.body = req.payload().to_vec();
                Response::new(Code::CHANGED).with_etag(&st.version.to_be_bytes())
            }
        })
}

/// `/create1`: PUT with If-None-Match creates once, then answers 4.12 (TD_COAP_CORE_23).
fn create_resource() -> MethodRouter {
    let body: Arc<Mutex<Option<Vec<u8>>>> = Arc::new(Mutex::new(None));
    let read = body.clone();
    let del = body.clone();
    MethodRouter::default()
        .get(move || {
            let b = read.clone();
            async move {
                match b.lock().unwrap_or_else(|e| e.into_inner()).clone() {
                    Some(v) => Response::content(v),
                    None => Code::NOT_FOUND.into_response(),
                }
            }
        })
        .put(move |req: Request| {
            let b = body.clone();
            async move {
                let mut b = b.lock().unwrap_or_else(|e| e.into_inner());
                let exists = b.is_some();
                if exists && req.options().contains(opt::IF_NONE_MATCH) {
                    return Code::PRECONDITION_FAILED.into_response();
                }
                *b = Some(req.payload().to_vec());
                if exists { Code::CHANGED } else { Code::CREATED }.into_response()
            }
        })
        .delete(move || {
            let b = del.clone();
            async move {
                *b.lock().unwrap_or_else(|e| e.into_inner()) = None;
                Code::DELETED
            }
        })
}

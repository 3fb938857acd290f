//! The resource set of the ETSI CoAP plugtest test descriptions (TD_COAP_CORE_*,
//! TD_COAP_LINK_*, TD_COAP_BLOCK_*, TD_COAP_OBS_*), with the resources that
//! Californium's plugtest server adds for them (`/obs-non`, `/obs-reset`,
//! `/large-post`, JSON and CBOR from `/multi-format`), so conformance drivers can be
//! pointed at `cobalt serve --plugtest`. `/separate` and `/large` come from the demo
//! set; `/obs` replaces the demo's with the plugtest's (confirmable notifications,
//! PUT and DELETE).
//!
//! What a client may store here is bounded: [`MAX_STORED`] bytes per value and
//! [`MAX_CREATED`] resources created by POST.

use super::clock::now_utc;
use cobalt::proto::message::{opt, option::encode_uint, MessageType};
use cobalt::server::{get, post, IntoResponse, MethodRouter, Observable, Request};
use cobalt::{content_format, Code, Response, Server};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Largest value a PUT or POST may store in a plugtest resource; larger ones get
/// 4.13 with Size1.
pub const MAX_STORED: usize = 64 * 1024;
/// Resources `/large-create` keeps; the oldest goes when another is created.
pub const MAX_CREATED: usize = 8;
/// How often `/obs` and `/obs-non` change.
const TICK: Duration = Duration::from_secs(1);
/// Max-Age of `/obs` and `/obs-non`: a notification is due before it runs out.
const OBS_MAX_AGE: u32 = 2;
/// Size of `/large-separate`'s representation: more than one 1024-byte block.
const LARGE_SEPARATE_SIZE: usize = 2048;
/// How long `/large-separate` takes: longer than the separate-ACK delay (1 s).
const SEPARATE_DELAY: Duration = Duration::from_millis(1500);
/// Ticks a value stored by PUT in `/obs` stays: long enough for a confirmable
/// notification of it to be retransmitted, or to wait for a late ACK of the one
/// before, without the next tick overtaking it (RFC 7641 §4.5 lets a server skip
/// states, and an observer would then never see the PUT value).
const STORED_TICKS: u32 = 5;
/// Size of `/obs-large`'s representation: more than one 1024-byte block.
const OBS_LARGE_SIZE: usize = 2500;

/// Background work the plugtest resources need (the clock behind the observable ones).
pub struct Plugtest {
    observed: Vec<Observed>,
}

impl Plugtest {
    /// Changes `/obs`, `/obs-non` and `/obs-large` every second until the runtime stops.
    pub fn start_ticker(&self) {
        let observed = self.observed.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(TICK);
            every.tick().await;
            loop {
                every.tick().await;
                for o in &observed {
                    o.tick();
                }
            }
        });
    }
}

/// Adds the plugtest resources.
pub fn routes(server: Server) -> (Server, Plugtest) {
    let obs = Observed::new(true, 0);
    let obs_non = Observed::new(false, 0);
    let obs_large = Observed::new(true, OBS_LARGE_SIZE);
    let plugtest = Plugtest {
        observed: vec![obs.clone(), obs_non.clone(), obs_large.clone()],
    };
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
                .attr("ct", "0 41 50 60"),
        )
        .route("/validate", validate_resource().title("Resource which varies"))
        .route(
            "/large-update",
            large_update()
                .title("Large resource that can be updated using PUT method")
                .rt("block"),
        )
        .route(
            "/large-create",
            large_create()
                .title("Large resource that can be created using POST method")
                .rt("block"),
        )
        .route(
            "/large-separate",
            get(|| async {
                tokio::time::sleep(SEPARATE_DELAY).await;
                Response::text(super::demo::large_text(LARGE_SEPARATE_SIZE))
            })
            .title("Large resource answered with a separate response")
            .rt("block")
            .attr("sz", &LARGE_SEPARATE_SIZE.to_string()),
        )
        .route(
            "/large-post",
            post(large_post)
                .title("Handle POST with two-way blockwise transfer")
                .rt("block"),
        )
        .route("/create1", create_resource().title("Creates resource with If-None-Match"))
        .route(
            "/obs",
            obs.resource()
                .title("Observable resource which changes every second (confirmable notifications)"),
        )
        .route(
            "/obs-non",
            obs_non
                .resource()
                .title("Observable resource which changes every second (non-confirmable notifications)"),
        )
        .route(
            "/obs-large",
            obs_large
                .resource()
                .title("Large observable resource which changes every second (notifications in Block2 blocks)")
                .attr("sz", &OBS_LARGE_SIZE.to_string()),
        )
        .route(
            "/obs-reset",
            obs_reset(plugtest.observed.clone())
                .title("POST 'sesame' to forget every observer of /obs, /obs-non and /obs-large and restore them, as a reboot would"),
        )
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
    let server = [
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
    });
    (server, plugtest)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The request's payload, if it is small enough to keep; else the 4.13 to answer.
fn storable(req: &Request) -> Result<Vec<u8>, Response> {
    if req.payload().len() > MAX_STORED {
        return Err(Response::new(Code::REQUEST_ENTITY_TOO_LARGE)
            .with_option(opt::SIZE1, encode_uint(MAX_STORED as u32))
            .with_payload(format!("this resource keeps at most {MAX_STORED} bytes")));
    }
    Ok(req.payload().to_vec())
}

/// A stored representation, answered with its Content-Format, or 4.06 when the
/// request's Accept asks for another one.
fn representation(req: &Request, body: Vec<u8>, cf: u16) -> Response {
    match req.accept() {
        Some(accept) if accept != cf => (
            Code::NOT_ACCEPTABLE,
            format!("this representation is Content-Format {cf} only"),
        )
            .into_response(),
        _ => Response::content(body).with_content_format(cf),
    }
}

/// A request as the plugtest resources describe it.
struct Described {
    /// The type's number (0 for CON) and name ("CON").
    mtype: (u8, &'static str),
    /// The code's number (1 for GET) and name ("GET").
    code: (u8, &'static str),
    mid: u16,
}

fn describe(req: &Request) -> Described {
    let m = req.message();
    let name = match m.mtype {
        MessageType::Confirmable => "CON",
        MessageType::NonConfirmable => "NON",
        MessageType::Acknowledgement => "ACK",
        MessageType::Reset => "RST",
    };
    Described {
        mtype: (m.mtype.bits(), name),
        code: (m.code.0, m.code.name()),
        mid: m.mid,
    }
}

/// `/obs`, `/obs-non` and `/obs-large` (TD_COAP_OBS_01–10, 13): a clock that ticks
/// every second (for `/obs-large` padded to [`OBS_LARGE_SIZE`] bytes); a PUT
/// replaces the value for [`STORED_TICKS`] ticks (TD_COAP_OBS_09). The resource's
/// format, the one its observers registered for, is text/plain: a PUT in another
/// Content-Format (TD_COAP_OBS_08) ends every observation with 4.06 Not Acceptable,
/// and a text/plain PUT after it is notified to whoever observes then. A DELETE
/// (TD_COAP_OBS_07) ends every observation with 4.04 Not Found and the resource is
/// back at once, in its initial state, for the next test.
#[derive(Clone)]
struct Observed {
    state: Arc<Mutex<ObservedState>>,
    observable: Observable,
    /// Notifications go out confirmable (`/obs`, as TD_COAP_OBS_01 expects) or
    /// non-confirmable except where RFC 7641 §4.5 asks for a CON (`/obs-non`).
    confirmable: bool,
    /// The clock text is padded to this many bytes (0: not padded).
    pad: usize,
}

#[derive(Debug, Default)]
struct ObservedState {
    ticks: u64,
    /// A value stored by PUT and its Content-Format, shown for [`STORED_TICKS`].
    stored: Option<(Vec<u8>, u16)>,
    /// Ticks the stored value has still to be shown.
    stored_ticks: u32,
}

impl Observed {
    fn new(confirmable: bool, pad: usize) -> Observed {
        Observed {
            state: Arc::default(),
            observable: Observable::new(),
            confirmable,
            pad,
        }
    }

    fn notify(&self) {
        if self.confirmable {
            self.observable.changed_confirmable();
        } else {
            self.observable.changed();
        }
    }

    fn tick(&self) {
        {
            let mut st = lock(&self.state);
            st.ticks += 1;
            st.stored_ticks = st.stored_ticks.saturating_sub(1);
            if st.stored_ticks == 0 {
                st.stored = None;
            }
        }
        self.notify();
    }

    /// Deleted and back at once in the initial state; every observation ends (4.04).
    fn delete(&self) {
        *lock(&self.state) = ObservedState::default();
        self.observable.deleted();
    }

    /// Back to the initial state and every observer forgotten without a word, as
    /// after a reboot (TD_COAP_OBS_04): observers notice by Max-Age.
    fn reboot(&self) {
        *lock(&self.state) = ObservedState::default();
        self.observable.forget_observers();
    }

    fn current(&self) -> (Vec<u8>, u16) {
        let st = lock(&self.state);
        match &st.stored {
            Some(v) => v.clone(),
            None => {
                let mut text = format!("tick {} at {}", st.ticks, now_utc()).into_bytes();
                if text.len() < self.pad {
                    text.push(b'\n');
                    text.resize(self.pad, b'.');
                }
                (text, content_format::TEXT_PLAIN)
            }
        }
    }

    fn resource(&self) -> MethodRouter {
        let (read, write, delete) = (self.clone(), self.clone(), self.clone());
        get(move |req: Request| {
            let (body, cf) = read.current();
            let r = representation(&req, body, cf).with_max_age(OBS_MAX_AGE);
            async move { r }
        })
        .put(move |req: Request| {
            let r = write.put(&req);
            async move { r }
        })
        .delete(move || {
            delete.delete();
            async { Code::DELETED }
        })
        .observable(&self.observable)
        .rt("observe")
        .ct(content_format::TEXT_PLAIN)
    }

    fn put(&self, req: &Request) -> Response {
        let Some(cf) = req.content_format() else {
            return (Code::BAD_REQUEST, "Content-Format not set").into_response();
        };
        let body = match storable(req) {
            Ok(b) => b,
            Err(too_large) => return too_large,
        };
        {
            let mut st = lock(&self.state);
            st.stored = Some((body, cf));
            st.stored_ticks = STORED_TICKS;
        }
        if cf == content_format::TEXT_PLAIN {
            self.notify();
        } else {
            // The observers registered for text/plain: the list is cleaned.
            self.observable.end_observations(Code::NOT_ACCEPTABLE);
        }
        Response::new(Code::CHANGED)
    }
}

/// `/obs-reset`: POST with the payload `sesame` forgets every observer of the
/// observed resources, sending nothing, and puts them back in their initial state, as
/// a reboot would (TD_COAP_OBS_04; Californium's plugtest server has the same
/// resource). An observer notices when its last notification's Max-Age runs out and
/// registers again.
fn obs_reset(observed: Vec<Observed>) -> MethodRouter {
    post(move |req: Request| {
        let r = if req.payload() == b"sesame" {
            for o in &observed {
                o.reboot();
            }
            Response::new(Code::CHANGED)
        } else {
            (
                Code::FORBIDDEN,
                "POST the payload 'sesame' to reset the observed resources",
            )
                .into_response()
        };
        async move { r }
    })
}

/// `/large-update`: a large text replaced by block-wise PUT (TD_COAP_BLOCK_03).
fn large_update() -> MethodRouter {
    let initial = super::demo::large_text(2048).into_bytes();
    let body = Arc::new(Mutex::new((initial, content_format::TEXT_PLAIN)));
    let read = body.clone();
    MethodRouter::default()
        .get(move |req: Request| {
            let (b, cf) = lock(&read).clone();
            let r = representation(&req, b, cf);
            async move { r }
        })
        .put(move |req: Request| {
            let r = match storable(&req) {
                Ok(b) => {
                    let cf = req.content_format().unwrap_or(content_format::TEXT_PLAIN);
                    *lock(&body) = (b, cf);
                    Response::new(Code::CHANGED)
                }
                Err(too_large) => too_large,
            };
            async move { r }
        })
}

/// `/large-create` (TD_COAP_BLOCK_04): a POST creates a resource from its (large)
/// body, at the Location `/large-create?id=N`, where GET reads it and DELETE removes
/// it. The last [`MAX_CREATED`] are kept.
fn large_create() -> MethodRouter {
    #[derive(Debug, Default)]
    struct Created {
        next: u32,
        items: VecDeque<(u32, Vec<u8>, u16)>,
    }
    let created = Arc::new(Mutex::new(Created::default()));
    let (read, remove) = (created.clone(), created.clone());
    let id = |req: &Request| req.query_param("id").and_then(|v| v.parse::<u32>().ok());
    MethodRouter::default()
        .post(move |req: Request| {
            let r = match storable(&req) {
                Ok(body) => {
                    let cf = req.content_format().unwrap_or(content_format::TEXT_PLAIN);
                    let mut c = lock(&created);
                    c.next = c.next.wrapping_add(1);
                    let n = c.next;
                    if c.items.len() >= MAX_CREATED {
                        c.items.pop_front();
                    }
                    c.items.push_back((n, body, cf));
                    Response::created(&format!("/large-create?id={n}"))
                }
                Err(too_large) => too_large,
            };
            async move { r }
        })
        .get(move |req: Request| {
            let r = match id(&req) {
                None => (
                    Code::BAD_REQUEST,
                    "ask for a created resource: /large-create?id=N (the Location of a POST)",
                )
                    .into_response(),
                Some(n) => {
                    let found = lock(&read)
                        .items
                        .iter()
                        .find(|(i, ..)| *i == n)
                        .map(|(_, b, cf)| (b.clone(), *cf));
                    match found {
                        Some((body, cf)) => representation(&req, body, cf),
                        None => Code::NOT_FOUND.into_response(),
                    }
                }
            };
            async move { r }
        })
        .delete(move |req: Request| {
            let n = id(&req);
            lock(&remove).items.retain(|(i, ..)| Some(*i) != n);
            async { Code::DELETED }
        })
}

/// `/large-post` (TD_COAP_BLOCK_05): a large text POSTed in Block1 blocks comes back
/// upper-cased, in Block2 blocks, in the same exchange (RFC 7959 §3.3).
async fn large_post(req: Request) -> Response {
    match req.content_format() {
        None | Some(content_format::TEXT_PLAIN) => Response::new(Code::CHANGED)
            .with_payload(req.payload().to_ascii_uppercase())
            .with_content_format(content_format::TEXT_PLAIN),
        Some(_) => (Code::UNSUPPORTED_CONTENT_FORMAT, "text/plain only").into_response(),
    }
}

fn test_resource() -> MethodRouter {
    MethodRouter::default()
        .get(|req: Request| async move {
            let Described { mtype, code, mid } = describe(&req);
            let ((t, tn), (c, cn)) = (mtype, code);
            Response::text(format!("Type: {t} ({tn})\nCode: {c} ({cn})\nMID: {mid}"))
                .with_max_age(30)
        })
        .post(|req: Request| async move {
            let _ = req;
            Response::created("/location1/location2/location3")
        })
        .put(|req: Request| async move {
            if req.options().contains(opt::IF_NONE_MATCH) {
                // The resource exists.
                return Code::PRECONDITION_FAILED.into_response();
            }
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

/// `/multi-format` (TD_COAP_CORE_20): the request's type, code, MID and Accept in the
/// format the Accept option asks for: text/plain (also without Accept),
/// application/xml, application/json or application/cbor; 4.06 for any other.
async fn multi_format(req: Request) -> Response {
    let Described { mtype, code, mid } = describe(&req);
    let (t, c) = (mtype.1, code.1);
    let accept = req.accept();
    let a = accept.unwrap_or(content_format::TEXT_PLAIN);
    let (cf, body) = match accept {
        None | Some(content_format::TEXT_PLAIN) => (
            content_format::TEXT_PLAIN,
            format!("Type: {t}\nCode: {c}\nMID: {mid}\nAccept: {a}").into_bytes(),
        ),
        Some(content_format::XML) => (
            content_format::XML,
            format!("<msg type=\"{t}\" code=\"{c}\" mid=\"{mid}\" accept=\"{a}\"/>").into_bytes(),
        ),
        Some(content_format::JSON) => (
            content_format::JSON,
            format!("{{\"type\":\"{t}\",\"code\":\"{c}\",\"mid\":{mid},\"accept\":{a}}}").into_bytes(),
        ),
        Some(content_format::CBOR) => (
            content_format::CBOR,
            cbor::map(&[
                ("type", cbor::Value::Text(t)),
                ("code", cbor::Value::Text(c)),
                ("mid", cbor::Value::Uint(u32::from(mid))),
                ("accept", cbor::Value::Uint(u32::from(a))),
            ]),
        ),
        Some(_) => {
            return (
                Code::NOT_ACCEPTABLE,
                "text/plain (0), application/xml (41), application/json (50) or application/cbor (60) only",
            )
                .into_response()
        }
    };
    Response::content(body).with_content_format(cf)
}

/// The little CBOR (RFC 8949) `/multi-format` needs: a map of text keys to text or
/// unsigned values.
mod cbor {
    /// A map value.
    pub enum Value<'a> {
        Text(&'a str),
        Uint(u32),
    }

    /// The head of a data item: major type and argument (RFC 8949 §3).
    fn head(out: &mut Vec<u8>, major: u8, arg: u32) {
        let m = major << 5;
        match arg {
            0..=23 => out.push(m | arg as u8),
            24..=0xff => out.extend_from_slice(&[m | 24, arg as u8]),
            0x100..=0xffff => {
                out.push(m | 25);
                out.extend_from_slice(&(arg as u16).to_be_bytes());
            }
            _ => {
                out.push(m | 26);
                out.extend_from_slice(&arg.to_be_bytes());
            }
        }
    }

    fn text(out: &mut Vec<u8>, s: &str) {
        head(out, 3, s.len() as u32);
        out.extend_from_slice(s.as_bytes());
    }

    /// Encodes a map.
    pub fn map(entries: &[(&str, Value<'_>)]) -> Vec<u8> {
        let mut out = Vec::new();
        head(&mut out, 5, entries.len() as u32);
        for (k, v) in entries {
            text(&mut out, k);
            match v {
                Value::Text(s) => text(&mut out, s),
                Value::Uint(n) => head(&mut out, 0, *n),
            }
        }
        out
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn encodes_rfc_8949_examples() {
            // {"a": 1, "b": "c"} is a2 61 61 01 61 62 61 63 (RFC 8949 Appendix A).
            assert_eq!(
                map(&[("a", Value::Uint(1)), ("b", Value::Text("c"))]),
                [0xa2, 0x61, 0x61, 0x01, 0x61, 0x62, 0x61, 0x63]
            );
            let mut out = Vec::new();
            head(&mut out, 0, 1000);
            assert_eq!(out, [0x19, 0x03, 0xe8]);
            out.clear();
            head(&mut out, 0, 100);
            assert_eq!(out, [0x18, 0x64]);
        }
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
                let st = lock(&st);
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
                let body = match storable(&req) {
                    Ok(b) => b,
                    Err(too_large) => return too_large,
                };
                let mut st = lock(&st);
                let current = st.version.to_be_bytes();
                let if_match: Vec<&[u8]> = req.options().get_all(opt::IF_MATCH).collect();
                if !if_match.is_empty() && !if_match.iter().any(|t| t.is_empty() || *t == current) {
                    return Code::PRECONDITION_FAILED.into_response();
                }
                st.version = st.version.wrapping_add(1);
                st.body = body;
                Response::new(Code::CHANGED).with_etag(&st.version.to_be_bytes())
            }
        })
}

/// `/create1`: PUT with If-None-Match creates once, then answers 4.12 (TD_COAP_CORE_23)
/// and is gone again, so that the test can run again.
fn create_resource() -> MethodRouter {
    let body: Arc<Mutex<Option<Vec<u8>>>> = Arc::new(Mutex::new(None));
    let read = body.clone();
    let del = body.clone();
    MethodRouter::default()
        .get(move || {
            let b = read.clone();
            async move {
                match lock(&b).clone() {
                    Some(v) => Response::content(v),
                    None => Code::NOT_FOUND.into_response(),
                }
            }
        })
        .put(move |req: Request| {
            let b = body.clone();
            async move {
                let value = match storable(&req) {
                    Ok(v) => v,
                    Err(too_large) => return too_large,
                };
                let mut b = lock(&b);
                let exists = b.is_some();
                if exists && req.options().contains(opt::IF_NONE_MATCH) {
                    *b = None;
                    return Code::PRECONDITION_FAILED.into_response();
                }
                *b = Some(value);
                if exists { Code::CHANGED } else { Code::CREATED }.into_response()
            }
        })
        .delete(move || {
            let b = del.clone();
            async move {
                *lock(&b) = None;
                Code::DELETED
            }
        })
}

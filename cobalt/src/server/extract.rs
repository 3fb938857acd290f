//! Handler arguments taken from the request, in the spirit of axum's extractors:
//! [`Path`] (route parameters), [`Query`], [`Payload`] and [`Text`] (the body). The
//! server's state is [`State`](super::State); the routes are
//! [`Routes`](super::Routes); the whole [`Request`] is one too.
//!
//! ```
//! use cobalt::server::extract::{Path, Query, Text};
//! use cobalt::server::{put, Server};
//! use std::collections::HashMap;
//!
//! let server = Server::new().route(
//!     "/rooms/{floor}/{room}",
//!     put(
//!         |Path((floor, room)): Path<(u8, String)>,
//!          Query(query): Query<HashMap<String, String>>,
//!          Text(body): Text| async move {
//!             let unit = query.get("unit").map_or("C", String::as_str);
//!             format!("floor {floor}, room {room}: {body} {unit}")
//!         },
//!     ),
//! );
//! # drop(server);
//! ```

use super::handler::{FromRequest, FromRequestParts};
use super::request::{Request, Response};
use cobalt_proto::message::Code;
use std::collections::HashMap;
use std::str::FromStr;

/// The answer to a request whose argument cannot be taken: 4.00 with `why`.
fn bad_request(why: String) -> Response {
    Response::new(Code::BAD_REQUEST).with_payload(why)
}

/// The route's parameters, parsed: `Path<String>` (or another [`FromStr`] type listed
/// under [`FromPath`]) for a route with one, a tuple such as `Path<(String, u32)>` for
/// several (in path order, a `{*name}` wildcard last), `Path<HashMap<String, String>>`
/// by name.
///
/// A value that does not parse is answered 4.00 with a payload naming the parameter;
/// a handler asking for a different number of parameters than its route has gets
/// 5.00 (a mistake in the server, logged as an error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Path<T>(pub T);

/// What [`Path`] can hold, made from the route's parameters as `(name, value)`.
pub trait FromPath: Sized {
    /// The value, or the answer to give instead of running the handler.
    fn from_path(params: &[(&str, &str)]) -> Result<Self, Response>;
}

impl<T: FromPath> FromRequestParts for Path<T> {
    fn from_request_parts(req: &Request) -> Result<Self, Response> {
        let mut params: [(&str, &str); 4] = [("", ""); 4];
        let mut n = 0;
        for p in req.params() {
            if n == params.len() {
                let all: Vec<(&str, &str)> = req.params().collect();
                return T::from_path(&all).map(Path);
            }
            params[n] = p;
            n += 1;
        }
        T::from_path(&params[..n]).map(Path)
    }
}

/// Parses the parameter `(name, value)` as a `T`.
fn parse_param<T: FromStr>((name, value): (&str, &str)) -> Result<T, Response>
where
    T::Err: std::fmt::Display,
{
    value.parse().map_err(|e| {
        bad_request(format!(
            "path parameter `{name}`: cannot read {value:?} as {}: {e}",
            std::any::type_name::<T>()
        ))
    })
}

/// The answer when a handler asks for `wanted` parameters from a route with
/// `params`: the server's mistake, not the client's.
fn wrong_count(wanted: usize, params: &[(&str, &str)]) -> Response {
    let names: Vec<&str> = params.iter().map(|(n, _)| *n).collect();
    let why = format!(
        "a handler takes {wanted} path parameter(s) but its route has {}: {names:?}",
        params.len()
    );
    tracing::error!("{why}");
    Response::new(Code::INTERNAL_SERVER_ERROR).with_payload(why)
}

/// `FromPath` for single values of the listed `FromStr` types.
macro_rules! from_path_one {
    ($($t:ty),*) => {$(
        impl FromPath for $t {
            fn from_path(params: &[(&str, &str)]) -> Result<Self, Response> {
                match params {
                    [one] => parse_param(*one),
                    _ => Err(wrong_count(1, params)),
                }
            }
        }
    )*};
}

from_path_one!(
    String, bool, char, u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64
);

/// `FromPath` for tuples of `FromStr` types, one parameter each.
macro_rules! from_path_tuple {
    ($n:literal: $($t:ident),*) => {
        impl<$($t: FromStr),*> FromPath for ($($t,)*)
        where
            $($t::Err: std::fmt::Display,)*
        {
            #[allow(non_snake_case)]
            fn from_path(params: &[(&str, &str)]) -> Result<Self, Response> {
                let [$($t),*] = params else {
                    return Err(wrong_count($n, params));
                };
                Ok(($(parse_param::<$t>(*$t)?,)*))
            }
        }
    };
}

from_path_tuple!(1: A);
from_path_tuple!(2: A, B);
from_path_tuple!(3: A, B, C);
from_path_tuple!(4: A, B, C, D);

impl FromPath for HashMap<String, String> {
    fn from_path(params: &[(&str, &str)]) -> Result<Self, Response> {
        Ok(params
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect())
    }
}

/// The Uri-Query items: `Query<Vec<String>>` as they came, `Query<HashMap<String,
/// String>>` by name (`name=value`; a bare `name` has the value `""`; of a name given
/// twice the first counts), or `Query<Vec<(String, String)>>` as pairs in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Query<T>(pub T);

/// What [`Query`] can hold, made from the Uri-Query items.
pub trait FromQuery: Sized {
    /// The value made of the items.
    fn from_query<'a>(items: impl Iterator<Item = &'a str>) -> Self;
}

/// An item split at its first `=` (`""` as the value of a bare name).
fn pair(item: &str) -> (String, String) {
    let (name, value) = item.split_once('=').unwrap_or((item, ""));
    (name.to_string(), value.to_string())
}

impl FromQuery for Vec<String> {
    fn from_query<'a>(items: impl Iterator<Item = &'a str>) -> Self {
        items.map(str::to_string).collect()
    }
}

impl FromQuery for Vec<(String, String)> {
    fn from_query<'a>(items: impl Iterator<Item = &'a str>) -> Self {
        items.map(pair).collect()
    }
}

impl FromQuery for HashMap<String, String> {
    fn from_query<'a>(items: impl Iterator<Item = &'a str>) -> Self {
        let mut out = HashMap::new();
        for (name, value) in items.map(pair) {
            out.entry(name).or_insert(value);
        }
        out
    }
}

impl<T: FromQuery> FromRequestParts for Query<T> {
    fn from_request_parts(req: &Request) -> Result<Self, Response> {
        Ok(Query(T::from_query(req.query())))
    }
}

/// The request's payload, taken out of it without a copy (the last argument only).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Payload(pub Vec<u8>);

impl FromRequest<super::handler::via::Request> for Payload {
    fn from_request(mut req: Request) -> Result<Self, Response> {
        Ok(Payload(req.take_payload()))
    }
}

/// The request's payload as text (the last argument only); one that is not UTF-8 is
/// answered 4.00.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Text(pub String);

impl FromRequest<super::handler::via::Request> for Text {
    fn from_request(mut req: Request) -> Result<Self, Response> {
        String::from_utf8(req.take_payload())
            .map(Text)
            .map_err(|e| bad_request(format!("the payload is not UTF-8 text: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::tree::ResourceTree;
    use crate::server::{get, put, MethodRouter};
    use cobalt_proto::message::{Message, MessageType};
    use futures_util::FutureExt;

    /// The answer of a tree holding `resource` at `route` to `method path?query` with
    /// `payload`.
    fn answer(route: &str, resource: MethodRouter, path: &str, payload: &[u8]) -> Response {
        let mut tree = ResourceTree::new();
        tree.insert(route, resource);
        let (path, query) = path.split_once('?').unwrap_or((path, ""));
        let mut m = Message::new(MessageType::Confirmable, Code::PUT, 1);
        m.options.set_uri_path(path);
        if !query.is_empty() {
            m.options.set_uri_query(query);
        }
        m.payload = payload.to_vec();
        let req = Request::new("127.0.0.1:9".parse().unwrap(), m);
        match tree.dispatch(req) {
            Ok(fut) => fut.now_or_never().expect("ready at once"),
            Err(refused) => refused,
        }
    }

    #[test]
    fn path_parses_one_several_or_all_parameters() {
        let one = put(|Path(id): Path<u32>| async move { format!("{}", id + 1) });
        assert_eq!(
            answer("/rd/{id}", one.clone(), "/rd/41", b"").text_payload(),
            "42"
        );
        let bad = answer("/rd/{id}", one, "/rd/x1", b"");
        assert_eq!(bad.code, Code::BAD_REQUEST);
        let why = bad.text_payload();
        assert!(
            why.contains("`id`") && why.contains("\"x1\"") && why.contains("u32"),
            "{why}"
        );

        let two = put(|Path((a, b)): Path<(String, i8)>| async move { format!("{a}{b}") });
        assert_eq!(
            answer("/{a}/{b}", two.clone(), "/x/-3", b"").text_payload(),
            "x-3"
        );
        let mismatch = answer("/{a}", two, "/x", b"");
        assert_eq!(
            mismatch.code,
            Code::INTERNAL_SERVER_ERROR,
            "the server's mistake"
        );
        assert!(
            mismatch.text_payload().contains("2 path parameter"),
            "{mismatch:?}"
        );

        let all = put(|Path(m): Path<HashMap<String, String>>| async move {
            format!("{} {}", m["dir"], m["rest"])
        });
        assert_eq!(
            answer("/f/{dir}/{*rest}", all, "/f/d/x/y", b"").text_payload(),
            "d x/y"
        );
    }

    #[test]
    fn query_gives_items_pairs_or_a_map() {
        let items = put(|Query(q): Query<Vec<String>>| async move { q.join("|") });
        assert_eq!(
            answer("/q", items, "/q?a=1&flag&a=2", b"").text_payload(),
            "a=1|flag|a=2"
        );
        let map = put(|Query(q): Query<HashMap<String, String>>| async move {
            format!("{} {:?} {}", q["a"], q["flag"], q.len())
        });
        assert_eq!(
            answer("/q", map, "/q?a=1&flag&a=2", b"").text_payload(),
            "1 \"\" 2"
        );
        let pairs = put(|Query(q): Query<Vec<(String, String)>>| async move { format!("{q:?}") });
        assert_eq!(
            answer("/q", pairs, "/q?k=v=w", b"").text_payload(),
            r#"[("k", "v=w")]"#
        );
    }

    #[test]
    fn payload_and_text_take_the_body_last() {
        let bytes = put(|Payload(p): Payload| async move { format!("{}", p.len()) });
        assert_eq!(answer("/b", bytes, "/b", b"\xff\x00").text_payload(), "2");
        let text = put(|Text(t): Text| async move { t.to_uppercase() });
        assert_eq!(answer("/t", text.clone(), "/t", b"hi").text_payload(), "HI");
        let bad = answer("/t", text, "/t", b"\xff");
        assert_eq!(bad.code, Code::BAD_REQUEST);
        assert!(bad.text_payload().contains("UTF-8"), "{bad:?}");
    }

    #[test]
    fn four_arguments_and_the_request_itself() {
        let four = put(
            |Path(id): Path<String>, Query(q): Query<Vec<String>>, req: Request| async move {
                format!("{id} {} {}", q.len(), req.method())
            },
        );
        assert_eq!(
            answer("/x/{id}", four, "/x/7?a", b"").text_payload(),
            "7 1 PUT"
        );
        let all = put(
            |Path(id): Path<u8>,
             Query(q): Query<Vec<String>>,
             routes: crate::server::Routes,
             Text(t): Text| async move {
                format!("{id} {} {} {t}", q.len(), routes.links().len())
            },
        );
        assert_eq!(
            answer("/x/{id}", all, "/x/7?a&b", b"body").text_payload(),
            "7 2 0 body"
        );
        let none = get(|| async { "still" });
        assert_eq!(
            answer("/n", none.put(|| async { "put" }), "/n", b"").text_payload(),
            "put"
        );
    }
}

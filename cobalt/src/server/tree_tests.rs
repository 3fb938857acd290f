//! Matching (static before parameter before wildcard), the fallback, removal and
//! discovery of the resource tree.

use super::*;
use crate::server::{any, get, UploadChunk};
use cobalt_proto::message::MessageType;
use futures_util::FutureExt;

fn request(method: Code, path: &str) -> Request {
    let mut m = Message::new(MessageType::Confirmable, method, 1);
    m.options.set_uri_path(path);
    Request::new("127.0.0.1:9".parse().unwrap(), m)
}

/// The answer of `tree` to `method path`, run to completion.
fn answer(tree: &ResourceTree, method: Code, path: &str) -> Response {
    match tree.route(request(method, path)) {
        Ok(routed) => routed.future.now_or_never().expect("handler ready at once"),
        Err(refused) => refused,
    }
}

fn text(tree: &ResourceTree, path: &str) -> String {
    let r = answer(tree, Code::GET, path);
    assert_eq!(r.code, Code::CONTENT, "GET {path}: {r:?}");
    r.text_payload()
}

/// A GET handler answering `name` and the request's parameters.
fn named(name: &'static str) -> MethodRouter {
    get(move |req: Request| async move {
        let params: Vec<String> = req.params().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{name} {}", params.join(","))
    })
}

#[test]
fn static_segments_win_over_parameters_over_wildcards() {
    let mut tree = ResourceTree::new();
    tree.insert("/a/b", named("static"));
    tree.insert("/a/b/d", named("static-d"));
    tree.insert("/a/{x}", named("param"));
    tree.insert("/a/{x}/c", named("param-c"));
    tree.insert("/a/{*rest}", named("wild"));
    tree.insert("/m/{x}/{y}", named("two"));
    assert_eq!(text(&tree, "/a/b"), "static ");
    assert_eq!(text(&tree, "/a/b/d"), "static-d ");
    assert_eq!(text(&tree, "/a/z"), "param x=z");
    assert_eq!(
        text(&tree, "/a/b/c"),
        "param-c x=b",
        "a static segment that leads nowhere gives way to the parameter"
    );
    assert_eq!(text(&tree, "/a/q/r/s"), "wild rest=q/r/s");
    assert_eq!(
        text(&tree, "/a"),
        "wild rest=",
        "a wildcard takes zero segments"
    );
    assert_eq!(text(&tree, "/m/1/2"), "two x=1,y=2");
    assert_eq!(answer(&tree, Code::GET, "/m/1").code, Code::NOT_FOUND);
    assert_eq!(answer(&tree, Code::GET, "/m/1/2/3").code, Code::NOT_FOUND);
    assert_eq!(
        answer(&tree, Code::POST, "/a/z").code,
        Code::METHOD_NOT_ALLOWED
    );
}

#[test]
fn a_parameter_does_not_take_an_empty_segment() {
    let mut tree = ResourceTree::new();
    tree.insert("/rd/{id}", named("param"));
    let mut m = Message::new(MessageType::Confirmable, Code::GET, 1);
    m.options.push(cobalt_proto::message::opt::URI_PATH, b"rd");
    m.options.push(cobalt_proto::message::opt::URI_PATH, b"");
    let r = tree.route(Request::new("127.0.0.1:9".parse().unwrap(), m));
    assert_eq!(r.err().map(|r| r.code), Some(Code::NOT_FOUND));
}

#[test]
fn param_reads_segments_and_static_routes_have_none() {
    let mut tree = ResourceTree::new();
    tree.insert(
        "/rd/{id}/{*rest}",
        get(|req: Request| async move {
            format!(
                "{:?} {:?} {:?}",
                req.param("id"),
                req.param("rest"),
                req.param("nope")
            )
        }),
    );
    tree.insert(
        "/plain",
        get(|req: Request| async move { format!("{:?}", req.param("id")) }),
    );
    assert_eq!(
        text(&tree, "/rd/4521/x/y"),
        r#"Some("4521") Some("x/y") None"#
    );
    assert_eq!(text(&tree, "/plain"), "None");
}

#[test]
fn the_fallback_answers_what_no_route_matches() {
    let mut tree = ResourceTree::new();
    tree.insert("/known", named("known"));
    assert_eq!(answer(&tree, Code::GET, "/unknown").code, Code::NOT_FOUND);
    tree.set_fallback(get(|req: Request| async move {
        format!("fallback {}", req.path())
    }));
    assert_eq!(text(&tree, "/unknown/x"), "fallback /unknown/x");
    assert_eq!(text(&tree, "/known"), "known ");
    assert_eq!(
        answer(&tree, Code::DELETE, "/unknown").code,
        Code::METHOD_NOT_ALLOWED,
        "the fallback has no DELETE handler"
    );
    let core = answer(&tree, Code::GET, WELL_KNOWN_CORE);
    assert!(core.text_payload().contains("</known>"), "{core:?}");
    assert!(tree.links().iter().all(|l| l.target == "/known"));
}

#[test]
fn well_known_core_is_generated_even_under_a_root_wildcard() {
    let mut tree = ResourceTree::new();
    tree.insert("/{*all}", named("wild"));
    tree.insert("/s", named("s"));
    let core = answer(&tree, Code::GET, WELL_KNOWN_CORE);
    assert_eq!(core.text_payload(), "</s>");
    assert_eq!(text(&tree, "/x/y"), "wild all=x/y");
}

#[test]
fn removal_prunes_and_discovery_follows() {
    let mut tree = ResourceTree::new();
    tree.insert("/things/{n}", named("pattern").rt("thing"));
    tree.insert("/things/7", named("seven").rt("thing"));
    tree.insert("/hidden", named("h").hidden());
    let targets =
        |t: &ResourceTree| -> Vec<String> { t.links().iter().map(|l| l.target.clone()).collect() };
    assert_eq!(targets(&tree), ["/things/7"], "no pattern, nothing hidden");
    assert!(tree.contains("/things/{n}") && tree.contains("/things/7"));
    assert!(!tree.contains("/things/8"));
    assert!(tree.remove("/things/7").is_some());
    assert!(tree.remove("/things/7").is_none(), "already gone");
    assert!(targets(&tree).is_empty());
    assert_eq!(text(&tree, "/things/7"), "pattern n=7");
    assert!(tree.patterns);
    assert!(tree.remove("/things/{n}").is_some());
    assert!(!tree.patterns, "no route with parameters is left");
    assert!(
        !tree.root.children.contains_key("things"),
        "emptied nodes pruned"
    );
    assert_eq!(answer(&tree, Code::GET, "/things/7").code, Code::NOT_FOUND);
    assert!(tree.remove("/{bad").is_none());
}

#[test]
fn pattern_routes_inherit_and_choose_executors() {
    let mut tree = ResourceTree::new();
    tree.insert("/rd/{id}", named("rd"));
    tree.insert("/rd/{id}/own", named("own"));
    tree.set_executor("/rd/{id}", Executor::blocking(1).unwrap());
    tree.set_executor("/rd/{id}/own", Executor::blocking(2).unwrap());
    let executor = |path| {
        let routed = tree.route(request(Code::GET, path)).ok().unwrap();
        format!("{:?}", routed.executor)
    };
    assert_eq!(executor("/rd/1"), "Threads(1)");
    assert_eq!(executor("/rd/1/own"), "Threads(2)");
}

#[test]
fn observables_of_pattern_routes_and_the_fallback_are_found() {
    let (a, b, c) = (Observable::new(), Observable::new(), Observable::new());
    let mut tree = ResourceTree::new();
    tree.insert("/s", named("s").observable(&a));
    tree.insert("/p/{x}", named("p").observable(&b));
    tree.set_fallback(any(|| async { "f" }).observable(&c));
    let mut ids: Vec<u64> = tree.observables().iter().map(Observable::id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [a.id(), b.id(), c.id()]);
}

#[test]
fn stream_uploads_of_pattern_routes_see_their_parameters() {
    let mut tree = ResourceTree::new();
    let upload = MethodRouter::default()
        .stream_upload(Code::PUT, |chunk: UploadChunk| async move {
            chunk.request.param("name").unwrap_or("none").to_string()
        });
    tree.insert("/up/{name}", upload);
    let mut m = Message::new(MessageType::Confirmable, Code::PUT, 1);
    m.options.set_uri_path("/up/file.bin");
    let (handler, _) = tree.stream_route(&m).expect("a streaming handler");
    let chunk = UploadChunk {
        request: Request::new("127.0.0.1:9".parse().unwrap(), m),
        offset: 0,
        last: true,
    };
    let r = handler(chunk).now_or_never().unwrap();
    assert_eq!(r.text_payload(), "file.bin");
}

#[test]
fn long_paths_match_patterns_past_the_inline_segments() {
    let mut tree = ResourceTree::new();
    tree.insert("/deep/{*rest}", named("deep"));
    let segments: Vec<String> = (0..INLINE_SEGMENTS + 4).map(|i| i.to_string()).collect();
    let path = format!("/deep/{}", segments.join("/"));
    assert_eq!(
        text(&tree, &path),
        format!("deep rest={}", segments.join("/"))
    );
}

#[test]
fn static_paths_follow_edits_and_executors_set_after_them() {
    let mut tree = ResourceTree::new();
    tree.insert("/a/b", named("first"));
    tree.insert("/a/{x}", named("param"));
    tree.set_executor("/a", Executor::blocking(3).unwrap());
    let executor = |tree: &ResourceTree, path| {
        let routed = tree.route(request(Code::GET, path)).ok().unwrap();
        format!("{:?}", routed.executor)
    };
    assert_eq!(executor(&tree, "/a/b"), "Threads(3)");
    tree.insert("/a/b", named("second"));
    assert_eq!(text(&tree, "/a/b"), "second ");
    tree.remove("/a/b");
    assert_eq!(text(&tree, "/a/b"), "param x=b");
    tree.remove("/a/{x}");
    assert_eq!(answer(&tree, Code::GET, "/a/b").code, Code::NOT_FOUND);
}

#[test]
fn static_paths_longer_than_the_index_takes_are_found_by_the_walk() {
    let mut tree = ResourceTree::new();
    let segments: Vec<String> = (0..EXACT_SEGMENTS + 3).map(|i| i.to_string()).collect();
    let path = format!("/{}", segments.join("/"));
    tree.insert(&path, named("long"));
    tree.insert("/", named("root"));
    assert_eq!(text(&tree, &path), "long ");
    assert_eq!(text(&tree, "/"), "root ");
}

#[test]
fn only_a_streamed_method_looks_for_a_streaming_route() {
    let mut tree = ResourceTree::new();
    let upload = get(|| async { "whole" })
        .stream_upload(Code::PUT, |_: UploadChunk| async move { "streamed" });
    tree.insert("/up", upload);
    let mut m = Message::new(MessageType::Confirmable, Code::PUT, 1);
    m.options.set_uri_path("/up");
    assert!(tree.stream_route(&m).is_some());
    m.code = Code::GET;
    assert!(tree.stream_route(&m).is_none());
    assert_eq!(text(&tree, "/up"), "whole");
    tree.remove("/up");
    m.code = Code::PUT;
    assert!(tree.stream_route(&m).is_none());
}

//! `cobalt rd` as a user runs it: the directory with its data directory, and the
//! device commands register, lookup, update and remove against it, across a restart.

#[path = "common/binary.rs"]
mod binary;

use binary::{cobalt, serve_printing, ChildGuard};
use cobalt_test_support::temp::TempDir;
use std::path::Path;

fn start_rd(data: &Path) -> (ChildGuard, String) {
    let mut rd = cobalt();
    rd.args(["rd", "--bind", "127.0.0.1", "--port", "0", "--data-dir"])
        .arg(data);
    let (server, found) = serve_printing(rd, &["cobalt: resource directory on "]);
    let origin = found[0].trim_end_matches("/rd").to_string();
    (server, origin)
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = cobalt().args(args).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

#[test]
fn register_look_up_update_and_remove_across_a_restart() {
    let dir = TempDir::new("rd-cli");
    let links = dir.write("links", "</temp>;rt=\"temperature\";obs\n");
    let data = dir.path().join("data");
    let (server, origin) = start_rd(&data);

    let (code, location, err) = run(&[
        "rd",
        "register",
        &origin,
        "--ep",
        "kitchen",
        "--lt",
        "600",
        "--links",
        links.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(location.trim(), format!("{origin}/rd/0"));
    let (code, found, _) = run(&["rd", "lookup", "res", &origin, "rt=temp*"]);
    assert_eq!(code, 0);
    assert!(
        found.starts_with("<coap://127.0.0.1:")
            && found.contains("/temp>;rt=\"temperature\";obs;anchor="),
        "{found}"
    );
    assert_eq!(run(&["rd", "update", location.trim(), "--lt", "900"]).0, 0);
    let (code, _, err) = run(&["rd", "lookup", "ep", &origin, "count=x"]);
    assert_eq!(code, 4, "a 4.00 exits 4");
    assert!(err.contains("count=x"), "{err}");
    drop(server);

    assert!(data.join("registrations.redb").is_file());
    let (_server, origin) = start_rd(&data);
    let (_, found, _) = run(&["rd", "lookup", "ep", &origin]);
    assert!(
        found.starts_with("</rd/0>;ep=kitchen;base=coap://127.0.0.1:"),
        "{found}"
    );
    assert_eq!(run(&["rd", "remove", &format!("{origin}/rd/0")]).0, 0);
    assert_eq!(run(&["rd", "lookup", "ep", &origin]).1, "");
    let (code, _, err) = run(&["rd", "register", &origin, "--ep", &"x".repeat(70)]);
    assert_eq!(code, 4);
    assert!(err.contains("4.00"), "{err}");
}

/// `cobalt rd --store redis://…` on a shared `redis-server` (skipped without one,
/// failed under COBALT_REQUIRE_PEERS=1): two nodes, a registration made through one
/// found through the other, each node with its metrics endpoint.
#[test]
fn two_nodes_on_one_redis_store_answer_for_each_others_registrations() {
    use cobalt_test_support::peers;
    let Some(redis) = peers::redis::start() else {
        return;
    };
    let url = peers::redis::url(&redis);
    let node = || {
        let mut rd = cobalt();
        rd.args(["rd", "--bind", "127.0.0.1", "--port", "0", "--store", &url])
            .args(["--metrics", "127.0.0.1:0"]);
        let (server, found) = serve_printing(
            rd,
            &["cobalt: resource directory on ", "cobalt: metrics on "],
        );
        (
            server,
            found[0].trim_end_matches("/rd").to_string(),
            found[1].clone(),
        )
    };
    let (_a, a, a_metrics) = node();
    let (_b, b, _) = node();
    let (code, location, err) = run(&["rd", "register", &a, "--ep", "shared", "--lt", "600"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(location.trim(), format!("{a}/rd/0"));
    // The change feed is asynchronous: give node b a moment, then insist.
    let mut found = String::new();
    for _ in 0..100 {
        found = run(&["rd", "lookup", "ep", &b, "ep=shared"]).1;
        if !found.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        found.starts_with("</rd/0>;ep=shared;base=coap://127.0.0.1:"),
        "{found}"
    );
    // Node a answered the registration: RD discovery and the POST, nothing else.
    let a_metrics = a_metrics
        .trim_start_matches("http://")
        .trim_end_matches("/metrics");
    assert_eq!(binary::metric(a_metrics, "cobalt_requests_total"), 2.0);
}

/// `cobalt rd --cid` (a cluster node's DTLS with Connection IDs that start with its
/// id): a client asking for a CID is served over coaps://; a node id that is not hex
/// is refused with the reason.
#[cfg(feature = "mbedtls")]
#[test]
fn a_node_grants_dtls_connection_ids_with_its_node_id() {
    let dir = TempDir::new("rd-cid");
    let keys = dir.write("keys.txt", "device-1:secretPSK\n");
    let node = |node_id: &str| {
        let mut rd = cobalt();
        rd.args(["rd", "--in-memory", "--bind", "127.0.0.1", "--port", "0"])
            .arg("--dtls-psk-file")
            .arg(&keys)
            .args(["--cid", "6", "--cid-node-id", node_id]);
        rd
    };
    let (_server, found) = serve_printing(node("07"), &["cobalt: resource directory on coaps://"]);
    let psk = ["--psk-identity", "device-1", "--psk-key", "secretPSK"];
    let uri = format!(
        "coaps://{}/.well-known/core",
        found[0].trim_end_matches("/rd")
    );
    let out = cobalt()
        .args(["get", &uri, "--cid"])
        .args(psk)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("rt=\"core.rd\""),
        "{out:?}"
    );
    let out = node("7g").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not hex"), "{err}");
}

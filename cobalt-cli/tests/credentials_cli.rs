//! `cobalt serve --credentials FILE` and `cobalt get --credentials FILE` with one
//! aiocoap-style credentials file each: OSCORE over coap:// (the traffic carries the
//! OSCORE option and no Uri-Path) and a DTLS PSK over coaps://.
#![cfg(feature = "openssl")]

#[path = "common/binary.rs"]
mod binary;

use binary::{cobalt, serve_until};
use cobalt_test_support::ports::{free_udp_port, V4};
use cobalt_test_support::temp::TempDir;

/// An aiocoap OSCORE context directory `name` of `dir`.
fn context(dir: &TempDir, name: &str, sender: &str, recipient: &str) {
    std::fs::create_dir_all(dir.path().join(name)).unwrap();
    dir.write(
        &format!("{name}/settings.json"),
        format!(
            r#"{{"sender-id_hex": "{sender}", "recipient-id_hex": "{recipient}", "secret_ascii": "cli-test-secret!"}}"#
        ),
    );
}

#[test]
fn serve_and_get_with_one_credentials_file_each() {
    let dir = TempDir::new("credentials-cli");
    context(&dir, "server-ctx", "01", "");
    context(&dir, "client-ctx", "", "01");
    let server_file = dir.write(
        "server.json",
        r#"{":client": {"oscore": {"basedir": "server-ctx/"}},
            ":alice": {"dtls": {"client-identity": {"ascii": "alice"}, "psk": {"ascii": "secretPSK"}}}}"#,
    );
    let (port, dtls_port) = (free_udp_port(V4), free_udp_port(V4));
    let mut serve = cobalt();
    serve
        .args(["serve", "--bind", "127.0.0.1", "--shards", "1"])
        .args([
            "--port",
            &port.to_string(),
            "--dtls-port",
            &dtls_port.to_string(),
        ])
        .arg("--credentials")
        .arg(&server_file);
    let _server = serve_until(serve, "serving CoAP over DTLS on");

    let client_file = dir.write(
        "client.json",
        format!(
            r#"{{"coap://127.0.0.1:{port}/*": {{"oscore": {{"basedir": "client-ctx/"}}}},
                "coaps://127.0.0.1:{dtls_port}/*": {{"dtls": {{"client-identity": {{"ascii": "alice"}}, "psk": {{"ascii": "secretPSK"}}}}}}}}"#
        ),
    );
    let get = |uri: &str| {
        cobalt()
            .args(["get", "-v", uri, "--credentials"])
            .arg(&client_file)
            .output()
            .unwrap()
    };
    let protected = get(&format!("coap://127.0.0.1:{port}/benchmark"));
    let (out, traffic) = (
        String::from_utf8_lossy(&protected.stdout),
        String::from_utf8_lossy(&protected.stderr),
    );
    assert!(protected.status.success(), "{out}\n{traffic}");
    assert_eq!(out.trim(), "hello world");
    assert!(
        traffic.contains("Option(9)"),
        "the request went protected: {traffic}"
    );
    assert!(
        !traffic.contains("benchmark"),
        "no Uri-Path outside: {traffic}"
    );
    let sequence = std::fs::read_to_string(dir.path().join("client-ctx/sequence.json")).unwrap();
    assert!(sequence.contains("next-to-send"), "{sequence}");

    let dtls = get(&format!("coaps://127.0.0.1:{dtls_port}/benchmark"));
    assert!(
        dtls.status.success(),
        "{}",
        String::from_utf8_lossy(&dtls.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&dtls.stdout).trim(), "hello world");

    // A file that is not a credentials file is a usage error naming it.
    let bad = dir.write("bad.json", "[1, 2]");
    let refused = cobalt()
        .args(["get", "coap://127.0.0.1:1/x", "--credentials"])
        .arg(&bad)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("bad.json"), "{stderr}");
}

/// Writes an EDHOC identity's private key (mode 0600) and returns its entry's
/// own-credential fields.
fn own_identity(
    dir: &TempDir,
    name: &str,
    identity: &cobalt_oscore::EdhocIdentity,
) -> serde_json::Value {
    use std::os::unix::fs::PermissionsExt;
    let key = dir.write(&format!("{name}.cosekey"), identity.private_key_cose());
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    serde_json::json!({
        "own_cred_style": "by-key-id",
        "own_cred": identity.credential().to_json(),
        "private_key_file": format!("{name}.cosekey"),
    })
}

/// An `edhoc-oscore` entry: `fields` with suite 2 and method 3.
fn edhoc_entry(mut fields: serde_json::Value) -> serde_json::Value {
    fields["suite"] = 2.into();
    fields["method"] = 3.into();
    serde_json::json!({ "edhoc-oscore": fields })
}

#[test]
fn serve_and_get_with_edhoc_credentials() {
    use cobalt_oscore::{CredentialStyle, EdhocIdentity};
    let dir = TempDir::new("credentials-cli-edhoc");
    let server = EdhocIdentity::generate("server", b"\x0a", CredentialStyle::ByKeyId);
    let client = EdhocIdentity::generate("client", b"\x0b", CredentialStyle::ByKeyId);
    let port = free_udp_port(V4);
    let origin = format!("coap://127.0.0.1:{port}");
    let server_file = dir.write(
        "server.json",
        serde_json::json!({
            format!("{origin}/*"): edhoc_entry(own_identity(&dir, "server", &server)),
            ":client": edhoc_entry(serde_json::json!({"peer_cred": client.credential().to_json()})),
        })
        .to_string(),
    );
    let mut serve = cobalt();
    serve
        .args(["serve", "--bind", "127.0.0.1", "--shards", "1"])
        .args(["--port", &port.to_string()])
        .arg("--credentials")
        .arg(&server_file);
    let _server = serve_until(serve, "serving CoAP on");

    let get = |name: &str, identity: &EdhocIdentity, combined: bool| {
        let mut entry = own_identity(&dir, name, identity);
        entry["peer_cred"] = server.credential().to_json();
        entry["use_combined_edhoc"] = combined.into();
        let file = dir.write(
            &format!("{name}.json"),
            serde_json::json!({ format!("{origin}/*"): edhoc_entry(entry) }).to_string(),
        );
        cobalt()
            .args(["get", "-v", &format!("{origin}/benchmark"), "--credentials"])
            .arg(&file)
            .output()
            .unwrap()
    };
    for combined in [false, true] {
        let protected = get("client", &client, combined);
        let (out, traffic) = (
            String::from_utf8_lossy(&protected.stdout),
            String::from_utf8_lossy(&protected.stderr),
        );
        assert!(protected.status.success(), "{out}\n{traffic}");
        assert_eq!(out.trim(), "hello world");
        assert_eq!(
            traffic.matches("edhoc").count(),
            if combined { 1 } else { 2 },
            "EDHOC first (message_3 alone or not): {traffic}"
        );
        assert!(
            traffic.contains("Option(9)"),
            "then the request went protected: {traffic}"
        );
        assert_eq!(traffic.contains("Option(21)"), combined, "{traffic}");
    }

    // A client the server does not know (another key ID): EDHOC is refused, exit
    // status 4.
    let stranger = EdhocIdentity::generate("stranger", b"\x0c", CredentialStyle::ByKeyId);
    let refused = get("stranger", &stranger, false);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("EDHOC"), "{stderr}");
    assert!(stderr.contains("not one this server knows"), "{stderr}");
}

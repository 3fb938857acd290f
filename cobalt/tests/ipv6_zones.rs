//! Link-local IPv6 with zones (RFC 6874): `coap://[fe80::…%25eth0]/` reaches a server
//! bound to that interface's link-local address. Skipped (with a note) on a machine
//! without a link-local address.

use cobalt::server::get;
use cobalt::Scheme;
use cobalt::{Client, Server};
use std::net::{Ipv6Addr, SocketAddrV6};

/// A link-local address of this machine with its interface name and index, from
/// /proc/net/if_inet6 (address, index, prefix, scope 0x20 = link, flags, name).
fn link_local() -> Option<(Ipv6Addr, String, u32)> {
    let table = std::fs::read_to_string("/proc/net/if_inet6").ok()?;
    table.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || f[3] != "20" {
            return None;
        }
        let addr = u128::from_str_radix(f[0], 16).ok()?;
        let index = u32::from_str_radix(f[1], 16).ok()?;
        Some((Ipv6Addr::from(addr), f[5].to_string(), index))
    })
}

#[tokio::test]
async fn a_zoned_link_local_uri_reaches_its_interface() {
    let Some((addr, name, index)) = link_local() else {
        eprintln!("SKIPPED: no link-local IPv6 address on this machine");
        return;
    };
    let server = Server::new()
        .route("/x", get(|| async { "on the link" }))
        .bind(SocketAddrV6::new(addr, 0, 0, index))
        .await
        .unwrap();
    let port = server.local_addr(Scheme::Coap).unwrap().port();
    let client = Client::new();
    for zone in [name.clone(), index.to_string()] {
        let uri = format!("coap://[{addr}%25{zone}]:{port}/x");
        let r = client
            .get(&uri)
            .await
            .unwrap_or_else(|e| panic!("{uri}: {e}"));
        assert_eq!(r.text_payload(), "on the link", "{uri}");
    }
    let e = client
        .get(&format!("coap://[{addr}%25no-such-if0]:{port}/x"))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("no network interface 'no-such-if0'"),
        "{e}"
    );
}

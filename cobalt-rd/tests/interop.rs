//! Interop of the resource directory with real peers: aiocoap's RD client and
//! libcoap's `coap-client` at Cobalt's RD, and Cobalt's RdClient at `aiocoap-rd`.
//! A missing peer skips the test, or fails it under `COBALT_REQUIRE_PEERS=1`.

use cobalt::{Client, Scheme, Server, ServerHandle};
use cobalt_rd::{find_interface, lookup_at, MemoryStore, RdClient, RdLimits, ResourceDirectory};
use cobalt_test_support::need;
use cobalt_test_support::peers::{aiocoap, libcoap, Listen, PeerServer, COMMAND_LIMIT};
use cobalt_test_support::ports::V4;
use cobalt_test_support::process::run;
use cobalt_test_support::ready::Ready;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

async fn cobalt_rd() -> (ResourceDirectory, ServerHandle, String) {
    let rd = ResourceDirectory::open(Arc::new(MemoryStore::new()), RdLimits::default())
        .await
        .unwrap();
    let server = rd.install(Server::new()).bind("127.0.0.1:0").await.unwrap();
    let origin = format!("coap://{}", server.local_addr(Scheme::Coap).unwrap());
    (rd, server, origin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aiocoap_registerer_registers_looks_up_and_removes_at_cobalt() {
    let python = need!("aiocoap", aiocoap::python());
    let (rd, server, origin) = cobalt_rd().await;
    let script = aiocoap::script("aiocoap_rd_register.py");
    let rd_uri = origin.clone();
    let ran = tokio::task::spawn_blocking(move || {
        run(
            Command::new(python)
                .arg(script)
                .args(["--rd", &rd_uri, "--ep", "aio1"]),
            COMMAND_LIMIT,
        )
    })
    .await
    .unwrap();
    assert!(ran.status.success(), "{}\n{}", ran.stdout, ran.stderr);
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert!(
        lines[0].starts_with(&format!("registered {origin}/rd/")),
        "{lines:?}"
    );
    let lookup = lines[1];
    assert!(
        lookup.starts_with("lookup 2.05 Content <coap://127.0.0.1:"),
        "{lookup}"
    );
    assert!(
        lookup.contains("/sensors/temp>")
            && lookup.contains("rt=\"temperature\"")
            && lookup.contains("anchor="),
        "{lookup}"
    );
    assert_eq!(lines[2], "removed");
    assert!(
        rd.is_empty().await,
        "the Registerer's shutdown removes the registration"
    );
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aiocoap_endpoint_registers_simply_and_cobalt_fetches_its_well_known_core() {
    let python = need!("aiocoap", aiocoap::python());
    let (rd, server, origin) = cobalt_rd().await;
    let script = aiocoap::script("aiocoap_rd_register.py");
    let rd_uri = origin.clone();
    let ran = tokio::task::spawn_blocking(move || {
        let args = ["--rd", &rd_uri, "--ep", "aiosimple", "--simple"];
        run(Command::new(python).arg(script).args(args), COMMAND_LIMIT)
    })
    .await
    .unwrap();
    assert!(ran.status.success(), "{}\n{}", ran.stdout, ran.stderr);
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(lines[0], "registered 2.04 Changed", "{lines:?}");
    assert!(
        lines[1].starts_with("lookup 2.05 Content <coap://127.0.0.1:"),
        "{lines:?}"
    );
    assert!(lines[1].contains("/sensors/temp>"), "{lines:?}");
    assert_eq!(rd.len().await, 1);
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libcoap_client_registers_updates_looks_up_and_removes_at_cobalt() {
    let coap_client = need!("libcoap's coap-client", libcoap::tool(libcoap::CLIENT));
    let (_rd, server, origin) = cobalt_rd().await;
    let tool = move |args: Vec<String>| {
        let coap_client = coap_client.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                run(Command::new(coap_client).args(args), COMMAND_LIMIT)
            })
            .await
            .unwrap()
        }
    };
    let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let reg = tool(s(&[
        "-v",
        "7",
        "-m",
        "post",
        "-t",
        "40",
        "-e",
        "</lc/light>;rt=\"light-lux\";if=\"core.s\"",
        &format!("{origin}/rd?ep=libcoap1&lt=300"),
    ]))
    .await;
    assert!(reg.status.success(), "{}\n{}", reg.stdout, reg.stderr);
    let log = format!("{}{}", reg.stdout, reg.stderr);
    assert!(log.contains("2.01"), "no 2.01 in coap-client's log:\n{log}");
    let upd = tool(s(&["-m", "post", &format!("{origin}/rd/0?lt=600")])).await;
    assert!(upd.status.success(), "{}", upd.stderr);
    let res = tool(s(&[&format!("{origin}/rd-lookup/res?rt=light*")])).await;
    let links = cobalt::proto::link_format::parse(res.stdout.trim()).unwrap();
    assert_eq!(links.len(), 1, "{}", res.stdout);
    assert!(
        links[0].target.starts_with("coap://127.0.0.1:") && links[0].target.ends_with("/lc/light"),
        "{}",
        res.stdout
    );
    assert_eq!(links[0].get("rt"), Some("light-lux"));
    let ep = tool(s(&[&format!("{origin}/rd-lookup/ep?ep=libcoap1")])).await;
    assert!(
        ep.stdout
            .starts_with("</rd/0>;ep=libcoap1;base=coap://127.0.0.1:"),
        "{}",
        ep.stdout
    );
    let del = tool(s(&["-m", "delete", &format!("{origin}/rd/0")])).await;
    assert!(del.status.success(), "{}", del.stderr);
    let ep = tool(s(&[&format!("{origin}/rd-lookup/ep")])).await;
    assert_eq!(ep.stdout.trim(), "");
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cobalt_rd_client_registers_at_aiocoap_rd() {
    let bin = need!("aiocoap-rd", aiocoap::program("aiocoap-rd"));
    let listen = Listen {
        ip: V4,
        free: &[0],
        at: 0,
        ready: Ready::CoapPing,
    };
    let peer = tokio::task::spawn_blocking(move || {
        PeerServer::start("aiocoap-rd", listen, None, |port| {
            let mut c = Command::new(&bin);
            c.arg("--bind").arg(format!("127.0.0.1:{port}"));
            c
        })
    })
    .await
    .unwrap();
    let origin = peer.uri("");
    let client = Client::new();
    let registration = RdClient::discover(&client, &origin).await.unwrap();
    assert!(registration.starts_with(&origin), "{registration}");
    let mut rd = RdClient::new(client.clone(), &registration, "cobalt1")
        .lifetime(300)
        .links("</temp>;rt=\"temperature\"");
    let location = rd.register().await.unwrap().to_string();
    assert!(location.starts_with(&origin), "{location}");
    rd.update().await.unwrap();
    let res = find_interface(&client, &origin, "core.rd-lookup-res")
        .await
        .unwrap();
    let links = lookup_at(&client, &res, &[("ep", "cobalt1")])
        .await
        .unwrap();
    assert_eq!(links.len(), 1, "{links:?}");
    assert!(links[0].target.ends_with("/temp"), "{links:?}");
    assert_eq!(links[0].get("rt"), Some("temperature"));
    rd.remove().await.unwrap();
    let links = lookup_at(&client, &res, &[("ep", "cobalt1")])
        .await
        .unwrap();
    assert!(links.is_empty(), "{links:?}");
}

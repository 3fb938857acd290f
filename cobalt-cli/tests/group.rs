//! Group communication (RFC 7252 §8, groupcomm-bis) between network namespaces on one
//! bridge: `cobalt serve --multicast` servers answer a `cobalt get --non --wait` group
//! request and libcoap's `coap-client -N`; libcoap's `coap-server -g` and an aiocoap
//! server (`multicast=[...]`) answer Cobalt's group request.
//!
//! Needs root, iproute2 and network namespaces: skipped (with why) elsewhere, failed
//! when COBALT_REQUIRE_NETNS=1 says this machine must run them. The peers (libcoap's
//! `coap-client-notls`/`coap-server-notls`, aiocoap in `.venv-peers/`) are skipped
//! when missing unless COBALT_REQUIRE_PEERS=1. Every namespace and interface is
//! named `cbgr-…` and removed when the test ends, passed or not.

use cobalt_test_support::peers::{aiocoap, on_path, require};
use cobalt_test_support::process::{run, ChildGuard, Ran};
use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The longest any command of these tests may run.
const LIMIT: Duration = Duration::from_secs(30);

/// The interface of every member namespace (the namespace's own, so one name serves
/// all).
const IFACE: &str = "cbgr-v";

/// Member namespaces `1..=members` on a bridge in a hub namespace, 10.`net`.0.i/24
/// each, with a multicast route; all deleted on drop (the members' processes are
/// killed first: guards declared after the `Lan` drop before it).
struct Lan {
    prefix: String,
    net: u8,
    members: usize,
}

impl Lan {
    fn new(tag: &str, net: u8, members: usize) -> Lan {
        let lan = Lan {
            prefix: format!("cbgr-{}-{tag}", std::process::id()),
            net,
            members,
        };
        lan.remove();
        let hub = lan.hub();
        ip(&["netns", "add", &hub]);
        ip(&["-n", &hub, "link", "add", "cbgr-br", "type", "bridge"]);
        ip(&["-n", &hub, "link", "set", "cbgr-br", "up"]);
        for i in 1..=members {
            let ns = lan.ns(i);
            let port = format!("cbgr-p{i}");
            ip(&["netns", "add", &ns]);
            ip(&[
                "link", "add", IFACE, "netns", &ns, "type", "veth", "peer", "name", &port, "netns",
                &hub,
            ]);
            ip(&["-n", &hub, "link", "set", &port, "master", "cbgr-br", "up"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", lan.addr(i)),
                "dev",
                IFACE,
            ]);
            ip(&["-n", &ns, "link", "set", IFACE, "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            ip(&["-n", &ns, "route", "add", "224.0.0.0/4", "dev", IFACE]);
        }
        lan
    }

    fn hub(&self) -> String {
        format!("{}-hub", self.prefix)
    }

    fn ns(&self, i: usize) -> String {
        format!("{}-{i}", self.prefix)
    }

    fn addr(&self, i: usize) -> String {
        format!("10.{}.0.{i}", self.net)
    }

    /// `program args` in member `i`'s namespace.
    fn command(&self, i: usize, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(i), program]);
        c
    }

    /// Starts a Cobalt group server in member `i`, ready when it says it serves.
    fn cobalt_server(&self, i: usize) -> ChildGuard {
        let mut server = ChildGuard::spawn(
            "cobalt serve --multicast",
            self.command(i, env!("CARGO_BIN_EXE_cobalt"))
                .args(["serve", "--shards", "1", "--multicast", IFACE])
                .args(["--leisure", "0.2"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
        );
        let stderr = server.child().stderr.take().unwrap();
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
        let serving = lines
            .by_ref()
            .any(|l| l.is_ok_and(|l| l.contains("serving CoAP")));
        assert!(serving, "cobalt serve in {} did not start", self.ns(i));
        // Keep reading, so the server's later lines find a reader.
        std::thread::spawn(move || lines.for_each(drop));
        server
    }

    /// `cobalt get --non URI --wait SECONDS` from member `i`.
    fn cobalt_group_get(&self, i: usize, uri: &str, wait: &str) -> Ran {
        let mut c = self.command(i, env!("CARGO_BIN_EXE_cobalt"));
        c.args(["get", "--non", uri, "--wait", wait]);
        run(&mut c, LIMIT)
    }

    fn remove(&self) {
        let names = (1..=self.members).map(|i| self.ns(i)).chain([self.hub()]);
        for ns in names {
            let _ = Command::new("ip")
                .args(["netns", "del", &ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The responders `cobalt get --wait` printed (`== ADDRESS CODE` lines), by IP.
fn responders(out: &Ran) -> BTreeSet<String> {
    out.stdout
        .lines()
        .filter_map(|l| l.strip_prefix("== "))
        .filter_map(|l| {
            l.split(' ')
                .next()?
                .rsplit_once(':')
                .map(|(ip, _)| ip.to_string())
        })
        .collect()
}

#[test]
fn three_cobalt_servers_answer_one_cobalt_group_request() {
    if !cobalt_test_support::netns::ready("the group tests", &[]) {
        return;
    }
    let lan = Lan::new("c", 71, 4);
    let _servers: Vec<ChildGuard> = (2..=4).map(|i| lan.cobalt_server(i)).collect();
    let started = Instant::now();
    let out = lan.cobalt_group_get(1, "coap://224.0.1.187/.well-known/core", "1.5s");
    let want: BTreeSet<String> = (2..=4).map(|i| lan.addr(i)).collect();
    assert_eq!(responders(&out), want, "{out:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "the wait was cut short"
    );
    out.assert_stdout_has("</time>");
    // Each server answered once: the unicast socket did not take the group request too.
    let lines = out.stdout.matches("== ").count();
    assert_eq!(lines, 3, "{out:?}");
    // A 4.04 is not sent to a group: no answers, exit 3.
    let none = lan.cobalt_group_get(1, "coap://224.0.1.187/no/such/resource", "1");
    assert_eq!(none.code(), Some(3), "{none:?}");
    assert!(responders(&none).is_empty(), "{none:?}");
    // With No-Response 0 (`-O 258`: interested in every answer) the 4.04s come.
    let mut c = lan.command(1, env!("CARGO_BIN_EXE_cobalt"));
    c.args([
        "get",
        "--non",
        "-O",
        "258",
        "coap://224.0.1.187/no/such/resource",
    ]);
    let errors = run(c.args(["--wait", "1"]), LIMIT);
    assert_eq!(responders(&errors), want, "{errors:?}");
    assert_eq!(errors.stdout.matches("4.04").count(), 3, "{errors:?}");
    // A CON request to the group is not answered; the same request as NON is.
    let mut raw = lan.command(1, "python3");
    let counts = run(raw.args(["-c", CON_AND_NON]), LIMIT);
    assert_eq!(counts.stdout.trim(), "con 0 non 3", "{counts:?}");
    // The link-local IPv6 group (once the link-local addresses are past DAD).
    let uri = format!("coap://[ff02::fd%{IFACE}]/time");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let v6 = lan.cobalt_group_get(1, &uri, "1");
        let from = responders(&v6);
        if from.len() == 3 {
            assert!(from.iter().all(|ip| ip.starts_with("[fe80:")), "{v6:?}");
            break;
        }
        assert!(Instant::now() < deadline, "ff02::fd: {v6:?}");
    }
    // Unicast is served as before.
    let mut unicast = lan.command(1, env!("CARGO_BIN_EXE_cobalt"));
    unicast.args(["get", &format!("coap://{}/time", lan.addr(2))]);
    let unicast = run(&mut unicast, LIMIT);
    assert!(unicast.status.success(), "{unicast:?}");
}

#[test]
fn libcoap_client_gets_answers_from_several_cobalt_servers() {
    if !cobalt_test_support::netns::ready("the group tests", &[]) {
        return;
    }
    let Some(client) = require("libcoap's coap-client-notls", on_path("coap-client-notls")) else {
        return;
    };
    let lan = Lan::new("l", 72, 3);
    let _servers: Vec<ChildGuard> = (2..=3).map(|i| lan.cobalt_server(i)).collect();
    let mut c = lan.command(1, client.to_str().unwrap());
    c.args(["-N", "-B", "2", "coap://224.0.1.187/.well-known/core"]);
    let out = run(&mut c, LIMIT);
    let answers = out.stdout.matches("</benchmark>").count();
    assert_eq!(answers, 2, "{out:?}");
}

#[test]
fn libcoap_and_aiocoap_servers_answer_a_cobalt_group_request() {
    if !cobalt_test_support::netns::ready("the group tests", &[]) {
        return;
    }
    let Some(server) = require("libcoap's coap-server-notls", on_path("coap-server-notls")) else {
        return;
    };
    let Some(python) = require("aiocoap", aiocoap::python()) else {
        return;
    };
    let lan = Lan::new("p", 73, 3);
    let _libcoap = ChildGuard::spawn(
        "coap-server-notls -g",
        lan.command(2, server.to_str().unwrap())
            .args(["-g", "224.0.1.187", "-G", IFACE])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let _aiocoap = ChildGuard::spawn(
        "aiocoap multicast server",
        lan.command(3, python.to_str().unwrap())
            .args(["-c", AIOCOAP_GROUP_SERVER, IFACE])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    // Neither says when it serves: ask until both answered once (libcoap waits up to
    // its 5 s default Leisure).
    let want: BTreeSet<String> = (2..=3).map(|i| lan.addr(i)).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = BTreeSet::new();
    while seen != want {
        assert!(Instant::now() < deadline, "only {seen:?} answered");
        let out = lan.cobalt_group_get(1, "coap://224.0.1.187/.well-known/core", "6");
        seen.extend(responders(&out));
    }
}

/// Sends GET /time to 224.0.1.187 as CON (token 07) and as NON (token 08) and prints
/// how many answers each got within 1.5 s.
const CON_AND_NON: &str = r#"
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
path = bytes([0xB4]) + b"time"
s.sendto(bytes([0x41, 0x01, 0x12, 0x34, 0x07]) + path, ("224.0.1.187", 5683))
s.sendto(bytes([0x51, 0x01, 0x12, 0x35, 0x08]) + path, ("224.0.1.187", 5683))
counts = {7: 0, 8: 0}
end = time.monotonic() + 1.5
while (left := end - time.monotonic()) > 0:
    s.settimeout(left)
    try:
        data, _ = s.recvfrom(2048)
    except socket.timeout:
        break
    if len(data) > 4 and data[0] & 0x0F == 1 and data[4] in counts:
        counts[data[4]] += 1
print("con", counts[7], "non", counts[8])
"#;

/// An aiocoap server joined to the groups on the interface `sys.argv[1]`.
const AIOCOAP_GROUP_SERVER: &str = r#"
import asyncio, sys
import aiocoap, aiocoap.resource as resource
class Hello(resource.Resource):
    async def render_get(self, request):
        return aiocoap.Message(payload=b"hello from aiocoap")
async def main():
    site = resource.Site()
    site.add_resource(['.well-known', 'core'], resource.WKCResource(site.get_resources_as_linkheader))
    site.add_resource(['hello'], Hello())
    await aiocoap.Context.create_server_context(site, multicast=[sys.argv[1]])
    await asyncio.get_running_loop().create_future()
asyncio.run(main())
"#;

#[test]
fn group_flags_that_do_not_fit_are_usage_errors() {
    let cobalt = env!("CARGO_BIN_EXE_cobalt");
    let cases: [(&[&str], &str); 3] = [
        (&["get", "coap://224.0.1.187/x", "--wait", "1"], "add --non"),
        (&["get", "--non", "coap://224.0.1.187/x"], "needs --wait"),
        (
            &["get", "--non", "coap://127.0.0.1/x", "--wait", "1"],
            "not a multicast address",
        ),
    ];
    for (args, says) in cases {
        let out = run(Command::new(cobalt).args(args), LIMIT);
        assert_eq!(out.code(), Some(2), "{args:?}: {out:?}");
        assert!(out.stderr.contains(says), "{args:?}: {out:?}");
    }
}

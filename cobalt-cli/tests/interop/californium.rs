//! Interoperability with Eclipse Californium 3.13 (californium-core from Maven Central,
//! `tests/peers/californium`) on loopback, in both directions:
//!
//! * Cobalt's client against a Californium server that asks for smaller blocks
//!   (RFC 7959 §2.5 Figure 6 for Block1, §2.4 for Block2);
//! * Californium's client against `cobalt serve --plugtest`: the resources of the
//!   ETSI plugtest descriptions that Californium's own plugtest client exercises
//!   (TD_COAP_CORE_20/23, TD_COAP_BLOCK_05, TD_COAP_OBS_01/02/07/08/09, `/obs-reset`).
//!
//! A missing peer (no `java`, or the peer not built) skips the test with a note, or
//! fails it under `COBALT_REQUIRE_PEERS=1`; `scripts/install-test-deps.sh` installs it.

use crate::runtime;
use cobalt::{Client, Code};
use cobalt_test_support::peers::californium::{
    self, field, letters, payload_of, unescape, Californium, CF_LIMIT,
};
use cobalt_test_support::peers::PeerServer;
use cobalt_test_support::ports::V4;
use cobalt_test_support::process;
use std::time::Duration;

/// The Californium peer and `cobalt serve` on 127.0.0.1 for it; `None` after the skip
/// note if the peer is missing.
fn californium_and_cobalt() -> Option<(Californium, PeerServer)> {
    californium::need().map(|cf| (cf, crate::binary::start_cobalt(V4)))
}

/// The Block1 (or Block2) values of the requests for `path` the Californium server
/// saw, in order.
fn blocks_seen(lines: &[String], path: &str, option: &str) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l.starts_with("REQUEST ") && field(l, "path") == Some(path))
        .filter_map(|l| field(l, option).map(str::to_string))
        .collect()
}

// ---------------------------------------------------------------------------
// Cobalt client -> Californium server
// ---------------------------------------------------------------------------

#[test]
fn cobalt_upload_follows_a_californium_server_asking_for_smaller_blocks() {
    let Some(cf) = californium::need() else {
        return;
    };
    let server = cf.server(&["--block-size", "512"]);
    let body = letters(3000);
    let rt = runtime();
    let client = Client::new();
    let r = rt
        .block_on(client.put(&server.uri("/upload"), body.clone()))
        .expect("PUT /upload");
    assert_eq!(
        (r.code, r.text_payload().as_str()),
        (Code::CHANGED, "stored 3000 bytes"),
        "{:#?}",
        server.events.lines()
    );
    // 0/1/1024 is acknowledged with 0/1/512: the first block counts whole and the
    // upload goes on with 2/1/512 (Californium answers 1/1/512 with 4.08).
    let lines = server.events.lines();
    assert_eq!(
        blocks_seen(&lines, "/upload", "block1"),
        ["0/1/1024", "2/1/512", "3/1/512", "4/1/512", "5/0/512"],
        "{lines:#?}"
    );
    let back = rt
        .block_on(client.get(&server.uri("/upload")))
        .expect("GET /upload");
    assert_eq!(back.payload, body, "the server stored the body byte-exact");
}

#[test]
fn cobalt_download_follows_a_californium_server_answering_smaller_blocks() {
    let Some(cf) = californium::need() else {
        return;
    };
    let server = cf.server(&["--block-size", "256"]);
    let rt = runtime();
    let r = rt
        .block_on(
            Client::new()
                .request(Code::GET, &server.uri("/large"))
                .block_size(1024)
                .expect("block size")
                .send(),
        )
        .expect("GET /large");
    assert_eq!(r.code, Code::CONTENT);
    assert_eq!(r.payload, letters(5000));
    // Asked for 1024-byte blocks, answered in 256-byte ones: the client follows.
    let lines = server.events.lines();
    let asked = blocks_seen(&lines, "/large", "block2");
    assert_eq!(asked[..3], ["0/0/1024", "1/0/256", "2/0/256"], "{lines:#?}");
    assert_eq!(asked.len(), 5000usize.div_ceil(256), "{lines:#?}");
}

/// `cobalt observe --count N` ends its relation on a Californium server: the server
/// sees the GET with Observe=1 (RFC 7641 §3.6) and its observer count drops to 0, so it
/// does not go on sending confirmable notifications to a port nobody reads.
#[test]
fn cobalt_observe_count_cancels_the_relation_on_a_californium_server() {
    let Some(cf) = californium::need() else {
        return;
    };
    let server = cf.server(&["--tick-ms", "200"]);
    let r = process::run(
        crate::binary::cobalt()
            .args(["observe", "--count", "3"])
            .arg(server.uri("/obs")),
        CF_LIMIT,
    )
    .ok();
    assert_eq!(r.stdout.lines().count(), 3, "{r:#?}");
    let events = &server.events;
    events.wait_for("the relation", CF_LIMIT, |l| l == "RELATIONS /obs 1");
    events.wait_for("the cancel", CF_LIMIT, |l| {
        l.starts_with("REQUEST ")
            && field(l, "path") == Some("/obs")
            && field(l, "observe") == Some("1")
    });
    events.wait_for("the relation to end", CF_LIMIT, |l| l == "RELATIONS /obs 0");
}

// ---------------------------------------------------------------------------
// Californium client -> cobalt serve --plugtest
// ---------------------------------------------------------------------------

/// The NOTIFY lines of an observation.
fn notifications(lines: &[String]) -> Vec<&String> {
    lines.iter().filter(|l| l.starts_with("NOTIFY ")).collect()
}

#[test]
fn californium_observes_obs_with_con_and_obs_non_with_non_notifications() {
    // TD_COAP_OBS_01 (CON notifications) and TD_COAP_OBS_02 (NON), each cancelled
    // with a GET with Observe=1 (Californium's proactive cancel).
    let Some((cf, server)) = californium_and_cobalt() else {
        return;
    };
    let mut con = cf.spawn(&[
        "observe",
        &server.uri("/obs"),
        "--seconds",
        "5",
        "--cancel",
        "proactive",
    ]);
    let mut non = cf.spawn(&[
        "observe",
        &server.uri("/obs-non"),
        "--non",
        "--seconds",
        "5",
        "--cancel",
        "proactive",
    ]);
    con.wait_exit(CF_LIMIT);
    non.wait_exit(CF_LIMIT);
    for (events, path, mtype) in [(&con, "/obs", "CON"), (&non, "/obs-non", "NON")] {
        let lines = events.lines();
        // The answer to the cancelling GET (Observe=1) comes without Observe.
        let n: Vec<&String> = notifications(&lines)
            .into_iter()
            .filter(|l| field(l, "observe") != Some("-"))
            .collect();
        assert!(
            n.len() >= 3,
            "{path}: a response and notifications: {lines:#?}"
        );
        let observe: Vec<u32> = n
            .iter()
            .filter_map(|l| field(l, "observe")?.parse().ok())
            .collect();
        assert!(
            observe.windows(2).all(|w| w[0] < w[1]),
            "{path}: increasing Observe: {lines:#?}"
        );
        // After the first (the response to the registration), notifications come
        // with the type the resource promises; of NON ones, the NON rule of the
        // server's congestion control (CoCoA §5) sends 2 of every 16 as CON.
        let later = &n[1..];
        for l in later {
            assert_eq!(field(l, "code"), Some("2.05"), "{path}: {l}");
            assert!(payload_of(l).unwrap().starts_with("tick "), "{l}");
        }
        let of = |t: &str| later.iter().filter(|l| field(l, "type") == Some(t)).count();
        if mtype == "CON" {
            assert_eq!(of("CON"), later.len(), "{path}: {lines:#?}");
        } else {
            assert!(of("NON") >= 1, "{path}: {lines:#?}");
            assert!(
                of("CON") <= 2 * later.len().div_ceil(16),
                "{path}: {lines:#?}"
            );
            assert_eq!(of("NON") + of("CON"), later.len(), "{path}: {lines:#?}");
        }
    }
}

#[test]
fn californium_sees_obs_put_and_delete_end_or_update_observations() {
    // TD_COAP_OBS_09 (a PUT with the same Content-Format is notified), TD_COAP_OBS_08
    // (a PUT changing the Content-Format ends the observation with 4.06) on /obs, and
    // TD_COAP_OBS_07 (DELETE ends it) on /obs-non; both come back for the next test.
    let Some((cf, server)) = californium_and_cobalt() else {
        return;
    };
    let observe = |path: &str| {
        cf.spawn(&[
            "observe",
            &server.uri(path),
            "--seconds",
            "30",
            "--cancel",
            "none",
        ])
    };
    let (obs, obs_non) = (observe("/obs"), observe("/obs-non"));
    let registered = |l: &str| l.starts_with("NOTIFY ") && field(l, "code") == Some("2.05");
    obs.wait_for("the /obs registration", CF_LIMIT, registered);
    obs_non.wait_for("the /obs-non registration", CF_LIMIT, registered);
    let rt = runtime();
    let client = Client::new();
    let put = |cf: u16, body: &str| {
        rt.block_on(
            client
                .request(Code::PUT, &server.uri("/obs"))
                .content_format(cf)
                .payload(body)
                .send(),
        )
        .expect("PUT /obs")
        .code
    };
    assert_eq!(put(0, "value for TD_COAP_OBS_09"), Code::CHANGED);
    obs.wait_for("the PUT value notified", CF_LIMIT, |l| {
        l.starts_with("NOTIFY ") && payload_of(l).as_deref() == Some("value for TD_COAP_OBS_09")
    });
    assert_eq!(put(41, "<value/>"), Code::CHANGED);
    let gone = obs.wait_for("the end of the /obs observation", CF_LIMIT, |l| {
        l.starts_with("NOTIFY ") && field(l, "code") == Some("4.06")
    });
    assert_eq!(field(&gone, "type"), Some("CON"), "{gone}");
    let deleted = rt
        .block_on(client.delete(&server.uri("/obs-non")))
        .expect("DELETE /obs-non");
    assert_eq!(deleted.code, Code::DELETED);
    obs_non.wait_for("the end of the /obs-non observation", CF_LIMIT, |l| {
        l.starts_with("NOTIFY ") && field(l, "code") == Some("4.04")
    });
    // Both resources are back: a GET is answered.
    for path in ["/obs", "/obs-non"] {
        let r = rt.block_on(client.get(&server.uri(path))).expect("GET");
        assert_eq!(r.code, Code::CONTENT, "{path}");
    }
    // Nothing is notified after the 4.06 and the 4.04 (the relations ended): once the
    // server has ticked twice more, the last NOTIFY of each observer is still that.
    let tick = || {
        let text = rt
            .block_on(client.get(&server.uri("/obs")))
            .expect("GET /obs")
            .text_payload();
        text.split(' ').nth(1).and_then(|n| n.parse::<u64>().ok())
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut start = None;
    while start.is_none_or(|s| tick().is_none_or(|n| n < s + 2)) {
        // The stored XML value is shown for a few ticks.
        start = start.or_else(tick);
        assert!(std::time::Instant::now() < deadline, "/obs stopped ticking");
        std::thread::sleep(Duration::from_millis(100));
    }
    for (events, path, code) in [(&obs, "/obs", "4.06"), (&obs_non, "/obs-non", "4.04")] {
        let lines = events.lines();
        let last = notifications(&lines).last().map(|l| l.to_string());
        assert_eq!(
            last.as_deref().and_then(|l| field(l, "code")),
            Some(code),
            "{path}: {lines:#?}"
        );
    }
}

#[test]
fn californium_notices_the_obs_reset_reboot_by_max_age_and_registers_again() {
    let Some((cf, server)) = californium_and_cobalt() else {
        return;
    };
    let obs = cf.spawn(&[
        "observe",
        &server.uri("/obs"),
        "--seconds",
        "30",
        "--cancel",
        "none",
    ]);
    let tick = |l: &str| {
        let p = payload_of(l)?;
        p.strip_prefix("tick ")?
            .split(' ')
            .next()?
            .parse::<u64>()
            .ok()
    };
    // The clock ticks a while, so that its restart after the reset shows (Californium
    // registers again some 4 s after the last notification: Max-Age and its back-off).
    let before = 10;
    obs.wait_for("the /obs clock to tick", CF_LIMIT, |l| {
        l.starts_with("NOTIFY ") && tick(l).is_some_and(|n| n >= before)
    });
    let refused = cf.run(&[
        "request",
        "POST",
        &server.uri("/obs-reset"),
        "--payload",
        "open",
    ]);
    assert!(
        refused.iter().any(|l| l.starts_with("RESPONSE code=4.03")),
        "{refused:#?}"
    );
    let reset = cf.run(&[
        "request",
        "POST",
        &server.uri("/obs-reset"),
        "--payload",
        "sesame",
    ]);
    assert!(
        reset.iter().any(|l| l.starts_with("RESPONSE code=2.04")),
        "{reset:#?}"
    );
    // Nothing ends the relation in words: Californium notices the silence after
    // Max-Age and registers again, and the clock restarted (at 0 after the reset).
    obs.wait_for("a notification after registering again", CF_LIMIT, |l| {
        l.starts_with("NOTIFY ") && tick(l).is_some_and(|n| n < before)
    });
    let lines = obs.lines();
    assert!(
        notifications(&lines)
            .iter()
            .all(|l| field(l, "code") == Some("2.05")),
        "{lines:#?}"
    );
}

#[test]
fn californium_posts_large_and_gets_large_back_in_one_exchange() {
    // TD_COAP_BLOCK_05: Block1 up, Block2 down (RFC 7959 §3.3).
    let Some((cf, server)) = californium_and_cobalt() else {
        return;
    };
    let lines = cf.run(&[
        "request",
        "POST",
        &server.uri("/large-post"),
        "--cf",
        "0",
        "--payload-size",
        "3000",
    ]);
    let response = lines.iter().find(|l| l.starts_with("RESPONSE "));
    assert_eq!(
        response.and_then(|l| field(l, "code")),
        Some("2.04"),
        "{lines:#?}"
    );
    let payload = lines
        .iter()
        .find_map(|l| l.strip_prefix("PAYLOAD "))
        .map(unescape)
        .unwrap_or_default();
    assert_eq!(
        payload.as_bytes(),
        letters(3000).to_ascii_uppercase(),
        "{lines:#?}"
    );
    let sent_block1 = lines
        .iter()
        .filter(|l| l.starts_with("SENT ") && field(l, "block1") != Some("-"))
        .count();
    let got_block2 = lines
        .iter()
        .filter(|l| l.starts_with("RECV ") && field(l, "block2") != Some("-"))
        .count();
    assert!(
        sent_block1 > 1 && got_block2 > 1,
        "both directions block-wise: {lines:#?}"
    );
}

#[test]
fn californium_gets_multi_format_in_every_format() {
    // TD_COAP_CORE_20 (text/plain, application/xml) and JSON and CBOR as Californium's
    // plugtest client asks for them; 4.06 for a format the resource does not have.
    let Some((cf, server)) = californium_and_cobalt() else {
        return;
    };
    let uri = server.uri("/multi-format");
    let runs: Vec<(&str, std::thread::JoinHandle<Vec<String>>)> = ["0", "41", "50", "60", "42"]
        .into_iter()
        .map(|accept| {
            let (cf, uri) = (cf.clone(), uri.clone());
            (
                accept,
                std::thread::spawn(move || cf.run(&["request", "GET", &uri, "--accept", accept])),
            )
        })
        .collect();
    for (accept, run) in runs {
        let lines = run.join().expect("client thread");
        let response = lines
            .iter()
            .find(|l| l.starts_with("RESPONSE "))
            .unwrap_or_else(|| panic!("Accept {accept}: {lines:#?}"));
        let payload = lines
            .iter()
            .find_map(|l| l.strip_prefix("PAYLOAD "))
            .unwrap_or_default();
        if accept == "42" {
            assert_eq!(field(response, "code"), Some("4.06"), "{lines:#?}");
            continue;
        }
        assert_eq!(field(response, "code"), Some("2.05"), "{lines:#?}");
        assert_eq!(field(response, "cf"), Some(accept), "{lines:#?}");
        let expected_start = match accept {
            "0" => "Type: CON\\nCode: GET\\nMID: ",
            "41" => "<msg type=\"CON\" code=\"GET\" mid=\"",
            "50" => "{\"type\":\"CON\",\"code\":\"GET\",\"mid\":",
            // A CBOR map of 4: a4, "type" (64 74 79 70 65), "CON" (63 43 4f 4e).
            _ => "\\xa4dtypecCONdcodecGETcmid",
        };
        assert!(
            payload.starts_with(expected_start),
            "Accept {accept}: {payload}"
        );
    }
}

#[test]
fn californium_creates_create1_twice_in_a_row() {
    // TD_COAP_CORE_23: PUT with If-None-Match creates, the second gets 4.12, and after
    // that the resource is gone again so the test can run again.
    let Some((cf, server)) = californium_and_cobalt() else {
        return;
    };
    let uri = server.uri("/create1");
    let codes: Vec<String> = (0..3)
        .map(|_| {
            let lines = cf.run(&[
                "request",
                "PUT",
                &uri,
                "--cf",
                "0",
                "--payload",
                "TD_COAP_CORE_23",
                "--if-none-match",
            ]);
            lines
                .iter()
                .find(|l| l.starts_with("RESPONSE "))
                .and_then(|l| field(l, "code"))
                .unwrap_or("none")
                .to_string()
        })
        .collect();
    assert_eq!(codes, ["2.01", "4.12", "2.01"]);
}

#[test]
fn californium_gets_large_separate_in_separate_responses() {
    // A large answer that comes late: an empty ACK, then the first block as a separate
    // CON response, and the rest asked for block by block (libcoap 4.3.1's client does
    // not continue such a transfer after the first block; Californium's does).
    let Some((cf, server)) = californium_and_cobalt() else {
        return;
    };
    let lines = cf.run(&["request", "GET", &server.uri("/large-separate")]);
    let first = lines.iter().find(|l| l.starts_with("RECV "));
    assert_eq!(
        first.and_then(|l| Some((field(l, "type")?, field(l, "block2")?))),
        Some(("CON", "0/1/1024")),
        "{lines:#?}"
    );
    let response = lines.iter().find(|l| l.starts_with("RESPONSE "));
    assert_eq!(
        response.and_then(|l| Some((field(l, "code")?, field(l, "len")?))),
        Some(("2.05", "2048")),
        "{lines:#?}"
    );
}

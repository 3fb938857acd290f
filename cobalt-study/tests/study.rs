//! The study's CI runs: one client over the emulated link (needs root, TUN and
//! iproute2; skipped elsewhere unless COBALT_REQUIRE_NETNS=1 or COBALT_REQUIRE_PEERS=1)
//! and a small study in virtual time with its report.

use cobalt_study::case::{subset, Case, Loss, Mode, Variant, Workload};
use cobalt_study::emu_run::{self, EmuOptions};
use cobalt_study::{report, results, sim_run};
use std::time::Duration;

fn can_emulate() -> bool {
    cobalt_linkem::ready_for_tests()
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("cobalt-study-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn one_client_over_the_emulated_link_takes_the_papers_33_seconds() {
    if !can_emulate() {
        return;
    }
    let case = Case {
        mode: Mode::Emulated,
        workload: Workload::Continuous,
        clients: 1,
        buffer: 2500,
        loss: Loss::None,
        variant: Variant::Default,
        rep: 0,
    };
    let dir = temp_dir("emulated");
    let opts = EmuOptions {
        work_dir: dir.clone(),
        keep_logs: false,
        case_timeout: Duration::from_secs(120),
        sysctls: Vec::new(),
    };
    let r = emu_run::run(&case, case.seed(1), &opts).unwrap();
    eprintln!("one emulated client: FCT {:?} s", r.fct);
    assert_eq!((r.fct.len(), r.unfinished), (1, 0));
    // The paper: 33.003 s; within 2 %.
    assert!((r.fct[0] / 33.003 - 1.0).abs() < 0.02, "{r:?}");
    assert_eq!(r.retransmissions, [0]);
    // 50 requests up, 50 responses down, nothing dropped.
    assert_eq!((r.up.packets, r.down.packets), (50, 50));
    assert_eq!(r.up.drops_queue + r.down.drops_queue, 0);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_small_virtual_study_runs_every_udp_case_and_reports() {
    let cases: Vec<Case> = subset("ci-virtual")
        .unwrap()
        .iter()
        .flat_map(|m| m.cases(Mode::Virtual))
        .collect();
    assert!(cases.len() >= 40, "{}", cases.len());
    let dir = temp_dir("virtual");
    let store = dir.join("results.jsonl");
    for c in &cases {
        let r = sim_run::run(c, c.seed(1));
        assert_eq!(r.unfinished, 0, "{}", r.key);
        results::append(&store, &r).unwrap();
    }
    // Resuming finds every case done.
    let done = results::done_keys(&store).unwrap();
    assert!(cases.iter().all(|c| done.contains(&c.key())));
    let all = results::load(&store).unwrap();
    let files = report::write_all(&dir, &all).unwrap();
    assert!(files.iter().any(|f| f == "fig6-virtual.svg"), "{files:?}");
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        md.contains("| Continuous | 50 | 2500B | Default CoAP | paper (stated) |"),
        "{md}"
    );
    for s in report::summarise(&all) {
        let f = s.fct.unwrap();
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "{s:?}");
        // One client on an idle link: 50 round trips of 660 ms, whatever the algorithm.
        if s.group.clients == 1 {
            assert!((f[2] / 33.0 - 1.0).abs() < 0.01, "{s:?}");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

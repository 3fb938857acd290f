//! The committed report is what the committed raw results give: `report.md`, the
//! summaries, `paper.json`, the figures and the README's findings in
//! `bench/congestion/` are regenerated from `results/results.jsonl` and
//! `virtual/results.jsonl(.gz)` and compared byte for byte.

use cobalt_study::{findings, report, results};
use std::path::{Path, PathBuf};

fn study() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/congestion")
}

#[test]
fn the_committed_report_and_findings_are_regenerated_from_the_raw_results() {
    let dir = study();
    let mut all = Vec::new();
    for part in ["results", "virtual"] {
        let store = dir.join(part).join("results.jsonl");
        let runs = results::load(&store).unwrap();
        assert!(!runs.is_empty(), "no results in {}", store.display());
        all.extend(runs);
    }
    let out = std::env::temp_dir().join(format!("cobalt-study-integrity-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let written = report::write_all(&out, &all).unwrap();
    assert!(written.iter().any(|f| f == "report.md"));
    for name in &written {
        let fresh = std::fs::read_to_string(out.join(name)).unwrap();
        let committed = std::fs::read_to_string(dir.join(name))
            .unwrap_or_else(|e| panic!("{name} is not committed in {}: {e}", dir.display()));
        assert!(
            fresh == committed,
            "{name} differs from what the results give: run `cobalt-study report` (see bench/congestion/README.md)"
        );
    }
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    let generated = findings::markdown(&report::summarise(&all), &all);
    assert!(
        findings::splice(&readme, &generated).unwrap() == readme,
        "the README's findings differ from what the results give: run `cobalt-study report --readme`"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn the_library_default_is_the_algorithm_the_study_supports() {
    let dir = study();
    let mut all = Vec::new();
    for part in ["results", "virtual"] {
        all.extend(results::load(&dir.join(part).join("results.jsonl")).unwrap());
    }
    let (standings, cases) = findings::standings(&report::summarise(&all));
    assert!(
        cases > 0,
        "no virtual case in which every UDP variant finished"
    );
    let verdict = findings::default_verdict(&standings).expect("standings for every UDP variant");
    assert_eq!(
        findings::library_default(),
        Some(verdict),
        "EndpointConfig::default().congestion_control is not what the study's verdict supports \
         (bench/congestion/README.md, \"Verdict on the default\"): change the default or the study"
    );
}

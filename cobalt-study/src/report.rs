//! Tables and plots from the results: flow-completion-time percentiles per case
//! (pooled over replications, as CSV and JSON), a Markdown report with the paper's
//! Table I side by side, the figures' cases, retransmissions, and the agreement of
//! virtual-time and emulated medians; SVG plots in the style of Figs. 2–6 and 4.

use crate::case::{Group, Loss, Mode, Variant, Workload};
use crate::figures;
use crate::paper::{self, Source};
use crate::results::RunResult;
pub use crate::summary::{percentiles, summarise, Summary, QUANTILES};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;
use std::path::Path;

fn buffer_name(b: usize) -> String {
    match b {
        1_410_000 => "infinite".into(),
        b => format!("{b}B"),
    }
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Emulated => "emulated",
        Mode::Virtual => "virtual",
    }
}

fn workload_name(w: Workload) -> &'static str {
    match w {
        Workload::Continuous => "Continuous",
        Workload::Random => "Random",
    }
}

/// The summaries as CSV.
pub fn csv(summaries: &[Summary]) -> String {
    let mut out = String::from(
        "mode,workload,clients,buffer,loss,variant,runs,finished,unfinished,p10,p25,median,p75,p90,retransmissions,unnecessary,handshake,failures,drops_queue_down,wall_s\n",
    );
    for s in summaries {
        let g = &s.group;
        let f = s.fct.map_or_else(
            || ",,,,".to_string(),
            |f| {
                f.iter()
                    .map(|v| format!("{v:.3}"))
                    .collect::<Vec<_>>()
                    .join(",")
            },
        );
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{f},{:.2},{:.2},{:.2},{},{:.1},{:.0}",
            mode_name(g.mode),
            workload_name(g.workload).to_lowercase(),
            g.clients,
            g.buffer,
            g.loss.name(),
            g.variant.name(),
            s.runs,
            s.finished,
            s.unfinished,
            s.retransmissions,
            s.unnecessary,
            s.handshake,
            s.failures,
            s.drops_queue_down,
            s.wall_s
        );
    }
    out
}

fn find(summaries: &[Summary], group: Group) -> Option<&Summary> {
    summaries.iter().find(|s| s.group == group)
}

/// The error-free case of `mode` with these parameters.
fn error_free(
    mode: Mode,
    workload: Workload,
    clients: usize,
    buffer: usize,
    variant: Variant,
) -> Group {
    Group {
        mode,
        workload,
        clients,
        buffer,
        loss: Loss::None,
        variant,
    }
}

fn fmt_fct(f: &[f64; 5]) -> String {
    f.iter()
        .map(|v| format!("{v:.3}"))
        .collect::<Vec<_>>()
        .join(" | ")
}

fn delta(ours: f64, paper: f64) -> String {
    format!("{:+.1} %", (ours / paper - 1.0) * 100.0)
}

/// The Markdown report.
pub fn markdown(summaries: &[Summary], results: &[RunResult]) -> String {
    let mut out = String::new();
    let modes: Vec<Mode> = [Mode::Emulated, Mode::Virtual]
        .into_iter()
        .filter(|m| summaries.iter().any(|s| s.group.mode == *m))
        .collect();
    let _ = writeln!(
        out,
        "## Table I: flow completion time (s), ours against the paper\n"
    );
    let _ = writeln!(
        out,
        "Pooled over every client of every replication. `paper` rows are the congestion-control paper's Table I.\n"
    );
    let _ = writeln!(
        out,
        "| Client | n | Buffer | Cong. control | source | runs | 10th | 25th | Median | 75th | 90th | median vs paper |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (w, n, b, v, paper) in paper::TABLE_I {
        let _ = writeln!(
            out,
            "| {} | {n} | {} | {} | paper (stated) | 20 | {} | |",
            workload_name(w),
            buffer_name(b),
            v.label(),
            fmt_fct(&paper)
        );
        for &m in &modes {
            if let Some(s) = find(summaries, error_free(m, w, n, b, v)) {
                if let Some(f) = s.fct {
                    let _ = writeln!(
                        out,
                        "| | | | | {} | {} | {} | {} |",
                        mode_name(m),
                        s.runs,
                        fmt_fct(&f),
                        delta(f[2], paper[2])
                    );
                }
            }
        }
    }
    out.push_str(&paper_medians(summaries, &modes));
    out.push_str(&paper_ratios(summaries, &modes));
    let _ = writeln!(out, "\n## Every case\n");
    let _ = writeln!(
        out,
        "FCT percentiles in seconds; retransmissions and unnecessary ones are per client (TCP random: per connection); `hs` = TCP SYN/SYN-ACK retransmissions per connection; `fail` = exchanges repeated after MAX_RETRANSMIT; `unfin.` = clients not done within the case's time limit; `drops` = downlink queue drops per run.\n"
    );
    let _ = writeln!(
        out,
        "| mode | workload | n | buffer | loss | variant | runs | 10th | 25th | median | 75th | 90th | retx | unnecessary | hs | fail | unfin. | drops | wall s |"
    );
    let _ = writeln!(out, "|{}", "---|".repeat(19));
    for s in summaries {
        let g = &s.group;
        let f = s
            .fct
            .map_or_else(|| "– | – | – | – | –".into(), |f| fmt_fct(&f));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {f} | {:.2} | {:.2} | {:.2} | {} | {} | {:.0} | {:.0} |",
            mode_name(g.mode),
            workload_name(g.workload).to_lowercase(),
            g.clients,
            buffer_name(g.buffer),
            g.loss.name(),
            g.variant.label(),
            s.runs,
            s.retransmissions,
            s.unnecessary,
            s.handshake,
            s.failures,
            s.unfinished,
            s.drops_queue_down,
            s.wall_s
        );
    }
    out.push_str(&agreement(results));
    out
}

/// The paper's values, as `paper.json` holds them: each with its source.
#[derive(Debug, Serialize)]
struct PaperValues {
    table_i: Vec<PaperRow>,
    medians: Vec<paper::Median>,
    ratios: Vec<paper::Ratio>,
}

/// One row of Table I in `paper.json`.
#[derive(Debug, Serialize)]
struct PaperRow {
    workload: Workload,
    clients: usize,
    buffer: usize,
    variant: Variant,
    percentiles: [f64; 5],
    source: Source,
}

impl PaperValues {
    fn new() -> PaperValues {
        PaperValues {
            table_i: paper::TABLE_I
                .iter()
                .map(
                    |&(workload, clients, buffer, variant, percentiles)| PaperRow {
                        workload,
                        clients,
                        buffer,
                        variant,
                        percentiles,
                        source: Source::Stated,
                    },
                )
                .collect(),
            medians: paper::MEDIANS.to_vec(),
            ratios: paper::RATIOS.to_vec(),
        }
    }
}

/// The medians the paper gives for Figs. 2–3, stated or back-calculated, against ours.
fn paper_medians(summaries: &[Summary], modes: &[Mode]) -> String {
    let mut out = String::from(
        "\n## Medians the paper gives for Figs. 2–3 (continuous clients, 2,500 B)\n\n\
         `stated`: printed in the paper; `derived`: back-calculated from the differences and \
         percentages it prints (how: below the table).\n\n",
    );
    let _ = writeln!(
        out,
        "| clients | variant | paper | source | {} |",
        modes
            .iter()
            .map(|m| mode_name(*m))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(out, "|---|---|---|---|{}", "---|".repeat(modes.len()));
    let mut derivations: Vec<&str> = Vec::new();
    for m in paper::MEDIANS {
        let cells: Vec<String> = modes
            .iter()
            .map(|&mode| {
                find(
                    summaries,
                    error_free(mode, Workload::Continuous, m.clients, m.buffer, m.variant),
                )
                .and_then(|s| s.fct)
                .map_or("–".into(), |f| {
                    format!("{:.1} ({})", f[2], delta(f[2], m.median))
                })
            })
            .collect();
        let source = match m.source {
            Source::Stated => "stated".to_string(),
            Source::Derived => {
                if !derivations.contains(&m.from) {
                    derivations.push(m.from);
                }
                let i = derivations.iter().position(|d| *d == m.from).unwrap_or(0);
                format!("derived ({})", i + 1)
            }
        };
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {source} | {} |",
            m.clients,
            m.variant.label(),
            m.median,
            cells.join(" | ")
        );
    }
    out.push('\n');
    for (i, d) in derivations.iter().enumerate() {
        let _ = writeln!(out, "({}) {d}\n", i + 1);
    }
    out
}

/// The ratios the paper states for Figs. 5–6, against ours.
fn paper_ratios(summaries: &[Summary], modes: &[Mode]) -> String {
    let mut out =
        String::from("\n## Ratios the paper states for Figs. 5–6 (median over median)\n\n");
    let _ = writeln!(
        out,
        "| workload | n | buffer | loss | ratio | paper | {} | the paper's words |",
        modes
            .iter()
            .map(|m| mode_name(*m))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(
        out,
        "|---|---|---|---|---|---|{}---|",
        "---|".repeat(modes.len())
    );
    for r in paper::RATIOS {
        let median = |mode: Mode, v: Variant| {
            find(
                summaries,
                Group {
                    mode,
                    workload: r.workload,
                    clients: r.clients,
                    buffer: r.buffer,
                    loss: r.loss,
                    variant: v,
                },
            )
            .and_then(|s| s.fct)
            .map(|f| f[2])
        };
        let cells: Vec<String> = modes
            .iter()
            .map(
                |&mode| match (median(mode, r.variant), median(mode, r.over)) {
                    (Some(a), Some(b)) => format!("{:.3}", a / b),
                    _ => "–".into(),
                },
            )
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} / {} | {:.3} | {} | {} |",
            workload_name(r.workload).to_lowercase(),
            r.clients,
            buffer_name(r.buffer),
            r.loss.name(),
            r.variant.label(),
            r.over.label(),
            r.ratio,
            cells.join(" | "),
            r.from
        );
    }
    out
}

/// Virtual-time against emulated medians, for the cases both ran: over the same
/// replications (the same seeds, so the same loss timelines) and over all virtual ones.
pub fn agreement(results: &[RunResult]) -> String {
    let mut emulated: BTreeMap<Group, Vec<&RunResult>> = BTreeMap::new();
    let mut virtual_runs: BTreeMap<Group, Vec<&RunResult>> = BTreeMap::new();
    for r in results {
        let g = r.case.group();
        match g.mode {
            Mode::Emulated => emulated.entry(g).or_default().push(r),
            Mode::Virtual => virtual_runs.entry(g).or_default().push(r),
        }
    }
    let median = |runs: &[&RunResult]| {
        let v: Vec<f64> = runs.iter().flat_map(|r| r.fct.iter().copied()).collect();
        percentiles(&v).map(|p| p[2])
    };
    let mut out = String::from("\n## Virtual time against emulation (medians)\n\n");
    let mut rows = Vec::new();
    for (g, e_runs) in &emulated {
        let v_group = Group {
            mode: Mode::Virtual,
            ..*g
        };
        let Some(v_runs) = virtual_runs.get(&v_group) else {
            continue;
        };
        let reps: Vec<u32> = e_runs.iter().map(|r| r.case.rep).collect();
        let paired: Vec<&RunResult> = v_runs
            .iter()
            .copied()
            .filter(|r| reps.contains(&r.case.rep))
            .collect();
        if let (Some(e), Some(p), Some(all)) = (median(e_runs), median(&paired), median(v_runs)) {
            rows.push((*g, e_runs.len(), paired.len(), v_runs.len(), e, p, all));
        }
    }
    if rows.is_empty() {
        out.push_str("No case ran in both modes.\n");
        return out;
    }
    out.push_str("`same reps`: the virtual runs with the emulated runs' seeds (the same loss timeline and link draws); `all reps`: every virtual replication.\n\n");
    out.push_str("| workload | n | buffer | loss | variant | emulated runs | emulated | virtual, same reps | difference | virtual, all reps | difference |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (g, er, _pr, vr, e, p, all) in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {er} | {e:.3} | {p:.3} | {} | {all:.3} ({vr}) | {} |",
            workload_name(g.workload).to_lowercase(),
            g.clients,
            buffer_name(g.buffer),
            g.loss.name(),
            g.variant.label(),
            delta(p, e),
            delta(all, e)
        );
    }
    out
}

/// Writes `summary.csv`, `summary.json`, `paper.json`, `report.md` and the paper's
/// figures ([`figures`]) into `dir`.
pub fn write_all(dir: &Path, results: &[RunResult]) -> io::Result<Vec<String>> {
    let summaries = summarise(results);
    let mut written = vec![
        "summary.csv".to_string(),
        "summary.json".into(),
        "report.md".into(),
    ];
    std::fs::write(dir.join("summary.csv"), csv(&summaries))?;
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(&summaries).map_err(io::Error::other)? + "\n",
    )?;
    let mut md = markdown(&summaries, results);
    std::fs::write(
        dir.join("paper.json"),
        serde_json::to_string_pretty(&PaperValues::new()).map_err(io::Error::other)? + "\n",
    )?;
    written.push("paper.json".into());
    let figures = figures::write_all(dir, &summaries)?;
    if !figures.is_empty() {
        md.push_str("\n## Figures\n\n");
    }
    for name in figures {
        let _ = writeln!(md, "![{name}]({name})\n");
        written.push(name);
    }
    std::fs::write(dir.join("report.md"), md)?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_papers_back_calculated_medians_are_marked_and_explained() {
        let md = paper_medians(&[], &[Mode::Emulated]);
        assert!(
            md.contains("| 100 | Default CoAP | 101.6 | stated | – |"),
            "{md}"
        );
        assert!(
            md.contains("| 200 | CoAP over TCP | 171.3 | derived (1) | – |"),
            "{md}"
        );
        assert!(
            md.contains("| 400 | CoCoA | 407.3 | derived (2) | – |"),
            "{md}"
        );
        assert!(md.contains("(1) §V-A4: TCP \"about 16.6 seconds"), "{md}");
        let json = serde_json::to_string(&PaperValues::new()).unwrap();
        assert_eq!(json.matches("\"source\":\"derived\"").count(), 6);
    }
}

//! Tables and plots from the results: flow-completion-time percentiles per case
//! (pooled over replications, as CSV and JSON), a Markdown report with the paper's
//! Table I side by side, the figures' cases, retransmissions, and the agreement of
//! virtual-time and emulated medians; SVG plots in the style of Figs. 2–6 and 4.

use crate::case::{Group, Loss, Mode, Variant, Workload};
use crate::figures;
use crate::paper::{self, Source};
use crate::results::RunResult;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;
use std::path::Path;

/// The percentiles reported: 10th, 25th, 50th, 75th, 90th.
pub const QUANTILES: [f64; 5] = [0.10, 0.25, 0.50, 0.75, 0.90];

/// Percentiles of `values` by linear interpolation between order statistics.
pub fn percentiles(values: &[f64]) -> Option<[f64; 5]> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    Some(QUANTILES.map(|q| {
        let pos = q * (v.len() - 1) as f64;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
    }))
}

/// One case summarised over its replications.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// The case.
    pub group: Group,
    /// Replications.
    pub runs: usize,
    /// Clients that finished, over all replications.
    pub finished: usize,
    /// Clients that did not finish in time.
    pub unfinished: usize,
    /// FCT percentiles, seconds (p10, p25, median, p75, p90).
    pub fct: Option<[f64; 5]>,
    /// Mean retransmissions per client (per connection for TCP random clients).
    pub retransmissions: f64,
    /// Mean unnecessary retransmissions per client.
    pub unnecessary: f64,
    /// Mean TCP SYN/SYN-ACK retransmissions per connection.
    pub handshake: f64,
    /// Exchanges repeated after a timeout, over all replications.
    pub failures: u64,
    /// Queue drops on the downlink per replication.
    pub drops_queue_down: f64,
    /// Wall-clock seconds of all replications together.
    pub wall_s: f64,
}

fn mean(v: impl Iterator<Item = u64>) -> f64 {
    let (n, s) = v.fold((0u64, 0u64), |(n, s), x| (n + 1, s + x));
    if n == 0 {
        0.0
    } else {
        s as f64 / n as f64
    }
}

/// Summarises results by case.
pub fn summarise(results: &[RunResult]) -> Vec<Summary> {
    let mut groups: BTreeMap<Group, Vec<&RunResult>> = BTreeMap::new();
    for r in results {
        groups.entry(r.case.group()).or_default().push(r);
    }
    groups
        .into_iter()
        .map(|(group, runs)| {
            let fct: Vec<f64> = runs.iter().flat_map(|r| r.fct.iter().copied()).collect();
            Summary {
                group,
                runs: runs.len(),
                finished: fct.len(),
                unfinished: runs.iter().map(|r| r.unfinished).sum(),
                fct: percentiles(&fct),
                retransmissions: mean(runs.iter().flat_map(|r| r.retransmissions.iter().copied())),
                unnecessary: mean(runs.iter().flat_map(|r| r.unnecessary.iter().copied())),
                handshake: mean(
                    runs.iter()
                        .flat_map(|r| r.handshake_retransmissions.iter().copied()),
                ),
                failures: runs.iter().map(|r| r.failures).sum(),
                drops_queue_down: mean(runs.iter().map(|r| r.down.drops_queue)),
                wall_s: runs.iter().map(|r| r.wall_s).sum(),
            }
        })
        .collect()
}

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
    fn percentiles_interpolate_between_order_statistics() {
        let v: Vec<f64> = (1..=11).map(f64::from).collect();
        assert_eq!(percentiles(&v).unwrap(), [2.0, 3.5, 6.0, 8.5, 10.0]);
        assert_eq!(percentiles(&[4.0]).unwrap(), [4.0; 5]);
        assert!(percentiles(&[]).is_none());
    }
}

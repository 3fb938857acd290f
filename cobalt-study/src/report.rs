//! Tables and plots from the results: flow-completion-time percentiles per case
//! (pooled over replications, as CSV and JSON), a Markdown report with the paper's
//! Table I side by side, the figures' cases, retransmissions, and the agreement of
//! virtual-time and emulated medians; SVG plots in the style of Figs. 2–6 and 4.

use crate::case::{Group, Loss, Mode, Variant, Workload};
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

/// The paper's Table I: (workload, clients, buffer, variant) → p10, p25, median, p75, p90.
pub const TABLE_I: [(Workload, usize, usize, Variant, [f64; 5]); 12] = {
    use Variant::{Cocoa, Default, Tcp};
    use Workload::{Continuous as C, Random as R};
    const INF: usize = 1_410_000;
    [
        (
            C,
            1,
            2500,
            Default,
            [33.003, 33.003, 33.003, 33.003, 33.003],
        ),
        (C, 1, 2500, Cocoa, [33.002, 33.002, 33.003, 33.003, 33.003]),
        (C, 1, 2500, Tcp, [33.208, 33.208, 33.208, 33.208, 33.208]),
        (R, 1, 2500, Tcp, [43.432, 45.099, 47.093, 47.746, 47.928]),
        (
            C,
            50,
            2500,
            Default,
            [61.250, 61.500, 62.001, 63.342, 63.767],
        ),
        (C, 50, 2500, Cocoa, [61.275, 61.525, 62.001, 63.347, 63.767]),
        (C, 50, 2500, Tcp, [62.102, 63.257, 65.032, 67.760, 72.684]),
        (R, 50, 2500, Tcp, [83.196, 86.248, 88.433, 90.463, 93.199]),
        (
            C,
            50,
            INF,
            Default,
            [62.177, 62.377, 62.690, 63.003, 63.178],
        ),
        (C, 50, INF, Cocoa, [62.177, 62.377, 62.690, 63.003, 63.179]),
        (C, 50, INF, Tcp, [69.382, 69.570, 69.868, 70.184, 70.383]),
        (R, 50, INF, Tcp, [85.789, 87.233, 90.086, 90.846, 91.259]),
    ]
};

/// Medians the paper gives in its text (Figs. 2, 3 and 5), continuous clients, 2,500 B
/// unless noted: (workload, clients, buffer, variant, median seconds).
pub const PAPER_MEDIANS: [(Workload, usize, usize, Variant, f64); 9] = [
    (Workload::Continuous, 100, 2500, Variant::Default, 101.6),
    (Workload::Continuous, 100, 2500, Variant::Cocoa, 104.7),
    (Workload::Continuous, 100, 2500, Variant::Tcp, 86.7),
    (Workload::Continuous, 200, 2500, Variant::Default, 184.0),
    (Workload::Continuous, 200, 2500, Variant::Cocoa, 198.0),
    (Workload::Continuous, 200, 2500, Variant::Tcp, 168.0),
    (Workload::Continuous, 400, 2500, Variant::Default, 389.0),
    (Workload::Continuous, 400, 2500, Variant::Cocoa, 407.0),
    (Workload::Continuous, 400, 2500, Variant::Tcp, 319.0),
];

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
    for (w, n, b, v, paper) in TABLE_I {
        let _ = writeln!(
            out,
            "| {} | {n} | {} | {} | paper | 20 | {} | |",
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
    let _ = writeln!(
        out,
        "\n## Medians the paper states for Figs. 2–3 (continuous, 2,500 B)\n"
    );
    let _ = writeln!(
        out,
        "| clients | variant | paper | {} |",
        modes
            .iter()
            .map(|m| mode_name(*m))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(out, "|---|---|---|{}", "---|".repeat(modes.len()));
    for (w, n, b, v, paper) in PAPER_MEDIANS {
        let cells: Vec<String> = modes
            .iter()
            .map(|&m| {
                find(summaries, error_free(m, w, n, b, v))
                    .and_then(|s| s.fct)
                    .map_or("–".into(), |f| {
                        format!("{:.1} ({})", f[2], delta(f[2], paper))
                    })
            })
            .collect();
        let _ = writeln!(
            out,
            "| {n} | {} | {paper:.1} | {} |",
            v.label(),
            cells.join(" | ")
        );
    }
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

const COLORS: [(Variant, &str); 7] = [
    (Variant::Default, "#d62728"),
    (Variant::Cocoa, "#1f77b4"),
    (Variant::CocoaStrong, "#17becf"),
    (Variant::Fasor, "#2ca02c"),
    (Variant::FasorK, "#ff7f0e"),
    (Variant::Karn, "#9467bd"),
    (Variant::Tcp, "#7f7f7f"),
];

fn color(v: Variant) -> &'static str {
    COLORS.iter().find(|c| c.0 == v).map_or("#000", |c| c.1)
}

/// Width of one buffer's group of bars or boxes.
const GROUP: f64 = 180.0;
/// Left margin (the value axis).
const LEFT: f64 = 70.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;

/// An SVG chart with buffers along x and one mark per variant in each buffer's group.
struct Chart {
    svg: String,
    height: f64,
    max: f64,
    slot: f64,
}

impl Chart {
    fn new(
        title: &str,
        groups: usize,
        variants: usize,
        height: f64,
        max: f64,
        ticks: u32,
    ) -> Chart {
        let width = (GROUP * groups as f64 + 120.0).max(LEFT + 115.0 * variants as f64 + 20.0);
        let mut c = Chart {
            svg: format!(
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{LEFT}\" y=\"20\" font-size=\"14\">{title}</text>\n"
            ),
            height,
            max: max.max(1e-9),
            slot: GROUP / (COLORS.len() as f64 + 1.0),
        };
        for i in 0..=ticks {
            let v = c.max * f64::from(i) / f64::from(ticks);
            let y = c.y(v);
            let _ = writeln!(
                c.svg,
                "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                width - 20.0,
                LEFT - 6.0,
                y + 4.0,
                if c.max >= 50.0 { format!("{v:.0}") } else { format!("{v:.1}") }
            );
        }
        c
    }

    fn y(&self, v: f64) -> f64 {
        TOP + (self.height - TOP - BOTTOM) * (1.0 - v / self.max)
    }

    /// The centre of variant `v`'s mark in buffer group `group`.
    fn x(&self, group: usize, v: Variant) -> f64 {
        let i = COLORS.iter().position(|c| c.0 == v).unwrap_or(0);
        LEFT + GROUP * group as f64 + self.slot * (i as f64 + 1.0)
    }

    fn finish(mut self, buffers: &[usize], variants: &[Variant]) -> String {
        for (i, b) in buffers.iter().enumerate() {
            let _ = writeln!(
                self.svg,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                LEFT + GROUP * i as f64 + GROUP / 2.0,
                self.height - BOTTOM + 20.0,
                buffer_name(*b)
            );
        }
        for (i, v) in variants.iter().enumerate() {
            let x = LEFT + 115.0 * i as f64;
            let _ = writeln!(
                self.svg,
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                self.height - 22.0,
                color(*v),
                x + 14.0,
                self.height - 13.0,
                v.label()
            );
        }
        self.svg.push_str("</svg>\n");
        self.svg
    }
}

/// The summaries of one (mode, workload, clients, loss), their buffers and variants.
fn select(
    summaries: &[Summary],
    mode: Mode,
    w: Workload,
    clients: usize,
    loss: Loss,
) -> (Vec<&Summary>, Vec<usize>, Vec<Variant>) {
    let sel: Vec<&Summary> = summaries
        .iter()
        .filter(|s| {
            let g = &s.group;
            g.mode == mode
                && g.workload == w
                && g.clients == clients
                && g.loss == loss
                && s.fct.is_some()
        })
        .collect();
    let mut buffers: Vec<usize> = sel.iter().map(|s| s.group.buffer).collect();
    buffers.sort_unstable();
    buffers.dedup();
    let variants = Variant::ALL
        .into_iter()
        .filter(|v| sel.iter().any(|s| s.group.variant == *v))
        .collect();
    (sel, buffers, variants)
}

/// One plot per (mode, workload, clients, loss): FCT boxes (p25–p75, median line,
/// p10–p90 whiskers) per buffer and variant, like the paper's Figs. 2, 3, 5 and 6.
pub fn fct_plot(
    summaries: &[Summary],
    mode: Mode,
    w: Workload,
    clients: usize,
    loss: Loss,
) -> Option<String> {
    let (sel, buffers, variants) = select(summaries, mode, w, clients, loss);
    if sel.is_empty() {
        return None;
    }
    let max = sel
        .iter()
        .filter_map(|s| s.fct)
        .map(|f| f[4])
        .fold(0.0, f64::max)
        * 1.08;
    let title = format!(
        "FCT (s), {clients} {} clients, {} loss ({})",
        workload_name(w).to_lowercase(),
        loss.name(),
        mode_name(mode)
    );
    let mut chart = Chart::new(&title, buffers.len(), variants.len(), 420.0, max, 5);
    for s in &sel {
        let Some(f) = s.fct else {
            continue;
        };
        let gi = buffers
            .iter()
            .position(|b| *b == s.group.buffer)
            .unwrap_or(0);
        let cx = chart.x(gi, s.group.variant);
        let hw = chart.slot * 0.35;
        let c = color(s.group.variant);
        let (y10, y25, y50, y75, y90) = (
            chart.y(f[0]),
            chart.y(f[1]),
            chart.y(f[2]),
            chart.y(f[3]),
            chart.y(f[4]),
        );
        let _ = writeln!(
            chart.svg,
            "<line x1=\"{cx:.1}\" x2=\"{cx:.1}\" y1=\"{y10:.1}\" y2=\"{y90:.1}\" stroke=\"{c}\"/><rect x=\"{:.1}\" y=\"{y75:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{c}\" fill-opacity=\"0.35\" stroke=\"{c}\"/><line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{y50:.1}\" y2=\"{y50:.1}\" stroke=\"{c}\" stroke-width=\"2.5\"/>",
            cx - hw,
            2.0 * hw,
            (y25 - y75).max(1.0),
            cx - hw,
            cx + hw,
        );
    }
    Some(chart.finish(&buffers, &variants))
}

/// Retransmissions per client, and the unnecessary ones, per buffer and variant (Fig. 4).
pub fn retx_plot(summaries: &[Summary], mode: Mode, w: Workload, clients: usize) -> Option<String> {
    let (sel, buffers, variants) = select(summaries, mode, w, clients, Loss::None);
    if sel.is_empty() {
        return None;
    }
    let max = sel
        .iter()
        .map(|s| s.unnecessary.max(s.retransmissions))
        .fold(1.0, f64::max)
        * 1.1;
    let title = format!(
        "Retransmissions per client (solid: unnecessary), {clients} {} clients ({})",
        workload_name(w).to_lowercase(),
        mode_name(mode)
    );
    let mut chart = Chart::new(&title, buffers.len(), variants.len(), 360.0, max, 4);
    let base = chart.y(0.0);
    for s in &sel {
        let gi = buffers
            .iter()
            .position(|b| *b == s.group.buffer)
            .unwrap_or(0);
        let x = chart.x(gi, s.group.variant) - chart.slot * 0.4;
        let c = color(s.group.variant);
        let (all, unnecessary) = (chart.y(s.retransmissions), chart.y(s.unnecessary));
        let _ = writeln!(
            chart.svg,
            "<rect x=\"{x:.1}\" y=\"{all:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"{c}\" fill-opacity=\"0.25\" stroke=\"{c}\"/><rect x=\"{x:.1}\" y=\"{unnecessary:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"{c}\"/>",
            base - all,
            base - unnecessary,
            w = chart.slot * 0.8,
        );
    }
    Some(chart.finish(&buffers, &variants))
}

/// Writes `summary.csv`, `summary.json`, `report.md` and the SVG plots into `dir`.
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
    md.push_str("\n## Plots\n\n");
    let mut keys: Vec<(Mode, Workload, usize, Loss)> = summaries
        .iter()
        .map(|s| {
            (
                s.group.mode,
                s.group.workload,
                s.group.clients,
                s.group.loss,
            )
        })
        .collect();
    keys.sort();
    keys.dedup();
    for (m, w, n, l) in keys {
        let name = format!(
            "fct-{}-{}-{n}-{}.svg",
            mode_name(m),
            workload_name(w).to_lowercase(),
            l.name()
        );
        if let Some(svg) = fct_plot(&summaries, m, w, n, l) {
            std::fs::write(dir.join(&name), svg)?;
            let _ = writeln!(md, "![{name}]({name})");
            written.push(name);
        }
        if l == Loss::None {
            let name = format!(
                "retx-{}-{}-{n}.svg",
                mode_name(m),
                workload_name(w).to_lowercase()
            );
            if let Some(svg) = retx_plot(&summaries, m, w, n) {
                std::fs::write(dir.join(&name), svg)?;
                let _ = writeln!(md, "![{name}]({name})");
                written.push(name);
            }
        }
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

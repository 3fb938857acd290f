//! `cobalt-study`: runs the congestion study (or a named part of it) over the emulated link
//! and/or in virtual time, resuming where an earlier run stopped, and writes its
//! tables and plots.

use clap::{Parser, Subcommand, ValueEnum};
use cobalt_study::case::{subset, Case, Loss, Matrix, Mode, Variant, Workload, SUBSETS};
use cobalt_study::emu_run::{self, EmuOptions};
use cobalt_study::{report, results, sim_run};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// CoAP congestion control on a constrained link: the congestion study.
#[derive(Debug, Parser)]
#[command(name = "cobalt-study", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs the cases not yet in OUT/results.jsonl, then writes the report.
    Run(RunArgs),
    /// Writes the report (OUT/report.md, summary.csv, summary.json, SVG plots) from
    /// OUT/results.jsonl, or from the results of the --from directories together (to
    /// set emulated and virtual-time runs side by side).
    Report {
        /// The study's directory.
        #[arg(long, default_value = "bench/congestion/results")]
        out: PathBuf,
        /// Read DIR/results.jsonl instead of OUT's (repeatable).
        #[arg(long, value_name = "DIR")]
        from: Vec<PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ModeArg {
    Virtual,
    Emulated,
    Both,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Virtual time (UDP variants, seconds per case), emulation (real time: a case
    /// lasts as long as its flows, hours for the whole matrix, root needed) or both.
    #[arg(long, value_enum, default_value = "virtual")]
    mode: ModeArg,
    /// Named parts of the study (repeatable): full, measured, table1, fig2, fig3, fig5,
    /// fig6, beyond, ci, ci-virtual. Without it, the lists below define the matrix.
    #[arg(long)]
    subset: Vec<String>,
    /// Workloads: continuous, random (comma-separated; with --subset: keep only these).
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
    /// Client counts, e.g. 1,50,100.
    #[arg(long, value_delimiter = ',')]
    clients: Vec<usize>,
    /// Buffers in bytes, e.g. 2500,28200,1410000.
    #[arg(long, value_delimiter = ',')]
    buffers: Vec<usize>,
    /// Error profiles: none, medium, high.
    #[arg(long, value_delimiter = ',')]
    loss: Vec<String>,
    /// Variants: default, cocoa, cocoa-strong, fasor, tcp.
    #[arg(long, value_delimiter = ',')]
    variants: Vec<String>,
    /// Replications on the error-free link (overrides the subset's).
    #[arg(long)]
    reps: Option<u32>,
    /// Replications on the error-prone links (overrides the subset's).
    #[arg(long)]
    reps_lossy: Option<u32>,
    /// Base seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The study's directory (results.jsonl, the report, packet logs).
    #[arg(long, default_value = "bench/congestion/results")]
    out: PathBuf,
    /// Emulation: give up on clients still running after this many seconds.
    #[arg(long, default_value_t = 3600)]
    case_timeout: u64,
    /// Emulation: keep the per-packet logs.
    #[arg(long)]
    keep_logs: bool,
    /// Emulation: a sysctl for both namespaces on top of the study's own (TCP
    /// experiments, e.g. net.ipv4.tcp_early_retrans=0); use a separate --out.
    #[arg(long)]
    sysctl: Vec<String>,
    /// Stop after this many cases (the rest run next time).
    #[arg(long)]
    max_cases: Option<usize>,
    /// List the cases that would run, and stop.
    #[arg(long)]
    dry_run: bool,
}

fn parse_list<T>(
    what: &str,
    items: &[String],
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Vec<T>, String> {
    items
        .iter()
        .map(|s| parse(s).ok_or_else(|| format!("unknown {what} `{s}`")))
        .collect()
}

fn matrices(a: &RunArgs) -> Result<Vec<Matrix>, String> {
    let workloads = parse_list("workload", &a.workloads, |s| match s {
        "continuous" => Some(Workload::Continuous),
        "random" => Some(Workload::Random),
        _ => None,
    })?;
    let losses = parse_list("loss profile", &a.loss, Loss::parse)?;
    let variants = parse_list("variant", &a.variants, Variant::parse)?;
    let keep = |base: &[Workload], m: &mut Matrix| {
        let _ = base;
        if !workloads.is_empty() {
            m.workloads.retain(|w| workloads.contains(w));
        }
        if !a.clients.is_empty() {
            m.clients.retain(|c| a.clients.contains(c));
        }
        if !a.buffers.is_empty() {
            m.buffers.retain(|b| a.buffers.contains(b));
        }
        if !losses.is_empty() {
            m.losses.retain(|l| losses.contains(l));
        }
        if !variants.is_empty() {
            m.variants.retain(|v| variants.contains(v));
        }
        if let Some(r) = a.reps {
            m.reps = r;
        }
        if let Some(r) = a.reps_lossy {
            m.reps_lossy = r;
        }
    };
    if a.subset.is_empty() {
        let mut m = Matrix {
            workloads: if workloads.is_empty() {
                vec![Workload::Continuous]
            } else {
                workloads.clone()
            },
            clients: if a.clients.is_empty() {
                vec![1]
            } else {
                a.clients.clone()
            },
            buffers: if a.buffers.is_empty() {
                vec![2500]
            } else {
                a.buffers.clone()
            },
            losses: if losses.is_empty() {
                vec![Loss::None]
            } else {
                losses.clone()
            },
            variants: if variants.is_empty() {
                Variant::ALL.to_vec()
            } else {
                variants.clone()
            },
            reps: 1,
            reps_lossy: 1,
        };
        keep(&[], &mut m);
        return Ok(vec![m]);
    }
    let mut out = Vec::new();
    for name in &a.subset {
        let ms = subset(name)
            .ok_or_else(|| format!("unknown subset `{name}`: use {}", SUBSETS.join(", ")))?;
        for mut m in ms {
            keep(&[], &mut m);
            out.push(m);
        }
    }
    Ok(out)
}

fn run(a: RunArgs) -> Result<(), String> {
    let ms = matrices(&a)?;
    let modes = match a.mode {
        ModeArg::Virtual => vec![Mode::Virtual],
        ModeArg::Emulated => vec![Mode::Emulated],
        ModeArg::Both => vec![Mode::Emulated, Mode::Virtual],
    };
    let mut cases: Vec<Case> = Vec::new();
    for mode in &modes {
        for m in &ms {
            cases.extend(m.cases(*mode));
        }
    }
    cases.sort_by_key(|c| (c.mode, c.clients, c.group(), c.rep));
    cases.dedup();
    std::fs::create_dir_all(&a.out)
        .map_err(|e| format!("cannot create {}: {e}", a.out.display()))?;
    let store = a.out.join("results.jsonl");
    let done =
        results::done_keys(&store).map_err(|e| format!("cannot read {}: {e}", store.display()))?;
    let todo: Vec<Case> = cases
        .into_iter()
        .filter(|c| !done.contains(&c.key()))
        .collect();
    let todo: Vec<Case> = todo
        .into_iter()
        .take(a.max_cases.unwrap_or(usize::MAX))
        .collect();
    eprintln!(
        "{} cases to run ({} already in {})",
        todo.len(),
        done.len(),
        store.display()
    );
    if a.dry_run {
        for c in &todo {
            println!("{}", c.key());
        }
        return Ok(());
    }
    if todo.iter().any(|c| c.mode == Mode::Emulated) {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("emulated cases need root (network namespaces and TUN devices)".into());
        }
        let stale = cobalt_linkem::netns::remove_stale();
        if !stale.is_empty() {
            eprintln!("removed stale namespaces {}", stale.join(", "));
        }
    }
    let opts = EmuOptions {
        work_dir: a.out.join("work"),
        keep_logs: a.keep_logs,
        case_timeout: Duration::from_secs(a.case_timeout),
        sysctls: a.sysctl.clone(),
    };
    let started = Instant::now();
    for (i, c) in todo.iter().enumerate() {
        let seed = c.seed(a.seed);
        let r = match c.mode {
            Mode::Virtual => sim_run::run(c, seed),
            Mode::Emulated => emu_run::run(c, seed, &opts)
                .map_err(|e| format!("{}: the emulated run failed: {e}", c.key()))?,
        };
        results::append(&store, &r)
            .map_err(|e| format!("cannot write {}: {e}", store.display()))?;
        let median = report::percentiles(&r.fct).map_or(f64::NAN, |p| p[2]);
        eprintln!(
            "[{}/{}] {}: median FCT {median:.3} s, {} unfinished, {:.1} s wall",
            i + 1,
            todo.len(),
            r.key,
            r.unfinished,
            r.wall_s
        );
    }
    eprintln!(
        "ran {} cases in {:.0} s",
        todo.len(),
        started.elapsed().as_secs_f64()
    );
    write_report(&a.out)
}

fn write_report(out: &std::path::Path) -> Result<(), String> {
    write_report_from(out, &[])
}

fn write_report_from(out: &std::path::Path, from: &[PathBuf]) -> Result<(), String> {
    let dirs = if from.is_empty() {
        vec![out.to_path_buf()]
    } else {
        from.to_vec()
    };
    let mut all = Vec::new();
    for d in dirs {
        let store = d.join("results.jsonl");
        all.extend(
            results::load(&store).map_err(|e| format!("cannot read {}: {e}", store.display()))?,
        );
    }
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let files =
        report::write_all(out, &all).map_err(|e| format!("cannot write the report: {e}"))?;
    eprintln!(
        "wrote {} files into {} ({} runs)",
        files.len(),
        out.display(),
        all.len()
    );
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Run(a) => run(a),
        Command::Report { out, from } => write_report_from(&out, &from),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cobalt-study: {e}");
            ExitCode::FAILURE
        }
    }
}

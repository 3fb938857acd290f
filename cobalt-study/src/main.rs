//! `cobalt-study`: runs the congestion study (or a named part of it) over the emulated link
//! and/or in virtual time, resuming where an earlier run stopped, and writes its
//! tables and plots.

use clap::{Parser, Subcommand, ValueEnum};
use cobalt_study::case::{subset, Case, Loss, Matrix, Mode, Variant, Workload, SUBSETS};
use cobalt_study::emu_run::{self, EmuOptions};
use cobalt_study::{estimate, findings, report, results, sim_run};
use std::path::{Path, PathBuf};
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
    /// Writes the report (OUT/report.md, summary.csv, summary.json, paper.json, the
    /// paper's figures as SVG) from
    /// OUT/results.jsonl, or from the results of the --from directories together (to
    /// set emulated and virtual-time runs side by side).
    Report {
        /// The study's directory.
        #[arg(long, default_value = "bench/congestion/results")]
        out: PathBuf,
        /// Read DIR/results.jsonl instead of OUT's (repeatable).
        #[arg(long, value_name = "DIR")]
        from: Vec<PathBuf>,
        /// Also regenerate the findings in this README (between its markers).
        #[arg(long, value_name = "FILE")]
        readme: Option<PathBuf>,
    },
    /// The whole study as the paper ran it, resumable: every UDP case in virtual time
    /// with the held-out workloads of FASOR-K's evaluation (OUT/virtual) and every case
    /// emulated (OUT/results, root; the paper's 20 and 40
    /// replications), skipping runs already stored; then the report, the figures and
    /// the README's findings over both, in OUT.
    Reproduce(ReproduceArgs),
}

#[derive(Debug, clap::Args)]
struct ReproduceArgs {
    /// The study's directory.
    #[arg(long, default_value = "bench/congestion")]
    out: PathBuf,
    /// Run no emulated case (only virtual time, then the report).
    #[arg(long)]
    skip_emulated: bool,
    /// Stop after this many emulated cases (the rest run next time).
    #[arg(long)]
    max_emulated_cases: Option<usize>,
    /// Emulation: give up on clients still running after this many seconds.
    #[arg(long, default_value_t = 3600)]
    case_timeout: u64,
    /// Say what is left to run and about how long it takes, and stop.
    #[arg(long)]
    dry_run: bool,
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

/// How cases are run.
struct Runner {
    out: PathBuf,
    seed: u64,
    emu: EmuOptions,
    max_cases: Option<usize>,
    dry_run: bool,
}

/// The cases of `ms` in `modes` not yet stored in OUT/results.jsonl.
fn missing(ms: &[Matrix], modes: &[Mode], out: &Path) -> Result<(Vec<Case>, usize), String> {
    let mut cases: Vec<Case> = Vec::new();
    for mode in modes {
        for m in ms {
            cases.extend(m.cases(*mode));
        }
    }
    cases.sort_by_key(|c| (c.mode, c.clients, c.group(), c.rep));
    cases.dedup();
    let store = out.join("results.jsonl");
    let done =
        results::done_keys(&store).map_err(|e| format!("cannot read {}: {e}", store.display()))?;
    let todo: Vec<Case> = cases
        .into_iter()
        .filter(|c| !done.contains(&c.key()))
        .collect();
    Ok((todo, done.len()))
}

impl Runner {
    /// Runs `todo` (at most `max_cases` of them), appending each result to
    /// OUT/results.jsonl as it finishes.
    fn run(&self, todo: Vec<Case>, done: usize) -> Result<(), String> {
        std::fs::create_dir_all(&self.out)
            .map_err(|e| format!("cannot create {}: {e}", self.out.display()))?;
        let store = self.out.join("results.jsonl");
        let todo: Vec<Case> = todo
            .into_iter()
            .take(self.max_cases.unwrap_or(usize::MAX))
            .collect();
        eprintln!(
            "{} cases to run ({done} already in {})",
            todo.len(),
            store.display()
        );
        if self.dry_run {
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
            for cgroup in cobalt_study::sockops::remove_stale() {
                eprintln!("removed the stale cgroup {}", cgroup.display());
            }
        }
        let started = Instant::now();
        for (i, c) in todo.iter().enumerate() {
            let seed = c.seed(self.seed);
            let r = match c.mode {
                Mode::Virtual => sim_run::run(c, seed),
                Mode::Emulated => emu_run::run(c, seed, &self.emu)
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
        Ok(())
    }
}

fn run(a: RunArgs) -> Result<(), String> {
    let ms = matrices(&a)?;
    let modes = match a.mode {
        ModeArg::Virtual => vec![Mode::Virtual],
        ModeArg::Emulated => vec![Mode::Emulated],
        ModeArg::Both => vec![Mode::Emulated, Mode::Virtual],
    };
    let (todo, done) = missing(&ms, &modes, &a.out)?;
    let runner = Runner {
        out: a.out.clone(),
        seed: a.seed,
        emu: EmuOptions {
            work_dir: a.out.join("work"),
            keep_logs: a.keep_logs,
            case_timeout: Duration::from_secs(a.case_timeout),
            sysctls: a.sysctl.clone(),
        },
        max_cases: a.max_cases,
        dry_run: a.dry_run,
    };
    runner.run(todo, done)?;
    if a.dry_run {
        return Ok(());
    }
    write_report(&a.out)
}

fn reproduce(a: ReproduceArgs) -> Result<(), String> {
    let full = subset("full").ok_or("no subset `full`")?;
    let mut with_held_out = full.clone();
    with_held_out.extend(subset("heldout").ok_or("no subset `heldout`")?);
    let virtual_dir = a.out.join("virtual");
    let emulated_dir = a.out.join("results");
    // The virtual results are kept compressed: continue from them.
    let store = virtual_dir.join("results.jsonl");
    if !store.exists() && results::compressed(&store).exists() {
        let runs =
            results::load(&store).map_err(|e| format!("cannot read the virtual results: {e}"))?;
        for r in &runs {
            results::append(&store, r)
                .map_err(|e| format!("cannot write {}: {e}", store.display()))?;
        }
    }
    let runner = |out: &Path, max_cases| Runner {
        out: out.to_path_buf(),
        seed: 1,
        emu: EmuOptions {
            work_dir: out.join("work"),
            keep_logs: false,
            case_timeout: Duration::from_secs(a.case_timeout),
            sysctls: Vec::new(),
        },
        max_cases,
        dry_run: a.dry_run,
    };
    let (todo, done) = missing(&with_held_out, &[Mode::Virtual], &virtual_dir)?;
    runner(&virtual_dir, None).run(todo, done)?;
    let (todo, done) = missing(&full, &[Mode::Emulated], &emulated_dir)?;
    let virtual_runs =
        results::load(&store).map_err(|e| format!("cannot read the virtual results: {e}"))?;
    let left = estimate::emulated_wall_time(&todo, &virtual_runs);
    eprintln!(
        "{} emulated cases left: about {:.1} h of wall-clock time",
        todo.len(),
        left.as_secs_f64() / 3600.0
    );
    if !a.skip_emulated {
        runner(&emulated_dir, a.max_emulated_cases).run(todo, done)?;
    }
    if a.dry_run {
        return Ok(());
    }
    if store.exists() {
        results::compress(&store)
            .map_err(|e| format!("cannot compress {}: {e}", store.display()))?;
    }
    write_report_from(
        &a.out,
        &[emulated_dir, virtual_dir],
        Some(&a.out.join("README.md")),
    )
}

fn write_report(out: &Path) -> Result<(), String> {
    write_report_from(out, &[], None)
}

/// Writes the report into `out` from the results of `from` (or of `out`), and the
/// findings into `readme` if given.
fn write_report_from(out: &Path, from: &[PathBuf], readme: Option<&Path>) -> Result<(), String> {
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
    if let Some(readme) = readme {
        let text = std::fs::read_to_string(readme)
            .map_err(|e| format!("cannot read {}: {e}", readme.display()))?;
        let generated = findings::markdown(&report::summarise(&all), &all);
        let text = findings::splice(&text, &generated)
            .map_err(|e| format!("{}: {e}", readme.display()))?;
        std::fs::write(readme, text)
            .map_err(|e| format!("cannot write {}: {e}", readme.display()))?;
        eprintln!("wrote the findings into {}", readme.display());
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Run(a) => run(a),
        Command::Report { out, from, readme } => write_report_from(&out, &from, readme.as_deref()),
        Command::Reproduce(a) => reproduce(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cobalt-study: {e}");
            ExitCode::FAILURE
        }
    }
}

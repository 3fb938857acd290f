//! `cobalt bench`: the command around the [`cobalt_bench`] engine (CoAPBench, the
//! paper's load generator, issue 4): its arguments ([`args`]), the sweep of steps, the
//! output formats, `--workers` ([`distributed`]), and the exit codes.
//!
//! Ctrl-C stops the run and prints what was measured (exit code 130). A run in which no
//! request completed warns and exits non-zero (see [`verdict`]); a step that cannot run
//! exits 3 when the server is to blame (refused connection, failed handshake) and 1
//! otherwise.

mod args;
mod distributed;
pub mod http_responder;
pub mod responder;
#[cfg(test)]
mod session_tests;

pub use args::BenchArgs;

use crate::exit;
use crate::flags::seconds;
use args::{BenchCommand, IoArg};
use cobalt_bench::output::{self, Format, RunInfo};
use cobalt_bench::stats::StepResult;
use cobalt_bench::sys::{self, interrupted, now_ns};
use cobalt_bench::target::{parse_sweep, parse_uri, Scheme};
use cobalt_bench::{
    http_request_bytes, plot, procfs, request_template, run_step, Blame, Config, StepError,
};
use std::time::Duration;

/// File descriptors kept in reserve beyond one per client and one per thread.
const FD_RESERVE: u64 = 64;

/// `template` (a CoAP request) with a Content-Format option, if one is given.
fn with_content_format(template: Vec<u8>, cf: Option<u16>) -> Result<Vec<u8>, String> {
    let Some(cf) = cf else { return Ok(template) };
    let mut m = cobalt_proto::message::codec::decode(&template)
        .map_err(|e| format!("cannot add a Content-Format to the request: {e:?}"))?;
    m.options
        .set_uint(cobalt_proto::message::opt::CONTENT_FORMAT, u32::from(cf));
    Ok(cobalt_proto::message::codec::encode(&m))
}

/// Validates the arguments into a step configuration; the error is a one-line message
/// for exit code 2.
pub fn config_from_args(a: &BenchArgs) -> Result<Config, String> {
    let uri = a.uri.as_deref().ok_or("missing target URI")?;
    let target = parse_uri(uri)?;
    check_combination(a, target.scheme)?;
    let dtls = match target.scheme {
        Scheme::Coap(cobalt::Scheme::Coaps) => Some(a.dtls.client_auth()?.ok_or(
            "coaps:// needs credentials: --psk-identity ID --psk-key KEY (as for \
                 `cobalt get`), or --ca FILE for certificates",
        )?),
        // Without credentials TLS trusts the system's CAs.
        _ => a.dtls.client_auth()?,
    };
    let addr = target.resolve()?;
    let steps = parse_sweep(&a.clients)?;
    if a.threads == 0 || a.threads > 1024 {
        return Err(format!(
            "invalid --threads {}: expected 1 to 1024",
            a.threads
        ));
    }
    if let Some(pid) = a.server_pid {
        if procfs::cpu_seconds(pid).is_none() {
            return Err(format!("--server-pid {pid}: cannot read /proc/{pid}/stat"));
        }
    }
    if let Some(r) = a.rate {
        if !r.is_finite() || r <= 0.0 || r > 1e9 {
            return Err(format!(
                "invalid --rate {r}: expected requests per second above 0"
            ));
        }
    }
    let scheme = target.scheme;
    let confirmable = !a.non;
    let template = match scheme {
        Scheme::Http => http_request_bytes(
            &target,
            a.method.name(),
            !a.no_keepalive,
            a.payload.as_deref(),
        ),
        _ => with_content_format(
            request_template(&target, a.method.code(), confirmable, a.payload.as_deref()),
            a.content_format,
        )?,
    };
    Ok(Config {
        uri: uri.to_string(),
        target: addr,
        scheme,
        host: target.host.clone(),
        dtls,
        new_session: a.new_session,
        keepalive: !a.no_keepalive,
        template,
        confirmable,
        cc: a.cc,
        method: a.method.name(),
        steps,
        duration: seconds("duration", a.duration, false)?,
        warmup: seconds("warmup", a.warmup, true)?,
        cooldown: seconds("cooldown", a.cooldown, true)?,
        timeout: seconds("timeout", a.timeout, false)?,
        threads: a.threads,
        io: a.io.io(),
        rate: a.rate,
        server_pid: a.server_pid,
        progress: !a.quiet,
        stop: Default::default(),
    })
}

/// Refuses flags that make no sense with the URI's scheme (exit code 2).
fn check_combination(a: &BenchArgs, scheme: Scheme) -> Result<(), String> {
    let name = scheme.name();
    if a.no_keepalive && scheme != Scheme::Http {
        let hint = if scheme.has_sessions() {
            " (use --new-session for a new connection or session per request)"
        } else {
            ""
        };
        return Err(format!(
            "--no-keepalive applies to http:// targets only{hint}"
        ));
    }
    if a.non
        && !matches!(
            scheme,
            Scheme::Coap(cobalt::Scheme::Coap) | Scheme::Coap(cobalt::Scheme::Coaps)
        )
    {
        return Err(format!(
            "--non applies to coap:// and coaps:// targets only ({name}:// has no message types)"
        ));
    }
    if a.content_format.is_some() && (scheme == Scheme::Http || a.workers.is_some()) {
        return Err(
            "--content-format applies to CoAP targets on this machine only (not http://, \
             not passed to --workers)"
                .into(),
        );
    }
    if a.cc.is_some() && a.workers.is_some() {
        return Err("--cc runs on this machine only; it is not passed to --workers".into());
    }
    if a.cc.is_some() && (scheme != Scheme::Coap(cobalt::Scheme::Coap) || a.non) {
        return Err(format!(
            "--cc applies to confirmable coap:// requests only ({name}://{} has no CoAP retransmissions)",
            if a.non { " with --non" } else { "" }
        ));
    }
    if a.io != IoArg::Auto && scheme != Scheme::Coap(cobalt::Scheme::Coap) {
        return Err(format!(
            "--io applies to coap:// targets only ({name}:// runs on epoll or async sessions)"
        ));
    }
    if a.io != IoArg::Auto && a.workers.is_some() {
        return Err("--io runs on this machine only; it is not passed to --workers".into());
    }
    if a.new_session && !scheme.has_sessions() {
        return Err(format!(
            "--new-session applies to coaps://, coap+tcp:// and coap+ws:// targets only \
             ({name}:// has no sessions{})",
            if scheme == Scheme::Http {
                "; use --no-keepalive for a new HTTP connection per request"
            } else {
                ""
            }
        ));
    }
    let secure = scheme.is_secure();
    if a.dtls.given() && !secure {
        return Err(format!(
            "--psk-identity, --psk-key, --ca, --cert and --key apply to coaps://, coaps+tcp:// \
             and coaps+ws:// targets only, not {name}://"
        ));
    }
    if a.workers.is_some() && secure {
        return Err(format!(
            "{name}:// cannot run on --workers: the worker protocol does not carry \
             credentials (they would cross the network in clear); run it on one machine"
        ));
    }
    Ok(())
}

/// Runs the benchmark; returns the process exit code.
pub fn run(mut args: BenchArgs) -> i32 {
    match args.command.take() {
        Some(BenchCommand::Worker(w)) => return distributed::worker_main(w),
        Some(BenchCommand::Plot(p)) => return plot_reports(&p),
        None => {}
    }
    let cfg = match config_from_args(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cobalt bench: {e}");
            return 2;
        }
    };
    let workers = match args.workers.as_deref().map(distributed::parse_workers) {
        None => None,
        Some(Ok(w)) => Some(w),
        Some(Err(e)) => {
            eprintln!("cobalt bench: {e}");
            return 2;
        }
    };
    if let (Some(command), Some(w)) = (&args.exec, &workers) {
        return distributed::run_exec_everywhere(w, command, args.duration);
    }
    let step_template = distributed::request_template(&args);
    let format = if args.json {
        Format::Json
    } else if args.csv {
        Format::Csv
    } else {
        Format::Table
    };
    let max_clients = cfg.steps.iter().copied().max().unwrap_or(1) as u64;
    let limit = sys::raise_fd_limit();
    let available = limit.saturating_sub(sys::open_fds());
    let needed = max_clients + cfg.threads as u64 + FD_RESERVE;
    if workers.is_none() && needed > available {
        eprintln!(
            "cobalt bench: {max_clients} clients need about {needed} file descriptors but only \
             {available} are available (limit {limit}); raise it with `ulimit -n {}` \
             (hard limit: `ulimit -Hn`)",
            needed + sys::open_fds()
        );
        return 1;
    }
    // Create the plot's file now: a path that cannot be written fails before the run.
    let mut plot_file = match args.plot.as_deref().map(std::fs::File::create) {
        None => None,
        Some(Ok(f)) => Some(f),
        Some(Err(e)) => {
            let path = args.plot.as_deref().unwrap_or(std::path::Path::new(""));
            eprintln!("cobalt bench: cannot write {}: {e}", path.display());
            return exit::FAILURE;
        }
    };
    sys::install_sigint_handler();
    let info = RunInfo {
        uri: cfg.uri.clone(),
        target: cfg.target.to_string(),
        method: cfg.method.to_string(),
        scheme: cfg.scheme.name().to_string(),
        message_type: match (cfg.scheme, cfg.confirmable, cfg.keepalive) {
            (Scheme::Http, _, true) => "HTTP/1.1 keep-alive",
            (Scheme::Http, _, false) => "HTTP/1.1 close",
            (s, _, _) if s.is_reliable() => "RFC 8323 (no message type)",
            (_, true, _) => "CON",
            (_, false, _) => "NON",
        }
        .to_string(),
        new_session: cfg.new_session,
        duration_s: cfg.duration.as_secs_f64(),
        warmup_s: cfg.warmup.as_secs_f64(),
        timeout_s: cfg.timeout.as_secs_f64(),
        threads: cfg.threads,
        rate: cfg.rate,
        server_pid: cfg.server_pid,
    };
    let with_server = cfg.server_pid.is_some();
    let mut code = exit::OK;
    // Whether stdout still has a reader; a closed one ends the run quietly.
    let mut reader = true;
    if let Some(h) = output::header(format, with_server) {
        emit(&h, &mut reader, &mut code);
    }
    let mut results = Vec::new();
    for (i, &clients) in cfg.steps.iter().enumerate() {
        if interrupted() || !reader || code != exit::OK {
            break;
        }
        if i > 0 && !sleep_interruptible(cfg.cooldown) {
            break;
        }
        let result = match &workers {
            Some(w) => {
                if cfg.progress {
                    eprintln!("[{clients} clients] running on {} workers", w.len());
                }
                distributed::run_step(&cfg, &step_template, w, clients)
            }
            None => run_step(&cfg, clients),
        };
        match result {
            Ok(r) => {
                if let Some(line) = output::row(format, &r, with_server) {
                    emit(&line, &mut reader, &mut code);
                }
                results.push(r);
            }
            Err(e) => {
                eprintln!("cobalt bench: {e}");
                code = exit_code(&e);
                break;
            }
        }
    }
    if interrupted() {
        eprintln!("cobalt bench: interrupted, results are partial");
        code = exit::INTERRUPTED;
    } else if reader {
        let (verdict, warnings) = verdict(&results);
        for w in warnings {
            eprintln!("cobalt bench: warning: {w}");
        }
        if code == exit::OK {
            code = verdict;
        }
    }
    if format == Format::Json && reader {
        emit(
            &output::json(&info, &results, interrupted()),
            &mut reader,
            &mut code,
        );
    }
    if let (Some(path), Some(file)) = (&args.plot, plot_file.as_mut()) {
        let run = plot::Run {
            label: info.uri.clone(),
            info: &info,
            steps: &results,
        };
        if let Err(e) = std::io::Write::write_all(file, plot::svg(&[run]).as_bytes()) {
            eprintln!("cobalt bench: cannot write {}: {e}", path.display());
            code = code.max(exit::FAILURE);
        }
    }
    code
}

/// The exit code of a step that could not run: 3 when the server is to blame, else 1.
fn exit_code(e: &StepError) -> i32 {
    match e.blame {
        Blame::Network => exit::NETWORK,
        Blame::Local => exit::FAILURE,
    }
}

/// `cobalt bench plot`: one figure from several `--json` reports; returns the exit code.
fn plot_reports(args: &args::PlotArgs) -> i32 {
    let mut reports = Vec::new();
    for path in &args.reports {
        match plot::read_report(path) {
            Ok(r) => {
                let label = path
                    .file_stem()
                    .map_or_else(|| r.info.uri.clone(), |s| s.to_string_lossy().into_owned());
                reports.push((label, r));
            }
            Err(e) => {
                eprintln!("cobalt bench plot: {e}");
                return exit::USAGE;
            }
        }
    }
    let runs: Vec<plot::Run> = reports
        .iter()
        .map(|(label, r)| plot::Run {
            label: label.clone(),
            info: &r.info,
            steps: &r.steps,
        })
        .collect();
    match std::fs::write(&args.output, plot::svg(&runs)) {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!(
                "cobalt bench plot: cannot write {}: {e}",
                args.output.display()
            );
            exit::FAILURE
        }
    }
}

/// Prints one line of results; a closed stdout clears `reader`, another failure sets
/// `code`.
fn emit(text: &str, reader: &mut bool, code: &mut i32) {
    match crate::sink::write_stdout(format!("{text}\n").as_bytes()) {
        Ok(open) => *reader &= open,
        Err((c, message)) => {
            eprintln!("cobalt bench: {message}");
            *code = c;
        }
    }
}

/// The exit code the results call for, and warnings for stderr: answers other than
/// 2.xx (never counted as completed) and steps that completed nothing. A run in which
/// no request completed fails: with the class of its most frequent answer (4.xx: 4,
/// 5.xx: 5, anything else: 6), or 3 when nothing was answered at all.
fn verdict(results: &[StepResult]) -> (i32, Vec<String>) {
    let mut warnings = Vec::new();
    let mut codes: std::collections::BTreeMap<&str, u64> = Default::default();
    for r in results {
        let step = format!("[{} clients]", r.clients);
        if r.non_2xx > 0 {
            warnings.push(format!(
                "{step} {} answers were not 2.xx ({}); they are not counted as completed",
                r.non_2xx,
                output::codes_text(r, ": ")
            ));
        }
        if r.completed == 0 {
            warnings.push(format!(
                "{step} no request completed ({} sent, {} lost, {} errors, {} resets, {} other answers)",
                r.sent, r.lost, r.errors, r.resets, r.non_2xx
            ));
        }
        for (code, n) in &r.non_2xx_codes {
            *codes.entry(code).or_default() += n;
        }
    }
    if results.is_empty() || results.iter().any(|r| r.completed > 0) {
        return (exit::OK, warnings);
    }
    let code = match codes.iter().max_by_key(|(_, n)| **n) {
        None => exit::NETWORK,
        Some((code, _)) => match code.as_bytes().first() {
            Some(b'4') => exit::CLIENT_ERROR,
            Some(b'5') => exit::SERVER_ERROR,
            _ => exit::PROTOCOL,
        },
    };
    (code, warnings)
}

/// Sleeps for `d` unless Ctrl-C comes first; returns false when interrupted.
fn sleep_interruptible(d: Duration) -> bool {
    let end = now_ns() + d.as_nanos() as u64;
    loop {
        if interrupted() {
            return false;
        }
        let now = now_ns();
        if now >= end {
            return true;
        }
        std::thread::sleep(Duration::from_nanos((end - now).min(50_000_000)));
    }
}

/// Parses `cobalt bench` arguments (without the `bench` word), for tests.
#[cfg(test)]
fn parse_args(argv: &[&str]) -> BenchArgs {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }
    Cli::parse_from(std::iter::once("bench").chain(argv.iter().copied())).bench
}

#[cfg(test)]
mod tests {
    use super::*;
    use cobalt_bench::responder;
    use cobalt_bench::stats::Recorder;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// A one-second step of CON GETs to `target`, as `cobalt bench` parses it.
    fn config(target: SocketAddr, timeout_ms: u64) -> Config {
        let uri = format!("coap://{target}/bench");
        let timeout = format!("{}", timeout_ms as f64 / 1000.0);
        let argv = [
            uri.as_str(),
            "-c",
            "4",
            "-d",
            "1",
            "--warmup",
            "0",
            "--timeout",
            timeout.as_str(),
            "-q",
        ];
        config_from_args(&parse_args(&argv)).unwrap()
    }

    #[test]
    fn bad_input_exits_with_2() {
        for argv in [
            &["coap//nohost"][..],
            &["ftp://127.0.0.1/"],
            &["coap://127.0.0.1:99999/"],
            &["coap://127.0.0.1/", "-c", "0"],
            &["coap://127.0.0.1/", "-c", "10..5"],
            &["coap://127.0.0.1/", "--threads", "0"],
            &["coap://127.0.0.1/", "-d", "0"],
            &["coap://127.0.0.1/", "--rate", "0"],
            &["coap://127.0.0.1/", "--no-keepalive"],
            &["http://127.0.0.1/", "--non"],
            &["coap://127.0.0.1/", "--workers", "nonsense"],
            &["coaps+tcp://127.0.0.1/", "--non"],
            &["coaps+ws://127.0.0.1/", "--workers", "h:1"],
            &["coaps://127.0.0.1/"],
            &[
                "coaps://127.0.0.1/",
                "--psk-identity",
                "a",
                "--psk-key",
                "0xz",
            ],
            &["coap+tcp://127.0.0.1/", "--non"],
            &["coap+ws://127.0.0.1/", "--no-keepalive"],
            &["coap://127.0.0.1/", "--new-session"],
            &["http://127.0.0.1/", "--new-session"],
            &[
                "coap+tcp://127.0.0.1/",
                "--psk-identity",
                "a",
                "--psk-key",
                "b",
            ],
            &["coap://127.0.0.1/", "--dtls-ca", "/dev/null"],
            &["coap+tcp://127.0.0.1/", "--cc", "fasor"],
            &["http://127.0.0.1/", "--io", "uring"],
            &[
                "coap://127.0.0.1/",
                "--io",
                "epoll",
                "--workers",
                "127.0.0.1:7000",
            ],
            &["coap://127.0.0.1/", "--cc", "fasor", "--non"],
            &[
                "coap://127.0.0.1/",
                "--cc",
                "karn",
                "--workers",
                "127.0.0.1:7000",
            ],
            &[
                "coaps://127.0.0.1/",
                "--psk-identity",
                "a",
                "--psk-key",
                "b",
                "--workers",
                "127.0.0.1:7000",
            ],
        ] {
            assert_eq!(run(parse_args(argv)), 2, "{argv:?}");
        }
    }

    #[test]
    fn distributed_step_over_two_workers() {
        let server = responder::Background::start().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::new();
        for _ in 0..2 {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            workers.push(l.local_addr().unwrap());
            let stop = stop.clone();
            std::thread::spawn(move || {
                distributed::serve_worker(&l, false, || stop.load(Ordering::Relaxed)).unwrap()
            });
        }
        let cfg = config(server.addr(), 2000);
        let template = distributed::StepRequest {
            uri: cfg.uri.clone(),
            clients: 0,
            duration_s: 1.0,
            warmup_s: 0.0,
            timeout_s: 2.0,
            threads: 1,
            rate: None,
            method: "get".into(),
            payload: None,
            non: false,
            no_keepalive: false,
            new_session: false,
            exec: None,
        };
        let r = distributed::run_step(&cfg, &template, &workers, 5).unwrap();
        stop.store(true, Ordering::Relaxed);
        server.stop().unwrap();
        assert_eq!(r.clients, 5);
        assert!(r.completed > 0 && r.lost == 0, "{r:?}");
        // A worker that is not there is a clear error, not a hang.
        let gone = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let e = distributed::run_step(&cfg, &template, &[gone], 1).unwrap_err();
        assert!(e.message.contains("cannot connect"), "{e}");
        assert_eq!(exit_code(&e), exit::NETWORK);
    }

    #[test]
    fn the_verdict_follows_the_answers() {
        let step = |completed: u64, codes: &[(&str, u64)], lost: u64| {
            let mut r = StepResult::from_recorder(10, 1.0, &Recorder::new(), None, false);
            r.completed = completed;
            r.lost = lost;
            r.non_2xx_codes = codes.iter().map(|(c, n)| (c.to_string(), *n)).collect();
            r.non_2xx = codes.iter().map(|(_, n)| n).sum();
            r
        };
        assert_eq!(verdict(&[]), (exit::OK, vec![]));
        assert_eq!(verdict(&[step(5, &[], 0)]), (exit::OK, vec![]));
        // One step completed something: success, but the empty step is reported.
        let (code, warnings) = verdict(&[step(0, &[], 9), step(5, &[], 0)]);
        assert_eq!(code, exit::OK);
        assert!(warnings[0].contains("no request completed"), "{warnings:?}");
        // Nothing completed: the most frequent answer's class, or 3 without answers.
        assert_eq!(verdict(&[step(0, &[], 9)]).0, exit::NETWORK);
        assert_eq!(
            verdict(&[step(0, &[("4.04", 9), ("5.03", 2)], 0)]).0,
            exit::CLIENT_ERROR
        );
        assert_eq!(verdict(&[step(0, &[("503", 3)], 0)]).0, exit::SERVER_ERROR);
        assert_eq!(verdict(&[step(0, &[("302", 3)], 0)]).0, exit::PROTOCOL);
    }
}

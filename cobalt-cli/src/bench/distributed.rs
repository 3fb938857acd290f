//! Distributed mode: `cobalt bench worker --listen ADDR` on several load machines, and
//! `cobalt bench URI --workers a:port,b:port` on a coordinator that splits each step's
//! clients (and `--rate`) across them and merges their counters and histograms.
//!
//! The control protocol is one JSON object per line over TCP: the coordinator sends a
//! [`StepRequest`], the worker runs the step with its own generator and answers with a
//! [`StepReply`] carrying its raw histogram buckets, so merged percentiles are exact to
//! the histogram's precision. Workers start a step when its request arrives; the
//! warm-up absorbs the small skew between machines.

use super::args::WorkerArgs;
use super::args::{BenchArgs, Method};
use super::config_from_args;
use clap::ValueEnum;
use cobalt_bench::stats::{AnswerCode, Recorder, ServerUsage, StepResult};
use cobalt_bench::{measure_step, procfs, sys, Config, StepError};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Largest control line accepted, in bytes (histograms are a few hundred KiB at most).
const MAX_LINE: u64 = 64 * 1024 * 1024;

/// Largest output of a third-party tool sent back, in bytes.
const MAX_EXEC_OUTPUT: usize = 1 << 20;

/// One step, as the coordinator asks a worker to run it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StepRequest {
    /// Target URI.
    pub uri: String,
    /// This worker's share of the clients.
    pub clients: usize,
    /// Measured seconds.
    pub duration_s: f64,
    /// Warm-up seconds.
    pub warmup_s: f64,
    /// Request timeout in seconds.
    pub timeout_s: f64,
    /// Generator threads on the worker.
    pub threads: usize,
    /// This worker's share of the open-loop rate.
    pub rate: Option<f64>,
    /// Method name (get, post, put, delete).
    pub method: String,
    /// Request payload.
    pub payload: Option<String>,
    /// CoAP NON requests.
    pub non: bool,
    /// HTTP without keep-alive.
    pub no_keepalive: bool,
    /// A new connection per request (`--new-session`, `coap+tcp` and `coap+ws`).
    #[serde(default)]
    pub new_session: bool,
    /// Run this command (argv) instead of a CoAPBench step.
    #[serde(default)]
    pub exec: Option<Vec<String>>,
}

/// A worker's answer to a [`StepRequest`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StepReply {
    /// Why the step could not run, if it could not.
    pub error: Option<String>,
    /// Requests sent in the window.
    pub sent: u64,
    /// Requests answered with 2.xx.
    pub completed: u64,
    /// Other answers, by code.
    #[serde(default)]
    pub other_codes: Vec<(AnswerCode, u64)>,
    /// Requests timed out.
    pub lost: u64,
    /// Socket errors and malformed responses.
    pub errors: u64,
    /// RST answers.
    pub resets: u64,
    /// Measured seconds.
    pub duration_s: f64,
    /// Cut short on the worker.
    pub partial: bool,
    /// Latency histogram as (nanoseconds, count) buckets.
    pub histogram: Vec<(u64, u64)>,
    /// Standard output and error of a third-party tool run with `exec`.
    #[serde(default)]
    pub output: Option<String>,
}

impl StepReply {
    fn from_recorder(rec: &Recorder, duration_s: f64, partial: bool) -> StepReply {
        StepReply {
            error: None,
            sent: rec.sent,
            completed: rec.completed,
            other_codes: rec.other_codes.iter().map(|(c, n)| (*c, *n)).collect(),
            lost: rec.lost,
            errors: rec.errors,
            resets: rec.resets,
            duration_s,
            partial,
            histogram: rec
                .latency
                .iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect(),
            output: None,
        }
    }

    fn failed(e: String) -> StepReply {
        StepReply {
            error: Some(e),
            ..StepReply::default()
        }
    }

    fn add_to(&self, rec: &mut Recorder) {
        rec.sent += self.sent;
        rec.completed += self.completed;
        for (code, n) in &self.other_codes {
            *rec.other_codes.entry(*code).or_default() += n;
        }
        rec.lost += self.lost;
        rec.errors += self.errors;
        rec.resets += self.resets;
        for &(v, n) in &self.histogram {
            rec.latency.saturating_record_n(v.max(1), n);
        }
    }
}

/// Builds the request template every worker gets for a run of `args`.
pub fn request_template(args: &BenchArgs) -> StepRequest {
    StepRequest {
        uri: args.uri.clone().unwrap_or_default(),
        clients: 0,
        duration_s: args.duration,
        warmup_s: args.warmup,
        timeout_s: args.timeout,
        threads: args.threads,
        rate: None,
        method: args.method.name().to_ascii_lowercase(),
        payload: args.payload.clone(),
        non: args.non,
        no_keepalive: args.no_keepalive,
        new_session: args.new_session,
        exec: None,
    }
}

/// Parses `--workers host:port,host:port`.
pub fn parse_workers(list: &str) -> Result<Vec<SocketAddr>, String> {
    let mut out = Vec::new();
    for w in list.split(',').map(str::trim) {
        let addr = w
            .to_socket_addrs()
            .map_err(|e| format!("invalid worker {w:?} (expected host:port): {e}"))?
            .next()
            .ok_or_else(|| format!("worker {w:?} has no address"))?;
        out.push(addr);
    }
    if out.is_empty() {
        return Err("--workers needs at least one host:port".into());
    }
    Ok(out)
}

/// Runs `cobalt bench worker`; returns the exit code.
pub fn worker_main(args: WorkerArgs) -> i32 {
    let listener = match TcpListener::bind(&args.listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cobalt bench worker: cannot listen on {}: {e}", args.listen);
            return 2;
        }
    };
    sys::raise_fd_limit();
    sys::install_sigint_handler();
    let shown = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or(args.listen);
    eprintln!("cobalt bench worker: waiting for a coordinator on {shown}");
    match serve_worker(&listener, args.allow_exec, sys::interrupted) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("cobalt bench worker: {e}");
            1
        }
    }
}

/// Serves coordinators one at a time until `stop` returns true.
pub fn serve_worker(
    listener: &TcpListener,
    allow_exec: bool,
    stop: impl Fn() -> bool,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    while !stop() {
        let (conn, peer) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        eprintln!("cobalt bench worker: coordinator {peer} connected");
        if let Err(e) = serve_coordinator(conn, allow_exec) {
            eprintln!("cobalt bench worker: coordinator {peer}: {e}");
        }
    }
    Ok(())
}

fn serve_coordinator(conn: TcpStream, allow_exec: bool) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    let mut writer = conn.try_clone()?;
    let watch = conn.try_clone()?;
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = Vec::new();
        if (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        let reply = match serde_json::from_slice::<StepRequest>(&line) {
            Ok(StepRequest {
                exec: Some(argv),
                duration_s,
                ..
            }) => run_external(&argv, duration_s, allow_exec),
            Ok(req) => {
                // While the step runs, a coordinator that hangs up (Ctrl-C there) stops it.
                let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
                let done = std::sync::atomic::AtomicBool::new(false);
                std::thread::scope(|s| {
                    s.spawn(|| watch_hangup(&watch, &done, &stop));
                    let reply = run_request(&req, stop.clone());
                    done.store(true, std::sync::atomic::Ordering::Relaxed);
                    reply
                })
            }
            Err(e) => StepReply::failed(format!("bad step request: {e}")),
        };
        let mut text = serde_json::to_string(&reply)
            .unwrap_or_else(|e| format!("{{\"error\":\"cannot encode reply: {e}\"}}"));
        text.push('\n');
        writer.write_all(text.as_bytes())?;
    }
}

/// Sets `stop` if the coordinator closes its side before `done` is set.
fn watch_hangup(
    conn: &TcpStream,
    done: &std::sync::atomic::AtomicBool,
    stop: &std::sync::atomic::AtomicBool,
) {
    use std::sync::atomic::Ordering;
    let _ = conn.set_read_timeout(Some(Duration::from_millis(100)));
    let mut byte = [0u8; 1];
    while !done.load(Ordering::Relaxed) {
        match conn.peek(&mut byte) {
            Ok(0) => {
                stop.store(true, Ordering::Relaxed);
                break;
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(100)), // next request queued
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut
                    || e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => {
                stop.store(true, Ordering::Relaxed);
                break;
            }
        }
    }
    let _ = conn.set_read_timeout(None);
}

/// Runs a third-party load tool for the coordinator and returns its output, killing it
/// if it runs much longer than the step should.
fn run_external(argv: &[String], duration_s: f64, allow: bool) -> StepReply {
    if !allow {
        return StepReply::failed(
            "this worker does not run commands; start it with `cobalt bench worker --allow-exec`"
                .into(),
        );
    }
    let Some((program, args)) = argv.split_first() else {
        return StepReply::failed("empty command".into());
    };
    let child = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return StepReply::failed(format!("cannot run {program}: {e}")),
    };
    let limit = Duration::from_secs_f64(duration_s.max(0.0) + 60.0);
    let started = std::time::Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return StepReply::failed(format!("waiting for {program}: {e}")),
        }
    };
    let mut output = String::new();
    for pipe in [
        child.stdout.take().map(|p| Box::new(p) as Box<dyn Read>),
        child.stderr.take().map(|p| Box::new(p) as Box<dyn Read>),
    ]
    .into_iter()
    .flatten()
    {
        let mut buf = Vec::new();
        let _ = pipe.take(MAX_EXEC_OUTPUT as u64).read_to_end(&mut buf);
        output.push_str(&String::from_utf8_lossy(&buf));
    }
    let mut reply = StepReply {
        output: Some(output),
        ..StepReply::default()
    };
    match status {
        Some(s) if s.success() => {}
        Some(s) => reply.error = Some(format!("{program} exited with {s}")),
        None => {
            reply.error = Some(format!(
                "{program} ran longer than {limit:?} and was stopped"
            ))
        }
    }
    reply
}

/// Runs a third-party tool on every worker at once and prints each one's output;
/// returns the exit code (0 when every worker's tool succeeded).
pub fn run_exec_everywhere(workers: &[SocketAddr], command: &str, duration_s: f64) -> i32 {
    let argv: Vec<String> = command.split_whitespace().map(str::to_string).collect();
    if argv.is_empty() {
        eprintln!("cobalt bench: --exec needs a command");
        return 2;
    }
    let req = StepRequest {
        exec: Some(argv),
        duration_s,
        ..StepRequest::default()
    };
    let wait = Duration::from_secs_f64(duration_s.max(0.0) + 90.0);
    let replies: Vec<(SocketAddr, Result<StepReply, String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = workers
            .iter()
            .map(|w| (*w, s.spawn(|| ask_worker(*w, &req, wait))))
            .collect();
        handles
            .into_iter()
            .map(|(w, h)| {
                (
                    w,
                    h.join()
                        .unwrap_or_else(|_| Err("worker thread panicked".into())),
                )
            })
            .collect()
    });
    let mut code = 0;
    for (w, reply) in replies {
        let output = match &reply {
            Ok(r) => r.output.as_deref().unwrap_or_default(),
            Err(_) => "",
        };
        if !crate::sink::write_stdout(format!("=== worker {w} ===\n{output}").as_bytes())
            .unwrap_or(false)
        {
            return code; // nobody reads the output any more
        }
        match reply {
            Ok(r) => {
                if let Some(e) = r.error {
                    eprintln!("cobalt bench: worker {w}: {e}");
                    code = 1;
                }
            }
            Err(e) => {
                eprintln!("cobalt bench: worker {w}: {e}");
                code = 1;
            }
        }
    }
    code
}

/// Runs one requested step on this machine.
pub fn run_request(
    req: &StepRequest,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> StepReply {
    let Ok(method) = Method::from_str(&req.method, true) else {
        return StepReply::failed(format!("unknown method {:?}", req.method));
    };
    let args = BenchArgs {
        command: None,
        uri: Some(req.uri.clone()),
        clients: req.clients.to_string(),
        duration: req.duration_s,
        warmup: req.warmup_s,
        cooldown: 0.0,
        timeout: req.timeout_s,
        rate: req.rate,
        no_keepalive: req.no_keepalive,
        new_session: req.new_session,
        non: req.non,
        cc: None,
        method,
        payload: req.payload.clone(),
        content_format: None,
        threads: req.threads,
        io: super::args::IoArg::Auto,
        dtls: Default::default(),
        server_pid: None,
        workers: None,
        exec: None,
        json: false,
        csv: false,
        plot: None,
        quiet: true,
    };
    let mut cfg = match config_from_args(&args) {
        Ok(c) => c,
        Err(e) => return StepReply::failed(e),
    };
    cfg.stop = stop;
    match measure_step(&cfg, req.clients) {
        Ok(m) => StepReply::from_recorder(&m.rec, m.duration_s, m.partial),
        Err(e) => StepReply::failed(e.message),
    }
}

/// Runs one step spread over `workers`: splits the clients (and rate), waits for every
/// reply, samples `--server-pid` locally, and merges the results.
pub fn run_step(
    cfg: &Config,
    template: &StepRequest,
    workers: &[SocketAddr],
    clients: usize,
) -> Result<StepResult, StepError> {
    let n = workers.len();
    let shares: Vec<usize> = (0..n)
        .map(|i| clients / n + usize::from(i < clients % n))
        .collect();
    let wait = Duration::from_secs_f64(
        template.warmup_s + template.duration_s + template.timeout_s + 30.0,
    );
    let started = std::time::Instant::now();
    let replies = std::thread::scope(|s| {
        let handles: Vec<_> = workers
            .iter()
            .zip(&shares)
            .filter(|(_, &share)| share > 0)
            .map(|(addr, &share)| {
                let mut req = template.clone();
                req.clients = share;
                req.rate = cfg.rate.map(|r| r * share as f64 / clients as f64);
                (*addr, s.spawn(move || ask_worker(*addr, &req, wait)))
            })
            .collect();
        let usage = sample_server(cfg);
        let replies: Vec<(SocketAddr, Result<StepReply, String>)> = handles
            .into_iter()
            .map(|(addr, h)| {
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err("worker thread panicked".into()));
                (addr, r)
            })
            .collect();
        (replies, usage)
    });
    let (replies, usage) = replies;
    let mut rec = Recorder::new();
    let mut duration: f64 = 0.0;
    let mut partial = false;
    for (addr, r) in replies {
        // A worker that cannot be reached, or whose step could not run against the
        // server, is a network failure for the exit code.
        let reply = r.map_err(|e| StepError::network(format!("worker {addr}: {e}")))?;
        if let Some(e) = reply.error {
            return Err(StepError::network(format!("worker {addr}: {e}")));
        }
        reply.add_to(&mut rec);
        duration = duration.max(reply.duration_s);
        partial |= reply.partial;
    }
    if sys::interrupted() {
        partial = true;
        duration = duration.min(started.elapsed().as_secs_f64() - template.warmup_s);
    }
    Ok(StepResult::from_recorder(
        clients,
        duration.max(0.0),
        &rec,
        usage,
        partial,
    ))
}

/// Sends one step to a worker and waits for its reply. On Ctrl-C it half-closes the
/// connection, which makes the worker stop early and reply with partial results.
fn ask_worker(addr: SocketAddr, req: &StepRequest, wait: Duration) -> Result<StepReply, String> {
    let conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("cannot connect: {e}"))?;
    conn.set_read_timeout(Some(Duration::from_millis(100)))
        .map_err(|e| e.to_string())?;
    let mut line = serde_json::to_string(req).map_err(|e| e.to_string())?;
    line.push('\n');
    (&conn)
        .write_all(line.as_bytes())
        .map_err(|e| format!("cannot send the step: {e}"))?;
    let deadline = std::time::Instant::now() + wait;
    let mut reader = BufReader::new(&conn);
    let mut answer = Vec::new();
    let mut hung_up = false;
    loop {
        if sys::interrupted() && !hung_up {
            let _ = conn.shutdown(std::net::Shutdown::Write);
            hung_up = true;
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("no reply within {:.0}s", wait.as_secs_f64()));
        }
        // Bytes read before a timeout stay in `answer`; the next call appends the rest.
        match (&mut reader)
            .take(MAX_LINE.saturating_sub(answer.len() as u64))
            .read_until(b'\n', &mut answer)
        {
            Ok(0) => break,
            Ok(_) if answer.ends_with(b"\n") => break,
            Ok(_) => {
                if answer.len() as u64 >= MAX_LINE {
                    return Err("reply too long".into());
                }
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut
                    || e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("no reply: {e}")),
        }
    }
    if answer.is_empty() {
        return Err("closed the connection without a reply".into());
    }
    serde_json::from_slice(&answer).map_err(|e| format!("bad reply: {e}"))
}

/// Samples `--server-pid` over the expected measured window of a distributed step.
fn sample_server(cfg: &Config) -> Option<ServerUsage> {
    let pid = cfg.server_pid?;
    let sleep = |d: Duration| {
        let end = std::time::Instant::now() + d;
        while !sys::interrupted() {
            let now = std::time::Instant::now();
            if now >= end {
                break;
            }
            std::thread::sleep((end - now).min(Duration::from_millis(50)));
        }
    };
    sleep(cfg.warmup);
    let start = procfs::cpu_seconds(pid);
    sleep(cfg.duration);
    let end = procfs::cpu_seconds(pid);
    Some(ServerUsage {
        cpu_s: match (start, end) {
            (Some(a), Some(b)) => (b - a).max(0.0),
            _ => 0.0,
        },
        rss_kb: procfs::rss_kb(pid),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_round_trip_keeps_histogram() {
        let mut rec = Recorder::new();
        rec.sent = 5;
        for v in [10_000u64, 20_000, 30_000, 1_000_000] {
            rec.complete(v);
        }
        rec.answer(AnswerCode::Coap(0xa3), 5);
        rec.answer(AnswerCode::Http(404), 5);
        let reply = StepReply::from_recorder(&rec, 1.0, false);
        let text = serde_json::to_string(&reply).unwrap();
        let back: StepReply = serde_json::from_str(&text).unwrap();
        assert_eq!(back, reply);
        let mut merged = Recorder::new();
        back.add_to(&mut merged);
        back.add_to(&mut merged);
        assert_eq!((merged.sent, merged.completed), (10, 8));
        assert_eq!(merged.other_codes[&AnswerCode::Coap(0xa3)], 2);
        assert_eq!(merged.other(), 4);
        assert_eq!(merged.latency.len(), 8);
        assert_eq!(
            merged.latency.value_at_quantile(0.5),
            rec.latency.value_at_quantile(0.5)
        );
    }

    #[test]
    fn workers_run_third_party_tools_only_when_allowed() {
        for allow in [true, false] {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let quit = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let q = quit.clone();
            let worker = std::thread::spawn(move || {
                serve_worker(&l, allow, || q.load(std::sync::atomic::Ordering::Relaxed)).unwrap()
            });
            let req = StepRequest {
                exec: Some(vec!["echo".into(), "tool says hi".into()]),
                duration_s: 1.0,
                ..StepRequest::default()
            };
            let reply = ask_worker(addr, &req, Duration::from_secs(20)).unwrap();
            quit.store(true, std::sync::atomic::Ordering::Relaxed);
            worker.join().unwrap();
            if allow {
                assert_eq!(reply.error, None);
                assert_eq!(reply.output.as_deref(), Some("tool says hi\n"));
            } else {
                assert!(reply.error.unwrap().contains("--allow-exec"));
                assert_eq!(reply.output, None);
            }
        }
    }

    #[test]
    fn worker_stops_when_the_coordinator_hangs_up() {
        let target = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let quit = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let q = quit.clone();
        let worker = std::thread::spawn(move || {
            serve_worker(&l, false, || q.load(std::sync::atomic::Ordering::Relaxed)).unwrap()
        });
        let req = StepRequest {
            uri: format!("coap://{}/", target.local_addr().unwrap()),
            clients: 2,
            duration_s: 30.0,
            warmup_s: 0.0,
            timeout_s: 1.0,
            threads: 1,
            rate: None,
            method: "get".into(),
            payload: None,
            non: false,
            no_keepalive: false,
            new_session: false,
            exec: None,
        };
        let started = std::time::Instant::now();
        let conn = TcpStream::connect(addr).unwrap();
        let mut line = serde_json::to_string(&req).unwrap();
        line.push('\n');
        (&conn).write_all(line.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        conn.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = String::new();
        BufReader::new(&conn).read_line(&mut answer).unwrap();
        let reply: StepReply = serde_json::from_str(&answer).unwrap();
        assert!(reply.error.is_none() && reply.partial, "{reply:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
        quit.store(true, std::sync::atomic::Ordering::Relaxed);
        worker.join().unwrap();
    }

    #[test]
    fn worker_list() {
        let w = parse_workers("127.0.0.1:7000, [::1]:7001").unwrap();
        assert_eq!(w.len(), 2);
        assert_eq!(w[1].port(), 7001);
        assert!(parse_workers("nohostport").is_err());
        assert!(parse_workers("").is_err());
    }

    #[test]
    fn bad_requests_get_error_replies() {
        let mut req = StepRequest {
            uri: "coap://127.0.0.1:9/".into(),
            clients: 1,
            duration_s: 1.0,
            warmup_s: 0.0,
            timeout_s: 1.0,
            threads: 1,
            rate: None,
            method: "brew".into(),
            payload: None,
            non: false,
            no_keepalive: false,
            new_session: false,
            exec: None,
        };
        let stop = std::sync::Arc::default;
        assert!(run_request(&req, stop())
            .error
            .unwrap()
            .contains("unknown method"));
        req.method = "get".into();
        req.uri = "ftp://x/".into();
        assert!(run_request(&req, stop()).error.unwrap().contains("ftp"));
    }
}

//! Every subcommand with hostile values in every numeric flag: none may panic (exit code
//! 101); values that are not numbers in range are usage errors (exit code 2).

use std::io::Read;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[path = "common/binary.rs"]
mod binary;

use binary::{cobalt, local_serve, serve_printing};

/// Values no numeric flag may accept: each must be refused with exit code 2.
const REFUSED: &[&str] = &[
    "inf",
    "-inf",
    "nan",
    "NaN",
    "-1",
    "1e300",
    "-1e300",
    "99999999999999999999999",
    "abc",
    "",
];

/// Values some flags accept and others refuse: anything but a panic is fine.
const EDGES: &[&str] = &[
    "0",
    "-0",
    "0.0001",
    "1.5",
    "65535",
    "65536",
    "4294967296",
    "18446744073709551615",
    "1e6",
];

/// How long one run may take; a valid value that makes a command run on (a responder)
/// is stopped at this point, which is not a failure.
const RUN_LIMIT: Duration = Duration::from_secs(20);

/// Runs `cobalt ARGS` with stdin closed; returns the exit code (None: still running at
/// [`RUN_LIMIT`], then killed) and stderr.
fn run(args: &[String], limit: Duration) -> (Option<i32>, String) {
    let mut child = cobalt()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code().or(Some(-1));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (code, reader.join().unwrap())
}

/// A command line to try: `before` + `flag VALUE` + `after`; `limit` bounds one run.
struct Case {
    before: Vec<String>,
    flag: String,
    after: Vec<String>,
    limit: Duration,
}

fn case(before: &[&str], flag: &str, after: &[&str]) -> Case {
    Case {
        before: before.iter().map(|s| s.to_string()).collect(),
        flag: flag.to_string(),
        after: after.iter().map(|s| s.to_string()).collect(),
        limit: RUN_LIMIT,
    }
}

/// Every subcommand's numeric flags, each in a command line that ends quickly when the
/// value is valid (a short benchmark, `--count 1`, `--print-config`).
fn cases(server: &str) -> Vec<Case> {
    let get = format!("coap://{server}/benchmark");
    let obs = format!("coap://{server}/obs");
    let mut cases = Vec::new();
    for cmd in [
        "get", "post", "put", "delete", "fetch", "patch", "ipatch", "discover",
    ] {
        let uri = if cmd == "discover" {
            format!("coap://{server}")
        } else {
            get.clone()
        };
        for flag in [
            "--timeout",
            "--block-size",
            "--content-format",
            "--accept",
            "--option",
        ] {
            cases.push(case(&[cmd, &uri], flag, &[]));
        }
    }
    for flag in ["--timeout", "--block-size", "--count"] {
        let after: &[&str] = if flag == "--count" {
            &[]
        } else {
            &["--count", "1"]
        };
        cases.push(case(&["observe", &obs], flag, after));
    }
    for flag in [
        "--port",
        "--shards",
        "--tcp",
        "--dtls-port",
        "--tls",
        "--wss-port",
        "--ws-port",
        "--metrics",
        "--bind",
    ] {
        cases.push(case(&["serve"], flag, &["--print-config"]));
    }
    for key in [
        "endpoint.ack_timeout",
        "endpoint.ack_random_factor",
        "endpoint.max_retransmit",
        "endpoint.nstart",
        "runtime.shards",
        "runtime.recv_batch",
        "server.port",
        "connections.max_message_size",
        "connections.keepalive",
    ] {
        // `--set key=VALUE`: the value is glued to the key.
        cases.push(case(
            &["serve", "--print-config", "--set"],
            &format!("{key}="),
            &[],
        ));
    }
    let bench_flags = [
        ("-c", "1"),
        ("-d", "0.2"),
        ("--warmup", "0"),
        ("--cooldown", "0"),
        ("--timeout", "0.2"),
        ("--threads", "1"),
    ];
    for flag in [
        "-c",
        "-d",
        "--warmup",
        "--cooldown",
        "--timeout",
        "--rate",
        "--threads",
        "--server-pid",
    ] {
        let mut before = vec!["bench".to_string(), get.clone(), "-q".to_string()];
        for (f, v) in bench_flags.iter().filter(|(f, _)| *f != flag) {
            before.push(f.to_string());
            before.push(v.to_string());
        }
        cases.push(Case {
            before,
            flag: flag.to_string(),
            after: Vec::new(),
            limit: RUN_LIMIT,
        });
    }
    // Servers that run until stopped: a valid value keeps them running.
    let short = Duration::from_secs(2);
    for (cmd, flag, bind) in [
        ("bench-responder", "--rcvbuf", "127.0.0.1:0"),
        ("bench-responder", "--bind", ""),
        ("bench-http-responder", "--bind", ""),
    ] {
        let mut c = if bind.is_empty() {
            case(&[cmd], flag, &[])
        } else {
            case(&[cmd, "--bind", bind], flag, &[])
        };
        c.limit = short;
        cases.push(c);
    }
    let mut worker = case(&["bench", "worker"], "--listen", &[]);
    worker.limit = short;
    cases.push(worker);
    cases
}

#[test]
fn no_flag_value_makes_any_subcommand_panic() {
    let (_server, found) = serve_printing(local_serve(), &["cobalt: serving CoAP on "]);
    let addr = &found[0];
    let runs: Vec<(Vec<String>, bool, Duration)> = cases(addr)
        .into_iter()
        .flat_map(|c| {
            let refused = REFUSED.iter().map(|v| (*v, true));
            let edges = EDGES.iter().map(|v| (*v, false));
            refused
                .chain(edges)
                .map(|(v, must_refuse)| {
                    let mut args = c.before.clone();
                    if c.flag.ends_with('=') {
                        args.push(format!("{}{v}", c.flag));
                    } else {
                        args.push(c.flag.clone());
                        args.push(v.to_string());
                    }
                    args.extend(c.after.iter().cloned());
                    (args, must_refuse, c.limit)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let total = runs.len();
    let failures = Mutex::new(Vec::new());
    let succeeded = std::sync::atomic::AtomicUsize::new(0);
    let next = Mutex::new(runs.into_iter());
    std::thread::scope(|s| {
        for _ in 0..6 {
            s.spawn(|| loop {
                let Some((args, must_refuse, limit)) = next.lock().unwrap().next() else {
                    return;
                };
                let (code, stderr) = run(&args, limit);
                if code == Some(0) {
                    succeeded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                let panicked = code == Some(101) || stderr.contains("panicked");
                let wrong = must_refuse && code != Some(2);
                if panicked || wrong {
                    failures
                        .lock()
                        .unwrap()
                        .push(format!("cobalt {args:?}: exit {code:?}\n{stderr}"));
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n---\n"));
    // The valid values ran the commands for real (requests answered, benchmarks run).
    let succeeded = succeeded.into_inner();
    assert!(
        succeeded > total / 20,
        "{succeeded} of {total} runs succeeded"
    );
}

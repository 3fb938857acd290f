//! `cobalt bench`: CoAPBench, the paper's load generator (issue 4).

use clap::Args;

/// Arguments of `cobalt bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Target URI, e.g. coap://127.0.0.1:5683/benchmark
    pub uri: String,
}

/// Runs the benchmark; returns the process exit code.
pub fn run(args: BenchArgs) -> i32 {
    eprintln!("cobalt bench {}: not built yet", args.uri);
    2
}

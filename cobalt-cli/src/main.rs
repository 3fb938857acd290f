//! The `cobalt` command: argument parsing only; each command lives in its own module.

mod bench;

use clap::{Parser, Subcommand};

/// Cobalt: a CoAP client like curl, a demo server, and CoAPBench.
#[derive(Debug, Parser)]
#[command(name = "cobalt", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// CoAPBench: drive a CoAP (or HTTP) server with many virtual clients.
    Bench(bench::BenchArgs),
    /// Raw floor responder for `cobalt bench`: answers every request with 2.05 "hello world".
    #[command(name = "bench-responder", hide = true)]
    BenchResponder(bench::responder::ResponderArgs),
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Bench(args) => bench::run(args),
        Command::BenchResponder(args) => bench::responder::main(args),
    };
    std::process::exit(code);
}

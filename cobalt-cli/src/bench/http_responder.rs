//! `cobalt bench-http-responder`: the command around [`cobalt_bench::http_responder`].

use clap::Args;
use cobalt_bench::http_responder::{accept_loop, listen};

/// Arguments of `cobalt bench-http-responder`.
#[derive(Debug, Args)]
pub struct HttpResponderArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub bind: String,
}

/// Runs the responder until Ctrl-C; returns the exit code.
pub fn main(args: HttpResponderArgs) -> i32 {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cobalt bench-http-responder: cannot start the runtime: {e}");
            return 1;
        }
    };
    rt.block_on(async move {
        let listener = match listen(&args.bind) {
            Ok(l) => l,
            Err(e) => {
                eprintln!(
                    "cobalt bench-http-responder: cannot bind {}: {e}",
                    args.bind
                );
                return 2;
            }
        };
        let addr = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or(args.bind);
        eprintln!(
            "cobalt bench-http-responder: listening on http://{addr}/ (pid {}), Ctrl-C to stop",
            std::process::id()
        );
        tokio::select! {
            () = accept_loop(listener) => 0,
            _ = tokio::signal::ctrl_c() => 0,
        }
    })
}

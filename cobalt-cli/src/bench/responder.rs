//! `cobalt bench-responder`: the command around [`cobalt_bench::responder`].

use clap::Args;
use cobalt_bench::responder::{serve, StopFlag};
use cobalt_bench::sys::{install_sigint_handler, interrupted};
use std::net::UdpSocket;
use std::os::fd::AsRawFd;

/// Arguments of `cobalt bench-responder`.
#[derive(Debug, Args)]
pub struct ResponderArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:5683")]
    pub bind: String,

    /// Socket receive buffer in bytes (the kernel caps it at net.core.rmem_max); a
    /// large one absorbs the first burst of thousands of clients. 0 keeps the default.
    #[arg(long, default_value_t = 4 << 20)]
    pub rcvbuf: usize,
}

/// Runs the responder until Ctrl-C; returns the exit code.
pub fn main(args: ResponderArgs) -> i32 {
    let sock = match UdpSocket::bind(&args.bind) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cobalt bench-responder: cannot bind {}: {e}", args.bind);
            return 2;
        }
    };
    if args.rcvbuf > 0 {
        let size = args.rcvbuf.min(i32::MAX as usize) as libc::c_int;
        // SAFETY: valid socket and option value.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            eprintln!(
                "cobalt bench-responder: cannot set SO_RCVBUF: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    install_sigint_handler();
    let addr = sock
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or(args.bind);
    eprintln!(
        "cobalt bench-responder: listening on {addr} (pid {}), Ctrl-C to stop",
        std::process::id()
    );
    struct Interrupt;
    impl StopFlag for Interrupt {
        fn stop(&self) -> bool {
            interrupted()
        }
    }
    match serve(&sock, &Interrupt) {
        Ok(n) => {
            eprintln!("cobalt bench-responder: answered {n} requests");
            0
        }
        Err(e) => {
            eprintln!("cobalt bench-responder: {e}");
            1
        }
    }
}

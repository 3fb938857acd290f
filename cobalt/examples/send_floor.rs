//! The kernel's floor under an observe fan-out: what sending one datagram to each of
//! many observers costs with no CoAP at all.
//!
//! Binds `--ips` receiving sockets (127.0.0.2, 127.0.0.3, ..., as `fanout_flood`
//! spreads its observers), drains them on another thread, and sends `--datagrams`
//! datagrams of `--bytes` bytes round-robin to them from one socket in `sendmmsg`
//! batches ([`cobalt::transport::mmsg::send_batch`], as the server's shard does). It
//! prints the sending thread's CPU time per datagram: on loopback that includes the
//! receiver's delivery, which the kernel runs in the sender's context, as it does for
//! the server's notifications. `bench/observe-scale.sh` runs it beside the server so
//! that CPU per notification can be read against the floor of the same machine.
//!
//! ```text
//! cargo run --release -p cobalt --example send_floor -- --datagrams 1000000 --ips 200 --bytes 20
//! ```

use cobalt::transport::mmsg;
use socket2::{Domain, Socket, Type};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

struct Args {
    datagrams: usize,
    ips: usize,
    bytes: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        datagrams: 1_000_000,
        ips: 200,
        bytes: 20,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value"))?
            .parse::<usize>()
            .map_err(|e| format!("{flag}: {e}"))?;
        match flag.as_str() {
            "--datagrams" => args.datagrams = value,
            "--ips" => args.ips = value.clamp(1, 250),
            "--bytes" => args.bytes = value.clamp(1, 1152),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(args)
}

/// CPU time (user + system) of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn receiver(ip: IpAddr) -> std::io::Result<UdpSocket> {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, None)?;
    s.set_recv_buffer_size(4 << 20)?;
    s.set_nonblocking(true)?;
    s.bind(&SocketAddr::new(ip, 0).into())?;
    Ok(s.into())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()
        .map_err(|e| format!("{e}\nusage: send_floor [--datagrams N] [--ips N] [--bytes N]"))?;
    let receivers = (0..args.ips)
        .map(|i| receiver(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + i as u8))))
        .collect::<std::io::Result<Vec<_>>>()?;
    let targets = receivers
        .iter()
        .map(UdpSocket::local_addr)
        .collect::<std::io::Result<Vec<_>>>()?;
    let stop = Arc::new(AtomicBool::new(false));
    let drain = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            let mut got = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut idle = true;
                for r in &receivers {
                    while r.recv(&mut buf).is_ok() {
                        got += 1;
                        idle = false;
                    }
                }
                if idle {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            got
        })
    };
    let sender = UdpSocket::bind("127.0.0.1:0")?;
    let fd = sender.as_raw_fd();
    let payload = vec![0x55u8; args.bytes];
    let before = thread_cpu();
    let (mut sent, mut next) = (0usize, 0usize);
    while sent < args.datagrams {
        let batch = (args.datagrams - sent).min(mmsg::BATCH);
        let msgs = (0..batch).map(|i| (targets[(next + i) % targets.len()], &payload[..]));
        match mmsg::send_batch(fd, msgs) {
            Ok(n) => {
                sent += n;
                next += n;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) => return Err(format!("send failed: {e}").into()),
        }
    }
    let cpu = thread_cpu().saturating_sub(before);
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let received = drain.join().map_err(|_| "the receiving thread panicked")?;
    println!(
        "send floor: {sent} datagrams of {} bytes to {} addresses, {:.2} µs of the sending thread's CPU per datagram ({received} received)",
        args.bytes,
        targets.len(),
        cpu.as_secs_f64() * 1e6 / sent as f64
    );
    Ok(())
}

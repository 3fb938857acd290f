//! The paper's TCP is in force inside the study's namespaces (needs root, TUN,
//! iproute2 and BPF; skipped elsewhere unless COBALT_REQUIRE_NETNS=1): a connection
//! to an address behind the link that nobody answers (the server namespace does not
//! forward, so the SYN vanishes) uses CUBIC, starts with a 2 s RTO, retransmits its
//! SYN once after it, and then backs off to 4 s.

use cobalt_linkem::emulator::{Config, Emulator};
use cobalt_proto::sim::link::{LinkConfig, LossModel};
use cobalt_study::paper_tcp;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// What `TCP_INFO` says about a socket: (retransmissions so far, RTO in µs).
fn tcp_info(fd: &OwnedFd) -> (u32, u32) {
    // SAFETY: a zeroed tcp_info is valid; getsockopt writes at most `len` bytes.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
    (info.tcpi_total_retrans, info.tcpi_rto)
}

fn congestion_control(fd: &OwnedFd) -> String {
    let mut name = [0u8; 16];
    let mut len = name.len() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `name`.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_mut_ptr().cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0, "TCP_CONGESTION: {}", std::io::Error::last_os_error());
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    String::from_utf8_lossy(&name[..end]).into_owned()
}

/// A non-blocking connect from the client namespace to `to`.
fn connect(to: std::net::SocketAddrV4) -> OwnedFd {
    // SAFETY: a new socket; we own the descriptor.
    let fd = unsafe {
        OwnedFd::from_raw_fd(libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK,
            0,
        ))
    };
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: to.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*to.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: a valid sockaddr_in of the size passed.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EINPROGRESS)
    );
    fd
}

fn sysctl(ns: &str, key: &str) -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "sysctl", "-n", key])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_lost_syn_is_retransmitted_after_two_seconds_with_cubic() {
    if !cobalt_linkem::ready_for_tests() {
        return;
    }
    let mut config = Config::new(LinkConfig::paper(2500, LossModel::None), 1);
    paper_tcp::configure(&mut config);
    let emu = Emulator::start(config).unwrap();
    let _rto = paper_tcp::initial_rto(emu.client_ns()).unwrap();
    let ns = emu.client_ns().name().to_string();
    assert_eq!(sysctl(&ns, "net.ipv4.tcp_syn_retries"), "40");
    assert_eq!(sysctl(&ns, "net.ipv4.tcp_rto_max_ms"), "120000");
    assert_eq!(sysctl(&ns, "net.ipv4.tcp_syn_linear_timeouts"), "0");
    // An address on the server's network that nobody holds.
    let nobody = std::net::SocketAddrV4::new(std::net::Ipv4Addr::new(10, 78, 2, 9), 5683);
    let (cc, first, retransmitted, backed_off) = emu
        .client_ns()
        .run(move || {
            let fd = connect(nobody);
            let sent = Instant::now();
            let first = tcp_info(&fd);
            // The first retransmission, polled every 10 ms for at most 4 s.
            let mut retransmitted = None;
            while sent.elapsed() < Duration::from_secs(4) {
                if tcp_info(&fd).0 >= 1 {
                    retransmitted = Some(sent.elapsed());
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            (congestion_control(&fd), first, retransmitted, tcp_info(&fd))
        })
        .unwrap();
    drop(emu);
    assert_eq!(cc, "cubic");
    assert_eq!(
        first,
        (0, 2_000_000),
        "(retransmissions, RTO µs) after the SYN"
    );
    let at = retransmitted.expect("the SYN was not retransmitted within 4 s");
    eprintln!("first SYN retransmission after {at:?}");
    // 2 s, and the poll's 10 ms plus a busy host's scheduling.
    assert!(
        at >= Duration::from_millis(1990) && at < Duration::from_millis(2500),
        "{at:?}"
    );
    // Backed off (no linear SYN timeouts): the next wait is 4 s.
    assert_eq!(backed_off, (1, 4_000_000));
}

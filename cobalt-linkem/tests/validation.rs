//! Validation of the emulator on the congestion-control paper's link (needs root, TUN and iproute2;
//! skipped elsewhere unless COBALT_REQUIRE_NETNS=1 or COBALT_REQUIRE_PEERS=1 is set,
//! as in CI, which then fails instead).
//!
//! One-way delays are measured with the kernel's receive timestamps (SO_TIMESTAMPNS)
//! against the sender's clock, so the measuring threads' scheduling does not count;
//! the bounds allow a few milliseconds for the emulator's own wake-ups on a busy host.

use cobalt_linkem::emulator::{Config, Emulator, Report};
use cobalt_proto::sim::link::{GilbertElliott, LinkConfig, LossModel};
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn can_emulate() -> bool {
    cobalt_linkem::ready_for_tests()
}

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// A UDP socket bound inside a namespace, with kernel receive timestamps.
fn socket(emu: &Emulator, server: bool, port: u16) -> UdpSocket {
    let (ns, ip) = if server {
        (emu.server_ns(), emu.server_addr())
    } else {
        (emu.client_ns(), emu.client_addr())
    };
    let s = ns
        .run(move || UdpSocket::bind((ip, port)))
        .unwrap()
        .unwrap();
    let on: libc::c_int = 1;
    // SAFETY: setting an int option on an open socket.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            4,
        )
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Receives one datagram: its bytes and the kernel's receive time (ns since the epoch).
fn recv_stamped(s: &UdpSocket, buf: &mut [u8]) -> Option<(usize, u64)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u8; 64];
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len();
    // SAFETY: valid socket and msghdr.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return None;
    }
    // SAFETY: walking the control messages the kernel wrote into `control`.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: `cmsg` points into `control`.
        let c = unsafe { &*cmsg };
        if c.cmsg_level == libc::SOL_SOCKET && c.cmsg_type == libc::SCM_TIMESTAMPNS {
            // SAFETY: SCM_TIMESTAMPNS carries a timespec.
            let ts: libc::timespec =
                unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast()) };
            return Some((
                n as usize,
                ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64,
            ));
        }
        // SAFETY: advancing within the kernel-written control buffer.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    Some((n as usize, wall_ns()))
}

fn paper(buffer: usize, loss: LossModel, seed: u64) -> Emulator {
    Emulator::start(Config::new(LinkConfig::paper(buffer, loss), seed)).unwrap()
}

fn check_clean(report: &Report) {
    assert_eq!(
        report.device_drops, 0,
        "the devices dropped packets: {report:?}"
    );
    assert_eq!(report.up.drops_mtu + report.down.drops_mtu, 0);
}

#[test]
fn ping_rtt_is_664_ms() {
    if !can_emulate() {
        return;
    }
    let emu = paper(2500, LossModel::None, 1);
    let c = socket(&emu, false, 40000);
    let s = socket(&emu, true, 7);
    let server_addr = s.local_addr().unwrap();
    let client_addr = c.local_addr().unwrap();
    // Like ping: 56 bytes of payload, 84-byte IP packets, one at a time.
    let mut rtts = Vec::new();
    let mut buf = [0u8; 2048];
    for _ in 0..10 {
        let mut probe = [0u8; 56];
        probe[..8].copy_from_slice(&wall_ns().to_be_bytes());
        c.send_to(&probe, server_addr).unwrap();
        let (n, rx) = recv_stamped(&s, &mut buf).expect("probe arrives");
        assert_eq!(n, 56);
        let up = rx - u64::from_be_bytes(buf[..8].try_into().unwrap());
        let mut echo = [0u8; 56];
        echo[..8].copy_from_slice(&wall_ns().to_be_bytes());
        s.send_to(&echo, client_addr).unwrap();
        let (_, rx) = recv_stamped(&c, &mut buf).expect("echo arrives");
        let down = rx - u64::from_be_bytes(buf[..8].try_into().unwrap());
        // Up: 84 B at 60 kbit/s (11.2 ms) + 200 ms + U(10, 20); down: U(10, 20) + 22.4 ms + 400 ms.
        let (up, down) = (up as f64 / 1e6, down as f64 / 1e6);
        assert!((221.2..=231.2 + 3.0).contains(&up), "uplink {up} ms");
        assert!((432.4..=442.4 + 3.0).contains(&down), "downlink {down} ms");
        rtts.push(up + down);
    }
    let mean = rtts.iter().sum::<f64>() / rtts.len() as f64;
    eprintln!("ping RTT mean {mean:.1} ms: {rtts:.1?}");
    // Expected 633.6 + 2 × 15 = 663.6 ms on average.
    assert!((mean - 663.6).abs() < 8.0, "mean RTT {mean} ms: {rtts:?}");
    let report = emu.stop().unwrap();
    check_clean(&report);
    assert_eq!(report.up.packets_out, 10);
    assert_eq!(report.down.packets_out, 10);
}

/// Sends `count` datagrams of `ip_len` bytes (IP) every `gap` from `from` to `to`.
fn flood(from: UdpSocket, to: std::net::SocketAddr, ip_len: usize, gap: Duration, count: usize) {
    let payload = vec![0u8; ip_len - 28];
    let start = Instant::now();
    for i in 0..count {
        let due = start + gap * i as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        from.send_to(&payload, to).unwrap();
    }
}

/// Receives until `idle` passes without a datagram: (count, first and last kernel time, bytes after the first).
fn sink(s: &UdpSocket, idle: Duration) -> (usize, u64, u64, u64) {
    s.set_read_timeout(Some(idle)).unwrap();
    let mut buf = [0u8; 2048];
    let (mut n, mut first, mut last, mut bytes) = (0usize, 0u64, 0u64, 0u64);
    while let Some((len, t)) = recv_stamped(s, &mut buf) {
        if n == 0 {
            first = t;
        } else {
            bytes += (len + 28) as u64;
        }
        last = t;
        n += 1;
    }
    (n, first, last, bytes)
}

#[test]
fn a_saturated_link_runs_at_its_rate_and_its_queue_stays_within_the_limit() {
    if !can_emulate() {
        return;
    }
    let emu = paper(2500, LossModel::None, 2);
    let (c_tx, s_rx) = (socket(&emu, false, 40001), socket(&emu, true, 9001));
    let (s_tx, c_rx) = (socket(&emu, true, 9002), socket(&emu, false, 40002));
    let (up_to, down_to) = (s_rx.local_addr().unwrap(), c_rx.local_addr().unwrap());
    // 228-byte packets: 50/s up (91 kbit/s offered to 60) and 30/s down (55 to 30), 20 s.
    let up = std::thread::spawn(move || flood(c_tx, up_to, 228, Duration::from_millis(20), 1000));
    let down =
        std::thread::spawn(move || flood(s_tx, down_to, 228, Duration::from_micros(33_333), 600));
    let up_rx = std::thread::spawn(move || sink(&s_rx, Duration::from_secs(3)));
    let down_rx = sink(&c_rx, Duration::from_secs(3));
    up.join().unwrap();
    down.join().unwrap();
    let up_rx = up_rx.join().unwrap();
    for ((n, first, last, bytes), rate, dir) in
        [(up_rx, 60_000.0, "up"), (down_rx, 30_000.0, "down")]
    {
        let measured = bytes as f64 * 8.0 / ((last - first) as f64 / 1e9);
        eprintln!("{dir}: {measured:.1} bit/s over {n} packets (rate {rate})");
        assert!(n > 100, "{dir}: {n} packets");
        assert!(
            (measured / rate - 1.0).abs() < 0.01,
            "{dir}: {measured} bit/s against {rate}"
        );
    }
    let report = emu.stop().unwrap();
    check_clean(&report);
    eprintln!(
        "lateness {:?}, peak queues {} / {} B",
        report.lateness, report.up.peak_queue_bytes, report.down.peak_queue_bytes
    );
    for (d, name) in [(report.up, "up"), (report.down, "down")] {
        assert!(d.drops_queue > 0, "{name} was not saturated: {d:?}");
        assert!(d.peak_queue_bytes <= 2500, "{name}: {d:?}");
        assert!(d.peak_queue_bytes > 2500 - 228, "{name}: {d:?}");
    }
}

#[test]
fn the_error_profiles_lose_what_their_loss_timeline_says() {
    if !can_emulate() {
        return;
    }
    let run = |model: GilbertElliott, seed: u64| {
        let emu = paper(1_410_000, LossModel::GilbertElliott(model), seed);
        let (c_tx, s_rx) = (socket(&emu, false, 40003), socket(&emu, true, 9003));
        let (s_tx, c_rx) = (socket(&emu, true, 9004), socket(&emu, false, 40004));
        let (up_to, down_to) = (s_rx.local_addr().unwrap(), c_rx.local_addr().unwrap());
        // 40 pps of 48-byte packets each way for 30 s (15 kbit/s, below both rates).
        let up =
            std::thread::spawn(move || flood(c_tx, up_to, 48, Duration::from_millis(25), 1200));
        let down =
            std::thread::spawn(move || flood(s_tx, down_to, 48, Duration::from_millis(25), 1200));
        let up_rx = std::thread::spawn(move || sink(&s_rx, Duration::from_secs(3)).0);
        let down_rx = sink(&c_rx, Duration::from_secs(3)).0;
        up.join().unwrap();
        down.join().unwrap();
        let up_rx = up_rx.join().unwrap();
        let report = emu.stop().unwrap();
        check_clean(&report);
        (report, up_rx, down_rx)
    };
    let medium = std::thread::spawn(move || run(GilbertElliott::medium(), 11));
    let (high, up_rx, down_rx) = run(GilbertElliott::high(), 12);
    let (medium, m_up, m_down) = medium.join().unwrap();
    for ((r, up_rx, down_rx), model, nominal) in [
        ((medium, m_up, m_down), GilbertElliott::medium(), 0.10),
        ((high, up_rx, down_rx), GilbertElliott::high(), 0.18),
    ] {
        for (d, received) in [(r.up, up_rx), (r.down, down_rx)] {
            assert_eq!(d.packets_in, 1200);
            assert_eq!(d.drops_loss + received as u64, 1200, "{d:?}");
            let loss = d.drops_loss as f64 / 1200.0;
            eprintln!(
                "nominal {nominal}: loss {loss:.4}, bad fraction {:.3}",
                d.bad_fraction
            );
            // What this run's good and bad periods imply, within binomial noise.
            let implied = d.bad_fraction * model.p_bad + (1.0 - d.bad_fraction) * model.p_good;
            assert!(
                (loss - implied).abs() < 0.03,
                "{loss} against {implied}: {d:?}"
            );
            // And near the profile's nominal rate (30 s is only ~60 good/bad cycles;
            // the long-run rates are checked on the same model in cobalt-proto).
            assert!((loss - nominal).abs() < 0.08, "{loss} against {nominal}");
        }
    }
}

fn namespaces() -> String {
    String::from_utf8(
        Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
}

#[test]
fn the_emulator_removes_its_namespaces_when_stopped_or_dropped() {
    if !can_emulate() {
        return;
    }
    let emu = paper(2500, LossModel::None, 3);
    let names = [
        emu.client_ns().name().to_string(),
        emu.server_ns().name().to_string(),
    ];
    assert!(names.iter().all(|n| namespaces().contains(n.as_str())));
    emu.stop().unwrap();
    assert!(names.iter().all(|n| !namespaces().contains(n.as_str())));
    let emu = paper(2500, LossModel::None, 4);
    let name = emu.client_ns().name().to_string();
    drop(emu);
    assert!(!namespaces().contains(name.as_str()));
}

fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_binary_exits_cleanly_on_sigterm_and_cleans_up_after_sigkill() {
    if !can_emulate() {
        return;
    }
    let bin = env!("CARGO_BIN_EXE_cobalt-linkem");
    let dir = std::env::temp_dir().join(format!("linkem-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let stats = dir.join("stats.json");
    let tag = format!("lemt{}", std::process::id() % 100_000);
    let (cn, sn) = (format!("{tag}c"), format!("{tag}s"));
    let mut child = Command::new(bin)
        .args([
            "--client-ns",
            &cn,
            "--server-ns",
            &sn,
            "--loss",
            "high",
            "--stats",
        ])
        .arg(&stats)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the namespaces", Duration::from_secs(20), || {
        let l = namespaces();
        l.contains(&cn) && l.contains(&sn)
    });
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let mut status = None;
    wait_until("the exit", Duration::from_secs(20), || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    assert!(status.unwrap().success());
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert!(json["down"]["peak_queue_bytes"].is_u64(), "{json}");
    assert!(!namespaces().contains(&cn) && !namespaces().contains(&sn));

    // Killed outright, it leaves its namespaces; the next start (or --cleanup) removes them.
    let mut child = Command::new(bin).stdout(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let prefix = format!("lem{pid}x");
    wait_until("the namespaces", Duration::from_secs(20), || {
        namespaces().contains(&prefix)
    });
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(namespaces().contains(&prefix));
    let cleaned = Command::new(bin).arg("--cleanup").output().unwrap();
    assert!(cleaned.status.success());
    assert!(!namespaces().contains(&prefix), "{}", namespaces());
    let _ = std::fs::remove_dir_all(dir);
}

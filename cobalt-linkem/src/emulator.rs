//! The emulator: two namespaces, a TUN device in each, and one thread moving IP packets
//! between them through [`cobalt_proto::sim::link`] — the same link model the
//! simulator runs in virtual time — on the real clock.
//!
//! The thread sleeps in `ppoll(2)` on both devices, a `timerfd` armed with the absolute
//! nanosecond deadline of the link's next event, and a stop descriptor. Every
//! transmission and delivery is scheduled on the link's ideal timeline, so a late
//! wake-up delays one delivery a little but never changes the rate.

use crate::netns::{ip, unique_name, Namespace};
use crate::tun::{self, Tun, TunAddr};
use cobalt_proto::sim::link::{Direction, DirectionStats, Fate, LinkConfig, Nanos, Outcome};
use serde::Serialize;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

/// One end of the emulated link.
#[derive(Debug, Clone)]
pub struct End {
    /// The namespace's name (created by the emulator, deleted when it stops).
    pub namespace: String,
    /// The TUN device's name in it.
    pub device: String,
    /// Its address.
    pub addr: Ipv4Addr,
}

/// What to emulate and where.
#[derive(Debug, Clone)]
pub struct Config {
    /// The link; `up` carries packets from the client end to the server end.
    pub link: LinkConfig,
    /// Seed of every random draw of the link.
    pub seed: u64,
    /// The devices' side (IoT clients).
    pub client: End,
    /// The fixed host's side.
    pub server: End,
    /// MTU of both devices.
    pub mtu: usize,
    /// Packets a device may queue before the emulator reads them.
    pub txqueuelen: usize,
    /// Sysctls set in both namespaces, e.g. `net.ipv4.tcp_timestamps=0`.
    pub sysctls: Vec<String>,
    /// Attributes of the route through the link in both namespaces, as `ip route`
    /// takes them, e.g. `["congctl", "lock", "cubic", "rto_min", "200ms"]`.
    pub route_attributes: Vec<String>,
    /// Write one CSV line per packet here.
    pub packet_log: Option<PathBuf>,
    /// Run the link's thread with real-time priority (SCHED_FIFO 10) if allowed.
    pub realtime: bool,
}

impl Config {
    /// `link` between two new namespaces with unique names (client 10.78.1.2, server
    /// 10.78.2.1), MTU taken from the link's downlink.
    pub fn new(link: LinkConfig, seed: u64) -> Config {
        let mtu = link.down.mtu.min(65535);
        let c = unique_name('c');
        let s = unique_name('s');
        Config {
            link,
            seed,
            client: End {
                device: c.clone(),
                namespace: c,
                addr: Ipv4Addr::new(10, 78, 1, 2),
            },
            server: End {
                device: s.clone(),
                namespace: s,
                addr: Ipv4Addr::new(10, 78, 2, 1),
            },
            mtu,
            txqueuelen: 10_000,
            sysctls: Vec::new(),
            route_attributes: Vec::new(),
            packet_log: None,
            realtime: true,
        }
    }
}

/// Counters of one direction, as written to the stats JSON.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct DirectionReport {
    /// Packets offered to the link.
    pub packets_in: u64,
    /// Their bytes (IP packets).
    pub bytes_in: u64,
    /// Packets delivered.
    pub packets_out: u64,
    /// Their bytes.
    pub bytes_out: u64,
    /// Dropped for exceeding the MTU.
    pub drops_mtu: u64,
    /// Dropped by the full queue.
    pub drops_queue: u64,
    /// Dropped by the loss process.
    pub drops_loss: u64,
    /// Most bytes ever waiting in the queue.
    pub peak_queue_bytes: u64,
    /// Fraction of the run the Gilbert–Elliott process was in its bad state.
    pub bad_fraction: f64,
}

impl From<DirectionStats> for DirectionReport {
    fn from(s: DirectionStats) -> Self {
        DirectionReport {
            packets_in: s.packets_in,
            bytes_in: s.bytes_in,
            packets_out: s.packets_out,
            bytes_out: s.bytes_out,
            drops_mtu: s.drops_mtu,
            drops_queue: s.drops_queue,
            drops_loss: s.drops_loss,
            peak_queue_bytes: s.peak_queue_bytes,
            bad_fraction: if s.ge_ns > 0 {
                s.bad_ns as f64 / s.ge_ns as f64
            } else {
                0.0
            },
        }
    }
}

/// How late packets left the emulator compared with the link's timeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Lateness {
    /// Packets delivered.
    pub packets: u64,
    /// Median lateness, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// Largest, microseconds.
    pub max_us: f64,
}

/// What an emulator run did: the stats JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Seconds the link ran.
    pub seconds: f64,
    /// The seed.
    pub seed: u64,
    /// Client to server.
    pub up: DirectionReport,
    /// Server to client.
    pub down: DirectionReport,
    /// Delivery lateness.
    pub lateness: Lateness,
    /// Packets the devices dropped before the emulator read them (should be 0).
    pub device_drops: u64,
    /// Whether the link thread got real-time priority.
    pub realtime: bool,
}

/// A running emulator. [`Emulator::stop`] ends it and removes its namespaces (so
/// does dropping it).
#[derive(Debug)]
pub struct Emulator {
    client: Namespace,
    server: Namespace,
    config: Config,
    stop: Option<OwnedFd>,
    thread: Option<JoinHandle<io::Result<Report>>>,
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: no pointers; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Emulator {
    /// Creates the namespaces and devices and starts the link's thread.
    pub fn start(config: Config) -> io::Result<Emulator> {
        let client = Namespace::create(&config.client.namespace)?;
        let server = Namespace::create(&config.server.namespace)?;
        for s in &config.sysctls {
            client.sysctl(s)?;
            server.sysctl(s)?;
        }
        let net =
            |a: Ipv4Addr| format!("{}.{}.{}.0/24", a.octets()[0], a.octets()[1], a.octets()[2]);
        let c_addr = TunAddr {
            local: format!("{}/24", config.client.addr),
            remote: net(config.server.addr),
        };
        let s_addr = TunAddr {
            local: format!("{}/24", config.server.addr),
            remote: net(config.client.addr),
        };
        let tc = Tun::create(
            &client,
            &config.client.device,
            &c_addr,
            config.mtu,
            config.txqueuelen,
        )?;
        let ts = Tun::create(
            &server,
            &config.server.device,
            &s_addr,
            config.mtu,
            config.txqueuelen,
        )?;
        if !config.route_attributes.is_empty() {
            for (ns, dev, remote) in [
                (&client, &config.client.device, &c_addr.remote),
                (&server, &config.server.device, &s_addr.remote),
            ] {
                let mut args = vec!["-n", ns.name(), "route", "change", remote, "dev", dev];
                args.extend(config.route_attributes.iter().map(String::as_str));
                ip(&args)?;
            }
        }
        let log = match &config.packet_log {
            Some(p) => Some(BufWriter::new(File::create(p).map_err(|e| {
                io::Error::new(e.kind(), format!("cannot write {}: {e}", p.display()))
            })?)),
            None => None,
        };
        let stop = eventfd()?;
        // SAFETY: dup of a descriptor we own; the copy is owned by the thread.
        let stop_copy = unsafe { libc::dup(stop.as_raw_fd()) };
        if stop_copy < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let stop_copy = unsafe { OwnedFd::from_raw_fd(stop_copy) };
        let (link, seed, realtime) = (config.link.clone(), config.seed, config.realtime);
        let thread = std::thread::Builder::new()
            .name("linkem".into())
            .spawn(move || {
                let realtime = realtime && set_realtime(10);
                Pump::new(tc, ts, link, seed, stop_copy, log)?.run(realtime)
            })?;
        Ok(Emulator {
            client,
            server,
            config,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The client side's namespace.
    pub fn client_ns(&self) -> &Namespace {
        &self.client
    }

    /// The server side's namespace.
    pub fn server_ns(&self) -> &Namespace {
        &self.server
    }

    /// The client side's address.
    pub fn client_addr(&self) -> IpAddr {
        IpAddr::V4(self.config.client.addr)
    }

    /// The server side's address.
    pub fn server_addr(&self) -> IpAddr {
        IpAddr::V4(self.config.server.addr)
    }

    /// True while the link's thread runs (it ends only when stopped or on an I/O error).
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops the link, removes the namespaces and returns the run's report.
    pub fn stop(mut self) -> io::Result<Report> {
        self.finish()
    }

    fn finish(&mut self) -> io::Result<Report> {
        let drops = [
            tun::tx_dropped(&self.client, &self.config.client.device),
            tun::tx_dropped(&self.server, &self.config.server.device),
        ];
        if let Some(stop) = self.stop.take() {
            let one: u64 = 1;
            // SAFETY: writing 8 bytes to an eventfd.
            unsafe { libc::write(stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
        let Some(thread) = self.thread.take() else {
            return Err(io::Error::other("the emulator was already stopped"));
        };
        let mut report = thread
            .join()
            .map_err(|_| io::Error::other("the link thread panicked"))??;
        report.device_drops = drops.iter().flatten().sum();
        report.seed = self.config.seed;
        Ok(report)
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.finish();
        }
    }
}

/// Gives the calling thread SCHED_FIFO priority `priority` (1-99), inherited by the
/// threads it starts; false where not permitted. The link's thread runs at 10, so
/// that a busy host delays neither transmissions nor deliveries; endpoints driven
/// over the link can run just below it, so that the host's other work does not
/// stretch their round trips.
pub fn set_realtime(priority: i32) -> bool {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: pthread_self is always valid; `param` outlives the call.
    unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) == 0 }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A packet on the link: its bytes and when it reached the emulator.
struct Packet {
    data: Vec<u8>,
    arrived: Nanos,
}

/// The link's thread.
struct Pump {
    c: Tun,
    s: Tun,
    up: Direction<Packet>,
    down: Direction<Packet>,
    timer: OwnedFd,
    stop: OwnedFd,
    t0: u64,
    log: Option<BufWriter<File>>,
    late_us: Vec<u32>,
    armed: Option<Nanos>,
}

impl Pump {
    fn new(
        c: Tun,
        s: Tun,
        link: LinkConfig,
        seed: u64,
        stop: OwnedFd,
        mut log: Option<BufWriter<File>>,
    ) -> io::Result<Pump> {
        // SAFETY: no pointers; checked.
        let timer = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if timer < 0 {
            return Err(io::Error::last_os_error());
        }
        if let Some(w) = &mut log {
            writeln!(w, "{}", crate::log::HEADER)?;
        }
        Ok(Pump {
            c,
            s,
            up: Direction::new(link.up, seed.wrapping_mul(2).wrapping_add(1)),
            down: Direction::new(link.down, seed.wrapping_mul(2).wrapping_add(2)),
            // SAFETY: a fresh descriptor we own.
            timer: unsafe { OwnedFd::from_raw_fd(timer) },
            stop,
            t0: monotonic_ns(),
            log,
            late_us: Vec::new(),
            armed: None,
        })
    }

    fn now(&self) -> Nanos {
        monotonic_ns().saturating_sub(self.t0)
    }

    /// Arms the timer for the link's next event (absolute time), or disarms it.
    fn arm(&mut self) -> io::Result<()> {
        let next = [self.up.next_event(), self.down.next_event()]
            .into_iter()
            .flatten()
            .min();
        if next == self.armed {
            return Ok(());
        }
        self.armed = next;
        let at = next.map_or(0, |n| self.t0 + n.max(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (at / 1_000_000_000) as libc::time_t,
                tv_nsec: (at % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: valid descriptor and itimerspec; old value not wanted.
        let r = unsafe {
            libc::timerfd_settime(
                self.timer.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Writes delivered packets into the far device and logs every fate.
    fn emit(&mut self, out: &mut Vec<Outcome<Packet>>, up: bool) -> io::Result<()> {
        for o in out.drain(..) {
            if o.fate == Fate::Delivered {
                let target = if up { &self.s } else { &self.c };
                // A packet the far stack refuses is as good as lost; keep running.
                let _ = target.send(&o.packet.data);
                let late = self.now().saturating_sub(o.at) / 1000;
                self.late_us.push(late.min(u64::from(u32::MAX)) as u32);
            }
            if let Some(w) = &mut self.log {
                crate::log::write_line(w, o.packet.arrived, o.at, up, o.fate, &o.packet.data)?;
            }
        }
        Ok(())
    }

    fn advance(&mut self, out: &mut Vec<Outcome<Packet>>) -> io::Result<()> {
        let now = self.now();
        self.up.advance(now, out);
        self.emit(out, true)?;
        self.down.advance(now, out);
        self.emit(out, false)
    }

    fn read_all(
        &mut self,
        up: bool,
        buf: &mut [u8],
        out: &mut Vec<Outcome<Packet>>,
    ) -> io::Result<()> {
        loop {
            let tun = if up { &self.c } else { &self.s };
            let Some(n) = tun.recv(buf)? else {
                return Ok(());
            };
            let now = self.now();
            let packet = Packet {
                data: buf[..n].to_vec(),
                arrived: now,
            };
            let dir = if up { &mut self.up } else { &mut self.down };
            dir.send(now, n, packet, out);
            self.emit(out, up)?;
        }
    }

    fn run(mut self, realtime: bool) -> io::Result<Report> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65536];
        let fds = [
            self.c.raw_fd(),
            self.s.raw_fd(),
            self.timer.as_raw_fd(),
            self.stop.as_raw_fd(),
        ];
        loop {
            self.advance(&mut out)?;
            self.arm()?;
            let mut pfds: Vec<libc::pollfd> = fds
                .iter()
                .map(|&fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            // SAFETY: `pfds` holds valid pollfds; no timeout, no signal mask change.
            let n = unsafe {
                libc::ppoll(
                    pfds.as_mut_ptr(),
                    pfds.len() as libc::nfds_t,
                    std::ptr::null(),
                    std::ptr::null(),
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if pfds[3].revents != 0 {
                break;
            }
            if pfds[2].revents != 0 {
                let mut expirations = [0u8; 8];
                // SAFETY: reading 8 bytes from a timerfd into a buffer of 8.
                unsafe { libc::read(fds[2], expirations.as_mut_ptr().cast(), 8) };
                self.armed = None;
            }
            // Everything due before the new arrivals (they come later in time).
            self.advance(&mut out)?;
            if pfds[0].revents != 0 {
                self.read_all(true, &mut buf, &mut out)?;
            }
            if pfds[1].revents != 0 {
                self.read_all(false, &mut buf, &mut out)?;
            }
        }
        let now = self.now();
        if let Some(w) = &mut self.log {
            w.flush()?;
        }
        self.late_us.sort_unstable();
        let pick = |q: f64| {
            if self.late_us.is_empty() {
                return 0.0;
            }
            let i = ((self.late_us.len() - 1) as f64 * q).round() as usize;
            f64::from(self.late_us[i])
        };
        Ok(Report {
            seconds: Duration::from_nanos(now).as_secs_f64(),
            seed: 0,
            up: self.up.stats(now).into(),
            down: self.down.stats(now).into(),
            lateness: Lateness {
                packets: self.late_us.len() as u64,
                p50_us: pick(0.5),
                p99_us: pick(0.99),
                max_us: pick(1.0),
            },
            device_drops: 0,
            realtime,
        })
    }
}

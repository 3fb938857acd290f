//! A case over the emulated link, in real time: `cobalt-linkem` between a client and
//! a server namespace; Cobalt's server (UDP and coap+tcp) in one; the clients in the
//! other — over UDP each with its own socket and Cobalt endpoint, driven by one
//! thread; over TCP each with its own `cobalt::Client` (one connection per short-lived
//! client) on the kernel's TCP.

use crate::case::{Case, Variant, Workload, EXCHANGES, PAYLOAD, TOKEN_LEN};
use crate::paper_tcp;
use crate::results::{LinkCounters, RunResult};
use crate::retx::{analyse, Pkt};
use crate::sim_run::{CLIENT_IP, SERVER};
use crate::workload::{client_config, plan, Next, UdpClient, PATH};
use cobalt::proto::tcp_connection::TcpConfig;
use cobalt::server::{get, Response};
use cobalt::transport::limits::TcpServerLimits;
use cobalt::{Client, Code, Scheme, Server};
use cobalt_linkem::emulator::{set_realtime, Config, DirectionReport, Emulator};
use cobalt_linkem::log::parse_line;
use cobalt_proto::endpoint::Endpoint;
use cobalt_proto::sim::link::Fate;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::io::{self, BufRead};
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// How emulated runs are made.
#[derive(Debug, Clone)]
pub struct EmuOptions {
    /// Where the per-packet logs go.
    pub work_dir: PathBuf,
    /// Keep the logs after the analysis.
    pub keep_logs: bool,
    /// Give up on clients still running after this long.
    pub case_timeout: Duration,
    /// Sysctls set in both namespaces after [`paper_tcp::sysctls`] (experiments).
    pub sysctls: Vec<String>,
}

/// Real-time priority of the server's and the clients' threads (below the link's 10):
/// their work is light, and without it a busy host (other builds on the same cores)
/// stalls them for hundreds of milliseconds, which the link's ideal timeline would
/// then count as round-trip time.
const ENDPOINT_PRIORITY: i32 = 5;

/// TCP settings of both ends: one-byte tokens like the UDP clients', and nothing that
/// would end a slow connection (no keep-alive, no idle close, generous timeouts).
fn tcp_config() -> TcpConfig {
    TcpConfig {
        token_len: TOKEN_LEN,
        keepalive: None,
        idle_timeout: None,
        csm_timeout: Duration::from_secs(3600),
        frame_timeout: Duration::from_secs(3600),
        ..TcpConfig::default()
    }
}

/// Starts Cobalt's server in the server namespace: UDP and coap+tcp on port 5683, one
/// shard, [`crate::sim_run::server_config`]. Returns a sender that stops it.
fn start_server(
    emu: &Emulator,
) -> io::Result<(mpsc::Sender<()>, std::thread::JoinHandle<io::Result<()>>)> {
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let (ready_tx, ready_rx) = mpsc::channel::<io::Result<()>>();
    let handle = emu.server_ns().spawn(move || {
        set_realtime(ENDPOINT_PRIORITY);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let tcp_limits = TcpServerLimits {
                connection: tcp_config(),
                write_timeout: Duration::from_secs(3600),
                handshake_timeout: Duration::from_secs(3600),
                ..TcpServerLimits::default()
            };
            let server = Server::new()
                .route(
                    &format!("/{PATH}"),
                    get(|| async { Response::content(vec![b'x'; PAYLOAD]) }),
                )
                .config(crate::sim_run::server_config())
                .listen(Scheme::CoapTcp, SERVER)
                .tcp_limits(tcp_limits)
                .shards(1)
                .bind(SERVER)
                .await;
            let server = match server {
                Ok(s) => {
                    let _ = ready_tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(io::Error::other(e.to_string())));
                    return Ok(());
                }
            };
            let _ = tokio::task::spawn_blocking(move || stop_rx.recv()).await;
            server.shutdown(Duration::ZERO).await;
            Ok(())
        })
    })?;
    ready_rx
        .recv_timeout(Duration::from_secs(30))
        .map_err(|_| io::Error::other("the server did not start"))??;
    Ok((
        stop_tx,
        std::thread::spawn(move || {
            handle
                .join()
                .map_err(|_| io::Error::other("server panicked"))??
        }),
    ))
}

/// One UDP client's socket and endpoint.
struct Slot {
    sock: UdpSocket,
    ep: Endpoint,
    udp: UdpClient,
    done: bool,
}

fn bind_client() -> io::Result<UdpSocket> {
    let s = UdpSocket::bind((CLIENT_IP, 0))?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// Runs the UDP clients (on the calling thread, which must be in the client
/// namespace) until all finish or `deadline`; returns them and their ports.
fn udp_clients(
    case: &Case,
    seed: u64,
    deadline: Instant,
) -> io::Result<(Vec<UdpClient>, HashMap<u16, usize>)> {
    let config = client_config(case.variant);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ports = HashMap::new();
    let mut slots = Vec::with_capacity(case.clients);
    let now = Instant::now();
    for i in 0..case.clients {
        let sock = bind_client()?;
        ports.insert(sock.local_addr()?.port(), i);
        let client_seed = seed ^ (i as u64).wrapping_mul(0x9e37_79b9);
        slots.push(Slot {
            sock,
            ep: Endpoint::with_seed(config.clone(), now, rng.random()),
            udp: UdpClient::new(SERVER, plan(case.workload, client_seed)),
            done: false,
        });
    }
    for s in &mut slots {
        s.udp.send(now, &mut s.ep);
    }
    let mut buf = vec![0u8; 2048];
    let mut left = case.clients;
    while left > 0 {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        let mut next = deadline;
        for (i, s) in slots.iter_mut().enumerate().filter(|(_, s)| !s.done) {
            if s.ep.poll_timeout().is_some_and(|t| t <= now) {
                s.ep.handle_timeout(now);
            }
            while let Some(ev) = s.ep.poll_event() {
                match s.udp.on_event(now, &mut s.ep, ev) {
                    Next::Wait => {}
                    Next::NewSession => {
                        s.udp.retire(&s.ep);
                        s.sock = bind_client()?;
                        ports.insert(s.sock.local_addr()?.port(), i);
                        s.ep = Endpoint::with_seed(config.clone(), now, rng.random());
                        s.udp.send(now, &mut s.ep);
                    }
                    Next::Finished => {
                        s.udp.retire(&s.ep);
                        s.done = true;
                        left -= 1;
                    }
                }
            }
            while let Some(tx) = s.ep.poll_transmit() {
                let _ = s.sock.send_to(&tx.bytes, tx.peer);
            }
            if let Some(t) = s.ep.poll_timeout() {
                next = next.min(t);
            }
        }
        wait_readable(&slots, next.saturating_duration_since(Instant::now()));
        let now = Instant::now();
        for s in slots.iter_mut().filter(|s| !s.done) {
            while let Ok((n, from)) = s.sock.recv_from(&mut buf) {
                s.ep.handle_datagram(now, from, &buf[..n]);
            }
        }
    }
    Ok((slots.into_iter().map(|s| s.udp).collect(), ports))
}

/// Waits until a client socket is readable, at most `timeout`.
fn wait_readable(slots: &[Slot], timeout: Duration) {
    let mut fds: Vec<libc::pollfd> = slots
        .iter()
        .filter(|s| !s.done)
        .map(|s| libc::pollfd {
            fd: s.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `fds` are valid pollfds of open sockets; `ts` outlives the call.
    unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
}

/// What a TCP client reports.
struct TcpOutcome {
    fct: Option<f64>,
    failures: u64,
}

/// Runs the TCP clients (on the calling thread, in the client namespace) until all
/// finish or `deadline`. Continuous clients connect first (handshake and CSM are not
/// timed, as in the paper); random ones connect anew for each short-lived client.
fn tcp_clients(case: &Case, seed: u64, deadline: Instant) -> io::Result<Vec<TcpOutcome>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let uri = format!("coap+tcp://{SERVER}/{PATH}");
    let base = format!("coap+tcp://{SERVER}/");
    let workload = case.workload;
    let clients = case.clients;
    rt.block_on(async move {
        let connected = Arc::new(tokio::sync::Barrier::new(clients));
        let mut tasks = Vec::new();
        for i in 0..clients {
            let plan = plan(workload, seed ^ (i as u64).wrapping_mul(0x9e37_79b9));
            let (uri, base, connected) = (uri.clone(), base.clone(), connected.clone());
            tasks.push(tokio::spawn(async move {
                let fresh = || {
                    let c = Client::new();
                    c.set_tcp_config(tcp_config());
                    c
                };
                let mut failures = 0;
                let mut client = fresh();
                if workload == Workload::Continuous {
                    while client.connect(&base).await.is_err() {
                        failures += 1;
                        client = fresh();
                    }
                    connected.wait().await;
                }
                let start = Instant::now();
                let mut done = 0;
                for n in plan {
                    if workload == Workload::Random {
                        client = fresh();
                    }
                    let mut left = n;
                    while left > 0 {
                        let r = client
                            .request(Code::GET, &uri)
                            .timeout(Duration::from_secs(3600))
                            .send()
                            .await;
                        match r {
                            Ok(r) if r.code.is_success() => {
                                left -= 1;
                                done += 1;
                            }
                            _ => {
                                failures += 1;
                                client = fresh();
                            }
                        }
                    }
                }
                drop(client);
                TcpOutcome {
                    fct: (done == EXCHANGES).then(|| start.elapsed().as_secs_f64()),
                    failures,
                }
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, t).await {
                Ok(Ok(o)) => out.push(o),
                _ => out.push(TcpOutcome {
                    fct: None,
                    failures: 0,
                }),
            }
        }
        Ok(out)
    })
}

fn counters(d: DirectionReport) -> LinkCounters {
    LinkCounters {
        packets: d.packets_in,
        drops_queue: d.drops_queue,
        drops_loss: d.drops_loss,
        peak_queue: d.peak_queue_bytes,
    }
}

/// The packets of a log, as the retransmission analysis wants them.
fn read_log(path: &std::path::Path) -> io::Result<Vec<Pkt>> {
    let f = std::fs::File::open(path)?;
    let mut out = Vec::new();
    for line in io::BufReader::new(f).lines() {
        let Some(r) = parse_line(&line?) else {
            continue;
        };
        out.push(Pkt {
            sent: r.arrived,
            up: r.up,
            delivered: r.fate == Fate::Delivered,
            port: if r.up { r.src.1 } else { r.dst.1 },
            coap: r.coap.filter(|_| r.proto == 17),
            tcp: r.tcp.map(|(seq, _, flags, len)| (seq, flags, len)),
        });
    }
    Ok(out)
}

/// Runs one case over the emulated link.
pub fn run(case: &Case, seed: u64, opts: &EmuOptions) -> io::Result<RunResult> {
    let wall = Instant::now();
    std::fs::create_dir_all(&opts.work_dir)?;
    let log = opts.work_dir.join(format!(
        "{}.packets.csv",
        case.key().replace(['/', '#'], "_")
    ));
    let mut config = Config::new(case.link(), seed);
    config.sysctls.clone_from(&opts.sysctls);
    paper_tcp::configure(&mut config);
    config.packet_log = Some(log.clone());
    let emu = Emulator::start(config)?;
    // Before the first socket: the paper's initial RTO for both ends (TCP only: it
    // needs BPF and a cgroup, which UDP runs can do without).
    let initial_rto = if case.variant == Variant::Tcp {
        Some(paper_tcp::initial_rto(emu.client_ns())?)
    } else {
        None
    };
    let (stop_server, server) = start_server(&emu)?;
    let deadline = Instant::now() + opts.case_timeout;
    let case_copy = *case;
    let (fct, retransmissions, failures, ports) = if case.variant == Variant::Tcp {
        let outcomes = emu.client_ns().run(move || {
            set_realtime(ENDPOINT_PRIORITY);
            tcp_clients(&case_copy, seed, deadline)
        })??;
        let fct: Vec<f64> = outcomes.iter().filter_map(|o| o.fct).collect();
        let failures = outcomes.iter().map(|o| o.failures).sum();
        (fct, Vec::new(), failures, None)
    } else {
        let (clients, ports) = emu.client_ns().run(move || {
            set_realtime(ENDPOINT_PRIORITY);
            udp_clients(&case_copy, seed, deadline)
        })??;
        let fct = clients
            .iter()
            .filter_map(UdpClient::fct)
            .map(|d| d.as_secs_f64())
            .collect();
        let retx = clients.iter().map(|c| c.retransmissions).collect();
        let failures = clients.iter().map(|c| c.failures).sum();
        (fct, retx, failures, Some(ports))
    };
    let span = wall.elapsed().as_secs_f64();
    let _ = stop_server.send(());
    let served = server
        .join()
        .map_err(|_| io::Error::other("server thread panicked"))?;
    let report = emu.stop()?;
    drop(initial_rto);
    served?;
    let per_port = analyse(read_log(&log)?);
    if !opts.keep_logs {
        let _ = std::fs::remove_file(&log);
    }
    let clients = case.clients;
    let (mut retransmissions, mut unnecessary, mut handshake) =
        (retransmissions, vec![0u64; clients], vec![0u64; clients]);
    match ports {
        Some(ports) => {
            for (port, r) in per_port {
                if let Some(&i) = ports.get(&port) {
                    unnecessary[i] += r.unnecessary;
                }
            }
        }
        None => {
            // TCP: a port is a connection; continuous clients have one each, random
            // clients' connections cannot be told apart, so list them by connection.
            retransmissions = per_port.values().map(|r| r.total).collect();
            unnecessary = per_port.values().map(|r| r.unnecessary).collect();
            handshake = per_port.values().map(|r| r.handshake).collect();
        }
    }
    Ok(RunResult {
        case: *case,
        key: case.key(),
        seed,
        unfinished: clients - fct.len(),
        fct,
        retransmissions,
        unnecessary,
        handshake_retransmissions: if case.variant == Variant::Tcp {
            handshake
        } else {
            Vec::new()
        },
        failures,
        up: counters(report.up),
        down: counters(report.down),
        wall_s: wall.elapsed().as_secs_f64(),
        span_s: span,
    })
}

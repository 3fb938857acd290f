//! Many simulated [`Device`]s on one tokio runtime: each has its own UDP socket (on
//! one address, or spread over a range of addresses so that per-address budgets of
//! the server under test apply per device group), optionally DTLS with a pre-shared
//! key towards its directory, and one small task that feeds its datagrams and timers
//! to it. Nothing per device but the socket, the device's state and that task: no
//! thread, no buffer of its own (datagrams are read into one buffer per thread).

use crate::device::{Device, DeviceSettings};
use crate::stats::{FleetStats, Summary};
use cobalt::transport::credentials::ClientPsk;
use cobalt::transport::dtls::{DtlsBackend, DtlsConfig, DtlsEvent, OpensslDtls};
use std::cell::RefCell;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// The source addresses of a fleet's sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceAddrs {
    /// Every device on this address (an ephemeral port each).
    One(IpAddr),
    /// Devices spread round-robin over the host addresses of this IPv4 network
    /// (`127.0.0.0/16`: 127.0.0.1, 127.0.0.2, ...; all of 127.0.0.0/8 is loopback).
    Net {
        /// The network address.
        network: Ipv4Addr,
        /// Its prefix length (8 to 30).
        prefix: u8,
    },
}

impl SourceAddrs {
    /// Parses `A.B.C.D/N`; says what is wrong otherwise.
    pub fn parse_net(s: &str) -> Result<SourceAddrs, String> {
        let (addr, len) = s
            .split_once('/')
            .ok_or_else(|| format!("`{s}` is not a network: write it as 127.0.0.0/16"))?;
        let network: Ipv4Addr = addr
            .parse()
            .map_err(|_| format!("`{addr}` is not an IPv4 address"))?;
        let prefix: u8 = len
            .parse()
            .ok()
            .filter(|p| (8..=30).contains(p))
            .ok_or_else(|| format!("prefix length `{len}` must be 8 to 30"))?;
        let mask = u32::MAX << (32 - prefix);
        Ok(SourceAddrs::Net {
            network: Ipv4Addr::from(u32::from(network) & mask),
            prefix,
        })
    }

    /// The address of device number `index`.
    pub fn address(&self, index: u32) -> IpAddr {
        match *self {
            SourceAddrs::One(ip) => ip,
            SourceAddrs::Net { network, prefix } => {
                let hosts = (1u32 << (32 - prefix)) - 2;
                IpAddr::V4(Ipv4Addr::from(u32::from(network) + 1 + index % hosts))
            }
        }
    }
}

/// DTLS with a pre-shared key for each device towards its directory.
#[derive(Clone)]
pub struct FleetPsk {
    /// Device number `i` uses the identity `{identity_prefix}{i}`.
    pub identity_prefix: String,
    /// The key, the same for all.
    pub key: Vec<u8>,
}

impl std::fmt::Debug for FleetPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetPsk")
            .field("identity_prefix", &self.identity_prefix)
            .finish_non_exhaustive()
    }
}

/// A fleet to start.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// How many devices.
    pub devices: u32,
    /// Device number `i` is called `{ep_prefix}{i}`.
    pub ep_prefix: String,
    /// Where the sockets are bound.
    pub source: SourceAddrs,
    /// What the devices serve and where they register.
    pub settings: DeviceSettings,
    /// DTLS towards the directory (the devices are then reachable only through it).
    pub psk: Option<FleetPsk>,
    /// Devices starting to register per second, and at shutdown removing their
    /// registrations (so that a large fleet does not hit its directory in the same
    /// millisecond: 10,000 devices take 10 s to register and to stop at 1,000).
    pub registrations_per_second: u32,
    /// How long a device waits for its removal to be answered at shutdown (after its
    /// turn in the pace); one still unanswered then is counted as an error.
    pub shutdown_grace: Duration,
}

impl FleetConfig {
    /// `devices` devices with `settings` on 127.0.0.1, named `dev-0`, `dev-1`, ...
    pub fn new(devices: u32, settings: DeviceSettings) -> FleetConfig {
        FleetConfig {
            devices,
            ep_prefix: "dev-".into(),
            source: SourceAddrs::One(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            settings,
            psk: None,
            registrations_per_second: 1000,
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// Why a fleet could not start.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// A socket could not be opened.
    #[error(
        "cannot open the socket of device {index} on {addr}: {source} (too many open files? \
         raise `ulimit -n`; address not available? spread the devices with a source \
         network on this machine's addresses)"
    )]
    Bind {
        /// The device's number.
        index: u32,
        /// The address.
        addr: IpAddr,
        /// The error.
        source: std::io::Error,
    },
    /// DTLS could not be set up.
    #[error("cannot set up DTLS for the devices: {0}")]
    Dtls(String),
    /// DTLS was asked for without a directory to talk to.
    #[error("DTLS needs a directory (the devices open a session with it)")]
    DtlsWithoutDirectory,
}

/// A running fleet.
#[derive(Debug)]
pub struct Fleet {
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
    stats: Arc<FleetStats>,
    addrs: Vec<SocketAddr>,
}

impl Fleet {
    /// Opens every device's socket (failing, with nothing left running, if one
    /// cannot be opened) and starts the devices on the current runtime. A socket per
    /// device: raise the limit on open files first for large fleets (`cobalt devices`
    /// raises it to the hard limit).
    pub async fn start(config: FleetConfig) -> Result<Fleet, FleetError> {
        let mut sockets = Vec::with_capacity(config.devices as usize);
        for index in 0..config.devices {
            let addr = config.source.address(index);
            let bind = |source| FleetError::Bind {
                index,
                addr,
                source,
            };
            let std = std::net::UdpSocket::bind(SocketAddr::new(addr, 0)).map_err(bind)?;
            std.set_nonblocking(true).map_err(bind)?;
            sockets.push(UdpSocket::from_std(std).map_err(bind)?);
        }
        let directory = config.settings.directory.as_ref().map(|d| d.server);
        if config.psk.is_some() && directory.is_none() {
            return Err(FleetError::DtlsWithoutDirectory);
        }
        let addrs: Vec<SocketAddr> = sockets.iter().filter_map(|s| s.local_addr().ok()).collect();
        let stats = Arc::new(FleetStats::default());
        let settings = Arc::new(config.settings.clone());
        let (stop, stopped) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let now = Instant::now();
        let change_every = settings.change_every.unwrap_or(Duration::from_secs(1));
        let per_second = config.registrations_per_second.max(1);
        for (index, socket) in (0..config.devices).zip(sockets) {
            let dtls = match (&config.psk, directory) {
                (Some(psk), Some(server)) => Some((
                    Box::new(
                        OpensslDtls::client(
                            ClientPsk {
                                identity: format!("{}{index}", psk.identity_prefix).into_bytes(),
                                key: psk.key.clone(),
                            },
                            DtlsConfig::default(),
                        )
                        .map_err(|e| FleetError::Dtls(e.to_string()))?,
                    ),
                    server,
                )),
                _ => None,
            };
            // Changes spread evenly over the interval, registrations at the set pace.
            let first_change = change_every.mul_f64(f64::from(index % 1000) / 1000.0);
            let register_at =
                now + Duration::from_secs_f64(f64::from(index) / f64::from(per_second));
            let device = Device::new(
                index,
                format!("{}{index}", config.ep_prefix),
                settings.clone(),
                stats.clone(),
                now,
                first_change,
                register_at,
            );
            // Removals at shutdown at the same pace as the registrations.
            let stop_after = Duration::from_secs_f64(f64::from(index) / f64::from(per_second));
            tasks.spawn(run_device(
                device,
                socket,
                dtls,
                stopped.clone(),
                (stop_after, config.shutdown_grace),
            ));
        }
        Ok(Fleet {
            stop,
            tasks,
            stats,
            addrs,
        })
    }

    /// The devices' socket addresses, by device number.
    pub fn addresses(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<FleetStats> {
        &self.stats
    }

    /// Stops every device (removing its registration at the registrations' pace,
    /// waiting at most the shutdown grace for each answer) and returns the counters.
    pub async fn shutdown(mut self) -> Summary {
        let _ = self.stop.send(true);
        while self.tasks.join_next().await.is_some() {}
        self.stats.summary()
    }
}

thread_local! {
    /// The buffer datagrams are read into, one per runtime thread (a device handles
    /// each datagram before the next read, without awaiting in between).
    static RECEIVE_BUFFER: RefCell<Vec<u8>> = RefCell::new(vec![0; 65_536]);
}

/// A DTLS session table towards the directory at the given address.
type Secure = (Box<OpensslDtls>, SocketAddr);

/// Runs one device until the fleet stops: then, `stop_after` later (shutdowns are
/// paced like registrations), it removes its registration and waits at most `grace`
/// for the answer.
async fn run_device(
    mut device: Device,
    socket: UdpSocket,
    mut dtls: Option<Secure>,
    mut stop: watch::Receiver<bool>,
    (stop_after, grace): (Duration, Duration),
) {
    let mut stop_at: Option<Instant> = None;
    let mut stopped = false;
    loop {
        let now = Instant::now();
        if !stopped && stop_at.is_some_and(|at| at <= now) {
            device.stop(now);
            stopped = true;
        }
        device.handle_timeout(now);
        if let Some((table, _)) = dtls.as_mut() {
            table.handle_timeout(now);
        }
        flush(&socket, &mut device, dtls.as_mut(), now);
        let give_up_at = stop_at.map(|at| at + grace);
        if device.is_stopped() || give_up_at.is_some_and(|at| at <= now) {
            if !device.is_stopped() {
                device.give_up();
            }
            flush(&socket, &mut device, dtls.as_mut(), now);
            return;
        }
        let wake = [
            device.poll_timeout(),
            dtls.as_ref().and_then(|(t, _)| t.poll_timeout()),
            stop_at.filter(|_| !stopped),
            give_up_at,
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(now + Duration::from_secs(3600));
        tokio::select! {
            ready = socket.readable() => {
                if ready.is_ok() {
                    receive(&socket, &mut device, dtls.as_mut());
                }
            }
            _ = tokio::time::sleep_until(wake.into()) => {}
            changed = stop.changed(), if stop_at.is_none() => {
                if changed.is_err() || *stop.borrow() {
                    stop_at = Some(Instant::now() + stop_after);
                }
            }
        }
    }
}

/// Reads every datagram waiting on the socket into the device.
fn receive(socket: &UdpSocket, device: &mut Device, mut dtls: Option<&mut Secure>) {
    RECEIVE_BUFFER.with(|buf| {
        let mut buf = buf.borrow_mut();
        // At most a batch per wake-up, so that one busy device does not hold the thread.
        for _ in 0..64 {
            let (n, peer) = match socket.try_recv_from(&mut buf) {
                Ok(got) => got,
                Err(_) => return,
            };
            let now = Instant::now();
            match dtls.as_deref_mut() {
                None => device.handle_datagram(now, peer, &buf[..n]),
                Some((table, server)) => {
                    if peer != *server {
                        continue; // the device speaks DTLS only, with its directory
                    }
                    for plain in table.handle_datagram(now, peer, &buf[..n]) {
                        device.handle_datagram(now, peer, &plain);
                    }
                }
            }
        }
    });
}

/// Sends one datagram now. Straight to the kernel: tokio's `try_send_to` refuses
/// until the reactor has seen the socket writable once, which would drop a new
/// device's first datagram. One the kernel cannot take now (a full send buffer) is
/// dropped, as a network would; the protocol retransmits.
fn send(socket: &UdpSocket, bytes: &[u8], peer: SocketAddr) {
    let _ = socket2::SockRef::from(socket).send_to(bytes, &peer.into());
}

/// Sends what the device (and its DTLS table) have to send.
fn flush(socket: &UdpSocket, device: &mut Device, mut dtls: Option<&mut Secure>, now: Instant) {
    while let Some(tx) = device.poll_transmit() {
        match dtls.as_deref_mut() {
            None => send(socket, &tx.bytes, tx.peer),
            Some((table, server)) => {
                if tx.peer == *server {
                    table.encrypt(now, tx.peer, &tx.bytes);
                }
            }
        }
        device.recycle(tx.bytes);
    }
    if let Some((table, _)) = dtls {
        while let Some(tx) = table.poll_transmit() {
            send(socket, &tx.bytes, tx.peer);
        }
        while let Some(event) = table.poll_event() {
            if let DtlsEvent::HandshakeFailed { reason, .. } = event {
                tracing::debug!(ep = device.ep(), "DTLS handshake failed: {reason}");
                device.dtls_failed();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_networks_spread_devices_over_host_addresses() {
        let net = SourceAddrs::parse_net("127.0.0.9/30").unwrap();
        assert_eq!(
            net,
            SourceAddrs::Net {
                network: Ipv4Addr::new(127, 0, 0, 8),
                prefix: 30
            }
        );
        let addrs: Vec<IpAddr> = (0..3).map(|i| net.address(i)).collect();
        assert_eq!(
            addrs,
            ["127.0.0.9", "127.0.0.10", "127.0.0.9"].map(|a| a.parse::<IpAddr>().unwrap())
        );
        assert!(SourceAddrs::parse_net("127.0.0.1")
            .unwrap_err()
            .contains("127.0.0.0/16"));
        assert!(SourceAddrs::parse_net("127.0.0.0/31").is_err());
        assert!(SourceAddrs::parse_net("x/16").is_err());
    }
}

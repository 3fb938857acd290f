//! TUN devices: opened inside a namespace, carrying whole IP packets (no packet
//! information header, no offloads, so every packet arrives checksummed and within
//! the MTU).

use crate::netns::{self, ip, Namespace};
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// A TUN device in a namespace; it disappears when dropped (its file is closed).
#[derive(Debug)]
pub struct Tun {
    fd: OwnedFd,
    name: String,
}

/// Addresses of one end: its own address and the network behind the other end.
#[derive(Debug, Clone)]
pub struct TunAddr {
    /// This end's address with prefix, e.g. `10.78.1.2/24`.
    pub local: String,
    /// The far side's network, routed through the device, e.g. `10.78.2.0/24`.
    pub remote: String,
}

impl Tun {
    /// Creates the device `name` in `ns`, non-blocking, with `addr`, `mtu` and a
    /// transmit queue of `txqueuelen` packets, and brings it up.
    pub fn create(
        ns: &Namespace,
        name: &str,
        addr: &TunAddr,
        mtu: usize,
        txqueuelen: usize,
    ) -> io::Result<Tun> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("interface name `{name}` must have 1 to 15 characters"),
            ));
        }
        let saved = netns::current()?;
        ns.enter()?;
        let opened = open(name);
        netns::restore(&saved)?;
        let tun = Tun {
            fd: opened?,
            name: name.to_string(),
        };
        let n = ns.name();
        let (mtu, qlen) = (mtu.to_string(), txqueuelen.to_string());
        ip(&["-n", n, "addr", "add", &addr.local, "dev", name])?;
        ip(&[
            "-n",
            n,
            "link",
            "set",
            name,
            "mtu",
            &mtu,
            "txqueuelen",
            &qlen,
            "up",
        ])?;
        ip(&["-n", n, "route", "add", &addr.remote, "dev", name])?;
        Ok(tun)
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The raw descriptor, for polling.
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Reads one packet into `buf`; `Ok(None)` when none is waiting.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::read(self.raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        }
    }

    /// Hands one packet to the namespace's stack as if it arrived on the device.
    pub fn send(&self, packet: &[u8]) -> io::Result<()> {
        // SAFETY: `packet` is readable for its length.
        let n = unsafe { libc::write(self.raw_fd(), packet.as_ptr().cast(), packet.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Opens `/dev/net/tun` and attaches the device `name` in the caller's namespace.
fn open(name: &str) -> io::Result<OwnedFd> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .map_err(|e| io::Error::new(e.kind(), format!("cannot open /dev/net/tun: {e}")))?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF takes a pointer to an `ifreq`, which `IfReq` lays out.
    if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("cannot create TUN device {name}: {e}"),
        ));
    }
    Ok(file.into())
}

/// Packets a device dropped on transmit (its own queue overflowing because the
/// emulator did not read fast enough); `None` if it cannot be read.
pub fn tx_dropped(ns: &Namespace, dev: &str) -> Option<u64> {
    let out =
        crate::netns::ip_output(&["-n", ns.name(), "-j", "-s", "link", "show", "dev", dev]).ok()?;
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    v.get(0)?
        .get("stats64")?
        .get("tx")?
        .get("dropped")?
        .as_u64()
}

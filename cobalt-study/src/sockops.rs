//! The initial retransmission timeout of this process's TCP sockets, set by a BPF
//! sock_ops program: Linux has no sysctl, route attribute or socket option for it
//! (1 s, RFC 6298), only the `BPF_SOCK_OPS_TIMEOUT_INIT` callback of a sock_ops
//! program attached to a cgroup v2.
//!
//! The program is six instructions, assembled here and loaded with `bpf(2)` (no BPF
//! toolchain, no object file): it answers `BPF_SOCK_OPS_TIMEOUT_INIT` with the timeout
//! in jiffies and leaves every other callback alone. It is attached to a cgroup made
//! for this process ([`InitialRto::install`]), and the process moves into it so that
//! only its sockets (both ends of the study, in any network namespace) are affected.
//! Dropping the guard moves the process back, detaches the program and removes the
//! cgroup.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `bpf(2)` commands and constants (linux/bpf.h).
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_PROG_TYPE_SOCK_OPS: u32 = 13;
const BPF_CGROUP_SOCK_OPS: u32 = 3;
const BPF_SOCK_OPS_TIMEOUT_INIT: i32 = 1;
/// Name of this process's cgroup, followed by its pid.
const CGROUP_PREFIX: &str = "cobalt-study-";
/// Offset of `reply` in `struct bpf_sock_ops` (after `__u32 op`).
const REPLY_OFFSET: i16 = 4;

/// One BPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Insn {
    code: u8,
    /// dst_reg in the low nibble, src_reg in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}

/// The program: `if ctx->op == TIMEOUT_INIT { ctx->reply = jiffies } return 1`.
fn program(jiffies: i32) -> [Insn; 6] {
    const LDX_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
    const JNE_K: u8 = 0x55; // BPF_JMP | BPF_JNE | BPF_K
    const MOV64_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
    const STX_W: u8 = 0x63; // BPF_STX | BPF_MEM | BPF_W
    const EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT
    [
        insn(LDX_W, 2, 1, 0, 0),                         // r2 = ctx->op
        insn(JNE_K, 2, 0, 2, BPF_SOCK_OPS_TIMEOUT_INIT), // if r2 != TIMEOUT_INIT goto +2
        insn(MOV64_K, 3, 0, 0, jiffies),                 // r3 = jiffies
        insn(STX_W, 1, 3, REPLY_OFFSET, 0),              // ctx->reply = r3
        insn(MOV64_K, 0, 0, 0, 1),                       // r0 = 1
        insn(EXIT, 0, 0, 0, 0),
    ]
}

/// `union bpf_attr` for BPF_PROG_LOAD, up to the fields used.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `union bpf_attr` for BPF_PROG_ATTACH and BPF_PROG_DETACH.
#[repr(C)]
#[derive(Default)]
struct AttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a valid, initialised bpf_attr prefix of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// Loads the program; the error carries the verifier's log.
fn load(jiffies: i32) -> io::Result<OwnedFd> {
    let insns = program(jiffies);
    let license = c"GPL";
    let mut log = vec![0u8; 4096];
    let mut name = [0u8; 16];
    name[..11].copy_from_slice(b"initial_rto");
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_SOCK_OPS,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        prog_name: name,
        ..ProgLoadAttr::default()
    };
    match bpf(BPF_PROG_LOAD, &mut attr) {
        // SAFETY: BPF_PROG_LOAD returned a new descriptor we own.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) }),
        Err(e) => {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            Err(io::Error::new(
                e.kind(),
                format!(
                    "the kernel refused the sock_ops program (needs CAP_BPF and \
                     CONFIG_CGROUP_BPF): {e}; verifier: {}",
                    String::from_utf8_lossy(&log[..end]).trim()
                ),
            ))
        }
    }
}

/// Where cgroup v2 is mounted (`/sys/fs/cgroup` or `/sys/fs/cgroup/unified`).
fn cgroup2_root() -> io::Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (path, kind) = (f.nth(1)?, f.next()?);
            (kind == "cgroup2").then(|| PathBuf::from(path))
        })
        .next()
        .ok_or_else(|| io::Error::other("no cgroup v2 hierarchy is mounted (mount -t cgroup2)"))
}

/// This process's cgroup v2 directory.
fn own_cgroup(root: &Path) -> io::Result<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup")?;
    let rel = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| io::Error::other("this process is in no cgroup v2"))?;
    Ok(root.join(rel.trim_start_matches('/')))
}

/// How long a jiffy lasts in the namespace `ns`, read back from a sysctl kept in
/// jiffies and shown in milliseconds (rounded up to a jiffy when written): the
/// kernel's HZ is a build option.
pub fn jiffy(ns: &cobalt_linkem::netns::Namespace) -> io::Result<Duration> {
    let setting = "net.ipv4.neigh.lo.retrans_time_ms";
    ns.sysctl(&format!("{setting}=1"))?;
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns.name(), "sysctl", "-n", setting])
        .output()?;
    let ms: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|_| io::Error::other(format!("cannot read {setting} in {}", ns.name())))?;
    if ms == 0 || ms > 100 {
        return Err(io::Error::other(format!(
            "{setting} reads {ms} ms after writing 1 ms: not a jiffy"
        )));
    }
    Ok(Duration::from_millis(ms))
}

/// The sock_ops program attached to a cgroup holding this process; undone when
/// dropped.
#[derive(Debug)]
pub struct InitialRto {
    prog: OwnedFd,
    cgroup: PathBuf,
    cgroup_dir: File,
    previous: PathBuf,
}

impl InitialRto {
    /// Gives every TCP socket this process opens from now on (SYN and SYN-ACK, and
    /// the connection until its first RTT sample) the initial retransmission
    /// timeout `rto`, in whole jiffies of length `jiffy`. Needs root.
    pub fn install(rto: Duration, jiffy: Duration) -> io::Result<InitialRto> {
        let jiffies = (rto.as_nanos().div_ceil(jiffy.as_nanos().max(1))) as i32;
        let prog = load(jiffies)?;
        let root = cgroup2_root()?;
        let previous = own_cgroup(&root)?;
        let cgroup = previous.join(format!("{CGROUP_PREFIX}{}", std::process::id()));
        match std::fs::create_dir(&cgroup) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot create the cgroup {}: {e}", cgroup.display()),
                ))
            }
        }
        let cgroup_dir = File::open(&cgroup)?;
        let mut attr = AttachAttr {
            target_fd: cgroup_dir.as_raw_fd() as u32,
            attach_bpf_fd: prog.as_raw_fd() as u32,
            attach_type: BPF_CGROUP_SOCK_OPS,
            attach_flags: 0,
        };
        bpf(BPF_PROG_ATTACH, &mut attr).map_err(|e| {
            let _ = std::fs::remove_dir(&cgroup);
            io::Error::new(
                e.kind(),
                format!(
                    "cannot attach the sock_ops program to {}: {e}",
                    cgroup.display()
                ),
            )
        })?;
        let guard = InitialRto {
            prog,
            cgroup,
            cgroup_dir,
            previous,
        };
        move_process(&guard.cgroup)?;
        Ok(guard)
    }

    /// The cgroup the program is attached to.
    pub fn cgroup(&self) -> &Path {
        &self.cgroup
    }
}

/// Removes the cgroups of earlier study processes that are gone (killed before their
/// guard was dropped; the kernel detaches the program with the cgroup); returns them.
pub fn remove_stale() -> Vec<PathBuf> {
    let Ok(parent) = cgroup2_root().and_then(|root| own_cgroup(&root)) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(&parent) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid: u32 = name.strip_prefix(CGROUP_PREFIX)?.parse().ok()?;
            let gone = pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists();
            (gone && std::fs::remove_dir(e.path()).is_ok()).then(|| e.path())
        })
        .collect()
}

fn move_process(to: &Path) -> io::Result<()> {
    std::fs::write(to.join("cgroup.procs"), std::process::id().to_string()).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot move this process into {}: {e}", to.display()),
        )
    })
}

impl Drop for InitialRto {
    fn drop(&mut self) {
        let _ = move_process(&self.previous);
        let mut attr = AttachAttr {
            target_fd: self.cgroup_dir.as_raw_fd() as u32,
            attach_bpf_fd: self.prog.as_raw_fd() as u32,
            attach_type: BPF_CGROUP_SOCK_OPS,
            attach_flags: 0,
        };
        let _ = bpf(BPF_PROG_DETACH, &mut attr);
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_answers_timeout_init_with_the_jiffies_and_returns_one() {
        let p = program(500);
        // The jump skips exactly the two instructions that set the reply.
        assert_eq!((p[1].code, p[1].off, p[1].imm), (0x55, 2, 1));
        assert_eq!((p[2].imm, p[3].off, p[3].regs), (500, 4, 1 | (3 << 4)));
        assert_eq!((p[4].imm, p[5].code), (1, 0x95));
    }
}

//! Server-side figures from /proc: CPU time and resident set size of `--server-pid`.

/// CPU time (utime + stime) of `pid` in seconds, or `None` if it cannot be read.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ticks = parse_stat_ticks(&stat)?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as f64 } else { 100.0 };
    Some(ticks as f64 / hz)
}

/// utime + stime in clock ticks from the text of /proc/PID/stat.
///
/// The command name (field 2) may contain spaces and parentheses, so fields are
/// counted from the last `)`.
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_ascii_whitespace();
    // After the comm: state(3) ppid pgrp session tty_nr tpgid flags minflt cminflt majflt
    // cmajflt utime(14) stime(15).
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Resident set size of `pid` in KiB.
pub fn rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vmrss(&status)
}

/// The VmRSS value in KiB from the text of /proc/PID/status.
pub fn parse_vmrss(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_ascii_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_odd_command_name() {
        let stat = "1234 (my (odd) srv) S 1 1234 1234 0 -1 4194560 500 0 0 0 \
                    250 75 0 0 20 0 4 0 100 1000000 300 18446744073709551615";
        assert_eq!(parse_stat_ticks(stat), Some(325));
        assert_eq!(parse_stat_ticks("garbage"), None);
        assert_eq!(parse_stat_ticks("1 (x) S 1 2"), None);
    }

    #[test]
    fn vmrss_line() {
        let status = "Name:\tsrv\nVmPeak:\t  9000 kB\nVmRSS:\t    4321 kB\nThreads:\t1\n";
        assert_eq!(parse_vmrss(status), Some(4321));
        assert_eq!(parse_vmrss("Name: x\n"), None);
    }

    #[test]
    fn own_process_is_readable() {
        let pid = std::process::id();
        assert!(cpu_seconds(pid).is_some());
        assert!(rss_kb(pid).unwrap() > 0);
    }
}

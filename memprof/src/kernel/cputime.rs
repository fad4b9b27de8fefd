//! CPU time of a traced process, as /proc tells it.

/// System CPU seconds of process `pid` (all threads, past and present).
pub fn system_time(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces and parens).
    let rest = &stat[stat.rfind(')')? + 2..];
    let stime: f64 = rest.split(' ').nth(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| stime / hz as f64)
}

/// CPU seconds of process `pid` (user and system, all threads).
pub fn cpu_time(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ').skip(11);
    let utime: f64 = fields.next()?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| (utime + stime) / hz as f64)
}

/// CPUs online.
pub fn online_cpus() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    n.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_time_of_this_process_is_readable() {
        let t = system_time(std::process::id()).unwrap();
        assert!(t >= 0.0);
        assert_eq!(system_time(0), None);
        let cpu = cpu_time(std::process::id()).unwrap();
        assert!(cpu >= t);
        assert!(online_cpus() >= 1.0);
    }
}

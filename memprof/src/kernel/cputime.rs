//! CPU time of a traced process, as /proc tells it.

/// The fields of `/proc/PID/stat` after the command name (which may
/// contain spaces and parens): index 0 is field 3 of proc(5), the state.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    Some(rest.split(' ').map(str::to_string).collect())
}

/// Clock ticks as seconds.
fn ticks(fields: &[String], index: usize) -> Option<f64> {
    let ticks: f64 = fields.get(index)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| ticks / hz as f64)
}

/// System CPU seconds of process `pid` (all threads, past and present).
pub fn system_time(pid: u32) -> Option<f64> {
    ticks(&stat_fields(pid)?, 12)
}

/// CPU seconds of process `pid` (user and system, all threads).
pub fn cpu_time(pid: u32) -> Option<f64> {
    let fields = stat_fields(pid)?;
    Some(ticks(&fields, 11)? + ticks(&fields, 12)?)
}

/// Threads of process `pid` now (proc(5) field 20): the most CPUs it can
/// keep busy.
pub fn threads(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(17)?.parse().ok()
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
        // The test harness starts and ends threads meanwhile: one at least.
        assert!(threads(std::process::id()).is_some_and(|n| n >= 1));
        assert_eq!(threads(0), None);
    }
}

//! CPU time of a traced process, as /proc tells it.

use crate::process::procfs::{stat, stat_fields, stat_number};

/// Clock ticks as seconds.
fn ticks(fields: &[String], index: usize) -> Option<f64> {
    let ticks: f64 = stat_number(fields, index)?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| ticks / hz as f64)
}

/// System CPU seconds of process `pid` (all threads, past and present).
pub fn system_time(pid: u32) -> Option<f64> {
    ticks(&stat_fields(pid)?, stat::STIME)
}

/// CPU seconds of process `pid` (user and system, all threads).
pub fn cpu_time(pid: u32) -> Option<f64> {
    let fields = stat_fields(pid)?;
    Some(ticks(&fields, stat::UTIME)? + ticks(&fields, stat::STIME)?)
}

/// CPU seconds of process `pid` by its CPU clock: every thread's, exited
/// ones included, to the nanosecond (proc's figures are 10 ms ticks, as
/// long as a short window).
pub fn cpu_clock(pid: u32) -> Option<f64> {
    let pid = libc::pid_t::try_from(pid).ok().filter(|p| *p > 0)?;
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `clock` is a valid, writable clockid_t.
    if unsafe { libc::clock_getcpuclockid(pid, &mut clock) } != 0 {
        return None;
    }
    // SAFETY: an all-zero timespec is valid for clock_gettime to fill.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `ts` is a valid, writable timespec; an ended process's
    // clock gives an error, not undefined behaviour.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}

/// Threads of process `pid` now (proc(5) field 20): the most CPUs it can
/// keep busy.
pub fn threads(pid: u32) -> Option<u32> {
    stat_number(&stat_fields(pid)?, stat::NUM_THREADS)
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

    #[test]
    fn the_cpu_clock_of_a_process_counts_its_threads_to_the_nanosecond() {
        let me = std::process::id();
        let before = cpu_clock(me).unwrap();
        // Work on another thread counts for the process.
        std::thread::spawn(|| {
            let started = std::time::Instant::now();
            let mut x = 0u64;
            while started.elapsed() < std::time::Duration::from_millis(20) {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        })
        .join()
        .unwrap();
        let spent = cpu_clock(me).unwrap() - before;
        assert!(spent >= 0.015, "20 ms of work counted as {spent} s");
        assert_eq!(cpu_clock(0), None);
        assert_eq!(cpu_clock(u32::MAX), None);
    }
}

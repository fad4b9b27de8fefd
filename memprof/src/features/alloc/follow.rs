//! What the untraced timing helper ([`super::untraced`]) takes from its
//! target: its allocator's tuning variables, and the CPU it runs on —
//! the target's busiest thread's.
//!
//! The vCPUs of these VMs do not run at one pace: two helpers pinned one
//! to each of two vCPUs, side by side, timed a malloc-free pair at 2.7 ns
//! on one and 4.5 ns on the other, and each flipped to about 7-8.5 ns
//! and back every few hundred ms on its own, idle or not. A helper
//! running wherever the scheduler puts it timed another vCPU's pace than
//! a hot loop's, and its count from the CPU time was 40-52% short in 5
//! of 15 runs of the hot-loop test (claiming 27-30%). So before each run
//! the helper reads where the target's busiest thread last ran, and pins
//! itself there (which thread is busiest is read of every thread once a
//! second, the one thread's CPU before every run: a target of 200
//! threads would cost 200 reads a run):
//! it shares that CPU for its run (1.5 ms every 100 ms: a CPU-bound
//! `alloc loop` ran at 5.2-5.4 ns a pair against 5.1 alone) and meets
//! the pace the target's calls met.
//!
//! The choice is pure ([`busiest`]); reading `/proc` and pinning are thin.

use crate::process::procfs::{self, stat, stat_number};

/// Environment variables through which allocators are tuned: the helper
/// gets the target's values so that it runs the allocator as configured.
const TUNING_PREFIXES: [&str; 6] = [
    "MALLOC_",
    "GLIBC_TUNABLES",
    "JE_MALLOC_CONF",
    "_RJEM_MALLOC_CONF",
    "TCMALLOC_",
    "MIMALLOC_",
];

/// The target's allocator-tuning variables (none if unreadable).
pub fn tuning_environment(pid: u32) -> Vec<(String, String)> {
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return Vec::new();
    };
    tuning_of(&raw)
}

fn tuning_of(raw: &[u8]) -> Vec<(String, String)> {
    raw.split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| TUNING_PREFIXES.iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The environment variable that names the target to follow.
pub const FOLLOW_ENV: &str = "MEMPROF_UNTRACED_FOLLOW";

/// A thread as `/proc` shows it: its id, CPU ticks so far, last CPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThreadCpu {
    pub tid: u32,
    pub ticks: u64,
    pub cpu: usize,
}

/// The thread that used the most CPU time since `last` (each thread's
/// ticks then; a thread new since counts all its ticks); `last` becomes
/// `now`. None when no thread ran: the target idles and no CPU is its.
pub fn busiest(now: &[ThreadCpu], last: &mut Vec<(u32, u64)>) -> Option<ThreadCpu> {
    let before = |tid: u32| last.iter().find(|(t, _)| *t == tid).map_or(0, |(_, k)| *k);
    let best = now
        .iter()
        .map(|t| (t.ticks.saturating_sub(before(t.tid)), *t))
        .filter(|(used, _)| *used > 0)
        .max_by_key(|(used, _)| *used)
        .map(|(_, t)| t);
    last.clear();
    last.extend(now.iter().map(|t| (t.tid, t.ticks)));
    best
}

/// Runs between two reads of every thread of the target (1 s).
const SCAN_EVERY: u32 = 10;

/// The target's busiest thread, followed from run to run.
pub struct Follower {
    pid: u32,
    /// Each thread's ticks at the last scan. Sized far above the timed
    /// block's class: kept across runs, a 64-byte vector (4 threads of
    /// 16 bytes) made mimalloc's pairs timed "alone" 2.9 ns for 5.3.
    last: Vec<(u32, u64)>,
    busiest: Option<u32>,
    runs: u32,
}

impl Follower {
    pub fn new(pid: u32) -> Self {
        Self {
            pid,
            last: Vec::with_capacity(4096),
            busiest: None,
            runs: 0,
        }
    }

    /// The CPU to run on now: where the busiest thread last ran (every
    /// thread read at every [`SCAN_EVERY`]th call, or when that thread is
    /// gone); None when no thread of the target ran since the last scan.
    pub fn cpu(&mut self) -> Option<usize> {
        let scan = self.runs.is_multiple_of(SCAN_EVERY);
        self.runs = self.runs.wrapping_add(1);
        if !scan {
            if let Some(t) = self.busiest.and_then(|tid| thread(self.pid, tid)) {
                return Some(t.cpu);
            }
        }
        let now = threads(self.pid);
        let best = busiest(&now, &mut self.last);
        self.busiest = best.map(|t| t.tid);
        best.map(|t| t.cpu)
    }
}

/// The target's threads, read from `/proc` (those gone on the way are
/// left out).
pub fn threads(pid: u32) -> Vec<ThreadCpu> {
    procfs::list_threads(pid)
        .into_iter()
        .filter_map(|tid| thread(pid, tid))
        .collect()
}

/// Thread `tid` of process `pid`, or None when it is gone.
fn thread(pid: u32, tid: u32) -> Option<ThreadCpu> {
    let f = procfs::thread_stat_fields(pid, tid)?;
    Some(ThreadCpu {
        tid,
        ticks: stat_number::<u64>(&f, stat::UTIME)? + stat_number::<u64>(&f, stat::STIME)?,
        cpu: stat_number(&f, stat::PROCESSOR)?,
    })
}

/// Pins the calling thread to `cpu`; false when the kernel refused (a
/// CPU outside the helper's cpuset: it then runs where it may).
pub fn pin(cpu: usize) -> bool {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return false;
    }
    // SAFETY: `cpu` is within the set's bits (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: the set is a valid cpu_set_t of the size passed; pid 0 is
    // the calling thread.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(tid: u32, ticks: u64, cpu: usize) -> ThreadCpu {
        ThreadCpu { tid, ticks, cpu }
    }

    #[test]
    fn only_the_allocators_tuning_is_passed_on() {
        let env = b"PATH=/bin\0MALLOC_CONF=narenas:1\0GLIBC_TUNABLES=glibc.malloc.tcache_count=0\0LD_PRELOAD=/x.so\0HOME=/root\0bad\0";
        let got = tuning_of(env);
        assert_eq!(
            got,
            [
                ("MALLOC_CONF".into(), "narenas:1".into()),
                (
                    "GLIBC_TUNABLES".into(),
                    "glibc.malloc.tcache_count=0".into()
                )
            ]
        );
    }

    #[test]
    fn the_thread_busiest_since_the_last_look_is_followed() {
        let mut last = Vec::new();
        let cpu = |t: Option<ThreadCpu>| t.map(|t| t.cpu);
        // First look: all ticks count; thread 2 has used the most.
        assert_eq!(
            busiest(&[t(1, 10, 0), t(2, 50, 1)], &mut last),
            Some(t(2, 50, 1))
        );
        // Since then thread 1 ran 30 ticks on CPU 3, thread 2 only 5.
        assert_eq!(
            cpu(busiest(&[t(1, 40, 3), t(2, 55, 1)], &mut last)),
            Some(3)
        );
        // A new thread counts all its ticks.
        assert_eq!(
            cpu(busiest(&[t(1, 41, 3), t(2, 55, 1), t(7, 9, 0)], &mut last)),
            Some(0)
        );
        // Nobody ran: no CPU to follow.
        assert_eq!(
            busiest(&[t(1, 41, 3), t(2, 55, 1), t(7, 9, 0)], &mut last),
            None
        );
        assert_eq!(busiest(&[], &mut last), None);
    }

    #[test]
    fn this_process_is_read_and_can_be_pinned_where_it_runs() {
        let me = std::process::id();
        // Two clock ticks of CPU on this thread: it is seen to have run.
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(25) {
            std::hint::black_box(0);
        }
        let threads = threads(me);
        assert!(threads.iter().any(|t| t.tid == me), "{threads:?}");
        // Followed: this process has run, so its busiest thread has a
        // CPU, at a scan and between scans.
        let mut follower = Follower::new(me);
        assert!(follower.cpu().is_some());
        assert_eq!(follower.busiest.is_some(), follower.cpu().is_some());
        // SAFETY: sched_getcpu has no preconditions.
        let here = unsafe { libc::sched_getcpu() };
        let cpu = usize::try_from(here).expect("a CPU number");
        // A thread of its own: the pin is the calling thread's.
        let pinned = std::thread::spawn(move || pin(cpu)).join().unwrap();
        assert!(pinned);
        assert!(!pin(1 << 20));
    }
}

//! The profiler's own cost: its CPU and memory, the records it read from
//! the programs' rings, and how long its BPF programs ran.

use serde::{Deserialize, Serialize};

use crate::kernel::cost::KernelCost;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Loader {
    /// CPU seconds the profiler itself used (user + system).
    pub cpu_s: f64,
    /// `cpu_s / duration_s`: the share of one core the profiler used.
    pub cpu_share: f64,
    /// Peak resident memory of the profiler, in bytes.
    pub peak_rss_bytes: u64,
    /// Records read from the programs' ring buffers, all rings.
    pub ring_events: u64,
    /// `ring_events / duration_s`.
    pub ring_events_per_s: f64,
    /// The same per ring, in the order the rings were opened.
    pub rings: Vec<RingCost>,
    /// Whether the kernel counted the programs' run time: `enabled by
    /// memprof` (for the session), `already on` (system-wide), or
    /// `unavailable: why` (then the `bpf_*` figures are null).
    pub bpf_stats: String,
    /// Nanoseconds our programs ran, all CPUs: the programs' own
    /// instructions, not the cost of entering them (a uprobe's trap).
    pub bpf_run_ns: Option<u64>,
    /// `bpf_run_ns` over the session's nanoseconds: the share of one core
    /// the programs used.
    pub bpf_run_share: Option<f64>,
    /// Times our programs ran.
    pub bpf_runs: Option<u64>,
    /// `bpf_runs / duration_s`.
    pub bpf_runs_per_s: Option<f64>,
    /// Each loaded program, most run time first (empty when not counted).
    pub programs: Vec<ProgramCost>,
    /// How the hot uprobes (allocator, locks) were linked: one
    /// `uprobe_multi` link per program (`uprobe_multi`), `single` links
    /// and why, or `none` (no hot uprobes).
    pub uprobe_links: Option<Mechanism>,
    /// How futex waits were hooked: `sched` (the scheduler's raw
    /// tracepoints: each wait seen as the sleep it is) or `syscalls` (the
    /// futex syscall tracepoints) and why.
    pub futex_hooks: Option<Mechanism>,
}

/// Which of a feature's ways of hooking the kernel was used, and why not
/// the first choice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mechanism {
    pub kind: String,
    /// Why not the first choice (null when it was used).
    pub why: Option<String>,
}

/// Records read from one ring.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RingCost {
    /// The ring's map, in lower case (`lock_events`).
    pub name: String,
    pub events: u64,
    pub per_s: f64,
}

/// How often and how long one program ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramCost {
    pub name: String,
    pub runs: u64,
    pub run_ns: u64,
}

/// The profiler's resource use as the kernel reports it for the process.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub cpu_s: f64,
    pub peak_rss_bytes: u64,
}

impl Usage {
    /// Reads the profiler's own resource usage so far (zero if the
    /// kernel refuses, which it does not for its caller).
    pub fn measure() -> Self {
        // SAFETY: an all-zero rusage is a valid value for getrusage to fill.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `usage` is a valid, writable rusage.
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
            return Self::default();
        }
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Self {
            cpu_s: secs(usage.ru_utime) + secs(usage.ru_stime),
            // Not `ru_maxrss`: the kernel keeps it across `execve`, so it
            // is at least the RSS of the process that forked the
            // profiler (a 300 MiB Python harness made a 1 s session's
            // peak 313 MiB; the test harness, late in a CI run, 159 MiB).
            peak_rss_bytes: peak_rss().unwrap_or(usage.ru_maxrss.max(0) as u64 * 1024),
        }
    }
}

/// This process's peak resident memory (`VmHWM`: of its own address
/// space, since its `execve` or the last reset), in bytes.
pub(crate) fn peak_rss() -> Option<u64> {
    status_kib("VmHWM:").map(|k| k * 1024)
}

/// A figure of this process's `/proc/self/status`, in KiB.
pub(crate) fn status_kib(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `n` per second over `duration_s` (0 before any time has passed).
pub fn per_second(n: f64, duration_s: f64) -> f64 {
    if duration_s > 0.0 {
        n / duration_s
    } else {
        0.0
    }
}

impl Loader {
    /// Reads the profiler's own resource usage so far, with what its
    /// programs cost (`kernel`), over `duration_s`.
    pub fn measure(duration_s: f64, kernel: &KernelCost) -> Self {
        Self::new(Usage::measure(), kernel, duration_s)
    }

    /// The cost from its parts.
    pub fn new(usage: Usage, kernel: &KernelCost, duration_s: f64) -> Self {
        let rings: Vec<RingCost> = kernel
            .rings
            .iter()
            .map(|(name, events)| RingCost {
                name: name.clone(),
                events: *events,
                per_s: per_second(*events as f64, duration_s),
            })
            .collect();
        let ring_events = rings.iter().map(|r| r.events).sum();
        let mut programs: Vec<ProgramCost> = kernel
            .programs
            .iter()
            .flatten()
            .map(|p| ProgramCost {
                name: p.name.clone(),
                runs: p.runs,
                run_ns: p.run_ns,
            })
            .collect();
        programs.sort_by(|a, b| b.run_ns.cmp(&a.run_ns).then(a.name.cmp(&b.name)));
        let counted = kernel.programs.is_some();
        let bpf_run_ns = counted.then(|| programs.iter().map(|p| p.run_ns).sum::<u64>());
        let bpf_runs = counted.then(|| programs.iter().map(|p| p.runs).sum::<u64>());
        Self {
            cpu_s: usage.cpu_s,
            cpu_share: per_second(usage.cpu_s, duration_s),
            peak_rss_bytes: usage.peak_rss_bytes,
            ring_events,
            ring_events_per_s: per_second(ring_events as f64, duration_s),
            rings,
            bpf_stats: kernel.bpf_stats.clone(),
            bpf_run_ns,
            bpf_run_share: bpf_run_ns.map(|ns| per_second(ns as f64 / 1e9, duration_s)),
            bpf_runs,
            bpf_runs_per_s: bpf_runs.map(|n| per_second(n as f64, duration_s)),
            programs,
            uprobe_links: kernel.links.as_ref().map(|l| Mechanism {
                kind: l.kind.into(),
                why: l.why.clone(),
            }),
            futex_hooks: kernel.futex_hooks.as_ref().map(|h| Mechanism {
                kind: h.kind.into(),
                why: h.why.clone(),
            }),
        }
    }

    /// A note for the report when the programs' run time is unknown.
    pub fn note(&self) -> Option<String> {
        self.bpf_run_ns.is_none().then(|| {
            format!(
                "the BPF programs' run time is unknown: bpf_stats {}",
                self.bpf_stats
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::cost::ProgramRun;

    fn run(name: &str, runs: u64, run_ns: u64) -> ProgramRun {
        ProgramRun {
            name: name.into(),
            runs,
            run_ns,
        }
    }

    #[test]
    fn loader_measures_itself() {
        let l = Loader::measure(1.0, &KernelCost::default());
        assert!(l.peak_rss_bytes > 0);
        assert!(l.cpu_s >= 0.0);
        assert_eq!(Loader::measure(0.0, &KernelCost::default()).cpu_share, 0.0);
    }

    #[test]
    fn rates_are_per_second_of_the_session() {
        let kernel = KernelCost {
            rings: vec![("samples".into(), 300), ("lock_events".into(), 900)],
            bpf_stats: "enabled by memprof".into(),
            programs: Some(vec![run("a", 10, 1_000), run("b", 30, 3_000_000)]),
            links: None,
            futex_hooks: None,
        };
        let usage = Usage {
            cpu_s: 0.5,
            peak_rss_bytes: 7,
        };
        let l = Loader::new(usage, &kernel, 2.0);
        assert_eq!(l.cpu_share, 0.25);
        assert_eq!(l.ring_events, 1_200);
        assert_eq!(l.ring_events_per_s, 600.0);
        assert_eq!(l.rings[1].name, "lock_events");
        assert_eq!(l.rings[1].per_s, 450.0);
        assert_eq!(l.bpf_run_ns, Some(3_001_000));
        assert_eq!(l.bpf_run_share, Some(0.0015005));
        assert_eq!(l.bpf_runs, Some(40));
        assert_eq!(l.bpf_runs_per_s, Some(20.0));
        assert_eq!(l.programs[0].name, "b", "most run time first");
        assert_eq!(l.note(), None);
    }

    #[test]
    fn uncounted_run_time_is_unknown_not_zero() {
        let kernel = KernelCost {
            rings: vec![],
            bpf_stats: "unavailable: the kernel refused".into(),
            programs: None,
            links: None,
            futex_hooks: None,
        };
        let l = Loader::new(Usage::default(), &kernel, 1.0);
        assert_eq!(l.bpf_run_ns, None);
        assert_eq!(l.bpf_run_share, None);
        assert_eq!(l.bpf_runs, None);
        assert!(l.programs.is_empty());
        let json = serde_json::to_value(&l).unwrap();
        assert!(json["bpf_run_ns"].is_null() && json["bpf_run_share"].is_null());
        assert!(l
            .note()
            .unwrap()
            .contains("unavailable: the kernel refused"));
        assert_eq!(
            Loader::new(Usage::default(), &kernel, 0.0).ring_events_per_s,
            0.0
        );
    }
}

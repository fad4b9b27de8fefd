//! The CPU sampler's perf events: one per traced thread, or one per CPU.
//!
//! Per thread the timer runs only while a traced thread runs, and threads
//! the traced ones start later inherit the event and its program. Per CPU
//! it runs all the time, idle CPUs included, and the program drops what
//! is not ours. Which one costs the target less depends on how its events
//! came to be, measured on this project's VMs (2 vCPUs, `haltpoll` idle,
//! no PMU, 999 Hz):
//!
//! - **A launched command** inherits one event from its first thread, so
//!   its threads' perf contexts are clones, and the kernel swaps them at a
//!   context switch between two of them instead of stopping one timer and
//!   starting the other. Per thread costs a futex hand-off loop (`locks
//!   contended_bench 2`) 1.24x and a lock/yield loop 1.03x; per CPU 1.70x
//!   and 1.59x (idle CPUs woken by the timer), bpftrace's `profile:hz:999`
//!   alike. Launched commands are sampled per thread.
//! - **Attached with `-p`**, each running thread gets an event of its own:
//!   no clones, so every context switch of a traced thread stops its timer
//!   and starts the next one (on a VM, reprogramming the timer traps to
//!   the hypervisor: the likely reason it costs this much, inferred, not
//!   measured apart). Debian `sysbench threads --threads=2 --thread-locks=2` pinned to
//!   one CPU (two threads taking turns with `sched_yield`) kept **0.11** of
//!   its throughput per thread (`perf record -p` alike: 0.10 at 1 ms, 0.29
//!   at 10 ms) and 0.93 per CPU; `sysbench threads --threads=4
//!   --thread-locks=1` 0.67-0.75 per thread and 0.79-0.88 per CPU; a
//!   contended 2-thread mutex and a spinning thread nothing either way.
//!   Attached processes are sampled per CPU.
//!
//! Per CPU too for `--cgroup`, whose processes come and go, and beyond
//! [`MAX_THREAD_EVENTS`].

use aya::programs::{
    perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy},
    PerfEvent, ProgramError,
};

use super::detach::OwnedLinks;
use crate::process::procfs::list_threads;

/// Most per-thread events opened (a file descriptor each); beyond, the
/// sampler is per CPU.
pub const MAX_THREAD_EVENTS: usize = 4096;

/// How the CPU sampler is attached.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    pub frequency_hz: u64,
    /// Hardware cycles when the machine has a PMU.
    pub try_hardware: bool,
    pub scope: SamplerScope,
    /// What one `cpu-clock` interrupt costs the thread it lands on, ns
    /// ([`super::interrupts`]), measured before the programs load.
    pub interrupt_ns: Option<f64>,
}

impl Sampling {
    /// For the main process `pid` and `others`: per thread unless
    /// `per_cpu` (see [`per_cpu`] and [`SamplerScope::choose`]).
    pub fn new(
        frequency_hz: u64,
        try_hardware: bool,
        pid: u32,
        others: &[u32],
        per_cpu: bool,
    ) -> crate::error::Result<Self> {
        // First: threads the target starts after they are listed (below)
        // would get no event of their own.
        let interrupt_ns = super::interrupts::measure();
        let tgids: Vec<u32> = std::iter::once(pid).chain(others.iter().copied()).collect();
        let cpus =
            aya::util::online_cpus().map_err(|(what, e)| anyhow::anyhow!("reading {what}: {e}"))?;
        Ok(Self {
            frequency_hz,
            try_hardware,
            scope: SamplerScope::choose(&tgids, per_cpu, cpus, list_threads),
            interrupt_ns,
        })
    }
}

/// Whether the sampler is per CPU whatever the thread count: for a
/// target attached to rather than `launched` (its threads' events would be
/// no clones: see the module's measurements), and for a `cgroup`.
pub fn per_cpu(launched: bool, cgroup: bool) -> bool {
    !launched || cgroup
}

/// Where the sampler's events are opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SamplerScope {
    /// One per online CPU, every process (the program filters).
    Cpus(Vec<u32>),
    /// One per thread, inherited by the threads and processes they start.
    Threads(Vec<u32>),
}

impl SamplerScope {
    /// Per thread for the threads of `tgids` now, unless there are more
    /// than [`MAX_THREAD_EVENTS`] or `per_cpu` is asked; per CPU then.
    /// `threads` lists a process's threads.
    pub fn choose(
        tgids: &[u32],
        per_cpu: bool,
        cpus: Vec<u32>,
        threads: impl Fn(u32) -> Vec<u32>,
    ) -> Self {
        if per_cpu {
            return Self::Cpus(cpus);
        }
        let tids: Vec<u32> = tgids.iter().flat_map(|&t| threads(t)).collect();
        if tids.is_empty() || tids.len() > MAX_THREAD_EVENTS {
            tracing::info!(
                "{} threads: CPU sampling per CPU rather than per thread",
                tids.len()
            );
            Self::Cpus(cpus)
        } else {
            Self::Threads(tids)
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::Cpus(_) => "per CPU",
            Self::Threads(_) => "per thread",
        }
    }

    /// Attaches `prog` to a `config` event in each place of the scope,
    /// all or none; the links go to `owned` as one (closed together).
    pub fn attach(
        &self,
        prog: &mut PerfEvent,
        config: PerfEventConfig,
        frequency_hz: u64,
        owned: &mut OwnedLinks,
    ) -> Result<(), ProgramError> {
        let (places, inherit) = match self {
            Self::Cpus(cpus) => (cpus, false),
            Self::Threads(tids) => (tids, true),
        };
        // A `cpu-clock` period is in nanoseconds: the rate is exact from
        // the first sample, where frequency mode starts each thread's
        // event from a guess and adjusts it as the thread runs.
        let policy = match config {
            PerfEventConfig::Software(_) => {
                SamplePolicy::Period(1_000_000_000 / frequency_hz.max(1))
            }
            _ => SamplePolicy::Frequency(frequency_hz),
        };
        let mut links = Vec::with_capacity(places.len());
        for &place in places {
            let scope = match self {
                Self::Cpus(_) => PerfEventScope::AllProcessesOneCpu { cpu: place },
                Self::Threads(_) => PerfEventScope::OneProcess {
                    pid: place,
                    cpu: None,
                },
            };
            match prog.attach(config, scope, policy, inherit) {
                Ok(link) => links.push(link),
                // A thread that exited since it was listed.
                Err(ProgramError::SyscallError(e))
                    if matches!(self, Self::Threads(_))
                        && e.io_error.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => {
                    for link in links {
                        let _ = prog.detach(link);
                    }
                    return Err(e);
                }
            }
        }
        let mut taken = Vec::with_capacity(links.len());
        for id in links {
            taken.push(prog.take_link(id)?);
        }
        owned.push(taken);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_thread_only_for_a_launched_command_outside_a_cgroup() {
        assert!(
            !per_cpu(true, false),
            "launched: inherited, cloned contexts"
        );
        assert!(per_cpu(false, false), "attached with -p");
        assert!(per_cpu(true, true) && per_cpu(false, true), "--cgroup");
    }

    #[test]
    fn threads_of_the_traced_processes_unless_per_cpu_or_too_many() {
        let threads = |tgid| match tgid {
            10 => vec![10, 11, 12],
            20 => vec![20],
            1000 => (1000..1000 + MAX_THREAD_EVENTS as u32 + 1).collect(),
            _ => vec![],
        };
        let cpus = vec![0, 1];
        let choose =
            |tgids: &[u32], per_cpu| SamplerScope::choose(tgids, per_cpu, cpus.clone(), threads);
        assert_eq!(
            choose(&[10, 20], false),
            SamplerScope::Threads(vec![10, 11, 12, 20])
        );
        assert_eq!(
            choose(&[10], true),
            SamplerScope::Cpus(cpus.clone()),
            "asked (--cgroup)"
        );
        assert_eq!(
            choose(&[99], false),
            SamplerScope::Cpus(cpus.clone()),
            "gone: no thread to open an event on"
        );
        assert_eq!(
            choose(&[1000], false),
            SamplerScope::Cpus(cpus.clone()),
            "too many"
        );
    }
}

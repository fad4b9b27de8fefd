//! The kernel side: system checks, the BPF loader, uprobe windows and
//! their budget.

pub mod budget;
pub mod calls;
pub mod contention;
pub mod cost;
pub mod cputime;
pub mod detach;
pub mod hooks;
pub mod interrupts;
pub mod loader;
pub mod maps;
pub mod multi;
pub mod precise;
pub mod preflight;
pub mod rings;
pub mod sampler;
pub mod spread;
pub mod tracefs;
pub mod uprobes;
pub mod windows;

use memprof_common::KernelStats;

use cost::{BpfStats, KernelCost};
use loader::Probes;
use maps::Counters;

/// The programs while attached, and what was read from them when they
/// were detached: one value, so the report reads the same either way.
#[derive(Default)]
pub struct Kernel {
    pub probes: Option<Probes>,
    /// The run-time statistics, on while the programs run.
    bpf_stats: Option<BpfStats>,
    counters: Counters,
    stats: Vec<(u32, KernelStats)>,
    cost: KernelCost,
}

impl Kernel {
    pub fn new(probes: Probes, bpf_stats: BpfStats) -> Self {
        Self {
            probes: Some(probes),
            bpf_stats: Some(bpf_stats),
            counters: Counters::default(),
            stats: Vec::new(),
            cost: KernelCost::default(),
        }
    }

    /// What the programs cost so far (or up to when they were detached).
    pub fn cost(&self) -> KernelCost {
        let Some(probes) = &self.probes else {
            return self.cost.clone();
        };
        let state = self.bpf_stats.as_ref().map(|s| &s.state);
        KernelCost {
            rings: probes.rings.snapshot(),
            bpf_stats: state.map_or_else(|| "unavailable: not requested".into(), |s| s.label()),
            programs: state
                .is_some_and(|s| s.counting())
                .then(|| probes.program_runs()),
            links: Some(probes.link_mode.clone()),
            futex_hooks: Some(probes.futex_hooks.clone()),
        }
    }

    pub fn counters(&self) -> Counters {
        self.probes.as_ref().map_or(self.counters, Probes::counters)
    }

    /// Page faults and `mmap_lock` waits per thread of the target.
    pub fn stats(&self) -> Vec<(u32, KernelStats)> {
        match &self.probes {
            Some(p) => p.kernel_stats(),
            None => self.stats.clone(),
        }
    }

    /// Reads the last counters and costs and detaches every program.
    pub fn detach(&mut self) {
        self.cost = self.cost();
        if let Some(mut probes) = self.probes.take() {
            self.stats = probes.kernel_stats();
            self.counters = probes.counters();
            probes.flush_logs();
            drop(probes);
        }
        // The programs are gone: the kernel may stop counting.
        if let Some(stats) = &mut self.bpf_stats {
            stats.close();
        }
    }
}

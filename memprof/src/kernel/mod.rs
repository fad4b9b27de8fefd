//! The kernel side: system checks, the BPF loader, uprobe windows and
//! their budget.

pub mod budget;
pub mod contention;
pub mod loader;
pub mod maps;
pub mod precise;
pub mod preflight;
pub mod rings;
pub mod tracefs;
pub mod uprobes;
pub mod windows;

use memprof_common::KernelStats;

use loader::Probes;
use maps::Counters;

/// The programs while attached, and what was read from them when they
/// were detached: one value, so the report reads the same either way.
#[derive(Default)]
pub struct Kernel {
    pub probes: Option<Probes>,
    counters: Counters,
    stats: Vec<(u32, KernelStats)>,
}

impl Kernel {
    pub fn new(probes: Probes) -> Self {
        Self {
            probes: Some(probes),
            counters: Counters::default(),
            stats: Vec::new(),
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

    /// Reads the last counters and detaches every program.
    pub fn detach(&mut self) {
        if let Some(mut probes) = self.probes.take() {
            self.stats = probes.kernel_stats();
            self.counters = probes.counters();
            probes.flush_logs();
            drop(probes);
        }
    }
}

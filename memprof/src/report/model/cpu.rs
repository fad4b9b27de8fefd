//! How the session sampled, and what the CPU profile found: hot
//! functions and threads.

use serde::{Deserialize, Serialize};

use super::source_label;

schema_enum! {
    /// The event that drove sampling, and so gave the data addresses.
    pub enum SampleSource {
        /// Software timer (works everywhere, including VMs without a PMU).
        CpuClock = "cpu-clock",
        /// Hardware cycle counter.
        Cycles = "cycles",
        /// The kernel's scheduler tick (no interrupt of the tool's own).
        Tick = "tick",
        /// Intel's precise memory events.
        Pebs = "pebs",
        /// AMD's instruction-based sampling.
        Ibs = "ibs",
    }
}

impl SampleSource {
    /// The source of a session's data addresses: the precise memory events
    /// named `precise` ("pebs", "ibs") when they were used, else the
    /// sampling event.
    pub fn of(sampling: crate::kernel::loader::SamplingSource, precise: Option<&str>) -> Self {
        precise
            .and_then(Self::from_name)
            .unwrap_or_else(|| sampling.into())
    }
}

impl From<crate::kernel::loader::SamplingSource> for SampleSource {
    fn from(source: crate::kernel::loader::SamplingSource) -> Self {
        use crate::kernel::loader::SamplingSource;
        match source {
            SamplingSource::Cycles => SampleSource::Cycles,
            SamplingSource::CpuClock => SampleSource::CpuClock,
            SamplingSource::Tick => SampleSource::Tick,
        }
    }
}

schema_enum! {
    /// Where the sampling timer runs.
    pub enum SamplingScope {
        /// One event per traced thread, inherited by the threads it
        /// starts: `frequency_hz` per thread while it runs, none while it
        /// sleeps.
        Threads = "threads",
        /// One event per CPU, every process (attached with `-p` to threads
        /// that switch often, `--cgroup`, or more threads than the
        /// per-thread events allow): `frequency_hz` per CPU.
        Cpus = "cpus",
    }
}

impl SamplingScope {
    /// How the summary says it: "per thread", "per CPU".
    pub fn per(self) -> &'static str {
        match self {
            SamplingScope::Threads => "per thread",
            SamplingScope::Cpus => "per CPU",
        }
    }

    /// Whose time the timer's interrupts take: "sampled thread" (its
    /// running time), "CPU" (every process on it, the target's threads
    /// among them).
    pub fn whose(self) -> &'static str {
        match self {
            SamplingScope::Threads => "sampled thread",
            SamplingScope::Cpus => "CPU",
        }
    }
}

impl From<&crate::kernel::sampler::SamplerScope> for SamplingScope {
    fn from(scope: &crate::kernel::sampler::SamplerScope) -> Self {
        use crate::kernel::sampler::SamplerScope;
        match scope {
            SamplerScope::Threads(_) => SamplingScope::Threads,
            SamplerScope::Cpus(_) => SamplingScope::Cpus,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sampling {
    /// The sampling event ("cpu-clock", "cycles"), or the precise memory
    /// events ("pebs", "ibs") when they gave the data addresses.
    pub source: SampleSource,
    pub frequency_hz: u64,
    /// Whether `frequency_hz` is per traced thread or per CPU.
    pub scope: SamplingScope,
    /// Samples of the target's threads received.
    pub samples: u64,
    /// Samples lost (ring buffer full or busy, or dropped in userspace).
    pub lost: u64,
    /// Thread creation/exit/exec events lost the same way.
    pub lost_thread_events: u64,
    /// Samples whose user stack was lost to a full stack map; they count
    /// for their own function but not for its callers' total time.
    pub stack_errors: u64,
    /// Samples taken while the thread was in the kernel.
    pub kernel_samples: u64,
    /// Where the data addresses of samples came from, and how many did.
    pub addresses: AddressSampling,
    /// What one timer sample took from the thread it landed on, in ns:
    /// the interrupt around the program, measured at start-up
    /// ([`crate::kernel::interrupts`]). Null for the cycle counter and
    /// the precise events (`pebs`, `ibs`), or when it could not be
    /// measured.
    #[serde(default)]
    pub interrupt_ns: Option<f64>,
    /// `interrupt_ns × frequency_hz`: the share of a sampled thread's
    /// running time (of each CPU's, per CPU: every process's) the
    /// sampler's interrupts take, before any delay they pass on to
    /// threads waiting for it.
    #[serde(default)]
    pub interrupt_share: Option<f64>,
    /// Attached: the target's context switches a second at start-up, which
    /// chose the scope (per CPU from
    /// [`crate::kernel::sampler::SWITCHY_PER_S`]). Null when launched or
    /// with `--cgroup`.
    #[serde(default)]
    pub switches_per_s: Option<f64>,
}

impl Sampling {
    /// How a session samples, before anything was received.
    pub fn new(source: SampleSource, frequency_hz: u64, scope: SamplingScope) -> Self {
        Self {
            source,
            frequency_hz,
            scope,
            samples: 0,
            lost: 0,
            lost_thread_events: 0,
            stack_errors: 0,
            kernel_samples: 0,
            addresses: AddressSampling::default(),
            interrupt_ns: None,
            interrupt_share: None,
            switches_per_s: None,
        }
    }

    /// Records what the sampler measured at start-up.
    pub fn set_measured(&mut self, m: crate::kernel::sampler::StartMeasures) {
        self.set_interrupt_cost(m.interrupt_ns);
        self.switches_per_s = m.switches_per_s;
    }

    /// Records the measured cost of one `cpu-clock` sample, and its share
    /// at the session's rate; none for another source (the cycle
    /// counter's and the precise events' interrupt, an NMI, is another
    /// cost, not measured).
    pub fn set_interrupt_cost(&mut self, ns: Option<f64>) {
        self.interrupt_ns = ns.filter(|_| self.source == SampleSource::CpuClock);
        self.interrupt_share = self
            .interrupt_ns
            .map(|ns| Self::share_at(ns, self.frequency_hz));
    }

    /// The share of a second `hz` interrupts of `ns` each take.
    fn share_at(ns: f64, hz: u64) -> f64 {
        ns * hz as f64 / 1e9
    }

    /// A note when the sampler's interrupts alone take a share of the
    /// target that matters (from [`COSTLY_SAMPLER`]), with the rate that
    /// would take a fifth of it.
    pub fn cost_note(&self) -> Option<String> {
        let (ns, share) = (self.interrupt_ns?, self.interrupt_share?);
        if share < COSTLY_SAMPLER {
            return None;
        }
        let lower = (self.frequency_hz / 5).max(1);
        Some(format!(
            "the sampler's timer interrupts take about {:.1}% of each {}'s time on this \
             machine ({:.1} µs each at {} Hz, measured this boot; virtual machines pay the \
             hypervisor for every timer interrupt, a cost that moves with the host's load), \
             and more on lock convoys, where a holder stopped by one stops its waiters: \
             --sample-freq {lower} would take about {:.1}%",
            share * 100.0,
            self.scope.whose(),
            ns / 1e3,
            self.frequency_hz,
            Self::share_at(ns, lower) * 100.0,
        ))
    }
}

/// The sampler's own share of a thread's time from which the report says
/// so (a fifth of the default budget of 5%).
pub const COSTLY_SAMPLER: f64 = 0.01;

/// Where the data addresses of samples came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AddressMode {
    /// Computed from the sampled registers and the decoded instruction
    /// (timer sampling, no PMU).
    #[default]
    Decoded,
    /// Given by the CPU (PEBS, IBS).
    Precise,
}

impl std::fmt::Display for AddressMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AddressMode::Decoded => "decoded",
            AddressMode::Precise => "precise",
        })
    }
}

/// Data addresses of samples (the false-sharing input).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AddressSampling {
    /// "decoded" or "precise" (see [`AddressMode`]).
    pub mode: AddressMode,
    /// Samples of the target's threads in user mode.
    pub user_samples: u64,
    /// Of those: an address was computed.
    pub with_address: u64,
    /// The instruction had no usable memory operand (arithmetic, branch,
    /// TLS, ...).
    pub no_operand: u64,
    /// The instruction was not decoded yet (its first samples).
    pub not_decoded: u64,
    /// Of `with_address`: computed through a backward slice that read the
    /// overwritten base register back from memory (`*(rbp - 0x10) + 8`).
    pub through_slice: u64,
    /// Samples whose slice could not read that memory (not placed).
    pub slice_faults: u64,
    /// `with_address / user_samples`.
    pub address_share: f64,
    /// Distinct instructions decoded, and how many access memory.
    pub instructions_decoded: usize,
    pub instructions_with_operand: usize,
    /// Cache lines in the kernel's table at the end, and lines the table
    /// dropped (least recently sampled) to make room.
    pub lines_tracked: u64,
    pub lines_evicted: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HotFunctionEntry {
    pub function: String,
    /// Source file of the hottest line in the function, when known.
    pub file: Option<String>,
    /// The source line in the function that collected the most samples.
    pub line: Option<u32>,
    pub module: String,
    pub samples: u64,
    /// Fraction of all samples (0..1).
    pub share: f64,
    /// Samples with the function anywhere on the stack (needs frame
    /// pointers in the target for callers to be seen).
    pub total_samples: u64,
    /// `total_samples` as a fraction of all samples.
    pub total_share: f64,
}

impl ThreadEntry {
    /// `4711`, or `4711 (ns 12)` in another pid namespace.
    pub fn tid_label(&self) -> String {
        match self.ns_tid {
            Some(ns) => format!("{} (ns {ns})", self.tid),
            None => self.tid.to_string(),
        }
    }
}

impl HotFunctionEntry {
    /// `file.c:12`, or `(module)` without debug info, for display.
    pub fn source_label(&self) -> String {
        source_label(self.file.as_deref(), self.line, &self.module)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadEntry {
    /// The thread's id, as this machine (the tracer's pid namespace) sees
    /// it.
    pub tid: u32,
    /// Its process's id, likewise.
    pub pid: u32,
    /// Its id in the target's pid namespace (a container's), when that
    /// differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns_tid: Option<u32>,
    pub name: String,
    pub samples: u64,
    /// The thread that created it, when that happened during the session.
    pub created_by: Option<u32>,
    pub exited: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling(frequency_hz: u64) -> Sampling {
        Sampling::new(SampleSource::CpuClock, frequency_hz, SamplingScope::Threads)
    }

    #[test]
    fn a_costly_sampler_is_said_with_a_cheaper_rate() {
        let mut s = sampling(999);
        assert_eq!(s.cost_note(), None, "not measured: nothing said");
        // 14 µs at 999 Hz: 1.4%, and a fifth of the rate a fifth of it.
        s.set_interrupt_cost(Some(14_000.0));
        assert!((s.interrupt_share.unwrap() - 0.013986).abs() < 1e-9);
        let note = s.cost_note().unwrap();
        assert!(note.contains("about 1.4% of each sampled thread"), "{note}");
        assert!(note.contains("14.0 µs each at 999 Hz"), "{note}");
        assert!(
            note.contains("--sample-freq 199 would take about 0.3%"),
            "{note}"
        );
        // Bare metal: 1.5 µs, 0.15%.
        s.set_interrupt_cost(Some(1_500.0));
        assert_eq!(s.cost_note(), None);
        // A low rate, however costly each interrupt.
        let mut low = sampling(99);
        low.set_interrupt_cost(Some(14_000.0));
        assert_eq!(low.cost_note(), None);
        s.set_interrupt_cost(None);
        assert_eq!((s.interrupt_ns, s.interrupt_share), (None, None));
        let mut cycles = Sampling {
            source: SampleSource::Cycles,
            ..sampling(999)
        };
        cycles.set_interrupt_cost(Some(14_000.0));
        assert_eq!((cycles.interrupt_ns, cycles.interrupt_share), (None, None));
    }
}

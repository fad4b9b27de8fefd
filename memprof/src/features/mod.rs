//! The analyses, one directory each, behind one seam: the [`Feature`]
//! trait, which the session runs without knowing which analyses there are.
//!
//! A feature says what it needs loaded ([`Plan`]), then attaches its probes,
//! drains its rings, handles its deadlines, finishes, and contributes its
//! part of the report. Its analysis (`analysis.rs`) is pure: plain event
//! structs in, no BPF, no I/O, unit-tested.

pub mod alloc;
pub mod cache;
pub mod cpu;
pub mod locks;
pub mod sharing;
#[cfg(test)]
mod toy;

use std::{
    task::{Context, Poll},
    time::Instant,
};

use memprof_common::{KernelStats, SampleEvent};

use crate::process::threads::ThreadEvent;
use crate::{
    error::Result,
    heap::Heap,
    kernel::{
        loader::{Load, Probes},
        maps::Counters,
        windows::Detaching,
    },
    object::symbolize::Symbolizer,
    options::Options,
    process::state::Process,
    report::{section::SectionKind, Report},
};

/// The analyses, in the order they contribute to the report. A new
/// analysis is one more line here.
pub const SLICES: &[Slice] = &[
    Slice::new("cpu", cpu::plan),
    Slice::new("sharing", sharing::plan),
    Slice {
        name: "cache",
        plan: cache::plan,
        sections: &[cache::section::KIND],
    },
    Slice::new("alloc", alloc::plan),
    Slice::new("locks", locks::plan),
    #[cfg(test)]
    toy::SLICE,
];

/// One analysis as a session lists it: how it plans, and how the report
/// [`crate::report::section::Section`]s it writes are read back.
pub struct Slice {
    pub name: &'static str,
    pub plan: fn(&Options, &Target<'_>, &mut Vec<String>) -> Box<dyn Plan>,
    pub sections: &'static [SectionKind],
}

impl Slice {
    /// An analysis whose part of the report is in the common model.
    pub const fn new(
        name: &'static str,
        plan: fn(&Options, &Target<'_>, &mut Vec<String>) -> Box<dyn Plan>,
    ) -> Self {
        Self {
            name,
            plan,
            sections: &[],
        }
    }
}

/// The features of a session, in the order they contribute to the report.
pub fn plans(opts: &Options, target: &Target<'_>, notes: &mut Vec<String>) -> Vec<Box<dyn Plan>> {
    SLICES
        .iter()
        .map(|s| (s.plan)(opts, target, notes))
        .collect()
}

/// What the session loads: what every session needs, and what each
/// feature asks for.
pub fn load(opts: &Options, plans: &[Box<dyn Plan>]) -> Load {
    let mut load = Load {
        follow_children: opts.follow_children,
        single_links: opts.experimental.single_uprobe_links,
        syscall_futex_hooks: opts.experimental.syscall_futex_hooks,
        ..Load::default()
    };
    plans.iter().for_each(|p| p.load(&mut load));
    load
}

/// What a feature may look at while it plans: the process it will trace.
pub struct Target<'a> {
    pub pid: u32,
    /// What the launched command finally runs (None when attached).
    pub launched: Option<&'a crate::process::command::FinalCommand>,
}

/// A feature before the programs are loaded.
pub trait Plan {
    /// Asks for the programs and load-time settings the feature needs.
    fn load(&self, _load: &mut Load) {}
    /// Takes the feature's rings from the loaded programs and attaches
    /// what it attaches itself.
    fn start(
        self: Box<Self>,
        probes: &mut Probes,
        process: &mut Process,
    ) -> Result<Box<dyn Feature>>;
}

/// What a feature reads when it writes its part of the report.
pub struct ReportContext<'a> {
    /// The programs, while attached (None once detached).
    pub probes: Option<&'a Probes>,
    /// The kernel's counters (live, or as read when detaching).
    pub counters: &'a Counters,
    /// The kernel's own threads' statistics.
    pub kernel_stats: &'a [(u32, KernelStats)],
    pub process: &'a mut Process,
    pub symbolizer: &'a mut Symbolizer,
    /// The session's heap ([`Heap`]), when a feature keeps it.
    pub heap: Option<&'a dyn Heap>,
    /// Notes for the reader, in the order the features add them.
    pub notes: &'a mut Vec<String>,
    /// The command was launched (its first exec is our gate's).
    pub launched: bool,
    pub duration_s: f64,
}

/// Lets tests and views reach a feature's own type behind `dyn Feature`.
pub trait AsAny {
    fn as_any(&self) -> &dyn std::any::Any;
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

impl<T: std::any::Any> AsAny for T {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// One analysis, as the session runs it. Every hook but `report` does
/// nothing unless the feature needs it.
pub trait Feature: AsAny {
    /// A thread appeared, exited or exec'd (or existed at attach).
    fn on_thread(&mut self, _ev: &ThreadEvent, _process: &mut Process) {}
    /// A sample of the target (a CPU sample, or a precise memory event),
    /// past the launch gate.
    fn on_sample(&mut self, _ev: &SampleEvent, _process: &mut Process) {}
    /// Ready when one of the feature's rings has records.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Pending
    }
    /// Hands the records waiting in the feature's rings to its analysis,
    /// a batch at a time ([`crate::kernel::rings::drain_batch`]); true when
    /// more may wait.
    fn drain(&mut self, _process: &mut Process) -> bool {
        false
    }
    /// After each drain: give the programs what the drained records asked
    /// for.
    fn after_drain(&mut self, _probes: &mut Probes, _process: &mut Process) {}
    /// When the feature wants to be called back (a uprobe window).
    fn deadline(&self) -> Option<Instant> {
        None
    }
    /// The deadline came.
    fn on_deadline(&mut self, _probes: &mut Probes, _notes: &mut Vec<String>) {}
    /// Whether the feature re-attaches probes while tracing (which needs
    /// privileges kept after attaching).
    fn windowed(&self) -> bool {
        false
    }
    /// Resolves what could not be resolved when it came; `heap` is the
    /// session's heap, as another feature keeps it.
    fn settle(&mut self, _process: &mut Process, _heap: Option<&dyn Heap>) {}
    /// Tracing stops: stop the feature's probes and read what only the
    /// programs know, before they are detached.
    fn finish(&mut self, _probes: &mut Probes, _process: &mut Process) {}
    /// The heap this feature keeps (the allocator's live blocks), for
    /// the features that name memory.
    fn heap(&self) -> Option<&dyn Heap> {
        None
    }
    /// Writes the feature's part of the report.
    fn report(&mut self, ctx: &mut ReportContext<'_>, report: &mut Report);
    /// The probes the kernel is still removing.
    fn take_detaching(&mut self) -> Detaching {
        Detaching::default()
    }
}

/// Calls `f` on each feature with the heap another feature keeps.
pub fn each_with_heap(
    features: &mut [Box<dyn Feature>],
    mut f: impl FnMut(&mut dyn Feature, Option<&dyn Heap>),
) {
    for i in 0..features.len() {
        let (before, rest) = features.split_at_mut(i);
        let Some((me, after)) = rest.split_first_mut() else {
            return;
        };
        let heap = before.iter().chain(after.iter()).find_map(|g| g.heap());
        f(me.as_mut(), heap);
    }
}

/// A fast hasher for the per-event maps of the analyses (addresses and
/// small keys): std's SipHash resists hash flooding, which the target's own
/// addresses cannot mount, at several times the cost, and the loader hashes
/// a few keys per allocator call.
#[derive(Debug, Default, Clone, Copy)]
pub struct FastHasher(u64);

const MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

impl std::hash::Hasher for FastHasher {
    fn finish(&self) -> u64 {
        // Fold the well-mixed high bits down: aligned addresses have zero
        // low bits, and so does their product.
        self.0 ^ (self.0 >> 29)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(MULTIPLIER);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A `HashMap` with [`FastHasher`].
pub type FastMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<FastHasher>>;
/// A `HashSet` with [`FastHasher`].
pub type FastSet<K> = std::collections::HashSet<K, std::hash::BuildHasherDefault<FastHasher>>;

/// A latency histogram: 1 ns to about 18 minutes, 3 significant digits.
pub fn latency_histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 1 << 40, 3).expect("static bounds are valid")
}

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, BuildHasherDefault};

    use super::*;

    #[test]
    fn aligned_addresses_spread_over_buckets() {
        let build = BuildHasherDefault::<FastHasher>::default();
        let mut low_bits = std::collections::HashSet::new();
        for i in 0..1024u64 {
            low_bits.insert(build.hash_one(0x5555_0000_0000 + i * 64) & 1023);
        }
        assert!(low_bits.len() > 600, "{} distinct of 1024", low_bits.len());
    }
}

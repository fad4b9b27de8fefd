//! The report's allocator section: latency per split, syscalls, the
//! memory account, the top sites and the kernel-side cost per thread.

use memprof_common::{alloc_op, KernelStats};

use super::tracer::AllocTracer;
use crate::{
    cli::AllocMode,
    features::alloc::analysis::{AllocProfile, Class, Origin, Phase, SiteStats},
    kernel::windows::Windowed,
    object::symbolize::Frame,
    process::maps::Place,
    report::model::{
        AllocOp, AllocatorReport, BlockOrigin, KernelThreadEntry, MemoryReport, OpStats, SiteEntry,
        SizeClass, Syscall, SyscallStats, ThreadPhase, TraceMode,
    },
};

impl From<Class> for SizeClass {
    fn from(class: Class) -> Self {
        match class {
            Class::Small => SizeClass::Small,
            Class::Large => SizeClass::Large,
            Class::Unknown => SizeClass::Unknown,
        }
    }
}

impl From<Origin> for BlockOrigin {
    fn from(origin: Origin) -> Self {
        match origin {
            Origin::New => BlockOrigin::New,
            Origin::Reused => BlockOrigin::Reused,
        }
    }
}

impl From<Phase> for ThreadPhase {
    fn from(phase: Phase) -> Self {
        match phase {
            Phase::Serial => ThreadPhase::Serial,
            Phase::Parallel => ThreadPhase::Parallel,
        }
    }
}

impl From<AllocMode> for TraceMode {
    fn from(mode: AllocMode) -> Self {
        match mode {
            AllocMode::Full => TraceMode::Full,
            AllocMode::Sampled => TraceMode::Sampled,
            AllocMode::Off => TraceMode::Off,
            AllocMode::Floor => TraceMode::Floor,
        }
    }
}

/// Builds the report's allocator section.
pub fn report(
    tracer: Option<&AllocTracer>,
    profile: Option<&AllocProfile>,
    mode: AllocMode,
    lost: u64,
    kernel: &[(u32, KernelStats)],
    mut symbolize: impl FnMut(&Place) -> Frame,
) -> AllocatorReport {
    let (Some(tracer), Some(profile)) = (tracer, profile) else {
        return AllocatorReport {
            mode: mode.into(),
            traced_fraction: 0.0,
            ..Default::default()
        };
    };
    let scaling = Scaling::of(mode.into(), tracer);
    let always_traced = match scaling.sampled {
        true => tracer
            .resident_ops()
            .into_iter()
            .map(AllocOp::from_code)
            .collect(),
        false => Vec::new(),
    };
    AllocatorReport {
        library: Some(tracer.allocator.label()),
        path: Some(tracer.allocator.path.to_string()),
        mode: mode.into(),
        traced_fraction: scaling.fraction,
        sampled: scaling.sampled,
        large_rule: profile.rule().describe(),
        calls_traced: profile.calls(),
        always_traced,
        lost,
        ops: ops(profile, &scaling),
        syscalls: syscalls(profile),
        // The composition needs every call.
        memory: (mode == AllocMode::Full).then(|| memory(profile)),
        sites: sites(profile, &scaling, &mut symbolize),
        kernel: kernel_threads(kernel),
    }
}

/// How counts traced in windows become estimates for the whole session.
#[derive(Debug, Clone, PartialEq)]
struct Scaling {
    /// Fraction of the session the windowed probes were attached.
    fraction: f64,
    /// Whether counts are estimates (sampled, and traced in part).
    sampled: bool,
    /// Fraction of the session each operation was traced, by code.
    op_fractions: Vec<f64>,
}

impl Scaling {
    fn of(mode: TraceMode, tracer: &Windowed) -> Self {
        let fraction = tracer.traced_fraction();
        Self {
            fraction,
            sampled: mode.estimates(fraction),
            op_fractions: (0..alloc_op::COUNT)
                .map(|op| tracer.op_fraction(op))
                .collect(),
        }
    }

    /// `n` calls of operation `op` traced, as an estimate for the session
    /// when counts are scaled.
    fn calls(&self, n: u64, op: u32) -> u64 {
        let f = (self.op_fractions.get(op as usize)).map_or(self.fraction, |f| *f);
        if self.sampled && f > 0.0 {
            (n as f64 / f).round() as u64
        } else {
            n
        }
    }
}

/// Latency per split, busiest first.
fn ops(profile: &AllocProfile, scaling: &Scaling) -> Vec<OpStats> {
    profile
        .splits()
        .into_iter()
        .map(|(key, stats)| {
            let h = &stats.histogram;
            OpStats {
                op: AllocOp::from_code(key.op),
                class: key.class.into(),
                origin: key.origin.map(Into::into),
                phase: key.phase.into(),
                count: scaling.calls(h.len(), key.op),
                traced: h.len(),
                mean_ns: h.mean().round() as u64,
                p50_ns: h.value_at_quantile(0.5),
                p99_ns: h.value_at_quantile(0.99),
                max_ns: h.max(),
                histogram: log2_histogram(&stats.log2),
            }
        })
        .collect()
}

/// The non-empty log2 buckets: (upper bound in ns, calls).
fn log2_histogram(log2: &[u64]) -> Vec<(u64, u64)> {
    log2.iter()
        .enumerate()
        .filter(|(_, &n)| n > 0)
        .map(|(i, &n)| (1u64 << (i + 1), n))
        .collect()
}

/// The allocator's syscalls, most time first.
fn syscalls(profile: &AllocProfile) -> Vec<SyscallStats> {
    profile
        .syscalls()
        .into_iter()
        .map(|((nr, inside, traced), s)| SyscallStats {
            name: Syscall::from_code(nr),
            inside: inside.map(AllocOp::from_code),
            traced,
            count: s.count,
            total_ns: s.total_ns,
            bytes: s.bytes,
        })
        .collect()
}

/// Where the memory went at the peak of mapped memory.
fn memory(profile: &AllocProfile) -> MemoryReport {
    let peak = profile.memory_at_peak();
    MemoryReport {
        requested_peak: profile.requested_peak(),
        requested_at_peak: peak.requested,
        usable_peak: peak.usable,
        internal_fragmentation: peak.internal_fragmentation(),
        blowup: peak.blowup,
        external_fragmentation: peak.external_fragmentation(),
        mapped_peak: peak.mapped,
        requested_end: profile.memory_now().requested,
        usable_known: profile.usable_known(),
    }
}

/// Page faults and `mmap_lock` waits per thread.
fn kernel_threads(kernel: &[(u32, KernelStats)]) -> Vec<KernelThreadEntry> {
    kernel
        .iter()
        .map(|(tid, k)| KernelThreadEntry {
            tid: *tid,
            page_faults: k.page_faults,
            page_faults_in_allocator: k.page_faults_in_alloc,
            mmap_lock_waits: k.mmap_lock_waits,
            mmap_lock_wait_ns: k.mmap_lock_wait_ns,
        })
        .collect()
}

/// Sites kept per ranking.
const SITES_PER_RANKING: usize = 10;

/// The top sites by bytes, by count and by live bytes, each once. Sites
/// are mostly malloc's calls: their counts are scaled like malloc's.
fn sites(
    profile: &AllocProfile,
    scaling: &Scaling,
    symbolize: &mut impl FnMut(&Place) -> Frame,
) -> Vec<SiteEntry> {
    let all: Vec<_> = profile.sites().collect();
    let mut chosen: Vec<usize> = Vec::new();
    let rankings: [&dyn Fn(&SiteStats) -> u64; 3] = [&|s| s.bytes, &|s| s.count, &|s| s.live_bytes];
    for key in rankings {
        let mut order: Vec<usize> = (0..all.len()).filter(|&i| key(all[i].1) > 0).collect();
        order.sort_by(|&a, &b| key(all[b].1).cmp(&key(all[a].1)));
        for i in order.into_iter().take(SITES_PER_RANKING) {
            if !chosen.contains(&i) {
                chosen.push(i);
            }
        }
    }
    let scale = |n: u64| scaling.calls(n, alloc_op::MALLOC);
    chosen
        .into_iter()
        .map(|i| {
            let (place, s) = &all[i];
            let frame = symbolize(place);
            SiteEntry {
                function: frame.function,
                file: frame.file,
                line: frame.line,
                module: frame.module,
                count: scale(s.count),
                bytes: scale(s.bytes),
                live_bytes: s.live_bytes,
                live_blocks: s.live_blocks,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use memprof_common::{alloc_op, syscall};

    use super::*;
    use crate::features::alloc::analysis::op_name;

    /// The report's names are the analysis's.
    #[test]
    fn report_names_are_the_analysis_names() {
        for c in [Class::Small, Class::Large, Class::Unknown] {
            assert_eq!(SizeClass::from(c).name(), c.name());
        }
        for o in [Origin::New, Origin::Reused] {
            assert_eq!(BlockOrigin::from(o).name(), o.name());
        }
        for p in [Phase::Serial, Phase::Parallel] {
            assert_eq!(ThreadPhase::from(p).name(), p.name());
        }
        for op in 0..=alloc_op::COUNT {
            assert_eq!(AllocOp::from_code(op).name(), op_name(op), "op {op}");
        }
        for nr in 0..=syscall::COUNT {
            let name = syscall::NAMES.get(nr as usize).copied().unwrap_or("?");
            assert_eq!(Syscall::from_code(nr).name(), name, "syscall {nr}");
        }
    }
}

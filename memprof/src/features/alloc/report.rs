//! The report's allocator section: latency per split, syscalls, the
//! memory account, the top sites and the kernel-side cost per thread.

use memprof_common::KernelStats;

use super::tracer::AllocTracer;
use crate::{
    cli::AllocMode,
    features::alloc::analysis::{AllocProfile, Class, Origin, Phase},
    object::symbolize::Frame,
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

/// The report's name for `--alloc-mode`.
fn trace_mode(mode: AllocMode) -> TraceMode {
    match mode {
        AllocMode::Full => TraceMode::Full,
        AllocMode::Sampled => TraceMode::Sampled,
        AllocMode::Off => TraceMode::Off,
        AllocMode::Floor => TraceMode::Floor,
    }
}

/// Builds the report's allocator section.
pub fn report(
    tracer: Option<&AllocTracer>,
    profile: Option<&AllocProfile>,
    mode: AllocMode,
    lost: u64,
    kernel: &[(u32, KernelStats)],
    mut symbolize: impl FnMut(&crate::process::maps::Place) -> Frame,
) -> AllocatorReport {
    let (Some(tracer), Some(profile)) = (tracer, profile) else {
        return AllocatorReport {
            mode: trace_mode(mode),
            traced_fraction: 0.0,
            ..Default::default()
        };
    };
    let fraction = tracer.traced_fraction();
    let sampled = trace_mode(mode).estimates(fraction);
    let scale_by = |n: u64, f: f64| -> u64 {
        if sampled && f > 0.0 {
            (n as f64 / f).round() as u64
        } else {
            n
        }
    };
    // Sites are mostly malloc's calls: scale them like malloc.
    let malloc_fraction = tracer.op_fraction(memprof_common::alloc_op::MALLOC);
    let scale = |n: u64| scale_by(n, malloc_fraction);
    let ops = profile
        .splits()
        .into_iter()
        .map(|(key, stats)| {
            let h = &stats.histogram;
            OpStats {
                op: AllocOp::from_code(key.op),
                class: key.class.into(),
                origin: key.origin.map(Into::into),
                phase: key.phase.into(),
                count: scale_by(h.len(), tracer.op_fraction(key.op)),
                traced: h.len(),
                mean_ns: h.mean().round() as u64,
                p50_ns: h.value_at_quantile(0.5),
                p99_ns: h.value_at_quantile(0.99),
                max_ns: h.max(),
                histogram: stats
                    .log2
                    .iter()
                    .enumerate()
                    .filter(|(_, &n)| n > 0)
                    .map(|(i, &n)| (1u64 << (i + 1), n))
                    .collect(),
            }
        })
        .collect();
    let syscalls = profile
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
        .collect();
    let memory = (mode == AllocMode::Full).then(|| {
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
    });
    AllocatorReport {
        library: Some(tracer.allocator.label()),
        path: Some(tracer.allocator.path.to_string()),
        mode: trace_mode(mode),
        traced_fraction: fraction,
        sampled,
        large_rule: profile.rule().describe(),
        calls_traced: profile.calls(),
        lost,
        ops,
        syscalls,
        memory,
        sites: sites(profile, &scale, &mut symbolize),
        always_traced: if sampled {
            tracer
                .resident_ops()
                .into_iter()
                .map(AllocOp::from_code)
                .collect()
        } else {
            Vec::new()
        },
        kernel: kernel
            .iter()
            .map(|(tid, k)| KernelThreadEntry {
                tid: *tid,
                page_faults: k.page_faults,
                page_faults_in_allocator: k.page_faults_in_alloc,
                mmap_lock_waits: k.mmap_lock_waits,
                mmap_lock_wait_ns: k.mmap_lock_wait_ns,
            })
            .collect(),
    }
}

/// Sites kept per ranking.
const SITES_PER_RANKING: usize = 10;

/// The top sites by bytes, by count and by live bytes, each once.
fn sites(
    profile: &AllocProfile,
    scale: &impl Fn(u64) -> u64,
    symbolize: &mut impl FnMut(&crate::process::maps::Place) -> Frame,
) -> Vec<SiteEntry> {
    let all: Vec<_> = profile.sites().collect();
    let mut chosen: Vec<usize> = Vec::new();
    let rankings: [&dyn Fn(&crate::features::alloc::analysis::SiteStats) -> u64; 3] =
        [&|s| s.bytes, &|s| s.count, &|s| s.live_bytes];
    for key in rankings {
        let mut order: Vec<usize> = (0..all.len()).filter(|&i| key(all[i].1) > 0).collect();
        order.sort_by(|&a, &b| key(all[b].1).cmp(&key(all[a].1)));
        for i in order.into_iter().take(SITES_PER_RANKING) {
            if !chosen.contains(&i) {
                chosen.push(i);
            }
        }
    }
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

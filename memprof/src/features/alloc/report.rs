//! The report's allocator section: latency per split, syscalls, the
//! memory account, the top sites and the kernel-side cost per thread.

use memprof_common::{alloc_op, KernelStats};

use super::tracer::AllocTracer;
use crate::{
    cli::AllocMode,
    features::alloc::analysis::{AllocProfile, Class, Origin, Phase, ProbeKind, SiteStats},
    heap::site_name::past_inline_helpers,
    kernel::{
        calls::{CallEstimate, MAX_COUNT_ERROR},
        windows::Windowed,
    },
    object::symbolize::Inlined,
    process::maps::Place,
    report::model::{
        AllocOp, AllocatorReport, BlockOrigin, CountBasis, KernelThreadEntry, LatencyBasis,
        MemoryReport, OpStats, ProbeCostReport, ProbeKindCost, SiteEntry, SizeClass, Syscall,
        SyscallStats, ThreadPhase, TraceMode,
    },
    report::names::callers,
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
    estimate: Option<&CallEstimate>,
    profile: Option<&AllocProfile>,
    mode: AllocMode,
    lost: u64,
    kernel: &[(u32, KernelStats)],
    mut symbolize: impl FnMut(&Place) -> Inlined,
) -> AllocatorReport {
    let (Some(tracer), Some(profile)) = (tracer, profile) else {
        return AllocatorReport {
            mode: mode.into(),
            traced_fraction: 0.0,
            ..Default::default()
        };
    };
    let scaling = match estimate {
        Some(e) => Scaling::of(mode.into(), e, &seen_per_op(profile)),
        None => Scaling::exact(),
    };
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
        count_error: scaling.error,
        large_rule: profile.rule().describe(),
        calls_traced: profile.calls(),
        always_traced,
        lost,
        untracked_blocks: profile.untracked_blocks(),
        named_at_wrapper: 0,
        probe_cost_ns: probe_cost(profile),
        ops: ops(profile, &scaling),
        syscalls: syscalls(profile),
        // The composition needs every call.
        memory: (mode == AllocMode::Full).then(|| memory(profile)),
        sites: sites(profile, &scaling, &mut symbolize),
        heap_profile: None,
        kernel: kernel_threads(kernel),
        // From the CPU samples and the helper, by the caller.
        cpu: None,
        untraced_ns: None,
        count_basis: None,
    }
}

/// Estimated ÷ traced allocations (malloc's), as the counts are scaled;
/// None when unknown.
pub fn alloc_factor(
    mode: AllocMode,
    estimate: Option<&CallEstimate>,
    profile: &AllocProfile,
) -> Option<f64> {
    let scaling = match estimate {
        Some(e) => Scaling::of(mode.into(), e, &seen_per_op(profile)),
        None => Scaling::exact(),
    };
    scaling.factors[alloc_op::MALLOC as usize]
}

/// How the calls traced in windows become estimates for the whole session.
#[derive(Debug, Clone, PartialEq)]
struct Scaling {
    /// Fraction of the session the windowed probes were attached.
    fraction: f64,
    /// Whether counts are estimates (some operation was not traced all
    /// the time).
    sampled: bool,
    /// Per operation code: estimated calls ÷ calls traced (1 when exact);
    /// None when the estimate is not good enough to show.
    factors: Vec<Option<f64>>,
    /// Claimed relative error of the estimated counts (None: exact).
    error: Option<f64>,
}

impl Scaling {
    /// Every call traced: counts as seen.
    fn exact() -> Self {
        Self {
            fraction: 1.0,
            sampled: false,
            factors: vec![Some(1.0); alloc_op::COUNT as usize],
            error: None,
        }
    }

    /// From the calls the kernel counted per operation (`estimate`) and
    /// the calls traced per operation (`seen`, by code).
    fn of(mode: TraceMode, estimate: &CallEstimate, seen: &[u64]) -> Self {
        if mode != TraceMode::Sampled || estimate.exact.iter().all(|e| *e) {
            return Self::exact();
        }
        let known = estimate.shown(MAX_COUNT_ERROR);
        Self {
            fraction: estimate.traced_fraction,
            sampled: true,
            factors: (0..alloc_op::COUNT as usize)
                .map(|op| {
                    let seen = seen.get(op).copied().unwrap_or(0);
                    let exact = estimate.exact.get(op).copied().unwrap_or(true);
                    (exact || known).then(|| estimate.scale(op, seen))
                })
                .collect(),
            error: estimate.error,
        }
    }

    /// `n` calls of operation `op` traced, as an estimate for the session;
    /// None when unknown.
    fn calls(&self, n: u64, op: u32) -> Option<u64> {
        let factor = self
            .factors
            .get(op as usize)
            .copied()
            .unwrap_or(Some(1.0))?;
        Some((n as f64 * factor).round() as u64)
    }
}

/// The note saying how the counts were estimated, or why they are
/// unknown; None when every call was traced.
pub fn estimate_note(
    tracer: &Windowed,
    e: &CallEstimate,
    basis: CountBasis,
    budget: f64,
) -> Option<String> {
    let error = e.error?;
    let traced = format!(
        "allocator calls were traced {:.1}% of the time ({} windows) to stay within the {:.0}% \
         overhead budget; counts are estimates: ",
        e.traced_fraction * 100.0,
        tracer.windows,
        budget * 100.0,
    );
    let how = match basis {
        CountBasis::Windows => format!(
            "{traced}the calls the kernel counted while the probes were attached, extrapolated \
             over each gap at the rate of the window before it (corrected for the probes' \
             slowdown of the target)"
        ),
        CountBasis::CpuTime => format!(
            "{traced}the CPU time sampled in the allocator's code divided by what a call costs \
             it untraced (timed in a helper process all along, see `untraced_ns`), split by the mix of operations \
             the windows traced (the windows' own extrapolation claimed more: the probes slow \
             a target this hot too much to correct for); calls that meet colder caches or \
             slower paths than the timed loop make these counts high"
        ),
    };
    Some(if error <= MAX_COUNT_ERROR {
        format!("{how}; claimed error ±{:.0}%", error * 100.0)
    } else {
        format!(
            "{how}; their claimed error, ±{:.0}%, is above {:.0}%, so the counts of the \
             windowed operations are unknown (null; `traced` gives the calls seen): {}",
            error * 100.0,
            MAX_COUNT_ERROR * 100.0,
            e.why_rough()
        )
    })
}

/// Calls traced per operation code.
pub fn seen_per_op(profile: &AllocProfile) -> Vec<u64> {
    let mut seen = vec![0; alloc_op::COUNT as usize];
    for (key, stats) in profile.splits() {
        if let Some(n) = seen.get_mut(key.op as usize) {
            *n += stats.histogram.len();
        }
    }
    seen
}

/// Share of the corrected calls whose probes ran at another pace than at
/// calibration above which a note says so (in quiet runs here 2-11% of
/// the calls read just outside the calibrated range).
const PACED_NOTE_SHARE: f64 = 0.2;

/// The note saying how many calls are named at a wrapper's line (their
/// chain was not sent: see [`memprof_common::ALLOC_SITE_CHAINS_PER_S`]).
pub fn wrapper_note(named_at_wrapper: u64, traced: u64) -> Option<String> {
    (named_at_wrapper > 0).then(|| {
        format!(
            "{named_at_wrapper} of {traced} traced allocation calls are named at an allocation \
             wrapper's line, not past it: they came from call sites met for the first time \
             while the cap of {} call chains a second for such sites was spent",
            memprof_common::ALLOC_SITE_CHAINS_PER_S
        )
    })
}

/// The note saying that the probes' cost varied during the session and
/// how the latencies were corrected for it.
pub fn pace_note(cost: &ProbeCostReport) -> Option<String> {
    let share = cost.paced_calls as f64 / cost.corrected_calls.max(1) as f64;
    let k = cost.kinds.first()?;
    (share >= PACED_NOTE_SHARE).then(|| {
        format!(
            "the allocator probes ran at another pace than at calibration for {:.0}% of the \
             traced calls (this CPU was slower at times: the entry program took outside its \
             calibrated {}-{} ns); their probe cost was scaled by that run time before being \
             taken off, which leaves them slightly high (measured here: 50-70 ns)",
            share * 100.0,
            k.pace_range_ns[0],
            k.pace_range_ns[1]
        )
    })
}

/// The note saying which medians are the untraced loop's.
pub fn fast_path_note(
    settled: usize,
    correction: Option<super::fast_path::Correction>,
) -> Option<String> {
    let c = correction.filter(|_| settled > 0)?;
    Some(format!(
        "the median latency of {settled} small malloc/free/calloc row(s) (marked ~) is the \
         allocator's untraced cost (`untraced_ns`, timed in a helper process): their traced \
         medians were as near it as the probes' correction can tell (it takes up to {} ns off \
         a call, calibrated to {} ns); their mean, p99 and max are the traced calls'",
        c.added_ns, c.resolution_ns
    ))
}

/// The calibration taken off the latencies, if any.
fn probe_cost(profile: &AllocProfile) -> Option<ProbeCostReport> {
    let (cost, used) = (profile.probe_cost(), profile.probe_kinds());
    let (corrected_calls, paced_calls) = profile.paced();
    cost.is_calibrated().then(|| ProbeCostReport {
        paced_calls,
        corrected_calls,
        resolution_ns: cost.resolution_ns(&used),
        kinds: ProbeKind::ALL
            .iter()
            .filter_map(|&kind| {
                let k = cost.kind(kind)?;
                Some(ProbeKindCost {
                    kind: kind.name().to_string(),
                    added_ns: k.added_ns,
                    spread_ns: k.spread_ns,
                    cpu_ns: k.cpu_ns,
                    calls: k.calls,
                    pace_ns: k.pace_ns,
                    pace_range_ns: [k.pace_range_ns.0, k.pace_range_ns.1],
                })
            })
            .collect(),
    })
}

/// Latency per split, busiest first.
fn ops(profile: &AllocProfile, scaling: &Scaling) -> Vec<OpStats> {
    let cost = profile.probe_cost();
    let resolution = cost
        .is_calibrated()
        .then(|| cost.resolution_ns(&profile.probe_kinds()));
    let measured = |ns: u64| measured(ns, resolution);
    profile
        .splits()
        .into_iter()
        .map(|(key, stats)| {
            let h = &stats.histogram;
            let p50_ns = measured(h.value_at_quantile(0.5));
            OpStats {
                op: AllocOp::from_code(key.op),
                class: key.class.into(),
                origin: key.origin.map(Into::into),
                phase: key.phase.into(),
                count: scaling.calls(h.len(), key.op),
                traced: h.len(),
                mean_ns: measured(h.mean().round() as u64),
                p50_ns,
                p50_basis: p50_ns.map(|_| LatencyBasis::Traced),
                p99_ns: measured(h.value_at_quantile(0.99)),
                max_ns: measured(h.max()),
                histogram: log2_histogram(&stats.log2),
                syscalls: stats.syscalls,
                syscall_ns: stats.syscall_ns,
                page_faults: stats.page_faults,
            }
        })
        .collect()
}

/// A corrected latency, or None below the calibration's `resolution`.
fn measured(ns: u64, resolution: Option<u64>) -> Option<u64> {
    match resolution {
        Some(r) if ns < r => None,
        _ => Some(ns),
    }
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
        usable_end: profile.memory_now().usable,
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
    symbolize: &mut impl FnMut(&Place) -> Inlined,
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
            // Past the allocation wrappers: inlined helpers here, the
            // out-of-line ones in the kernel (`via` is the call in them).
            let (chain, inline_via) = past_inline_helpers(symbolize(place));
            let via = (s.via != 0)
                .then(|| {
                    symbolize(&profile.site_place(s.via))
                        .outermost()
                        .function
                        .clone()
                })
                .or(inline_via);
            let inlined_into = callers(&chain);
            let frame = chain.frame;
            SiteEntry {
                function: frame.function,
                file: frame.file,
                line: frame.line,
                module: frame.module,
                inlined_into,
                via,
                count: scale(s.count),
                traced: s.count,
                bytes: scale(s.bytes),
                live_bytes: s.live_bytes,
                live_blocks: s.live_blocks,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use memprof_common::{alloc_op, syscall};

    use super::*;
    use crate::{
        features::alloc::{
            allocator::{Allocator, AllocatorKind},
            analysis::{op_name, AllocCall, LargeRule, SyscallCall},
            classes::SizeClasses,
        },
        kernel::calls::Doubt,
        object::symbolize::Frame,
        options::AllocSettings,
        report::fixtures::code_at,
    };

    /// A call of `op` on `ptr` from call site `site`, with `threads` live.
    fn call(op: u32, ptr: u64, size: u64, site: u64, duration_ns: u64, threads: u32) -> AllocCall {
        AllocCall {
            op,
            tid: 1,
            start_ns: 0,
            duration_ns,
            ptr,
            old_ptr: 0,
            size,
            chunk: 0,
            site,
            via: 0,
            live_threads: threads,
            page_faults: 0,
            pace_ns: 0,
        }
    }

    /// Two small mallocs, a free and a malloc reusing the freed block (one
    /// thread), then a large malloc while two threads live; the small
    /// blocks come from call site 0x10, the large one from 0x30.
    fn profile() -> AllocProfile {
        let mut p = AllocProfile::new(LargeRule::Above(1024), false, SizeClasses::Unknown);
        p.add_call(call(alloc_op::MALLOC, 0x1000, 16, 0x10, 100, 1));
        p.add_call(call(alloc_op::MALLOC, 0x2000, 16, 0x10, 300, 1));
        p.add_call(call(alloc_op::FREE, 0x1000, 0, 0x20, 50, 1));
        p.add_call(call(alloc_op::MALLOC, 0x1000, 16, 0x10, 200, 1));
        p.add_call(call(alloc_op::MALLOC, 0x9000, 4096, 0x30, 5000, 2));
        p.set_site_place(0x10, code_at(0x10));
        p.set_site_place(0x30, code_at(0x30));
        p
    }

    fn exact() -> Scaling {
        Scaling::exact()
    }

    /// The kernel counted 4x the mallocs traced and every free (resident),
    /// with a claimed error of `error`.
    fn estimate(error: f64) -> CallEstimate {
        let mut calls = vec![0.0; alloc_op::COUNT as usize];
        calls[alloc_op::MALLOC as usize] = 16.0;
        calls[alloc_op::FREE as usize] = 1.0;
        let mut exact = vec![false; alloc_op::COUNT as usize];
        exact[alloc_op::FREE as usize] = true;
        CallEstimate {
            calls,
            exact,
            traced_fraction: 0.25,
            error: Some(error),
            windows: 5,
            doubt: Some(Doubt::Spread { upper: error, n: 5 }),
        }
    }

    /// The profile's four mallocs and one free under [`estimate`].
    fn windowed() -> Scaling {
        Scaling::of(TraceMode::Sampled, &estimate(0.1), &seen_per_op(&profile()))
    }

    /// `site{offset}`, for the places [`code_at`] gives.
    fn site_names(place: &Place) -> Inlined {
        Inlined::alone(match place {
            Place::File { file_offset, .. } => Frame {
                function: format!("site{file_offset}"),
                module: "prog".into(),
                file: None,
                line: None,
            },
            other => Frame::unknown(other),
        })
    }

    #[test]
    fn a_note_says_when_many_calls_ran_at_another_pace() {
        let kind = ProbeKindCost {
            kind: "emulated, allocation".into(),
            added_ns: 726,
            spread_ns: 10,
            cpu_ns: 2000,
            calls: 1000,
            pace_ns: 250,
            pace_range_ns: [235, 265],
        };
        let mut cost = ProbeCostReport {
            resolution_ns: 10,
            kinds: vec![kind],
            paced_calls: 300,
            corrected_calls: 1000,
        };
        let note = pace_note(&cost).expect("30% paced");
        assert!(
            note.contains("30% of the traced calls") && note.contains("235-265 ns"),
            "{note}"
        );
        cost.paced_calls = 100;
        assert_eq!(pace_note(&cost), None);
    }

    #[test]
    fn ops_are_the_splits_busiest_first() {
        let ops = ops(&profile(), &exact());
        let splits: Vec<_> = ops
            .iter()
            .map(|o| {
                (
                    o.op.name(),
                    o.class.name(),
                    o.origin.map(BlockOrigin::name),
                    o.phase.name(),
                    o.count,
                )
            })
            .collect();
        assert_eq!(
            splits,
            [
                ("malloc", "small", Some("new"), "serial", Some(2)),
                // Ties in key order: small before large, malloc before free.
                ("malloc", "small", Some("reused"), "serial", Some(1)),
                ("malloc", "large", Some("new"), "parallel", Some(1)),
                ("free", "small", Some("new"), "serial", Some(1)),
            ]
        );
        let first = &ops[0];
        assert_eq!(
            (first.traced, first.mean_ns, first.max_ns),
            (2, Some(200), Some(300))
        );
        // 100 ns and 300 ns: one call under 128 ns, one under 512 ns.
        assert_eq!(first.histogram, [(128, 1), (512, 1)]);
    }

    #[test]
    fn latencies_below_the_resolution_are_not_numbers() {
        assert_eq!(measured(30, Some(131)), None, "noise of the correction");
        assert_eq!(measured(131, Some(131)), Some(131));
        assert_eq!(measured(1, None), Some(1), "uncorrected: the raw duration");
    }

    #[test]
    fn sampled_counts_are_the_kernels_counts_shared_as_the_calls_were_seen() {
        let ops = ops(&profile(), &windowed());
        let counts: Vec<_> = ops
            .iter()
            .map(|o| (o.op.name(), o.count, o.traced))
            .collect();
        // 16 mallocs estimated for 4 seen: each seen stands for 4; the
        // free was counted exactly.
        assert_eq!(
            counts,
            [
                ("malloc", Some(8), 2),
                ("malloc", Some(4), 1),
                ("malloc", Some(4), 1),
                ("free", Some(1), 1)
            ]
        );
        let scaling = windowed();
        assert_eq!((scaling.sampled, scaling.error), (true, Some(0.1)));
        assert_eq!(scaling.fraction, 0.25);
        assert_eq!(scaling.calls(3, 99), Some(3), "an unknown op: as seen");
    }

    #[test]
    fn counts_too_rough_to_show_are_unknown_but_exact_ones_stay() {
        let rough = Scaling::of(
            TraceMode::Sampled,
            &estimate(MAX_COUNT_ERROR + 0.01),
            &seen_per_op(&profile()),
        );
        assert_eq!(rough.calls(4, alloc_op::MALLOC), None);
        assert_eq!(rough.calls(1, alloc_op::FREE), Some(1), "resident: exact");
        let ops = ops(&profile(), &rough);
        assert!(ops
            .iter()
            .filter(|o| o.op == AllocOp::Malloc)
            .all(|o| o.count.is_none() && o.traced > 0));
    }

    #[test]
    fn full_mode_or_every_op_exact_is_not_sampled() {
        let e = estimate(0.1);
        let seen = seen_per_op(&profile());
        assert_eq!(Scaling::of(TraceMode::Full, &e, &seen), Scaling::exact());
        let all_exact = CallEstimate {
            exact: vec![true; alloc_op::COUNT as usize],
            error: None,
            ..e
        };
        assert_eq!(
            Scaling::of(TraceMode::Sampled, &all_exact, &seen),
            Scaling::exact()
        );
    }

    #[test]
    fn syscalls_name_the_operation_they_ran_inside() {
        let mut p = profile();
        let sys = |nr, inside, traced, duration_ns, length| SyscallCall {
            nr,
            tid: 1,
            inside,
            traced,
            duration_ns,
            args: [0x7f00_0000_0000, length, 3, 0],
            ret: 0,
        };
        p.add_syscall(sys(syscall::MUNMAP, None, true, 1000, 4096));
        p.add_syscall(sys(
            syscall::MMAP,
            Some(alloc_op::MALLOC),
            true,
            5000,
            1 << 20,
        ));
        p.add_syscall(sys(syscall::MADVISE, None, false, 200, 8192));
        p.add_syscall(sys(99, Some(99), true, 10, 0));
        let rows: Vec<_> = syscalls(&p)
            .iter()
            .map(|s| {
                (
                    s.name.name(),
                    s.inside.map(AllocOp::name),
                    s.traced,
                    s.total_ns,
                    s.bytes,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("mmap", Some("malloc"), true, 5000, 1 << 20),
                ("munmap", None, true, 1000, 4096),
                ("madvise", None, false, 200, 8192),
                ("?", Some("unknown"), true, 10, 0),
            ]
        );
    }

    /// Sites 1 to 10 allocate twice 1000·i bytes and free them; site 11
    /// allocates 1500 bytes once and keeps them; site 12 allocates 10
    /// bytes once and frees them.
    fn sites_profile() -> AllocProfile {
        let mut p = AllocProfile::new(LargeRule::Above(1 << 20), false, SizeClasses::Unknown);
        let mut ptr = 0x10_0000;
        let mut malloc = |p: &mut AllocProfile, site: u64, size: u64, keep: bool| {
            ptr += 0x1_0000;
            p.add_call(call(alloc_op::MALLOC, ptr, size, site, 100, 1));
            if !keep {
                p.add_call(call(alloc_op::FREE, ptr, 0, 0, 100, 1));
            }
        };
        for i in 1..=10 {
            malloc(&mut p, i, 1000 * i, false);
            malloc(&mut p, i, 1000 * i, false);
        }
        malloc(&mut p, 11, 1500, true);
        malloc(&mut p, 12, 10, false);
        for site in 1..=12 {
            p.set_site_place(site, code_at(site));
        }
        p
    }

    #[test]
    fn sites_are_the_top_of_each_ranking_each_once() {
        let sites = sites(&sites_profile(), &exact(), &mut site_names);
        let names: Vec<&str> = sites.iter().map(|s| s.function.as_str()).collect();
        // The ten biggest by bytes (also the ten most frequent), then the
        // one that kept memory; site 12 is in no top ten.
        assert_eq!(
            names,
            [
                "site10", "site9", "site8", "site7", "site6", "site5", "site4", "site3", "site2",
                "site1", "site11"
            ]
        );
        let s10 = &sites[0];
        assert_eq!(
            (s10.count, s10.bytes, s10.live_bytes, s10.live_blocks),
            (Some(2), Some(20_000), 0, 0)
        );
        let s11 = &sites[10];
        assert_eq!(
            (s11.count, s11.bytes, s11.live_bytes, s11.live_blocks),
            (Some(1), Some(1500), 1500, 1)
        );
        assert_eq!(s11.module, "prog");
    }

    #[test]
    fn sampled_sites_are_scaled_like_malloc_but_not_what_is_live() {
        let sites = sites(&sites_profile(), &windowed(), &mut site_names);
        let s11 = sites.iter().find(|s| s.function == "site11").unwrap();
        assert_eq!(
            (s11.count, s11.bytes, s11.live_bytes),
            (Some(4), Some(6000), 1500)
        );
    }

    #[test]
    fn without_a_tracer_the_section_only_says_the_mode() {
        let off = report(None, None, None, AllocMode::Off, 0, &[], |p| {
            Inlined::alone(Frame::unknown(p))
        });
        assert_eq!(off, AllocatorReport::default());
        let p = profile();
        let not_found = report(None, None, Some(&p), AllocMode::Sampled, 5, &[], |p| {
            Inlined::alone(Frame::unknown(p))
        });
        assert_eq!(
            not_found,
            AllocatorReport {
                mode: TraceMode::Sampled,
                ..Default::default()
            }
        );
    }

    fn tracer(mode: AllocMode) -> AllocTracer {
        let allocator = Allocator {
            path: Arc::from("/usr/lib/libc.so.6"),
            kind: AllocatorKind::Glibc,
            version: Some("2.36".into()),
            entries: vec![],
        };
        let settings = AllocSettings {
            mode,
            ..Default::default()
        };
        AllocTracer::new(allocator, settings, 1, None)
    }

    #[test]
    fn a_full_session_fills_every_part() {
        let p = profile();
        let kernel = [(
            42,
            KernelStats {
                page_faults: 10,
                page_faults_in_alloc: 3,
                mmap_lock_waits: 2,
                mmap_lock_wait_ns: 500,
                mmap_lock_start_ns: 0,
            },
        )];
        let tracer = tracer(AllocMode::Full);
        let r = report(
            Some(&tracer),
            None,
            Some(&p),
            AllocMode::Full,
            7,
            &kernel,
            site_names,
        );
        assert_eq!(r.library.as_deref(), Some("glibc 2.36"));
        assert_eq!(r.path.as_deref(), Some("/usr/lib/libc.so.6"));
        assert_eq!(
            (r.mode, r.traced_fraction, r.sampled),
            (TraceMode::Full, 1.0, false)
        );
        assert_eq!(r.large_rule, "> 1024 bytes");
        assert_eq!((r.calls_traced, r.lost), (5, 7));
        assert_eq!(r.ops, ops(&p, &exact()));
        assert!(r.always_traced.is_empty());
        let memory = r.memory.expect("full mode has the composition");
        assert_eq!((memory.requested_peak, memory.requested_end), (4128, 4128));
        assert!(!memory.usable_known);
        let sites: Vec<&str> = r.sites.iter().map(|s| s.function.as_str()).collect();
        assert_eq!(
            sites,
            ["site48", "site16"],
            "by bytes: the large block first"
        );
        assert_eq!(
            r.kernel,
            [KernelThreadEntry {
                tid: 42,
                page_faults: 10,
                page_faults_in_allocator: 3,
                mmap_lock_waits: 2,
                mmap_lock_wait_ns: 500,
            }]
        );
    }

    #[test]
    fn memory_composition_needs_full_mode() {
        let p = profile();
        let tracer = tracer(AllocMode::Sampled);
        let estimate = tracer.call_estimate(None);
        let r = report(
            Some(&tracer),
            Some(&estimate),
            Some(&p),
            AllocMode::Sampled,
            0,
            &[],
            site_names,
        );
        assert_eq!(r.mode, TraceMode::Sampled);
        assert_eq!(r.memory, None);
        // Nothing elapsed yet: the windows cover the whole session.
        assert_eq!((r.traced_fraction, r.sampled), (1.0, false));
        assert_eq!(r.ops[0].count, Some(2));
    }

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

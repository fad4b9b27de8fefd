//! The allocator profiler: per-call latency split by size class, address
//! origin and serial/parallel phase; the syscalls made inside the
//! allocator; memory composition; allocation sites and leaks; which
//! allocator is in use; and the overhead budget of sampled mode.
//!
//! Each test runs the real tool against the `alloc` workload (whose exact
//! allocator calls are known: see tests/workloads/alloc.c) and asserts on
//! the `allocator` object of the JSON report, then checks that nothing is
//! left loaded. They share kernel state, so `cargo xtask test` runs them
//! one at a time.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use memprof::report::{
    model::{
        AllocOp, BlockOrigin, CountBasis, LatencyBasis, MemoryReport, OpStats, SiteEntry,
        SizeClass, Syscall, ThreadPhase, TraceMode,
    },
    Report,
};
use memprof_tests::*;

/// Allocator calls a launched process may make besides the workload's own:
/// glibc's internal allocations (stdio, thread start-up, the dynamic
/// loader). The workload avoids all of them it can (see alloc.c), so in
/// practice this is 0–10; the spec allows 50.
const LIBC_EXTRA_CALLS: u64 = 50;
/// Calls glibc makes per thread the workload starts: at exit, the
/// thread's cache (tcache) frees the blocks it holds.
const LIBC_EXTRA_CALLS_PER_THREAD: u64 = 100;
/// Bytes those calls may hold: stdio's buffers (a few KiB).
const LIBC_EXTRA_BYTES: u64 = 64 << 10;

/// Share of the address-origin split that must be right: phase 1 of
/// `reuse` hands out new addresses, phase 2 gets them back. A few blocks
/// may land elsewhere (tcache/fastbin ordering, the warm-up block), so 95%.
const ORIGIN_SHARE: f64 = 0.95;

/// Share of the parallel phase's mallocs that must be labelled parallel:
/// the first calls of a thread may be seen before the tool knows it is
/// running (thread-creation events and calls race on other CPUs).
const PARALLEL_SHARE: f64 = 0.95;

/// How far a sampled estimate of the calls may be from the truth on a
/// steady load.
const SAMPLED_COUNT_TOLERANCE: f64 = 0.25;

/// In sampled mode the budget (5%) must force gaps: traced all the time,
/// the `hold` loop would spend ~85% of its time in uprobe traps. The
/// controller's first window (200 ms) is fully traced, so the traced
/// fraction of a 4 s session is ~0.05–0.15; half is a safe upper bound.
const SAMPLED_MAX_FRACTION: f64 = 0.5;

/// The CPU the `hold` target may use while attached in sampled mode, as a
/// share of wall time. Untraced it uses ~2% (it sleeps 1 ms per 1000
/// pairs); traced all the time ~85%; within a 5% budget plus the fully
/// traced first window, ~5–10%.
const SAMPLED_MAX_TARGET_CPU: f64 = 0.25;

/// Preloaded allocators: (test label, library file, expected `library`
/// prefix).
const PRELOADED: [(&str, &str, &str); 3] = [
    (
        "jemalloc",
        "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
        "jemalloc",
    ),
    (
        "tcmalloc",
        "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
        "tcmalloc",
    ),
    (
        "mimalloc",
        "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2",
        "mimalloc",
    ),
];

const MIB: u64 = 1 << 20;

fn alloc_workload() -> PathBuf {
    build_workload("alloc", Variant::Debug).expect("building alloc")
}

/// Launches `program args` under the tool in `mode` and returns the report.
fn launch(name: &str, mode: &str, program: &std::path::Path, args: &[&str]) -> Report {
    launch_truth(name, mode, program, args).0
}

/// As [`launch`], with the workload's ground truth.
fn launch_truth(
    name: &str,
    mode: &str,
    program: &std::path::Path,
    args: &[&str],
) -> (Report, Truth) {
    let mut all = vec![
        "--alloc-mode",
        mode,
        "--no-tui",
        "--",
        program.to_str().expect("UTF-8 path"),
    ];
    all.extend_from_slice(args);
    let (_, report, truth) = trace_truth(name, &all);
    (typed(&report), truth)
}

/// The workload's malloc and free calls (its truth) are the report's,
/// give or take libc's own: a few (stdio, start-up), and for each of its
/// `threads` the blocks glibc's per-thread cache returns with free() when
/// the thread exits (measured 37-66 per thread).
fn assert_calls_truth(report: &Report, truth: &Truth, threads: u64) {
    let extra = LIBC_EXTRA_CALLS + threads * LIBC_EXTRA_CALLS_PER_THREAD;
    for op in [AllocOp::Malloc, AllocOp::Free] {
        in_range(
            op_count(report, op),
            truth.get(op.name()),
            extra,
            op.name(),
            report,
        );
    }
}

/// The `count` of an `ops` row (a null one, unknown in sampled mode, is
/// a failure).
fn count(row: &OpStats) -> u64 {
    row.count.unwrap_or_else(|| panic!("count of {row:#?}"))
}

/// Sum of `field` ([`count`] or the traced calls) over the `ops` rows of
/// `op` that pass `filter`.
fn sum_ops(
    report: &Report,
    op: AllocOp,
    field: impl Fn(&OpStats) -> u64,
    filter: impl Fn(&OpStats) -> bool,
) -> u64 {
    report
        .allocator
        .ops
        .iter()
        .filter(|row| row.op == op && filter(row))
        .map(field)
        .sum()
}

/// Calls of `op` (all splits).
fn op_count(report: &Report, op: AllocOp) -> u64 {
    sum_ops(report, op, count, |_| true)
}

/// Calls of `op`, or None when the report says they are unknown (a null
/// count in sampled mode: no estimate within 30%).
fn op_count_if_known(report: &Report, op: AllocOp) -> Option<u64> {
    report
        .allocator
        .ops
        .iter()
        .filter(|row| row.op == op)
        .all(|row| row.count.is_some())
        .then(|| op_count(report, op))
}

/// Calls of `op` in the splits that pass `filter` (by origin, class or
/// phase).
fn op_count_where(report: &Report, op: AllocOp, filter: impl Fn(&OpStats) -> bool) -> u64 {
    sum_ops(report, op, count, filter)
}

/// (count, bytes) of syscall `name` made inside allocator operation
/// `inside`, over all its rows.
fn syscall(report: &Report, name: Syscall, inside: AllocOp) -> (u64, u64) {
    report
        .allocator
        .syscalls
        .iter()
        .filter(|s| s.name == name && s.inside == Some(inside))
        .fold((0, 0), |(count, bytes), s| {
            (count + s.count, bytes + s.bytes)
        })
}

/// The site at `line` of a file whose name ends with `file`.
fn site_at<'a>(report: &'a Report, file: &str, line: u32) -> Option<&'a SiteEntry> {
    report
        .allocator
        .sites
        .iter()
        .find(|s| s.file.as_deref().is_some_and(|f| f.ends_with(file)) && s.line == Some(line))
}

/// Every latency row is ordered: p50 ≤ p99 ≤ max, mean ≤ max, and the
/// histogram holds the traced calls.
fn check_latency_rows(report: &Report) {
    for row in &report.allocator.ops {
        // A latency below the calibration's resolution is null, never a
        // made-up number: it is below any given one at or above the
        // resolution, and a given one below the resolution (a median from
        // the untraced loop) is below a null one.
        let resolution = report
            .allocator
            .probe_cost_ns
            .as_ref()
            .map(|p| p.resolution_ns);
        let ordered = |low: Option<u64>, high: Option<u64>, high_name: &str| match high {
            Some(h) => low.is_none_or(|l| l <= h),
            None => {
                assert!(
                    resolution > Some(0),
                    "{high_name} null without a resolution: {row:#?}"
                );
                low.is_none_or(|l| Some(l) < resolution)
            }
        };
        assert!(
            ordered(row.p50_ns, row.p99_ns, "p99_ns") && ordered(row.p99_ns, row.max_ns, "max_ns"),
            "percentiles out of order: {row:#?}"
        );
        assert!(
            ordered(row.mean_ns, row.max_ns, "max_ns"),
            "mean above max: {row:#?}"
        );
        // A count may be unknown (null) in sampled mode; when given, it
        // covers what was traced.
        if let Some(count) = row.count {
            assert!(row.traced <= count, "traced above count: {row:#?}");
        }
        let in_histogram: u64 = row.histogram.iter().map(|&(_, calls)| calls).sum();
        assert_eq!(in_histogram, row.traced, "histogram total: {row:#?}");
    }
}

/// Asserts full mode: every call traced, nothing scaled.
fn assert_full(report: &Report) {
    let a = &report.allocator;
    assert_eq!(a.mode, TraceMode::Full, "{a:#?}");
    assert_eq!(a.traced_fraction, 1.0, "{a:#?}");
    assert!(!a.sampled, "{a:#?}");
}

fn assert_glibc(report: &Report) {
    let library = report.allocator.library.as_deref().unwrap_or_default();
    assert!(library.starts_with("glibc"), "library: {library:?}");
}

fn in_range(value: u64, low: u64, extra: u64, what: &str, report: &Report) {
    assert!(
        (low..=low + extra).contains(&value),
        "{what}: {value}, expected {low}..={} (lost: {}); ops: {:#?}",
        low + extra,
        report.allocator.lost,
        report.allocator.ops
    );
}

/// Proves the latency split by address origin: `reuse 20000` makes 20000
/// malloc(64) on fresh addresses, frees them, then 20000 more that glibc
/// serves from the freed blocks. In full mode every call is counted (the
/// process's first allocation, the workload's warm-up, is left out of the
/// latencies), the two phases come out as "new" and "reused", all small
/// and serial, and the memory composition saw the 1.28 MB peak.
#[test]
fn reuse_split_in_full_mode() {
    if !require_root("reuse_split_in_full_mode") {
        return;
    }
    const N: u64 = 20_000;
    let (report, truth) = launch_truth(
        "alloc-reuse",
        "full",
        &alloc_workload(),
        &["reuse", "20000"],
    );
    assert_glibc(&report);
    assert_full(&report);
    assert_calls_truth(&report, &truth, 0);
    let least = (N as f64 * ORIGIN_SHARE) as u64;
    let new = op_count_where(&report, AllocOp::Malloc, |r| {
        r.origin == Some(BlockOrigin::New)
    });
    let reused = op_count_where(&report, AllocOp::Malloc, |r| {
        r.origin == Some(BlockOrigin::Reused)
    });
    assert!(
        new >= least && reused >= least,
        "new {new}, reused {reused} (expected ≥ {least} each): {:#?}",
        report.allocator.ops
    );
    for row in report
        .allocator
        .ops
        .iter()
        .filter(|r| r.op == AllocOp::Malloc)
    {
        assert_eq!(row.class, SizeClass::Small, "{row:#?}");
        assert_eq!(row.phase, ThreadPhase::Serial, "one thread: {row:#?}");
    }
    check_latency_rows(&report);
    let memory = report
        .allocator
        .memory
        .as_ref()
        .unwrap_or_else(|| panic!("full mode measures memory: {:#?}", report.allocator.memory));
    // 20000 blocks of 64 bytes live at once, and (frees counted) never
    // more than that and libc's stdio buffers.
    assert_between(
        "requested_peak",
        memory.requested_peak as f64,
        (N * 64) as f64,
        (N * 64 + LIBC_EXTRA_BYTES) as f64,
        &format!("{memory:#?}"),
    );
    assert_eq!(
        memory.requested_end, 0,
        "every block of the workload was freed: {memory:#?}"
    );
    assert!(
        memory.usable_peak >= memory.requested_at_peak,
        "a block is at least what was asked: {memory:#?}"
    );
    assert_no_programs_left();
}

/// Proves that large blocks are classed as such and that the syscalls the
/// allocator makes are put inside the call that made them: with a fixed
/// 64 KiB mmap threshold, each malloc(1 MiB) of `large 50 1048576` mmaps
/// its block and each free munmaps it (strace: 50 + 50).
#[test]
fn large_blocks_show_their_mmap_and_munmap() {
    if !require_root("large_blocks_show_their_mmap_and_munmap") {
        return;
    }
    const N: u64 = 50;
    let (report, truth) = launch_truth(
        "alloc-large",
        "full",
        &alloc_workload(),
        &["large", "50", "1048576"],
    );
    assert_calls_truth(&report, &truth, 0);
    assert_glibc(&report);
    assert_full(&report);
    let large = op_count_where(&report, AllocOp::Malloc, |r| r.class == SizeClass::Large);
    assert!(
        large >= N,
        "large mallocs: {large}; {:#?}",
        report.allocator
    );
    let small = op_count_where(&report, AllocOp::Malloc, |r| r.class == SizeClass::Small);
    assert!(
        small < 20,
        "small mallocs: {small}; {:#?}",
        report.allocator
    );
    for (name, inside) in [
        (Syscall::Mmap, AllocOp::Malloc),
        (Syscall::Munmap, AllocOp::Free),
    ] {
        let (count, bytes) = syscall(&report, name, inside);
        // One per call; a block is 1 MiB and a page of header.
        assert!(
            (N..=N + 2).contains(&count) && (N * MIB..=N * (MIB + 8192)).contains(&bytes),
            "{name} inside {inside}: {count} calls, {bytes} bytes; syscalls: {:#?}",
            report.allocator.syscalls
        );
    }
    check_latency_rows(&report);
    // The same syscalls by latency split: the large mallocs' rows hold
    // the mmaps and the page fault of writing each new chunk's header; the
    // large frees' the munmaps; the small calls none.
    let split = |op: AllocOp, class: SizeClass| {
        report
            .allocator
            .ops
            .iter()
            .filter(|r| r.op == op && r.class == class)
            .fold((0, 0), |(s, f), r| (s + r.syscalls, f + r.page_faults))
    };
    let (sys, faults) = split(AllocOp::Malloc, SizeClass::Large);
    assert!(
        (N..=N + 2).contains(&sys) && (N..=4 * N).contains(&faults),
        "large mallocs: {sys} syscalls, {faults} page faults; {:#?}",
        report.allocator.ops
    );
    let (sys, _) = split(AllocOp::Free, SizeClass::Large);
    assert!((N..=N + 2).contains(&sys), "large frees: {sys} syscalls");
    let (sys, _) = split(AllocOp::Malloc, SizeClass::Small);
    assert_eq!(sys, 0, "small mallocs make no syscall here");
    // One 1 MiB block at a time: the peak is one block (and the heap),
    // not fifty (munmaps ignored).
    let memory = report.allocator.memory.as_ref();
    assert_between(
        "mapped_peak",
        memory.map_or(0, |m| m.mapped_peak) as f64,
        MIB as f64,
        (4 * MIB) as f64,
        &format!("{memory:#?}"),
    );
    assert_no_programs_left();
}

/// Proves the serial/parallel split: `mixed 2 20000` makes 2000 small
/// malloc/free pairs on its main thread alone, then two threads make 20000
/// pairs each at once (every 100th of 1 MiB, large).
#[test]
fn mixed_threads_split_serial_and_parallel() {
    if !require_root("mixed_threads_split_serial_and_parallel") {
        return;
    }
    const THREADS: u64 = 2;
    const N: u64 = 20_000;
    let (report, truth) = launch_truth(
        "alloc-mixed",
        "full",
        &alloc_workload(),
        &["mixed", "2", "20000"],
    );
    assert_full(&report);
    assert_calls_truth(&report, &truth, 2);
    let serial = op_count_where(&report, AllocOp::Malloc, |r| r.phase == ThreadPhase::Serial);
    let parallel = op_count_where(&report, AllocOp::Malloc, |r| {
        r.phase == ThreadPhase::Parallel
    });
    let serial_least = (N as f64 / 10.0 * PARALLEL_SHARE) as u64;
    let parallel_least = (THREADS as f64 * N as f64 * PARALLEL_SHARE) as u64;
    assert!(
        serial >= serial_least && parallel >= parallel_least,
        "serial {serial} (≥ {serial_least}), parallel {parallel} (≥ {parallel_least}): {:#?}",
        report.allocator.ops
    );
    assert!(
        report
            .allocator
            .ops
            .iter()
            .any(|r| r.op == AllocOp::Malloc && r.class == SizeClass::Large),
        "the 1 MiB blocks make a large split: {:#?}",
        report.allocator.ops
    );
    check_latency_rows(&report);
    assert_no_programs_left();
}

/// Proves leak reporting by source line: `leak 500` calls leak_some() 500
/// times, which keeps a malloc(100) block at the line marked LEAK, and
/// between those calls churn() mallocs and frees 200 bytes (line NOLEAK).
/// The leaking line tops the live bytes; the churning one leaks nothing.
#[test]
fn leak_site_is_named_by_file_and_line() {
    if !require_root("leak_site_is_named_by_file_and_line") {
        return;
    }
    const N: u64 = 500;
    let (report, truth) = launch_truth("alloc-leak", "full", &alloc_workload(), &["leak", "500"]);
    assert_calls_truth(&report, &truth, 0);
    let sites = &report.allocator.sites;
    let top = sites
        .iter()
        .max_by_key(|s| s.live_bytes)
        .unwrap_or_else(|| panic!("no sites: {:#?}", report.allocator));
    let file = top.file.as_deref().unwrap_or_default();
    assert!(file.ends_with("alloc.c"), "leaking site: {top:#?}");
    assert_eq!(top.line, Some(marked_line("alloc", "// LEAK")), "{top:#?}");
    assert_eq!(top.function, "leak_some", "{top:#?}");
    assert_eq!(top.live_blocks, truth.get("live_blocks"), "{top:#?}");
    assert_eq!(top.live_bytes, truth.get("live_bytes"), "{top:#?}");
    let churn = site_at(&report, "alloc.c", marked_line("alloc", "// NOLEAK"))
        .unwrap_or_else(|| panic!("the malloc(200) site is listed: {sites:#?}"));
    assert_eq!(churn.live_bytes, 0, "freed blocks are no leak: {churn:#?}");
    assert_eq!(churn.live_blocks, 0, "{churn:#?}");
    assert_eq!(
        churn.count,
        Some(N),
        "full mode counts every call: {churn:#?}"
    );
    assert_eq!(churn.bytes, Some(N * 200), "{churn:#?}");
    assert_no_programs_left();
}

/// Proves that allocations from a library loaded with dlopen() after the
/// session started are attributed to its source: `dlopen LIB 300` calls
/// lib_leak(300), which leaks 48-byte blocks at the line marked LIBLEAK of
/// allocator_lib.c.
#[test]
fn dlopened_library_allocations_are_attributed() {
    if !require_root("dlopened_library_allocations_are_attributed") {
        return;
    }
    let lib = build_shared_lib("allocator_lib").expect("building liballocator_lib.so");
    let (report, truth) = launch_truth(
        "alloc-dlopen",
        "full",
        &alloc_workload(),
        &["dlopen", lib.to_str().unwrap(), "300"],
    );
    let line = marked_line("allocator_lib", "// LIBLEAK");
    let site = site_at(&report, "allocator_lib.c", line).unwrap_or_else(|| {
        panic!(
            "no site at allocator_lib.c:{line}: {:#?}",
            report.allocator.sites
        )
    });
    assert_eq!(site.function, "lib_leak", "{site:#?}");
    assert_eq!(site.module, "liballocator_lib.so", "{site:#?}");
    assert_eq!(site.live_blocks, truth.get("live_blocks"), "{site:#?}");
    assert_eq!(site.live_bytes, truth.get("live_bytes"), "{site:#?}");
    assert_no_programs_left();
}

/// Threads and pairs of the `threads` workload in the attach tests: a few
/// hundred thousand calls, a second or two under full tracing.
const ATTACH_THREADS: &str = "4";
const ATTACH_PAIRS: &str = "20000";

/// Attaches to `alloc threads 4 20000` (with `env`) held at its start
/// gate, in allocator mode `mode`: every call of its work is made while
/// traced.
fn attach_threads(name: &str, mode: &str, env: &[(&str, &str)]) -> (Report, Truth) {
    attach_threads_of(name, mode, ATTACH_THREADS, ATTACH_PAIRS, env)
}

/// As [`attach_threads`], for `alloc threads THREADS PAIRS`.
fn attach_threads_of(
    name: &str,
    mode: &str,
    threads: &str,
    pairs: &str,
    env: &[(&str, &str)],
) -> (Report, Truth) {
    let r = attach_gated(
        name,
        &["--alloc-mode", mode, "--lock-mode", "off"],
        &alloc_workload(),
        &["threads", threads, pairs],
        env,
    );
    let report = typed(&r.report);
    assert!(report.target.exited, "{:#?}", report.target);
    (report, r.truth)
}

/// Full mode, attached: the calls are the workload's, exactly (and libc's
/// thread start-up), the blocks it keeps are live at the KEEP_CALL line in
/// exactly the number and bytes it counted, and the other sites leak
/// nothing.
fn assert_attached_full(report: &Report, truth: &Truth, threads: u64, label: &str) {
    assert_full(report);
    assert_calls_truth(report, truth, threads);
    check_latency_rows(report);
    // keep_block() returns malloc's block: a wrapper, passed over.
    let line = marked_line("alloc", "// KEEP_CALL");
    let keep = site_at(report, "alloc.c", line).unwrap_or_else(|| {
        panic!(
            "{label}: no site at alloc.c:{line}: {:#?}",
            report.allocator.sites
        )
    });
    assert_eq!(
        keep.via.as_deref(),
        Some("keep_block"),
        "{label}: {keep:#?}"
    );
    // Every call of the burst was named past the wrapper, even those made
    // before the loader classified its return address.
    assert_eq!(
        report.allocator.named_at_wrapper, 0,
        "{label}: {:#?}",
        report.notes
    );
    assert_eq!(
        keep.live_blocks,
        truth.get("live_blocks"),
        "{label}: {keep:#?}"
    );
    assert_eq!(
        keep.live_bytes,
        truth.get("live_bytes"),
        "{label}: {keep:#?}"
    );
    let live: u64 = report.allocator.sites.iter().map(|s| s.live_bytes).sum();
    assert_between(
        &format!("{label}: live bytes of all sites"),
        live as f64,
        truth.get("live_bytes") as f64,
        (truth.get("live_bytes") + LIBC_EXTRA_BYTES) as f64,
        &format!("{:#?}", report.allocator.sites),
    );
}

/// Proves the main use case for glibc's allocator: attached with -p to a
/// running four-thread process, full mode sees every call.
#[test]
fn attached_full_mode_matches_the_workload_counts() {
    if !require_root("attached_full_mode_matches_the_workload_counts") {
        return;
    }
    let (report, truth) = attach_threads("alloc-attach-full", "full", &[]);
    assert_glibc(&report);
    assert_attached_full(&report, &truth, 4, "glibc");
    // All the counted work is done by the four threads at once; only the
    // main thread's own calls after it joined them (writing its truth
    // file) run alone.
    let serial = op_count_where(&report, AllocOp::Malloc, |r| r.phase == ThreadPhase::Serial);
    assert!(
        serial <= LIBC_EXTRA_CALLS,
        "serial mallocs {serial}: the workers' calls must be parallel: {:#?}",
        report.allocator.ops
    );
    assert_no_programs_left();
}

/// Proves that a preloaded allocator is the one traced and named (not
/// libc's unused malloc), attached to a running multi-threaded process:
/// the report names it and counts the workload's calls exactly.
fn preloaded_allocator_is_named(label: &str, path: &str, prefix: &str) {
    let test = format!("preloaded_{label}_is_named");
    if !require_root(&test) {
        return;
    }
    if !std::path::Path::new(path).exists() {
        skip(
            &test,
            &format!("{path} is not installed (cargo xtask setup installs it)"),
        );
        return;
    }
    let (report, truth) = attach_threads(
        &format!("alloc-preload-{label}"),
        "full",
        &[("LD_PRELOAD", path)],
    );
    let a = &report.allocator;
    let library = a.library.as_deref().unwrap_or_default();
    assert!(library.starts_with(prefix), "{label}: library {library:?}");
    let file = std::path::Path::new(path)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    assert!(
        a.path.as_deref().unwrap_or_default().contains(file),
        "{label}: path {:#?} should name {file}",
        a.path
    );
    assert_attached_full(&report, &truth, 4, label);
    assert_no_programs_left();
}

#[test]
fn preloaded_jemalloc_is_named() {
    let (label, path, prefix) = PRELOADED[0];
    preloaded_allocator_is_named(label, path, prefix);
}

#[test]
fn preloaded_tcmalloc_is_named() {
    let (label, path, prefix) = PRELOADED[1];
    preloaded_allocator_is_named(label, path, prefix);
}

#[test]
fn preloaded_mimalloc_is_named() {
    let (label, path, prefix) = PRELOADED[2];
    preloaded_allocator_is_named(label, path, prefix);
}

/// A launch through `env` that preloads an allocator
/// (`-- env LD_PRELOAD=libjemalloc.so.2 ./alloc ...`): the allocator is
/// the one the program `env` finally runs maps, found before it runs, so
/// every call is traced there. Before #17, `env` and our own environment
/// were inspected: glibc was probed and none of the workload's calls seen.
#[test]
fn env_launch_with_a_preloaded_allocator_traces_that_allocator() {
    let test = "env_launch_with_a_preloaded_allocator_traces_that_allocator";
    if !require_root(test) {
        return;
    }
    let (_, path, prefix) = PRELOADED[0];
    if !std::path::Path::new(path).exists() {
        skip(
            test,
            &format!("{path} is not installed (cargo xtask setup installs it)"),
        );
        return;
    }
    let (report, truth) = launch_preloaded(
        "alloc-env-preload",
        path,
        &["threads", ATTACH_THREADS, ATTACH_PAIRS],
    );
    let a = &report.allocator;
    let library = a.library.as_deref().unwrap_or_default();
    assert!(library.starts_with(prefix), "library {library:?}: {a:#?}");
    assert!(
        a.path
            .as_deref()
            .unwrap_or_default()
            .ends_with("libjemalloc.so.2"),
        "{a:#?}"
    );
    // Launched, the start-up's blocks are seen too (libstdc++'s emergency
    // pool, which jemalloc's C++ runtime brings): the workload's own sites
    // are checked instead of all of them.
    assert_full(&report);
    assert_calls_truth(&report, &truth, ATTACH_THREADS.parse().expect("a number"));
    check_latency_rows(&report);
    let live: u64 = a
        .sites
        .iter()
        .filter(|s| s.module == "alloc")
        .map(|s| s.live_bytes)
        .sum();
    assert_eq!(live, truth.get("live_bytes"), "{:#?}", a.sites);
    assert_no_programs_left();
}

/// glibc (preload "") and each preloaded allocator that is installed,
/// as (label, preload path); a missing one is a loud skip of `test`.
fn installed_allocators(test: &str) -> Vec<(&'static str, &'static str)> {
    let preloaded = PRELOADED.iter().map(|&(label, path, _)| (label, path));
    std::iter::once(("glibc", ""))
        .chain(preloaded)
        .filter(|&(label, path)| {
            let there = path.is_empty() || std::path::Path::new(path).exists();
            if !there {
                skip(test, &format!("{label}: {path} is not installed"));
            }
            there
        })
        .collect()
}

/// Launches `env -u MALLOC_CONF LD_PRELOAD=PRELOAD alloc ARGS` in full
/// mode: the allocator the program finally maps is traced.
fn launch_preloaded(name: &str, preload: &str, args: &[&str]) -> (Report, Truth) {
    let program = alloc_workload();
    let preload = format!("LD_PRELOAD={preload}");
    let mut command = vec![
        "env",
        "-u",
        "MALLOC_CONF",
        &preload,
        program.to_str().expect("UTF-8 path"),
    ];
    command.extend_from_slice(args);
    let (_, report, truth) = trace_truth(name, &full_alloc_launch(&command));
    (typed(&report), truth)
}

/// Usable bytes follow each allocator's own size classes: `alloc sizes
/// 3000` keeps 3000 blocks over every small class and some large ones,
/// and counts the allocator's own account of them (the sum of
/// `malloc_usable_size()`). Launched in full mode under glibc (its chunk
/// headers) and with jemalloc, tcmalloc and mimalloc preloaded (classes
/// computed from the request), the tool's usable bytes at the end are the
/// allocator's within 1% (libc's start-up blocks are the difference).
/// Before #17 tcmalloc's were unknown (the requested bytes, 9% short).
#[test]
fn usable_bytes_are_each_allocators_own_account() {
    let test = "usable_bytes_are_each_allocators_own_account";
    if !require_root(test) {
        return;
    }
    for (label, path) in installed_allocators(test) {
        let name = format!("alloc-sizes-{label}");
        let (report, truth) = launch_preloaded(&name, path, &["sizes", "3000"]);
        let memory = report.allocator.memory.as_ref();
        assert!(
            memory.is_some_and(|m| m.usable_known),
            "{label}: {memory:#?}"
        );
        let usable = memory.map_or(0, |m| m.usable_end);
        assert_usable_near(label, usable, truth.get("live_usable"), 0.01, memory);
    }
    assert_no_programs_left();
}

/// Asserts the tool's live usable bytes are `own` (the allocator's or the
/// program's account) within `tolerance` (0.01: 1%).
fn assert_usable_near(
    label: &str,
    usable: u64,
    own: u64,
    tolerance: f64,
    memory: Option<&MemoryReport>,
) {
    let err = usable as f64 / own as f64 - 1.0;
    assert!(
        err.abs() <= tolerance,
        "{label}: live usable bytes {usable} against {own} ({:+.2}%): {memory:#?}",
        err * 100.0
    );
}

/// Proves that in a static executable the allocator is found in the
/// executable itself (glibc linked in) and traced there.
#[test]
fn static_binary_allocator_is_the_executable() {
    if !require_root("static_binary_allocator_is_the_executable") {
        return;
    }
    let alloc = build_workload("alloc", Variant::Static).expect("building alloc statically");
    let report = launch("alloc-static", "full", &alloc, &["reuse", "5000"]);
    assert_glibc(&report);
    let path = report.allocator.path.as_deref().unwrap_or_default();
    assert!(path.ends_with("alloc-static"), "path: {path:?}");
    let mallocs = op_count(&report, AllocOp::Malloc);
    assert!(mallocs >= 10_000, "malloc calls: {mallocs}");
    assert_no_programs_left();
}

/// CPU seconds (user + system) process `pid` has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("reading /proc/PID/stat");
    // Fields after the command (which may hold spaces) start at state (3);
    // utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks as f64 / hz
}

/// Proves the default sampled mode: on a hot allocator loop the probes are
/// attached only part of the time (the target's CPU stays near its own,
/// far from what full tracing costs), and the report says so: counts are
/// labelled sampled and scaled from the traced ones, and the memory
/// composition, which needs every call, is absent.
#[test]
fn sampled_mode_stays_within_budget_and_labels_counts() {
    if !require_root("sampled_mode_stays_within_budget_and_labels_counts") {
        return;
    }
    // Runs well past the session (attach + 4 s + report); killed at the end.
    let mut target = TestProcess::spawn(&alloc_workload(), &["hold", "15"]);
    target.wait_ready();
    let pid = target.pid();
    let (cpu_before, wall_before) = (cpu_seconds(pid), Instant::now());
    let (_, report) = trace(
        "alloc-sampled",
        &["-p", &pid.to_string(), "--duration", "4s", "--no-tui"],
    );
    let (cpu, wall) = (
        cpu_seconds(pid) - cpu_before,
        wall_before.elapsed().as_secs_f64(),
    );
    assert!(
        target.child.try_wait().unwrap().is_none(),
        "the target must survive the session"
    );
    let report = typed(&report);
    let a = &report.allocator;
    assert_eq!(a.mode, TraceMode::Sampled, "the default: {a:#?}");
    assert!(a.sampled, "{a:#?}");
    let fraction = a.traced_fraction;
    assert!(
        fraction > 0.0 && fraction <= SAMPLED_MAX_FRACTION,
        "traced_fraction {fraction}: the budget must force gaps"
    );
    assert!(
        a.memory.is_none(),
        "no memory composition from a sample: {:#?}",
        a.memory
    );
    assert!(
        cpu / wall <= SAMPLED_MAX_TARGET_CPU,
        "the target used {cpu:.2} s of CPU in {wall:.2} s while traced"
    );
    let traced = sum_ops(&report, AllocOp::Malloc, |row| row.traced, |_| true);
    assert!(traced > 0, "mallocs traced in the windows: {:#?}", a.ops);
    // The workload makes at most ~1000 pairs per ms of wall time; whether
    // the estimate is right is checked against its own count in
    // sampled_counts_are_within_their_claimed_error. This loop is hot
    // enough that the count may be unknown (null): then nothing to check.
    if let Some(count) = op_count_if_known(&report, AllocOp::Malloc) {
        assert_between(
            "malloc count (estimate)",
            count as f64,
            traced as f64,
            wall * 1e6,
            &format!("{:#?}", a.ops),
        );
    }
    check_latency_rows(&report);
    drop(target);
    assert_no_programs_left();
}

/// Proves `--alloc-mode off`: the report has no allocator data, and while
/// the session runs no uprobe of ours is attached (seen with bpftool; the
/// CPU sampler being seen attached shows the check can see attachments).
#[test]
fn off_mode_attaches_no_allocator_probes() {
    if !require_root("off_mode_attaches_no_allocator_probes") {
        return;
    }
    let alloc = alloc_workload();
    let report = launch("alloc-off", "off", &alloc, &["small", "1000"]);
    let a = &report.allocator;
    assert_eq!(a.mode, TraceMode::Off, "{a:#?}");
    for (key, len) in [
        ("ops", a.ops.len()),
        ("syscalls", a.syscalls.len()),
        ("sites", a.sites.len()),
    ] {
        assert_eq!(len, 0, "{key} must be empty: {a:#?}");
    }
    assert_eq!(a.calls_traced, 0, "{a:#?}");
    assert!(a.memory.is_none(), "{a:#?}");
    assert_no_programs_left();

    // The same on a process that allocates all the time, watched from
    // outside while the tool runs.
    let json = report_path("alloc-off-watched");
    let tool = std::process::Command::new(tool())
        .args([
            "--alloc-mode",
            "off",
            "--no-tui",
            "--duration",
            "2s",
            "--json",
        ])
        .arg(&json)
        .arg("--")
        .arg(&alloc)
        .args(["hold", "10"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting memprof-ebpf");
    let (start, tool_pid) = (Instant::now(), tool.id());
    let mut seen = Vec::new();
    while_running(tool_pid, Duration::from_secs(30), || {
        seen.extend(attached_programs(tool_pid))
    });
    let run = finish(tool, start, Duration::from_secs(60));
    assert_eq!(run.code(), 0, "stderr: {}", run.stderr);
    assert_eq!(read_typed(&json).allocator.mode, TraceMode::Off);
    assert!(
        seen.iter().any(|p| p.prog_type == "perf_event"),
        "the CPU sampler was never seen attached, so this check sees nothing: {seen:?}"
    );
    // The lock uprobes (mp_lock_*, mp_unlock) have their own switch.
    let uprobes: Vec<_> = seen
        .iter()
        .filter(|p| p.prog_type == "kprobe" && p.name.starts_with("mp_alloc"))
        .collect();
    assert!(
        uprobes.is_empty(),
        "allocator uprobes attached in off mode: {uprobes:?}"
    );
    assert_no_programs_left();
}

/// The default mode attached to a running two-thread process: windows
/// within the budget, no more calls traced than the workload made, and a
/// count that is either unknown (null: this hot a loop cannot be
/// extrapolated, see hot_allocator_counts_are_unknown_rather_than_wrong)
/// or between what was traced and twice the truth. Before #17 a process
/// that is idle when attached and then allocates hard was traced all the
/// time (traced_fraction 1.0 over 9 s, 2.2 M events lost): a ring drained
/// as fast as the target fills it kept the loader from ever closing the
/// window.
#[test]
fn attached_default_mode_traces_in_windows() {
    if !require_root("attached_default_mode_traces_in_windows") {
        return;
    }
    let r = attach_gated(
        "alloc-attach-default",
        &["--lock-mode", "off"],
        &alloc_workload(),
        &["threads", "2", "2000000"],
        &[],
    );
    let report = typed(&r.report);
    let a = &report.allocator;
    assert_eq!(a.mode, TraceMode::Sampled, "the default: {a:#?}");
    let fraction = a.traced_fraction;
    assert_between(
        "traced_fraction",
        fraction,
        0.001,
        SAMPLED_MAX_FRACTION,
        &format!("{a:#?}"),
    );
    assert!(a.memory.is_none(), "no memory composition from a sample");
    let real = r.truth.get("malloc");
    let traced = sum_ops(&report, AllocOp::Malloc, |row| row.traced, |_| true);
    assert_between(
        "mallocs traced",
        traced as f64,
        1.0,
        real as f64,
        &format!("{:#?}", a.ops),
    );
    if let Some(count) = op_count_if_known(&report, AllocOp::Malloc) {
        assert_between(
            "malloc count (estimate)",
            count as f64,
            traced as f64,
            2.0 * real as f64,
            &format!("{:#?}", a.ops),
        );
    }
    check_latency_rows(&report);
    assert_no_programs_left();
}

/// The default mode attached to a running process with a moderate
/// allocator load (`alloc work` with twice its default hashing: a malloc
/// and a free per ~20 us, ~12 s, running at that rate before the attach
/// too): the estimated calls must be near the workload's own count, and
/// the report must claim an error that covers the truth. Before #17 the
/// count was the calls traced ÷ the traced time fraction, 1000x low on a
/// hot allocator, with no error claimed.
///
/// At this rate the probes slow the target by ~20% while attached, and
/// the claim is ~±13%. At the default hashing (~35% slower attached) it
/// was ±20–27%, and with the work starting on the go signal, inside the
/// first window, the rates varied enough between windows to claim over
/// ±30% in 3 runs of 8, and the count was (rightly) unknown: that rate
/// is for the bench, the unknown case for the hot test below.
#[test]
fn sampled_counts_are_within_their_claimed_error() {
    if !require_root("sampled_counts_are_within_their_claimed_error") {
        return;
    }
    let r = attach_gated(
        "alloc-attach-sampled",
        &["--lock-mode", "off"],
        &alloc_workload(),
        &["work", "600000", "8192"],
        &[],
    );
    let report = typed(&r.report);
    let a = &report.allocator;
    assert_eq!(a.mode, TraceMode::Sampled, "{a:#?}");
    let (estimate, real) = (op_count(&report, AllocOp::Malloc), r.truth.get("malloc"));
    assert_near(
        "malloc calls (estimate)",
        estimate,
        real,
        SAMPLED_COUNT_TOLERANCE,
        &format!("{:#?}", a.ops),
    );
    let claimed = a
        .count_error
        .unwrap_or_else(|| panic!("the report claims no error for its estimates: {a:#?}"));
    assert!(
        (estimate as f64 - real as f64).abs() <= claimed * real as f64,
        "estimate {estimate}, truth {real}: outside the claimed ±{claimed}"
    );
    assert_no_programs_left();
}

/// A hot allocator (two threads of back-to-back malloc/free pairs, 15 ns
/// each untraced; ~1.5 us each under the probes) cannot be counted from
/// windows: the rate seen while attached is 100x below the real one, and
/// the correction is a small difference of large numbers. The counts must
/// then be unknown (null, with `traced` given and a note saying why), not
/// a number: before #17 this session reported ~1% of the calls as exact.
#[test]
fn hot_allocator_counts_are_unknown_rather_than_wrong() {
    if !require_root("hot_allocator_counts_are_unknown_rather_than_wrong") {
        return;
    }
    let r = attach_gated(
        "alloc-attach-hot",
        &["--lock-mode", "off"],
        &alloc_workload(),
        &["threads", "2", "20000000"],
        &[],
    );
    let report = typed(&r.report);
    let a = &report.allocator;
    assert_eq!((a.mode, a.sampled), (TraceMode::Sampled, true), "{a:#?}");
    let real = r.truth.get("malloc");
    for row in a.ops.iter().filter(|row| row.op == AllocOp::Malloc) {
        let traced = row.traced;
        match row.count {
            // A number is only allowed if it is right within its claim.
            Some(_) => {
                let count = op_count(&report, AllocOp::Malloc);
                let claimed = a.count_error.expect("a claimed error");
                assert!(
                    (count as f64 - real as f64).abs() <= claimed * real as f64,
                    "count {count}, truth {real}, claimed ±{claimed}: {a:#?}"
                );
                return;
            }
            None => assert!(row.count.is_none() && traced > 0, "{row:#?}"),
        }
    }
    let notes = &report.notes;
    assert!(
        notes.iter().any(|n| n.contains("unknown")),
        "a note says why the counts are unknown: {notes:#?}"
    );
    assert_no_programs_left();
}

/// What `workloads/slowalloc.c` costs: its malloc busy-waits this long,
/// its free the next (then glibc's ~20 ns each, and what
/// [`slowalloc_excess_ns`] measures).
pub(crate) const SLOW_MALLOC_NS: u64 = 3_000;
pub(crate) const SLOW_FREE_NS: u64 = 1_000;

/// How much longer than nominal each of slowalloc's calls (`lib`, a build
/// of it waiting [`SLOW_MALLOC_NS`] and [`SLOW_FREE_NS`]) really takes,
/// untraced: its busy waits end at the first clock read past their time
/// (a read costs ~27 ns here), and glibc's call follows, so a pair takes
/// ~4,150 ns, not 4,000; the excess splits evenly, as both calls wait the
/// same way. Busy waits only get longer when the VM preempts them, so the
/// fastest of three timings of the pair is their cost (one run of a noisy
/// CI machine timed 4,407 ns).
pub(crate) fn slowalloc_excess_ns(lib: &std::path::Path) -> f64 {
    let real_pair = (0..3)
        .map(|_| untraced_pairs_ns(lib.to_str().expect("UTF-8 path"), 50_000))
        .fold(f64::INFINITY, f64::min);
    let excess = (real_pair - (SLOW_MALLOC_NS + SLOW_FREE_NS) as f64) / 2.0;
    assert!(
        (0.0..200.0).contains(&excess),
        "slowalloc's pair {real_pair:.1} ns: its waits are not what it says"
    );
    excess
}

/// How far a reported latency may be from the truth: 20% or 50 ns,
/// whichever is larger. The issue's target is 10%, which the benchmark
/// (`cargo xtask bench --only latency`) judges: the calibration varies
/// from session to session (540-880 ns added latency measured), so one
/// run in three or four lands 10-12% off. Without the calibration the
/// same calls are +22% (malloc) and +65% (free): still caught here.
fn latency_tolerance(truth: u64) -> f64 {
    (0.2f64).max(50.0 / truth as f64)
}

/// Attaches in full mode to `alloc threads 2 5000` with slowalloc
/// preloaded: an allocator whose latencies are known.
fn attach_slowalloc(name: &str) -> Report {
    let lib = build_shared_lib("slowalloc").expect("building libslowalloc.so");
    attach_slowalloc_with(name, &lib, &[])
}

/// As [`attach_slowalloc`], with `lib` (a build of slowalloc) and more
/// variables in the target's environment.
fn attach_slowalloc_with(name: &str, lib: &std::path::Path, env: &[(&str, &str)]) -> Report {
    let mut vars = vec![("LD_PRELOAD", lib.to_str().expect("UTF-8 path"))];
    vars.extend_from_slice(env);
    let (report, truth) = attach_threads_of(name, "full", "2", "5000", &vars);
    let path = report.allocator.path.as_deref().unwrap_or_default();
    let file = lib.file_name().and_then(|f| f.to_str()).unwrap_or_default();
    assert!(
        path.ends_with(file),
        "the preloaded allocator is traced: {path}"
    );
    assert_attached_full(&report, &truth, 2, "slowalloc");
    report
}

/// slowalloc built with both its malloc and free busy-waiting `ns`
/// (`libslowalloc-<ns>.so`).
fn slowalloc_of(ns: u64) -> std::path::PathBuf {
    let defines = [
        format!("-DSLOWALLOC_MALLOC_NS={ns}"),
        format!("-DSLOWALLOC_FREE_NS={ns}"),
    ];
    build_shared_lib_with("slowalloc", &format!("slowalloc-{ns}"), &defines)
        .expect("building a slowalloc variant")
}

/// The medians of the small mallocs and frees, weighted by calls, with
/// where they came from (`p50_basis`); every busy row has one.
fn small_medians(report: &Report, op: AllocOp) -> (u64, Vec<Option<LatencyBasis>>) {
    let rows: Vec<&OpStats> = report
        .allocator
        .ops
        .iter()
        .filter(|r| r.op == op && r.class == SizeClass::Small)
        .collect();
    let calls: u64 = rows.iter().map(|r| r.traced).sum();
    let busy = rows.iter().filter(|r| r.traced * 100 >= calls.max(1));
    let (mut weighted, mut weight, mut bases) = (0, 0, vec![]);
    for r in busy {
        let p50 = r
            .p50_ns
            .unwrap_or_else(|| panic!("{op}: a busy row without a median: {r:#?}"));
        let traced = r.traced;
        weighted += p50 * traced;
        weight += traced;
        bases.push(r.p50_basis);
    }
    assert!(weight > 0, "no small {op} traced: {:#?}", report.allocator);
    (weighted / weight, bases)
}

/// Proves that latencies are measured, not made up: an allocator whose
/// malloc takes 2 us is reported at 2 us or more, and below the 10 us a
/// wrong pairing of entries and returns would give.
#[test]
fn a_slow_allocator_is_reported_slow() {
    if !require_root("a_slow_allocator_is_reported_slow") {
        return;
    }
    let report = attach_slowalloc("alloc-slow");
    assert_between(
        "malloc p50 (ns)",
        small_medians(&report, AllocOp::Malloc).0 as f64,
        SLOW_MALLOC_NS as f64,
        5.0 * SLOW_MALLOC_NS as f64,
        &format!("{:#?}", report.allocator.ops),
    );
    assert_no_programs_left();
}

/// The probe's own cost is not the allocator's, and the program's own
/// calls are measured: slowalloc built fast (50 ns) but made slow in the
/// target only (its environment sets malloc 3 us, free 1 us, which the
/// tool's untraced helper does not inherit) is reported at 3 us and 1 us
/// within 20% (or 50 ns) from the traced calls (`p50_basis` "traced"),
/// not at the helper's ~100 ns, and the calibration taken off is in the
/// report. Before #17 malloc was reported at +0.4 to +0.9 us and free at
/// +0.4 us (the probes' own traps).
#[test]
fn latencies_exclude_the_probes_own_cost() {
    if !require_root("latencies_exclude_the_probes_own_cost") {
        return;
    }
    let env = [
        ("SLOWALLOC_MALLOC_NS", "3000"),
        ("SLOWALLOC_FREE_NS", "1000"),
    ];
    // The default build waits as long as the environment makes this one.
    let excess = slowalloc_excess_ns(&build_shared_lib("slowalloc").expect("slowalloc"));
    let report = attach_slowalloc_with("alloc-latency", &slowalloc_of(50), &env);
    let a = &report.allocator;
    for (op, truth) in [
        (AllocOp::Malloc, SLOW_MALLOC_NS),
        (AllocOp::Free, SLOW_FREE_NS),
    ] {
        let (p50, bases) = small_medians(&report, op);
        assert!(
            bases.iter().all(|&b| b == Some(LatencyBasis::Traced)),
            "{op}: {bases:?}"
        );
        // The busy-wait plus its last clock read and glibc's own call.
        assert_near(
            &format!("{op} p50 (ns)"),
            p50,
            truth + excess.round() as u64,
            latency_tolerance(truth),
            &format!("{:#?}", a.ops),
        );
    }
    let helper = a.untraced_ns.as_ref().map_or(f64::NAN, |u| u.malloc_ns);
    assert!(helper < 1000.0, "the helper timed the fast build: {a:#?}");
    let cost = a.probe_cost_ns.as_ref().unwrap_or_else(|| panic!("{a:#?}"));
    assert!(
        cost.kinds.iter().any(|k| k.added_ns > 0),
        "the correction is reported: {cost:#?}"
    );
    assert!(cost.resolution_ns > 0, "{cost:#?}");
    assert_no_programs_left();
}

/// Launches `alloc loop N` in full mode with `preload` (nothing: glibc)
/// and returns the report and the loop's own untraced cost of a
/// malloc-free pair, timed side by side.
fn loop_medians(name: &str, preload: &str, timed_pairs: u64) -> (Report, f64) {
    let truth_pair = untraced_pairs_ns(preload, timed_pairs);
    let (report, _) = launch_preloaded(name, preload, &["loop", "200000"]);
    (report, truth_pair)
}

/// Each allocator's small malloc and free are reported at what they cost:
/// `alloc loop` (a malloc(64)-free pair at a time) in full mode under
/// glibc, jemalloc, tcmalloc and mimalloc, the medians of malloc plus
/// free within the issue's ±30% (or ±20 ns) of the workload's own
/// untraced timed loop. Traced, each call carries the probes' traps
/// (0.1-0.9 us on these VMs, their spread 10-930 ns): the medians come
/// from the allocator's untraced cost timed by the helper where the
/// traced calls cannot tell it apart (`p50_basis` "untraced_loop").
/// Before #35 glibc's was the correction's noise (1-39 ns, "1 ns" in
/// the JSON) and the others were not checked.
#[test]
fn small_malloc_medians_are_each_allocators_untraced_cost() {
    let test = "small_malloc_medians_are_each_allocators_untraced_cost";
    if !require_root(test) {
        return;
    }
    for (label, preload) in installed_allocators(test) {
        let (report, truth_pair) =
            loop_medians(&format!("alloc-median-{label}"), preload, UNTRACED_PAIRS);
        let (malloc, mb) = small_medians(&report, AllocOp::Malloc);
        let (free, fb) = small_medians(&report, AllocOp::Free);
        let pair = (malloc + free) as f64;
        let allowed = (0.3 * truth_pair).max(20.0);
        assert!(
            pair >= 1.0 && (pair - truth_pair).abs() <= allowed,
            "{label}: malloc {malloc} ns ({mb:?}) + free {free} ns ({fb:?}) against the \
             loop's pair {truth_pair:.1} ns: {:#?}",
            report.allocator
        );
    }
    assert_no_programs_left();
}

/// Shims of known latency (slowalloc built with malloc and free each
/// busy-waiting 50 ns, 200 ns, 1 us; a busy-wait's clock reads make them
/// longer, so the truth is the workload's own untraced pair with the shim
/// preloaded) are reported within the issue's 10%: the medians of malloc
/// plus free in full mode under `alloc loop`. Known wrong until the
/// helper timed long rounds of pairs (1706bca): CI runs failed on the
/// 200 ns shim at -12% (session 29) and the 50 ns one at +21% (190 ns for
/// 157, session 30, from the helper's mean of its two call patterns).
/// After: 5 runs of 5 passed by hand, the last within 2% (174 ns for
/// 176, 472 for 464, 2,093 for 2,109).
#[test]
fn shims_of_known_latency_are_reported_within_ten_percent() {
    if !require_root("shims_of_known_latency_are_reported_within_ten_percent") {
        return;
    }
    assert_shims(0.10);
}

/// Each shim's malloc + free medians within `tolerance` of the truth.
fn assert_shims(tolerance: f64) {
    for ns in [50, 200, 1000] {
        let lib = slowalloc_of(ns);
        let lib = lib.to_str().expect("UTF-8 path");
        // About half a second of the shim's spins: 20 M pairs took 40 s
        // at 1 us, for a figure no steadier than this one.
        let pairs = 250_000_000 / ns;
        let (report, truth_pair) = loop_medians(&format!("alloc-shim-{ns}"), lib, pairs);
        let path = report.allocator.path.as_deref().unwrap_or_default();
        assert!(path.ends_with(&format!("libslowalloc-{ns}.so")), "{path}");
        let (malloc, mb) = small_medians(&report, AllocOp::Malloc);
        let (free, fb) = small_medians(&report, AllocOp::Free);
        let a = &report.allocator;
        assert_near(
            &format!("{ns} ns shim: malloc ({mb:?}) + free ({fb:?}) medians"),
            malloc + free,
            truth_pair.round() as u64,
            tolerance,
            &format!("{:#?}\n{:#?}\n{:#?}", a.untraced_ns, a.probe_cost_ns, a.ops),
        );
    }
    assert_no_programs_left();
}

const REDIS_SERVER: &str = "/usr/bin/redis-server";
const REDIS_CLI: &str = "/usr/bin/redis-cli";
const REDIS_BENCHMARK: &str = "/usr/bin/redis-benchmark";

/// Redis's own account of its heap (`used_memory` of `INFO memory`, in
/// bytes).
fn redis_used_memory(port: &str) -> u64 {
    let out = std::process::Command::new(REDIS_CLI)
        .args(["-p", port, "info", "memory"])
        .output()
        .expect("running redis-cli");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no used_memory from redis-cli: {out:?}"))
}

/// How far the usable bytes the tool saw allocated and not freed may be
/// from the growth of redis's own count (the issue's target). Redis counts
/// `malloc_usable_size`, jemalloc's size classes, which the tool computes;
/// it also counts frees of blocks older than the session, which the tool
/// cannot: measured 32 bytes apart in 40.5 MB, and 64 in 40.5 MB (#35,
/// whose target is 5%).
const REDIS_TOLERANCE: f64 = 0.05;

/// Proves the allocator profile on a third-party program: attached to a
/// running redis-server (Debian's, jemalloc dynamically linked), full
/// mode names jemalloc, and while redis-benchmark stores 200,000 keys with
/// 100-byte values the usable bytes left live match the growth of redis's
/// own `used_memory`. Before #17: 17.2 MB requested for 40.5 MB grown,
/// `usable_known: false` (jemalloc rounds a 100-byte value's object up to
/// its class, and redis counts that).
#[test]
fn redis_heap_growth_matches_its_own_count() {
    const TEST: &str = "redis_heap_growth_matches_its_own_count";
    if !require_root(TEST) {
        return;
    }
    if !std::path::Path::new(REDIS_SERVER).exists() {
        skip(
            TEST,
            &format!("{REDIS_SERVER} is not installed (cargo xtask setup installs it)"),
        );
        return;
    }
    let port = (20000 + std::process::id() % 20000).to_string();
    let server = TestProcess::spawn(
        std::path::Path::new(REDIS_SERVER),
        &[
            "--port",
            &port,
            "--save",
            "",
            "--appendonly",
            "no",
            "--bind",
            "127.0.0.1",
        ],
    );
    let started = Instant::now();
    while std::process::Command::new(REDIS_CLI)
        .args(["-p", &port, "ping"])
        .output()
        .map_or(true, |o| {
            !String::from_utf8_lossy(&o.stdout).contains("PONG")
        })
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = redis_used_memory(&port);
    let json = report_path("alloc-redis");
    let pid = server.pid().to_string();
    // Full mode attaches every probe before the tool says it traces.
    let tool = TracingTool::start(&[
        "-p",
        &pid,
        "--alloc-mode",
        "full",
        "--lock-mode",
        "off",
        "--no-tui",
        "--duration",
        "60s",
        "--json",
        json.to_str().expect("UTF-8 path"),
    ]);
    let bench = std::process::Command::new(REDIS_BENCHMARK)
        .args([
            "-p",
            &port,
            "-t",
            "set",
            "-n",
            "200000",
            "-d",
            "100",
            "-r",
            "100000000",
            "-P",
            "16",
            "-q",
        ])
        .output()
        .expect("running redis-benchmark");
    assert!(bench.status.success(), "redis-benchmark: {bench:?}");
    let after = redis_used_memory(&port);
    // SAFETY: kill with the pid of our own unreaped child.
    unsafe { libc::kill(tool.pid() as i32, libc::SIGINT) };
    let run = tool.finish(Duration::from_secs(60));
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let report = read_typed(&json);
    let a = &report.allocator;
    assert!(
        a.library
            .as_deref()
            .unwrap_or_default()
            .starts_with("jemalloc"),
        "redis uses jemalloc: {:#?}",
        a.library
    );
    let memory = a.memory.as_ref();
    assert!(memory.is_some_and(|m| m.usable_known), "{memory:#?}");
    let live = memory
        .map(|m| m.usable_end)
        .unwrap_or_else(|| panic!("allocator.memory.usable_end: {a:#?}"));
    assert_near(
        "usable bytes allocated and not freed",
        live,
        after.saturating_sub(before),
        REDIS_TOLERANCE,
        &format!("{memory:#?}"),
    );
    drop(server);
    assert_no_programs_left();
}

/// The entry points besides malloc and free that a program built for its
/// allocator calls (#35): the C++ operators' sized, aligned and nothrow
/// forms, and jemalloc's `mallocx`/`rallocx`/`xallocx`/`sdallocx`/
/// `dallocx`, each implemented inside the allocator without passing
/// through `malloc` or `free`. `allocapi` allocates through every one the
/// preloaded allocator defines and releases every other block through
/// them; the tool's live usable bytes are the allocator's own sum of
/// `malloc_usable_size()` over what it keeps. Before #35 the releases were
/// not seen and jemalloc's own calls not at all (jemalloc: 150 MB kept,
/// most of it unseen or seen live after its release). The tolerance is
/// mimalloc's: its blocks for `new(size, align_val_t(64))` are over-sized
/// by a run-time choice the request does not tell (about 3% of those).
#[test]
fn nonstandard_entry_points_keep_the_allocators_account() {
    let test = "nonstandard_entry_points_keep_the_allocators_account";
    if !require_root(test) {
        return;
    }
    let program = build_workload("allocapi", Variant::Debug).expect("building allocapi");
    for (label, path, _) in PRELOADED {
        if !std::path::Path::new(path).exists() {
            skip(test, &format!("{label}: {path} is not installed"));
            continue;
        }
        let preload = format!("LD_PRELOAD={path}");
        let command = [
            "env",
            "-u",
            "MALLOC_CONF",
            &preload,
            program.to_str().expect("UTF-8 path"),
            "20000",
        ];
        let (_, report, truth) =
            trace_truth(&format!("allocapi-{label}"), &full_alloc_launch(&command));
        let report = typed(&report);
        let a = &report.allocator;
        assert_full(&report);
        // Every call through them is counted, once (a plain delete that
        // jumps to the allocator's free is counted as that free), besides
        // libc's few (the truth file's stdio).
        let calls: u64 = a.ops.iter().map(|o| o.count.unwrap_or(0)).sum();
        assert_between(
            &format!("{label}: allocator calls"),
            calls as f64,
            truth.get("api_calls") as f64,
            (truth.get("api_calls") + 2 * LIBC_EXTRA_CALLS) as f64,
            &format!("{:#?}", a.ops),
        );
        if label == "jemalloc" {
            for op in [
                AllocOp::Mallocx,
                AllocOp::Rallocx,
                AllocOp::Xallocx,
                AllocOp::Sdallocx,
                AllocOp::Dallocx,
            ] {
                assert!(
                    op_count(&report, op) > 0,
                    "{label}: no {op} call: {:#?}",
                    a.ops
                );
            }
        }
        let memory = a.memory.as_ref();
        let usable = memory.map_or(0, |m| m.usable_end);
        assert_usable_near(label, usable, truth.get("live_usable"), 0.02, memory);
    }
    assert_no_programs_left();
}

/// The allocator's share of the CPU comes from the CPU samples, in every
/// mode (#35): `alloc loop` does nothing but malloc(64)/free, so in the
/// default (sampled) mode most of its samples land in glibc's malloc code
/// (measured: 93%, the rest the loop in main and the probes' traps); a
/// CPU-bound program that only allocates while starting has under 1%.
#[test]
fn allocator_cpu_share_comes_from_the_samples() {
    if !require_root("allocator_cpu_share_comes_from_the_samples") {
        return;
    }
    let report = launch(
        "alloc-cpu-loop",
        "sampled",
        &alloc_workload(),
        &["loop", "50000000"],
    );
    let cpu = report.allocator.cpu.as_ref();
    let share = cpu.map_or(0.0, |c| c.share);
    assert!(
        share >= 0.7,
        "allocator CPU share {share} of a malloc/free loop: {cpu:#?}"
    );
    let ops: Vec<AllocOp> = cpu
        .unwrap_or_else(|| panic!("functions is not an array: {cpu:#?}"))
        .functions
        .iter()
        .filter_map(|f| f.op)
        .collect();
    assert!(
        ops.contains(&AllocOp::Malloc) && ops.contains(&AllocOp::Free),
        "{cpu:#?}"
    );
    let spin = build_workload("spin", Variant::Debug).expect("building spin");
    let spin = spin.to_str().expect("UTF-8 path");
    let (_, report) = trace(
        "alloc-cpu-spin",
        &[
            "--alloc-mode",
            "sampled",
            "--no-tui",
            "--",
            spin,
            "time",
            "2",
            "1",
        ],
    );
    let report = typed(&report);
    let cpu = report.allocator.cpu.as_ref();
    assert!(report.sampling.samples > 100, "{:#?}", report.sampling);
    // spin allocates only while starting (stdio, its threads): a sample
    // may land there (seen once: __glibc_morecore), no more than that.
    assert!(
        cpu.is_some_and(|c| c.share < 0.01),
        "a program that allocates only at start-up: {cpu:#?}"
    );
    assert_no_programs_left();
}

/// The allocator's code range the CPU samples are matched against is
/// that of the program the target runs now: launched through a shell
/// that lives half a second (glibc-linked, like `env`) before it
/// `exec`s the workload, the range written for the shell's libc was
/// kept, and no sample of the workload's allocator got a site (seen in
/// CI through `env`, whose life is a millisecond).
#[test]
fn allocator_cpu_sites_follow_an_exec() {
    let test = "allocator_cpu_sites_follow_an_exec";
    if !require_root(test) {
        return;
    }
    let program = alloc_workload();
    let (_, report) = trace(
        "alloc-cpu-exec",
        &[
            "--alloc-mode",
            "sampled",
            "--no-tui",
            "--",
            "sh",
            "-c",
            "sleep 0.5; exec \"$0\" split 3",
            program.to_str().expect("UTF-8 path"),
        ],
    );
    let report = typed(&report);
    let cpu = report.allocator.cpu.as_ref();
    let samples = cpu.map_or(0, |c| c.samples);
    let sited = cpu.map_or(0, |c| c.site_samples - c.sites_unknown);
    assert!(samples >= 300, "too few samples to judge: {cpu:#?}");
    assert!(
        sited as f64 >= 0.8 * samples as f64,
        "{sited} of the allocator's {samples} samples got a site: {cpu:#?}"
    );
    assert_no_programs_left();
}

/// The allocator's CPU time is split by the call it was spent for
/// (#35 item 3), in the default mode, for glibc and each preloaded
/// allocator: `alloc split 3` calls malloc(64)/free three times from
/// split_a() (SPLIT_A) for each time from split_b() (SPLIT_B, through
/// xmalloc), so 3/4 of the time in the allocator is SPLIT_A's. The
/// samples' stacks are unwound from the allocator's code, which keeps no
/// frame pointer; before, the sample's own stack skipped the caller.
/// Samples in a function's epilogue (after `pop %rbp`) unwind too: at
/// most 5% of the samples are left without a site (23% on one machine
/// while those stopped the walk).
#[test]
fn allocator_cpu_is_split_by_call_site() {
    let test = "allocator_cpu_is_split_by_call_site";
    if !require_root(test) {
        return;
    }
    let program = alloc_workload();
    let (line_a, line_b) = (
        marked_line("alloc", "// SPLIT_A"),
        marked_line("alloc", "// SPLIT_B"),
    );
    for (label, preload) in installed_allocators(test) {
        let preload = format!("LD_PRELOAD={preload}");
        let (_, report) = trace(
            &format!("alloc-cpu-split-{label}"),
            &[
                "--alloc-mode",
                "sampled",
                "--no-tui",
                "--",
                "env",
                "-u",
                "MALLOC_CONF",
                &preload,
                program.to_str().expect("UTF-8 path"),
                "split",
                "3",
            ],
        );
        let report = typed(&report);
        let cpu = report.allocator.cpu.as_ref();
        let samples = cpu.map_or(0, |c| c.site_samples);
        let unknown = cpu.map_or(0, |c| c.sites_unknown);
        assert!(
            samples >= 300,
            "{label}: too few samples to judge: {cpu:#?}"
        );
        assert!(
            unknown as f64 <= 0.05 * samples as f64,
            "{label}: stacks not unwound out of the allocator: {cpu:#?}"
        );
        let sites = cpu
            .map(|c| c.sites.as_slice())
            .unwrap_or_else(|| panic!("sites is not an array: {cpu:#?}"));
        let at = |line: u32| -> u64 {
            sites
                .iter()
                .filter(|s| {
                    s.site.line == Some(line)
                        && s.site
                            .file
                            .as_deref()
                            .is_some_and(|f| f.ends_with("alloc.c"))
                })
                .map(|s| s.samples)
                .sum()
        };
        let (a, b) = (at(line_a), at(line_b));
        assert!(
            (a + b) as f64 >= 0.8 * (samples - unknown) as f64,
            "{label}: the two sites take the allocator's time ({a} + {b} of {samples}): {cpu:#?}"
        );
        let share = a as f64 / (a + b).max(1) as f64;
        assert!(
            (0.62..=0.88).contains(&share),
            "{label}: SPLIT_A's share {share:.3}, 0.75 expected: {cpu:#?}"
        );
        let via_xmalloc = sites
            .iter()
            .any(|s| s.site.line == Some(line_b) && s.site.via.as_deref() == Some("xmalloc"));
        assert!(
            via_xmalloc,
            "{label}: SPLIT_B's malloc named past xmalloc: {cpu:#?}"
        );
    }
    assert_no_programs_left();
}

/// Claimed errors above this leave counts unknown (the tool's
/// `MAX_COUNT_ERROR`).
const MAX_COUNT_ERROR: f64 = 0.3;

/// The workload's own untraced timing of `alloc loop` (ns per
/// malloc-free pair, [`UNTRACED_PAIRS`] over its runs), with `preload`
/// (empty: glibc).
fn untraced_pair_ns(preload: &str) -> f64 {
    untraced_pairs_ns(preload, UNTRACED_PAIRS)
}

/// Pairs an allocator's untraced loop times, in all its runs: about
/// 0.2-0.5 s of a real allocator's small pairs (10-25 ns each).
const UNTRACED_PAIRS: u64 = 20_000_000;

/// Runs of the loop [`untraced_pairs_ns`] takes the median of.
const UNTRACED_RUNS: u64 = 5;

/// As [`untraced_pair_ns`], timing `pairs` pairs: the median of
/// [`UNTRACED_RUNS`] runs of a fifth of them each, as the tool's helper
/// takes the median of its rounds. One run of ~1 s timed the 50 ns shim's
/// pair at 195 ns in a CI run (2026-12-07) where the helper's rounds
/// agreed on 164-167 and ten runs by hand gave 169-173: something else
/// ran during it, which a median of five leaves out.
fn untraced_pairs_ns(preload: &str, pairs: u64) -> f64 {
    let mut runs: Vec<f64> = (0..UNTRACED_RUNS)
        .map(|_| untraced_run_ns(preload, (pairs / UNTRACED_RUNS).max(1)))
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

/// One run of `alloc loop pairs`: its own ns per pair.
fn untraced_run_ns(preload: &str, pairs: u64) -> f64 {
    let out = std::process::Command::new(alloc_workload())
        .args(["loop", &pairs.to_string()])
        .env_remove("MALLOC_CONF")
        .env("LD_PRELOAD", preload)
        .output()
        .expect("running alloc loop");
    assert!(out.status.success(), "alloc loop: {out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    err.lines()
        .find_map(|l| l.strip_prefix("ns_per_pair "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ns_per_pair in {err}"))
}

/// Counts a program too hot for the windows come from the CPU time in its
/// allocator: `alloc loop 400000000` (a malloc-free pair at a time,
/// ~100 M calls/s)
/// launched in the default mode under glibc and each preloaded
/// allocator. The allocator's untraced cost the tool timed in its helper
/// is the workload's own timed loop's (measured side by side,
/// untraced) within the issue's ±30% or ±20 ns, and not zero (a loop the
/// compiler had removed); the malloc and free counts of glibc, jemalloc
/// and tcmalloc are made from the CPU time and are within their claim of
/// the loop's own count (see the limit below), numbers (#35's target).
/// Mimalloc's pairs cost more when they leave a page empty (5.5 ns alone,
/// 4.2 beside a kept block), which the tool cannot tell of a target's
/// heap: its claim holds that and is over 30%, so its counts are unknown,
/// or within their claim if shown. Before #35 they were all null
/// ("claimed error ±100%"); before the helper timed long rounds of pairs
/// apart from its short rounds, mimalloc was counted +40% to +99% and
/// jemalloc's and tcmalloc's counts could not be shown. 400 M pairs give
/// the helper 12 or more runs under each allocator (7-8 under tcmalloc
/// at 200 M, whose claims then reached ±29% from the runs' drift).
/// Known wrong on an Intel Xeon VM (2026-12-06; it passed on the AMD
/// EPYC VMs, and fails at a738c64 too): 15% of the loop's samples fall
/// in the workload's `malloc@plt`/`free@plt` stubs, which count as the
/// program's own time, so jemalloc's share is 0.73, the stand-in term
/// makes the claim ±0.33 and the count is hidden. Taking the stubs out
/// of the share's base (tried) showed the count 40% low (240 M of 400 M
/// pairs, claimed ±0.28): the helper timed jemalloc's pair at 4.3 ns
/// (3.3-6.9 over 15 runs) where the loop's whole pair takes 3.5. #35
/// needs both: the stubs as the calls' plumbing, and the helper's pace.
#[test]
#[ignore = "known wrong: #35 (jemalloc's claim ±0.33 on a Xeon: PLT stubs counted as the program's)"]
fn hot_loop_counts_come_from_the_allocators_cpu_time() {
    let test = "hot_loop_counts_come_from_the_allocators_cpu_time";
    if !require_root(test) {
        return;
    }
    let program = alloc_workload();
    for (label, preload) in installed_allocators(test) {
        let truth_pair = untraced_pair_ns(preload);
        let preload_var = format!("LD_PRELOAD={preload}");
        let args = [
            "--alloc-mode",
            "sampled",
            "--lock-mode",
            "off",
            "--no-tui",
            "--",
            "env",
            "-u",
            "MALLOC_CONF",
            &preload_var,
            program.to_str().expect("UTF-8 path"),
            "loop",
            "400000000",
        ];
        let (_, report, truth) = trace_truth(&format!("alloc-hot-{label}"), &args);
        assert_hot_counts(label, &typed(&report), &truth, truth_pair);
    }
    assert_no_programs_left();
}

/// A hot loop's counts from the CPU time, checked against the workload's
/// own: the helper timed real calls, near the workload's untraced loop
/// (`truth_pair`, ns) within the issue's ±30% or ±20 ns; glibc's,
/// jemalloc's and tcmalloc's counts are known (from the CPU time) and
/// every count shown is within the issue's 30% or its claim, a fifth
/// more; the allocator's share of the CPU is reported.
fn assert_hot_counts(label: &str, report: &Report, truth: &Truth, truth_pair: f64) {
    let a = &report.allocator;
    let u = a.untraced_ns.as_ref();
    let pair = u
        .map(|u| u.pair_ns)
        .unwrap_or_else(|| panic!("{label}: {a:#?}"));
    let (m, f) = (u.map_or(0.0, |u| u.malloc_ns), u.map_or(0.0, |u| u.free_ns));
    assert!(
        pair >= 1.0 && m >= 0.5 && f >= 0.5,
        "{label}: calls really timed: {u:#?}"
    );
    let allowed = (0.3 * truth_pair).max(20.0);
    assert!(
        (pair - truth_pair).abs() <= allowed,
        "{label}: helper's pair {pair:.1} ns, the workload's untraced loop {truth_pair:.1} ns"
    );
    let known = label != "mimalloc";
    if known {
        assert_eq!(a.count_basis, Some(CountBasis::CpuTime), "{label}: {a:#?}");
    }
    // The issue's 30% (or the claim, if larger: not for those whose
    // counts must be known), a fifth more: on a VM's two vCPUs the
    // helper's pace and the target's differ (-21% to +24% in 10 runs
    // by hand).
    let claimed = a.count_error.expect("a claimed error");
    let limit = 1.2 * claimed.max(MAX_COUNT_ERROR);
    for op in [AllocOp::Malloc, AllocOp::Free] {
        let real = truth.get(op.name()) as f64;
        let Some(count) = op_count_if_known(report, op) else {
            // Unknown only when the claim is too wide to show.
            assert!(
                !known && claimed > MAX_COUNT_ERROR,
                "{label}: {op} count unknown (claimed ±{claimed:.2}): {a:#?}"
            );
            continue;
        };
        let count = count as f64;
        assert!(
            (count - real).abs() <= limit * real,
            "{label}: {op} count {count}, truth {real} ({:+.0}%), allowed ±{limit:.2} \
             (claimed ±{claimed:.2}); {}; {a:#?}",
            100.0 * (count / real - 1.0),
            hot_basis(report, truth, truth_pair)
        );
    }
    let share = a.cpu.as_ref().map_or(0.0, |c| c.share);
    assert!(share > 0.5, "{label}: allocator's CPU share {share}");
}

/// What a hot loop's count was made of, in a line (the report's debug
/// form is cut short in CI's log): the helper's pace beside the loop's own
/// (untraced before the session, and while traced: the calls cost at most
/// that), and the allocator's CPU time as sampled.
fn hot_basis(report: &Report, truth: &Truth, truth_pair: f64) -> String {
    let a = &report.allocator;
    let s = &report.sampling;
    let helper = a.untraced_ns.as_ref().map_or("none".to_string(), |u| {
        format!(
            "{:.2} ns ({:.2}-{:.2} over {} runs, drift {:.3}, heap {:.3})",
            u.pair_ns,
            u.pair_range_ns[0],
            u.pair_range_ns[1],
            u.measurements,
            u.drift,
            u.heap_spread
        )
    });
    let cpu = a.cpu.as_ref().map_or("none".to_string(), |c| {
        format!("{} samples, {:.3} of the target's", c.samples, c.share)
    });
    format!(
        "helper's pair {helper}; the loop's untraced {truth_pair:.2} ns, traced {:.2} ns; \
         allocator CPU {cpu}; sampling {} samples, {} lost at {} Hz",
        truth.get("loop_ps_per_pair") as f64 / 1000.0,
        s.samples,
        s.lost,
        s.frequency_hz
    )
}

/// The same counts with the tool attached (`-p`, the default mode) to a
/// loop already running hot (#35's "attached to a ~100 M calls/s loop"):
/// `alloc loop` runs its pairs uncounted from "ready" until the go
/// signal, sent once the tool traces, then counts 1.2 G. The helper's
/// first run and the sampler start on a busy target, as they would on a
/// program in its steady state. The tool also sees the uncounted pairs
/// of its last 0.2-0.3 s of start-up (sampled already): at 400 M pairs
/// that made the counts +7% to +28% of the truth, at 1.2 G a third of
/// that.
/// Known wrong on an Intel Xeon VM (2026-12-06; it passed on the AMD
/// EPYC VMs, and fails at a738c64 too): 15% of the loop's samples fall
/// in the workload's `malloc@plt`/`free@plt` stubs, which count as the
/// program's own time, so jemalloc's share is 0.73, the stand-in term
/// makes the claim ±0.33 and the count is hidden. Taking the stubs out
/// of the share's base (tried) showed the count 40% low (240 M of 400 M
/// pairs, claimed ±0.28): the helper timed jemalloc's pair at 4.3 ns
/// (3.3-6.9 over 15 runs) where the loop's whole pair takes 3.5. #35
/// needs both: the stubs as the calls' plumbing, and the helper's pace.
#[test]
#[ignore = "known wrong: #35 (jemalloc's claim ±0.33 on a Xeon: PLT stubs counted as the program's)"]
fn attached_hot_loop_counts_come_from_the_allocators_cpu_time() {
    let test = "attached_hot_loop_counts_come_from_the_allocators_cpu_time";
    if !require_root(test) {
        return;
    }
    for (label, preload) in installed_allocators(test) {
        let truth_pair = untraced_pair_ns(preload);
        let r = attach_gated(
            &format!("alloc-attach-loop-{label}"),
            &["--lock-mode", "off"],
            &alloc_workload(),
            &["loop", "1200000000"],
            &[("LD_PRELOAD", preload), ("MALLOC_CONF", "")],
        );
        assert_hot_counts(label, &typed(&r.report), &r.truth, truth_pair);
    }
    assert_no_programs_left();
}

/// The helper times the allocator the target really uses: with slowalloc
/// preloaded, its untraced costs are slowalloc's within 10% — the
/// issue's bar for shims of known latency. The truth is what slowalloc
/// really costs, timed side by side (`alloc loop`, untraced:
/// [`slowalloc_excess_ns`]). Against the nominal 1,000 ns, free was
/// 1,114 ns in two CI runs, +6% of its real ~1,060.
#[test]
fn the_untraced_cost_is_the_targets_allocators() {
    if !require_root("the_untraced_cost_is_the_targets_allocators") {
        return;
    }
    let lib = build_shared_lib("slowalloc").expect("building libslowalloc.so");
    let excess = slowalloc_excess_ns(&lib);
    let report = attach_slowalloc_with("alloc-slow-untraced", &lib, &[]);
    let u = report.allocator.untraced_ns.as_ref();
    for (what, nominal, value) in [
        ("malloc_ns", SLOW_MALLOC_NS, u.map(|u| u.malloc_ns)),
        ("free_ns", SLOW_FREE_NS, u.map(|u| u.free_ns)),
    ] {
        let v = value.unwrap_or_else(|| panic!("{u:#?}"));
        let truth = nominal as f64 + excess;
        assert_between(
            what,
            v,
            0.9 * truth,
            1.1 * truth,
            &format!("slowalloc's calls each timed untraced {excess:.1} ns over: {u:#?}"),
        );
    }
    assert_no_programs_left();
}

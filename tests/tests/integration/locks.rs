//! The lock-contention profiler: which locks make threads wait, for how
//! long, where the waiting and the releasing code are, and (with the lock
//! uprobes) acquisitions and hold times.
//!
//! Each test launches a workload with known locking under the real tool
//! (tests/workloads/locks.c, whose locks are globals with distinctive
//! names and whose lock calls sit on marked lines; tests/workloads/
//! rustlock.rs; a real Debian program) and asserts on the `locks` array of
//! the JSON report, then checks that nothing is left loaded. They share
//! kernel state, so `cargo xtask test` runs them one at a time.

use std::path::{Path, PathBuf};

use memprof::kernel::calls::MAX_ACQUISITIONS_ERROR;
use memprof::process::maps::ProcMaps;
use memprof::report::{
    model::{
        HolderSite, LockAddress, LockContention, LockEntry, LockKind, LockTracing, ObjectKind,
        SectionEntry, SharingKind, TraceMode, WaiterSite,
    },
    names::NO_SYMBOLS,
    Report,
};
use memprof_tests::*;

/// Contentions the hot mutex must show in `contended 2 3`. Measured
/// untraced (clock_gettime around the lock call, 2 threads on 2 CPUs):
/// ~11000 contended acquisitions per thread per second, each a futex wait.
/// The bound only has to tell "contended" from "not": 50.
const MIN_HOT_CONTENTIONS: u64 = 50;

/// Wait time any mutex may show in `condvar 2`: the producer signals after
/// unlocking, so the consumer never waits for the mutex (strace: only
/// FUTEX_WAKE calls on it, from glibc's cond-wait relock); the ~2 s the
/// consumer spends waiting are condvar waits. 100 ms leaves room for a few
/// scheduling accidents, and is far below 2 s.
const MAX_CONDVAR_MUTEX_WAIT_NS: u64 = 100_000_000;

/// How far the traced acquisitions of a lock may be from the workload's
/// own count, in full mode (every call traced): 1%.
const ACQUISITIONS_TOLERANCE: f64 = 0.01;

/// How far g_hot_lock's summed hold time may be from the workload's own
/// (clock_gettime after the lock returns and before unlock): the uprobes
/// time from the lock's return to the unlock call, so they add the trap of
/// the return probe: measured +5% (1.286 s for 1.221 s); 15%.
const HOLD_TOLERANCE: f64 = 0.15;

/// g_hot_lock's wait time (futex waits, seen by the kernel) as a share of
/// the time the workload's threads spent in pthread_mutex_lock (which adds
/// the lock call's own work and the waker's latency): measured 0.92
/// (1.789 s of 1.949 s). Two-sided: ignoring waits, or counting each
/// twice, falls outside.
const WAIT_SHARE_LOW: f64 = 0.6;
const WAIT_SHARE_HIGH: f64 = 1.1;

/// In `condvar 2` the consumer waits on the condvar nearly all the time:
/// at least 1.5 of the 2 s, and no more than the session.
const CONDVAR_WAIT_LOW_NS: f64 = 1.5e9;
const CONDVAR_WAIT_HIGH_NS: f64 = 2.5e9;

/// Hold time p99 of g_hot_lock in `contended`: each section busy-waits
/// 20 us (`busy_ns`), so almost every hold is at least that; 15 us leaves
/// room for clock granularity and is far above an empty section (~100 ns).
const MIN_HOT_HOLD_P99_NS: u64 = 15_000;
/// ... and at most this: measured ~40 us with the probes' traps.
const MAX_HOT_HOLD_P99_NS: u64 = 1_000_000;

/// Longest p99 hold of g_queue_lock in `condvar 2`: its sections only
/// move a counter, but the consumer's pthread_cond_wait (~1 ms each, the
/// producer's period) runs with the mutex released inside libc; counted as
/// holding it, the p99 would be about 1 ms.
const MAX_CONDVAR_HOLD_P99_NS: u64 = 300_000;

/// Contentions of the rwlock in `rwlock 3`: the writer holds it 2 ms every
/// ~10 ms, and each reader (sleeping 100 us between reads) hits about every
/// write phase: ~100 blocked reads per reader per second untraced (strace).
const MIN_RWLOCK_CONTENTIONS: u64 = 10;

/// Contentions of the Rust mutex in `rustlock 3` (2 threads, 20 us held,
/// 5 us outside): thousands of futex waits per second untraced (strace).
const MIN_RUST_CONTENTIONS: u64 = 20;

/// Size of the generated input for pbzip2: big enough for many 900 kB
/// blocks (pbzip2's default), so its two workers and its reader/writer
/// threads meet on their queue locks for a second or two.
const PBZIP2_INPUT_BYTES: usize = 40 << 20;

const PBZIP2: &str = "/usr/bin/pbzip2";
/// pbzip2's top lock's waits, and their total time, in that run
/// (measured 21-29 waits, 4-13 ms): a tenth to ten times.
const PBZIP2_MIN_WAITS: f64 = 3.0;
const PBZIP2_MAX_WAITS: f64 = 300.0;
/// Threads `pbzip2 -p2` runs.
const PBZIP2_THREADS: f64 = 6.0;
const PBZIP2_MIN_WAIT_NS: f64 = 100_000.0;
const PBZIP2_MAX_WAIT_NS: f64 = 500_000_000.0;

fn locks_workload() -> PathBuf {
    build_workload("locks", Variant::Debug).expect("building locks")
}

/// Launches `program args` under the tool and returns the run and its
/// report.
fn launch(name: &str, program: &Path, args: &[&str]) -> (ToolRun, Report) {
    launch_with(name, &[], program, args)
}

/// As [`launch`], with tool options `flags`.
fn launch_with(name: &str, flags: &[&str], program: &Path, args: &[&str]) -> (ToolRun, Report) {
    let (run, report) = trace(name, &launch_args(flags, program, args));
    let report = typed(&report);
    check_locks(&report);
    (run, report)
}

/// The tool's arguments to launch `program args` with options `flags`.
fn launch_args<'a>(flags: &[&'a str], program: &'a Path, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["--no-tui"];
    all.extend_from_slice(flags);
    all.extend(["--", program.to_str().expect("UTF-8 path")]);
    all.extend_from_slice(args);
    all
}

/// As [`launch_with`], also returning the workload's ground truth.
fn launch_truth(
    name: &str,
    flags: &[&str],
    program: &Path,
    args: &[&str],
) -> (ToolRun, Report, Truth) {
    let (run, report, truth) = trace_truth(name, &launch_args(flags, program, args));
    let report = typed(&report);
    check_locks(&report);
    (run, report, truth)
}

/// Attaches to the `locks` workload running `args`, held at its start
/// gate until the tool traces (see [`attach_gated`]).
fn attach(name: &str, flags: &[&str], args: &[&str]) -> (Report, Truth) {
    let mut all = vec!["--alloc-mode", "off"];
    all.extend_from_slice(flags);
    let r = attach_gated(name, &all, &locks_workload(), args, &[]);
    let report = typed(&r.report);
    check_locks(&report);
    assert!(report.target.exited, "{:#?}", report.target);
    (report, r.truth)
}

/// The entry named `name`; fails when it is not listed.
fn must_lock<'a>(report: &'a Report, name: &str) -> &'a LockEntry {
    lock_named(report, name).unwrap_or_else(|| panic!("{name} is listed: {:#?}", report.locks))
}

/// In full mode every lock call is traced: acquisitions equal the
/// workload's own count (a few calls of libc's own may add to them:
/// within 1%), for the hot and the quiet lock of `contended`; hold and
/// wait times agree with what the workload measured around its calls.
fn assert_contended_truth(report: &Report, truth: &Truth) {
    let hot = must_lock(report, "g_hot_lock");
    assert_near(
        "g_hot_lock acquisitions",
        known(hot.acquisitions, "acquisitions", hot),
        truth.get("hot_acquisitions"),
        ACQUISITIONS_TOLERANCE,
        &format!("{hot:#?}"),
    );
    assert_near(
        "g_hot_lock hold time",
        known(hot.hold_total_ns, "hold_total_ns", hot),
        truth.get("hot_hold_ns"),
        HOLD_TOLERANCE,
        &format!("{hot:#?}"),
    );
    assert_wait_truth(hot, truth);
    let quiet = must_lock(report, "g_quiet_lock");
    assert_eq!(
        known(quiet.acquisitions, "acquisitions", quiet),
        truth.get("quiet_acquisitions"),
        "the uprobes saw every g_quiet_lock call: {quiet:#?}"
    );
    assert_eq!(quiet.contentions, 0, "nobody waits for it: {quiet:#?}");
}

/// The hot lock's wait time agrees with the time the workload's threads
/// spent inside pthread_mutex_lock, and it waited at most once per
/// acquisition.
fn assert_wait_truth(hot: &LockEntry, truth: &Truth) {
    let waited = truth.get("hot_wait_ns") as f64;
    assert_between(
        "g_hot_lock wait_total_ns",
        hot.wait_total_ns as f64,
        waited * WAIT_SHARE_LOW,
        waited * WAIT_SHARE_HIGH,
        &format!("{hot:#?}"),
    );
    assert_between(
        "g_hot_lock contentions",
        hot.contentions as f64,
        MIN_HOT_CONTENTIONS as f64,
        truth.get("hot_acquisitions") as f64,
        &format!("{hot:#?}"),
    );
}

/// The top mutex of the ranking; fails when none is listed.
///
/// Not simply the top entry: a thread's long wait in pthread_join (kind
/// "join", not contention) was once reported as a plain "futex" wait, its
/// call chain missing libc's frames, and so ranked above the hot lock (1
/// run in 5 of the suite; a lock-ranking bug for #16).
fn top_mutex(report: &Report) -> &LockEntry {
    report
        .locks
        .iter()
        .find(|l| l.kind == LockKind::Mutex)
        .unwrap_or_else(|| panic!("no mutex reported: {:#?}", report.locks))
}

/// Of the top three mutexes that more than one thread waited for in
/// `module`'s own code, the one waited for most often (a queue's lock, met
/// by its producers and consumers at every item; not an allocator arena
/// lock, waited for in malloc, nor a lock waited for twice, long: in one
/// CI run pbzip2's 239-acquisition lock ranked first with 2 waits of
/// 2.9 ms in all, the queue locks' ~20 waits each below it).
fn queue_mutex<'a>(report: &'a Report, module: &str) -> &'a LockEntry {
    report
        .locks
        .iter()
        .filter(|l| l.kind == LockKind::Mutex)
        .take(3)
        .filter(|l| l.threads >= 2 && l.waiters.iter().any(|w| w.module == module))
        .max_by_key(|l| l.contentions)
        .unwrap_or_else(|| {
            panic!(
                "none of the top 3 mutexes was waited for by several threads in {module}: {:#?}",
                report.locks
            )
        })
}

/// The entry named `name`, if any.
fn lock_named<'a>(report: &'a Report, name: &str) -> Option<&'a LockEntry> {
    report
        .locks
        .iter()
        .find(|l| l.name.as_deref() == Some(name))
}

/// `value`, the entry's `key` (known only with the lock uprobes); fails
/// when it is unknown.
fn known(value: Option<u64>, key: &str, entry: &LockEntry) -> u64 {
    value.unwrap_or_else(|| panic!("{key} is not a number: {entry:#?}"))
}

/// Every entry is well formed and the list is ranked by total wait time.
fn check_locks(report: &Report) {
    let all = &report.locks;
    let acquisitions_error = report
        .lock_tracing
        .as_ref()
        .and_then(|t| t.acquisitions_error)
        .unwrap_or(0.0);
    for entry in all {
        let kind = entry.kind;
        assert!(
            [
                LockKind::Mutex,
                LockKind::Rwlock,
                LockKind::Condvar,
                LockKind::Futex,
                LockKind::Kernel,
                LockKind::Barrier,
                LockKind::Join,
                LockKind::Semaphore,
            ]
            .contains(&kind),
            "kind {kind:?}: {entry:#?}"
        );
        // The address (a string in the JSON: hex, "kernel" or "other"),
        // and the waiters and holders (arrays), are typed: the report
        // reads as the model only when they are.
        let _: (&LockAddress, &[WaiterSite], &[HolderSite]) =
            (&entry.address, &entry.waiters, &entry.holders);
        assert!(
            entry.wait_p99_ns <= entry.wait_max_ns && entry.wait_max_ns <= entry.wait_total_ns,
            "p99 ≤ max ≤ total: {entry:#?}"
        );
        // A lock cannot be waited for more often than it was taken: its
        // acquisitions are unknown (null) or at least its contentions,
        // both within their claimed errors when they are estimates (the
        // most the acquisitions may be, the least the waits may be).
        let error = entry.contention_error.unwrap_or(0.0);
        let least = (entry.contentions as f64 * (1.0 - error)).floor() as u64;
        let most = |a: u64| (a as f64 * (1.0 + acquisitions_error)).ceil() as u64;
        assert!(
            entry.acquisitions.is_none_or(|a| most(a) >= least),
            "acquisitions must be null or ≥ contentions (within their claimed errors, \
             acquisitions ±{acquisitions_error}): {entry:#?}"
        );
        // "N% contended" is a share of the acquisitions: at most all.
        assert!(
            entry
                .contention_rate
                .is_none_or(|r| (0.0..=1.0).contains(&r)),
            "contention_rate must be null or within [0, 1]: {entry:#?}"
        );
    }
    // Lock contention first, then other waits (condvars, joins...), each
    // part by total wait time.
    let contention = |l: &LockEntry| {
        [
            LockKind::Mutex,
            LockKind::Rwlock,
            LockKind::Futex,
            LockKind::Kernel,
        ]
        .contains(&l.kind)
    };
    let ranked: Vec<(bool, u64)> = all
        .iter()
        .map(|l| (contention(l), l.wait_total_ns))
        .collect();
    assert!(
        ranked
            .windows(2)
            .all(|w| (w[0].0 && !w[1].0) || (w[0].0 == w[1].0 && w[0].1 >= w[1].1)),
        "locks must be ranked: contention first, then by wait_total_ns: {ranked:?}"
    );
}

/// A waiter, holder or critical-section site of a lock entry: where in
/// the source it is.
trait Site: std::fmt::Debug {
    fn file(&self) -> Option<&str>;
    fn line(&self) -> Option<u32>;
}

/// A holder or critical-section site: it caused delay.
trait Blamed: Site {
    /// `delay_caused_ns`.
    fn delay_caused(&self) -> u64;
}

impl Site for WaiterSite {
    fn file(&self) -> Option<&str> {
        self.file.as_deref()
    }
    fn line(&self) -> Option<u32> {
        self.line
    }
}

impl Site for HolderSite {
    fn file(&self) -> Option<&str> {
        self.file.as_deref()
    }
    fn line(&self) -> Option<u32> {
        self.line
    }
}

impl Site for SectionEntry {
    fn file(&self) -> Option<&str> {
        self.file.as_deref()
    }
    fn line(&self) -> Option<u32> {
        self.line
    }
}

impl Blamed for HolderSite {
    fn delay_caused(&self) -> u64 {
        self.delay_caused_ns
    }
}

impl Blamed for SectionEntry {
    fn delay_caused(&self) -> u64 {
        self.delay_caused_ns
    }
}

/// The site of a list (the waiters, holders or sections of an entry) at
/// `line` of a file whose name ends with `file`.
fn site_at<'a, S: Site>(list: &'a [S], file: &str, line: u32) -> Option<&'a S> {
    list.iter()
        .find(|s| s.file().is_some_and(|f| f.ends_with(file)) && s.line() == Some(line))
}

/// Proves the kernel-side analysis alone (no uprobes): in `contended 2 3`
/// two threads fight over g_hot_lock (each holds it ~20 us, works ~5 us
/// outside), while g_quiet_lock is taken by one thread only. The hot lock
/// tops the mutexes, named by its symbol, as a mutex whose owner was read
/// at wait time, with the waiting line (the pthread_mutex_lock call) and
/// the releasing line (the unlock that woke the waiters); the quiet one
/// shows no contention. With the lock uprobes off (`--lock-mode off`),
/// acquisitions and hold times are unknown (null).
#[test]
fn hot_mutex_is_named_with_waiter_and_releaser_lines() {
    if !require_root("hot_mutex_is_named_with_waiter_and_releaser_lines") {
        return;
    }
    let (_, report, truth) = launch_truth(
        "locks-contended",
        &["--lock-mode", "off"],
        &locks_workload(),
        &["contended", "2", "3"],
    );
    let top = top_mutex(&report);
    assert_eq!(
        top.name.as_deref(),
        Some("g_hot_lock"),
        "the top entry: {top:#?}"
    );
    assert_eq!(top.kind, LockKind::Mutex, "{top:#?}");
    assert_wait_truth(top, &truth);
    assert!(
        top.acquisitions.is_none() && top.hold_p99_ns.is_none(),
        "lock uprobes off, so no acquisitions or hold times: {top:#?}"
    );
    assert!(report.lock_tracing.is_none(), "{:#?}", report.lock_tracing);
    assert!(
        top.owner_seen,
        "a glibc mutex holds its owner's TID: {top:#?}"
    );
    let wait = marked_line("locks", "// WAIT");
    assert!(
        site_at(&top.waiters, "locks.c", wait).is_some(),
        "a waiter at locks.c:{wait}: {:#?}",
        top.waiters
    );
    let release = marked_line("locks", "// RELEASE");
    assert!(
        site_at(&top.holders, "locks.c", release).is_some(),
        "a releaser at locks.c:{release}: {:#?}",
        top.holders
    );
    // Without the uprobes a lock is seen only when someone waits for it,
    // and nobody waits for g_quiet_lock (one thread takes it): it must not
    // be listed as contended. (That it was taken, and seen taken, is
    // checked with the uprobes on, in full mode.)
    assert!(
        lock_named(&report, "g_quiet_lock").is_none_or(|q| q.contentions == 0),
        "one thread alone takes g_quiet_lock: {:#?}",
        report.locks
    );
    // Its symbols are there: the workload is no file without them.
    let program = locks_workload().display().to_string();
    assert!(
        !report
            .notes
            .iter()
            .any(|n| n.starts_with(NO_SYMBOLS) && n.contains(&program)),
        "{:#?}",
        report.notes
    );
    assert_no_programs_left();
}

/// Proves the lock uprobes in full mode: every pthread_mutex_lock of
/// `contended 2 3` is traced, so the acquisitions of g_hot_lock and
/// g_quiet_lock match the workload's own counts, hold and wait times match
/// the ones it measured, its hold p99 reflects the 20 us held, and its
/// critical section is named: taken at the `// WAIT` line, released at
/// `// RELEASE`. g_quiet_lock is seen taken, and nobody waits for it.
#[test]
fn full_mode_counts_acquisitions_and_hold_times() {
    if !require_root("full_mode_counts_acquisitions_and_hold_times") {
        return;
    }
    let (_, report, truth) = launch_truth(
        "locks-full",
        &["--lock-mode", "full"],
        &locks_workload(),
        &["contended", "2", "3"],
    );
    assert_contended_truth(&report, &truth);
    let hot = must_lock(&report, "g_hot_lock");
    assert_hot_hold_p99(hot);
    let rate = hot.contention_rate.unwrap_or(-1.0);
    assert!(rate > 0.0 && rate <= 1.0, "contention rate: {hot:#?}");
    let (wait, release) = (
        marked_line("locks", "// WAIT"),
        marked_line("locks", "// RELEASE"),
    );
    let section = site_at(&hot.sections, "locks.c", wait)
        .unwrap_or_else(|| panic!("a section taken at locks.c:{wait}: {:#?}", hot.sections));
    assert_eq!(
        section.released_at,
        Some(format!("locks.c:{release}")),
        "{section:#?}"
    );
    let tracing = lock_tracing(&report);
    assert_eq!(tracing.mode, TraceMode::Full, "{tracing:#?}");
    assert_eq!(tracing.traced_fraction, 1.0, "{tracing:#?}");
    assert_eq!(tracing.sections_lost, 0, "{tracing:#?}");
    assert_no_programs_left();
}

/// g_hot_lock's hold p99 in `contended`: each section busy-waits 20 us,
/// so at least [`MIN_HOT_HOLD_P99_NS`], and far below 1 ms unless holds
/// are mismatched (a lock paired with a later thread's unlock).
fn assert_hot_hold_p99(hot: &LockEntry) {
    assert_between(
        "g_hot_lock hold_p99_ns",
        known(hot.hold_p99_ns, "hold_p99_ns", hot) as f64,
        MIN_HOT_HOLD_P99_NS as f64,
        MAX_HOT_HOLD_P99_NS as f64,
        &format!("{hot:#?}"),
    );
}

/// The lock tracing section of a sampled session: attached part of the
/// time, within the budget.
fn assert_sampled(report: &Report) -> f64 {
    let tracing = lock_tracing(report);
    assert_eq!(tracing.mode, TraceMode::Sampled, "{tracing:#?}");
    let fraction = tracing.traced_fraction;
    assert_between(
        "traced_fraction",
        fraction,
        0.001,
        0.5,
        &format!("{tracing:#?}"),
    );
    fraction
}

/// The report's `lock_tracing`; fails when it is null.
fn lock_tracing(report: &Report) -> &LockTracing {
    report
        .lock_tracing
        .as_ref()
        .unwrap_or_else(|| panic!("no lock_tracing: {:#?}", report.notes))
}

/// The report's `lock_contention`; fails when it is null.
fn lock_contention(report: &Report) -> &LockContention {
    report
        .lock_contention
        .as_ref()
        .unwrap_or_else(|| panic!("no lock_contention: {:#?}", report.notes))
}

/// Proves the default (sampled) mode: the lock probes are attached in
/// windows within the budget, the report says so, and the hot lock still
/// gets acquisitions (a scaled estimate) and hold times.
#[test]
fn sampled_mode_estimates_acquisitions() {
    if !require_root("sampled_mode_estimates_acquisitions") {
        return;
    }
    let (_, report, truth) = launch_truth(
        "locks-sampled",
        &[],
        &locks_workload(),
        &["contended", "2", "3"],
    );
    assert_sampled(&report);
    let hot = must_lock(&report, "g_hot_lock");
    let notes = &report.notes;
    let said = |text: &str| notes.iter().any(|n| n.contains(text));
    match hot.acquisitions {
        Some(estimate) => assert_between(
            "g_hot_lock acquisitions",
            estimate as f64,
            1.0,
            truth.get("hot_acquisitions") as f64 * 1.5,
            &format!("{hot:#?}"),
        ),
        // A 3 s session affords one or two windows under the lock budget;
        // an estimate from them below the futex waits seen is shown as
        // unknown, with a note (seen once in CI on 455875a), and so is
        // one whose claim is above ±60% (a window that slowed the target
        // past correction: seen once by hand in session 54, in 8 runs).
        // The number itself is checked by the claim tests
        // (sampled_acquisitions_are_within_their_claimed_error and the
        // launched one), which require one.
        None => assert!(
            said("their acquisitions are shown as unknown") || said("acquisitions are unknown"),
            "acquisitions null without a note saying why: {notes:#?}"
        ),
    }
    assert_hot_hold_p99(hot);
    assert_wait_truth(hot, &truth);
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("acquisitions are scaled estimates")),
        "{:#?}",
        report.notes
    );
    assert_no_programs_left();
}

/// The default mode attaches no lock probe to a program whose locks no
/// thread ever waits for (`locks uncontended`: one thread, g_solo_lock
/// taken N times): its first lock window opens at the first futex wait,
/// and there is none. The same program in full mode shows g_solo_lock's
/// every acquisition, so the probes would have seen it.
#[test]
fn uncontended_locks_get_no_lock_probe_in_the_default_mode() {
    if !require_root("uncontended_locks_get_no_lock_probe_in_the_default_mode") {
        return;
    }
    const TIMES: u64 = 200_000;
    let times = TIMES.to_string();
    let args = ["uncontended", times.as_str()];
    let (_, full) = launch_with(
        "locks-uncontended-full",
        &["--lock-mode", "full"],
        &locks_workload(),
        &args,
    );
    let solo = must_lock(&full, "g_solo_lock");
    assert_eq!(solo.acquisitions, Some(TIMES), "{solo:#?}");
    let (_, report) = launch("locks-uncontended", &locks_workload(), &args);
    let tracing = lock_tracing(&report);
    assert_eq!(tracing.mode, TraceMode::Sampled, "{tracing:#?}");
    assert_eq!(
        (
            tracing.windows,
            tracing.traced_fraction,
            tracing.acquisitions_error
        ),
        (0, 0.0, None),
        "{tracing:#?}"
    );
    assert!(
        lock_named(&report, "g_solo_lock").is_none(),
        "{:#?}",
        report.locks
    );
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("no thread of the target waited on a futex")),
        "{:#?}",
        report.notes
    );
    assert_no_programs_left();
}

/// Proves that condition-variable waits are not lock contention: in
/// `condvar 2` a consumer waits on g_queue_cond for an item the producer
/// pushes every 1 ms, while their mutex g_queue_lock is essentially free.
/// The condvar, when listed, is a condvar with its waiter on the
/// pthread_cond_wait line; no mutex shows the consumer's ~2 s of waiting.
#[test]
fn condvar_waits_are_not_lock_contention() {
    if !require_root("condvar_waits_are_not_lock_contention") {
        return;
    }
    let (_, report, truth) = launch_truth(
        "locks-condvar",
        &["--lock-mode", "full"],
        &locks_workload(),
        &["condvar", "2"],
    );
    for entry in &report.locks {
        if entry.kind == LockKind::Mutex || entry.name.as_deref() == Some("g_queue_lock") {
            assert!(
                entry.wait_total_ns <= MAX_CONDVAR_MUTEX_WAIT_NS,
                "condvar waits counted as mutex waits: {entry:#?}"
            );
        }
    }
    // The uprobes end a section where pthread_cond_wait releases the
    // mutex, and start one where it retakes it; the workload's own
    // lock calls are all counted.
    let queue = must_lock(&report, "g_queue_lock");
    assert_near(
        "g_queue_lock acquisitions",
        known(queue.acquisitions, "acquisitions", queue),
        truth.get("queue_acquisitions"),
        ACQUISITIONS_TOLERANCE,
        &format!("{queue:#?}"),
    );
    assert!(
        known(queue.hold_p99_ns, "hold_p99_ns", queue) <= MAX_CONDVAR_HOLD_P99_NS,
        "condvar waits counted as holding the mutex: {queue:#?}"
    );
    // The condvar was seen, as a condvar, with every wait of the consumer
    // and the time it spent waiting.
    let cond = must_lock(&report, "g_queue_cond");
    assert_eq!(cond.kind, LockKind::Condvar, "{cond:#?}");
    assert_near(
        "g_queue_cond waits",
        cond.contentions,
        truth.get("cond_waits"),
        ACQUISITIONS_TOLERANCE,
        &format!("{cond:#?}"),
    );
    assert_between(
        "g_queue_cond wait_total_ns",
        cond.wait_total_ns as f64,
        CONDVAR_WAIT_LOW_NS,
        CONDVAR_WAIT_HIGH_NS,
        &format!("{cond:#?}"),
    );
    let line = marked_line("locks", "// CONDWAIT");
    assert!(
        site_at(&cond.waiters, "locks.c", line).is_some(),
        "a condvar waiter at locks.c:{line}: {:#?}",
        cond.waiters
    );
    assert_no_programs_left();
}

/// Proves rwlock contention: in `rwlock 3` a writer holds g_table_lock
/// for ~2 ms every ~10 ms and two readers, reading every ~100 us, block
/// behind it at the pthread_rwlock_rdlock line.
#[test]
fn rwlock_writers_block_readers() {
    if !require_root("rwlock_writers_block_readers") {
        return;
    }
    let (_, report, truth) = launch_truth(
        "locks-rwlock",
        &["--lock-mode", "full"],
        &locks_workload(),
        &["rwlock", "3"],
    );
    let table = must_lock(&report, "g_table_lock");
    assert_eq!(table.kind, LockKind::Rwlock, "{table:#?}");
    // Readers block behind the writer at most once per read.
    assert_between(
        "g_table_lock contentions",
        table.contentions as f64,
        MIN_RWLOCK_CONTENTIONS as f64,
        truth.get("reads") as f64,
        &format!("{table:#?}"),
    );
    assert_near(
        "g_table_lock acquisitions (reads and writes)",
        known(table.acquisitions, "acquisitions", table),
        truth.get("reads") + truth.get("writes"),
        ACQUISITIONS_TOLERANCE,
        &format!("{table:#?}"),
    );
    let line = marked_line("locks", "// RDLOCK");
    assert!(
        site_at(&table.waiters, "locks.c", line).is_some(),
        "a reader waiting at locks.c:{line}: {:#?}",
        table.waiters
    );
    // The uprobes see the readers' and the writer's sections; the
    // writer's 2 ms holds dominate.
    assert!(
        known(table.acquisitions, "acquisitions", table) > 0,
        "{table:#?}"
    );
    assert!(
        site_at(&table.sections, "locks.c", line).is_some(),
        "a read section at locks.c:{line}: {:#?}",
        table.sections
    );
    assert!(
        known(table.hold_max_ns, "hold_max_ns", table) >= 1_000_000,
        "{table:#?}"
    );
    assert_no_programs_left();
}

/// Proves that locks without pthread are found: Rust's std::sync::Mutex is
/// a futex word of its own. In `rustlock 3` two threads fight over the
/// static COUNTER_LOCK (named by its symbol, `rustlock::COUNTER_LOCK`),
/// waiting at the lock() line of contend().
#[test]
fn rust_std_mutex_contention_is_found() {
    if !require_root("rust_std_mutex_contention_is_found") {
        return;
    }
    if rustc_version().is_none() {
        skip(
            "rust_std_mutex_contention_is_found",
            "no rustc on PATH to build tests/workloads/rustlock.rs",
        );
        return;
    }
    let program = build_rust_workload("rustlock").expect("building rustlock");
    let (_, report, truth) = launch_truth("locks-rust", &[], &program, &["3"]);
    let counter = report
        .locks
        .iter()
        .find(|l| {
            l.name
                .as_deref()
                .is_some_and(|n| n.contains("COUNTER_LOCK"))
        })
        .unwrap_or_else(|| panic!("COUNTER_LOCK is listed: {:#?}", report.locks));
    let kind = counter.kind;
    assert!(
        kind == LockKind::Futex || kind == LockKind::Mutex,
        "kind {kind:?}: {counter:#?}"
    );
    // Waited for at least sometimes, and at most once per acquisition.
    assert_between(
        "COUNTER_LOCK contentions",
        counter.contentions as f64,
        MIN_RUST_CONTENTIONS as f64,
        truth.get("acquisitions") as f64,
        &format!("{counter:#?}"),
    );
    let line = marked_line_in(&rust_workload_source("rustlock"), "// RUSTWAIT");
    assert!(
        site_at(&counter.waiters, "rustlock.rs", line).is_some(),
        "a waiter at rustlock.rs:{line}: {:#?}",
        counter.waiters
    );
    assert_no_programs_left();
}

/// A compressible text of about `bytes` bytes: numbered records of words
/// picked by a fixed xorshift generator (so bzip2 has real work, and every
/// run compresses the same data).
fn compressible_text(bytes: usize) -> Vec<u8> {
    const WORDS: [&str; 12] = [
        "alpha", "beta", "gamma", "delta", "lock", "mutex", "thread", "queue", "block", "profile",
        "wait", "owner",
    ];
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut text = Vec::with_capacity(bytes + 64);
    let mut record = 0u64;
    while text.len() < bytes {
        let (a, b, n) = (next(), next(), next() % 1_000_000);
        let line = format!(
            "record {record} {} {} {n}\n",
            WORDS[a as usize % WORDS.len()],
            WORDS[b as usize % WORDS.len()]
        );
        text.extend_from_slice(line.as_bytes());
        record += 1;
    }
    text
}

/// A stripped program's lock has no symbol to be named by (Debian's
/// `stress-ng` showed its mutex as a bare address): it is named by the
/// file and its address there, which is what `nm` gives for `g_hot_lock`
/// in the same build before stripping, and a note names the file as
/// without symbols and says how to get them (the unstripped build is not
/// named so: `hot_mutex_is_named_with_waiter_and_releaser_lines`).
#[test]
fn a_stripped_programs_lock_is_named_by_file_and_address() {
    const TEST: &str = "a_stripped_programs_lock_is_named_by_file_and_address";
    if !require_root(TEST) {
        return;
    }
    let stripped = build_workload("locks", Variant::Stripped).expect("building locks, stripped");
    let nm = std::process::Command::new("nm")
        .arg(locks_workload())
        .output()
        .expect("nm runs (binutils)");
    let symbols = String::from_utf8_lossy(&nm.stdout);
    let vaddr = symbols
        .lines()
        .find_map(|l| l.strip_suffix(" B g_hot_lock"))
        .and_then(|a| u64::from_str_radix(a, 16).ok())
        .unwrap_or_else(|| panic!("g_hot_lock in nm's output: {symbols}"));
    let flags = ["--lock-mode", "off", "--alloc-mode", "off"];
    let (_, report) = launch_with(TEST, &flags, &stripped, &["contended", "2", "2"]);
    let file = stripped
        .file_name()
        .and_then(|f| f.to_str())
        .expect("a file name");
    let name = format!("{file}+{vaddr:#x}");
    let lock = report
        .locks
        .iter()
        .find(|l| l.kind == LockKind::Mutex && l.contentions > 100)
        .unwrap_or_else(|| panic!("no contended mutex: {:#?}", report.locks));
    assert_eq!(lock.name.as_deref(), Some(name.as_str()), "{lock:#?}");
    // And the report says why, and how to get the names.
    let path = stripped.display().to_string();
    let note = report.notes.iter().find(|n| n.starts_with(NO_SYMBOLS));
    assert!(
        note.is_some_and(|n| n.contains(&path) && n.contains("DEBUGINFOD_URLS")),
        "a note names {path} as without symbols: {:#?}",
        report.notes
    );
    assert_no_programs_left();
}

/// Proves that contention is found in a real program without debug
/// symbols: Debian's pbzip2 (stripped) compressing a 40 MB file with two
/// workers. Its queue mutexes are heap objects its threads meet on
/// (perf, untraced: ~40 mutex futex waits per run): one of them is among
/// the top three mutexes, waited for by its threads a few dozen times, in
/// pbzip2's own code (named by module and offset, pbzip2+0x...).
#[test]
fn pbzip2_contention_is_found_without_debug_symbols() {
    const TEST: &str = "pbzip2_contention_is_found_without_debug_symbols";
    if !require_root(TEST) {
        return;
    }
    if !Path::new(PBZIP2).exists() {
        skip(
            TEST,
            &format!("{PBZIP2} is not installed (apt-get install pbzip2)"),
        );
        return;
    }
    /// Removes the input and output files however the test ends.
    struct Scratch(PathBuf);
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let dir = Scratch(workload_dir().join(format!("pbzip2-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("creating the pbzip2 directory");
    let input = dir.0.join("input.txt");
    std::fs::write(&input, compressible_text(PBZIP2_INPUT_BYTES)).expect("writing the input");
    let (_, report) = launch(
        "locks-pbzip2",
        Path::new(PBZIP2),
        &["-p2", "-k", "-f", input.to_str().expect("UTF-8 path")],
    );
    drop(dir);
    // Measured (3 runs, 40 MB, -p2): the top two locks are mutexes in
    // heap blocks, waited for 20-30 times each, 4-13 ms in all, by 4
    // threads (two workers, the reader and the writer; see below), the waiting code
    // in pbzip2 itself (its queue functions, unnamed: stripped). In one
    // CI run a single 5 ms wait by one thread on a glibc arena lock (held
    // in BZ2_bzCompressInit's allocation, in a run with 7 ms of kernel
    // rwsem waits in the allocation paths) ranked above them: that is a
    // real wait, so the queue lock is looked for among the top three
    // mutexes, as the one several threads waited for in pbzip2 most often.
    let top = queue_mutex(&report, "pbzip2");
    assert_eq!(top.kind, LockKind::Mutex, "{top:#?}");
    assert_between(
        "contentions",
        top.contentions as f64,
        PBZIP2_MIN_WAITS,
        PBZIP2_MAX_WAITS,
        &format!("{top:#?}"),
    );
    assert_between(
        "wait_total_ns",
        top.wait_total_ns as f64,
        PBZIP2_MIN_WAIT_NS,
        PBZIP2_MAX_WAIT_NS,
        &format!("{top:#?}"),
    );
    // `pbzip2 -p2` runs six threads (/proc/PID/task while it compresses:
    // the reader, two workers, the writer, a signal handler and a
    // terminator); a fifth waited on the queue lock once in CI, at the end.
    assert_between(
        "waiting threads",
        top.threads as f64,
        2.0,
        PBZIP2_THREADS,
        &format!("{top:#?}"),
    );
    let waiters = &top.waiters;
    assert!(
        !waiters.is_empty() && waiters.iter().all(|w| w.module == "pbzip2"),
        "the queue code that waits is pbzip2's own: {top:#?}"
    );
    // libbz2 has no frame pointers: a stack walk through it reads data as
    // return addresses, and those are no callers (`[unmapped]` had 65%
    // of the samples as its total time, attached to pbzip2).
    let wild = report
        .hot_functions
        .iter()
        .filter(|h| h.function == "[unmapped]" && h.total_samples > h.samples);
    assert_eq!(wild.count(), 0, "{:#?}", report.hot_functions);
    assert_no_programs_left();
}

/// Proves the main use case in full mode: attached with `-p` to
/// `contended 2 2` already running (held at its start gate until the tool
/// traces), every lock call of the workload is seen: acquisitions, hold
/// and wait times match its own account.
#[test]
fn attached_full_mode_matches_the_workload_counts() {
    if !require_root("attached_full_mode_matches_the_workload_counts") {
        return;
    }
    let (report, truth) = attach(
        "locks-attach-full",
        &["--lock-mode", "full"],
        &["contended", "2", "2"],
    );
    assert_contended_truth(&report, &truth);
    assert_hot_hold_p99(must_lock(&report, "g_hot_lock"));
    assert_eq!(
        report.lock_tracing.as_ref().map(|t| t.mode),
        Some(TraceMode::Full)
    );
    assert_loader_memory(&report);
    assert_no_programs_left();
}

/// Proves the default mode attached to a running process: the lock
/// probes run in windows within the budget, the waits (seen from the
/// kernel all the time) match the workload's, and hold times are right.
#[test]
fn attached_default_mode_sees_the_waits() {
    if !require_root("attached_default_mode_sees_the_waits") {
        return;
    }
    let (report, truth) = attach("locks-attach-default", &[], &["contended", "2", "3"]);
    assert_sampled(&report);
    let hot = must_lock(&report, "g_hot_lock");
    assert_wait_truth(hot, &truth);
    assert_hot_hold_p99(hot);
    assert_loader_memory(&report);
    assert_no_programs_left();
}

/// How far a sampled estimate may be from the truth for a lock taken
/// 30,000 times a second at a steady rate.
const SAMPLED_ACQUISITIONS_TOLERANCE: f64 = 0.25;

/// The default mode's acquisitions are an estimate: it must be near the
/// workload's count, and the report must say how far it may be off (a
/// claim that covers the truth). Before #16 the estimate was 20x low
/// (4,565 for 92,651) and no error was claimed. With single links a 3 s
/// session got one window (detaching three links took 0.5 s, so gaps were
/// up to a minute) and was off by +8%, -32%, -17%, -16% in four runs, the
/// claim (±25%) covering three. Since #17 the lock probes are three
/// `uprobe_multi` links gone in about 75 ms, and a one-window estimate
/// claims at least ±35%: within 8% and the claim in 5 runs of 5 (a 20 ms
/// first window was off by up to 29%, so it is 100 ms). In session 11 one
/// run of ~6 showed the estimate as unknown (below the futex waits). On
/// a fresh machine of the same kind (Xeon with AVX-512, session 30) the
/// estimate ran high in 7 runs of 7: +7, +21, +16, +21, +13, +11 and
/// (in CI) +26%, the claim (±35%) covering all: the one window's rate,
/// traced, is higher than the untraced rate it stands for. The claim is
/// checked here; the tighter target is the known-wrong test below.
#[test]
fn sampled_acquisitions_are_within_their_claimed_error() {
    if !require_root("sampled_acquisitions_are_within_their_claimed_error") {
        return;
    }
    let (report, estimate, real) = sampled_estimate();
    assert_within_claim(&report, estimate, real);
}

/// Acquisitions shown as unknown come with the claim that made them so
/// (above [`MAX_ACQUISITIONS_ERROR`]) and a note that says why.
fn assert_unknown_said_why(report: &Report) {
    let claimed = lock_tracing(report).acquisitions_error.unwrap_or(0.0);
    assert!(
        claimed > MAX_ACQUISITIONS_ERROR
            && report
                .notes
                .iter()
                .any(|n| n.contains("acquisitions are unknown")),
        "acquisitions unknown while claiming ±{claimed:.3}: {:#?}",
        report.notes
    );
}

/// The report's claimed acquisitions error covers `estimate` for `real`.
fn assert_within_claim(report: &Report, estimate: u64, real: u64) {
    let claimed = report
        .lock_tracing
        .as_ref()
        .and_then(|t| t.acquisitions_error)
        .unwrap_or_else(|| panic!("the report claims no error: {:#?}", report.lock_tracing));
    assert!(
        (estimate as f64 - real as f64).abs() <= claimed * real as f64,
        "estimate {estimate}, truth {real}: outside the claimed ±{claimed}"
    );
}

/// The estimate within [`SAMPLED_ACQUISITIONS_TOLERANCE`] of the truth,
/// which the one-window estimate missed on the Xeon machines (above:
/// +26% in CI). On an AMD EPYC (session 44) it was within -7% to +4% in
/// 8 runs of 8; the mark stays until a Xeon run shows the same.
#[test]
#[ignore = "known wrong: #33 (a one-window estimate runs 7-26% high here)"]
fn sampled_acquisitions_are_near_the_truth() {
    if !require_root("sampled_acquisitions_are_near_the_truth") {
        return;
    }
    let (report, estimate, real) = sampled_estimate();
    let hot = must_lock(&report, "g_hot_lock");
    assert_near(
        "g_hot_lock acquisitions (estimate)",
        estimate,
        real,
        SAMPLED_ACQUISITIONS_TOLERANCE,
        &format!("{hot:#?}"),
    );
}

/// Launched (not attached), the same workload's one-window estimate was
/// outside its own claim in 3 runs of 4 (session 30): 55,494, 56,807 and
/// 56,850 for 91,547, 104,788 and 95,120 acquisitions (-39%, -46%, -40%)
/// claiming ±35%, where `--lock-mode full` counted the truth exactly
/// (79,738 of 79,738). A claim that does not cover the truth is the bug.
/// In session 43 it failed 3 runs of 4 on another count: the estimate,
/// 10-14% low, fell below the (sampled) waits and was shown as unknown;
/// since the two contradict each other only beyond both claims, it was
/// within its claim in 11 runs of 11 (-12% to -13% of the truth, claiming
/// ±35%).
#[test]
fn launched_sampled_acquisitions_are_within_their_claimed_error() {
    const TEST: &str = "launched_sampled_acquisitions_are_within_their_claimed_error";
    if !require_root(TEST) {
        return;
    }
    let flags = ["--alloc-mode", "off"];
    let args = ["contended", "2", "3"];
    let (_, report, truth) = launch_truth(TEST, &flags, &locks_workload(), &args);
    assert_sampled(&report);
    let hot = must_lock(&report, "g_hot_lock");
    let estimate = known(hot.acquisitions, "acquisitions", hot);
    let real = truth.get("hot_acquisitions");
    assert_within_claim(&report, estimate, real);
    assert_no_programs_left();
}

/// A program whose lock calls come in bursts (`locks bursty 2 6`: 300 ms
/// of the contended loop each second, then sleep) gets an estimate
/// within its claim. A gap's calls follow the target's own CPU time, not
/// the rate of the window before it: a window in a burst would give each
/// gap 3.3x its calls, one between bursts none. On an AMD EPYC it ran
/// -14.6% and (in CI) -22% claiming ±12-12.5%: the convoy slows under the
/// probes more than their modelled cost, which the claim now allows for
/// (`TRAP_COST_ERROR` in the lock tracer): -1% to -26% in 6 runs by
/// hand (session 50), then within claims of ±35-38% in 5 runs of 5. In
/// session 54 CI failed it at -24% claiming ±20%: with three windows
/// or more the claim is mostly the slowdown correction's error, then
/// taken as 2.5x the 7% modelled; the miss was 3.7x. Taken as 4x: -13%
/// to -24% claiming ±31-44% in 6 runs by hand. Two windows' spread is
/// now taken at its upper bound (3.95x from two, 2.1x from three), and
/// with the correction's ±30% the claims are ±31-52%, above ±50% (then
/// the limit: an unknown count, with a note that says why) in 4 sessions
/// of 10 by hand; the limit is now ±60%.
/// That is a right answer, so up to three sessions are run: each unknown
/// must say why, and one must give a number (a gap filled at the
/// window's rate instead, 3.3x too many calls, would make every window's
/// spread, and every session unknown).
#[test]
fn bursty_acquisitions_are_within_their_claimed_error() {
    const TEST: &str = "bursty_acquisitions_are_within_their_claimed_error";
    if !require_root(TEST) {
        return;
    }
    let flags = ["--alloc-mode", "off"];
    let args = ["bursty", "2", "6"];
    let session = || {
        let (_, report, truth) = launch_truth(TEST, &flags, &locks_workload(), &args);
        (report, truth)
    };
    let (report, estimate, real) = estimate_of_hot_lock(|| {
        for attempt in 1..=3 {
            let (report, truth) = session();
            if attempt == 3 || must_lock(&report, "g_hot_lock").acquisitions.is_some() {
                return (report, truth);
            }
            assert_unknown_said_why(&report);
            eprintln!("{TEST}: acquisitions unknown (session {attempt}), with a note; another");
        }
        unreachable!("the third session returns")
    });
    assert_sampled(&report);
    assert_within_claim(&report, estimate, real);
    assert_no_programs_left();
}

/// A default-mode session attached to the contended workload: the
/// report, g_hot_lock's estimated acquisitions and the workload's count.
fn sampled_estimate() -> (Report, u64, u64) {
    let (report, estimate, real) =
        estimate_of_hot_lock(|| attach("locks-attach-estimate", &[], &["contended", "2", "3"]));
    assert_sampled(&report);
    assert_no_programs_left();
    (report, estimate, real)
}

/// The report of a default-mode session (`run`), its estimate of
/// g_hot_lock's acquisitions and the workload's count.
///
/// Nearly every acquisition of this lock waits (contentions are 94-97%
/// of them), and its waits are sampled estimates too: the estimate a few
/// percent low is below the waits' (bursty: acquisitions 3-16% low in 14
/// sessions, within their ±32% claim, waits 4-21% low). It is shown all
/// the same, as the two agree within their claims; shown as unknown (a
/// failure here) only beyond them.
fn estimate_of_hot_lock(run: impl Fn() -> (Report, Truth)) -> (Report, u64, u64) {
    let (report, truth) = run();
    let hot = must_lock(&report, "g_hot_lock");
    let estimate = known(hot.acquisitions, "acquisitions", hot);
    let real = truth.get("hot_acquisitions");
    (report, estimate, real)
}

/// The loader's own peak memory: measured ~115 MB (debug build) on the
/// lock workloads; far more means per-event state that grows without
/// bound.
const LOADER_PEAK_RSS_MAX: u64 = 400 << 20;

fn assert_loader_memory(report: &Report) {
    let rss = report.loader.peak_rss_bytes;
    assert_between(
        "loader peak_rss_bytes",
        rss as f64,
        (1u64 << 20) as f64,
        LOADER_PEAK_RSS_MAX as f64,
        &format!("{:#?}", report.loader),
    );
}

/// Proves the kernel-side analysis at scale: 64 threads fight over
/// g_hot_lock (`contended 64 2`, default mode). It tops the ranking with
/// all 64 threads among its waiters, and its wait time matches the
/// workload's.
#[test]
fn sixty_four_threads_on_one_lock() {
    if !require_root("sixty_four_threads_on_one_lock") {
        return;
    }
    let (_, report, truth) = launch_truth(
        "locks-64",
        &[],
        &locks_workload(),
        &["contended", "64", "2"],
    );
    let top = top_mutex(&report);
    assert_eq!(top.name.as_deref(), Some("g_hot_lock"), "{top:#?}");
    assert_eq!(top.threads, 64, "every thread waited: {top:#?}");
    assert_wait_truth(top, &truth);
    assert_loader_memory(&report);
    assert_no_programs_left();
}

/// The most threads the workload starts (`contended 256 1`), all asleep
/// on one lock nearly all the time: each one's waits have a slot of the
/// sched hooks' table, none is lost to another's (`slot_collisions`),
/// and every thread is counted among the lock's waiters. Before the
/// hooks took the slot beside a held one, 4 of 10 runs here lost 10-34
/// waits and one to three threads (a CI run of the 64-thread convoy
/// above: 184 waits and a thread).
#[test]
fn a_convoy_of_256_threads_loses_no_wait() {
    if !require_root("a_convoy_of_256_threads_loses_no_wait") {
        return;
    }
    let (_, report, _) = launch_truth(
        "locks-256",
        &["--alloc-mode", "off"],
        &locks_workload(),
        &["contended", "256", "1"],
    );
    let contention = report.lock_contention.as_ref().expect("lock_contention");
    assert_eq!(contention.hooks, "sched", "{contention:#?}");
    assert_eq!(contention.slot_collisions, 0, "{contention:#?}");
    let top = top_mutex(&report);
    assert_eq!(top.name.as_deref(), Some("g_hot_lock"), "{top:#?}");
    assert_eq!(top.threads, 256, "every thread waited: {top:#?}");
    assert_no_programs_left();
}

/// Contention spread over 10,000 locks (`many 10000 2 5`, full mode):
/// the locks' acquisitions — of those listed one by one and of the "other
/// locks" aggregated by call site beyond the loader's table — sum to the
/// workload's count, no lock event is lost, and the loader's memory stays
/// bounded. Before #16 the loader peaked at 6.5 GB, lost 134,640 events
/// and slowed the workload 20x.
#[test]
fn ten_thousand_contended_locks_stay_bounded() {
    if !require_root("ten_thousand_contended_locks_stay_bounded") {
        return;
    }
    let (report, truth) = attach(
        "locks-many",
        &["--lock-mode", "full"],
        &["many", "10000", "2", "5"],
    );
    assert_loader_memory(&report);
    // Locks beyond those the loader tracks one by one count in the
    // "other locks" entry (aggregated by call site; here only
    // g_many_locks[] are taken).
    let many: Vec<&LockEntry> = report
        .locks
        .iter()
        .filter(|l| {
            l.name
                .as_deref()
                .is_some_and(|n| n.starts_with("g_many_locks"))
                || l.address == LockAddress::Other
        })
        .collect();
    let acquisitions: u64 = many
        .iter()
        .map(|l| known(l.acquisitions, "acquisitions", l))
        .sum();
    assert_near(
        "acquisitions of g_many_locks[]",
        acquisitions,
        truth.get("many_acquisitions"),
        ACQUISITIONS_TOLERANCE,
        &format!("{:#?}", report.lock_tracing),
    );
    assert!(
        !report.notes.iter().any(|n| n.contains("were lost")),
        "{:#?}",
        report.notes
    );
    assert_no_programs_left();
}

const SYSBENCH: &str = "/usr/bin/sysbench";

/// Whether `test` can run: as root, with Debian's sysbench installed (a
/// loud skip otherwise).
fn require_root_and_sysbench(test: &str) -> bool {
    if !require_root(test) {
        return false;
    }
    if !Path::new(SYSBENCH).exists() {
        skip(
            test,
            &format!("{SYSBENCH} is not installed (cargo xtask setup installs it)"),
        );
        return false;
    }
    true
}

/// `sysbench mutex` with one mutex: THREADS threads each lock and unlock
/// it LOCKS times (sysbench's own count: threads x --mutex-locks), with
/// ~200 empty loops outside.
fn sysbench_mutex(threads: u32, locks: u64) -> Vec<String> {
    [
        "mutex".to_string(),
        format!("--threads={threads}"),
        "--mutex-num=1".into(),
        format!("--mutex-locks={locks}"),
        "--mutex-loops=200".into(),
        "run".into(),
    ]
    .to_vec()
}

/// Proves lock profiling on a third-party program, Debian's sysbench
/// (stripped): in `sysbench mutex` with one mutex its two threads take it
/// exactly 2 x 100,000 times (sysbench's own count) in a heap array; full
/// mode counts every acquisition, and the lock tops the ranking as a
/// contended mutex waited for by both threads in sysbench's code.
#[test]
fn sysbench_mutex_acquisitions_are_counted() {
    const TEST: &str = "sysbench_mutex_acquisitions_are_counted";
    if !require_root_and_sysbench(TEST) {
        return;
    }
    const LOCKS: u64 = 100_000;
    let args = sysbench_mutex(2, LOCKS);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_, report) = launch_with(
        "locks-sysbench",
        &["--lock-mode", "full", "--alloc-mode", "off"],
        Path::new(SYSBENCH),
        &args,
    );
    let top = top_mutex(&report);
    assert_eq!(top.kind, LockKind::Mutex, "{top:#?}");
    assert_near(
        "acquisitions",
        known(top.acquisitions, "acquisitions", top),
        2 * LOCKS,
        ACQUISITIONS_TOLERANCE,
        &format!("{top:#?}"),
    );
    assert_eq!(top.threads, 2, "both threads waited: {top:#?}");
    assert_between(
        "contentions",
        top.contentions as f64,
        MIN_HOT_CONTENTIONS as f64,
        (2 * LOCKS) as f64,
        &format!("{top:#?}"),
    );
    let in_sysbench = (
        top.waiters.iter().any(|s| s.module == "sysbench"),
        top.sections.iter().any(|s| s.module == "sysbench"),
    );
    assert!(in_sysbench.0 && in_sysbench.1, "{top:#?}");
    assert_no_programs_left();
}

/// Proves attaching to a running third-party program: sysbench mutex
/// runs for many seconds; attached for 2 s in the default mode, its one
/// mutex is the top contended lock, a mutex with both threads waiting in
/// sysbench's code, and its estimated acquisitions are no more than
/// sysbench can do in that time.
#[test]
fn sysbench_mutex_is_found_when_attached() {
    const TEST: &str = "sysbench_mutex_is_found_when_attached";
    if !require_root_and_sysbench(TEST) {
        return;
    }
    // ~150,000 acquisitions a second untraced: 20 M is minutes of work.
    let args = sysbench_mutex(2, 10_000_000);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let target = TestProcess::spawn(Path::new(SYSBENCH), &args);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let pid = target.pid().to_string();
    let (_, report) = trace(
        "locks-sysbench-attach",
        &[
            "-p",
            &pid,
            "--duration",
            "2s",
            "--no-tui",
            "--alloc-mode",
            "off",
        ],
    );
    let report = typed(&report);
    check_locks(&report);
    let top = top_mutex(&report);
    assert_eq!(top.kind, LockKind::Mutex, "{top:#?}");
    assert_eq!(top.threads, 2, "both threads waited: {top:#?}");
    assert!(
        top.waiters.iter().any(|s| s.module == "sysbench"),
        "{top:#?}"
    );
    assert_between(
        "contentions in 2 s",
        top.contentions as f64,
        MIN_HOT_CONTENTIONS as f64,
        2_000_000.0,
        &format!("{top:#?}"),
    );
    drop(target);
    assert_no_programs_left();
}

/// One-letter names: the function `w`, the lock `m` and the global `g`
/// of `short.c` are named `w`, `m` and `g` (and `m` is the top lock, a
/// mutex; `g`, whose words the two threads write, is false sharing). They
/// came out as the C++ type names an Itanium demangler reads in them
/// (`wchar_t`, `unsigned long`, `__float128`).
#[test]
fn one_letter_names_are_named_right() {
    if !require_root("one_letter_names_are_named_right") {
        return;
    }
    let program = build_workload("short", Variant::Debug).expect("building short");
    let (_, report, truth) = launch_truth("locks-short", &[], &program, &["2"]);
    // The program's own hottest function (the vDSO's clock_gettime, which
    // w calls in its spin loop, can take more samples than w itself on
    // some VMs: 44% against 25% on this one).
    let own = report
        .hot_functions
        .iter()
        .find(|h| h.module == "short")
        .unwrap_or_else(|| panic!("no function of short: {:#?}", report.hot_functions));
    assert_eq!(
        own.function, "w",
        "the hot function w: {:#?}",
        report.hot_functions
    );
    let g = report
        .false_sharing
        .iter()
        .find(|e| e.object.kind == ObjectKind::Global)
        .unwrap_or_else(|| panic!("no global finding: {:#?}", report.false_sharing));
    assert_eq!(g.object.name, "g", "{g:#?}");
    assert_eq!(g.kind, SharingKind::False, "{g:#?}");
    // The write is in spin_ns, inlined into w: the code line is
    // spin_ns's own, with w as the function it was inlined into.
    let write = marked_line("short", "SHORT_G_WRITE");
    let code = g
        .code
        .iter()
        .find(|c| c.line == Some(write))
        .unwrap_or_else(|| panic!("no code at short.c:{write}: {g:#?}"));
    assert_eq!(code.function, "spin_ns", "{code:#?}");
    assert_eq!(
        code.inlined_into.first().map(|c| c.function.as_str()),
        Some("w"),
        "{code:#?}"
    );
    let top = top_mutex(&report);
    assert_eq!(top.name.as_deref(), Some("m"), "{top:#?}");
    assert_eq!(top.kind, LockKind::Mutex, "{top:#?}");
    assert_between(
        "contentions of m",
        top.contentions as f64,
        MIN_HOT_CONTENTIONS as f64,
        truth.get("acquisitions") as f64,
        &format!("{top:#?}"),
    );
    assert_no_programs_left();
}

// ---- Heavy contention (#16): scale, holder blame, kernel lock chains ----

/// No lock record was lost: the notes say nothing "were lost".
fn assert_nothing_lost(report: &Report) {
    assert!(
        !report.notes.iter().any(|n| n.contains("were lost")),
        "{:#?}",
        report.notes
    );
}

/// Proves the contention path at scale: 200 threads on g_hot_lock
/// (`contended 200 3`, default mode), 20 us held each. Nothing is lost
/// (one record per futex call lost 22 M of them in 15 s), the lock tops
/// the mutexes under its own name, and its top waiter is the
/// pthread_mutex_lock line of the workload.
#[test]
fn two_hundred_threads_on_one_mutex_lose_nothing() {
    if !require_root("two_hundred_threads_on_one_mutex_lose_nothing") {
        return;
    }
    let (_, report, truth) = launch_truth(
        "locks-200",
        &[],
        &locks_workload(),
        &["contended", "200", "3"],
    );
    assert_nothing_lost(&report);
    let top = top_mutex(&report);
    assert_eq!(top.name.as_deref(), Some("g_hot_lock"), "{top:#?}");
    assert_between(
        "g_hot_lock contentions",
        top.contentions as f64,
        MIN_HOT_CONTENTIONS as f64,
        truth.get("hot_acquisitions") as f64,
        &format!("{top:#?}"),
    );
    let wait = marked_line("locks", "// WAIT");
    let first = top
        .waiters
        .first()
        .unwrap_or_else(|| panic!("no waiter: {top:#?}"));
    assert!(
        first
            .file
            .as_deref()
            .is_some_and(|f| f.ends_with("locks.c"))
            && first.line == Some(wait),
        "the top waiter is at locks.c:{wait}: {:#?}",
        top.waiters
    );
    assert_no_programs_left();
}

/// Proves that the numbers of a lock agree with each other and that the
/// critical section is blamed: in `yield 4 2` four threads take
/// g_hot_lock, yield their CPU while holding it, and release it, so the
/// others wait for it at nearly every round. Acquisitions are unknown or
/// at least the contentions, less their claimed error (they once said
/// 6,484 acquisitions for 617,013 waits), and the section taken at the
/// YIELDLOCK line caused delay.
#[test]
fn yield_loop_is_consistent_and_blames_its_section() {
    if !require_root("yield_loop_is_consistent_and_blames_its_section") {
        return;
    }
    let (_, report, truth) =
        launch_truth("locks-yield", &[], &locks_workload(), &["yield", "4", "2"]);
    let hot = must_lock(&report, "g_hot_lock");
    assert_between(
        "g_hot_lock contentions",
        hot.contentions as f64,
        MIN_HOT_CONTENTIONS as f64,
        truth.get("yield_rounds") as f64,
        &format!("{hot:#?}"),
    );
    // Both may be estimates (the futex hooks in windows here): the
    // acquisitions at least the least the contentions may be.
    let least = hot.contentions as f64 * (1.0 - hot.contention_error.unwrap_or(0.0));
    assert!(
        hot.acquisitions.is_none_or(|a| a as f64 >= least.floor()),
        "{hot:#?}"
    );
    let line = marked_line("locks", "// YIELDLOCK");
    let section = site_at(&hot.sections, "locks.c", line)
        .unwrap_or_else(|| panic!("a section taken at locks.c:{line}: {:#?}", hot.sections));
    assert!(section.delay_caused_ns > 0, "{section:#?}");
    assert_no_programs_left();
}

/// Share of a lock's blamed delay that must fall on the slow holder in
/// `slowholder`: it holds g_slow_lock ~1 ms every 10 ms while the fast
/// takers hold it for a few ns (sleeping ~50 us between), so nearly all
/// the waiting happens behind the slow section: 0.98-0.99 when run alone,
/// 0.85 in one CI run, where a fast taker preempted while holding held
/// it up to 100 µs (its sections 2.1 µs on average). Charging each wait
/// to the release that ended it would give the slow holder about half.
const SLOW_HOLDER_SHARE: f64 = 0.8;

/// The slow holder's blamed delay as a share of the fast takers' own
/// time inside pthread_mutex_lock (which adds the waker's latency to the
/// futex wait): it is their waiting, so at most about all of it, and at
/// least half.
const SLOW_DELAY_LOW: f64 = 0.5;
const SLOW_DELAY_HIGH: f64 = 1.1;

/// Proves holder blame (Go's and Abseil's mutex-profile semantics): in
/// `slowholder 3 3` one thread holds g_slow_lock ~1 ms every 10 ms and
/// two others take it briefly in a loop. The wait each section caused is
/// charged to it: at least 90% of the lock's delay goes to the section
/// taken at SLOWLOCK, and that delay is about what the fast takers waited.
/// Two fast takers, so that one of them is often woken by the other's
/// release after waiting behind the slow section: charging a wait to
/// whoever ended it would blame the fast section for it.
#[test]
fn slow_holder_is_blamed_for_the_delay() {
    if !require_root("slow_holder_is_blamed_for_the_delay") {
        return;
    }
    assert_slow_blame(
        "locks-slowholder",
        &["--lock-mode", "full", "--alloc-mode", "off"],
        "sections",
        |l| &l.sections[..],
        "// SLOWLOCK",
        SLOW_HOLDER_SHARE,
    );
}

/// Runs `slowholder 3 3` with `flags` and checks the blame in `list`
/// ("sections" or "holders", the entry's `sites`) of g_slow_lock: the
/// site at `marker` caused at least `share` of the lock's delay, and
/// about what the fast takers waited.
fn assert_slow_blame<S: Blamed>(
    name: &str,
    flags: &[&str],
    list: &str,
    sites: fn(&LockEntry) -> &[S],
    marker: &str,
    share: f64,
) {
    let (_, report, truth) =
        launch_truth(name, flags, &locks_workload(), &["slowholder", "3", "3"]);
    assert_eq!(
        report.loader.futex_hooks.as_ref().map(|h| h.kind.as_str()),
        Some("sched"),
        "{:#?}",
        report.loader
    );
    let lock = must_lock(&report, "g_slow_lock");
    let total: u64 = sites(lock).iter().map(Blamed::delay_caused).sum();
    let line = marked_line("locks", marker);
    let slow = site_at(sites(lock), "locks.c", line)
        .unwrap_or_else(|| panic!("{list}: one at locks.c:{line}: {:#?}", sites(lock)));
    let caused = slow.delay_caused();
    assert!(
        caused as f64 >= share * total as f64 && caused > 0,
        "the slow site caused {caused} of {total} ns: {:#?}",
        sites(lock)
    );
    let waited = truth.get("fast_wait_ns") as f64;
    assert_between(
        "the slow site's delay_caused_ns",
        caused as f64,
        waited * SLOW_DELAY_LOW,
        waited * SLOW_DELAY_HIGH,
        &format!("{lock:#?}"),
    );
    assert_no_programs_left();
}

/// Proves kernel lock waits with user call chains: in `kwait 4 3` four
/// threads map, touch, mprotect and unmap memory (churn_maps, called by
/// kwait_loop), each call taking the mm's mmap_lock for writing, so they
/// wait in the kernel (bpftrace on lock:contention_begin: ~1,400 sleeping
/// rwsem waits a second untraced). A kernel entry lists a waiter whose
/// chain has at least two frames: churn_maps at one of its calls, then
/// kwait_loop at its call of churn_maps.
#[test]
fn kernel_lock_waits_have_user_call_chains() {
    if !require_root("kernel_lock_waits_have_user_call_chains") {
        return;
    }
    let (_, report, _) = launch_truth(
        "locks-kwait",
        &["--lock-mode", "off", "--alloc-mode", "off"],
        &locks_workload(),
        &["kwait", "4", "3"],
    );
    let calls: Vec<String> = ["// KWAITMMAP", "// KWAITMPROTECT", "// KWAITMUNMAP"]
        .iter()
        .map(|m| format!("churn_maps (locks.c:{})", marked_line("locks", m)))
        .collect();
    let caller = format!(
        "kwait_loop (locks.c:{})",
        marked_line("locks", "// KWAITCALL")
    );
    let chains: Vec<Vec<String>> = report
        .locks
        .iter()
        .filter(|l| l.kind == LockKind::Kernel)
        .flat_map(|l| &l.waiters)
        .map(|w| w.chain.clone())
        .collect();
    let found = chains.iter().any(|chain| {
        let at = chain
            .iter()
            .position(|f| calls.iter().any(|c| f.contains(c.as_str())));
        chain.len() >= 2 && at.is_some_and(|i| chain[i + 1..].iter().any(|f| f.contains(&caller)))
    });
    assert!(
        found,
        "a kernel lock waiter with {calls:?} then {caller:?} in its chain: {chains:#?}\n{:#?}",
        report.locks
    );
    assert_no_programs_left();
}

/// Proves lock contention found in Debian's sysbench `threads` test: 4
/// threads share one lock (--thread-locks=1) and yield while holding it,
/// so they wait for it all the time. The lock tops the mutexes, with a
/// waiter in sysbench's own code, and its numbers agree (checked for
/// every lock by check_locks: the tool once said 6,962 acquisitions,
/// "5760% contended", for 401,008 waits).
#[test]
fn sysbench_threads_lock_is_found() {
    const TEST: &str = "sysbench_threads_lock_is_found";
    if !require_root_and_sysbench(TEST) {
        return;
    }
    let (_, report) = launch_with(
        "locks-sysbench-threads",
        &["--alloc-mode", "off"],
        Path::new(SYSBENCH),
        &[
            "threads",
            "--threads=4",
            "--thread-locks=1",
            "--time=3",
            "run",
        ],
    );
    assert_nothing_lost(&report);
    // sysbench's thread locks are a heap array, and with --alloc-mode off
    // heap blocks are not named: its waiters identify the lock.
    let top = top_mutex(&report);
    assert!(
        top.contentions >= MIN_HOT_CONTENTIONS,
        "contended: {top:#?}"
    );
    assert!(
        top.waiters.iter().any(|w| w.module == "sysbench"),
        "a waiter in sysbench: {top:#?}"
    );
    assert_no_programs_left();
}

/// A mutex inside a heap struct (`struct table`, 48 bytes in) is named
/// by its type and field, from the pointer its lock calls were made from
/// (`pthread_mutex_lock(&tb->lock)`, `tb` a parameter), and by the line
/// that allocated its block. Before, it was "heap block from locks.c:N".
/// The workload frees the block before it exits, and the full allocator
/// mode traces that free, so the block is not live at report time: it is
/// named from what the heap held while the lock was waited for (without
/// that, "struct table.lock" alone, as in a CI run of the default mode
/// whose window took in the free).
#[test]
fn a_heap_mutex_is_named_by_type_and_field() {
    if !require_root("a_heap_mutex_is_named_by_type_and_field") {
        return;
    }
    let (_, report) = launch_with(
        "locks-table",
        &["--alloc-mode", "full"],
        &locks_workload(),
        &["table", "4", "3"],
    );
    let top = top_mutex(&report);
    let name = top.name.as_deref().unwrap_or_default();
    assert!(name.starts_with("struct table.lock "), "{top:#?}");
    let line = marked_line("locks", "/* TABLE_CALLOC */");
    assert!(
        name.ends_with(&format!("locks.c:{line})")),
        "named by its allocation line: {top:#?}"
    );
    assert!(
        top.waiters.iter().any(|w| w.function == "table_loop"),
        "{top:#?}"
    );
    assert_no_programs_left();
}

/// The loader's peak memory bound from the lock issue, attached to a
/// process with 100 k distinct mutexes under load.
const LOADER_PEAK_RSS_100K: u64 = 150 << 20;

/// Proves that the loader's memory is bounded by design: attached to
/// `roundrobin 100000 4 20` (100 k heap mutexes taken in turn by 4
/// threads for 20 s, the threads meeting on whichever one a preempted
/// thread holds), its peak RSS stays within 150 MiB.
#[test]
fn hundred_thousand_mutexes_keep_the_loader_bounded() {
    if !require_root("hundred_thousand_mutexes_keep_the_loader_bounded") {
        return;
    }
    let (report, truth) = attach(
        "locks-roundrobin",
        &[],
        &["roundrobin", "100000", "4", "20"],
    );
    assert!(truth.get("rr_acquisitions") > 0);
    let rss = report.loader.peak_rss_bytes;
    assert!(
        rss <= LOADER_PEAK_RSS_100K,
        "loader peak RSS {} MiB > {} MiB: {:#?}",
        rss >> 20,
        LOADER_PEAK_RSS_100K >> 20,
        report.loader
    );
    assert_no_programs_left();
}

// ---- The always-on path at production cost (#33) ----

/// Share of g_slow_lock's blamed delay the slow unlock must get on the
/// kernel side: a fast taker woken behind the other fast taker's release
/// waited for the slow section, for that taker's wake-up (the hand-off,
/// charged to nobody) and for its few-ns section: so the fast unlock gets
/// almost none (0.5-0.9% beside two CPU hogs, 3 runs; before hand-offs
/// were left out, 2.7-7.1%, and 12-23% in an earlier CI). Charging each
/// wait whole to the release that ended it gives the fast unlock about
/// 45% (it ends that share of the waits).
const SLOW_RELEASE_SHARE: f64 = 0.9;

/// Proves holder blame on the default path, from the kernel alone (no
/// lock uprobes): in `slowholder 3 3` one thread holds g_slow_lock ~1 ms
/// every 10 ms and two others take it briefly in a loop, so a fast
/// taker's wait often spans the slow section and then the other fast
/// taker's wake-up and release. The releases are the wakers the sched
/// hooks saw, and each part of a wait is charged to the release that
/// ended it, hand-offs to nobody: the slow holder's unlock (SLOWUNLOCK)
/// gets at least 90% of the delay the lock's holders caused, and that
/// delay is about what the fast takers waited.
#[test]
fn default_path_blames_the_slow_holder() {
    if !require_root("default_path_blames_the_slow_holder") {
        return;
    }
    assert_slow_blame(
        "locks-slowholder-default",
        &["--lock-mode", "off", "--alloc-mode", "off"],
        "holders",
        |l| &l.holders[..],
        "// SLOWUNLOCK",
        SLOW_RELEASE_SHARE,
    );
}

/// Proves the governor of the always-on path: with `--budget 1` the
/// contention hooks may take 0.25% of `contended 2 4`'s time, and its
/// two threads wait for g_hot_lock some 20 thousand times a second (each
/// traced wait costs the hooks about 2 µs): so the governor must trace
/// one wait in N > 1 and say so, and the scaled wait time must still
/// agree with the time the workload's threads spent in
/// pthread_mutex_lock (the same bounds as the exact count's, widened by
/// the claimed error), with the lock's contentions claimed to within
/// ±50% and at most its acquisitions (the workload's count) plus that.
#[test]
fn governed_waits_are_within_their_claimed_error() {
    if !require_root("governed_waits_are_within_their_claimed_error") {
        return;
    }
    let (_, report, truth) = launch_truth(
        "locks-governed",
        &["--budget", "1", "--lock-mode", "off", "--alloc-mode", "off"],
        &locks_workload(),
        &["contended", "2", "4"],
    );
    let c = lock_contention(&report);
    assert_eq!(c.hooks, "sched", "{c:#?}");
    assert!(
        c.stride_max > 1,
        "the governor never sampled: {c:#?} {:#?}",
        report.loader.programs
    );
    assert!(c.waits_skipped > 0, "{c:#?}");
    // The error is claimed at the session's largest stride (a CI run
    // claimed ±0.32 on 65 k contentions, at most 0.3 being asked then);
    // what must hold is the estimate within it.
    assert_hot_estimate(&report, &truth, "hot_acquisitions", 0.5);
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("probability down to 1/")),
        "the notes say the waits were sampled: {:#?}",
        report.notes
    );
    assert_no_programs_left();
}

/// Proves the hooks' windows: in `yield 4 8` four threads hand a lock
/// over at nearly every round, so the sched hooks run on hundreds of
/// thousands of context switches a second, most finding nothing to do
/// (their base cost, measured at 4-6% of the target's CPU, which no
/// stride lowers). With `--budget 2` that is several times their 0.5%
/// share: the governor must attach them in windows, say so, and the
/// waits seen in the windows, scaled to the session, must still agree
/// with the time the threads spent in pthread_mutex_lock (the same
/// bounds as the exact count's, widened by the claimed error), with the
/// contentions at most the rounds (each round takes the lock once).
#[test]
fn windowed_waits_are_within_their_claimed_error() {
    if !require_root("windowed_waits_are_within_their_claimed_error") {
        return;
    }
    let (_, report, truth) = launch_truth(
        "locks-windowed",
        &["--budget", "2", "--lock-mode", "off", "--alloc-mode", "off"],
        &locks_workload(),
        &["yield", "4", "8"],
    );
    let c = lock_contention(&report);
    assert_eq!(c.hooks, "sched", "{c:#?}");
    assert!(
        c.windows >= 3,
        "the hooks were never detached: {c:#?} {:#?}",
        report.loader.programs
    );
    let attached = c.attached_share;
    assert!(
        attached > 0.0 && attached < 0.6,
        "attached {attached}: {c:#?}"
    );
    assert_hot_estimate(&report, &truth, "yield_rounds", 0.5);
    // Either note says so: "attached in windows of 250 ms", or, when even
    // the sparsest windows left the hooks over their share (12.2% of the
    // target's CPU in one CI run), "even attached one window in 20".
    assert!(
        report.notes.iter().any(|n| n.contains("attached in windows")
            || n.contains("even attached one window in")),
        "the notes say the hooks went in windows: {:#?}",
        report.notes
    );
    assert_no_programs_left();
}

/// g_hot_lock's estimated waits against the workload's own account: a
/// claimed error above 0 and at most `most`, the wait time within the
/// exact count's bounds of the time its threads spent in
/// pthread_mutex_lock widened by that error, and the contentions at most
/// its acquisitions (truth `acquisitions`) plus that error.
fn assert_hot_estimate(report: &Report, truth: &Truth, acquisitions: &str, most: f64) {
    let hot = must_lock(report, "g_hot_lock");
    let error = hot
        .contention_error
        .unwrap_or_else(|| panic!("an estimate claims its error: {hot:#?}"));
    assert!(error > 0.0 && error <= most, "claimed ±{error}: {hot:#?}");
    let waited = truth.get("hot_wait_ns") as f64;
    assert_between(
        "g_hot_lock wait_total_ns (estimate)",
        hot.wait_total_ns as f64,
        waited * WAIT_SHARE_LOW * (1.0 - error),
        waited * WAIT_SHARE_HIGH * (1.0 + error),
        &format!("{hot:#?}"),
    );
    assert_between(
        "g_hot_lock contentions (estimate)",
        hot.contentions as f64,
        MIN_HOT_CONTENTIONS as f64,
        truth.get(acquisitions) as f64 * (1.0 + error),
        &format!("{hot:#?}"),
    );
}

/// Proves the fallback path: with `MEMPROF_FUTEX_HOOKS=syscalls` the
/// futex syscall tracepoints are used, the report says so and why, and
/// the hot lock of `contended 2 2` is still found waited for at its
/// pthread_mutex_lock line.
#[test]
fn syscall_fallback_still_finds_the_hot_lock() {
    if !require_root("syscall_fallback_still_finds_the_hot_lock") {
        return;
    }
    let program = locks_workload();
    let args = launch_args(
        &["--lock-mode", "off", "--alloc-mode", "off"],
        &program,
        &["contended", "2", "2"],
    );
    let (_, report) = trace_env(
        "locks-syscall-fallback",
        &args,
        &[("MEMPROF_FUTEX_HOOKS", Path::new("syscalls"))],
        std::time::Duration::from_secs(60),
    );
    let report = typed(&report);
    check_locks(&report);
    let hooks = report
        .loader
        .futex_hooks
        .as_ref()
        .unwrap_or_else(|| panic!("no futex_hooks: {:#?}", report.loader));
    assert_eq!(hooks.kind, "syscalls", "{hooks:#?}");
    assert!(
        hooks
            .why
            .as_deref()
            .is_some_and(|w| w.contains("MEMPROF_FUTEX_HOOKS")),
        "{hooks:#?}"
    );
    let hot = must_lock(&report, "g_hot_lock");
    assert!(hot.contentions >= MIN_HOT_CONTENTIONS, "{hot:#?}");
    let line = marked_line("locks", "// WAIT");
    assert!(
        site_at(&hot.waiters, "locks.c", line).is_some(),
        "waited at locks.c:{line}: {:#?}",
        hot.waiters
    );
    assert_no_programs_left();
}

/// `alloc arena 60` built as `variant`, with `env` besides its truth
/// file, ready: it runs past the tool's report, which reads its memory
/// (ended when dropped). Returns it and its truth file.
fn start_arenas(test: &str, variant: Variant, env: &[(&str, &str)]) -> (TestProcess, PathBuf) {
    let alloc = build_workload("alloc", variant).expect("building alloc");
    let truth_path = Truth::path(test);
    let mut all = vec![("WORKLOAD_TRUTH", truth_path.to_str().expect("UTF-8 path"))];
    all.extend_from_slice(env);
    let mut target = TestProcess::spawn_env(&alloc, &["arena", "60"], &all);
    target.wait_ready();
    (target, truth_path)
}

/// The note on waits for glibc malloc arenas' locks is in `report`.
fn assert_arena_note(report: &Report) {
    let note = report
        .notes
        .iter()
        .any(|n| n.contains("glibc malloc arena's lock"));
    assert!(note, "{:#?}", report.notes);
}

/// glibc's main arena is in libc's data, where a stripped libc has no
/// symbol for it (it showed as `libc.so.6+0x1d3c60`). With
/// `MALLOC_ARENA_MAX=1` all of `alloc arena`'s threads share it, and a
/// static, stripped build puts it in the program's own data, where no
/// symbol or debug file names it (this machine's libc has a debug file):
/// attached to, the lock there is named as the main arena's from its
/// state in memory, with the arenas' note.
#[test]
fn the_main_arenas_lock_is_named_without_its_symbol() {
    const TEST: &str = "the_main_arenas_lock_is_named_without_its_symbol";
    if !require_root(TEST) {
        return;
    }
    let only_main = [("MALLOC_ARENA_MAX", "1")];
    let (target, truth_path) = start_arenas(TEST, Variant::StaticStripped, &only_main);
    let pid = target.pid();
    let maps = ProcMaps::read(pid).expect("the target's maps");
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("the workload's path");
    let data = maps
        .mappings()
        .iter()
        .find(|m| m.writable && Path::new(&*m.name) == exe)
        .map(|m| m.start..m.end)
        .unwrap_or_else(|| panic!("the program's data in its maps: {maps:#?}"));
    let (_, report) = attach_for(TEST, &pid.to_string(), "3s");
    let truth = Truth::read(&truth_path);
    assert_eq!(
        truth.get("arena_heap"),
        0,
        "the producer's blocks are the main arena's"
    );
    let in_data = |l: &&LockEntry| matches!(l.address, LockAddress::At(a) if data.contains(&a));
    let main = report
        .locks
        .iter()
        .filter(in_data)
        .max_by_key(|l| l.wait_total_ns)
        .unwrap_or_else(|| {
            panic!(
                "a lock in the program's data {data:x?}: {:#?}",
                report.locks
            )
        });
    assert_eq!(
        main.name.as_deref(),
        Some("glibc malloc main arena"),
        "{main:#?}"
    );
    assert!(main.contentions > 0, "{main:#?}");
    let named = report.locks.iter().filter(|l| l.name == main.name).count();
    assert_eq!(named, 1, "one main arena: {:#?}", report.locks);
    assert_arena_note(&report);
    drop(target);
    assert_no_programs_left();
}

/// A mutex in a heap block allocated before the attach has no allocation
/// site, but the program keeps the block in a global (`g_table =
/// calloc(...)`): attached to `locks table` while it runs, the lock is
/// named by its type and field, the block's usable size from its chunk,
/// and the global that points at it. Before, "struct table.lock (96-byte
/// heap block allocated before tracing)", which did not say which one.
#[test]
fn a_lock_in_a_block_made_before_the_attach_is_named_by_the_global_that_keeps_it() {
    const TEST: &str =
        "a_lock_in_a_block_made_before_the_attach_is_named_by_the_global_that_keeps_it";
    if !require_root(TEST) {
        return;
    }
    // No go gate: the workload allocates its table as soon as it is ready,
    // well before the tool has attached.
    let mut target = TestProcess::spawn(&locks_workload(), &["table", "4", "8"]);
    target.wait_ready();
    let (_, report) = attach_for(TEST, &target.pid().to_string(), "3s");
    assert!(
        target.child.try_wait().expect("try_wait").is_none(),
        "still runs"
    );
    let top = top_mutex(&report);
    let name = top.name.as_deref().unwrap_or_default();
    assert!(
        name.starts_with("struct table.lock (")
            && name.contains("heap block allocated before tracing")
            && name.ends_with(", pointed to by g_table)"),
        "{top:#?}"
    );
    drop(target);
    assert_no_programs_left();
}

/// Threads that free blocks another thread's glibc arena made wait for
/// that arena's lock (`alloc arena`): attached to while it runs, the
/// lock is named as the arena's, at the heap the workload found its own
/// block in, with a note on what causes it. Before, it was a bare
/// address. A lock that is no arena's is never named so.
#[test]
fn a_glibc_arenas_lock_is_named_as_the_arenas() {
    const TEST: &str = "a_glibc_arenas_lock_is_named_as_the_arenas";
    if !require_root(TEST) {
        return;
    }
    let (mut target, truth_path) = start_arenas(TEST, Variant::Debug, &[]);
    let (_, report) = attach_for(TEST, &target.pid().to_string(), "3s");
    assert!(
        target.child.try_wait().expect("try_wait").is_none(),
        "still runs"
    );
    let truth = Truth::read(&truth_path);
    let (heap, lock) = (truth.get("arena_heap"), truth.get("arena_lock"));
    assert!(
        heap != 0 && lock > heap,
        "the producer's block is a non-main arena's"
    );
    let entry = report
        .locks
        .iter()
        .find(|l| l.address == LockAddress::At(lock))
        .unwrap_or_else(|| panic!("the arena's lock {lock:#x} is listed: {:#?}", report.locks));
    assert_eq!(
        entry.name.as_deref(),
        Some(format!("glibc malloc arena at {heap:#x}").as_str()),
        "{entry:#?}"
    );
    assert!(entry.contentions > 0, "{entry:#?}");
    assert!(entry.owners.is_empty(), "no owner read: {entry:#?}");
    for l in &report.locks {
        if let (Some(name), LockAddress::At(at)) = (l.name.as_deref(), l.address) {
            if name.starts_with("glibc malloc arena at") {
                let base = at & !((64 << 20) - 1);
                assert_eq!(name, format!("glibc malloc arena at {base:#x}"), "{l:#?}");
            }
        }
    }
    assert_arena_note(&report);
    drop(target); // nothing of the test runs on

    assert_no_programs_left();
}

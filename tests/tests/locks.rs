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

/// How far the traced acquisitions of g_hot_lock may be from the count the
/// workload prints, in full mode (every call traced): 10%.
const ACQUISITIONS_TOLERANCE: f64 = 0.10;

/// Hold time p99 of g_hot_lock in `contended`: each section busy-waits
/// 20 us (`busy_ns`), so almost every hold is at least that; 15 us leaves
/// room for clock granularity and is far above an empty section (~100 ns).
const MIN_HOT_HOLD_P99_NS: u64 = 15_000;

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

fn locks_workload() -> PathBuf {
    build_workload("locks", Variant::Debug).expect("building locks")
}

/// Launches `program args` under the tool and returns the run and its
/// report.
fn launch(name: &str, program: &Path, args: &[&str]) -> (ToolRun, serde_json::Value) {
    launch_with(name, &[], program, args)
}

/// As [`launch`], with tool options `flags`.
fn launch_with(
    name: &str,
    flags: &[&str],
    program: &Path,
    args: &[&str],
) -> (ToolRun, serde_json::Value) {
    let mut all = vec!["--no-tui"];
    all.extend_from_slice(flags);
    all.extend(["--", program.to_str().expect("UTF-8 path")]);
    all.extend_from_slice(args);
    let (run, report) = trace(name, &all);
    check_locks(&report);
    (run, report)
}

/// The report's `locks` entries.
fn locks(report: &serde_json::Value) -> &[serde_json::Value] {
    report["locks"]
        .as_array()
        .unwrap_or_else(|| panic!("locks is not an array: {report:#}"))
}

/// The entry named `name`, if any.
fn lock_named<'a>(report: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    locks(report).iter().find(|l| l["name"] == name)
}

fn get(entry: &serde_json::Value, key: &str) -> u64 {
    entry[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a number: {entry:#}"))
}

/// Every entry is well formed and the list is ranked by total wait time.
fn check_locks(report: &serde_json::Value) {
    let all = locks(report);
    for entry in all {
        let kind = entry["kind"].as_str().unwrap_or_default();
        assert!(
            [
                "mutex",
                "rwlock",
                "condvar",
                "futex",
                "kernel",
                "barrier",
                "join",
                "semaphore"
            ]
            .contains(&kind),
            "kind {kind:?}: {entry:#}"
        );
        assert!(entry["address"].is_string(), "address: {entry:#}");
        assert!(
            get(entry, "wait_p99_ns") <= get(entry, "wait_max_ns")
                && get(entry, "wait_max_ns") <= get(entry, "wait_total_ns"),
            "p99 ≤ max ≤ total: {entry:#}"
        );
        for key in ["waiters", "holders"] {
            assert!(entry[key].is_array(), "{key}: {entry:#}");
        }
    }
    // Lock contention first, then other waits (condvars, joins...), each
    // part by total wait time.
    let contention = |l: &serde_json::Value| {
        ["mutex", "rwlock", "futex", "kernel"].contains(&l["kind"].as_str().unwrap_or_default())
    };
    let ranked: Vec<(bool, u64)> = all
        .iter()
        .map(|l| (contention(l), get(l, "wait_total_ns")))
        .collect();
    assert!(
        ranked
            .windows(2)
            .all(|w| (w[0].0 && !w[1].0) || (w[0].0 == w[1].0 && w[0].1 >= w[1].1)),
        "locks must be ranked: contention first, then by wait_total_ns: {ranked:?}"
    );
}

/// The site of `list` ("waiters" or "holders") at `line` of a file whose
/// name ends with `file`.
fn site_at<'a>(
    entry: &'a serde_json::Value,
    list: &str,
    file: &str,
    line: u32,
) -> Option<&'a serde_json::Value> {
    entry[list]
        .as_array()
        .unwrap_or_else(|| panic!("{list} is not an array: {entry:#}"))
        .iter()
        .find(|s| s["file"].as_str().is_some_and(|f| f.ends_with(file)) && s["line"] == line)
}

/// Proves the kernel-side analysis alone (no uprobes): in `contended 2 3`
/// two threads fight over g_hot_lock (each holds it ~20 us, works ~5 us
/// outside), while g_quiet_lock is taken by one thread only. The hot lock
/// tops the ranking, named by its symbol, as a mutex whose owner was read
/// at wait time, with the waiting line (the pthread_mutex_lock call) and
/// the releasing line (the unlock that woke the waiters); the quiet one
/// shows no contention. With the lock uprobes off (`--lock-mode off`),
/// acquisitions and hold times are unknown (null).
#[test]
fn hot_mutex_is_named_with_waiter_and_releaser_lines() {
    if !require_root("hot_mutex_is_named_with_waiter_and_releaser_lines") {
        return;
    }
    let (_, report) = launch_with(
        "locks-contended",
        &["--lock-mode", "off"],
        &locks_workload(),
        &["contended", "2", "3"],
    );
    let top = locks(&report)
        .first()
        .unwrap_or_else(|| panic!("no locks reported: {report:#}"));
    assert_eq!(top["name"], "g_hot_lock", "the top entry: {top:#}");
    assert_eq!(top["kind"], "mutex", "{top:#}");
    assert!(
        get(top, "contentions") > MIN_HOT_CONTENTIONS,
        "contentions (expected > {MIN_HOT_CONTENTIONS}): {top:#}"
    );
    assert!(get(top, "wait_total_ns") > 0, "{top:#}");
    assert!(
        top["acquisitions"].is_null() && top["hold_p99_ns"].is_null(),
        "lock uprobes off, so no acquisitions or hold times: {top:#}"
    );
    assert!(
        report["lock_tracing"].is_null(),
        "{:#}",
        report["lock_tracing"]
    );
    assert_eq!(
        top["owner_seen"], true,
        "a glibc mutex holds its owner's TID: {top:#}"
    );
    let wait = marked_line("locks", "// WAIT");
    assert!(
        site_at(top, "waiters", "locks.c", wait).is_some(),
        "a waiter at locks.c:{wait}: {:#}",
        top["waiters"]
    );
    let release = marked_line("locks", "// RELEASE");
    assert!(
        site_at(top, "holders", "locks.c", release).is_some(),
        "a releaser at locks.c:{release}: {:#}",
        top["holders"]
    );
    if let Some(quiet) = lock_named(&report, "g_quiet_lock") {
        assert_eq!(
            get(quiet, "contentions"),
            0,
            "one thread alone takes g_quiet_lock: {quiet:#}"
        );
    }
    assert_no_programs_left();
}

/// Proves the lock uprobes in full mode: every pthread_mutex_lock of
/// `contended 2 3` is traced, so g_hot_lock's acquisitions match the count
/// the workload prints (within 10%), its hold p99 reflects the 20 us held,
/// and its critical section is named: taken at the `// WAIT` line,
/// released at `// RELEASE`. g_quiet_lock is taken (acquisitions > 0) but
/// nobody waits for it.
#[test]
fn full_mode_counts_acquisitions_and_hold_times() {
    if !require_root("full_mode_counts_acquisitions_and_hold_times") {
        return;
    }
    let (run, report) = launch_with(
        "locks-full",
        &["--lock-mode", "full"],
        &locks_workload(),
        &["contended", "2", "3"],
    );
    let printed: u64 = run
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("acquisitions "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("the workload prints its acquisitions: {}", run.stderr));
    let hot = lock_named(&report, "g_hot_lock")
        .unwrap_or_else(|| panic!("g_hot_lock is listed: {:#}", report["locks"]));
    let traced = get(hot, "acquisitions");
    assert!(
        (traced as f64 - printed as f64).abs() <= printed as f64 * ACQUISITIONS_TOLERANCE,
        "acquisitions {traced}, the workload counted {printed}: {hot:#}"
    );
    assert!(
        get(hot, "hold_p99_ns") >= MIN_HOT_HOLD_P99_NS,
        "hold p99 (expected ≥ {MIN_HOT_HOLD_P99_NS} ns): {hot:#}"
    );
    assert!(get(hot, "contentions") > MIN_HOT_CONTENTIONS, "{hot:#}");
    let rate = hot["contention_rate"].as_f64().unwrap_or(-1.0);
    assert!(rate > 0.0 && rate <= 1.0, "contention rate: {hot:#}");
    let (wait, release) = (
        marked_line("locks", "// WAIT"),
        marked_line("locks", "// RELEASE"),
    );
    let section = site_at(hot, "sections", "locks.c", wait)
        .unwrap_or_else(|| panic!("a section taken at locks.c:{wait}: {:#}", hot["sections"]));
    assert_eq!(
        section["released_at"],
        format!("locks.c:{release}"),
        "{section:#}"
    );
    let quiet = lock_named(&report, "g_quiet_lock")
        .unwrap_or_else(|| panic!("g_quiet_lock is listed: {:#}", report["locks"]));
    assert!(get(quiet, "acquisitions") > 0, "{quiet:#}");
    assert_eq!(get(quiet, "contentions"), 0, "{quiet:#}");
    let tracing = &report["lock_tracing"];
    assert_eq!(tracing["mode"], "full", "{tracing:#}");
    assert_eq!(tracing["traced_fraction"], 1.0, "{tracing:#}");
    assert_eq!(get(tracing, "sections_lost"), 0, "{tracing:#}");
    assert_no_programs_left();
}

/// Proves the default (sampled) mode: the lock probes are attached in
/// windows within the budget, the report says so, and the hot lock still
/// gets acquisitions (a scaled estimate) and hold times.
#[test]
fn sampled_mode_estimates_acquisitions() {
    if !require_root("sampled_mode_estimates_acquisitions") {
        return;
    }
    let (_, report) = launch("locks-sampled", &locks_workload(), &["contended", "2", "3"]);
    let tracing = &report["lock_tracing"];
    assert_eq!(tracing["mode"], "sampled", "{tracing:#}");
    let fraction = tracing["traced_fraction"].as_f64().unwrap_or(-1.0);
    assert!(fraction > 0.0 && fraction < 1.0, "{tracing:#}");
    let hot = lock_named(&report, "g_hot_lock")
        .unwrap_or_else(|| panic!("g_hot_lock is listed: {:#}", report["locks"]));
    assert!(get(hot, "acquisitions") > 0, "{hot:#}");
    assert!(get(hot, "hold_p99_ns") >= MIN_HOT_HOLD_P99_NS, "{hot:#}");
    assert!(
        report["notes"]
            .as_array()
            .is_some_and(|n| n.iter().any(|n| n
                .as_str()
                .is_some_and(|n| n.contains("acquisitions are scaled estimates")))),
        "{:#}",
        report["notes"]
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
    let (_, report) = launch_with(
        "locks-condvar",
        &["--lock-mode", "full"],
        &locks_workload(),
        &["condvar", "2"],
    );
    for entry in locks(&report) {
        if entry["name"] == "g_queue_cond" {
            assert_eq!(entry["kind"], "condvar", "{entry:#}");
        }
        if entry["kind"] == "mutex" || entry["name"] == "g_queue_lock" {
            assert!(
                get(entry, "wait_total_ns") <= MAX_CONDVAR_MUTEX_WAIT_NS,
                "condvar waits counted as mutex waits: {entry:#}"
            );
        }
    }
    // The uprobes end a section where pthread_cond_wait releases the
    // mutex, and start one where it retakes it.
    let queue = lock_named(&report, "g_queue_lock")
        .unwrap_or_else(|| panic!("g_queue_lock is listed: {:#}", report["locks"]));
    assert!(get(queue, "acquisitions") > 0, "{queue:#}");
    assert!(
        get(queue, "hold_p99_ns") <= MAX_CONDVAR_HOLD_P99_NS,
        "condvar waits counted as holding the mutex: {queue:#}"
    );
    if let Some(cond) = lock_named(&report, "g_queue_cond") {
        let line = marked_line("locks", "// CONDWAIT");
        assert!(
            site_at(cond, "waiters", "locks.c", line).is_some(),
            "a condvar waiter at locks.c:{line}: {:#}",
            cond["waiters"]
        );
    }
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
    let (_, report) = launch_with(
        "locks-rwlock",
        &["--lock-mode", "full"],
        &locks_workload(),
        &["rwlock", "3"],
    );
    let table = lock_named(&report, "g_table_lock")
        .unwrap_or_else(|| panic!("g_table_lock is listed: {:#}", report["locks"]));
    assert_eq!(table["kind"], "rwlock", "{table:#}");
    assert!(
        get(table, "contentions") > MIN_RWLOCK_CONTENTIONS,
        "contentions (expected > {MIN_RWLOCK_CONTENTIONS}): {table:#}"
    );
    let line = marked_line("locks", "// RDLOCK");
    assert!(
        site_at(table, "waiters", "locks.c", line).is_some(),
        "a reader waiting at locks.c:{line}: {:#}",
        table["waiters"]
    );
    // The uprobes see the readers' and the writer's sections; the
    // writer's 2 ms holds dominate.
    assert!(get(table, "acquisitions") > 0, "{table:#}");
    assert!(
        site_at(table, "sections", "locks.c", line).is_some(),
        "a read section at locks.c:{line}: {:#}",
        table["sections"]
    );
    assert!(get(table, "hold_max_ns") >= 1_000_000, "{table:#}");
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
    let (_, report) = launch("locks-rust", &program, &["3"]);
    let counter = locks(&report)
        .iter()
        .find(|l| {
            l["name"]
                .as_str()
                .is_some_and(|n| n.contains("COUNTER_LOCK"))
        })
        .unwrap_or_else(|| panic!("COUNTER_LOCK is listed: {:#}", report["locks"]));
    let kind = counter["kind"].as_str().unwrap_or_default();
    assert!(
        kind == "futex" || kind == "mutex",
        "kind {kind:?}: {counter:#}"
    );
    assert!(
        get(counter, "contentions") > MIN_RUST_CONTENTIONS,
        "contentions (expected > {MIN_RUST_CONTENTIONS}): {counter:#}"
    );
    let line = marked_line_in(&rust_workload_source("rustlock"), "// RUSTWAIT");
    assert!(
        site_at(counter, "waiters", "rustlock.rs", line).is_some(),
        "a waiter at rustlock.rs:{line}: {:#}",
        counter["waiters"]
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

/// Proves that contention is found in a real program without debug
/// symbols: Debian's pbzip2 (stripped) compressing a 40 MB file with two
/// workers. Its queue mutexes are heap objects its threads meet on
/// (perf, untraced: ~40 mutex futex waits per run); the waiting code is
/// named by module and offset (pbzip2+0x...) or libc's symbols.
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
    let names_module = |site: &serde_json::Value| {
        ["function", "module", "file"].iter().any(|key| {
            site[*key]
                .as_str()
                .is_some_and(|s| s.contains("pbzip2") || s.contains("libc"))
        })
    };
    let found = locks(&report).iter().any(|l| {
        get(l, "contentions") > 0
            && l["waiters"]
                .as_array()
                .is_some_and(|w| w.iter().any(names_module))
    });
    assert!(
        found,
        "a contended lock whose waiters are in pbzip2 or libc: {:#}",
        report["locks"]
    );
    assert_no_programs_left();
}

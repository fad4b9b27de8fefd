//! `cargo xtask test`: every test built once by one `cargo test --no-run`,
//! then each test binary run here.
//!
//! The unit tests and the suites that change kernel-wide state run alone;
//! the other integration suites run side by side, in lanes. Each lane runs
//! one suite at a time, and a suite runs its tests one at a time, as
//! before: what lanes share is the kernel, and a test that checks what the
//! tool left behind tells another suite's tool from its own
//! (`memprof_tests::leaks`). A suite's output is printed whole when it
//! ends, so lanes do not interleave lines.

use std::{
    collections::VecDeque,
    path::PathBuf,
    process::{Command, Stdio},
    sync::Mutex,
    time::Instant,
};

use anyhow::{bail, Context, Result};

use crate::{cargo, is_root, root};

/// Suites that must run with nothing beside them, and why.
const ALONE: &[(&str, &str)] = &[
    (
        "foundation",
        "unmounts tracefs to see the tool mount it, and reads kernel.bpf_stats_enabled, \
         which any running tool turns on",
    ),
    (
        "links",
        "counts the uprobe links attached on the machine (bpftool here cannot tell \
         which process holds one)",
    ),
    (
        "allocator",
        "checks that the off mode attaches no allocator probe, among all attached",
    ),
];

/// Seconds each slow suite took in a clean-clone CI run (2 vCPUs,
/// 2026-11-29), to start the longest first; an unlisted suite counts as
/// short. Only the order depends on them.
const SECONDS: &[(&str, u32)] = &[
    ("allocator", 188),
    ("locks", 121),
    ("sharing", 107),
    ("ulcp", 65),
    ("foundation", 45),
    ("heap", 35),
    ("demo", 27),
    ("safety", 26),
    ("containers", 23),
    ("export", 19),
    ("naming", 16),
    ("cache", 15),
    ("links", 13),
    ("fuzz", 13),
];

/// One test binary cargo built, or one module of it.
#[derive(Clone)]
struct Suite {
    /// The test target's name ("integration", "fuzz", or the package's for
    /// unit tests).
    target: String,
    /// The suite's: the module's ("allocator") when the binary holds one
    /// suite per module, else the target's.
    name: String,
    /// "lib", "bin" or "test".
    kind: String,
    executable: PathBuf,
    /// Where cargo would run it: its package's directory.
    dir: PathBuf,
    /// The module's tests, run by exact name; `None`: the whole binary.
    tests: Option<Vec<String>>,
}

impl Suite {
    fn label(&self) -> String {
        match (self.kind.as_str(), &self.tests) {
            ("test", Some(_)) => format!("{}::{}", self.target, self.name),
            ("test", None) => format!("tests/{}", self.name),
            (kind, _) => format!("{} ({kind} unit tests)", self.name),
        }
    }

    fn seconds(&self) -> u32 {
        SECONDS
            .iter()
            .find(|(n, _)| self.kind == "test" && *n == self.name)
            .map_or(0, |(_, s)| *s)
    }

    fn alone(&self) -> bool {
        self.kind != "test" || ALONE.iter().any(|(n, _)| *n == self.name)
    }
}

/// What the runs added up to.
#[derive(Default)]
pub struct Totals {
    pub passed: usize,
    pub failed: usize,
    /// "name: reason" of each ignored test.
    pub ignored: Vec<String>,
    /// The start of each failed test's panic message.
    pub failures: Vec<String>,
    /// Labels of the suites that failed.
    pub failed_suites: Vec<String>,
}

impl Totals {
    /// Adds one suite's libtest output.
    fn add(&mut self, label: &str, output: &str, ok: bool) {
        for line in output.lines() {
            if let Some(ignored) = ignored_test(line) {
                self.ignored.push(ignored);
            }
            if let Some(rest) = line.strip_prefix("test result: ") {
                self.passed += count_before(rest, " passed");
                self.failed += count_before(rest, " failed");
            }
        }
        self.failures.extend(failure_heads(output));
        if !ok {
            self.failed_suites.push(label.to_string());
        }
    }
}

/// Builds every test once and runs them, `lanes` integration suites at a
/// time; `extra` goes to every test binary (e.g. a test name filter).
pub fn run(extra: &[String], lanes: usize) -> Result<()> {
    let lanes = lanes.max(1);
    prepare_env(lanes);
    let started = Instant::now();
    cargo(&["test", "--no-run"])?;
    let built = started.elapsed();
    let suites = by_module(list()?, extra)?;
    let cpu_built = children_cpu_s();
    let skip_log = workloads::skip_log();
    let _ = std::fs::remove_file(&skip_log);
    let (alone, together): (Vec<Suite>, Vec<Suite>) = suites.into_iter().partition(Suite::alone);
    let totals = Mutex::new(Totals::default());
    for suite in &alone {
        run_suite(suite, extra, "", &totals)?;
    }
    let mut queue: Vec<Suite> = together;
    queue.sort_by_key(|s| std::cmp::Reverse(s.seconds()));
    let queue = Mutex::new(VecDeque::from(queue));
    std::thread::scope(|scope| -> Result<()> {
        let workers: Vec<_> = (1..=lanes)
            .map(|lane| {
                let (queue, totals) = (&queue, &totals);
                scope.spawn(move || -> Result<()> {
                    let tag = if lanes > 1 {
                        format!(" [lane {lane}]")
                    } else {
                        String::new()
                    };
                    loop {
                        // Not in a `while let`: its guard would hold the
                        // queue for the whole suite, one lane at a time.
                        let next = queue.lock().expect("queue").pop_front();
                        let Some(suite) = next else { return Ok(()) };
                        run_suite(&suite, extra, &tag, totals)?;
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().expect("a test lane panicked")?;
        }
        Ok(())
    })?;
    let totals = totals.into_inner().expect("totals");
    println!(
        "xtask: the tests used {:.0} s of CPU in {:.0} s ({lanes} lane(s))",
        children_cpu_s() - cpu_built,
        (started.elapsed() - built).as_secs_f64()
    );
    conclude(&totals, &skip_log, built, started.elapsed())
}

/// The variables the test processes read.
fn prepare_env(lanes: usize) {
    // The binary the integration tests run, built by `cargo test` (the
    // memprof package has integration tests of its own, so cargo builds
    // its binary with them).
    std::env::set_var("MEMPROF_BIN", root().join("target/debug/memprof-ebpf"));
    // As root on a set-up machine every kernel feature the tests need is
    // there, so a skip would hide a failure: make skips fail.
    // Under CI strict mode cannot be turned off (the test harness also
    // reads CI itself, for `cargo test` run directly).
    if workloads::ci() || (is_root() && std::env::var_os("MEMPROF_TESTS_STRICT").is_none()) {
        std::env::set_var("MEMPROF_TESTS_STRICT", "1");
    }
    if !is_root() {
        eprintln!(
            "xtask: not root: the integration tests will be SKIPPED \
             (run `sudo -E env \"PATH=$PATH\" cargo xtask test`)"
        );
    }
    // Read by `memprof_tests::leaks`.
    std::env::set_var("MEMPROF_TESTS_LANES", lanes.to_string());
}

/// The test binaries `cargo test --no-run` built (it builds nothing more
/// when asked again, only lists them).
fn list() -> Result<Vec<Suite>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["test", "--no-run", "--message-format=json"])
        .current_dir(root())
        .stderr(Stdio::inherit())
        .output()
        .context("listing the test binaries")?;
    if !out.status.success() {
        bail!("cargo test --no-run failed ({})", out.status);
    }
    let suites: Vec<Suite> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(suite_of)
        .collect();
    if suites.is_empty() {
        bail!("cargo test --no-run listed no test binaries");
    }
    Ok(suites)
}

/// The test binary in one line of cargo's JSON messages, if it names one.
fn suite_of(line: &str) -> Option<Suite> {
    let msg: serde_json::Value = serde_json::from_str(line).ok()?;
    if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
        return None;
    }
    let executable = PathBuf::from(msg["executable"].as_str()?);
    let manifest = PathBuf::from(msg["manifest_path"].as_str()?);
    let target = msg["target"]["name"].as_str()?.to_string();
    Some(Suite {
        name: target.clone(),
        target,
        kind: msg["target"]["kind"][0].as_str()?.to_string(),
        executable,
        dir: manifest.parent()?.to_path_buf(),
        tests: None,
    })
}

/// Splits libtest arguments into test name filters and the other options
/// (with the values of those that take one).
fn filters_and_options(extra: &[String]) -> (Vec<String>, Vec<String>) {
    const WITH_VALUE: &[&str] = &["--skip", "--color", "--format", "--logfile"];
    let (mut filters, mut options) = (Vec::new(), Vec::new());
    let mut args = extra.iter();
    while let Some(arg) = args.next() {
        if WITH_VALUE.contains(&arg.as_str()) {
            options.push(arg.clone());
            options.extend(args.next().cloned());
        } else if arg.starts_with('-') {
            options.push(arg.clone());
        } else {
            filters.push(arg.clone());
        }
    }
    (filters, options)
}

/// One suite per module of an integration-test binary that holds several
/// (`tests/tests/integration`), each with the tests `extra` selects;
/// other binaries as they are.
fn by_module(suites: Vec<Suite>, extra: &[String]) -> Result<Vec<Suite>> {
    let mut out = Vec::new();
    for suite in suites {
        if suite.kind != "test" {
            out.push(suite);
            continue;
        }
        let listed = Command::new(&suite.executable)
            .args(["--list", "--format", "terse"])
            .args(extra)
            .current_dir(&suite.dir)
            .output()
            .with_context(|| format!("listing the tests of {}", suite.executable.display()))?;
        if !listed.status.success() {
            bail!(
                "{} --list failed ({})",
                suite.executable.display(),
                listed.status
            );
        }
        let modules = modules(&String::from_utf8_lossy(&listed.stdout));
        if modules.is_empty() {
            out.push(suite);
            continue;
        }
        out.extend(modules.into_iter().map(|(module, tests)| Suite {
            name: module,
            tests: Some(tests),
            ..suite.clone()
        }));
    }
    Ok(out)
}

/// Test names by their first module, from libtest's `--list --format
/// terse` ("locks::hot_lock: test"); empty when no name has a module.
fn modules(listing: &str) -> Vec<(String, Vec<String>)> {
    let mut modules: Vec<(String, Vec<String>)> = Vec::new();
    for name in listing.lines().filter_map(|l| l.strip_suffix(": test")) {
        let Some((module, _)) = name.split_once("::") else {
            return Vec::new();
        };
        match modules.iter_mut().find(|(m, _)| m == module) {
            Some((_, tests)) => tests.push(name.to_string()),
            None => modules.push((module.to_string(), vec![name.to_string()])),
        }
    }
    modules
}

/// Runs one test binary, its tests one at a time, and prints its output.
fn run_suite(suite: &Suite, extra: &[String], tag: &str, totals: &Mutex<Totals>) -> Result<()> {
    let label = suite.label();
    if !tag.is_empty() {
        println!("     Started {label}{tag}");
    }
    let started = Instant::now();
    let cpu_before = children_cpu_s();
    let mut cmd = Command::new(&suite.executable);
    cmd.arg("--test-threads=1");
    match &suite.tests {
        Some(tests) => cmd
            .args(
                filters_and_options(extra)
                    .1
                    .iter()
                    .filter(|o| *o != "--exact"),
            )
            .arg("--exact")
            .args(tests),
        None => cmd.args(extra),
    };
    let out = cmd
        .current_dir(&suite.dir)
        .env("CARGO_MANIFEST_DIR", &suite.dir)
        .output()
        .with_context(|| format!("running {}", suite.executable.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Alone, the children's CPU time since it started is its own.
    let cpu = if tag.is_empty() {
        format!(", {:.0} s CPU", children_cpu_s() - cpu_before)
    } else {
        String::new()
    };
    // One print, so that lanes do not interleave.
    println!(
        "     Running {label}{tag} ({})\n{stdout}{}     Finished {label} in {:.0} s{cpu}",
        suite.executable.display(),
        String::from_utf8_lossy(&out.stderr),
        started.elapsed().as_secs_f64()
    );
    totals
        .lock()
        .expect("totals")
        .add(&label, &stdout, out.status.success());
    Ok(())
}

/// User and system CPU seconds of the children waited for so far (the
/// test binaries, and what they waited for in turn).
fn children_cpu_s() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_CHILDREN with a valid pointer has no other precondition.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// Prints what was skipped and ignored and the closing line.
fn conclude(
    totals: &Totals,
    skip_log: &std::path::Path,
    built: std::time::Duration,
    all: std::time::Duration,
) -> Result<()> {
    let skipped: Vec<String> = std::fs::read_to_string(skip_log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    for line in &skipped {
        println!("*** SKIPPED {line}");
    }
    // Tests marked known wrong wait for the issue that fixes them: say
    // which, every time, so that they are not forgotten.
    for line in &totals.ignored {
        println!("*** IGNORED {line}");
    }
    // A CI log may keep only its head and tail: each failure's message
    // again, next to the closing line.
    for line in &totals.failures {
        println!("*** FAILED {line}");
    }
    // libtest counts a skipped test as passed; one plain closing line.
    let passed = totals.passed.saturating_sub(skipped.len());
    println!(
        "tests: {passed} passed, {} failed, {} skipped, {} ignored (known wrong); \
         built in {:.0} s, {:.0} s in all",
        totals.failed,
        skipped.len(),
        totals.ignored.len(),
        built.as_secs_f64(),
        all.as_secs_f64()
    );
    if !totals.failed_suites.is_empty() {
        bail!("tests failed in {}", totals.failed_suites.join(", "));
    }
    Ok(())
}

/// "name: reason" from libtest's line for an ignored test
/// (`test NAME ... ignored, REASON`).
fn ignored_test(line: &str) -> Option<String> {
    let rest = line.strip_prefix("test ")?;
    let (name, outcome) = rest.split_once(" ... ")?;
    let reason = outcome.strip_prefix("ignored")?;
    let reason = reason.strip_prefix(", ").unwrap_or("no reason given");
    Some(format!("{name}: {reason}"))
}

/// Lines of a failed test's message kept for the closing summary.
const FAILURE_LINES: usize = 12;

/// "name: message" for each failed test in libtest's output: the start of
/// what it printed from its panic (`---- NAME stdout ----`, then
/// `thread 'NAME' panicked at FILE:LINE:` and the message).
fn failure_heads(output: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut lines = output.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line
            .strip_prefix("---- ")
            .and_then(|l| l.strip_suffix(" stdout ----"))
        else {
            continue;
        };
        let mut message: Vec<String> = lines
            .by_ref()
            .skip_while(|l| !(l.starts_with("thread '") && l.contains(" panicked at ")))
            .take_while(|l| {
                !l.starts_with("stack backtrace:") && !l.starts_with("---- ") && *l != "failures:"
            })
            .take(FAILURE_LINES)
            .map(|l| match l.split_once(" panicked at ") {
                Some((_, at)) => format!("at {at}"),
                None => l.to_string(),
            })
            .collect::<Vec<_>>();
        while message.last().is_some_and(|l| l.trim().is_empty()) {
            message.pop();
        }
        let mut message = message.join("\n    ");
        if message.is_empty() {
            message = "no panic message".to_string();
        }
        heads.push(format!("{name}: {message}"));
    }
    heads
}

/// In "ok. 8 passed; 0 failed; ...", the number before `word`.
fn count_before(text: &str, word: &str) -> usize {
    text.split(';')
        .find_map(|part| {
            part.trim()
                .trim_start_matches("ok. ")
                .trim_start_matches("FAILED. ")
                .strip_suffix(word)
        })
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::{
        count_before, failure_heads, filters_and_options, ignored_test, modules, suite_of,
    };

    #[test]
    fn a_binary_with_modules_is_one_suite_per_module() {
        let listing = "allocator::a: test\nlocks::b: test\nallocator::c: test\n\n\
                       3 tests, 0 benchmarks\n";
        assert_eq!(
            modules(listing),
            [
                (
                    "allocator".to_string(),
                    vec!["allocator::a".to_string(), "allocator::c".into()]
                ),
                ("locks".to_string(), vec!["locks::b".to_string()]),
            ]
        );
        // The fuzz targets have no module: the binary is one suite.
        assert!(modules("fuzz_dwarf: test\nfuzz_maps: test\n").is_empty());
        assert!(modules("").is_empty());
    }

    #[test]
    fn filters_are_told_from_options() {
        let args: Vec<String> = ["hot", "--nocapture", "--skip", "slow", "locks::"]
            .map(String::from)
            .to_vec();
        let (filters, options) = filters_and_options(&args);
        assert_eq!(filters, ["hot", "locks::"]);
        assert_eq!(options, ["--nocapture", "--skip", "slow"]);
    }

    #[test]
    fn ignored_tests_are_listed_with_their_reason() {
        assert_eq!(
            ignored_test("test latencies ... ignored, known wrong: Allocator (#17)").as_deref(),
            Some("latencies: known wrong: Allocator (#17)")
        );
        assert_eq!(
            ignored_test("test bare ... ignored").as_deref(),
            Some("bare: no reason given")
        );
        assert_eq!(ignored_test("test ok_one ... ok"), None);
        assert_eq!(ignored_test("running 3 tests"), None);
    }

    #[test]
    fn failed_tests_are_listed_with_the_start_of_their_message() {
        let output = "\
failures:

---- locks::pbzip2 stdout ----

thread 'locks::pbzip2' (28655) panicked at tests/tests/integration/locks.rs:843:5:
waiting threads 7 not in [2, 6]
LockEntry {
stack backtrace:
   0: __rustc::rust_begin_unwind
---- locks::other stdout ----
printed before
thread 'locks::other' (1) panicked at a.rs:1:1:
boom

failures:
    locks::pbzip2
";
        assert_eq!(
            failure_heads(output),
            vec![
                "locks::pbzip2: at tests/tests/integration/locks.rs:843:5:\n    \
                 waiting threads 7 not in [2, 6]\n    LockEntry {"
                    .to_string(),
                "locks::other: at a.rs:1:1:\n    boom".to_string(),
            ]
        );
    }

    #[test]
    fn reads_libtest_result_lines() {
        let ok =
            "ok. 8 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 17.55s";
        assert_eq!(
            (count_before(ok, " passed"), count_before(ok, " failed")),
            (8, 0)
        );
        let bad =
            "FAILED. 43 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.38s";
        assert_eq!(
            (count_before(bad, " passed"), count_before(bad, " failed")),
            (43, 1)
        );
        assert_eq!(count_before("garbage", " passed"), 0);
    }

    #[test]
    fn test_binaries_are_read_from_cargo_messages() {
        let line = r#"{"reason":"compiler-artifact","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["test"],"name":"locks"},"profile":{"test":true},"executable":"/w/target/debug/deps/locks-1f"}"#;
        let suite = suite_of(line).expect("a test binary");
        assert_eq!(suite.label(), "tests/locks");
        assert!(!suite.alone());
        assert_eq!(suite.dir, std::path::Path::new("/w/tests"));
        let lib = line
            .replace(r#"["test"]"#, r#"["lib"]"#)
            .replace("locks", "memprof");
        assert!(suite_of(&lib).expect("unit tests").alone());
        let built = line.replace(r#""test":true"#, r#""test":false"#);
        assert!(suite_of(&built).is_none());
        assert!(suite_of(r#"{"reason":"build-finished","success":true}"#).is_none());
    }
}

//! Project tasks: `cargo xtask setup | build | test | demo | bench | fuzz`.
//!
//! `setup` is idempotent and quick when everything is present; every other
//! task runs it first, so a bare machine needs nothing installed by hand.

mod bench;
mod fuzz;
mod limits;
mod setup;
mod slices;

use std::{
    path::PathBuf,
    process::{Command, ExitCode},
};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "memprof-ebpf's build, test, demo and benchmark tasks")]
struct Args {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and testing need (Debian packages, the eBPF
    /// toolchain, bpf-linker). Idempotent.
    Setup,
    /// Build the release binary (target/release/memprof-ebpf).
    Build,
    /// Run every test: lint, unit tests and the root-only integration tests.
    Test {
        /// Extra arguments for the test harness (e.g. a test name filter).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Check formatting, run clippy on the userspace crates and, with the
    /// eBPF toolchain, on the eBPF crate; check the size limits and that no
    /// feature directory uses another.
    Lint,
    /// Trace a bundled workload with one bug of each kind (heap false
    /// sharing, a contended mutex, allocation churn with a leak) and print
    /// the summary (needs root; about 15 s after the build).
    Demo {
        /// Show the live dashboard instead, for 20 s (q quits early).
        #[arg(long)]
        tui: bool,
    },
    /// Measure overhead side by side: target untraced vs traced.
    Bench {
        /// Repetitions of each measurement (the median is reported).
        #[arg(long, default_value_t = 7)]
        runs: usize,
        /// Rounds of the allocator and lock benchmarks (each runs every
        /// configuration once; about a minute per round).
        #[arg(long, default_value_t = 3)]
        alloc_rounds: usize,
        /// Run only this part (default: every part; a piece also runs at
        /// the end of the part it belongs to).
        #[arg(long, value_enum)]
        only: Option<bench::Part>,
    },
    /// Fuzz the parsers of target-controlled data (ELF symbols, DWARF,
    /// .eh_frame, /proc/PID/maps, machine code), optimised, for longer than
    /// `test` does.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Seed of the mutations (decimal or 0x-hex; default: a fixed one).
        #[arg(long)]
        seed: Option<String>,
        /// Run only the targets whose test name contains this (e.g. "dwarf").
        #[arg(long)]
        only: Option<String>,
    },
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    setup::ensure()?;
    match args.task {
        Task::Setup => Ok(()),
        Task::Build => cargo(&["build", "--release", "--package", "memprof"]),
        Task::Test { args } => test(&args),
        Task::Lint => lint(),
        Task::Demo { tui } => demo(tui),
        Task::Bench {
            runs,
            alloc_rounds,
            only,
        } => bench::run(runs, alloc_rounds, only),
        Task::Fuzz {
            seconds,
            seed,
            only,
        } => fuzz::run(seconds, seed.as_deref(), only.as_deref()),
    }
}

/// The workspace root.
fn root() -> PathBuf {
    workloads::workspace()
}

/// Runs cargo (the one that runs us) in the workspace root.
fn cargo(args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args(args)
        .current_dir(root())
        .status()
        .with_context(|| format!("running cargo {args:?}"))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn test(extra: &[String]) -> Result<()> {
    lint()?;
    cargo(&["build", "--package", "memprof"])?;
    let bin = root().join("target/debug/memprof-ebpf");
    // Read by the test processes cargo starts.
    std::env::set_var("MEMPROF_BIN", &bin);
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
    // Integration tests share kernel state (tracefs, loaded programs), so
    // tests run one at a time.
    let mut args = vec!["test", "--", "--test-threads=1"];
    args.extend(extra.iter().map(String::as_str));
    let skip_log = workloads::skip_log();
    let _ = std::fs::remove_file(&skip_log);
    let totals = cargo_test(&args)?;
    let skipped: Vec<String> = std::fs::read_to_string(&skip_log)
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
    // libtest counts a skipped test as passed; one plain closing line.
    let passed = totals.passed.saturating_sub(skipped.len());
    println!(
        "tests: {passed} passed, {} failed, {} skipped, {} ignored (known wrong)",
        totals.failed,
        skipped.len(),
        totals.ignored.len()
    );
    if !totals.ok {
        bail!("tests failed");
    }
    Ok(())
}

#[derive(Default)]
struct Totals {
    passed: usize,
    failed: usize,
    /// "name: reason" of each ignored test.
    ignored: Vec<String>,
    ok: bool,
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

/// Runs `cargo test ...`, passing its output through, and adds up the
/// `test result:` lines of every test binary.
fn cargo_test(args: &[&str]) -> Result<Totals> {
    use std::io::BufRead as _;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut child = Command::new(&cargo)
        .args(args)
        .current_dir(root())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("running cargo test")?;
    let mut totals = Totals::default();
    let stdout = child.stdout.take().context("cargo test stdout")?;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        if let Some(ignored) = ignored_test(&line) {
            totals.ignored.push(ignored);
        }
        if let Some(rest) = line.strip_prefix("test result: ") {
            totals.passed += count_before(rest, " passed");
            totals.failed += count_before(rest, " failed");
        }
    }
    totals.ok = child.wait()?.success();
    Ok(totals)
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

fn lint() -> Result<()> {
    cargo(&["fmt", "--all", "--check"])?;
    cargo(&["clippy", "--all-targets", "--", "-D", "warnings"])?;
    limits::check(&root().join("memprof/src"))?;
    slices::check(&root().join("memprof/src/features"))?;
    let target_dir = root().join("target/bpf-lint");
    let target_dir = target_dir.to_str().context("non-UTF-8 workspace path")?;
    setup::run(
        setup::bpf_cargo(&[
            "clippy",
            "--package",
            "memprof-ebpf",
            "--target-dir",
            target_dir,
        ])
        .args(["--", "-D", "warnings"])
        .current_dir(root()),
    )
}

fn demo(tui: bool) -> Result<()> {
    if !is_root() {
        bail!(
            "the demo loads eBPF programs: run it as root \
             (sudo -E env \"PATH=$PATH\" cargo xtask demo)"
        );
    }
    cargo(&["build", "--release", "--package", "memprof"])?;
    let workload = workloads::build_workload(workloads::DEMO_WORKLOAD, workloads::Variant::Debug)?;
    let bin = root().join("target/release/memprof-ebpf");
    let mut cmd = Command::new(bin);
    let seconds = if tui {
        workloads::DEMO_TUI_SECONDS
    } else {
        workloads::DEMO_SECONDS
    };
    println!(
        "demo: tracing `{} {seconds}`, a two-thread \"server\" with three bugs: two \
         counters on one heap cache line (false sharing), a mutex both threads want \
         (contention), and a session record it never frees (a leak); options {}\n",
        workload.display(),
        workloads::DEMO_TOOL_ARGS.join(" ")
    );
    cmd.args(workloads::DEMO_TOOL_ARGS);
    if !tui {
        let json = workloads::workload_dir().join("demo.json");
        cmd.arg("--no-tui").arg("--json").arg(&json);
        println!("demo: the JSON report goes to {}\n", json.display());
    }
    let status = cmd
        .arg("--")
        .arg(&workload)
        .arg(seconds.to_string())
        .status()
        .context("running memprof-ebpf")?;
    if !status.success() {
        bail!("memprof-ebpf failed ({status})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{count_before, ignored_test, root};
    use std::process::Command;

    #[test]
    fn a_missing_report_number_is_an_error_and_a_miss_is_remembered() {
        let report = serde_json::json!({"loader": {"cpu_s": 0.5}});
        assert_eq!(
            crate::bench::number(&report, &["loader", "cpu_s"]).ok(),
            Some(0.5)
        );
        assert!(crate::bench::number(&report, &["loader", "peak_rss_bytes"]).is_err());
        assert_eq!(crate::bench::verdict("fine", true), "ok");
        assert_eq!(crate::bench::verdict("too slow", false), "MISSED");
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

    /// Packages xtask must never depend on (for normal or build use): their
    /// build needs the eBPF toolchain that xtask's `setup` installs, so with them
    /// in its graph xtask cannot build on a bare machine.
    const NEEDS_TOOLCHAIN: &[&str] = &[
        "memprof",
        "memprof-ebpf",
        "memprof-common",
        "memprof-tests",
        "aya-build",
    ];

    /// The forbidden packages in `cargo tree --prefix none --format {p}` output
    /// (one "name vX.Y.Z (path)" per line).
    fn toolchain_dependents(tree: &str) -> Vec<String> {
        let mut found: Vec<String> = tree
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|name| NEEDS_TOOLCHAIN.contains(name) || name.contains("memprof"))
            .map(str::to_string)
            .collect();
        found.sort();
        found.dedup();
        found
    }

    /// The invariant that lets `cargo xtask setup` run on a bare machine:
    /// nothing xtask builds with needs the eBPF toolchain.
    #[test]
    fn build_graph() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .args(["tree", "--package", "xtask", "--edges", "normal,build"])
            .args(["--prefix", "none", "--format", "{p}"])
            .current_dir(root())
            .output()
            .expect("running cargo tree");
        assert!(
            out.status.success(),
            "cargo tree failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let tree = String::from_utf8_lossy(&out.stdout);
        assert!(
            tree.contains("workloads"),
            "unexpected cargo tree output:\n{tree}"
        );
        let bad = toolchain_dependents(&tree);
        assert!(
            bad.is_empty(),
            "xtask depends on {bad:?}, whose build needs the eBPF toolchain that \
             `cargo xtask setup` installs: on a bare machine xtask could not build. \
             Share code through the `workloads` crate instead."
        );
    }

    #[test]
    fn toolchain_dependents_are_found() {
        let tree = "xtask v0.1.0 (/w/xtask)\nanyhow v1.0.100\nmemprof-tests v0.1.0 (/w/tests)\n\
                    memprof v0.1.0 (/w/memprof)\naya-build v0.2.0\nmemprof v0.1.0 (/w/memprof)\n";
        assert_eq!(
            toolchain_dependents(tree),
            ["aya-build", "memprof", "memprof-tests"]
        );
        assert!(toolchain_dependents("xtask v0.1.0 (/w/xtask)\nworkloads v0.1.0\n").is_empty());
        assert!(toolchain_dependents("").is_empty());
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
}

//! Project tasks: `cargo xtask setup | build | test | demo | bench | fuzz`.
//!
//! `setup` is idempotent and quick when everything is present; every other
//! task runs it first, so a bare machine needs nothing installed by hand.

mod bench;
mod fuzz;
mod limits;
mod setup;
mod slices;
mod testrun;

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
    /// Build every test once and run them: unit tests, then the root-only
    /// integration suites (CI runs `lint` first).
    Test {
        /// Integration suites run at once. On 2 vCPUs, 2 lanes took 400 s
        /// instead of 720 s but failed 9 timing checks: the default is one
        /// suite after another (docs/testing.md).
        #[arg(long, default_value_t = 1)]
        lanes: usize,
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
    /// .eh_frame, PLT stubs, /proc/PID/maps, machine code), optimised, for longer than
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
        Task::Test { lanes, args } => testrun::run(&args, lanes),
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
    use super::root;
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
}

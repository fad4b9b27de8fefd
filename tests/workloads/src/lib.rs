//! Builds the bundled C workloads under `tests/workloads/` and says where
//! things live in the workspace.
//!
//! xtask (demo, bench) and the integration tests both use it. It must stay
//! free of the crates whose build needs the eBPF toolchain, because xtask is
//! what installs that toolchain (see xtask's `build_graph` test).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("workspace root")
        .to_path_buf()
}

/// Where built workloads go.
pub fn workload_dir() -> PathBuf {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
        .join("memprof-workloads");
    std::fs::create_dir_all(&dir).expect("creating the workload directory");
    dir
}

/// Source file of a bundled C workload.
pub fn workload_source(name: &str) -> PathBuf {
    workspace()
        .join("tests/workloads")
        .join(format!("{name}.c"))
}

/// How to build a workload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Variant {
    /// `-g -O1` with frame pointers: symbols and line numbers.
    #[default]
    Debug,
    /// As `Debug`, then `strip`ped: no symbols at all.
    Stripped,
    /// Statically linked (`-static`).
    Static,
    /// Statically linked, then `strip`ped: libc's own data (glibc's main
    /// arena) is the program's, with no symbol for it.
    StaticStripped,
    /// `-g -O0`: every variable lives in a stack slot and is reloaded
    /// before each use, as in code built without optimisation.
    Unoptimized,
    /// `-g -O2`: registers carry values across statements.
    Optimized,
}

/// Builds `workloads/NAME.c` and returns the executable's path.
pub fn build_workload(name: &str, variant: Variant) -> anyhow::Result<PathBuf> {
    let src = workload_source(name);
    let suffix = match variant {
        Variant::Debug => "",
        Variant::Stripped => "-stripped",
        Variant::Static => "-static",
        Variant::StaticStripped => "-static-stripped",
        Variant::Unoptimized => "-O0",
        Variant::Optimized => "-O2",
    };
    let out = workload_dir().join(format!("{name}{suffix}"));
    let tmp = workload_dir().join(format!(
        ".{name}{suffix}.{}.{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let mut cc = Command::new("gcc");
    let level = match variant {
        Variant::Unoptimized => "-O0",
        Variant::Optimized => "-O2",
        _ => "-O1",
    };
    cc.args([
        "-g",
        level,
        "-fno-omit-frame-pointer",
        "-pthread",
        "-Wall",
        "-o",
    ])
    .arg(&tmp)
    .arg(&src);
    if matches!(variant, Variant::Static | Variant::StaticStripped) {
        cc.arg("-static");
    }
    run_ok(&mut cc)?;
    if matches!(variant, Variant::Stripped | Variant::StaticStripped) {
        run_ok(Command::new("strip").arg(&tmp))?;
    }
    install_built(&tmp, &out)?;
    Ok(out)
}

/// Puts the program (or library) just built at `tmp` in place at `out`.
///
/// It is built beside `out` and renamed over it, because the old file may
/// be running (writing to a running executable fails with ETXTBSY;
/// renaming works). When `out` already holds the same bytes (the same
/// source built the same way) it is kept and `tmp` removed: `cargo xtask
/// test` runs suites side by side, and a program another suite is tracing
/// keeps the very file it runs from.
pub fn install_built(tmp: &Path, out: &Path) -> anyhow::Result<()> {
    if std::fs::read(out).is_ok_and(|old| std::fs::read(tmp).is_ok_and(|new| new == old)) {
        std::fs::remove_file(tmp)?;
        return Ok(());
    }
    std::fs::rename(tmp, out)?;
    Ok(())
}

/// Runs `cmd`, failing with its stderr when it does not succeed.
pub fn run_ok(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd
        .output()
        .map_err(|e| anyhow::anyhow!("running {cmd:?}: {e}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Whether this runs under CI (`CI=true`, as CI services set it), where
/// the tests are strict (a skip fails) whatever else is set.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// File where skipped tests are recorded (libtest hides the output of
/// passing tests, so `cargo xtask test` reads this and reports them).
pub fn skip_log() -> PathBuf {
    workload_dir().join("skipped.log")
}

/// The demo's workload (`workloads/demo.c`) and its arguments: how long it
/// runs, in seconds. `cargo xtask demo` and the demo's integration test
/// trace the same thing.
pub const DEMO_WORKLOAD: &str = "demo";
/// The profiler's options for the demo. The allocator is traced in full so
/// that its call counts and live (leaked) bytes are exact (the default
/// sampled mode loses about half the live blocks of a leaking site today).
/// The lock uprobes are off: their acquisition count for a contended lock is
/// wrong today (hundreds for tens of thousands), and the demo shows no number
/// known to be wrong; contention, waiters and releasers come from the
/// kernel side either way. Both are known-wrong tests in `demo.rs`.
pub const DEMO_TOOL_ARGS: &[&str] = &["--alloc-mode", "full", "--lock-mode", "off"];
/// Seconds the demo workload runs for the summary.
pub const DEMO_SECONDS: u32 = 8;
/// Seconds it runs under the dashboard (`cargo xtask demo --tui`).
pub const DEMO_TUI_SECONDS: u32 = 20;

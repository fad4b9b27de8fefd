//! `cargo xtask bench`: overhead measured side by side in one run.
//!
//! Foundation benchmark: a CPU-bound two-thread workload doing a fixed
//! amount of work, timed by itself, untraced and traced at the default
//! sampling rate, alternating runs. The headline ratio is the median of the
//! ratios of each traced run to the untraced run just before it (drift in
//! the VM's speed cancels within a pair); the profiler's own CPU time and
//! peak memory come from its report. Results also go to
//! target/bench/foundation.json.

mod alloc;
mod alloc_heap;
mod alloc_latency;
mod alloc_redis;
mod cache;
mod containers;
mod corpus;
mod export;
mod locks;
mod locks_attach;
mod locks_load;
mod sharing;
mod ulcp;

use std::{path::Path, process::Command};

use anyhow::{bail, Context, Result};
use clap::ValueEnum;

use crate::{cargo, is_root, root};

/// Target ratio of traced to untraced wall time (issue #2).
const TARGET_RATIO: f64 = 1.02;
/// Target share of one core used by the profiler.
const TARGET_LOADER_CPU: f64 = 0.05;
/// Target peak memory of the profiler.
const TARGET_LOADER_RSS: u64 = 100 << 20;
/// Untraced run time the workload is calibrated to.
const RUN_SECONDS: f64 = 4.0;

/// Targets missed so far in this run ("what: value vs target").
static MISSED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// "ok" or "MISSED" for a target named `what`; a miss is remembered, and
/// makes `cargo xtask bench` fail at the end (after every benchmark ran).
pub fn verdict(what: &str, ok: bool) -> &'static str {
    if ok {
        return "ok";
    }
    MISSED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(what.to_string());
    "MISSED"
}

/// A number of the tool's report at `path` (keys); a missing one is an
/// error, never a zero that passes a "less than" target.
pub fn number(report: &serde_json::Value, path: &[&str]) -> Result<f64> {
    path.iter()
        .fold(report, |v, k| &v[*k])
        .as_f64()
        .with_context(|| format!("the report has no number at {}", path.join(".")))
}

/// Environment variable naming the tool to measure instead of the
/// release build (which is then not built), e.g. a debug build.
const TOOL_ENV: &str = "MEMPROF_BIN";

/// The tool the benchmarks measure: `$MEMPROF_BIN`, or the release build.
pub fn tool() -> std::path::PathBuf {
    std::env::var_os(TOOL_ENV)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root().join("target/release/memprof-ebpf"))
}

/// A part of the benchmarks (`--only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Part {
    /// Sampling alone: a two-thread CPU-bound workload.
    Foundation,
    /// The allocator profiler; ends with its pieces below.
    Allocator,
    /// Of "allocator": reported latencies against shims of known cost.
    Latency,
    /// Of "allocator": the heap profile's chains and their cost.
    Heap,
    /// Of "allocator": Debian's redis-server under redis-benchmark.
    Redis,
    /// The lock profiler; ends with "ulcp".
    Locks,
    /// The unnecessary-contention analysis, with it and without.
    Ulcp,
    /// False sharing; ends with "corpus" and "cache".
    Sharing,
    /// Of "sharing": the false-sharing corpus.
    Corpus,
    /// Of "sharing": the cache-use analysis, with it and without.
    Cache,
    /// --pprof and --flamegraph at the end of a session.
    Export,
    /// A target in a private mount namespace against one run directly.
    Containers,
}

pub fn run(runs: usize, alloc_rounds: usize, only: Option<Part>) -> Result<()> {
    if !is_root() {
        bail!("benchmarks load eBPF programs: run them as root (sudo -E cargo xtask bench)");
    }
    if std::env::var_os(TOOL_ENV).is_none() {
        cargo(&["build", "--release", "--package", "memprof"])?;
    }
    run_parts(runs, alloc_rounds, only)?;
    let missed = MISSED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if !missed.is_empty() {
        bail!(
            "{} benchmark targets missed: {}",
            missed.len(),
            missed.join("; ")
        );
    }
    Ok(())
}

fn run_parts(runs: usize, alloc_rounds: usize, only: Option<Part>) -> Result<()> {
    match only {
        Some(Part::Foundation) => foundation(runs),
        Some(Part::Allocator) => allocator(alloc_rounds),
        Some(Part::Locks) => locks(alloc_rounds),
        Some(Part::Redis) => {
            let dir = root().join("target/bench");
            std::fs::create_dir_all(&dir)?;
            let summary = alloc_redis::run(&tool(), &dir)?;
            std::fs::write(
                dir.join("redis.json"),
                serde_json::to_string_pretty(&summary)? + "\n",
            )?;
            Ok(())
        }
        Some(Part::Cache) => {
            let dir = root().join("target/bench");
            std::fs::create_dir_all(&dir)?;
            cache::run(alloc_rounds, &tool(), &dir).map(drop)
        }
        Some(Part::Heap) => {
            let dir = root().join("target/bench");
            std::fs::create_dir_all(&dir)?;
            alloc_heap::run(&tool(), &dir).map(drop)
        }
        Some(Part::Latency) => {
            let dir = root().join("target/bench");
            std::fs::create_dir_all(&dir)?;
            alloc_latency::run(&tool(), &dir).map(drop)
        }
        Some(Part::Ulcp) => {
            let dir = root().join("target/bench");
            std::fs::create_dir_all(&dir)?;
            ulcp::run(alloc_rounds, &tool(), &dir).map(drop)
        }
        Some(Part::Sharing) => sharing(alloc_rounds),
        Some(Part::Export) => export(),
        Some(Part::Containers) => containers(alloc_rounds),
        Some(Part::Corpus) => corpus(alloc_rounds),
        None => {
            foundation(runs)?;
            allocator(alloc_rounds)?;
            locks(alloc_rounds)?;
            sharing(alloc_rounds)?;
            export()?;
            containers(alloc_rounds)
        }
    }
}

fn sharing(rounds: usize) -> Result<()> {
    let mut summary = sharing::run(rounds)?;
    let out = root().join("target/bench/sharing.json");
    let dir = out.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    summary["cache_use"] = cache::run(rounds, &tool(), dir)?;
    std::fs::write(&out, serde_json::to_string_pretty(&summary)? + "\n")?;
    println!("  (written to {})", out.display());
    Ok(())
}

/// The false-sharing corpus alone (`sharing` runs it too).
fn corpus(rounds: usize) -> Result<()> {
    println!("false-sharing corpus");
    let json = root().join("target/bench/sharing-corpus-report.json");
    std::fs::create_dir_all(json.parent().unwrap_or(Path::new(".")))?;
    let summary = corpus::run(rounds, &tool(), &json)?;
    let out = root().join("target/bench/sharing-corpus.json");
    std::fs::write(&out, serde_json::to_string_pretty(&summary)? + "\n")?;
    println!("  (written to {})", out.display());
    Ok(())
}

fn export() -> Result<()> {
    let out = root().join("target/bench/export.json");
    let dir = out.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let summary = export::run(&tool(), dir)?;
    std::fs::write(&out, serde_json::to_string_pretty(&summary)? + "\n")?;
    Ok(())
}

fn containers(rounds: usize) -> Result<()> {
    let out = root().join("target/bench/containers.json");
    let dir = out.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let summary = containers::run(rounds, &tool(), dir)?;
    std::fs::write(&out, serde_json::to_string_pretty(&summary)? + "\n")?;
    Ok(())
}

fn locks(rounds: usize) -> Result<()> {
    let mut summary = locks::run(rounds)?;
    let out = root().join("target/bench/locks.json");
    let dir = out.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    summary["unnecessary"] = ulcp::run(rounds, &tool(), dir)?;
    std::fs::write(&out, serde_json::to_string_pretty(&summary)? + "\n")?;
    println!("  (written to {})", out.display());
    Ok(())
}

fn allocator(rounds: usize) -> Result<()> {
    let out = root().join("target/bench/allocator.json");
    let dir = out.parent().unwrap_or(Path::new("."));
    // The runs write their reports there: on a fresh clone it is not there.
    std::fs::create_dir_all(dir)?;
    let mut summary = alloc::run(rounds)?;
    summary["latency"] = alloc_latency::run(&tool(), dir)?;
    summary["heap"] = alloc_heap::run(&tool(), dir)?;
    summary["redis"] = alloc_redis::run(&tool(), dir)?;
    std::fs::write(&out, serde_json::to_string_pretty(&summary)? + "\n")?;
    println!("  (written to {})", out.display());
    Ok(())
}

fn foundation(runs: usize) -> Result<()> {
    let runs = runs.max(1);
    let spin = workloads::build_workload("spin", workloads::Variant::Debug)?;
    let tool = tool();

    // Calibrate the amount of work to about RUN_SECONDS untraced.
    let probe_chunks = 2000u64;
    let t = untraced(&spin, probe_chunks)?;
    let chunks = ((probe_chunks as f64) * RUN_SECONDS / t).max(100.0) as u64;
    eprintln!("bench: cpu-bound, 2 threads, {chunks} chunks each (~{RUN_SECONDS} s), {runs} runs of each, alternating");

    let json = root().join("target/bench/foundation-report.json");
    std::fs::create_dir_all(json.parent().unwrap_or(Path::new(".")))?;
    let mut plain = Vec::new();
    let mut traced_times = Vec::new();
    let mut loader_cpu = Vec::new();
    let mut loader_share = Vec::new();
    let mut loader_rss = Vec::new();
    for i in 0..runs {
        plain.push(untraced(&spin, chunks)?);
        let (t, report) = traced(&tool, &spin, chunks, &json)?;
        traced_times.push(t);
        loader_cpu.push(number(&report, &["loader", "cpu_s"])?);
        loader_share.push(number(&report, &["loader", "cpu_share"])?);
        loader_rss.push(number(&report, &["loader", "peak_rss_bytes"])?);
        eprintln!(
            "bench: run {}/{runs}: untraced {:.3} s, traced {:.3} s",
            i + 1,
            plain[i],
            t
        );
    }
    // Each traced run is compared with the untraced run just before it, so
    // slow drift in the machine's speed cancels; the median of those ratios
    // is the headline.
    let mut pairs: Vec<f64> = traced_times
        .iter()
        .zip(&plain)
        .map(|(t, u)| t / u)
        .collect();
    let ratio = median(&mut pairs);
    let (u, t) = (median(&mut plain), median(&mut traced_times));
    let cpu = median(&mut loader_cpu);
    let share = median(&mut loader_share);
    let rss = median(&mut loader_rss) as u64;
    println!("foundation benchmark (median of {runs}, one run, side by side)");
    println!("  workload untraced            {u:8.3} s");
    println!("  workload traced at 999 Hz    {t:8.3} s");
    println!(
        "  ratio traced/untraced        {ratio:8.3}   target ≤ {TARGET_RATIO}  {}",
        verdict("foundation traced/untraced", ratio <= TARGET_RATIO)
    );
    println!(
        "    (median of per-pair ratios; pairs ranged {:.3} .. {:.3})",
        pairs.first().copied().unwrap_or(f64::NAN),
        pairs.last().copied().unwrap_or(f64::NAN),
    );
    println!(
        "  profiler CPU                 {cpu:8.3} s = {:.1}% of a core   target < {:.0}%  {}",
        share * 100.0,
        TARGET_LOADER_CPU * 100.0,
        verdict("foundation profiler CPU", share < TARGET_LOADER_CPU)
    );
    println!(
        "  profiler peak RSS            {:8.1} MiB   target < 100 MiB  {}",
        rss as f64 / (1 << 20) as f64,
        verdict("foundation profiler peak RSS", rss < TARGET_LOADER_RSS)
    );
    let summary = serde_json::json!({
        "benchmark": "foundation",
        "runs": runs,
        "chunks": chunks,
        "untraced_s": u,
        "traced_s": t,
        "ratio": ratio,
        "pair_ratios": pairs,
        "loader_cpu_s": cpu,
        "loader_cpu_share": share,
        "loader_peak_rss_bytes": rss,
    });
    let out = root().join("target/bench/foundation.json");
    std::fs::write(&out, serde_json::to_string_pretty(&summary)? + "\n")?;
    println!("  (written to {})", out.display());
    Ok(())
}

/// Runs the workload alone; returns its own elapsed time.
fn untraced(spin: &Path, chunks: u64) -> Result<f64> {
    let out = Command::new(spin)
        .args(["work", "2", &chunks.to_string()])
        .output()?;
    if !out.status.success() {
        bail!("workload failed ({})", out.status);
    }
    elapsed(&String::from_utf8_lossy(&out.stdout))
}

/// Runs the workload under the profiler; returns its elapsed time and the
/// profiler's report.
fn traced(tool: &Path, spin: &Path, chunks: u64, json: &Path) -> Result<(f64, serde_json::Value)> {
    let out = run_tool(
        Command::new(tool)
            .arg("--json")
            .arg(json)
            .arg("--")
            .arg(spin)
            .args(["work", "2", &chunks.to_string()]),
    )?;
    let t = elapsed(&String::from_utf8_lossy(&out.stdout))?;
    Ok((t, read_report(json)?))
}

/// Runs the profiler as `cmd` to its end; fails with the command, its
/// status and its stderr when it does not succeed.
pub(crate) fn run_tool(cmd: &mut Command) -> Result<std::process::Output> {
    let out = cmd.output().context("running memprof-ebpf")?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

/// The report the profiler wrote to `json`.
pub(crate) fn read_report(json: &Path) -> Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(json).with_context(|| format!("reading {}", json.display()))?;
    Ok(serde_json::from_str(&text)?)
}

fn elapsed(stdout: &str) -> Result<f64> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("elapsed ")?.trim().parse().ok())
        .context("the workload printed no elapsed time")
}

/// Runs a self-timing workload command and returns the number it prints
/// after `key` (on stderr or stdout, at the start of a line after any
/// indentation).
pub(crate) fn run_for_metric(cmd: &mut Command, what: &str, key: &str) -> Result<f64> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim_start().strip_prefix(key)?.trim().parse().ok())
        .with_context(|| format!("{what} printed no {key}: {text}"))
}

/// The libc the workloads link (bpftrace needs its path).
pub(crate) fn libc_path() -> Result<std::path::PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/x86_64-linux-gnu/libc.so.6",
    ]
    .iter()
    .map(std::path::PathBuf::from)
    .find(|p| p.exists())
    .context("libc.so.6 not found")
}

/// The median (NaN for no values).
pub(crate) fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// The loader's CPU share over a 10 s session of the tool (`tool_args`,
/// plus `env` when given) attached to `target`, started for the occasion
/// and killed after.
pub(crate) fn attached_loader_cpu(
    tool: &Path,
    target: &mut Command,
    json: &Path,
    tool_args: &[&str],
    env: Option<(&str, &str)>,
) -> Result<f64> {
    let mut target = target
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting the workload")?;
    std::thread::sleep(std::time::Duration::from_millis(300));
    let pid = target.id().to_string();
    let mut cmd = Command::new(tool);
    cmd.args(["-p", &pid, "--duration", "10s", "--no-tui"])
        .args(tool_args)
        .arg("--json")
        .arg(json);
    if let Some((key, value)) = env {
        cmd.env(key, value);
    }
    let result = run_tool(&mut cmd);
    let _ = target.kill();
    let _ = target.wait();
    result?;
    read_report(json)?["loader"]["cpu_share"]
        .as_f64()
        .context("no loader.cpu_share")
}

/// The order the `n` configurations of round `round` run in: forward in
/// even rounds, backward in odd ones. In a fixed order each configuration
/// always ran right after the same other one, and the machine's drift
/// over a round favoured one side: eight rounds by hand of the ulcp
/// workload with the analysis and without gave a median ratio of 1.08
/// one way round and 0.93 the other.
pub(crate) fn round_order(n: usize, round: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if round % 2 == 1 {
        order.reverse();
    }
    order
}

/// The median of the per-round ratios `runs[i] / base[i]`.
pub(crate) fn median_ratio(runs: &[f64], base: &[f64]) -> f64 {
    let mut r: Vec<f64> = runs.iter().zip(base).map(|(t, u)| t / u).collect();
    median(&mut r)
}

/// An analysis that adds no kernel work, measured side by side in
/// alternating rounds: the workload `w args` untraced, traced by the tool
/// (`tool_args`, report in `json`), and traced with the analysis turned
/// off (`off_env=off`). Returns each configuration's `ns_per_iter`, in
/// that order; `after_traced` reads each traced run's report.
pub(crate) fn analysis_rounds(
    rounds: usize,
    tool: &Path,
    tool_args: &[&str],
    json: &Path,
    off_env: &str,
    workload: (&Path, &[&str]),
    mut after_traced: impl FnMut() -> Result<()>,
) -> Result<[Vec<f64>; 3]> {
    let configs = ["untraced", "traced", "traced, analysis off"];
    let mut ns: [Vec<f64>; 3] = Default::default();
    let (w, args) = workload;
    for round in 0..rounds.max(1) {
        for i in round_order(configs.len(), round) {
            let name = configs[i];
            let mut cmd = if i == 0 {
                Command::new(w)
            } else {
                let mut c = Command::new(tool);
                c.args(tool_args).arg("--json").arg(json).arg("--").arg(w);
                if i == 2 {
                    c.env(off_env, "off");
                }
                c
            };
            cmd.args(args);
            ns[i].push(run_for_metric(&mut cmd, name, "ns_per_iter")?);
            if i == 1 {
                after_traced()?;
            }
        }
    }
    Ok(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_alternate_their_order() {
        assert_eq!(round_order(3, 0), [0, 1, 2]);
        assert_eq!(round_order(3, 1), [2, 1, 0]);
        assert_eq!(round_order(3, 2), [0, 1, 2]);
        assert!(round_order(0, 1).is_empty());
    }
}

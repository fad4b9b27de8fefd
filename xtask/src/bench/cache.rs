//! `cargo xtask bench --only cache`: what the cache-use analysis costs,
//! side by side in one run. It adds no kernel work (it reads the samples
//! the false-sharing sampler already takes), so the comparison is the
//! tool with it and without it (`MEMPROF_CACHE_USE=off`), and untraced:
//!
//! - *overhead*: `cacheuse records 4` (tests/workloads/cacheuse.c, a key
//!   scan that prints ns per pass), untraced, traced, and traced without
//!   the analysis, alternating rounds; medians of per-round ratios
//!   (target: no more than the sampler's own, ≤ 1.03x untraced);
//! - *loader CPU*: the tool attached for 10 s to a running scan, with and
//!   without the analysis (target ≤ 5% of a core);
//! - *accuracy*: the scan's line use against the truth (12.5%; target
//!   ±5 points).

use std::{path::Path, process::Command};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::bench::{
    analysis_rounds, attached_loader_cpu, median, median_ratio, read_report, verdict,
};

const TARGET_OVERHEAD: f64 = 1.03;
const TARGET_LOADER_CPU: f64 = 0.05;
const TARGET_LINE_USE_ERROR: f64 = 0.05;

pub fn run(rounds: usize, tool: &Path, dir: &Path) -> Result<Value> {
    let w = workloads::build_workload("cacheuse", workloads::Variant::Debug)?;
    let json = dir.join("cache-report.json");
    println!("cache use (record scan, {rounds} rounds)");
    let mut line_use = Vec::new();
    let tool_args = ["--no-tui", "--alloc-mode", "off", "--lock-mode", "off"];
    let workload = (w.as_path(), &["records", "4"][..]);
    let ns = analysis_rounds(
        rounds,
        tool,
        &tool_args,
        &json,
        "MEMPROF_CACHE_USE",
        workload,
        || {
            let report = read_report(&json)?;
            line_use.push(
                report["cache_utilization"][0]["line_use"]
                    .as_f64()
                    .context("no cache-use finding on the record scan")?,
            );
            Ok(())
        },
    )?;
    let ratio = |i: usize| median_ratio(&ns[i], &ns[0]);
    let (traced, off) = (ratio(1), ratio(2));
    println!(
        "  overhead: traced {traced:.3}x untraced, {off:.3}x without the analysis  target ≤ {TARGET_OVERHEAD}x  {}",
        verdict("cache use: overhead", traced <= TARGET_OVERHEAD)
    );
    let use_median = median(&mut line_use.clone());
    println!(
        "  line use of the record scan: {:.1}% (truth 12.5%)  target ±5 points  {}",
        use_median * 100.0,
        verdict(
            "cache use: line use of the record scan",
            (use_median - 0.125).abs() <= TARGET_LINE_USE_ERROR
        )
    );
    let on = loader_cpu(tool, &w, dir, false)?;
    let without = loader_cpu(tool, &w, dir, true)?;
    println!(
        "  loader CPU attached 10 s: {:.1}% of a core ({:.1}% without the analysis)  target ≤ 5%  {}",
        on * 100.0,
        without * 100.0,
        verdict("cache use: loader CPU", on <= TARGET_LOADER_CPU)
    );
    Ok(json!({
        "ns_per_iter": { "untraced": ns[0], "traced": ns[1], "analysis_off": ns[2] },
        "overhead": traced,
        "overhead_analysis_off": off,
        "line_use": line_use,
        "loader_cpu": on,
        "loader_cpu_analysis_off": without,
    }))
}

/// The loader's CPU share over a 10 s session attached to a running scan.
fn loader_cpu(tool: &Path, w: &Path, dir: &Path, off: bool) -> Result<f64> {
    let mut target = Command::new(w);
    target.args(["records", "14"]);
    let args = ["--alloc-mode", "off", "--lock-mode", "off"];
    let env = off.then_some(("MEMPROF_CACHE_USE", "off"));
    let json = dir.join("cache-attach-report.json");
    attached_loader_cpu(tool, &mut target, &json, &args, env)
}

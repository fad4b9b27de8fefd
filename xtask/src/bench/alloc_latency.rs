//! `cargo xtask bench --only allocator`, latency part: the latencies the
//! tool reports against an allocator whose latencies are known
//! (`tests/workloads/slowalloc.c`, preloaded through `env`: malloc
//! busy-waits 3 µs, free 1 µs), in full mode, with the probes' calibrated
//! cost taken off and, beside it, without (`MEMPROF_ALLOC_CALIBRATION=off`).
//! Target (#17): within 10% or 50 ns.

use std::{path::Path, process::Command};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::bench::{read_report, verdict};

/// slowalloc's busy-waits plus glibc's own call (~20 ns).
const TRUTH_NS: [(&str, f64); 2] = [("malloc", 3020.0), ("free", 1020.0)];

pub fn run(tool: &Path, dir: &Path) -> Result<Value> {
    let lib = dir.join("libslowalloc.so");
    let source = crate::root().join("tests/workloads/slowalloc.c");
    let status = Command::new("gcc")
        .args(["-O1", "-fPIC", "-shared", "-o"])
        .arg(&lib)
        .arg(&source)
        .status()
        .context("running gcc")?;
    if !status.success() {
        bail!("building {} failed", lib.display());
    }
    let alloc = workloads::build_workload("alloc", workloads::Variant::Debug)?;
    let mut out = json!({});
    println!("  latency against slowalloc (malloc 3 µs, free 1 µs; full mode, launched via env):");
    for calibrated in [true, false] {
        let json = dir.join("latency-report.json");
        let mut cmd = Command::new(tool);
        if !calibrated {
            cmd.env("MEMPROF_ALLOC_CALIBRATION", "off");
        }
        let status = cmd
            .args([
                "--alloc-mode",
                "full",
                "--lock-mode",
                "off",
                "--no-tui",
                "--json",
            ])
            .arg(&json)
            .arg("--")
            .arg("env")
            .arg(format!("LD_PRELOAD={}", lib.display()))
            .arg(&alloc)
            .args(["threads", "2", "5000"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()?;
        if !status.success() {
            bail!("the tool failed on slowalloc ({status})");
        }
        let report = read_report(&json)?;
        let label = if calibrated { "calibrated" } else { "raw" };
        for (op, truth) in TRUTH_NS {
            let p50 = p50(&report, op).with_context(|| format!("no {op} rows"))?;
            let error = p50 - truth;
            let ok = error.abs() <= (0.1 * truth).max(50.0);
            let mark = if calibrated {
                verdict("allocator latency error against slowalloc", ok)
            } else {
                "(for comparison)"
            };
            println!(
                "    {label:<10} {op:<6} p50 {p50:7.0} ns, truth {truth:5.0} ns: {:+6.1}%  target ≤ 10% or 50 ns  {mark}",
                100.0 * error / truth
            );
            out[label][op] = json!({ "p50_ns": p50, "truth_ns": truth });
        }
        if calibrated {
            out["probe_cost_ns"] = report["allocator"]["probe_cost_ns"].clone();
        }
    }
    Ok(out)
}

/// The p50 latency of `op` over its rows, weighted by calls traced.
fn p50(report: &Value, op: &str) -> Option<f64> {
    let rows: Vec<&Value> = report["allocator"]["ops"]
        .as_array()?
        .iter()
        .filter(|r| r["op"] == op)
        .collect();
    let calls: f64 = rows.iter().filter_map(|r| r["traced"].as_f64()).sum();
    let weighted: f64 = rows
        .iter()
        .map(|r| r["p50_ns"].as_f64().unwrap_or(0.0) * r["traced"].as_f64().unwrap_or(0.0))
        .sum();
    (calls > 0.0).then(|| weighted / calls)
}

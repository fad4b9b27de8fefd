//! `cargo xtask bench --only export`: what `--pprof` and `--flamegraph`
//! cost at the end of a session. The demo workload is traced at 4999 Hz
//! for 12 s (about 100,000 CPU samples on two busy CPUs), with every
//! export on; the tool reports how long writing the files took and how
//! much its peak memory grew meanwhile (it resets its peak, `VmHWM`,
//! before). Targets (issue #19): under 1 s and 50 MiB.

use std::{path::Path, process::Command};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::bench::{read_report, verdict};

const TARGET_MS: f64 = 1000.0;
const TARGET_MIB: f64 = 50.0;
const SECONDS: &str = "12";
const FREQUENCY: &str = "4999";

pub fn run(tool: &Path, dir: &Path) -> Result<Value> {
    let demo = workloads::build_workload(workloads::DEMO_WORKLOAD, workloads::Variant::Debug)?;
    let json = dir.join("export-report.json");
    let pprof = dir.join("export-{kind}.pb.gz");
    let flame = dir.join("export");
    println!("export: the demo traced {SECONDS} s at {FREQUENCY} Hz with --pprof and --flamegraph");
    let out = Command::new(tool)
        .args(["--no-tui", "--sample-freq", FREQUENCY, "--json"])
        .arg(&json)
        .arg("--pprof")
        .arg(&pprof)
        .arg("--flamegraph")
        .arg(&flame)
        .arg("--")
        .arg(&demo)
        .arg(SECONDS)
        .output()
        .context("running the tool")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("the tool failed: {stderr}");
    }
    let (ms, mib) = parse_cost(&stderr)
        .with_context(|| format!("no \"profiles written in\" line in: {stderr}"))?;
    let report = read_report(&json)?;
    let samples = report["sampling"]["samples"].as_u64().unwrap_or(0);
    let chains = report["allocator"]["heap_profile"]["sites"]
        .as_array()
        .map_or(0, Vec::len);
    println!("  {samples} CPU samples, {chains} allocation chains");
    let ms_ok = ms < TARGET_MS;
    println!(
        "  export time {ms:.0} ms   target < {TARGET_MS:.0} ms  {}",
        verdict("export: time", ms_ok)
    );
    let mib_ok = mib.is_some_and(|m| m < TARGET_MIB);
    println!(
        "  extra peak memory {}   target < {TARGET_MIB:.0} MiB  {}",
        mib.map_or("unknown".into(), |m| format!("{m:.1} MiB")),
        verdict("export: memory", mib_ok)
    );
    Ok(json!({ "samples": samples, "chains": chains, "ms": ms, "extra_mib": mib }))
}

/// "profiles written in N ms (peak memory +M MiB)" → (N, M).
fn parse_cost(stderr: &str) -> Option<(f64, Option<f64>)> {
    let line = stderr.lines().find(|l| l.contains("profiles written in"))?;
    let ms = line
        .split("written in ")
        .nth(1)?
        .split(' ')
        .next()?
        .parse()
        .ok()?;
    let mib = line
        .split("peak memory +")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|m| m.parse().ok());
    Some((ms, mib))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cost_line_is_parsed() {
        let line = "x\nmemprof-ebpf: profiles written in 85 ms (peak memory +3.2 MiB)\n";
        assert_eq!(super::parse_cost(line), Some((85.0, Some(3.2))));
        let unknown = "memprof-ebpf: profiles written in 7 ms (peak memory +unknown)";
        assert_eq!(super::parse_cost(unknown), Some((7.0, None)));
    }
}

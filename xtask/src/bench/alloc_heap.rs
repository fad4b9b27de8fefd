//! `cargo xtask bench --only heap` (and part of `--only allocator`): the
//! byte-sampled heap profile on `alloc chains` (tests/workloads/alloc.c:
//! four sites behind wrappers, with known bytes per iteration, at a
//! moderate rate).
//!
//! - Accuracy: each site's estimated bytes per iteration against the
//!   workload's own, in full mode and in the default (windowed) mode, and
//!   the default mode's top sites against full mode's (same sites, bytes
//!   within 25%: the #17 target).
//! - Cost, side by side in one run (medians of three alternating rounds):
//!   untraced, the default mode with and without call chains
//!   (`MEMPROF_ALLOC_CHAINS=off`), full mode with and without, and the
//!   peer a user would pick, bpftrace summing malloc's bytes by user stack
//!   (`@[ustack] = sum(arg0)`, every call; its stacks follow frame
//!   pointers, which the workload, like most binaries, does not keep).

use std::{collections::BTreeMap, path::Path, process::Command};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::bench::{libc_path, median, read_report, run_for_metric, verdict};

/// The sites: function, bytes per iteration.
const SITES: [(&str, f64); 4] = [
    ("build_index", 8192.0),
    ("fill_cache", 4096.0),
    ("parse_record", 2048.0),
    ("grow_tree", 2048.0),
];
/// Hashing rounds per iteration: ~120 µs of work for 16 allocator calls
/// (130 k calls/s: a moderate load, like the allocator bench's `alloc
/// work`; at 470 k/s the probes slow the target twofold, and the default
/// mode rightly leaves its counts, so the totals, unknown).
const SPIN: &str = "150000";
/// Target: the default mode's sites within this of full mode's.
const TARGET_TOP_SITES: f64 = 0.25;

pub fn run(tool: &Path, dir: &Path) -> Result<Value> {
    let alloc = workloads::build_workload("alloc", workloads::Variant::Debug)?;
    println!("  heap profile on `alloc chains` (4 sites behind wrappers, moderate rate):");
    let full = profile(tool, &alloc, dir, &["--alloc-mode", "full"], "6")?;
    // The default mode traces ~6% of the time: a minute gives the
    // smallest sites ~100 samples.
    let sampled = profile(tool, &alloc, dir, &[], "60")?;
    let mut out = json!({ "full": full.clone(), "default": sampled.clone() });
    let mut ok = true;
    for (site, truth) in SITES {
        let f = full[site].as_f64();
        let s = sampled[site].as_f64();
        let vs_full = match (f, s) {
            (Some(f), Some(s)) => s / f - 1.0,
            _ => f64::NAN,
        };
        ok &= vs_full.abs() <= TARGET_TOP_SITES;
        println!(
            "    {site:<13} truth {truth:6.0} B/iter   full {:>7}   default {:>7}   default vs full {:+6.1}%",
            per_iter(f),
            per_iter(s),
            vs_full * 100.0
        );
    }
    println!(
        "    top sites of the default mode = full mode's, bytes within {:.0}%  {}",
        TARGET_TOP_SITES * 100.0,
        verdict("heap profile: default-mode sites against full mode's", ok)
    );
    out["cost"] = cost(tool, &alloc, dir)?;
    Ok(out)
}

fn per_iter(v: Option<f64>) -> String {
    v.map_or("null".into(), |v| format!("{v:.0}"))
}

/// Runs `alloc chains SECONDS SPIN` under the tool with `flags`; returns
/// each site's estimated bytes per iteration (null when unknown) and the
/// run's samples and claimed count error.
fn profile(tool: &Path, alloc: &Path, dir: &Path, flags: &[&str], secs: &str) -> Result<Value> {
    let json = dir.join("heap-report.json");
    let truth = dir.join("heap.truth");
    let _ = std::fs::remove_file(&truth);
    let status = Command::new(tool)
        .args(flags)
        .args(["--lock-mode", "off", "--no-tui", "--json"])
        .arg(&json)
        .arg("--")
        .arg(alloc)
        .args(["chains", secs, SPIN])
        .env("WORKLOAD_TRUTH", &truth)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()?;
    anyhow::ensure!(
        status.success(),
        "the tool failed on alloc chains ({status})"
    );
    let iterations: f64 = std::fs::read_to_string(&truth)?
        .lines()
        .find_map(|l| l.strip_prefix("chain_iterations ")?.trim().parse().ok())
        .context("no chain_iterations in the truth")?;
    let report = read_report(&json)?;
    let heap = &report["allocator"]["heap_profile"];
    let mut sites = BTreeMap::new();
    for s in heap["sites"].as_array().context("no heap profile")? {
        let name = s["function"].as_str().unwrap_or_default().to_string();
        sites.insert(
            name,
            json!(s["alloc_space"].as_f64().map(|b| b / iterations)),
        );
    }
    let mut out = json!(sites);
    out["samples"] = heap["samples"].clone();
    out["count_error"] = report["allocator"]["count_error"].clone();
    out["iterations"] = json!(iterations);
    Ok(out)
}

/// Rounds of the cost comparison (medians are reported).
const COST_ROUNDS: usize = 3;

/// ns per iteration under each configuration: medians of
/// [`COST_ROUNDS`] rounds that alternate the configurations.
fn cost(tool: &Path, alloc: &Path, dir: &Path) -> Result<Value> {
    let libc = libc_path()?;
    let json = dir.join("heap-cost-report.json");
    let peer = "bpftrace @[ustack] = sum(arg0)";
    let configs = [
        "untraced",
        "default",
        "default, no chains",
        "full",
        "full, no chains",
        peer,
    ];
    let mut ns: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for _ in 0..COST_ROUNDS {
        for name in configs {
            let mut cmd = match name {
                "untraced" => Command::new(alloc),
                _ if name == peer => {
                    let script = format!(
                        "uprobe:{}:malloc /pid == cpid/ {{ @[ustack] = sum(arg0); }}",
                        libc.display()
                    );
                    let mut c = Command::new("bpftrace");
                    c.arg("-e")
                        .arg(script)
                        .arg("-c")
                        .arg(format!("{} chains 6 {SPIN}", alloc.display()));
                    c
                }
                _ => {
                    let mut c = Command::new(tool);
                    if name.starts_with("full") {
                        c.args(["--alloc-mode", "full"]);
                    }
                    if name.ends_with("no chains") {
                        c.env("MEMPROF_ALLOC_CHAINS", "off");
                    }
                    c.args(["--lock-mode", "off", "--no-tui", "--json"])
                        .arg(&json)
                        .arg("--")
                        .arg(alloc);
                    c
                }
            };
            if name != peer {
                cmd.args(["chains", "6", SPIN]);
            }
            ns.entry(name)
                .or_default()
                .push(run_for_metric(&mut cmd, name, "ns_per_iter")?);
        }
    }
    let medians: BTreeMap<&str, f64> = ns
        .into_iter()
        .map(|(k, mut v)| (k, median(&mut v)))
        .collect();
    let base = medians["untraced"];
    for name in configs {
        let v = medians[name];
        println!(
            "    cost: {name:<32} {v:9.0} ns/iter  {:.3}x untraced",
            v / base
        );
    }
    Ok(json!(medians
        .iter()
        .map(|(k, v)| (
            k.to_string(),
            json!({ "ns_per_iter": v, "ratio": v / base })
        ))
        .collect::<serde_json::Map<_, _>>()))
}

//! `cargo xtask bench --only ulcp`: what the unnecessary-contention
//! analysis costs and gets right, side by side in one run. It adds no
//! kernel work (it joins the samples the false-sharing sampler takes with
//! the critical sections the lock uprobes send), so the comparison is
//! the tool with it and without it (`MEMPROF_ULCP=off`), and untraced:
//!
//! - *overhead*: `ulcp 4 4` (tests/workloads/ulcp.c, five contended
//!   locks, one per class, printing ns per round of sections), untraced,
//!   traced in the default mode, and traced without the analysis,
//!   alternating rounds; medians of per-round ratios (target: no more
//!   than the sampler's own, with-analysis ≤ 1.03x without);
//! - *loader CPU*: the tool attached for 10 s to a running `ulcp`, with
//!   and without the analysis, in the default lock mode (target ≤ 5% of a
//!   core) and with every lock call traced (where the analysis sees
//!   100k+ sections a second);
//! - *accuracy*: the class of each lock in a 5 s session with every lock
//!   call traced (target: all five right).

use std::{path::Path, process::Command};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::bench::{
    analysis_rounds, attached_loader_cpu, median_ratio, read_report, run_tool, verdict,
};

const TARGET_OVERHEAD: f64 = 1.03;
const TARGET_LOADER_CPU: f64 = 0.05;
/// The workload's locks and the class each should get.
const CLASSES: [(&str, &str); 5] = [
    ("g_null_lock", "null"),
    ("g_table_lock", "read-read"),
    ("g_slots_lock", "disjoint-write"),
    ("g_flag_lock", "benign"),
    ("g_counter_lock", "true"),
];

pub fn run(rounds: usize, tool: &Path, dir: &Path) -> Result<Value> {
    let w = workloads::build_workload("ulcp", workloads::Variant::Debug)?;
    let json = dir.join("ulcp-report.json");
    println!("unnecessary lock contention (ulcp workload, {rounds} rounds)");
    let tool_args = ["--no-tui", "--alloc-mode", "off"];
    let workload = (w.as_path(), &["4", "4"][..]);
    let ns = analysis_rounds(
        rounds,
        tool,
        &tool_args,
        &json,
        "MEMPROF_ULCP",
        workload,
        || Ok(()),
    )?;
    let ratio = |i: usize, base: usize| median_ratio(&ns[i], &ns[base]);
    let (traced, off, added) = (ratio(1, 0), ratio(2, 0), ratio(1, 2));
    println!(
        "  overhead: traced {traced:.3}x untraced, {off:.3}x without the analysis: the analysis adds {added:.3}x  target ≤ {TARGET_OVERHEAD}x  {}",
        verdict("ulcp: overhead", added <= TARGET_OVERHEAD)
    );
    let right = classes(tool, &w, dir)?;
    println!(
        "  classes in 5 s, every lock call traced: {right} of {} right  target all  {}",
        CLASSES.len(),
        verdict("ulcp: classes", right == CLASSES.len())
    );
    let mut cpu = json!({});
    for mode in ["sampled", "full"] {
        let on = loader_cpu(tool, &w, dir, mode, false)?;
        let without = loader_cpu(tool, &w, dir, mode, true)?;
        let target = if mode == "sampled" {
            format!(
                "target ≤ 5%  {}",
                verdict("ulcp: loader CPU", on <= TARGET_LOADER_CPU)
            )
        } else {
            "(every lock call traced: for information)".into()
        };
        println!(
            "  loader CPU attached 10 s, --lock-mode {mode}: {:.1}% of a core ({:.1}% without the analysis)  {target}",
            on * 100.0,
            without * 100.0,
        );
        cpu[mode] = json!({ "with": on, "without": without });
    }
    Ok(json!({
        "ns_per_iter": { "untraced": ns[0], "traced": ns[1], "analysis_off": ns[2] },
        "overhead": traced,
        "overhead_analysis_off": off,
        "analysis_added": added,
        "classes_right": right,
        "loader_cpu": cpu,
    }))
}

/// How many of the workload's locks get their class in a 5 s launch
/// with every lock call traced.
fn classes(tool: &Path, w: &Path, dir: &Path) -> Result<usize> {
    let json = dir.join("ulcp-classes.json");
    let mut cmd = Command::new(tool);
    cmd.args(["--no-tui", "--alloc-mode", "off", "--lock-mode", "full"])
        .arg("--json")
        .arg(&json)
        .arg("--")
        .arg(w)
        .args(["5", "4"]);
    run_tool(&mut cmd)?;
    let report = read_report(&json)?;
    let locks = report["locks"].as_array().context("no locks")?;
    let got = |name: &str| {
        locks
            .iter()
            .find(|l| l["name"] == name)
            .map(|l| {
                l["unnecessary"]["class"]
                    .as_str()
                    .unwrap_or("none")
                    .to_string()
            })
            .unwrap_or_else(|| "absent".into())
    };
    let mut right = 0;
    for (name, class) in CLASSES {
        let g = got(name);
        println!("    {name}: {g} (expected {class})");
        right += usize::from(g == class);
    }
    Ok(right)
}

/// The loader's CPU share over a 10 s session attached to a running
/// `ulcp` in lock mode `mode`.
fn loader_cpu(tool: &Path, w: &Path, dir: &Path, mode: &str, off: bool) -> Result<f64> {
    let mut target = Command::new(w);
    target.args(["14", "4"]);
    let args = ["--alloc-mode", "off", "--lock-mode", mode];
    let env = off.then_some(("MEMPROF_ULCP", "off"));
    let json = dir.join("ulcp-attach-report.json");
    attached_loader_cpu(tool, &mut target, &json, &args, env)
}

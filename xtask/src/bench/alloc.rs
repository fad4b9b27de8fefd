//! `cargo xtask bench`, allocator part: what tracing the allocator costs
//! the target, side by side in one run.
//!
//! Two workloads from `tests/workloads/alloc.c`, each timing itself:
//! - *malloc-heavy*: `alloc loop N`, malloc(64)+free pairs back to back,
//!   sized to run 3 s untraced (the first window dominates) and 30 s (the
//!   budget does);
//! - *moderate*: `alloc work N`, one malloc+free per few microseconds of
//!   real work, 12 s.
//!
//! Each is run untraced, under the default (sampled, 5% budget) mode, under
//! `--alloc-mode full`, under the hidden `--alloc-mode floor` (the same
//! probes with programs that do nothing: the cost of the traps alone), and
//! under bpftrace's usual latency script (uprobe+uretprobe on malloc with a
//! histogram, uprobe on free). Rounds alternate the configurations, and the
//! headline numbers are medians of per-round ratios, so drift in the VM's
//! speed cancels. Results also go to target/bench/allocator.json.

use std::{path::Path, process::Command};

use crate::bench::{read_report, verdict};
use anyhow::Result;

use crate::{
    bench::{libc_path, median, run_for_metric},
    root,
};

/// Targets from the allocator issue (#17): the default mode on a
/// malloc-heavy loop of 3 s and of 30 s, and on the moderate workload.
const TARGET_DEFAULT_MODERATE: f64 = 1.03;
const TARGET_DEFAULT_HEAVY: f64 = 1.05;
const TARGET_FULL_OVER_FLOOR: f64 = 1.3;
const TARGET_BPFTRACE_OVER_FULL: f64 = 5.0;
const TARGET_LOADER_CPU: f64 = 0.10;

/// Runs under full tracing (1000x slower per call) last about this long.
const SHORT_RUN_S: f64 = 2.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Config {
    Untraced,
    Sampled,
    Full,
    Floor,
    Bpftrace,
}

impl Config {
    const ALL: [Config; 5] = [
        Config::Untraced,
        Config::Sampled,
        Config::Full,
        Config::Floor,
        Config::Bpftrace,
    ];

    fn name(self) -> &'static str {
        match self {
            Config::Untraced => "untraced",
            Config::Sampled => "default (sampled)",
            Config::Full => "--alloc-mode full",
            Config::Floor => "bare uprobe floor",
            Config::Bpftrace => "bpftrace script",
        }
    }

    fn slow(self) -> bool {
        matches!(self, Config::Full | Config::Floor | Config::Bpftrace)
    }
}

struct Workload {
    title: &'static str,
    mode: &'static str,
    /// What the workload prints: `KEY value` (ns per unit of work).
    key: &'static str,
    /// Allocator calls per unit of work.
    calls_per_unit: f64,
    /// How long its untraced and sampled runs last: a short run is
    /// dominated by the first window (a hot allocator traps on every call
    /// until it is detached), a long one by the budget.
    run_s: f64,
    /// The most the default mode may slow it (traced ÷ untraced).
    target: f64,
}

const WORKLOADS: [Workload; 3] = [
    Workload {
        title: "malloc-heavy loop, 3 s",
        mode: "loop",
        key: "ns_per_pair",
        calls_per_unit: 2.0,
        run_s: 3.0,
        target: TARGET_DEFAULT_HEAVY,
    },
    Workload {
        title: "malloc-heavy loop, 30 s",
        mode: "loop",
        key: "ns_per_pair",
        calls_per_unit: 2.0,
        run_s: 30.0,
        target: TARGET_DEFAULT_HEAVY,
    },
    Workload {
        title: "moderate workload",
        mode: "work",
        key: "ns_per_iter",
        calls_per_unit: 2.0,
        run_s: 12.0,
        target: TARGET_DEFAULT_MODERATE,
    },
];

/// One measurement: ns per unit, and the profiler's CPU share if traced.
struct Sample {
    ns: f64,
    loader_cpu: Option<f64>,
}

pub fn run(rounds: usize) -> Result<serde_json::Value> {
    let rounds = rounds.clamp(1, 5);
    let alloc = workloads::build_workload("alloc", workloads::Variant::Debug)?;
    let tool = crate::bench::tool();
    let libc = libc_path()?;
    let json = root().join("target/bench/allocator-report.json");
    let mut results = serde_json::Map::new();
    for w in &WORKLOADS {
        // Calibrate: units for `run_s` untraced; for SHORT_RUN_S traced
        // (a traced call costs microseconds: use a full run to see).
        let probe = measure(Config::Untraced, &alloc, w, 200_000, &tool, &libc, &json)?;
        let long_n = ((w.run_s * 1e9 / probe.ns) as u64).max(10_000);
        let traced = measure(Config::Full, &alloc, w, 20_000, &tool, &libc, &json)?;
        let short_n = ((SHORT_RUN_S * 1e9 / traced.ns) as u64).max(10_000);
        eprintln!(
            "bench: {}: {long_n} units untraced/sampled, {short_n} traced, {rounds} rounds",
            w.title
        );
        let mut per_config: Vec<Vec<Sample>> = Config::ALL.iter().map(|_| Vec::new()).collect();
        for round in 0..rounds {
            for i in super::round_order(Config::ALL.len(), round) {
                let config = Config::ALL[i];
                let n = if config.slow() { short_n } else { long_n };
                let s = measure(config, &alloc, w, n, &tool, &libc, &json)?;
                eprintln!(
                    "bench: {} round {}/{rounds}: {:<18} {:>10.1} ns per unit",
                    w.title,
                    round + 1,
                    config.name(),
                    s.ns
                );
                per_config[i].push(s);
            }
        }
        results.insert(
            format!("{}_{}s", w.mode, w.run_s),
            summarize(w, &per_config),
        );
    }
    Ok(serde_json::Value::Object(results))
}

/// Prints one workload's table and returns its JSON summary.
fn summarize(w: &Workload, per: &[Vec<Sample>]) -> serde_json::Value {
    let ns = |c: Config| -> Vec<f64> {
        per[Config::ALL.iter().position(|&x| x == c).unwrap_or(0)]
            .iter()
            .map(|s| s.ns)
            .collect()
    };
    let ratio = |a: Config, b: Config| -> f64 {
        let mut r: Vec<f64> = ns(a).iter().zip(ns(b)).map(|(x, y)| x / y).collect();
        median(&mut r)
    };
    // Added cost per allocator call (ns), per round, then the median.
    let added = |c: Config| -> f64 {
        let mut r: Vec<f64> = ns(c)
            .iter()
            .zip(ns(Config::Untraced))
            .map(|(x, u)| (x - u) / w.calls_per_unit)
            .collect();
        median(&mut r)
    };
    let default_ratio = ratio(Config::Sampled, Config::Untraced);
    let full_over_floor = added(Config::Full) / added(Config::Floor);
    let bpftrace_over_full = added(Config::Bpftrace) / added(Config::Full);
    let mut cpu: Vec<f64> = per.iter().flatten().filter_map(|s| s.loader_cpu).collect();
    let loader_cpu = cpu
        .iter_mut()
        .fold(0.0f64, |m, v| if *v > m { *v } else { m });
    let target_default = w.target;
    println!("allocator benchmark: {} (medians, one run)", w.title);
    for c in Config::ALL {
        let mut v = ns(c);
        println!("  {:<22} {:>10.1} ns per unit", c.name(), median(&mut v));
    }
    println!(
        "  default / untraced     {default_ratio:>10.3}   target ≤ {target_default}  {}",
        verdict(
            "allocator default/untraced",
            default_ratio <= target_default
        )
    );
    println!(
        "  full: +{:.0} ns per call; floor: +{:.0} ns; bpftrace: +{:.0} ns",
        added(Config::Full),
        added(Config::Floor),
        added(Config::Bpftrace)
    );
    println!(
        "  full / floor (added)   {full_over_floor:>10.2}   target ≤ {TARGET_FULL_OVER_FLOOR}  {}",
        verdict(
            "allocator full over the uprobe floor",
            full_over_floor <= TARGET_FULL_OVER_FLOOR
        )
    );
    println!(
        "  bpftrace / full (added){bpftrace_over_full:>10.2}   target ≥ {TARGET_BPFTRACE_OVER_FULL}  {}",
        verdict("allocator bpftrace over full", bpftrace_over_full >= TARGET_BPFTRACE_OVER_FULL)
    );
    println!(
        "  profiler CPU (max run) {:>9.1}%   target < {:.0}%  {}",
        loader_cpu * 100.0,
        TARGET_LOADER_CPU * 100.0,
        verdict("allocator profiler CPU", loader_cpu < TARGET_LOADER_CPU)
    );
    serde_json::json!({
        "workload": w.title,
        "ns_per_unit": Config::ALL.iter().map(|&c| (c.name(), ns(c))).collect::<Vec<_>>(),
        "default_over_untraced": default_ratio,
        "added_ns_per_call": {
            "full": added(Config::Full),
            "floor": added(Config::Floor),
            "bpftrace": added(Config::Bpftrace),
        },
        "full_over_floor": full_over_floor,
        "bpftrace_over_full": bpftrace_over_full,
        "loader_cpu_share_max": loader_cpu,
    })
}

/// Runs the workload once under `config`; returns its self-timed cost.
fn measure(
    config: Config,
    alloc: &Path,
    w: &Workload,
    n: u64,
    tool: &Path,
    libc: &Path,
    json: &Path,
) -> Result<Sample> {
    let n = n.to_string();
    let mut cmd = match config {
        Config::Untraced => {
            let mut c = Command::new(alloc);
            c.args([w.mode, &n]);
            c
        }
        Config::Sampled | Config::Full | Config::Floor => {
            let mut c = Command::new(tool);
            c.arg("--json").arg(json).arg("--no-tui");
            match config {
                Config::Full => c.args(["--alloc-mode", "full"]),
                Config::Floor => c.args(["--alloc-mode", "floor"]),
                _ => &mut c,
            };
            c.arg("--").arg(alloc).args([w.mode, &n]);
            c
        }
        Config::Bpftrace => {
            let lib = libc.display();
            let script = format!(
                "uprobe:{lib}:malloc /pid == cpid/ {{ @start[tid] = nsecs; }} \
                 uretprobe:{lib}:malloc /@start[tid]/ {{ @ns = hist(nsecs - @start[tid]); \
                 delete(@start[tid]); }} \
                 uprobe:{lib}:free /pid == cpid/ {{ @frees = count(); }}"
            );
            let mut c = Command::new("bpftrace");
            c.arg("-e")
                .arg(script)
                .arg("-c")
                .arg(format!("{} {} {n}", alloc.display(), w.mode));
            c
        }
    };
    let ns = run_for_metric(&mut cmd, config.name(), w.key)?;
    let loader_cpu = match config {
        Config::Sampled | Config::Full | Config::Floor => {
            read_report(json)?["loader"]["cpu_share"].as_f64()
        }
        _ => None,
    };
    Ok(Sample { ns, loader_cpu })
}

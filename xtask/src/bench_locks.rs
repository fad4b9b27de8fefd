//! `cargo xtask bench`, lock part: what the lock-contention tracing costs
//! the target, side by side in one run.
//!
//! Two workloads from `tests/workloads/locks.c`, each timing itself in ns
//! per critical section: many short *uncontended* critical sections
//! (`locks uncontended N`, one thread) and a *contended* lock
//! (`locks contended_bench 2 N`). Each runs untraced, under the default
//! mode (lock probes sampled within the budget), under `--lock-mode full`
//! (every lock, unlock and their returns traced), and under the usual
//! bpftrace script (uprobe+uretprobe on pthread_mutex_lock with a latency
//! histogram), in alternating rounds; the headline ratios are medians of
//! per-round ratios. Full mode is compared with bpftrace by what each adds
//! to a critical section. Results also go to target/bench/locks.json.

use std::{path::Path, process::Command};

use anyhow::Result;

use crate::{
    bench::{libc_path, median, run_for_metric},
    root,
};

/// Targets from the lock issue (default mode).
const TARGET_UNCONTENDED: f64 = 1.02;
const TARGET_CONTENDED: f64 = 1.05;
/// Full mode must add at least 5x less than the bpftrace script.
const TARGET_FULL_VS_BPFTRACE: f64 = 5.0;
/// Untraced and default runs last about this long.
const RUN_S: f64 = 15.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Config {
    Untraced,
    Default,
    Full,
    Bpftrace,
}

const CONFIGS: [Config; 4] = [
    Config::Untraced,
    Config::Default,
    Config::Full,
    Config::Bpftrace,
];

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::Untraced => "untraced",
            Config::Default => "default",
            Config::Full => "full mode",
            Config::Bpftrace => "bpftrace script",
        }
    }
}

struct Workload {
    title: &'static str,
    args: &'static [&'static str],
    target: f64,
}

const WORKLOADS: [Workload; 2] = [
    Workload {
        title: "uncontended",
        args: &["uncontended"],
        target: TARGET_UNCONTENDED,
    },
    Workload {
        title: "contended",
        args: &["contended_bench", "2"],
        target: TARGET_CONTENDED,
    },
];

pub fn run(rounds: usize) -> Result<serde_json::Value> {
    let rounds = rounds.clamp(1, 7);
    let locks = workloads::build_workload("locks", workloads::Variant::Debug)?;
    let tool = crate::bench::tool();
    let json = root().join("target/bench/locks-report.json");
    let mut results = serde_json::Map::new();
    for w in &WORKLOADS {
        let probe = measure(Config::Untraced, &locks, w, 100_000, &tool, &json)?;
        let n = ((RUN_S * 1e9 / probe) as u64).max(10_000);
        // Full mode and bpftrace trap on every lock call: a shorter run
        // says as much.
        let slow = measure(Config::Bpftrace, &locks, w, 20_000, &tool, &json)?;
        let slow_n = ((RUN_S * 1e9 / slow) as u64).clamp(10_000, n);
        eprintln!(
            "bench: locks {}: {n} critical sections ({slow_n} under bpftrace), {rounds} rounds",
            w.title
        );
        let mut per: Vec<Vec<f64>> = vec![Vec::new(); CONFIGS.len()];
        for round in 0..rounds {
            for (i, &c) in CONFIGS.iter().enumerate() {
                let count = if matches!(c, Config::Bpftrace | Config::Full) {
                    slow_n
                } else {
                    n
                };
                let ns = measure(c, &locks, w, count, &tool, &json)?;
                eprintln!(
                    "bench: locks {} round {}/{rounds}: {:<16} {ns:>9.1} ns per critical section",
                    w.title,
                    round + 1,
                    c.name()
                );
                per[i].push(ns);
            }
        }
        let ratio = |i: usize| {
            let mut r: Vec<f64> = per[i].iter().zip(&per[0]).map(|(t, u)| t / u).collect();
            median(&mut r)
        };
        let (default_ratio, full_ratio, bpftrace_ratio) = (ratio(1), ratio(2), ratio(3));
        // What each adds per critical section, per round.
        let mut cheaper: Vec<f64> = (0..per[0].len())
            .map(|r| (per[3][r] - per[0][r]) / (per[2][r] - per[0][r]).max(1.0))
            .collect();
        let cheaper = median(&mut cheaper);
        let full_verdict = crate::bench::verdict(
            &format!("locks {}: bpftrace added over full added", w.title),
            cheaper >= TARGET_FULL_VS_BPFTRACE,
        );
        let verdict = crate::bench::verdict(
            &format!("locks {}: default/untraced", w.title),
            default_ratio <= w.target,
        );
        println!(
            "lock benchmark: {} (medians of {rounds} rounds, one run)",
            w.title
        );
        for (i, c) in CONFIGS.iter().enumerate() {
            let mut v = per[i].clone();
            println!(
                "  {:<18} {:>10.1} ns per critical section",
                c.name(),
                median(&mut v)
            );
        }
        println!(
            "  default / untraced {default_ratio:>10.3}   target ≤ {}  {verdict}",
            w.target
        );
        println!("  full / untraced    {full_ratio:>10.2}");
        println!("  bpftrace / untraced{bpftrace_ratio:>10.2}");
        println!(
            "  bpftrace added / full added {cheaper:>6.2}   target ≥ {TARGET_FULL_VS_BPFTRACE}  \
             {full_verdict}"
        );
        results.insert(
            w.title.into(),
            serde_json::json!({
                "ns_per_cs": CONFIGS.iter().zip(&per).map(|(c, v)| (c.name(), v.clone())).collect::<Vec<_>>(),
                "default_over_untraced": default_ratio,
                "full_over_untraced": full_ratio,
                "bpftrace_added_over_full_added": cheaper,
                "bpftrace_over_untraced": bpftrace_ratio,
            }),
        );
    }
    Ok(serde_json::Value::Object(results))
}

/// Runs the workload once under `config`; returns ns per critical section.
fn measure(
    config: Config,
    locks: &Path,
    w: &Workload,
    n: u64,
    tool: &Path,
    json: &Path,
) -> Result<f64> {
    let n = n.to_string();
    let mut args: Vec<String> = w.args.iter().map(|s| s.to_string()).collect();
    args.push(n);
    let mut cmd = match config {
        Config::Untraced => {
            let mut c = Command::new(locks);
            c.args(&args);
            c
        }
        Config::Default | Config::Full => {
            let mut c = Command::new(tool);
            c.arg("--json").arg(json).arg("--no-tui");
            if config == Config::Full {
                c.args(["--lock-mode", "full"]);
            }
            c.arg("--").arg(locks).args(&args);
            c
        }
        Config::Bpftrace => {
            let libc = libc_path()?;
            let libc = libc.display();
            let script = format!(
                "uprobe:{libc}:pthread_mutex_lock /pid == cpid/ {{ @start[tid] = nsecs; }} \
                 uretprobe:{libc}:pthread_mutex_lock /@start[tid]/ {{ \
                 @ns = hist(nsecs - @start[tid]); delete(@start[tid]); }}"
            );
            let mut c = Command::new("bpftrace");
            c.arg("-e").arg(script).arg("-c").arg(format!(
                "{} {}",
                locks.display(),
                args.join(" ")
            ));
            c
        }
    };
    run_for_metric(&mut cmd, config.name(), "ns_per_cs ")
}

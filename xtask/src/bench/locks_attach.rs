//! `cargo xtask bench`, lock part: the default mode attached with `-p` to
//! running Debian `sysbench threads` processes, as a user would, against
//! the same run's own throughput before and after (issue #33).
//!
//! Two programs: `sysbench threads --threads=4 --thread-locks=1` (four
//! threads on one mutex, yielding while they hold it: a convoy, whose
//! report must name the mutex, a futex word of kind mutex with its waiting
//! code), and `taskset -c 0 sysbench threads --threads=2 --thread-locks=2`
//! (two threads on one CPU yielding to each other: about a million context
//! switches a second; each event takes the next of the two mutexes in
//! turn, so the threads seldom want the same one), the program that
//! per-thread timer events of an attached process slowed to 0.11, see
//! `memprof/src/kernel/sampler.rs`.
//!
//! Each round runs the program for 20 s with a report every second, and
//! attaches the tool to it from 5 s to 13 s. The ratio is the median
//! events/s of the seconds fully traced (7-12) over the median of the
//! seconds not traced at all (1-4 and 16-20); the headline is the median
//! of the rounds' ratios, with their spread.
//!
//! Each round is paired with a control round, run alternately: the same
//! sysbench run and the same seconds compared, nothing attached. On this
//! project's 2-vCPU VMs sysbench's own throughput wanders by tens of
//! percent from second to second (measured: control ratios 0.74, 1.05,
//! 1.12, 1.41 and 0.99 in five runs), so one round says little, and the
//! control's median and spread say how much a traced median can.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::bench::{median, read_report, verdict};

/// The target from the issue: ≥ 0.90 of untraced.
const TARGET_ATTACHED: f64 = 0.90;
const SYSBENCH: &str = "/usr/bin/sysbench";

/// A program the tool is attached to.
struct Program {
    /// Its key in the results.
    key: &'static str,
    /// What the summary calls it.
    title: &'static str,
    /// The command: `sysbench threads` with these options, pinned to CPU 0
    /// when `pinned`.
    options: &'static [&'static str],
    pinned: bool,
    /// Whether the report must name sysbench's mutex.
    contended: bool,
}

const PROGRAMS: [Program; 2] = [
    Program {
        key: "attached_sysbench",
        title: "`sysbench threads --threads=4 --thread-locks=1`",
        options: &["--threads=4", "--thread-locks=1"],
        pinned: false,
        contended: true,
    },
    Program {
        key: "attached_switching",
        title: "`taskset -c 0 sysbench threads --threads=2 --thread-locks=2` \
                (context switches, little contention)",
        options: &["--threads=2", "--thread-locks=2"],
        pinned: true,
        contended: false,
    },
];

/// Each program's results, by its key.
pub fn run(tool: &Path, json: &Path, rounds: usize) -> Result<Vec<(&'static str, Value)>> {
    if !Path::new(SYSBENCH).exists() {
        println!("lock benchmark: attached to sysbench: SKIPPED ({SYSBENCH} is missing)");
        return Ok(Vec::new());
    }
    PROGRAMS
        .iter()
        .map(|p| Ok((p.key, one_program(p, tool, json, rounds)?)))
        .collect()
}

fn one_program(p: &Program, tool: &Path, json: &Path, rounds: usize) -> Result<Value> {
    let mut ratios = Vec::new();
    let mut controls = Vec::new();
    let mut found = Vec::new();
    for round in 0..rounds {
        let (ratio, mutex) = round_once(p, Some(tool), json)?;
        let (control, _) = round_once(p, None, json)?;
        eprintln!(
            "bench: locks {} round {}/{rounds}: {ratio:.3} (control, nothing attached: \
             {control:.3}), mutex found: {mutex}",
            p.key,
            round + 1
        );
        ratios.push(ratio);
        controls.push(control);
        found.push(mutex);
    }
    let (ratio, lo, hi) = median_and_spread(&ratios);
    let (control, control_lo, control_hi) = median_and_spread(&controls);
    let all_found = found.iter().all(|&f| f);
    println!(
        "lock benchmark: default mode attached with -p to a running {} for 8 s ({rounds} \
         rounds)\n  \
         events/s traced / untraced {ratio:.3} ({lo:.3}-{hi:.3})   target ≥ {TARGET_ATTACHED}  {}\n  \
         control rounds, the same seconds with nothing attached: {control:.3} \
         ({control_lo:.3}-{control_hi:.3})",
        p.title,
        verdict(&format!("locks: {}", p.key), ratio >= TARGET_ATTACHED),
    );
    if p.contended {
        println!(
            "  the mutex named with its waiting code in every session: {all_found}  {}",
            verdict(&format!("locks: {} finds its mutex", p.key), all_found),
        );
    }
    Ok(json!({
        "ratios": ratios,
        "ratio": ratio,
        "control_ratios": controls,
        "control_ratio": control,
        "mutex_found": p.contended.then_some(found),
    }))
}

/// The median of `v`, its lowest and its highest.
fn median_and_spread(v: &[f64]) -> (f64, f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (median(&mut v.to_vec()), lo, hi)
}

/// One 20 s run of `p` with the tool attached from 5 s to 13 s (or,
/// without `tool`, nothing attached: the control): the traced over
/// untraced events/s, and whether the report found the mutex.
fn round_once(p: &Program, tool: Option<&Path>, json: &Path) -> Result<(f64, bool)> {
    let _ = std::fs::remove_file(json);
    let mut command = if p.pinned {
        let mut c = Command::new("taskset");
        c.args(["-c", "0", SYSBENCH]);
        c
    } else {
        Command::new(SYSBENCH)
    };
    let sysbench = command
        .arg("threads")
        .args(p.options)
        .args(["--time=20", "--report-interval=1", "run"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting sysbench")?;
    std::thread::sleep(Duration::from_secs(5));
    let Some(tool) = tool else {
        let out = sysbench.wait_with_output()?;
        return Ok((ratio(&String::from_utf8_lossy(&out.stdout)), false));
    };
    let status = Command::new(tool)
        .args([
            "-p",
            &sysbench.id().to_string(),
            "-d",
            "8s",
            "--no-tui",
            "--json",
        ])
        .arg(json)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("running the tool")?;
    let out = sysbench.wait_with_output()?;
    anyhow::ensure!(status.success(), "the tool failed ({status})");
    let report = read_report(json)?;
    let mutex = report["locks"].as_array().into_iter().flatten().any(|l| {
        l["kind"] == "mutex"
            && l["waiters"]
                .as_array()
                .is_some_and(|w| w.iter().any(|s| s["module"] == "sysbench"))
    });
    Ok((ratio(&String::from_utf8_lossy(&out.stdout)), mutex))
}

/// The median events/s of seconds 7-12 over that of seconds 1-4 and
/// 16-20 of sysbench's output.
fn ratio(stdout: &str) -> f64 {
    let per_second = per_second(stdout);
    let pick = |keep: &dyn Fn(u32) -> bool| -> Vec<f64> {
        per_second
            .iter()
            .filter(|(t, _)| keep(*t))
            .map(|&(_, v)| v)
            .collect()
    };
    let traced = median(&mut pick(&|t| (7..=12).contains(&t)));
    let untraced = median(&mut pick(&|t| t <= 4 || t >= 16));
    traced / untraced
}

/// `[ Ns ] thds: 4 eps: X ...` lines: (second, events per second).
fn per_second(text: &str) -> Vec<(u32, f64)> {
    text.lines()
        .filter_map(|l| {
            let (t, rest) = l.trim().strip_prefix('[')?.split_once("s ]")?;
            let eps = rest.split("eps:").nth(1)?.split_whitespace().next()?;
            Some((t.trim().parse().ok()?, eps.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysbench_interval_lines_are_read() {
        let text = "[ 1s ] thds: 4 eps: 350.02 lat (ms,95%): 12.30\n\
                    [ 12s ] thds: 4 eps: 364.00 lat (ms,95%): 11.00\nother";
        assert_eq!(per_second(text), [(1, 350.02), (12, 364.0)]);
    }

    /// Seconds 7-12 against 1-4 and 16-20; 5, 6 and 13-15 (attaching,
    /// detaching) count in neither.
    #[test]
    fn the_ratio_compares_the_traced_seconds_with_the_untouched_ones() {
        let text: String = (1..=20)
            .map(|t| {
                let eps = match t {
                    7..=12 => 300,
                    5 | 6 | 13..=15 => 1,
                    _ => 400,
                };
                format!("[ {t}s ] thds: 4 eps: {eps}.00 lat (ms,95%): 1.0\n")
            })
            .collect();
        assert!((ratio(&text) - 0.75).abs() < 1e-12);
    }
}

//! `cargo xtask bench --only containers`: what a private mount namespace
//! costs the tool. The `locks` workload runs directly, or from a tmpfs that
//! only its private mount namespace sees, with its own copy of libc (what a
//! container's root filesystem is from the host); the tool attaches to it
//! with `-p` (allocator and lock probes in full mode, so their files are
//! read and probed too) for 2 s. Alternating rounds measure, side by
//! side, the attach time (the tool's start to its "tracing pid" log) and
//! the end (the session's end to the tool's exit: drain, detach,
//! symbolization, report). Targets (issue #20): both within 10% of the
//! direct case.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::bench::{median, read_report, verdict};

const TARGET_RATIO: f64 = 1.10;
const SECONDS: f64 = 2.0;
const ARGS: [&str; 3] = ["contended", "4", "60"];

/// The script that mounts the tmpfs at `$1`, copies the files before
/// `--` into it and runs the command after it with them first in the
/// library path (as the integration tests do).
const SCRIPT: &str = r#"d=$1; shift
mount -t tmpfs memprof-bench "$d" || exit 90
while [ "$1" != -- ]; do cp "$1" "$d/" || exit 91; shift; done; shift
exec env LD_LIBRARY_PATH="$d" "$@""#;

pub fn run(rounds: usize, tool: &Path, dir: &Path) -> Result<Value> {
    let locks = workloads::build_workload("locks", workloads::Variant::Debug)?;
    let libc = crate::bench::libc_path()?;
    let root = dir.join("ns-root");
    println!(
        "containers: -p on `locks contended` run directly vs from a private root, {rounds} \
         alternating rounds"
    );
    let (mut attach, mut end) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for round in 0..rounds.max(1) {
        for i in super::round_order(2, round) {
            let private = i == 1;
            let mut target = if private {
                let _ = std::fs::create_dir_all(&root);
                let mut cmd = Command::new("unshare");
                cmd.args([
                    "--mount",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    SCRIPT,
                    "sh",
                ])
                .arg(&root)
                .arg(&libc)
                .arg(&locks)
                .arg("--")
                .arg(root.join("locks"))
                .args(ARGS);
                start(&mut cmd)?
            } else {
                start(Command::new(&locks).args(ARGS))?
            };
            let json = dir.join(format!("containers-{i}.json"));
            let timed = attach_once(tool, target.id(), &json);
            let _ = target.kill();
            let _ = target.wait();
            let (a, e) = timed?;
            check(&read_report(&json)?, private)?;
            println!(
                "  round {round} {}: attach {:.0} ms, end {:.0} ms",
                if private {
                    "private root"
                } else {
                    "direct      "
                },
                a * 1e3,
                e * 1e3
            );
            attach[i].push(a);
            end[i].push(e);
        }
    }
    let _ = std::fs::remove_dir(&root);
    let mut out = json!({});
    for (what, times) in [("attach", &mut attach), ("end", &mut end)] {
        let direct = median(&mut times[0]);
        let private = median(&mut times[1]);
        let ratio = private / direct;
        println!(
            "  {what}: direct {:.0} ms, private root {:.0} ms: {ratio:.3}x   target <= \
             {TARGET_RATIO:.2}x  {}",
            direct * 1e3,
            private * 1e3,
            verdict(&format!("containers: {what} time"), ratio <= TARGET_RATIO)
        );
        out[what] =
            json!({ "direct_ms": direct * 1e3, "private_ms": private * 1e3, "ratio": ratio });
    }
    Ok(out)
}

/// Starts the workload and waits for its "ready".
fn start(cmd: &mut Command) -> Result<Child> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the workload")?;
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().context("stdout")?).read_line(&mut line)?;
    if line.trim() != "ready" {
        let _ = child.kill();
        bail!("the workload did not become ready: {line:?}");
    }
    Ok(child)
}

/// One session of the tool on `pid`: (attach, end) in seconds.
fn attach_once(tool: &Path, pid: u32, json: &Path) -> Result<(f64, f64)> {
    let started = Instant::now();
    let mut child = Command::new(tool)
        .args(["-v", "-p", &pid.to_string(), "--no-tui"])
        .args(["--lock-mode", "full", "--alloc-mode", "full"])
        .arg("--duration")
        .arg(format!("{SECONDS}s"))
        .arg("--json")
        .arg(json)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the tool")?;
    let stderr = BufReader::new(child.stderr.take().context("stderr")?);
    let mut tracing = None;
    let mut log = String::new();
    for line in stderr.lines().map_while(Result::ok) {
        if tracing.is_none() && line.contains("tracing pid") {
            tracing = Some(started.elapsed());
        }
        log.push_str(&line);
        log.push('\n');
    }
    let status = child.wait()?;
    let total = started.elapsed();
    let Some(tracing) = tracing else {
        bail!("the tool never said it was tracing: {log}");
    };
    if !status.success() {
        bail!("the tool failed ({status}): {log}");
    }
    let end = total.saturating_sub(tracing + Duration::from_secs_f64(SECONDS));
    Ok((tracing.as_secs_f64(), end.as_secs_f64()))
}

/// The session found what it should (so the times are of the same work):
/// the workload's hot function named, its lock traced.
fn check(report: &Value, private: bool) -> Result<()> {
    let named = report["hot_functions"]
        .as_array()
        .is_some_and(|h| h.iter().any(|f| f["function"] == "busy_ns"));
    let lock = report["locks"].as_array().is_some_and(|l| {
        l.iter()
            .any(|l| l["name"] == "g_hot_lock" && !l["acquisitions"].is_null())
    });
    if !(named && lock) {
        bail!(
            "the {} session missed busy_ns or g_hot_lock's acquisitions",
            if private { "private-root" } else { "direct" }
        );
    }
    Ok(())
}

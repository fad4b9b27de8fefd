//! `cargo xtask bench --only allocator`, third-party part: Debian's
//! `redis-server` (jemalloc, dynamically linked) under `redis-benchmark`,
//! with the tool attached (`-p`, the main use case) in its default mode,
//! beside bpftrace's usual allocator latency script, in one run:
//!
//! - throughput (SET and GET requests per second) untraced, under the
//!   tool, and under bpftrace, each pass right after the other so the
//!   machine's drift cancels; the headline is traced ÷ untraced;
//! - how long the tool takes to exit after SIGINT (the issue's target:
//!   ≤ 1 s, every probe gone);
//! - what the report says of the allocator: which one, whether its counts
//!   are estimates, and the estimate (or null) beside the calls traced.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::bench::{read_report, verdict};

const REDIS: &str = "/usr/bin/redis-server";
const REDIS_BENCHMARK: &str = "/usr/bin/redis-benchmark";
const BPFTRACE: &str = "/usr/bin/bpftrace";
/// A port on the loopback for the benchmark's redis.
const REDIS_PORT: u16 = 21_988;
/// Requests per pass (SET then GET), on 100 k random keys of 100 bytes.
const REQUESTS: &str = "300000";
/// Targets from the allocator issue (#17).
const TARGET_EXIT_S: f64 = 1.0;
/// The default mode's budget is 5%; a server answering over the loopback
/// is a moderate allocator user.
const TARGET_THROUGHPUT: f64 = 1.0 / 1.05;

/// A child killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn run(tool: &Path, dir: &Path) -> Result<Value> {
    if [REDIS, REDIS_BENCHMARK]
        .iter()
        .any(|p| !Path::new(p).exists())
    {
        println!(
            "  redis-server under redis-benchmark: SKIPPED ({REDIS} or {REDIS_BENCHMARK} is \
             missing: cargo xtask setup installs redis-server and redis-tools)"
        );
        return Ok(Value::Null);
    }
    let server = start_redis()?;
    let pid = server.0.id();
    // Warm up: the keys exist and the allocator has its arenas before the
    // first measured pass.
    let _ = throughput()?;
    let untraced = throughput()?;
    let (traced, exit_s, report) = under_tool(tool, dir, pid, &[], &[])?;
    // Every call traced: the peer is bpftrace's script, which does as much.
    let (full, _, full_report) = under_tool(tool, dir, pid, &[], &["--alloc-mode", "full"])?;
    // The same with one link per probe point (kernels before 6.6).
    let single = [("MEMPROF_UPROBE_LINKS", "single")];
    let (single_rate, single_exit_s, _) = under_tool(tool, dir, pid, &single, &[])?;
    let bpftrace = under_bpftrace(pid)?;
    let untraced_after = throughput()?;
    drop(server);
    let base = (untraced + untraced_after) / 2.0;
    let ratio = traced / base;
    let bt_ratio = bpftrace.map(|b| b / base);
    let alloc = &report["allocator"];
    println!("  redis-server (jemalloc) under redis-benchmark, tool attached with -p:");
    println!(
        "    requests/s untraced {base:.0}, default mode {traced:.0} ({ratio:.3}x), \
         bpftrace latency script {}   target ≥ {TARGET_THROUGHPUT:.3}x  {}",
        bt_ratio.map_or("not run".into(), |r| format!("{:.0} ({r:.3}x)", r * base)),
        verdict(
            "allocator: redis throughput in the default mode",
            ratio >= TARGET_THROUGHPUT
        )
    );
    let full_ratio = full / base;
    println!(
        "    full mode (every call traced) {full:.0} ({full_ratio:.3}x){}; a traced call costs \
         {} (calibrated at start)",
        bt_ratio.map_or(String::new(), |b| format!(
            ", {:.2}x bpftrace's rate",
            full_ratio / b
        )),
        kind_costs(&full_report)
    );
    println!(
        "    exit after SIGINT: {exit_s:.2} s   target ≤ {TARGET_EXIT_S} s  {}",
        verdict(
            "allocator: exit after SIGINT attached to redis",
            exit_s <= TARGET_EXIT_S
        )
    );
    println!(
        "    with single uprobe links (MEMPROF_UPROBE_LINKS=single, as before 6.6): \
         {single_rate:.0} requests/s ({:.3}x), exit after SIGINT {single_exit_s:.2} s",
        single_rate / base
    );
    println!(
        "    allocator {} sampled={} traced_fraction={} calls traced {}",
        alloc["library"], alloc["sampled"], alloc["traced_fraction"], alloc["calls_traced"]
    );
    Ok(json!({
        "requests_per_s": {
            "untraced": base, "default": traced, "full": full, "bpftrace": bpftrace
        },
        "ratio_default": ratio,
        "ratio_full": full_ratio,
        "ratio_bpftrace": bt_ratio,
        "exit_s": exit_s,
        "uprobe_links": report["loader"]["uprobe_links"],
        "single_links": { "requests_per_s": single_rate, "exit_s": single_exit_s },
        "allocator": {
            "library": alloc["library"],
            "sampled": alloc["sampled"],
            "traced_fraction": alloc["traced_fraction"],
            "calls_traced": alloc["calls_traced"],
            "ops": alloc["ops"],
        },
    }))
}

fn start_redis() -> Result<Killed> {
    let port = REDIS_PORT.to_string();
    let server = Killed(
        Command::new(REDIS)
            .args(["--port", &port, "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--daemonize", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting redis-server")?,
    );
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", REDIS_PORT)).is_err() {
        if started.elapsed() > Duration::from_secs(10) {
            bail!("redis-server did not listen on 127.0.0.1:{port}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(server)
}

/// One pass of SET then GET; their mean requests per second.
fn throughput() -> Result<f64> {
    let out = Command::new(REDIS_BENCHMARK)
        .args([
            "-p",
            &REDIS_PORT.to_string(),
            "-t",
            "set,get",
            "-n",
            REQUESTS,
        ])
        .args(["-r", "100000", "-d", "100", "--csv"])
        .stderr(Stdio::null())
        .output()
        .context("running redis-benchmark")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rates = csv_rates(&text);
    if rates.len() != 2 {
        bail!("redis-benchmark printed no SET and GET rates: {text}");
    }
    Ok(rates.iter().sum::<f64>() / rates.len() as f64)
}

/// The requests per second of each test in redis-benchmark's `--csv`
/// output (`"SET","123456.79",...`).
fn csv_rates(text: &str) -> Vec<f64> {
    text.lines()
        .filter_map(|l| {
            let mut fields = l.split(',').map(|f| f.trim_matches('"'));
            let test = fields.next()?;
            let rps: f64 = fields.next()?.parse().ok()?;
            (test != "test").then_some(rps)
        })
        .collect()
}

/// A pass under the tool attached in its default mode (with `env`); then
/// SIGINT, timed to the tool's exit. Returns the pass's rate, the exit
/// time and the report.
fn under_tool(
    tool: &Path,
    dir: &Path,
    pid: u32,
    env: &[(&str, &str)],
    args: &[&str],
) -> Result<(f64, f64, Value)> {
    let json = dir.join("redis-report.json");
    let log = dir.join("redis-tool.log");
    let _ = std::fs::remove_file(&json);
    let _ = std::fs::remove_file(&log);
    let mut child = Command::new(tool)
        .args(["-p", &pid.to_string(), "--no-tui", "-v", "--json"])
        .arg(&json)
        .arg("--log-file")
        .arg(&log)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting memprof-ebpf")?;
    wait_for_log(&log, "tracing pid", &mut child)?;
    let rate = throughput()?;
    let signalled = Instant::now();
    // SAFETY: kill(2) on the pid of our own child; no memory involved.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().context("waiting for memprof-ebpf")?;
    let exit_s = signalled.elapsed().as_secs_f64();
    if !status.success() {
        bail!(
            "memprof-ebpf attached to redis failed ({status}); log in {}",
            log.display()
        );
    }
    Ok((rate, exit_s, read_report(&json)?))
}

/// What a traced call costs the program, by probe kind, as the tool's
/// start-up calibration measured it: "4007 ns emulated, allocation; ...".
fn kind_costs(report: &Value) -> String {
    let kinds = report["allocator"]["probe_cost_ns"]["kinds"].as_array();
    let costs: Vec<String> = kinds
        .into_iter()
        .flatten()
        .map(|k| format!("{} ns {}", k["cpu_ns"], k["kind"].as_str().unwrap_or("?")))
        .collect();
    if costs.is_empty() {
        "unknown (no calibration in the report)".into()
    } else {
        costs.join("; ")
    }
}

/// Waits until the tool's log says it traces (attach done).
fn wait_for_log(log: &PathBuf, needle: &str, child: &mut Child) -> Result<()> {
    let started = Instant::now();
    loop {
        if std::fs::read_to_string(log).is_ok_and(|t| t.contains(needle)) {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!(
                "memprof-ebpf exited before tracing ({status}); log in {}",
                log.display()
            );
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("memprof-ebpf did not start tracing within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A pass under bpftrace's usual latency script on jemalloc's malloc and
/// free, for this pid only; None when bpftrace is missing.
fn under_bpftrace(pid: u32) -> Result<Option<f64>> {
    if !Path::new(BPFTRACE).exists() {
        return Ok(None);
    }
    let lib = jemalloc_of(pid)?;
    let script = format!(
        "uprobe:{lib}:malloc {{ @start[tid] = nsecs; }}\n\
         uretprobe:{lib}:malloc /@start[tid]/ {{ @ns = hist(nsecs - @start[tid]); \
         delete(@start[tid]); }}\n\
         uprobe:{lib}:free {{ @frees = count(); }}\n\
         BEGIN {{ printf(\"attached\\n\"); }}"
    );
    let mut bt = Killed(
        Command::new(BPFTRACE)
            .args(["-p", &pid.to_string(), "-e", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting bpftrace")?,
    );
    let stdout = bt.0.stdout.take().context("bpftrace's stdout")?;
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    if !lines.any(|l| l.is_ok_and(|l| l.contains("attached"))) {
        bail!("bpftrace did not attach to redis-server");
    }
    let rate = throughput()?;
    drop(bt);
    Ok(Some(rate))
}

/// The jemalloc library mapped by `pid`.
fn jemalloc_of(pid: u32) -> Result<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("libjemalloc"))
        .map(String::from)
        .context("redis-server maps no libjemalloc")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_rates_skip_the_header() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\"\n\
                    \"SET\",\"123456.79\",\"0.2\"\n\"GET\",\"150000.00\",\"0.1\"\n";
        assert_eq!(csv_rates(text), vec![123456.79, 150000.0]);
    }
}

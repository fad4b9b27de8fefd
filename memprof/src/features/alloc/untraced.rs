//! What the target's allocator costs without a probe: a timed loop of
//! its small calls, run all session long in a helper process of ours
//! that loads the same allocator the way the target does.
//!
//! A traced call's latency is the trap's cost plus the allocator's, and
//! the trap's cost is known to within its calibration's spread (hundreds
//! of ns on these VMs) — far more than a thread-cache `malloc` (tens of
//! ns). So the allocator's own fast path is measured where it runs alone:
//! our own binary (`/proc/self/exe`) is started again as the target's
//! user, in `/`, with the allocator preloaded (for glibc, nothing to
//! preload; the helper checks that its `malloc` is the one asked for) and
//! the allocator's tuning variables taken from the target's environment
//! (`MALLOC_CONF`, `GLIBC_TUNABLES`, ...). For 1 ms every 100 ms, on the
//! CPU of the target's busiest thread ([`super::follow`]), it times
//! malloc(64)-free pairs in rounds of sixty, then `malloc(64)`, `free`
//! and `calloc(1, 64)` in rounds of six (within glibc's per-thread cache
//! of seven, as a program's hot path is), and prints a line per run
//! (each the mean of the fastest 90% of its rounds). The long rounds give
//! the level: in rounds of six a clock read costs as much as the calls
//! and overlaps them, and the calls came out 20-40% short of what the
//! same allocator's hot loop spends in it (`perf`); the short rounds
//! give only how a pair's time splits between malloc and free. The two
//! patterns are timed apart: interleaved round by round, each spoiled the
//! other's caches (jemalloc's pairs 6.5 ns instead of 2.3). Half the
//! pairs are timed with no other block of their size alive, half with
//! one kept: mimalloc's `free` retires a page it leaves empty, and its
//! pairs cost 5.5 ns alone, 4.2 with a neighbour (glibc's, jemalloc's
//! and tcmalloc's the same either way). Which a program meets depends on
//! its heap, unknown here: the level is the mean of the two, and their
//! difference is part of a count's claimed error.
//! The runs' mean is the untraced cost per call, reported beside
//! the traced latencies and used to estimate call counts from the CPU
//! time spent in the allocator ([`super::cpu_calls`]). The target's
//! probes are its pid's only: the helper is never trapped.
//!
//! Not measured (None, with the reason) when the allocator is inside the
//! target's executable (nothing to preload), when the helper cannot load
//! it, or gives no run within 2 s.

use std::{
    io::{BufRead, BufReader, Read},
    os::unix::process::CommandExt,
    path::Path,
    process::{Child, ChildStderr, ChildStdout, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{
    allocator::{Allocator, AllocatorKind},
    follow,
};
use crate::{process::procfs, report::model::UntracedCostReport};

/// The variable that turns our binary into the timing loop.
pub const LOOP_ENV: &str = "MEMPROF_UNTRACED_LOOP";
/// The request size timed: a small block, in every allocator's fastest
/// size class.
pub const SIZE: usize = 64;
/// What a single run claims of the pace over the session: the runs of
/// one session here differed by up to 2x.
const ONE_RUN_DRIFT: f64 = 0.3;
/// How long the helper may take to give its first run.
const TIMEOUT: Duration = Duration::from_secs(2);

/// The allocator's untraced cost per call, in ns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UntracedCost {
    pub malloc_ns: f64,
    pub free_ns: f64,
    pub calloc_ns: f64,
    /// A `malloc` and its `free` at once, as a hot loop does: the level
    /// `malloc_ns + free_ns` are scaled to. The mean of the pairs timed
    /// alone and beside a kept block of their size.
    pub pair_ns: f64,
    /// How the pairs timed alone differ from those beside a kept block:
    /// (alone - kept) / (alone + kept).
    pub heap_spread: f64,
    /// Timed rounds, of both patterns.
    pub rounds: usize,
    /// Runs of the loop (one every 100 ms of the session).
    pub measurements: u32,
    /// How uncertain the mean pace over the session is, relatively (see
    /// [`combine`]).
    pub drift: f64,
    /// The fastest and the slowest run's [`Self::pair_ns`]: how far the
    /// machine's pace moved over the session.
    pub pair_range_ns: [f64; 2],
}

impl UntracedCost {
    /// The untraced cost of a call of operation `op`: malloc's for the
    /// allocating operations not timed, free's for the freeing ones.
    pub fn of_op(&self, op: u32) -> f64 {
        use memprof_common::alloc_op;
        if op == alloc_op::CALLOC {
            self.calloc_ns
        } else if alloc_op::is_free(op) {
            self.free_ns
        } else if alloc_op::is_resize(op) && op != alloc_op::XALLOCX {
            // A resize that moves is an allocation and a free.
            self.malloc_ns + self.free_ns
        } else {
            self.malloc_ns
        }
    }

    /// How far a program's calls may cost from [`Self::pair_ns`] for
    /// its heap's state alone, relatively.
    pub fn heap_error(&self) -> f64 {
        self.heap_spread.abs()
    }

    /// As the report gives it.
    pub fn report(&self) -> UntracedCostReport {
        UntracedCostReport {
            size: SIZE as u64,
            malloc_ns: self.malloc_ns,
            free_ns: self.free_ns,
            calloc_ns: self.calloc_ns,
            pair_ns: self.pair_ns,
            heap_spread: self.heap_error(),
            rounds: self.rounds as u64,
            measurements: self.measurements,
            drift: self.drift,
            pair_range_ns: self.pair_range_ns,
        }
    }
}

/// Runs of the loop as one: their means, and how uncertain the mean pace
/// is (the runs' relative standard deviation over √runs; a single run
/// claims [`ONE_RUN_DRIFT`]). None without a run.
pub fn combine(runs: &[UntracedCost]) -> Option<UntracedCost> {
    let n = runs.len();
    if n == 0 {
        return None;
    }
    let mean = |f: fn(&UntracedCost) -> f64| runs.iter().map(f).sum::<f64>() / n as f64;
    let total = |c: &UntracedCost| c.malloc_ns + c.free_ns + c.pair_ns;
    let m = mean(total);
    let drift = if n < 2 || m <= 0.0 {
        ONE_RUN_DRIFT
    } else {
        let var = runs.iter().map(|c| (total(c) - m).powi(2)).sum::<f64>() / (n - 1) as f64;
        var.sqrt() / m / (n as f64).sqrt()
    };
    let pairs = runs.iter().map(|c| c.pair_ns);
    let pair_range_ns = [
        pairs.clone().fold(f64::INFINITY, f64::min),
        pairs.fold(0.0, f64::max),
    ];
    Some(UntracedCost {
        malloc_ns: mean(|c| c.malloc_ns),
        free_ns: mean(|c| c.free_ns),
        calloc_ns: mean(|c| c.calloc_ns),
        pair_ns: mean(|c| c.pair_ns),
        heap_spread: mean(|c| c.heap_spread),
        rounds: runs.iter().map(|c| c.rounds).sum(),
        measurements: n as u32,
        drift,
        pair_range_ns,
    })
}

/// The loop run again and again while the session lasts, by one helper
/// process: the machine's pace drifts (a VM's vCPU ran these calls at
/// half speed for seconds at a time here), and the count estimate needs
/// the pace the target met, not the one at start.
pub struct Sampler {
    shared: Arc<Mutex<Runs>>,
    child: Option<Child>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct Runs {
    costs: Vec<UntracedCost>,
    error: Option<String>,
}

impl Sampler {
    /// Starts the helper; a thread reads its runs.
    pub fn start(timer: &Timer) -> Result<Self> {
        let mut child = timer.spawn()?;
        let stdout = child.stdout.take().context("the helper's output")?;
        let stderr = child.stderr.take();
        let shared = Arc::new(Mutex::new(Runs::default()));
        let runs = shared.clone();
        let thread = std::thread::Builder::new()
            .name("untraced-loop".into())
            .spawn(move || {
                // Capabilities are per thread: this one needs none.
                crate::privilege::drop_all_in_this_thread();
                read_runs(stdout, stderr, &runs)
            })
            .ok();
        Ok(Self {
            shared,
            child: Some(child),
            thread,
        })
    }

    /// Waits up to [`TIMEOUT`] for the first run (or the helper's
    /// failure), so that a session knows the cost from the start; a
    /// helper that gave nothing by then is an error, and stopped.
    pub fn first_run(&mut self) {
        let until = Instant::now() + TIMEOUT;
        while Instant::now() < until {
            let r = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            if !r.costs.is_empty() || r.error.is_some() {
                return;
            }
            drop(r);
            std::thread::sleep(Duration::from_millis(5));
        }
        self.shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .error
            .get_or_insert_with(|| format!("the timing helper gave no run within {TIMEOUT:?}"));
        self.stop();
    }

    /// Stops the helper.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // (CAP_KILL is kept after the drop of capabilities; if the
            // kill still failed, the helper exits at its next line once
            // the reader is gone, and is reaped by init.)
            if child.kill().is_ok() {
                let _ = child.wait();
            }
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// The runs so far as one; an error when the helper failed before
    /// any run.
    pub fn cost(&self) -> std::result::Result<Option<UntracedCost>, String> {
        let r = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        match (combine(&r.costs), &r.error) {
            (None, Some(e)) => Err(e.clone()),
            (c, _) => Ok(c),
        }
    }
}

/// Reads the helper's runs until it ends; a failure before any run is
/// kept with its first line of errors.
fn read_runs(stdout: ChildStdout, stderr: Option<ChildStderr>, runs: &Mutex<Runs>) {
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let parsed = parse(&line);
        let mut r = runs.lock().unwrap_or_else(|e| e.into_inner());
        match parsed {
            Ok(c) => r.costs.push(c),
            Err(e) => r.error = Some(format!("{e:#}")),
        }
    }
    let mut r = runs.lock().unwrap_or_else(|e| e.into_inner());
    if r.costs.is_empty() && r.error.is_none() {
        let mut err = String::new();
        if let Some(mut e) = stderr {
            let _ = e.read_to_string(&mut err);
        }
        r.error = Some(format!(
            "the timing helper ended without a run: {}",
            err.lines().next().unwrap_or("no message")
        ));
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How to run the helper for one target's allocator.
#[derive(Debug, Clone)]
pub struct Timer {
    preload: Option<String>,
    env: Vec<(String, String)>,
    /// The target's effective user and group: the helper runs the
    /// target's allocator (a library the target's owner chose) with the
    /// target's privileges, never the tool's.
    owner: (u32, u32),
    /// The target, whose busiest thread's CPU the helper runs on.
    pid: u32,
}

impl Timer {
    /// For the target `pid`'s allocator; an error when it cannot be
    /// loaded apart from the target.
    /// `run_as`: the user and group a launched command will run as.
    pub fn for_target(allocator: &Allocator, pid: u32, run_as: Option<(u32, u32)>) -> Result<Self> {
        let preload = match allocator.kind {
            AllocatorKind::Glibc => None,
            _ => Some(preloadable(allocator, pid)?),
        };
        let owner = match run_as {
            Some(owner) => owner,
            None => procfs::effective_owner(pid).context("reading the target's owner")?,
        };
        Ok(Self {
            preload,
            env: follow::tuning_environment(pid),
            owner,
            pid,
        })
    }

    /// Starts the helper process; it prints a run per line.
    fn spawn(&self) -> Result<Child> {
        // Our own file, reachable whatever the helper's user may open.
        let mut cmd = Command::new("/proc/self/exe");
        cmd.env_clear()
            .env(LOOP_ENV, self.preload.as_deref().unwrap_or("1"))
            .env(follow::FOLLOW_ENV, self.pid.to_string())
            .current_dir("/")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // (Run as root, std also clears the supplementary groups.)
        cmd.uid(self.owner.0).gid(self.owner.1);
        if let Some(path) = &self.preload {
            cmd.env("LD_PRELOAD", path);
        }
        cmd.spawn().context("starting the timing helper")
    }
}

/// The allocator's file, as a path the helper can preload; an error when
/// the allocator is part of the target's executable.
fn preloadable(allocator: &Allocator, pid: u32) -> Result<String> {
    let path = allocator.path.to_string();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let name = Path::new(&path).file_name().and_then(|n| n.to_str());
    let is_library = name.is_some_and(|n| n.contains(".so"));
    if !is_library || exe.as_deref() == Some(Path::new(&path)) {
        bail!("the allocator is part of the executable ({path}): nothing to preload");
    }
    Ok(path)
}

/// Reads the helper's line: `malloc_ns free_ns calloc_ns pair_ns rounds
/// heap_spread`.
fn parse(out: &str) -> Result<UntracedCost> {
    if let Some(why) = out.trim().strip_prefix("error: ") {
        bail!("{why}");
    }
    let fields: Vec<&str> = out.split_whitespace().collect();
    let num = |i: usize| -> Result<f64> {
        let v: f64 = fields
            .get(i)
            .context("the timing helper's output is short")?
            .parse()
            .context("the timing helper's output is not a number")?;
        if !v.is_finite() || v < 0.0 {
            bail!("the timing helper gave {v}");
        }
        Ok(v)
    };
    let pair_ns = num(3)?;
    Ok(UntracedCost {
        malloc_ns: num(0)?,
        free_ns: num(1)?,
        calloc_ns: num(2)?,
        pair_ns,
        rounds: num(4)? as usize,
        heap_spread: fields
            .get(5)
            .context("the timing helper's output is short")?
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && v.abs() <= 1.0)
            .context("the timing helper's spread is not a ratio")?,
        measurements: 1,
        drift: 0.0,
        pair_range_ns: [pair_ns; 2],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_helpers_line_is_read_or_refused() {
        let c = parse("18.5 9.0 25.2 20.1 3000 -0.125\n").unwrap();
        assert_eq!(
            (c.malloc_ns, c.free_ns, c.calloc_ns, c.pair_ns, c.rounds),
            (18.5, 9.0, 25.2, 20.1, 3000)
        );
        assert_eq!((c.heap_spread, c.heap_error()), (-0.125, 0.125));
        assert!(parse("18.5 9.0").is_err());
        assert!(parse("18.5 9.0 25.2 20.1 3000").is_err());
        assert!(parse("18.5 9.0 25.2 20.1 3000 1.5").is_err());
        assert!(parse("x 1 2 3 4").is_err());
        assert!(parse("NaN 1 2 3 4").is_err());
    }

    const COST: UntracedCost = UntracedCost {
        malloc_ns: 20.0,
        free_ns: 10.0,
        calloc_ns: 30.0,
        pair_ns: 30.0,
        heap_spread: 0.0,
        rounds: 1,
        measurements: 1,
        drift: 0.0,
        pair_range_ns: [30.0; 2],
    };

    #[test]
    fn each_operation_costs_what_its_kind_does() {
        use memprof_common::alloc_op;
        let c = COST;
        assert_eq!(c.of_op(alloc_op::MALLOC), 20.0);
        assert_eq!(c.of_op(alloc_op::NEW), 20.0);
        assert_eq!(c.of_op(alloc_op::FREE), 10.0);
        assert_eq!(c.of_op(alloc_op::DELETE), 10.0);
        assert_eq!(c.of_op(alloc_op::CALLOC), 30.0);
        assert_eq!(c.of_op(alloc_op::REALLOC), 30.0);
    }

    #[test]
    fn runs_are_their_mean_and_the_uncertainty_of_it() {
        assert_eq!(combine(&[]), None);
        let one = combine(&[COST]).unwrap();
        assert_eq!((one.malloc_ns, one.drift), (20.0, ONE_RUN_DRIFT));
        let slow = UntracedCost {
            malloc_ns: 40.0,
            free_ns: 20.0,
            calloc_ns: 60.0,
            pair_ns: 60.0,
            heap_spread: 0.0,
            ..COST
        };
        // Spreads of opposite sign are noise, and cancel.
        let (up, down) = (
            UntracedCost {
                heap_spread: 0.1,
                ..COST
            },
            UntracedCost {
                heap_spread: -0.1,
                ..COST
            },
        );
        assert_eq!(combine(&[up, down]).unwrap().heap_error(), 0.0);
        let both = combine(&[COST, slow]).unwrap();
        assert_eq!(
            (both.malloc_ns, both.pair_ns, both.measurements),
            (30.0, 45.0, 2)
        );
        assert_eq!(both.pair_range_ns, [30.0, 60.0]);
        // Totals 60 and 120: sd 42.4, over the mean 90 and √2.
        let expected = (1800f64).sqrt() / 90.0 / 2f64.sqrt();
        assert!((both.drift - expected).abs() < 1e-12, "{}", both.drift);
        let steady = combine(&[COST; 8]).unwrap();
        assert_eq!(steady.drift, 0.0);
    }
}

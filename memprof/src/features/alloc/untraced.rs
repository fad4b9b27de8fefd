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
//! (`MALLOC_CONF`, `GLIBC_TUNABLES`, ...). It times `malloc(64)`, `free`,
//! `calloc(1, 64)` and malloc-free pairs in rounds of six (within glibc's
//! per-thread cache of seven, as a program's hot path is) for 1 ms every
//! 100 ms, on the CPU of the target's busiest thread ([`super::follow`]),
//! and prints a line per run: the mean of the fastest 90% of its
//! rounds. The runs' mean is the untraced cost per call, reported beside
//! the traced latencies and used to estimate call counts from the CPU
//! time spent in the allocator ([`super::cpu_calls`]). The target's
//! probes are its pid's only: the helper is never trapped.
//!
//! Not measured (None, with the reason) when the allocator is inside the
//! target's executable (nothing to preload), when the helper cannot load
//! it, or gives no run within 2 s.

use std::{
    hint::black_box,
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
use crate::report::model::UntracedCostReport;

/// The variable that turns our binary into the timing loop.
pub const LOOP_ENV: &str = "MEMPROF_UNTRACED_LOOP";
/// The request size timed: a small block, in every allocator's fastest
/// size class.
pub const SIZE: usize = 64;
/// Calls per timed round (glibc's tcache holds 7 blocks of a size). The
/// pointers go through `black_box`: the compiler knows `malloc` and
/// `free`, and removes a pair whose block is not used.
const ROUND: usize = 6;
/// How long a run of the helper times rounds, and at most how many.
const RUN_TIME: Duration = Duration::from_millis(1);
/// Between runs: the helper takes 1.5% of one CPU (with the warm-up). Many
/// short runs follow the pace the target meets better than a few long
/// ones: it flips between two speeds 2x apart every few hundred ms on
/// these VMs, idle or not, and five runs of a 2 s session fell all in
/// one of them now and then (the count then off by 40%, its claim 30%).
const INTERVAL: Duration = Duration::from_millis(100);
/// What a single run claims of the pace over the session: the runs of
/// one session here differed by up to 2x.
const ONE_RUN_DRIFT: f64 = 0.3;
const MAX_ROUNDS: usize = 200_000;
/// Rounds not recorded at first: they warm the caches, the allocator's
/// own, and the vCPU (the first milliseconds ran at half speed here).
const WARM_UP: Duration = Duration::from_millis(5);
/// The same at each later run, after the helper slept.
const RUN_WARM_UP: Duration = Duration::from_micros(500);
/// How long the helper may take to give its first run.
const TIMEOUT: Duration = Duration::from_secs(2);

/// The allocator's untraced cost per call, in ns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UntracedCost {
    pub malloc_ns: f64,
    pub free_ns: f64,
    pub calloc_ns: f64,
    /// A `malloc` and its `free` at once, as a hot loop does.
    pub pair_ns: f64,
    /// Timed rounds (each of [`ROUND`] calls of each).
    pub rounds: usize,
    /// Runs of the loop (one every 100 ms of the session).
    pub measurements: u32,
    /// How uncertain the mean pace over the session is, relatively (see
    /// [`combine`]).
    pub drift: f64,
}

impl UntracedCost {
    /// The untraced cost of a call of operation `op`: malloc's for the
    /// allocating operations not timed, free's for the freeing ones,
    /// scaled to the mean of the two patterns timed (calls in rounds of
    /// six, and pairs).
    pub fn of_op(&self, op: u32) -> f64 {
        use memprof_common::alloc_op;
        let base = if op == alloc_op::CALLOC {
            self.calloc_ns
        } else if alloc_op::is_free(op) {
            self.free_ns
        } else if alloc_op::is_resize(op) && op != alloc_op::XALLOCX {
            // A resize that moves is an allocation and a free.
            self.malloc_ns + self.free_ns
        } else {
            self.malloc_ns
        };
        let rounds = self.malloc_ns + self.free_ns;
        match rounds > 0.0 {
            true => base * (rounds + self.pair_ns) / 2.0 / rounds,
            false => base,
        }
    }

    /// How far the two patterns timed differ, relatively: a program's
    /// calls may follow either (mimalloc here: pairs cost twice what
    /// rounds do).
    pub fn pattern_spread(&self) -> f64 {
        let rounds = self.malloc_ns + self.free_ns;
        let sum = rounds + self.pair_ns;
        match sum > 0.0 {
            true => (self.pair_ns - rounds).abs() / sum,
            false => 0.0,
        }
    }

    /// As the report gives it.
    pub fn report(&self) -> UntracedCostReport {
        UntracedCostReport {
            size: SIZE as u64,
            malloc_ns: self.malloc_ns,
            free_ns: self.free_ns,
            calloc_ns: self.calloc_ns,
            pair_ns: self.pair_ns,
            rounds: self.rounds as u64,
            measurements: self.measurements,
            drift: self.drift,
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
    Some(UntracedCost {
        malloc_ns: mean(|c| c.malloc_ns),
        free_ns: mean(|c| c.free_ns),
        calloc_ns: mean(|c| c.calloc_ns),
        pair_ns: mean(|c| c.pair_ns),
        rounds: runs.iter().map(|c| c.rounds).sum(),
        measurements: n as u32,
        drift,
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
            None => follow::owner_of(pid).context("reading the target's owner")?,
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

/// Reads the helper's line: `malloc_ns free_ns calloc_ns pair_ns rounds`.
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
    Ok(UntracedCost {
        malloc_ns: num(0)?,
        free_ns: num(1)?,
        calloc_ns: num(2)?,
        pair_ns: num(3)?,
        rounds: num(4)? as usize,
        measurements: 1,
        drift: 0.0,
    })
}

/// The helper: times the calls for [`RUN_TIME`], prints a line, sleeps
/// [`INTERVAL`], again, until its parent is gone or stops reading.
/// Called by `main` when [`LOOP_ENV`] is set; never returns.
pub fn run_loop() -> ! {
    use std::io::Write;
    // SAFETY: prctl with PR_SET_PDEATHSIG and a signal number: no memory
    // is passed; the helper is killed when the tool dies.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let parent = std::os::unix::process::parent_id();
    // The allocator timed must be the one asked for: a preload the
    // loader refused (a path only the target's mount namespace has, a
    // secure-mode binary) would leave glibc's malloc in place, silently.
    if let Ok(expected) = std::env::var(LOOP_ENV) {
        if let Some(why) = wrong_malloc(&expected) {
            println!("error: {why}");
            std::process::exit(0);
        }
    }
    // Nothing more on stderr (an allocator told to print statistics
    // would fill the pipe, which is read only at the end).
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 of two open descriptors; fd 2 is replaced.
        unsafe { libc::dup2(null.as_raw_fd(), 2) };
    }
    // Preallocated: the loop itself allocates nothing.
    let mut runs = Rounds::with_capacity(MAX_ROUNDS);
    let mut first = true;
    let target = std::env::var(follow::FOLLOW_ENV)
        .ok()
        .and_then(|p| p.parse().ok());
    let mut last = Vec::new();
    loop {
        if let Some(cpu) = target.and_then(|pid| follow::busiest(&follow::threads(pid), &mut last))
        {
            follow::pin(cpu);
        }
        runs.clear();
        runs.time(if first { WARM_UP } else { RUN_WARM_UP });
        first = false;
        let line = runs.line();
        let mut out = std::io::stdout().lock();
        if writeln!(out, "{line}").and_then(|_| out.flush()).is_err()
            || std::os::unix::process::parent_id() != parent
        {
            std::process::exit(0);
        }
        drop(out);
        std::thread::sleep(INTERVAL);
    }
}

/// The times of a run's rounds (each of [`ROUND`] calls), in ns.
struct Rounds {
    malloc: Vec<f64>,
    free: Vec<f64>,
    calloc: Vec<f64>,
    pair: Vec<f64>,
    /// What reading the clock twice cost in this run (taken off each
    /// round).
    timer: f64,
}

impl Rounds {
    fn with_capacity(n: usize) -> Self {
        Self {
            malloc: Vec::with_capacity(n),
            free: Vec::with_capacity(n),
            calloc: Vec::with_capacity(n),
            pair: Vec::with_capacity(n),
            timer: 0.0,
        }
    }

    fn clear(&mut self) {
        self.malloc.clear();
        self.free.clear();
        self.calloc.clear();
        self.pair.clear();
    }

    /// Times rounds for [`RUN_TIME`] (at least 100), the first `warm_up`
    /// of it unrecorded, then the clock's own cost: at this run's pace,
    /// which is not the last run's (a clock read costs as much as a round
    /// of calls; taken once at start, a slow start made every later
    /// call look nearly free).
    fn time(&mut self, warm_up: Duration) {
        let mut blocks = [std::ptr::null_mut::<libc::c_void>(); ROUND];
        let ns = |d: Duration| d.as_nanos() as f64;
        let start = Instant::now();
        let (warm, until) = (start + warm_up, start + warm_up + RUN_TIME);
        while self.malloc.len() < MAX_ROUNDS && (self.malloc.len() < 100 || Instant::now() < until)
        {
            let t0 = Instant::now();
            for b in blocks.iter_mut() {
                // SAFETY: malloc of a small size; the block is freed below.
                *b = black_box(unsafe { libc::malloc(black_box(SIZE)) });
            }
            let t1 = Instant::now();
            for b in blocks.iter() {
                // SAFETY: each block came from malloc above, freed once.
                unsafe { libc::free(black_box(*b)) };
            }
            let t2 = Instant::now();
            for b in blocks.iter_mut() {
                // SAFETY: calloc of a small size; the block is freed below.
                *b = black_box(unsafe { libc::calloc(1, black_box(SIZE)) });
            }
            let t3 = Instant::now();
            for b in blocks.iter() {
                // SAFETY: each block came from calloc above, freed once.
                unsafe { libc::free(black_box(*b)) };
            }
            let t4 = Instant::now();
            for _ in 0..ROUND {
                // SAFETY: a small block, freed at once.
                unsafe { libc::free(black_box(libc::malloc(black_box(SIZE)))) };
            }
            let t5 = Instant::now();
            if t0 >= warm {
                self.malloc.push(ns(t1 - t0));
                self.free.push(ns(t2 - t1));
                self.calloc.push(ns(t3 - t2));
                self.pair.push(ns(t5 - t4));
            }
        }
        self.timer = timer_overhead();
    }

    /// `malloc_ns free_ns calloc_ns pair_ns rounds`.
    fn line(&mut self) -> String {
        let n = self.malloc.len();
        let timer = self.timer;
        let per_call = |v: &mut [f64]| (typical(v) - timer).max(0.0) / ROUND as f64;
        format!(
            "{:.1} {:.1} {:.1} {:.1} {n}",
            per_call(&mut self.malloc),
            per_call(&mut self.free),
            per_call(&mut self.calloc),
            per_call(&mut self.pair)
        )
    }
}

/// Why the `malloc` this process calls is not `expected`'s (a path, or
/// "1" for glibc: nothing to check), or None when it is.
fn wrong_malloc(expected: &str) -> Option<String> {
    if !expected.starts_with('/') {
        return None;
    }
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let malloc: unsafe extern "C" fn(usize) -> *mut libc::c_void = libc::malloc;
    // SAFETY: dladdr reads the address and fills `info`, whose strings
    // point into the loader's own memory (read at once below).
    let found = unsafe { libc::dladdr(malloc as *const libc::c_void, info.as_mut_ptr()) };
    // SAFETY: zeroed, then filled by dladdr when it returned non-zero.
    let info = unsafe { info.assume_init() };
    if found == 0 || info.dli_fname.is_null() {
        return Some("cannot tell which object defines malloc".into());
    }
    // SAFETY: a NUL-terminated string of the loader's.
    let file = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    let real = |p: &str| std::fs::canonicalize(p).unwrap_or_else(|_| p.into());
    (real(&file) != real(expected))
        .then(|| format!("malloc is {file}'s, not {expected}'s: the preload was refused"))
}

/// What reading the clock twice costs, in ns (taken off each round).
fn timer_overhead() -> f64 {
    let mut d: Vec<f64> = (0..1000)
        .map(|_| {
            let t = Instant::now();
            (Instant::now() - t).as_nanos() as f64
        })
        .collect();
    median(&mut d)
}

/// The mean of the fastest 90% of the rounds: the clock's ticks are
/// coarser than a call, so a median would round to them; the slowest
/// rounds were interrupted.
fn typical(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let kept = &v[..(v.len() * 9).div_ceil(10)];
    kept.iter().sum::<f64>() / kept.len() as f64
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_helpers_line_is_read_or_refused() {
        let c = parse("18.5 9.0 25.2 20.1 3000\n").unwrap();
        assert_eq!(
            (c.malloc_ns, c.free_ns, c.calloc_ns, c.pair_ns, c.rounds),
            (18.5, 9.0, 25.2, 20.1, 3000)
        );
        assert!(parse("18.5 9.0").is_err());
        assert!(parse("x 1 2 3 4").is_err());
        assert!(parse("NaN 1 2 3 4").is_err());
    }

    const COST: UntracedCost = UntracedCost {
        malloc_ns: 20.0,
        free_ns: 10.0,
        calloc_ns: 30.0,
        pair_ns: 30.0,
        rounds: 1,
        measurements: 1,
        drift: 0.0,
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
        assert_eq!(c.pattern_spread(), 0.0);
        // Pairs at twice the rounds' cost: every call at the mean of the
        // patterns, and the difference claimed.
        let slow_pairs = UntracedCost {
            pair_ns: 60.0,
            ..COST
        };
        assert_eq!(slow_pairs.of_op(alloc_op::MALLOC), 30.0);
        assert!((slow_pairs.pattern_spread() - 1.0 / 3.0).abs() < 1e-12);
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
            ..COST
        };
        let both = combine(&[COST, slow]).unwrap();
        assert_eq!(
            (both.malloc_ns, both.pair_ns, both.measurements),
            (30.0, 45.0, 2)
        );
        // Totals 60 and 120: sd 42.4, over the mean 90 and √2.
        let expected = (1800f64).sqrt() / 90.0 / 2f64.sqrt();
        assert!((both.drift - expected).abs() < 1e-12, "{}", both.drift);
        let steady = combine(&[COST; 8]).unwrap();
        assert_eq!(steady.drift, 0.0);
    }
}

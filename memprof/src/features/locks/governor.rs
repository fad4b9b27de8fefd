//! The governor of the always-on futex path: keeps what the sched hooks
//! cost the target within their share of `--budget`.
//!
//! Every second it reads what the lock-contention programs spent on the
//! waits they traced (their own clock, kept in a counter), how long they
//! ran in all (the kernel's BPF statistics, when on: the rest is their
//! base cost, the runs that found nothing to do, which no stride lowers),
//! the waits traced and skipped, and the target's CPU time. Tracing every
//! wait costs the time per traced wait times all the waits; when that
//! exceeds what the share leaves after the base cost, the programs trace
//! each wait with probability 1/N (the stride), and the aggregates count
//! each traced wait N times. N goes up at once and down by halves, so a burst
//! is followed quickly and a quiet spell does not make it swing.
//!
//! Pure: fed with readings, it returns the stride. Counts are exact while
//! the stride stays 1; after that they are estimates, whose claimed error
//! [`claimed_error`] gives.

/// The share of `--budget` the lock-contention hooks may take: they are
/// the lock profiler's always-on part (its uprobes take 30% of the budget
/// in windows, aiming at 80% of it, the allocator's aim at 40%, its syscall
/// hooks 10%: together the whole budget).
pub const BUDGET_SHARE: f64 = 0.25;
/// Largest stride: at one wait in this many, a lock waited for a
/// thousand times a second still has its count within ±20% in a second
/// (the claimed error says so), and every busy lock is still named.
pub const MAX_STRIDE: u64 = 64;
/// The least share of the allowance left for traced waits: a base cost
/// above the rest puts the hooks in windows ([`Governor::scale`]).
const MIN_TRACED_SHARE: f64 = 0.25;
/// Most periods per window: the hooks attached 5% of the time at least
/// (beyond, the budget is overrun by the base cost, and said so).
pub const MAX_SCALE: u64 = 20;
/// Least attached time a reading is judged on (in windows, a governor
/// period may hold little of it: the next reading adds to it).
const MIN_ATTACHED_S: f64 = 0.05;

/// What the governor reads each period (cumulative values).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// Seconds since the session started.
    pub at_s: f64,
    /// The contention programs' run time, if the kernel counts it.
    pub run_ns: Option<u64>,
    /// What they spent on the waits they traced, by their own clock.
    pub hit_ns: u64,
    /// Waits traced, and left out by the stride.
    pub traced: u64,
    pub skipped: u64,
    /// The target's CPU time (user + system), seconds.
    pub target_cpu_s: f64,
    /// Seconds the hooks were attached (the programs run, and count,
    /// only then).
    pub attached_s: f64,
}

/// The governor's state.
#[derive(Debug, Clone)]
pub struct Governor {
    /// Allowed cost, a fraction of the target's CPU time.
    share: f64,
    stride: u64,
    stride_max: u64,
    /// The hooks attached one window in this many (1: always).
    scale: u64,
    scale_max: u64,
    last: Option<Reading>,
    /// The largest base cost seen that alone took more than the
    /// allowance: (base, allowance), as shares of the target's CPU time.
    overrun: Option<(f64, f64)>,
}

impl Governor {
    /// A governor for `budget` (a fraction: 0.05 for 5%).
    pub fn new(budget: f64) -> Self {
        Self {
            share: budget * BUDGET_SHARE,
            stride: 1,
            stride_max: 1,
            scale: 1,
            scale_max: 1,
            last: None,
            overrun: None,
        }
    }

    /// The stride in use.
    pub fn stride(&self) -> u64 {
        self.stride
    }

    /// The largest stride used so far (1: every wait was traced).
    pub fn stride_max(&self) -> u64 {
        self.stride_max
    }

    /// The hooks' windows: attached one period of [`super::hook_windows::WINDOW`]
    /// in this many (1: always attached).
    pub fn scale(&self) -> u64 {
        self.scale
    }

    /// The largest scale used so far.
    pub fn scale_max(&self) -> u64 {
        self.scale_max
    }

    /// The largest base cost that overran the allowance even in the
    /// sparsest windows, if any: (base while attached, allowance) as
    /// shares of the target's CPU time.
    pub fn overrun(&self) -> Option<(f64, f64)> {
        self.overrun
    }

    /// Takes a reading; returns the stride to use from now on (and sets
    /// the scale).
    pub fn observe(&mut self, now: Reading) -> u64 {
        let Some(last) = self.last else {
            self.last = Some(now);
            return self.stride;
        };
        let attached = now.attached_s - last.attached_s;
        if attached.is_nan() || attached < MIN_ATTACHED_S {
            // Too little seen since the last reading: wait for more.
            return self.stride;
        }
        self.last = Some(now);
        let traced = now.traced.saturating_sub(last.traced);
        let waits = traced + now.skipped.saturating_sub(last.skipped);
        // The target's time: its CPU time, but at least the wall time (a
        // target that mostly sleeps is slowed by the hooks' cost against
        // the time it takes, not against the little CPU it uses: two
        // threads passing an item through a condvar every ms spend 2 ms a
        // second in the hooks, a fifth of a percent of their time); of it,
        // the part while the hooks were attached.
        let wall = now.at_s - last.at_s;
        let cpu = (now.target_cpu_s - last.target_cpu_s).max(wall) * (attached / wall).min(1.0);
        if traced == 0 || waits == 0 || cpu.is_nan() || cpu <= 0.0 {
            return self.stride;
        }
        // What a traced wait took, over the session (at a high stride the
        // few traced waits find cold caches and share the stack samples,
        // and cost more each: taken alone, that would push the stride up
        // further), and the seconds the other runs took (the stride
        // cannot lower those; unknown without the kernel's statistics,
        // then taken as nothing).
        let hit = now.hit_ns.saturating_sub(last.hit_ns) as f64 / 1e9;
        let per_wait = now.hit_ns as f64 / 1e9 / now.traced.max(1) as f64;
        let base = match (now.run_ns, last.run_ns) {
            (Some(a), Some(b)) => (a.saturating_sub(b) as f64 / 1e9 - hit).max(0.0),
            _ => 0.0,
        };
        // Windows when the base cost leaves too little of the allowance:
        // attached one period in M, the hooks may cost M allowances while
        // attached, of which the base takes at most 1 - MIN_TRACED_SHARE.
        let allowance = self.share * cpu;
        let scale = (base / (allowance * (1.0 - MIN_TRACED_SHARE)) * (1.0 - 1e-6))
            .ceil()
            .clamp(1.0, MAX_SCALE as f64) as u64;
        self.scale = follow(self.scale, scale);
        self.scale_max = self.scale_max.max(self.scale);
        let allowance = allowance * self.scale as f64;
        if base > allowance && self.overrun.is_none_or(|(b, _)| base / cpu > b) {
            self.overrun = Some((base / cpu, self.share));
        }
        // What tracing every wait would cost, and what is left of the
        // allowance for it, in seconds of the target's CPU time.
        let full = waits as f64 * per_wait;
        let allowed = (allowance - base).max(allowance * MIN_TRACED_SHARE);
        // (A hair under: a cost of exactly N allowances wants stride N,
        // not N + 1 for a rounding error.)
        tracing::debug!(
            "futex governor: {traced} traced of {waits} waits, {:.0} ns each, base {:.1} ms, \
             cpu {cpu:.2} s attached: all {:.1} ms against {:.1} ms, windows 1 in {}",
            per_wait * 1e9,
            base * 1e3,
            full * 1e3,
            allowed * 1e3,
            self.scale
        );
        let wanted = (full / allowed * (1.0 - 1e-6))
            .ceil()
            .clamp(1.0, MAX_STRIDE as f64) as u64;
        self.stride = follow(self.stride, wanted);
        self.stride_max = self.stride_max.max(self.stride);
        self.stride
    }
}

/// A setting that goes up at once and down by halves, so a burst is
/// followed quickly and a quiet spell does not make it swing.
fn follow(current: u64, wanted: u64) -> u64 {
    if wanted > current {
        wanted
    } else if wanted * 2 <= current {
        (current / 2).max(wanted).max(1)
    } else {
        current
    }
}

/// How the waits were sampled over a session: the largest stride, and
/// the hooks' windows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    pub stride_max: u64,
    /// Session time over the time the hooks were attached (1: always).
    pub factor: f64,
    /// The relative standard error of the wait rate the windows'
    /// extrapolation assumes ([`super::hook_windows::HookWindows::rate_error`]).
    pub rate_error: f64,
}

impl Sampling {
    /// Every wait traced: exact counts.
    pub const EXACT: Sampling = Sampling {
        stride_max: 1,
        factor: 1.0,
        rate_error: 0.0,
    };

    /// Whether every wait was traced.
    pub fn exact(&self) -> bool {
        self.stride_max <= 1 && self.factor <= 1.0
    }
}

/// The claimed relative error (two standard deviations) of a lock's wait
/// count and wait time estimated under `sampling`: `count` waits
/// estimated, with durations whose coefficient of variation is `cv`.
/// Each wait is kept with probability 1/N (N the stride, times the
/// windows' factor: a wait is seen if it falls in a window), so the
/// estimate of n waits has a relative standard deviation of √((N−1)/n),
/// and a sum of durations √((N−1)/n·(1+cv²)); the windows add the error
/// of taking the rate seen in them for the rate in the gaps. None when
/// every wait was traced.
pub fn claimed_error(sampling: &Sampling, count: u64, cv: f64) -> Option<f64> {
    if sampling.exact() {
        return None;
    }
    if count == 0 {
        return Some(1.0);
    }
    let n = sampling.stride_max.max(1) as f64 * sampling.factor.max(1.0);
    let var = (n - 1.0).max(0.0) / count as f64 * (1.0 + cv * cv) + sampling.rate_error.powi(2);
    Some((2.0 * var.sqrt()).min(1.0))
}

/// The coefficient of variation of durations given as a log2 histogram
/// (upper bound in ns, count), each bucket taken at 3/4 of its bound (the
/// middle of `[bound/2, bound)`).
pub fn histogram_cv(histogram: &[(u64, u64)]) -> f64 {
    let (mut n, mut sum, mut sq) = (0.0, 0.0, 0.0);
    for &(bound, count) in histogram {
        let x = bound as f64 * 0.75;
        let c = count as f64;
        n += c;
        sum += c * x;
        sq += c * x * x;
    }
    if n == 0.0 || sum == 0.0 {
        return 0.0;
    }
    let mean = sum / n;
    let var = (sq / n - mean * mean).max(0.0);
    var.sqrt() / mean
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A budget whose share for the hooks is 1% of the target's time.
    const BUDGET: f64 = 0.01 / BUDGET_SHARE;

    /// All run time spent on traced waits (no base cost).
    fn reading(at_s: f64, run_ms: u64, traced: u64, skipped: u64, cpu: f64) -> Reading {
        Reading {
            at_s,
            run_ns: Some(run_ms * 1_000_000),
            hit_ns: run_ms * 1_000_000,
            traced,
            skipped,
            target_cpu_s: cpu,
            attached_s: at_s,
        }
    }

    #[test]
    fn a_cheap_path_traces_every_wait() {
        let mut g = Governor::new(BUDGET);
        assert_eq!(g.observe(reading(0.0, 0, 0, 0, 0.0)), 1);
        // 10 k waits a second at 1 µs on a target using 2 CPUs: 0.5%.
        assert_eq!(g.observe(reading(1.0, 10, 10_000, 0, 2.0)), 1);
        assert_eq!(g.stride_max(), 1);
        let exact = Sampling {
            stride_max: g.stride_max(),
            ..Sampling::EXACT
        };
        assert_eq!(claimed_error(&exact, 10_000, 1.0), None);
    }

    #[test]
    fn a_hot_path_is_sampled_and_recovers_by_halves() {
        let mut g = Governor::new(BUDGET);
        g.observe(reading(0.0, 0, 0, 0, 0.0));
        // 400 k waits a second at 1.5 µs on 2 CPUs: 30% against 1%.
        assert_eq!(g.observe(reading(1.0, 600, 400_000, 0, 2.0)), 30);
        // At stride 30 the same load: 13.3 k traced, the rest skipped.
        let s = g.observe(reading(2.0, 620, 413_334, 386_666, 4.0));
        assert_eq!(s, 30, "steady load, steady stride");
        // The load stops: no traced wait says nothing.
        assert_eq!(g.observe(reading(3.0, 620, 413_334, 386_666, 6.0)), 30);
        // A tenth of the load (40 k waits a second, each traced one
        // 1.5 µs): wanted 3, so down by halves: 15, then 7, then 3.
        let mut r = reading(3.0, 620, 413_334, 386_666, 6.0);
        for (stride, want) in [(30, 15), (15, 7), (7, 3), (3, 3)] {
            let traced = 40_000 / stride;
            r = Reading {
                at_s: r.at_s + 1.0,
                run_ns: r.run_ns.map(|ns| ns + traced * 1500),
                hit_ns: r.hit_ns + traced * 1500,
                traced: r.traced + traced,
                skipped: r.skipped + 40_000 - traced,
                target_cpu_s: r.target_cpu_s + 2.0,
                attached_s: r.attached_s + 1.0,
            };
            assert_eq!(g.observe(r), want, "from {stride}");
        }
        assert_eq!(g.stride_max(), 30);
    }

    #[test]
    fn without_run_times_the_hits_alone_count() {
        let mut g = Governor::new(BUDGET);
        let r = |at_s, hit_ms: u64, traced, cpu| Reading {
            at_s,
            run_ns: None,
            hit_ns: hit_ms * 1_000_000,
            traced,
            skipped: 0,
            target_cpu_s: cpu,
            attached_s: at_s,
        };
        g.observe(r(0.0, 0, 0, 0.0));
        // 100 k waits at 1.5 µs on one CPU: 15% against 1%.
        assert_eq!(g.observe(r(1.0, 150, 100_000, 1.0)), 15);
    }

    #[test]
    fn the_base_cost_is_left_out_of_the_stride() {
        let mut g = Governor::new(BUDGET);
        let r =
            |at_s: f64, run_ms: u64, hit_ms: u64, traced: u64, skipped: u64, cpu: f64| Reading {
                at_s,
                run_ns: Some(run_ms * 1_000_000),
                hit_ns: hit_ms * 1_000_000,
                traced,
                skipped,
                target_cpu_s: cpu,
                attached_s: at_s,
            };
        g.observe(r(0.0, 0, 0, 0, 0, 0.0));
        // 10 ms of base runs a second, 20 k waits at 1.5 µs (30 ms): on
        // 2 CPUs the allowance is 20 ms, of which the base leaves 10 for
        // 30 ms of waits: stride 3.
        assert_eq!(g.observe(r(1.0, 40, 30, 20_000, 0, 2.0)), 3);
        // At stride 3 the base is the same and the traced waits a third:
        // the stride holds (it does not chase its own base cost up).
        assert_eq!(g.observe(r(2.0, 60, 40, 26_667, 13_333, 4.0)), 3);
        assert_eq!(g.overrun(), None);
        assert_eq!(g.scale(), 1);
        // A base above three quarters of the allowance puts the hooks in
        // windows: 30 ms of base against 20 ms, attached one window in 2,
        // leaves 10 ms of the doubled allowance for 30 ms of waits.
        let mut h = Governor::new(BUDGET);
        h.observe(r(0.0, 0, 0, 0, 0, 0.0));
        assert_eq!(h.observe(r(1.0, 60, 30, 20_000, 0, 2.0)), 3);
        assert_eq!(h.scale(), 2);
        assert_eq!(h.overrun(), None);
        // A base beyond the sparsest windows is reported.
        let mut o = Governor::new(BUDGET);
        o.observe(r(0.0, 0, 0, 0, 0, 0.0));
        o.observe(r(1.0, 530, 30, 20_000, 0, 2.0));
        assert_eq!(o.scale(), MAX_SCALE);
        let (base, share) = o.overrun().unwrap();
        assert!((base - 0.25).abs() < 1e-9 && (share - 0.01).abs() < 1e-9);
    }

    #[test]
    fn in_windows_the_cost_is_judged_on_the_time_attached() {
        let mut g = Governor::new(BUDGET);
        let r = |at_s: f64, attached_s: f64, run_ms: u64, hit_ms: u64, traced: u64| Reading {
            at_s,
            run_ns: Some(run_ms * 1_000_000),
            hit_ns: hit_ms * 1_000_000,
            traced,
            skipped: 0,
            target_cpu_s: at_s * 2.0,
            attached_s,
        };
        g.observe(r(0.0, 0.0, 0, 0, 0));
        // 60 ms of base a second on 2 CPUs (3%) against 1%: 1 in 4.
        g.observe(r(1.0, 1.0, 66, 6, 4_000));
        assert_eq!(g.scale(), 4);
        // Attached a quarter of the next second, at the same rates: the
        // same cost while attached, so the same scale (not 1 because the
        // whole second cost a quarter).
        g.observe(r(2.0, 1.25, 82, 8, 5_000));
        assert_eq!((g.scale(), g.stride()), (4, 1));
        // Too little attached to judge: nothing changes until more is.
        let before = g.clone();
        g.observe(r(2.5, 1.26, 83, 8, 5_010));
        assert_eq!((g.scale(), g.stride()), (before.scale(), before.stride()));
        // A quiet program: the base falls (6 ms a second): back by halves.
        g.observe(r(3.5, 1.5, 85, 8, 5_100));
        assert_eq!(g.scale(), 2);
    }

    #[test]
    fn no_waits_keeps_the_stride() {
        let mut g = Governor::new(BUDGET);
        g.observe(reading(0.0, 0, 0, 0, 1.0));
        assert_eq!(g.observe(reading(1.0, 100, 1000, 0, 2.0)), 10);
        assert_eq!(g.observe(reading(2.0, 100, 1000, 0, 3.0)), 10);
    }

    #[test]
    fn a_sleeping_target_is_measured_against_the_wall_time() {
        let mut g = Governor::new(BUDGET);
        g.observe(reading(0.0, 0, 0, 0, 0.0));
        // A condvar passed every ms: 1000 waits at 2 µs, 2 ms a second,
        // by a target using 50 ms of CPU: 4% of its CPU, 0.2% of its time.
        assert_eq!(g.observe(reading(1.0, 2, 1000, 0, 0.05)), 1);
    }

    #[test]
    fn claimed_errors_shrink_with_the_count() {
        let sixteen = Sampling {
            stride_max: 16,
            ..Sampling::EXACT
        };
        let e = |n, cv| claimed_error(&sixteen, n, cv).unwrap();
        assert!((e(15_000, 0.0) - 0.0632).abs() < 1e-3);
        assert!(e(1_500, 0.0) > e(15_000, 0.0));
        assert!(e(15_000, 2.0) > e(15_000, 0.0));
        assert_eq!(e(1, 0.0), 1.0, "capped at ±100%");
        assert_eq!(claimed_error(&sixteen, 0, 0.0), Some(1.0));
        // Windows a quarter of the time at stride 4: as stride 16, plus
        // the rate's error.
        let windows = Sampling {
            stride_max: 4,
            factor: 4.0,
            rate_error: 0.05,
        };
        let w = claimed_error(&windows, 15_000, 0.0).unwrap();
        assert!((w - 2.0 * (0.001f64 + 0.0025).sqrt()).abs() < 1e-9, "{w}");
    }

    #[test]
    fn histogram_spread() {
        assert_eq!(histogram_cv(&[]), 0.0);
        assert_eq!(histogram_cv(&[(1024, 10)]), 0.0);
        let cv = histogram_cv(&[(1024, 10), (4096, 10)]);
        assert!((cv - 0.6).abs() < 1e-9, "{cv}");
    }
}

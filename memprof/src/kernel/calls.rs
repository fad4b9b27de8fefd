//! How many calls a windowed family's functions got over the session,
//! from what the kernel counted while their probes were attached.
//!
//! The entry probes count every call per operation while attached. A
//! session alternates periods:
//! - *attached*: every probe is in; the calls counted are exact;
//! - *untraced*: from the moment the window starts detaching (links go
//!   one by one, a grace period each, so counts are partial) to the next
//!   window. A windowed operation's calls there are the rate of the last
//!   stretch attached before it × its length; an operation whose probes
//!   stayed (resident) is counted exactly.
//!
//! Records seen (sections, calls with their arguments) are then scaled per
//! operation by estimated calls ÷ records seen: records lost at window
//! boundaries (a lock taken in the window, released after) are accounted
//! for by the counts, which are not.
//!
//! The probes slow the target while attached: the rate extrapolated is the
//! window's divided by the share of the target's CPU time the traps left
//! it (progress taken as proportional to CPU time).
//!
//! The claimed error of an estimate is its extrapolated share times the
//! combined relative uncertainty of the rates it used: the spread of the
//! rates between windows, the counting noise of the calls a rate was
//! measured from, a floor for what no window saw, and the slowdown
//! correction itself (a target that sleeps more than it computes was
//! slowed less).
//!
//! Pure: fed with instants and counter readings.

use std::time::{Duration, Instant};

/// Relative error assumed of any extrapolated rate: what the windows could
/// not see (the target changing pace within a gap).
pub const RATE_ERROR_FLOOR: f64 = 0.1;
/// The floor with fewer than [`WINDOWS_FOR_SPREAD`] windows: how much the
/// rate varies from window to window is not known yet (measured: a single
/// 30 ms window of a contended mutex on a loaded 2-CPU machine was off by
/// -13% to +22%; one-window estimates of the demo's lock -28.6% against a
/// claim of 25%, of a contended mutex +29% against 28%).
pub const FEW_WINDOWS_ERROR_FLOOR: f64 = 0.35;
/// Windows from which the spread of their rates is taken as known.
pub const WINDOWS_FOR_SPREAD: u64 = 3;
/// The claimed error once a window slowed the target beyond
/// [`MAX_SLOWDOWN`]: the estimate is then unknown to a factor, not a
/// percentage.
pub const SATURATED_ERROR: f64 = 1.0;
/// Largest claimed relative error of an estimated allocator count that is
/// shown as a number (the allocator issue's bound: within 30% of the
/// truth, or unknown); beyond it the count is unknown (`null`) and a note
/// says why.
pub const MAX_COUNT_ERROR: f64 = 0.3;
/// The same for lock acquisitions: a one-window estimate claims at least
/// [`FEW_WINDOWS_ERROR_FLOOR`] (35%) and was within 8% of the truth in
/// 5 runs of 5, so it is shown with its claim; beyond ±50% (a window that
/// slowed the target past correction, rates that varied) the number would
/// say little, and with it the contention rate.
pub const MAX_ACQUISITIONS_ERROR: f64 = 0.5;
/// Largest slowdown corrected for: beyond, the rate attached says little.
const MAX_SLOWDOWN: f64 = 0.5;
/// A stretch attached shorter than this says too little of the rate: the
/// whole window's is used instead.
const MIN_STRETCH: Duration = Duration::from_millis(5);

/// Running mean and variance (Welford), in bounded memory.
#[derive(Debug, Clone, Copy, Default)]
struct Spread {
    n: u64,
    mean: f64,
    m2: f64,
}

impl Spread {
    fn add(&mut self, x: f64) {
        self.n += 1;
        let d = x - self.mean;
        self.mean += d / self.n as f64;
        self.m2 += d * (x - self.mean);
    }

    /// Standard deviation over the mean (0 with fewer than 2 samples).
    fn relative(&self) -> f64 {
        if self.n < 2 || self.mean <= 0.0 {
            0.0
        } else {
            (self.m2 / (self.n - 1) as f64).sqrt() / self.mean
        }
    }
}

/// What the counters say so far.
#[derive(Debug, Clone, PartialEq)]
pub struct CallEstimate {
    /// Estimated calls per operation over the session.
    pub calls: Vec<f64>,
    /// Whether an operation's count is exact (never extrapolated).
    pub exact: Vec<bool>,
    /// Share of the session the probes were all attached.
    pub traced_fraction: f64,
    /// Claimed relative error of the extrapolated counts (None: exact).
    pub error: Option<f64>,
    /// Windows whose rates were extrapolated.
    pub windows: u64,
}

impl CallEstimate {
    /// The factor to scale `seen` records of operation `op` by (1 for an
    /// exact operation, or when none was seen).
    pub fn scale(&self, op: usize, seen: u64) -> f64 {
        match (self.exact.get(op), self.calls.get(op)) {
            (Some(false), Some(&calls)) if seen > 0 => calls / seen as f64,
            _ => 1.0,
        }
    }

    /// Why an estimate's claimed error is too large to show its counts,
    /// for the note that says they are unknown.
    pub fn why_rough(&self) -> &'static str {
        if self.windows < WINDOWS_FOR_SPREAD {
            "too few windows to know how steady the rate is (a longer session helps)"
        } else {
            "the rate varied between windows, or the probes slowed the target too much to \
             correct for"
        }
    }

    /// Whether extrapolated counts are good enough to show as numbers,
    /// with claims up to `max_error`.
    pub fn shown(&self, max_error: f64) -> bool {
        self.error.is_none_or(|e| e <= max_error)
    }

    /// As [`Self::scale`], but None for an extrapolated operation seen at
    /// least once when the estimate claims more than `max_error`.
    pub fn shown_scale(&self, op: usize, seen: u64, max_error: f64) -> Option<f64> {
        let exact = self.exact.get(op).copied().unwrap_or(true);
        (exact || seen == 0 || self.shown(max_error)).then(|| self.scale(op, seen))
    }
}

#[derive(Debug, Clone)]
enum Period {
    Idle,
    Attached {
        since: Instant,
        calls_at: Vec<u64>,
        /// The last stretch (sub-window) attached: its rate is the one
        /// extrapolated.
        stretch_since: Instant,
        stretch_calls: Vec<u64>,
    },
    Untraced {
        since: Instant,
        calls_at: Vec<u64>,
        rates: Vec<f64>,
        resident: Vec<bool>,
    },
}

/// The counters of one family over a session.
#[derive(Debug, Clone)]
pub struct CallCounter {
    ops: usize,
    counted: Vec<u64>,
    extrapolated: Vec<f64>,
    extrapolated_any: Vec<bool>,
    attached: Duration,
    untraced: Duration,
    period: Period,
    rates: Spread,
    /// Fewest calls any extrapolated rate was measured from.
    fewest_rate_calls: Option<u64>,
    /// Largest slowdown corrected for.
    slowdown: f64,
    /// Relative error of the per-call cost the slowdown is computed from.
    cost_error: f64,
    /// A window slowed the target more than can be corrected for.
    saturated: bool,
}

impl CallCounter {
    /// `cost_error`: how far, relatively, the per-call cost given to
    /// [`Self::detaching`] may be off (1: a model figure).
    pub fn new(ops: usize, cost_error: f64) -> Self {
        Self {
            ops,
            counted: vec![0; ops],
            extrapolated: vec![0.0; ops],
            extrapolated_any: vec![false; ops],
            attached: Duration::ZERO,
            untraced: Duration::ZERO,
            period: Period::Idle,
            rates: Spread::default(),
            fewest_rate_calls: None,
            slowdown: 0.0,
            cost_error,
            saturated: false,
        }
    }

    fn reading(&self, calls: &[u64]) -> Vec<u64> {
        (0..self.ops)
            .map(|op| calls.get(op).copied().unwrap_or(0))
            .collect()
    }

    /// Every probe is attached from `now` (counters read `calls`).
    pub fn attached(&mut self, now: Instant, calls: &[u64]) {
        self.close(now, calls);
        let calls = self.reading(calls);
        self.period = Period::Attached {
            since: now,
            calls_at: calls.clone(),
            stretch_since: now,
            stretch_calls: calls,
        };
    }

    /// A new stretch starts while staying attached (the rate extrapolated
    /// later is that of the last stretch).
    pub fn stretch(&mut self, now: Instant, calls: &[u64]) {
        let reading = self.reading(calls);
        if let Period::Attached {
            stretch_since,
            stretch_calls,
            ..
        } = &mut self.period
        {
            *stretch_since = now;
            *stretch_calls = reading;
        }
    }

    /// The windowed probes start detaching at `now`; `resident[op]` says
    /// which operations stay attached. `cpu_per_call` is the share of the
    /// target's CPU one traced call per second takes (trap cost ÷ CPUs the
    /// target uses): the probes slowed the target by the window's rate ×
    /// that, so the rate extrapolated is the window's divided by what was
    /// left (progress taken as proportional to the CPU time left to the
    /// program).
    pub fn detaching(&mut self, now: Instant, calls: &[u64], resident: &[bool], cpu_per_call: f64) {
        let Period::Attached {
            since,
            calls_at,
            stretch_since,
            stretch_calls,
        } = &self.period
        else {
            return;
        };
        // The last stretch's rate; the whole window's when the stretch is
        // too short to say anything.
        let (from, at) = if now.saturating_duration_since(*stretch_since) >= MIN_STRETCH {
            (*stretch_since, stretch_calls.clone())
        } else {
            (*since, calls_at.clone())
        };
        self.close(now, calls);
        let reading = self.reading(calls);
        let len = now.saturating_duration_since(from).as_secs_f64().max(1e-3);
        let resident: Vec<bool> = (0..self.ops)
            .map(|op| resident.get(op).copied().unwrap_or(false))
            .collect();
        let mut window_calls = 0;
        let mut window_rate = 0.0;
        let measured: Vec<f64> = (0..self.ops)
            .map(|op| {
                let n = reading[op].saturating_sub(at[op]);
                let rate = n as f64 / len;
                if !resident[op] {
                    window_calls += n;
                    window_rate += rate;
                }
                rate
            })
            .collect();
        let raw_slowdown = window_rate * cpu_per_call;
        self.saturated |= raw_slowdown >= MAX_SLOWDOWN;
        let slowdown = raw_slowdown.clamp(0.0, MAX_SLOWDOWN);
        let rates: Vec<f64> = measured.iter().map(|r| r / (1.0 - slowdown)).collect();
        self.slowdown = self.slowdown.max(slowdown);
        tracing::debug!(
            "window rate {window_rate:.0} calls/s: slowdown {raw_slowdown:.2} (corrected for: {slowdown:.2})"
        );
        self.rates.add(window_rate);
        self.fewest_rate_calls = Some(
            self.fewest_rate_calls
                .map_or(window_calls, |f| f.min(window_calls)),
        );
        self.period = Period::Untraced {
            since: now,
            calls_at: reading,
            rates,
            resident,
        };
    }

    /// Mean rate (calls/s of the windowed operations) of the windows.
    pub fn mean_rate(&self) -> f64 {
        self.rates.mean
    }

    /// Accounts for the period in progress up to `now` and ends it.
    pub fn end(&mut self, now: Instant, calls: &[u64]) {
        self.close(now, calls);
    }

    /// Adds the period in progress (up to `now`) to the totals.
    fn close(&mut self, now: Instant, calls: &[u64]) {
        let reading = self.reading(calls);
        match std::mem::replace(&mut self.period, Period::Idle) {
            Period::Idle => {}
            Period::Attached {
                since, calls_at, ..
            } => {
                for op in 0..self.ops {
                    self.counted[op] += reading[op].saturating_sub(calls_at[op]);
                }
                self.attached += now.saturating_duration_since(since);
            }
            Period::Untraced {
                since,
                calls_at,
                rates,
                resident,
            } => {
                let len = now.saturating_duration_since(since);
                for op in 0..self.ops {
                    if resident[op] {
                        self.counted[op] += reading[op].saturating_sub(calls_at[op]);
                    } else {
                        self.extrapolated[op] += rates[op] * len.as_secs_f64();
                        self.extrapolated_any[op] = true;
                    }
                }
                self.untraced += len;
            }
        }
    }

    /// The estimate as of `now`, with the counters reading `calls` (None
    /// once detached: the period in progress was closed by [`Self::end`]).
    pub fn estimate(&self, now: Instant, calls: Option<&[u64]>) -> CallEstimate {
        let mut this = self.clone();
        if let Some(calls) = calls {
            this.close(now, calls);
        }
        let calls: Vec<f64> = (0..this.ops)
            .map(|op| this.counted[op] as f64 + this.extrapolated[op])
            .collect();
        let elapsed = (this.attached + this.untraced).as_secs_f64();
        let traced_fraction = if elapsed > 0.0 {
            this.attached.as_secs_f64() / elapsed
        } else {
            1.0
        };
        let extrapolated: f64 = this.extrapolated.iter().sum();
        let windowed: f64 = (0..this.ops)
            .filter(|op| this.extrapolated_any[*op])
            .map(|op| calls[op])
            .sum();
        let error = this.extrapolated_any.iter().any(|x| *x).then(|| {
            let share = if windowed > 0.0 {
                extrapolated / windowed
            } else {
                1.0
            };
            let counting = this
                .fewest_rate_calls
                .map_or(1.0, |n| 1.0 / (n.max(1) as f64));
            let spread = this.rates.relative();
            // The rate extrapolated is the window's ÷ (1 - slowdown); the
            // slowdown is as wrong as the per-call cost it came from (a
            // model figure: by all of it; a target that sleeps more than
            // it computes was not slowed), which the division magnifies
            // as the slowdown grows.
            let s = this.slowdown;
            let slow = s * this.cost_error / (1.0 - s);
            let floor = if this.rates.n < WINDOWS_FOR_SPREAD {
                FEW_WINDOWS_ERROR_FLOOR
            } else {
                RATE_ERROR_FLOOR
            };
            let error = share * (floor.powi(2) + spread.powi(2) + counting + slow.powi(2)).sqrt();
            // Slowed beyond what can be corrected for, the rate seen
            // attached may be any fraction of the real one (a hot
            // allocator's: 1%).
            if this.saturated {
                error.max(SATURATED_ERROR)
            } else {
                error
            }
        });
        CallEstimate {
            calls,
            exact: this.extrapolated_any.iter().map(|x| !x).collect(),
            traced_fraction,
            error,
            windows: this.rates.n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A target calling op 0 at `rate` calls/s and op 1 at a tenth of it,
    /// the counters as the probes would read them.
    struct Target {
        t0: Instant,
        counted: [u64; 2],
    }

    impl Target {
        fn at(&self, ms: u64) -> Instant {
            self.t0 + MS * ms as u32
        }
    }

    #[test]
    fn full_tracing_is_exact() {
        let t = Target {
            t0: Instant::now(),
            counted: [0, 0],
        };
        let mut c = CallCounter::new(2, 1.0);
        c.attached(t.at(0), &t.counted);
        let e = c.estimate(t.at(1000), Some(&[500, 7]));
        assert_eq!(e.calls, [500.0, 7.0]);
        assert_eq!(e.exact, [true, true]);
        assert_eq!((e.traced_fraction, e.error), (1.0, None));
        assert_eq!(e.scale(0, 400), 1.0, "exact counts are not scaled");
    }

    #[test]
    fn gaps_are_filled_at_each_window_s_own_rate() {
        let t = Target {
            t0: Instant::now(),
            counted: [0, 0],
        };
        let mut c = CallCounter::new(2, 1.0);
        // Window 1: 100 ms at 1000 calls/s of op 0 (and op 1 resident,
        // counted all along), then 900 ms untraced.
        c.attached(t.at(0), &t.counted);
        c.detaching(t.at(100), &[100, 10], &[false, true], 0.0);
        // Window 2: the rate doubled.
        c.attached(t.at(1000), &[130, 100]);
        c.stretch(t.at(1050), &[170, 105]);
        c.detaching(t.at(1100), &[270, 110], &[false, true], 0.0);
        c.end(t.at(2000), &[290, 200]);
        let e = c.estimate(t.at(2000), None);
        // Op 0: 100 + 1000/s × 0.9 s, then 140 counted + 2000/s (the last
        // stretch) × 0.9 s. The 30 and 20 calls counted while detaching are
        // replaced by the extrapolation.
        assert!(
            (e.calls[0] - (100.0 + 900.0 + 140.0 + 1800.0)).abs() < 1e-6,
            "{e:?}"
        );
        assert_eq!(e.calls[1], 200.0, "resident: every call counted");
        assert_eq!(e.exact, [false, true]);
        assert!((e.traced_fraction - 0.1).abs() < 1e-9);
        assert_eq!(e.windows, 2);
        // Scaling: 1000 sections seen of op 0's 2940 calls.
        assert!((e.scale(0, 1000) - 2.94).abs() < 1e-9);
        assert_eq!(e.scale(1, 150), 1.0);
        let err = e.error.unwrap();
        // Extrapolated share 2700/2940; rates 1000 and 2000 (relative
        // spread 0.47), 100 calls in the first: ±45%.
        let cv = 500f64.hypot(500.0) / 1500.0;
        let floor = FEW_WINDOWS_ERROR_FLOOR.powi(2);
        let expected = 2700.0 / 2940.0 * (floor + cv * cv + 0.01f64).sqrt();
        assert!((err - expected).abs() < 1e-9, "{err} {expected}");
    }

    #[test]
    fn the_claimed_error_grows_with_spread_counting_noise_and_slowdown() {
        let t = Target {
            t0: Instant::now(),
            counted: [0, 0],
        };
        // Five windows of 100 ms, each followed by 900 ms untraced.
        let steady_with = |cpu_per_call: f64, per_window: u64, cost_error: f64| {
            let mut c = CallCounter::new(2, cost_error);
            let mut n = 0;
            for w in 0..5u64 {
                c.attached(t.at(w * 1000), &[n, 0]);
                n += per_window;
                let at = t.at(w * 1000 + 100);
                c.detaching(at, &[n, 0], &[false, false], cpu_per_call);
            }
            c.end(t.at(5000), &[n, 0]);
            c.estimate(t.at(5000), None)
        };
        let steady =
            |cpu_per_call: f64, per_window: u64| steady_with(cpu_per_call, per_window, 1.0);
        let e = steady(0.0, 10_000);
        assert!((e.calls[0] - 500_000.0).abs() < 1e-6);
        let err = e.error.unwrap();
        assert!(
            (err - 0.9 * (RATE_ERROR_FLOOR.powi(2) + 1e-4).sqrt()).abs() < 1e-9,
            "{err}"
        );
        // Traps taking 20% of the target's CPU at 100,000 calls/s: the
        // gaps ran 1/0.8 as fast, and the claim says the correction may be
        // off by as much (0.2 / 0.8 of the rate).
        let slowed = steady(0.2 / 100_000.0, 10_000);
        assert!((slowed.calls[0] - (50_000.0 + 450_000.0 / 0.8)).abs() < 1e-6);
        let share = 562_500.0 / 612_500.0;
        let expected = share * (RATE_ERROR_FLOOR.powi(2) + 0.25f64.powi(2) + 1e-4).sqrt();
        assert!((slowed.error.unwrap() - expected).abs() < 1e-9);
        assert!(steady(0.0, 25).error.unwrap() > 0.15, "25 calls say little");
        // A per-call cost measured at start: the correction is trusted to
        // its stated error.
        let calibrated = steady_with(0.2 / 100_000.0, 10_000, 0.35);
        let expected = share * (RATE_ERROR_FLOOR.powi(2) + 0.0875f64.powi(2) + 1e-4).sqrt();
        assert!((calibrated.error.unwrap() - expected).abs() < 1e-9);
        // Traps taking more than half the target's CPU: the rate seen
        // attached says little, calibrated or not.
        let saturated = steady_with(0.6 / 100_000.0, 10_000, 0.35);
        assert!(saturated.error.unwrap() >= SATURATED_ERROR);
    }

    #[test]
    fn the_period_in_progress_counts_in_a_live_estimate() {
        let t = Target {
            t0: Instant::now(),
            counted: [0, 0],
        };
        let mut c = CallCounter::new(1, 1.0);
        c.attached(t.at(0), &[0]);
        c.detaching(t.at(100), &[100], &[false], 0.0);
        // A dashboard tick in the gap: not "every call traced".
        let live = c.estimate(t.at(1000), Some(&[120]));
        assert!((live.traced_fraction - 0.1).abs() < 1e-9);
        assert!((live.calls[0] - 1000.0).abs() < 1e-6);
        assert!(!live.exact[0] && live.error.is_some());
        // The live estimate does not change the record.
        let again = c.estimate(t.at(1000), Some(&[120]));
        assert_eq!(live, again);
    }
}

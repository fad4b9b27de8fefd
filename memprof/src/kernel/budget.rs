//! The overhead budget: how long hot uprobes may stay attached.
//!
//! A uprobe trap costs about a microsecond here whatever the program does
//! (measured: +0.99 µs per malloc with one uprobe, +2.5 µs with a
//! uretprobe too), while a malloc+free pair costs 15 ns. So a hot
//! allocator or mutex cannot be traced all the time within any reasonable
//! overhead. The controller keeps the probes attached in *windows* and
//! sizes the gaps between them so that, on average, the target loses at
//! most `budget` of its time:
//!
//! - while attached, the target pays `calls/s × trap cost` of CPU per
//!   second of wall time, spread over its threads;
//! - attaching costs a fixed amount too (about 8 ms here for the first
//!   probe of a burst), charged to each window;
//! - the traced fraction is then `budget / (cost while attached)`, capped
//!   at 1 (trace everything when that is cheap enough);
//! - the budget is kept from the start, not only on average: a window is
//!   opened only once the session is long enough to pay for it and for
//!   every window before it (a short window to learn the rate, then a gap
//!   that prepays the next, full-length one). Amortizing each window over
//!   the gap after it let a 3 s session pay for a second window it never
//!   had the time to amortize (1.09x for a 5% budget).
//!
//! Pure: fed with observations, it returns the next window and gap, and the
//! fraction of time traced so far (to scale counts and label them sampled).
//! The allocator and lock profilers share it.

use std::time::Duration;

/// Controller settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetConfig {
    /// Allowed slowdown, as a fraction of the target's time (0.05 = 5%).
    pub budget: f64,
    /// Cost of one traced call (all traps it takes), in seconds.
    pub trap_cost_s: f64,
    /// Cost of attaching the probes once, in seconds of the target's time.
    pub attach_cost_s: f64,
    /// Length of an attached window.
    pub window: Duration,
    /// Longest gap between windows (so rare events are still seen).
    pub max_gap: Duration,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        Self {
            budget: 0.05,
            trap_cost_s: 2.5e-6,
            attach_cost_s: 8e-3,
            window: Duration::from_millis(200),
            max_gap: Duration::from_secs(10),
        }
    }
}

/// The controller's decision for the next cycle.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    /// Keep the probes attached this long...
    pub window: Duration,
    /// ...then detached this long (zero: stay attached).
    pub gap: Duration,
}

/// Decides windows from the call rate observed in earlier windows.
#[derive(Debug, Clone)]
pub struct DutyCycle {
    config: BudgetConfig,
    /// Smoothed calls per second while attached (None before any window).
    rate: Option<f64>,
    traced: Duration,
    elapsed: Duration,
    /// Target time the traced calls and attaches took so far, in seconds.
    spent: f64,
    /// Target time lost per second attached besides the traps: hooks that
    /// go with the windows (the allocator's syscall hooks).
    extra_cost: f64,
}

/// Weight of the newest window in the smoothed call rate.
const SMOOTHING: f64 = 0.5;

impl DutyCycle {
    pub fn new(config: BudgetConfig) -> Self {
        Self {
            config,
            rate: None,
            traced: Duration::ZERO,
            elapsed: Duration::ZERO,
            spent: 0.0,
            extra_cost: 0.0,
        }
    }

    /// Sets what the target loses per second attached besides the traps
    /// (a fraction of its time): hooks attached with the windows.
    pub fn set_extra_cost(&mut self, per_second: f64) {
        if per_second.is_finite() {
            self.extra_cost = per_second.max(0.0);
        }
    }

    /// What the target loses per second attached besides the traps.
    pub fn extra_cost(&self) -> f64 {
        self.extra_cost
    }

    /// Records a finished cycle: `calls` seen during `window` attached,
    /// followed by `gap` detached.
    pub fn observe(&mut self, calls: u64, window: Duration, gap: Duration) {
        self.observe_rate(calls, window);
        self.traced += window;
        self.elapsed += window + gap;
        self.spent +=
            calls as f64 * self.config.trap_cost_s + self.extra_cost * window.as_secs_f64();
    }

    fn observe_rate(&mut self, calls: u64, window: Duration) {
        if !window.is_zero() {
            let now = calls as f64 / window.as_secs_f64();
            self.rate = Some(match self.rate {
                Some(old) => old * (1.0 - SMOOTHING) + now * SMOOTHING,
                None => now,
            });
        }
    }

    /// Records a window that ended with a detach: `calls` seen while the
    /// probes were attached for `attached`, of which they trapped for
    /// `trapping` (until the detach began: a `uprobe_multi` link's
    /// breakpoints go before its grace period, so the rate is taken over
    /// the window proper; calls still counted during the detach are
    /// charged all the same).
    pub fn observe_window(&mut self, calls: u64, trapping: Duration, attached: Duration) {
        self.observe_rate(calls, trapping.min(attached));
        self.traced += attached;
        self.elapsed += attached;
        self.spent += calls as f64 * self.config.trap_cost_s
            + self.config.attach_cost_s
            + self.extra_cost * attached.as_secs_f64();
    }

    /// The fraction of time the probes may be attached at `rate` calls/s.
    pub fn duty(&self, rate: f64) -> f64 {
        let c = &self.config;
        let window = c.window.as_secs_f64();
        // Target time lost per second attached: the traps, plus the attach
        // cost spread over the window.
        let cost_attached = rate * c.trap_cost_s + c.attach_cost_s / window + self.extra_cost;
        if cost_attached <= c.budget {
            1.0
        } else {
            (c.budget / cost_attached).clamp(0.0, 1.0)
        }
    }

    /// The next window and gap. Before anything is known, one window is
    /// taken to measure the rate.
    pub fn next(&self) -> Plan {
        let window = self.config.window;
        let Some(rate) = self.rate else {
            return Plan {
                window,
                gap: Duration::ZERO,
            };
        };
        let duty = self.duty(rate);
        if duty >= 1.0 {
            return Plan {
                window,
                gap: Duration::ZERO,
            };
        }
        let gap = if duty <= 0.0 {
            self.config.max_gap
        } else {
            window.mul_f64(1.0 / duty - 1.0).min(self.config.max_gap)
        };
        Plan { window, gap }
    }

    /// The gap to leave after a window that [`DutyCycle::observe_window`]
    /// recorded (`calls` seen while attached for `attached`): long enough
    /// to pay for that window, and for the session so far plus the next
    /// window, at the budget.
    pub fn gap_after(&self, calls: u64, attached: Duration) -> Duration {
        let Some(rate) = self.rate else {
            return Duration::ZERO;
        };
        let c = &self.config;
        if self.duty(rate) >= 1.0 {
            return Duration::ZERO;
        }
        if c.budget <= 0.0 {
            return c.max_gap;
        }
        let extra = self.extra_cost;
        let this = calls as f64 * c.trap_cost_s + c.attach_cost_s + extra * attached.as_secs_f64();
        let amortized = this / c.budget - attached.as_secs_f64();
        let window = c.window.as_secs_f64();
        let next = rate * window * c.trap_cost_s + c.attach_cost_s + extra * window;
        let prepaid = (self.spent + next) / c.budget - self.elapsed.as_secs_f64() - window;
        Duration::from_secs_f64(amortized.max(prepaid).clamp(0.0, c.max_gap.as_secs_f64()))
    }

    /// Target time the traced calls and attaches took so far, as the
    /// model prices them, in seconds.
    pub fn spent(&self) -> f64 {
        self.spent
    }

    /// Fraction of the elapsed time the probes were attached (1 before
    /// anything happened): counts seen are scaled by its inverse.
    pub fn traced_fraction(&self) -> f64 {
        if self.elapsed.is_zero() {
            1.0
        } else {
            self.traced.as_secs_f64() / self.elapsed.as_secs_f64()
        }
    }

    /// Updates the cost of one traced call from a measurement (the
    /// target's system time per traced call in the last window). The model
    /// cost stays the floor: a measurement can only make tracing rarer.
    pub fn measured_trap_cost(&mut self, seconds_per_call: f64, model: f64) {
        if seconds_per_call.is_finite() {
            self.config.trap_cost_s = seconds_per_call.max(model);
        }
    }

    /// The budget aimed at (fraction of the target's time).
    pub fn budget(&self) -> f64 {
        self.config.budget
    }

    /// The cost of one traced call in use.
    pub fn trap_cost(&self) -> f64 {
        self.config.trap_cost_s
    }

    /// The smoothed call rate while attached, if measured.
    pub fn rate(&self) -> Option<f64> {
        self.rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Settings unlike the defaults, so that a test cannot pass by
    /// restating them.
    const CONFIG: BudgetConfig = BudgetConfig {
        budget: 0.03,
        trap_cost_s: 4e-6,
        attach_cost_s: 3e-3,
        window: Duration::from_millis(150),
        max_gap: Duration::from_secs(7),
    };

    fn cycle() -> DutyCycle {
        DutyCycle::new(CONFIG)
    }

    /// Target time lost per second of wall time under `plan`, for a call
    /// rate `rate` (the model the controller promises to keep): the traps
    /// while attached, and attaching once per window (charged even when
    /// staying attached: the model errs on the cheap side).
    fn overhead(plan: Plan, rate: f64) -> f64 {
        let window = plan.window.as_secs_f64();
        let duty = window / (window + plan.gap.as_secs_f64());
        duty * (rate * CONFIG.trap_cost_s + CONFIG.attach_cost_s / window)
    }

    #[test]
    fn starts_with_a_measuring_window() {
        let d = cycle();
        assert_eq!(
            d.next(),
            Plan {
                window: CONFIG.window,
                gap: Duration::ZERO
            }
        );
        assert_eq!(d.traced_fraction(), 1.0);
        assert_eq!(d.rate(), None);
    }

    #[test]
    fn every_rate_gets_a_plan_within_the_budget() {
        // From a call a second to a billion: the plan's overhead is the
        // budget when calls are hot, less when they are cheap enough to
        // trace all the time, and never more (except that a gap is never
        // longer than max_gap, checked below).
        for exp in 0..=18 {
            let rate = 10f64.powf(f64::from(exp) / 2.0);
            let mut d = cycle();
            let calls = (rate * CONFIG.window.as_secs_f64()) as u64;
            d.observe(calls, CONFIG.window, Duration::ZERO);
            let plan = d.next();
            let rate = d.rate().expect("a rate after a window");
            let lost = overhead(plan, rate);
            if plan.gap == CONFIG.max_gap {
                continue;
            }
            assert!(
                lost <= CONFIG.budget * 1.001,
                "rate {rate}: {plan:?} loses {lost}"
            );
            if plan.gap > Duration::ZERO {
                assert!(
                    (lost - CONFIG.budget).abs() < CONFIG.budget * 0.01,
                    "rate {rate}: a gapped plan uses the whole budget, not {lost}"
                );
            }
        }
    }

    #[test]
    fn rare_calls_are_traced_all_the_time() {
        let mut d = cycle();
        // 100 calls/s x 4 us, and attaching once per window: within 3%.
        let calls = (100.0 * CONFIG.window.as_secs_f64()) as u64;
        d.observe(calls, CONFIG.window, Duration::ZERO);
        assert!(
            overhead(
                Plan {
                    window: CONFIG.window,
                    gap: Duration::ZERO
                },
                100.0
            ) < CONFIG.budget
        );
        assert_eq!(d.next().gap, Duration::ZERO);
        assert_eq!(d.duty(100.0), 1.0);
    }

    #[test]
    fn gaps_are_capped_so_windows_keep_coming() {
        let mut d = cycle();
        d.observe(u64::MAX / 4, CONFIG.window, Duration::ZERO);
        assert_eq!(d.next().gap, CONFIG.max_gap);
    }

    #[test]
    fn the_rate_is_smoothed_and_the_traced_fraction_adds_up() {
        let mut d = cycle();
        d.observe(2_000, 200 * MS, 800 * MS); // 10k/s
        d.observe(6_000, 200 * MS, 800 * MS); // 30k/s
        assert_eq!(d.rate(), Some(20_000.0));
        assert!((d.traced_fraction() - 0.2).abs() < 1e-12);
        // An empty window (no time) does not change the rate.
        d.observe(0, Duration::ZERO, 100 * MS);
        assert_eq!(d.rate(), Some(20_000.0));
    }

    #[test]
    fn a_measured_trap_cost_only_ever_raises_the_model() {
        let mut d = cycle();
        let model = CONFIG.trap_cost_s;
        d.measured_trap_cost(3.0 * model, model);
        assert_eq!(d.trap_cost(), 3.0 * model);
        // 100k/s at the measured cost, plus attaching once per window.
        let window = CONFIG.window.as_secs_f64();
        let lost = 1e5 * 3.0 * model + CONFIG.attach_cost_s / window;
        assert!((d.duty(1e5) - CONFIG.budget / lost).abs() < 1e-9);
        d.measured_trap_cost(model / 2.0, model);
        assert_eq!(d.trap_cost(), model);
        d.measured_trap_cost(f64::NAN, model);
        assert_eq!(d.trap_cost(), model);
    }

    /// The model's price of `calls` traced calls and one attach.
    fn price(calls: u64) -> f64 {
        calls as f64 * CONFIG.trap_cost_s + CONFIG.attach_cost_s
    }

    #[test]
    fn a_gap_pays_for_its_window_whatever_the_detach_took() {
        let mut d = cycle();
        // A steady state: windows paid for so far.
        for _ in 0..5 {
            d.observe_window(4_000, CONFIG.window, CONFIG.window);
            let gap = d.gap_after(4_000, CONFIG.window);
            d.observe(0, Duration::ZERO, gap);
        }
        // The same calls, detached in one window's time or in two: the
        // target paid for the calls either way, so the whole cycle is the
        // same length (the detach counts as part of it).
        let mut short = d.clone();
        short.observe_window(4_000, CONFIG.window, CONFIG.window);
        let mut long = d.clone();
        long.observe_window(4_000, CONFIG.window, 2 * CONFIG.window);
        let short_cycle = CONFIG.window + short.gap_after(4_000, CONFIG.window);
        let long_cycle = 2 * CONFIG.window + long.gap_after(4_000, 2 * CONFIG.window);
        assert!(short_cycle > CONFIG.window * 2);
        let diff = short_cycle.as_secs_f64() - long_cycle.as_secs_f64();
        assert!(diff.abs() < 1e-3, "{short_cycle:?} vs {long_cycle:?}");
        // Cycle = price / budget.
        let want = price(4_000) / CONFIG.budget;
        assert!((short_cycle.as_secs_f64() - want).abs() < 1e-3 * want);
        assert_eq!(cycle().gap_after(4_000, 2 * CONFIG.window), Duration::ZERO);
    }

    /// A hot allocator's first window is short (to learn the rate); the
    /// gap after it must also prepay the next, full-length window, so that
    /// at the end of that one the session has kept the budget from the
    /// start: a session that ends any time after is within it.
    #[test]
    fn the_gap_after_a_short_first_window_prepays_the_next() {
        let mut d = cycle();
        let first = 20 * MS;
        // 100k calls/s while trapping (0.4 s lost per second: the gap is
        // below max_gap); the detach took 70 ms more.
        let calls = 2_000;
        d.observe_window(calls, first, first + 70 * MS);
        let gap = d.gap_after(calls, first + 70 * MS);
        // Amortizing the first window alone would open the next one early.
        let amortized = price(calls) / CONFIG.budget - 0.09;
        assert!(gap.as_secs_f64() > 2.0 * amortized, "{gap:?}");
        // After the next window, spent / elapsed is the budget.
        d.observe(0, Duration::ZERO, gap);
        let rate = d.rate().unwrap();
        let next_calls = (rate * CONFIG.window.as_secs_f64()) as u64;
        d.observe_window(next_calls, CONFIG.window, CONFIG.window);
        let elapsed = first + 70 * MS + gap + CONFIG.window;
        let share = d.spent() / elapsed.as_secs_f64();
        assert!(
            (share - CONFIG.budget).abs() < 0.02 * CONFIG.budget,
            "spent {:.4} s of {elapsed:?}: {share}",
            d.spent()
        );
    }

    #[test]
    fn a_zero_budget_traces_as_little_as_possible() {
        let d = DutyCycle::new(BudgetConfig {
            budget: 0.0,
            ..CONFIG
        });
        assert_eq!(d.duty(1.0), 0.0);
        let mut d = d;
        d.observe(10, CONFIG.window, Duration::ZERO);
        assert_eq!(d.next().gap, CONFIG.max_gap);
        assert_eq!(d.gap_after(10, CONFIG.window), CONFIG.max_gap);
    }
}

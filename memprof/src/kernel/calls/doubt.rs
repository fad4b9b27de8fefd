//! What most of an estimate's claimed error comes from: the note that
//! says why a count is unknown names it (only an unknown count's note
//! does: with three windows or more the floor alone never makes one).

use super::{CallCounter, FEW_WINDOWS_ERROR_FLOOR, MAX_SLOWDOWN, WINDOWS_FOR_SPREAD};

/// What most of an estimate's claimed error comes from, for the note that
/// says why its counts are unknown: the user learns which of a longer
/// session, a larger budget or full tracing would help.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Doubt {
    /// A window slowed the target by [`MAX_SLOWDOWN`] or more.
    Saturated,
    /// The slowdown correction: the traps were estimated to take `slowed`
    /// of the target's CPU time in a window (from a per-call cost known
    /// only roughly), which leaves the rate uncertain by ±`error`.
    Slowdown { slowed: f64, error: f64 },
    /// No window measured a rate: the target idled through them.
    NoRate,
    /// Fewer than [`WINDOWS_FOR_SPREAD`] windows measured a rate.
    FewWindows { n: u64 },
    /// The rates of `n` windows varied: ±`upper`, their relative spread at
    /// its upper bound.
    Spread { upper: f64, n: u64 },
    /// The window with the fewest calls counted only `calls`.
    Counting { calls: u64 },
    /// Counts from the CPU time: only `n` samples fell in the allocator.
    Samples { n: u64 },
    /// Counts from the CPU time: the untraced cost of a call stands in for
    /// the program's, to ±`error`, with `share` of the target's sampled
    /// time in the allocator.
    StandIn { error: f64, share: f64 },
    /// Counts from the CPU time: the allocator's untraced cost varied
    /// (with its heap's state, or over the session) by ±`error`.
    CostVaried { error: f64 },
}

impl Doubt {
    /// The reason, as the note gives it.
    pub fn reason(&self) -> String {
        let pct = |x: f64| format!("{:.0}%", x * 100.0);
        match *self {
            Doubt::Saturated => format!(
                "a window slowed the target by {} or more, so the rate it saw says little of \
                 the untraced one (full mode counts every call)",
                pct(MAX_SLOWDOWN)
            ),
            Doubt::Slowdown { slowed, error } => format!(
                "the probes' cost was estimated at {} of the target's CPU time in a window, \
                 from a per-call cost known only roughly; correcting for it leaves the rate \
                 uncertain by ±{}",
                pct(slowed),
                pct(error)
            ),
            Doubt::NoRate => "no window measured a rate: the target idled through them".to_string(),
            Doubt::FewWindows { n } => format!(
                "only {n} window{} measured a rate, too few to know how steady it is (a longer \
                 session gives more)",
                if n == 1 { "" } else { "s" }
            ),
            Doubt::Spread { upper, n } => format!(
                "the rate varied between the {n} windows that measured it (±{} at the upper \
                 bound of their spread)",
                pct(upper)
            ),
            Doubt::Counting { calls } => {
                format!("the window with the fewest calls counted only {calls}")
            }
            Doubt::Samples { n } => {
                format!("only {n} CPU samples fell in the allocator's code")
            }
            Doubt::StandIn { error, share } => format!(
                "what a call costs the program is taken from a timed loop of the same calls, \
                 known to ±{} with {} of the target's sampled CPU time in the allocator",
                pct(error),
                pct(share)
            ),
            Doubt::CostVaried { error } => format!(
                "the allocator's untraced cost varied by ±{} (with its heap's state, or over \
                 the session)",
                pct(error)
            ),
        }
    }
}

impl CallCounter {
    /// The largest part of the claimed error, as `estimate` combines them:
    /// the rate's `spread` (at its upper bound), the slowdown correction's
    /// error `slow`, the relative variance of the `counting`, or, with too
    /// few windows, the floor that stands for their spread (for the locks
    /// also for the correction, unless the two together are larger).
    pub(super) fn doubt(&self, spread: f64, slow: f64, counting: f64) -> Doubt {
        let n = self.basis.n;
        if self.saturated {
            return Doubt::Saturated;
        }
        if self.fewest_rate_calls.is_none() {
            return Doubt::NoRate;
        }
        let counting = counting.sqrt();
        let few = n < WINDOWS_FOR_SPREAD;
        let floor = if few { FEW_WINDOWS_ERROR_FLOOR } else { 0.0 };
        // The locks' floor holds spread and correction: it gives way to
        // the two together, named by the larger.
        let together = if few && self.floor_holds_slowdown {
            spread.hypot(slow)
        } else {
            spread.max(slow)
        };
        if counting > floor.max(together) {
            Doubt::Counting {
                calls: self.fewest_rate_calls.unwrap_or(0),
            }
        } else if floor >= together {
            Doubt::FewWindows { n }
        } else if slow >= spread {
            Doubt::Slowdown {
                slowed: self.slowdown,
                error: slow,
            }
        } else {
            Doubt::Spread { upper: spread, n }
        }
    }
}

//! What most of an estimate's claimed error comes from: the note that
//! says why a count is unknown names it, with its size.

use super::{CallCounter, FEW_WINDOWS_ERROR_FLOOR, MAX_SLOWDOWN, WINDOWS_FOR_SPREAD};

/// What most of an estimate's claimed error comes from, for the note that
/// says why its counts are unknown: the user learns which of a longer
/// session, a larger budget or full tracing would help.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Doubt {
    /// A window slowed the target by more than [`MAX_SLOWDOWN`].
    Saturated,
    /// The slowdown correction: the traps took `slowed` of the target's
    /// time in a window, a correction known to ±`error` of the rate.
    Slowdown { slowed: f64, error: f64 },
    /// Fewer than [`WINDOWS_FOR_SPREAD`] windows measured a rate.
    FewWindows { n: u64 },
    /// The rates of `n` windows varied: ±`upper`, their relative spread at
    /// its upper bound.
    Spread { upper: f64, n: u64 },
    /// The window with the fewest calls counted only `calls`.
    Counting { calls: u64 },
    /// Counts from the CPU time: only `n` samples fell in the allocator.
    Samples { n: u64 },
    /// Counts from the CPU time: `share` of the target's sampled time was
    /// in the allocator, whose untraced cost stands in for the program's.
    StandIn { share: f64 },
    /// Counts from the CPU time: the allocator's untraced cost varied
    /// (with its heap's state, or over the session).
    CostVaried,
}

impl Doubt {
    /// The reason, as the note gives it.
    pub fn reason(&self) -> String {
        let pct = |x: f64| format!("{:.0}%", x * 100.0);
        match *self {
            Doubt::Saturated => format!(
                "a window slowed the target by more than {}, so the rate it saw says little of \
                 the untraced one (a larger --budget gives shorter gaps, not cheaper windows; \
                 full mode counts every call)",
                pct(MAX_SLOWDOWN)
            ),
            Doubt::Slowdown { slowed, error } => format!(
                "the probes took {} of the target's time in a window; the rate is corrected for \
                 it, but the correction is known only to ±{}",
                pct(slowed),
                pct(error)
            ),
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
            Doubt::StandIn { share } => format!(
                "only {} of the target's sampled CPU time was in the allocator's code, so what a \
                 call costs the program is taken from a timed loop with a wide margin",
                pct(share)
            ),
            Doubt::CostVaried => "the allocator's untraced cost varied (with its heap's state, \
                 or over the session)"
                .to_string(),
        }
    }
}

impl CallCounter {
    /// The largest part of the claimed error: the rate's `spread` (at its
    /// upper bound), the slowdown correction's error `slow`, the relative
    /// variance of the `counting`, or too few windows for the spread.
    pub(super) fn doubt(&self, spread: f64, slow: f64, counting: f64) -> Doubt {
        let n = self.basis.n;
        let few = if n < WINDOWS_FOR_SPREAD {
            FEW_WINDOWS_ERROR_FLOOR
        } else {
            0.0
        };
        let counting = counting.sqrt();
        let top = few.max(spread).max(slow).max(counting);
        if self.saturated {
            Doubt::Saturated
        } else if top == slow {
            Doubt::Slowdown {
                slowed: self.slowdown,
                error: slow,
            }
        } else if top == counting {
            Doubt::Counting {
                calls: self.fewest_rate_calls.unwrap_or(0),
            }
        } else if top == few {
            Doubt::FewWindows { n }
        } else {
            Doubt::Spread { upper: spread, n }
        }
    }
}

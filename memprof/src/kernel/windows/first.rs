//! The first window: when it ends. Nothing is known yet of the calls'
//! rate, and a hot function traps on every call meanwhile.

use std::time::Duration;

use super::{rate_since, State, Windowed, MIN_CALLS_TO_MEASURE};
use crate::kernel::{budget::DutyCycle, cputime::threads, loader::Probes};

/// Trap time the allocator's first window may spend tracing the target's
/// serial start-up in full ([`Windowed::trace_serial_start_up`]). A
/// program usually builds the structures its threads will share before it
/// starts them: a launched linreg allocated its struct array 0.4 s in,
/// in the gap after a 20 ms first window busy with the dynamic loader's
/// calls, and its false sharing was "a heap block allocated before
/// tracing". A start-up of a few thousand calls costs a few ms; the cap
/// bounds a single-threaded program that allocates all along (the duty
/// cycle then repays what was spent with longer gaps).
const SERIAL_START_UP_SPEND: Duration = Duration::from_millis(50);

/// When a long first window first looks at its rate: a function this hot
/// (its traps taking [`FIRST_LOOK_HOT`] of the target's time and more)
/// ends the window then. Its rate is known well enough to size the gap,
/// and every further millisecond attached costs the target about as much
/// again: a 10 ns uncontended lock section traps ~450x slower, and its
/// 100 ms first window plus the detach took 4-6% of a 3 s run. Counts
/// from such a window are too rough to give anyway (its slowdown
/// correction alone is past the claim a count may carry).
pub(super) const FIRST_LOOK: Duration = Duration::from_millis(20);
/// See [`FIRST_LOOK`]: the traps take 60% of the target's time by the
/// model's cost of a call (measured at 20 ms: the uncontended lock loop
/// 0.97, the 4-thread yield loop 0.46, a 2-thread contended mutex 0.17 to
/// 0.52; the last two keep their 100 ms windows).
const FIRST_LOOK_HOT: f64 = 0.6;

impl Windowed {
    /// Traces the target's serial start-up in full: the first window
    /// stays attached while the target runs one thread, within
    /// [`SERIAL_START_UP_SPEND`] of trap time, unless its calls are
    /// trap-bound.
    pub fn trace_serial_start_up(&mut self) {
        self.start_up_left = Some(SERIAL_START_UP_SPEND.as_secs_f64());
    }

    /// Whether the first window stays attached through the serial
    /// start-up, a stretch with `seen` calls at `rate` just ended (its
    /// traps spent from the allowance); once it ends, it has ended.
    pub(super) fn in_serial_start_up(&mut self, seen: u64, rate: f64) -> bool {
        let Some(left) = self.start_up_left else {
            return false;
        };
        let left = left - seen as f64 * self.cycle.trap_cost();
        let serial = threads(self.pid) == Some(1);
        self.start_up_left = start_up_goes_on(serial, left, rate, &self.cycle).then_some(left);
        self.start_up_left.is_some()
    }

    /// At a long first window's first look ([`FIRST_LOOK`]): whether it
    /// goes on, its calls not being trap-bound; once a window.
    pub(super) fn first_look_waits(&mut self, probes: &Probes) -> bool {
        let (opened, calls_at_open) = match &self.state {
            State::Attached {
                opened,
                calls_at_open,
                ..
            } => (*opened, *calls_at_open),
            _ => return false,
        };
        if !self.first_window || std::mem::replace(&mut self.looked, true) {
            return false;
        }
        let seen = probes.calls(self.family).saturating_sub(calls_at_open);
        !hot_at_first_look(rate_since(seen, opened), &self.cycle)
    }
}

/// Whether the first window saw too little to tell hot from cold: few
/// calls, at a rate whose traps cost less than the budget. A busy window
/// decides even with few calls: on a loaded machine a short window of a
/// slowed-down target sees few calls, and staying attached would trace it
/// all session long.
pub(super) fn too_quiet_to_decide(seen: u64, rate: f64, cycle: &DutyCycle) -> bool {
    seen < MIN_CALLS_TO_MEASURE && rate * cycle.trap_cost() + cycle.extra_cost() < cycle.budget()
}

/// Whether the serial start-up is still traced in full: the target runs
/// one thread (`serial`), `left` seconds of trap time remain, and its
/// calls at `rate` are not trap-bound.
fn start_up_goes_on(serial: bool, left: f64, rate: f64, cycle: &DutyCycle) -> bool {
    serial && left > 0.0 && !hot_at_first_look(rate, cycle)
}

/// Whether calls at `rate` (a second of the traced target) are hot enough
/// at [`FIRST_LOOK`] to end the first window there.
fn hot_at_first_look(rate: f64, cycle: &DutyCycle) -> bool {
    rate * cycle.trap_cost() >= FIRST_LOOK_HOT
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::budget::BudgetConfig;

    #[test]
    fn a_busy_first_window_decides_even_with_few_calls() {
        let cycle = DutyCycle::new(BudgetConfig::default());
        // The trap cost at which calls spend the whole budget.
        let busy = cycle.budget() / cycle.trap_cost();
        // A program starting up: a few calls, cheap to trace.
        assert!(too_quiet_to_decide(10, 50.0, &cycle));
        // A contended program slowed down on a loaded machine: few calls in
        // a short window, but each second attached costs more than the
        // budget (the flake of 022cbb1: it stayed attached all session).
        assert!(!too_quiet_to_decide(
            MIN_CALLS_TO_MEASURE - 1,
            busy * 2.0,
            &cycle
        ));
        // Enough calls always decide.
        assert!(!too_quiet_to_decide(MIN_CALLS_TO_MEASURE, 1.0, &cycle));
    }

    #[test]
    fn the_serial_start_up_is_traced_until_a_second_thread_or_its_allowance() {
        let cycle = DutyCycle::new(BudgetConfig::default());
        let left = SERIAL_START_UP_SPEND.as_secs_f64();
        // A start-up allocating at a rate whose traps cost 10 times the
        // budget: still traced while it has one thread and allowance.
        let busy = cycle.budget() / cycle.trap_cost() * 10.0;
        assert!(start_up_goes_on(true, left, busy, &cycle));
        assert!(!start_up_goes_on(false, left, busy, &cycle), "two threads");
        assert!(!start_up_goes_on(true, 0.0, busy, &cycle), "spent");
        assert!(
            !start_up_goes_on(true, left, 0.9 / cycle.trap_cost(), &cycle),
            "trap-bound"
        );
    }

    #[test]
    fn only_a_trap_bound_target_ends_its_first_window_at_the_first_look() {
        let cycle = DutyCycle::new(BudgetConfig::default());
        let trap_bound = 1.0 / cycle.trap_cost();
        // A 10 ns section: the target does little but trap.
        assert!(hot_at_first_look(trap_bound, &cycle));
        // Even if a call costs it half again the model's figure.
        assert!(hot_at_first_look(trap_bound / 1.5, &cycle));
        // A contended lock, mostly waiting: its rate needs the whole window.
        assert!(!hot_at_first_look(trap_bound * 0.2, &cycle));
        // A busy window is not a hot one.
        assert!(!hot_at_first_look(
            cycle.budget() / cycle.trap_cost() * 2.0,
            &cycle
        ));
    }
}

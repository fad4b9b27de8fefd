//! What a traced call costs the target, from its system time in a window
//! less its own: a server's system calls (redis under load spends most of
//! its time in them) are no trap's, and taken for them they put the cost
//! of a call at 22-55 µs where the traps cost about 4, and the next gap at
//! the 10 s cap.

use std::time::{Duration, Instant};

use crate::kernel::cputime::system_time;

use super::MIN_CALLS_TO_MEASURE;

/// System time a window must have taken for it to measure the cost of a
/// call: the kernel counts it in 10 ms ticks, so a 20 ms first window
/// measured 4.0 µs a call where the calibration said 2.2 (and its gap
/// doubled).
const MIN_STIME_TO_MEASURE: f64 = 0.05;
/// The shortest gap whose system time is taken as the target's own rate.
const MIN_GAP_FOR_BASE: f64 = 0.5;

/// The target's system time, read at each window's ends.
pub(super) struct OwnSystemTime {
    pid: u32,
    /// When the last gap began, and the system time then.
    gap: Option<(Instant, f64)>,
    /// The system time a second over the last gap (untraced).
    base: Option<f64>,
    /// The system time when the window opened.
    at_open: Option<f64>,
}

impl OwnSystemTime {
    pub fn new(pid: u32) -> Self {
        Self {
            pid,
            gap: None,
            base: None,
            at_open: None,
        }
    }

    /// A window opens: the gap that ends is the target's own rate.
    pub fn window_opened(&mut self) {
        self.at_open = system_time(self.pid);
        self.base = match (self.gap.take(), self.at_open) {
            (Some((since, before)), Some(now)) => {
                let gap = since.elapsed().as_secs_f64();
                (gap >= MIN_GAP_FOR_BASE).then(|| (now - before) / gap)
            }
            _ => None,
        };
    }

    /// The window goes on as a new one (no gap between).
    pub fn window_restarted(&mut self) {
        self.at_open = system_time(self.pid);
    }

    /// The window's probes are gone after `attached`, with `calls`
    /// traced, and a gap begins: what a call cost, if measured.
    pub fn window_closed(&mut self, attached: Duration, calls: u64) -> Option<f64> {
        let now = system_time(self.pid);
        self.gap = now.map(|s| (Instant::now(), s));
        let stime = now? - self.at_open.take()?;
        if calls < MIN_CALLS_TO_MEASURE || stime < MIN_STIME_TO_MEASURE {
            return None;
        }
        trap_cost_beyond(stime, self.base, attached, calls)
    }
}

/// The target's system time per traced call in a window, beyond what it
/// spends in the kernel on its own: `stime` seconds taken during a window
/// `attached` long with `calls` traced, against `base` seconds a second
/// when untraced. None without a baseline (the first window).
fn trap_cost_beyond(stime: f64, base: Option<f64>, attached: Duration, calls: u64) -> Option<f64> {
    let own = base? * attached.as_secs_f64();
    (calls > 0).then(|| (stime - own).max(0.0) / calls as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_targets_own_system_time_is_not_the_traps() {
        let window = Duration::from_millis(200);
        // Busy in the kernel 60% of the time on its own: of 0.15 s in a
        // 0.2 s window, 0.03 s are the 20k traps'.
        let cost = trap_cost_beyond(0.15, Some(0.6), window, 20_000).unwrap();
        assert!((cost - 1.5e-6).abs() < 1e-12, "{cost}");
        // Less than its own rate (the load fell): no cost, not a negative one.
        assert_eq!(trap_cost_beyond(0.05, Some(0.6), window, 20_000), Some(0.0));
        assert_eq!(trap_cost_beyond(0.15, None, window, 20_000), None);
        assert_eq!(trap_cost_beyond(0.15, Some(0.0), window, 0), None);
    }
}

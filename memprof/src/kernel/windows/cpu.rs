//! The target's CPU time, for the call estimate and the cost of a call.

use std::time::{Duration, Instant};

use super::Windowed;
use crate::kernel::{
    calls::{CallEstimate, TrapCost},
    cputime::{cpu_clock, cpu_time, online_cpus, threads},
    loader::Probes,
};

/// How often the target's CPU clock is read in a gap.
const CPU_POLL: Duration = Duration::from_millis(50);

impl Windowed {
    /// The window opens: its calls are counted from now.
    pub(super) fn count_attached(&mut self, probes: &Probes) {
        let calls = probes.op_calls(self.family);
        self.counter
            .attached(Instant::now(), &calls, cpu_clock(self.pid));
    }

    /// The window goes on: the rate extrapolated will be that from now.
    pub(super) fn new_stretch(&mut self, probes: &Probes) {
        let calls = probes.op_calls(self.family);
        self.counter
            .stretch(Instant::now(), &calls, cpu_clock(self.pid));
    }

    /// The window's probes start going; `resident[op]` stay.
    pub(super) fn count_detaching(&mut self, probes: &Probes, resident: &[bool]) {
        let calls = probes.op_calls(self.family);
        let cost = self.counted_trap_cost();
        let cpu = cpu_clock(self.pid);
        self.counter
            .detaching(Instant::now(), &calls, cpu, resident, cost);
    }

    /// Tracing ends: the period in progress is counted.
    pub(super) fn count_end(&mut self, probes: &Probes) {
        let calls = probes.op_calls(self.family);
        self.counter
            .end(Instant::now(), &calls, cpu_clock(self.pid));
    }

    /// What one traced call costs the target, for the counter's correction
    /// (and the CPUs it uses, for its model). A per-call cost calibrated at
    /// start is used as is; the budget keeps the larger of it and what
    /// windows measure (system time in 10 ms ticks, with the target's own
    /// syscalls in it).
    pub(super) fn counted_trap_cost(&self) -> TrapCost {
        let per_call_s = if self.settings.trap_cost_error < 1.0 {
            self.settings.trap_cost_s
        } else {
            self.cycle.trap_cost()
        };
        TrapCost {
            per_call_s,
            cpus: self.cpus(),
        }
    }

    pub(super) fn read_cpu(&mut self) {
        let Some(cpu) = cpu_time(self.pid) else {
            return;
        };
        let now = (Instant::now(), cpu);
        match &mut self.cpu {
            Some([_, last]) => *last = now,
            None => self.cpu = Some([now, now]),
        }
    }

    /// The target's CPU use (CPUs busy on average) while traced, if read
    /// over at least a second.
    fn cpus_busy(&self) -> Option<f64> {
        let [(t0, c0), (t1, c1)] = self.cpu?;
        let wall = t1.saturating_duration_since(t0).as_secs_f64();
        (wall >= 1.0).then(|| (c1 - c0) / wall)
    }

    /// The CPUs the target uses: as read over a second or more, else the
    /// CPUs online or its threads, whichever is fewer (a single-threaded
    /// target keeps one CPU busy at most: taken as using all the CPUs, its
    /// first window's slowdown was corrected for by half).
    fn cpus(&self) -> f64 {
        self.cpus_busy()
            .unwrap_or_else(|| {
                let threads = threads(self.pid).map_or(f64::INFINITY, f64::from);
                online_cpus().min(threads)
            })
            .max(0.1)
    }

    /// Estimated calls per operation over the session, from the calls the
    /// kernel counted in each window (see `kernel::calls`); `probes` while
    /// attached (the window or gap in progress counts up to now).
    pub fn call_estimate(&self, probes: Option<&Probes>) -> CallEstimate {
        let calls = probes.map(|p| p.op_calls(self.family));
        self.counter
            .estimate(Instant::now(), calls.as_deref(), cpu_clock(self.pid))
    }

    /// Reads the target's CPU clock for the call estimate, at most every
    /// [`CPU_POLL`]: a target that exits in a gap takes its clock with
    /// it, and the gap's CPU time is then read up to the last reading.
    pub fn poll_cpu(&mut self) {
        let now = Instant::now();
        if self
            .cpu_polled
            .is_some_and(|t| now.saturating_duration_since(t) < CPU_POLL)
        {
            return;
        }
        self.cpu_polled = Some(now);
        self.counter.observe_cpu(now, cpu_clock(self.pid));
    }
}

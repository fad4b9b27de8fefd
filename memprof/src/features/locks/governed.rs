//! The always-on contention hooks' governor at work: its readings, and
//! the hooks' windows it calls for.

use std::time::{Duration, Instant};

use memprof_common::programs;

use super::{
    governor::{Governor, Reading},
    hook_windows::{self, HookWindows, Switch},
};
use crate::kernel::{cputime::cpu_time, loader::Probes};

/// How often the governor looks at the futex hooks' cost.
const GOVERNOR_PERIOD: Duration = Duration::from_secs(1);

/// The governor and what it reads.
pub(super) struct Governed {
    pub(super) governor: Governor,
    due: Instant,
    pid: u32,
    /// The hooks' windows (attached throughout while the scale is 1).
    pub(super) windows: HookWindows,
}

impl Governed {
    /// The governor of process `pid`'s hooks under `budget`, which were
    /// attached just now.
    pub(super) fn new(budget: f64, pid: u32) -> Self {
        let now = Instant::now();
        Self {
            governor: Governor::new(budget),
            due: now,
            pid,
            windows: HookWindows::new(now),
        }
    }

    /// The next reading or window switch.
    pub(super) fn deadline(&self) -> Instant {
        let scale = self.governor.scale();
        self.windows
            .next_switch(scale)
            .map_or(self.due, |t| t.min(self.due))
    }

    /// Takes a reading when one is due, and attaches or detaches the
    /// hooks when their windows say so.
    pub(super) fn on_deadline(&mut self, probes: &mut Probes, notes: &mut Vec<String>) {
        if self.due <= Instant::now() {
            self.tick(probes);
        }
        self.step_windows(probes, notes);
    }

    /// Attaches or detaches the hooks when their windows say so.
    fn step_windows(&mut self, probes: &mut Probes, notes: &mut Vec<String>) {
        let counters = probes.counters();
        let waits = counters.futex_waits_traced + counters.futex_waits_skipped;
        let now = Instant::now();
        match self.windows.step(now, self.governor.scale(), waits) {
            Some(Switch::Detach) => probes.close_contention_window(),
            Some(Switch::Attach) => {
                if let Err(e) = probes.open_contention_window() {
                    tracing::warn!("cannot re-attach the contention hooks: {e}");
                    notes.push(format!(
                        "the contention hooks could not be re-attached after a gap ({e}): \
                         contention after it was not seen"
                    ));
                    self.windows.end(now);
                }
            }
            None => {}
        }
    }

    /// Says that the hooks went in windows, or overran the budget even so.
    pub(super) fn windows_note(&self) -> Option<String> {
        let (scale, gaps) = match self.governor.overrun() {
            Some((base, share)) => {
                return Some(format!(
                    "the always-on lock hooks' base cost (runs on every context switch and \
                     wake-up, which no sampling lowers) reached {:.1}% of the target's CPU time \
                     while attached, above their {:.1}% share of the budget even attached one \
                     window in {}: this program switches threads very often",
                    base * 100.0,
                    share * 100.0,
                    self.governor.scale_max()
                ))
            }
            None if self.windows.gaps() > 0 => (self.governor.scale_max(), self.windows.gaps()),
            None => return None,
        };
        Some(format!(
            "the always-on lock hooks' base cost (runs on every context switch and wake-up, \
             which no sampling lowers) was above their share of the budget: they were attached \
             in windows of {} ms, down to one in {scale} ({gaps} gaps), and the waits seen in \
             them scaled to the session",
            hook_windows::WINDOW.as_millis()
        ))
    }

    /// Reads the futex programs' cost and sets the stride it calls for.
    fn tick(&mut self, probes: &mut Probes) {
        self.due = Instant::now() + GOVERNOR_PERIOD;
        let Some(target_cpu_s) = cpu_time(self.pid) else {
            return;
        };
        let counters = probes.counters();
        let (_, run_ns) = probes.runs_of(&[
            programs::FUTEX_SWITCH,
            programs::FUTEX_WAKING,
            programs::KLOCK_BEGIN,
            programs::KLOCK_END,
        ]);
        let before = self.governor.stride();
        let now = Instant::now();
        let reading = Reading {
            at_s: self.windows.session_s(now),
            // Zero while traced waits ran: the kernel keeps no run times.
            run_ns: (run_ns > 0 || counters.futex_waits_traced == 0).then_some(run_ns),
            hit_ns: counters.futex_hit_ns,
            traced: counters.futex_waits_traced,
            skipped: counters.futex_waits_skipped,
            target_cpu_s,
            attached_s: self.windows.attached_s(now),
        };
        self.governor.observe(reading);
        let stride = self.governor.stride();
        if stride != before {
            tracing::debug!("futex hooks: stride {before} -> {stride}");
            probes.set_futex_stride(stride);
        }
    }
}

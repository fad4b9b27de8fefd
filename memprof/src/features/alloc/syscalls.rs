//! The allocator's syscalls (mmap, munmap, mremap, madvise, brk,
//! mprotect), seen through the raw `sys_enter`/`sys_exit` tracepoints.
//!
//! An enabled syscall tracepoint sends every syscall on the machine down
//! the kernel's slow path: measured here, a futex call that took 330 ns
//! took 470 ns with the allocator's syscall tracepoints attached, and a
//! lock/yield loop (three syscalls a round) ran at 0.83 of its speed with
//! them always on. So in sampled mode these hooks go with the allocator's
//! windows (attached while its probes are), and what they cost the
//! target — its syscall rate, counted by the enter program, times the
//! slow path's price — is charged to the windows, so that a program with
//! a quiet allocator but many syscalls gets short windows too. In full
//! mode they stay attached. They are attached before the probes'
//! calibration, so the latency it takes off each traced call includes
//! them (a return probe returns through a syscall on Linux 6.11+).
//! Raw tracepoint links go in an instant.

use std::time::Instant;

use aya::programs::raw_trace_point::RawTracePointLink;

use crate::{
    error::Result,
    kernel::{
        cputime::{online_cpus, threads},
        loader::Probes,
    },
};

/// What the hooks cost the target per syscall while attached, in seconds
/// of CPU: the slow path and the two programs' filter (measured on this
/// machine kind: +140 ns per futex call with six syscall tracepoints
/// enabled, +300 ns with a do-nothing raw `sys_enter` program, +600 ns
/// with enter and exit programs).
const COST_PER_SYSCALL_S: f64 = 0.6e-6;

/// The allocator's syscall hooks of one session.
pub struct SyscallHooks {
    links: Vec<RawTracePointLink>,
    /// When they were attached (or last measured), and the target's
    /// syscalls counted then.
    since: Option<(Instant, u64)>,
    /// The CPUs the target keeps busy at most (the cost of a syscall is
    /// a share of their time).
    cpus: f64,
    /// Windows the hooks were attached in.
    pub windows: u64,
}

impl SyscallHooks {
    /// Hooks for process `pid` (not attached yet).
    pub fn new(pid: u32) -> Self {
        Self {
            links: Vec::new(),
            since: None,
            cpus: threads(pid)
                .map_or(f64::INFINITY, f64::from)
                .min(online_cpus())
                .max(1.0),
            windows: 0,
        }
    }

    /// Attaches or detaches the hooks; returns whether they were just
    /// attached again (the caller's brk bookkeeping starts over: brk calls
    /// in the gap were not seen).
    pub fn follow(&mut self, probes: &mut Probes, attached: bool) -> Result<bool> {
        if attached && self.links.is_empty() {
            self.links = probes.attach_alloc_syscalls()?;
            self.since = Some((Instant::now(), probes.counters().syscalls_seen));
            self.windows += 1;
            return Ok(self.windows > 1);
        }
        if !attached && !self.links.is_empty() {
            self.links.clear();
            self.since = None;
        }
        Ok(false)
    }

    /// What the hooks cost the target per second attached since the last
    /// call (a fraction of its time), if they were attached long enough
    /// to tell.
    pub fn cost(&mut self, probes: &Probes) -> Option<f64> {
        let (since, seen_then) = self.since?;
        let secs = since.elapsed().as_secs_f64();
        if secs < 0.01 {
            return None;
        }
        let seen = probes.counters().syscalls_seen;
        self.since = Some((Instant::now(), seen));
        let rate = seen.saturating_sub(seen_then) as f64 / secs;
        Some(per_second_cost(rate, self.cpus))
    }

    /// Detaches the hooks for good.
    pub fn finish(&mut self) {
        self.links.clear();
        self.since = None;
    }
}

/// The share of a target's time syscall hooks take at `rate` syscalls a
/// second, for a target using `cpus` CPUs.
fn per_second_cost(rate: f64, cpus: f64) -> f64 {
    rate * COST_PER_SYSCALL_S / cpus.max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::budget::{BudgetConfig, DutyCycle};
    use std::time::Duration;

    #[test]
    fn a_quiet_allocator_with_many_syscalls_gets_short_windows() {
        // The lock/yield loop: no allocation, about a million syscalls a
        // second on two CPUs: the hooks alone cost 30% while attached.
        let extra = per_second_cost(1e6, 2.0);
        assert!((extra - 0.3).abs() < 1e-9);
        let mut cycle = DutyCycle::new(BudgetConfig {
            budget: 0.02,
            attach_cost_s: 0.0,
            ..BudgetConfig::default()
        });
        cycle.set_extra_cost(extra);
        assert!(cycle.duty(0.0) < 0.1, "{}", cycle.duty(0.0));
        cycle.observe_window(0, Duration::from_millis(200), Duration::from_millis(200));
        assert!(cycle.gap_after(0, Duration::from_millis(200)) >= Duration::from_secs(2));
        // A program making a hundred syscalls a second stays attached.
        cycle.set_extra_cost(per_second_cost(100.0, 2.0));
        assert_eq!(cycle.duty(0.0), 1.0);
    }
}

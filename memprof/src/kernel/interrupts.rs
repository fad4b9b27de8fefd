//! What one timer sample costs the thread it lands on, measured at
//! start-up.
//!
//! The sampler's BPF program runs for about a microsecond a sample (the
//! kernel's statistics say so), but the interrupt around it costs more,
//! and how much depends on the machine: on this project's VMs a timer
//! interrupt stops the thread for 12-16 µs (the hypervisor takes the timer
//! and the re-arming of the next one), on bare metal one or two. At 999 Hz
//! that is 1.4% of every sampled thread's time here, and more on a lock
//! convoy, where a holder stopped in an interrupt stops its waiters too.
//!
//! The measure: a thread of the profiler spins reading the clock, first
//! alone, then with a `cpu-clock` event of the session's period on itself,
//! in alternating rounds. Each interrupt shows as a gap between two clock
//! reads; the gaps' share of the time grows by the event's interrupts ×
//! their cost, so the cost per interrupt is that growth × the period. The
//! medians of the rounds are taken (a burst of other interrupts spoils one
//! round, not the result). Gaps long enough to be the thread preempted
//! are left out, and so is their time: the event's interrupts come only
//! while the thread runs.
//!
//! [`GapMeter`] and [`per_interrupt_ns`] are pure; [`measure`] spins.

use std::{
    os::fd::{FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

use super::precise::PerfEventAttr;

/// A clock read this much later than the one before it was interrupted
/// (a read takes tens of ns; a cache miss or two, well under this).
pub const GAP_NS: u64 = 500;
/// A longer gap is the thread preempted, not interrupted: left out of the
/// gaps and of the time (a busy machine's other threads take the CPU for
/// milliseconds; an interrupt, even through a hypervisor, takes tens of
/// µs).
pub const PREEMPTED_NS: u64 = 200_000;
/// How long each round spins, with and without the event.
const ROUND: Duration = Duration::from_millis(20);
/// Rounds of each kind.
const ROUNDS: usize = 5;

/// Sums the gaps in a stream of clock reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GapMeter {
    first: Option<u64>,
    last: u64,
    pub gaps: u64,
    pub gap_ns: u64,
    /// Time the thread was preempted ([`PREEMPTED_NS`]).
    pub preempted_ns: u64,
}

impl GapMeter {
    /// Takes the next clock read, in ns.
    pub fn feed(&mut self, t_ns: u64) {
        if self.first.is_none() {
            self.first = Some(t_ns);
        } else {
            let d = t_ns.saturating_sub(self.last);
            if d > PREEMPTED_NS {
                self.preempted_ns += d;
            } else if d > GAP_NS {
                self.gaps += 1;
                self.gap_ns += d;
            }
        }
        self.last = t_ns;
    }

    /// The gaps' share of the time the thread ran so far.
    pub fn share(&self) -> f64 {
        let ran = match self.first {
            Some(first) => (self.last - first).saturating_sub(self.preempted_ns),
            None => 0,
        };
        if ran == 0 {
            0.0
        } else {
            self.gap_ns as f64 / ran as f64
        }
    }
}

/// The cost of one interrupt, in ns, from rounds of (gap share without the
/// event, gap share with it) at `period_ns` between interrupts: the growth
/// of the median share × the period, never below 0 (each kind's median on
/// its own, so a burst of other interrupts in one round of either kind
/// moves neither). None without rounds.
pub fn per_interrupt_ns(rounds: &[(f64, f64)], period_ns: u64) -> Option<f64> {
    let without = median(rounds.iter().map(|r| r.0).collect())?;
    let with = median(rounds.iter().map(|r| r.1).collect())?;
    Some(((with - without) * period_ns as f64).max(0.0))
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    })
}

/// Spins for `how_long`, reading the clock, and returns the gaps' share.
fn spin(how_long: Duration) -> f64 {
    let mut meter = GapMeter::default();
    let start = Instant::now();
    loop {
        let elapsed = start.elapsed();
        meter.feed(elapsed.as_nanos() as u64);
        if elapsed >= how_long {
            return meter.share();
        }
    }
}

/// A `cpu-clock` event on the calling thread, one interrupt every
/// `period_ns` while it runs (no program: the interrupt alone).
fn clock_event(period_ns: u64) -> std::io::Result<OwnedFd> {
    let attr = PerfEventAttr {
        type_: 1, // PERF_TYPE_SOFTWARE
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: 0, // PERF_COUNT_SW_CPU_CLOCK
        sample_period: period_ns,
        ..PerfEventAttr::default()
    };
    // SAFETY: perf_event_open with a valid, fully initialised attribute of
    // the size it declares; pid 0 + cpu -1 = the calling thread, any CPU.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            0 as libc::pid_t,
            -1 as libc::c_int,
            -1 as libc::c_int,
            8 as libc::c_ulong, // PERF_FLAG_FD_CLOEXEC
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Measures what one interrupt of a `frequency_hz` timer costs the thread
/// it lands on, in ns, on the calling thread (0.2 s of spinning). None
/// when the event cannot be opened.
pub fn measure(frequency_hz: u64) -> Option<f64> {
    let period_ns = 1_000_000_000 / frequency_hz.max(1);
    let mut rounds = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let without = spin(ROUND);
        let event = match clock_event(period_ns) {
            Ok(fd) => fd,
            Err(e) => {
                tracing::info!("sampler interrupt cost not measured: {e}");
                return None;
            }
        };
        let with = spin(ROUND);
        drop(event);
        rounds.push((without, with));
    }
    let cost = per_interrupt_ns(&rounds, period_ns);
    tracing::info!(
        "sampler interrupt: {:.1} µs each (gap shares without/with the event: {rounds:.4?})",
        cost.unwrap_or(0.0) / 1e3
    );
    cost
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_are_the_reads_far_apart() {
        let mut m = GapMeter::default();
        // Reads 50 ns apart for 1 ms, with two interrupts of 10 µs.
        let mut t = 0;
        for i in 0..20_000u64 {
            t += if i == 5_000 || i == 15_000 {
                10_000
            } else {
                50
            };
            m.feed(t);
        }
        assert_eq!(m.gaps, 2);
        assert_eq!(m.gap_ns, 20_000);
        assert!((m.share() - 20_000.0 / (t - 50) as f64).abs() < 1e-12);
        assert_eq!(GapMeter::default().share(), 0.0, "nothing read");
        // Preempted for 3 ms: neither a gap nor time run.
        let ran = (t - 50) + 20_000 * 50;
        m.feed(t + 3_000_000);
        for _ in 0..20_000 {
            m.feed(m.last + 50);
        }
        assert_eq!((m.gaps, m.preempted_ns), (2, 3_000_000));
        assert!(
            (m.share() - 20_000.0 / ran as f64).abs() < 1e-12,
            "{}",
            m.share()
        );
    }

    #[test]
    fn the_cost_is_the_growth_of_the_gaps_times_the_period() {
        // A 1 ms period: 1.4% more of the time in gaps is 14 µs each; a
        // round spoiled on either side moves nothing.
        let rounds = [
            (0.006, 0.020),
            (0.030, 0.020),
            (0.006, 0.060),
            (0.006, 0.020),
            (0.006, 0.020),
        ];
        let ns = per_interrupt_ns(&rounds, 1_000_000).unwrap();
        assert!((ns - 14_000.0).abs() < 1e-6, "{ns}");
        // Fewer gaps with the event (noise) is no cost, not a negative one.
        assert_eq!(per_interrupt_ns(&[(0.01, 0.009)], 1_000_000), Some(0.0));
        assert_eq!(per_interrupt_ns(&[], 1_000_000), None);
        let even = per_interrupt_ns(&[(0.0, 0.01), (0.0, 0.02)], 1_000_000).unwrap();
        assert!((even - 15_000.0).abs() < 1e-6);
    }
}

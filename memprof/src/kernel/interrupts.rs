//! What one timer sample costs the thread it lands on, measured at
//! start-up.
//!
//! The sampler's BPF program runs for about a microsecond a sample (the
//! kernel's statistics say so), but the interrupt around it costs more,
//! and how much depends on the machine: on this project's VMs a timer
//! interrupt stops the thread for 12-30 µs (the hypervisor takes the timer
//! and the re-arming of the next one; the cost moves within seconds with
//! the host's load, so a measure is an estimate, good to about a factor
//! of 1.7 there), on bare metal one or two. At 999 Hz that is 1.2-3% of
//! every sampled thread's time here, and more on a lock convoy, where a
//! holder stopped in an interrupt stops its waiters too.
//!
//! The measure: a thread of the profiler spins reading the clock, first
//! alone, then with a `cpu-clock` event of a 250 µs period on itself, in
//! alternating rounds. Each interrupt shows as a gap between two clock
//! reads; the gaps' share of the time grows by the event's interrupts ×
//! their cost, so the cost per interrupt is that growth × the period. The
//! least round of each kind is taken (a burst of other interrupts, or a
//! slow start, spoils some rounds, not the result). Gaps long enough to be
//! the thread preempted are left out, and so is their time: the event's
//! interrupts come only while the thread runs.
//!
//! [`GapMeter`] and [`per_interrupt_ns`] are pure; [`measure`] spins.

use std::{
    os::fd::OwnedFd,
    time::{Duration, Instant},
};

use super::precise::{perf_event_open, PerfEventAttr};

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
/// The measuring event's period: 250 µs, 80 interrupts a round whatever
/// the session's rate (an interrupt costs about the same at any rate; at
/// the session's own, a 1 Hz session would see none). At 4 kHz the
/// interrupts' share (5% here) stands well above the noise of the share
/// without them (±0.3 points between rounds, ±3 µs an interrupt at 1 ms:
/// ±0.8 µs at this period).
const PERIOD_NS: u64 = 250_000;

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
/// of the least share × the period, never below 0. Whatever else stops
/// the thread only adds gaps, so each kind's least round is the one least
/// disturbed (measured: the first rounds of a session that starts while
/// the machine is busy can see twice the gaps). None without rounds.
pub fn per_interrupt_ns(rounds: &[(f64, f64)], period_ns: u64) -> Option<f64> {
    let least = |side: fn(&(f64, f64)) -> f64| rounds.iter().map(side).reduce(f64::min);
    let (without, with) = (least(|r| r.0)?, least(|r| r.1)?);
    Some(((with - without) * period_ns as f64).max(0.0))
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
/// [`PERIOD_NS`] while it runs (no program: the interrupt alone).
fn clock_event() -> std::io::Result<OwnedFd> {
    let attr = PerfEventAttr {
        type_: 1, // PERF_TYPE_SOFTWARE
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: 0, // PERF_COUNT_SW_CPU_CLOCK
        sample_period: PERIOD_NS,
        ..PerfEventAttr::default()
    };
    perf_event_open(&attr, 0, -1)
}

/// Where a measure is kept for the sessions after it: `/run` is cleared
/// at boot, and the boot id in the file is checked besides.
const CACHE_DIR: &str = "/run/memprof-ebpf";
const CACHE_FILE: &str = "interrupt-cost";
/// How long a kept measure is used: the interrupt's cost is the machine's
/// (its hypervisor's), but a VM may move to another host.
const CACHE_FOR: Duration = Duration::from_secs(3600);

/// What one timer interrupt costs, in ns: this boot's measure from the
/// last hour if one was kept, else [`measure`]d now and kept. The measure
/// spins a CPU for 0.2 s, 37% of the loader's CPU time in a 3 s session
/// attached to a running program (perf, cpu-clock), taken from the
/// target's CPUs; the value is the machine's, not the session's.
/// Returns the cost and whether it was measured now.
pub fn cost() -> (Option<f64>, bool) {
    let dir = std::path::Path::new(CACHE_DIR);
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok();
    let boot = boot.as_deref().map(str::trim);
    if let Some(ns) = boot.and_then(|b| kept(&dir.join(CACHE_FILE), b)) {
        tracing::info!(
            "sampler interrupt: {:.1} µs each (kept from this boot)",
            ns / 1e3
        );
        return (Some(ns), false);
    }
    let ns = measure();
    if let (Some(ns), Some(boot)) = (ns, boot) {
        if let Err(e) = keep(dir, boot, ns) {
            tracing::debug!("sampler interrupt cost not kept: {e}");
        }
    }
    (ns, true)
}

/// The cost kept in `file` for boot `boot`, unless older than
/// [`CACHE_FOR`].
fn kept(file: &std::path::Path, boot: &str) -> Option<f64> {
    let age = std::fs::metadata(file)
        .ok()?
        .modified()
        .ok()?
        .elapsed()
        .ok()?;
    if age > CACHE_FOR {
        return None;
    }
    parse_kept(&std::fs::read_to_string(file).ok()?, boot)
}

/// The cost in a kept file's text ("BOOT_ID NS"), if it is boot `boot`'s.
fn parse_kept(text: &str, boot: &str) -> Option<f64> {
    let (id, ns) = text.trim().split_once(' ')?;
    let ns: f64 = ns.parse().ok()?;
    (id == boot && ns.is_finite() && ns >= 0.0).then_some(ns)
}

/// Keeps `ns` for boot `boot` in `dir` (root's only), replaced whole.
fn keep(dir: &std::path::Path, boot: &str, ns: f64) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let tmp = dir.join(format!(".{CACHE_FILE}.{}", std::process::id()));
    std::fs::write(&tmp, format!("{boot} {ns:.0}\n"))?;
    std::fs::rename(&tmp, dir.join(CACHE_FILE))
}

/// Measures what one timer interrupt costs the thread it lands on, in ns,
/// on the calling thread (0.2 s of spinning). None when the event cannot
/// be opened.
pub fn measure() -> Option<f64> {
    let mut rounds = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let without = spin(ROUND);
        let event = match clock_event() {
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
    let cost = per_interrupt_ns(&rounds, PERIOD_NS);
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
    fn a_kept_cost_is_this_boots_only() {
        let boot = "0b1c-2d";
        assert_eq!(parse_kept("0b1c-2d 12345\n", boot), Some(12345.0));
        assert_eq!(parse_kept("ffff-00 12345\n", boot), None, "another boot");
        assert_eq!(parse_kept("0b1c-2d NaN", boot), None);
        assert_eq!(parse_kept("0b1c-2d", boot), None);
        assert_eq!(parse_kept("", boot), None);
    }

    #[test]
    fn a_kept_cost_is_read_back_and_ages_out() {
        let dir = std::env::temp_dir().join(format!("memprof-irq-{}", std::process::id()));
        keep(&dir, "b00t", 9876.4).expect("kept");
        let file = dir.join(CACHE_FILE);
        assert_eq!(kept(&file, "b00t"), Some(9876.0));
        assert_eq!(kept(&file, "other"), None);
        let old = std::time::SystemTime::now() - CACHE_FOR - Duration::from_secs(60);
        std::fs::File::options()
            .write(true)
            .open(&file)
            .and_then(|f| f.set_modified(old))
            .expect("aged");
        assert_eq!(kept(&file, "b00t"), None, "older than an hour");
        let _ = std::fs::remove_dir_all(&dir);
    }

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
        // A 1 ms period: 1.4% more of the time in gaps is 14 µs each;
        // rounds disturbed on either side (more gaps) move nothing.
        let rounds = [
            (0.006, 0.040),
            (0.030, 0.020),
            (0.006, 0.060),
            (0.007, 0.020),
            (0.006, 0.021),
        ];
        let ns = per_interrupt_ns(&rounds, 1_000_000).unwrap();
        assert!((ns - 14_000.0).abs() < 1e-6, "{ns}");
        // Fewer gaps with the event (noise) is no cost, not a negative one.
        assert_eq!(per_interrupt_ns(&[(0.01, 0.009)], 1_000_000), Some(0.0));
        assert_eq!(per_interrupt_ns(&[], 1_000_000), None);
    }
}

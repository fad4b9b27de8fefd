//! What the probes themselves add to a traced call, measured at start on
//! this machine, and taken off every latency.
//!
//! A traced call's duration runs from the end of the entry program to the
//! start of the return program: it includes the rest of the entry trap
//! (the probed instruction emulated by the kernel, or single-stepped out of
//! line: a second trap) and the return trap. On a VM here that is about
//! 0.4–1 µs, as much as a slow allocator's call and 20–50x glibc's small
//! malloc. The loader calibrates it by tracing functions of its own whose
//! bodies cost almost nothing, with the same programs and placements
//! (`features::alloc::calibrate`): their traced durations *are* the added
//! latency. Their spread is the resolution: a corrected latency below it
//! is shown as "< N ns", not as a number.
//!
//! The cost is not constant: a VM's vCPU runs the probe slower at times
//! (here, stretches of 50–100 ms in about one run in three, wherever the
//! loader and the target ran), and then every call in the stretch gets
//! ~300 ns more (glibc's small malloc was reported at p50 ~250 ns instead
//! of ~10). The entry program times its own run up to the call's start
//! ([`memprof_common::alloc::AllocEvent::pace_ns`]): 240–270 ns in quiet
//! stretches, 280–380 in slow ones (the clock reads in steps of ~10 ns).
//! The calibration keeps its quiet calls (paces within [`QUIET_NS`] of its
//! fastest), as it may itself fall in a slow stretch; a call whose pace
//! lies more than [`PACE_MARGIN_NS`] outside their 10–90% range has the
//! calibrated cost scaled by its pace over theirs. That under-corrects
//! slow calls slightly (the rest of the trap path slows a little more than
//! the program: they came out 50–70 ns high, against ~250 before).
//!
//! Pure: fed with the calibration's durations and paces.

/// How the probed instruction is handled, and which program pair runs:
/// the four combinations cost differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// Kernel-emulated instruction (`push`), allocating operation (reads
    /// the return address at entry and, for glibc, the chunk header at
    /// return).
    EmulatedAlloc,
    /// Kernel-emulated instruction, a free (reads nothing).
    EmulatedFree,
    /// Single-stepped instruction, allocating operation.
    SteppedAlloc,
    /// Single-stepped instruction, a free.
    SteppedFree,
}

impl ProbeKind {
    pub const ALL: [ProbeKind; 4] = [
        ProbeKind::EmulatedAlloc,
        ProbeKind::EmulatedFree,
        ProbeKind::SteppedAlloc,
        ProbeKind::SteppedFree,
    ];

    pub fn of(emulated: bool, free: bool) -> Self {
        match (emulated, free) {
            (true, false) => ProbeKind::EmulatedAlloc,
            (true, true) => ProbeKind::EmulatedFree,
            (false, false) => ProbeKind::SteppedAlloc,
            (false, true) => ProbeKind::SteppedFree,
        }
    }

    /// The report's name.
    pub fn name(self) -> &'static str {
        match self {
            ProbeKind::EmulatedAlloc => "emulated, allocation",
            ProbeKind::EmulatedFree => "emulated, free",
            ProbeKind::SteppedAlloc => "single-stepped, allocation",
            ProbeKind::SteppedFree => "single-stepped, free",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The calibration of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindCost {
    /// Median traced duration of a function whose body costs (almost)
    /// nothing: the latency the probes add.
    pub added_ns: u64,
    /// Interquartile range of those durations.
    pub spread_ns: u64,
    /// What one traced call costs the caller in all (entry and return
    /// traps, programs), from the wall time of the calls with and without
    /// the probes.
    pub cpu_ns: u64,
    /// Calls measured.
    pub calls: u64,
    /// The entry program's run time in the quiet calibration calls:
    /// median, and the range of the middle 80% widened by
    /// [`PACE_MARGIN_NS`] (within it the cost is taken as calibrated).
    pub pace_ns: u32,
    pub pace_range_ns: (u32, u32),
}

/// The probes' own cost per kind, as calibrated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeCost {
    kinds: [Option<KindCost>; 4],
}

/// Fewest calls a kind must have been measured with to be used.
pub const MIN_CALLS: usize = 100;
/// Calibration calls whose pace is within this of the fastest (their 5th
/// percentile) are the quiet ones the calibration is made of.
pub const QUIET_NS: u64 = 25;
/// How far outside the quiet calls' 10–90% pace range a call's pace must
/// lie for its cost to be scaled: half a step of the clock (the range is
/// at least two steps either side of the median). Quiet calls read
/// 240–270 ns, and a slow stretch starts at 280 with ~120 ns more
/// latency; a margin of 20 left those unscaled (p50 99 ns in one run of
/// 12).
pub const PACE_MARGIN_NS: u32 = 5;
/// The step the BPF clock reads in here (kvm-clock).
const CLOCK_STEP_NS: u64 = 10;

/// One kind's calibration calls: (duration less the body's own time,
/// pace), and the per-call wall-time cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    pub kind: ProbeKind,
    pub calls: Vec<(u64, u32)>,
    pub cpu_ns: u64,
}

/// The quantile function of `values` (nearest rank).
fn quantiles(values: impl Iterator<Item = u64>) -> impl Fn(f64) -> u64 {
    let mut v: Vec<u64> = values.collect();
    v.sort_unstable();
    move |q: f64| v[((v.len() - 1) as f64 * q).round() as usize]
}

impl ProbeCost {
    /// From each kind's traced (duration, pace) pairs and its per-call
    /// wall-time cost (`cpu_ns`). Kinds with fewer than [`MIN_CALLS`]
    /// calls stay uncalibrated (nothing is subtracted for them).
    pub fn from_samples(samples: &[Calibration]) -> Self {
        let mut cost = Self::default();
        for c in samples {
            if c.calls.len() < MIN_CALLS {
                continue;
            }
            let fastest = quantiles(c.calls.iter().map(|&(_, p)| u64::from(p)))(0.05);
            let quiet: Vec<(u64, u32)> = (c.calls.iter().copied())
                .filter(|&(_, p)| u64::from(p) <= fastest + QUIET_NS)
                .collect();
            let calls = if quiet.len() >= MIN_CALLS {
                &quiet
            } else {
                &c.calls
            };
            let durations = quantiles(calls.iter().map(|&(d, _)| d));
            let paces = quantiles(calls.iter().map(|&(_, p)| u64::from(p)));
            let margin = u64::from(PACE_MARGIN_NS);
            cost.kinds[c.kind.index()] = Some(KindCost {
                added_ns: durations(0.5),
                spread_ns: durations(0.75) - durations(0.25),
                cpu_ns: c.cpu_ns,
                calls: calls.len() as u64,
                pace_ns: paces(0.5) as u32,
                // At least two clock steps either side of the median: the
                // clock reads in steps of ~10 ns, a calibration whose calls
                // mostly read one value has a range of one point, and with
                // one step a quiet call one step off had its cost scaled up
                // by ~55 ns (slowalloc's 3 µs malloc came out at 2,985 ns);
                // the slow stretches start three steps up.
                pace_range_ns: (
                    paces(0.1)
                        .min(paces(0.5).saturating_sub(2 * CLOCK_STEP_NS))
                        .saturating_sub(margin) as u32,
                    (paces(0.9).max(paces(0.5) + 2 * CLOCK_STEP_NS) + margin) as u32,
                ),
            });
        }
        cost
    }

    pub fn kind(&self, kind: ProbeKind) -> Option<KindCost> {
        self.kinds[kind.index()]
    }

    /// Whether any kind was calibrated.
    pub fn is_calibrated(&self) -> bool {
        self.kinds.iter().any(Option::is_some)
    }

    /// The latency a traced call of `kind` really had: `duration_ns` less
    /// what the probes add at the call's `pace_ns` (never below 0), and
    /// whether that cost was scaled by the pace (see [`Self::added_at`]).
    pub fn correct(&self, kind: ProbeKind, duration_ns: u64, pace_ns: u32) -> (u64, bool) {
        let (added, scaled) = self.added_at(kind, pace_ns);
        (duration_ns.saturating_sub(added), scaled)
    }

    /// What the probes add to a call of `kind` run at `pace_ns`, and
    /// whether the pace was outside the calibration's range (the cost
    /// scaled).
    pub fn added_at(&self, kind: ProbeKind, pace_ns: u32) -> (u64, bool) {
        let Some(k) = self.kind(kind) else {
            return (0, false);
        };
        let (low, high) = k.pace_range_ns;
        if pace_ns == 0 || k.pace_ns == 0 || (low..=high).contains(&pace_ns) {
            return (k.added_ns, false);
        }
        let scaled = k.added_ns as f64 * f64::from(pace_ns) / f64::from(k.pace_ns);
        (scaled.round() as u64, true)
    }

    /// The most the probes add to a call, of the calibrated kinds among
    /// `used` (0 when none is).
    pub fn largest_added_ns(&self, used: &[ProbeKind]) -> u64 {
        used.iter()
            .filter_map(|&kind| self.kind(kind))
            .map(|k| k.added_ns)
            .max()
            .unwrap_or(0)
    }

    /// Below this a corrected latency cannot be told from zero: the
    /// largest spread of the calibrated kinds among `used` (at least 1 ns).
    pub fn resolution_ns(&self, used: &[ProbeKind]) -> u64 {
        used.iter()
            .filter_map(|&kind| self.kind(kind))
            .map(|k| k.spread_ns)
            .max()
            .unwrap_or(0)
            .max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 200 calls of `kind` around `center` ns: center-10 .. center+10,
    /// evenly, at paces 250..=270.
    fn around(kind: ProbeKind, center: u64, cpu_ns: u64) -> Calibration {
        let calls = (0..200)
            .map(|i| (center - 10 + i % 21, 250 + (i % 21) as u32))
            .collect();
        Calibration {
            kind,
            calls,
            cpu_ns,
        }
    }

    #[test]
    fn each_kind_is_its_median_with_its_spread() {
        let cost = ProbeCost::from_samples(&[
            around(ProbeKind::EmulatedAlloc, 400, 1500),
            around(ProbeKind::SteppedFree, 900, 3000),
        ]);
        let k = cost.kind(ProbeKind::EmulatedAlloc).expect("calibrated");
        assert_eq!((k.added_ns, k.cpu_ns, k.calls), (400, 1500, 200));
        assert_eq!((k.pace_ns, k.pace_range_ns), (260, (235, 285)));
        assert!((9..=11).contains(&k.spread_ns), "{k:?}");
        assert_eq!(cost.kind(ProbeKind::EmulatedFree), None);
        assert!(cost.is_calibrated());
        assert_eq!(cost.resolution_ns(&ProbeKind::ALL), k.spread_ns);
        // The stepped free's 900 ns; an uncalibrated kind counts nothing.
        assert_eq!(cost.largest_added_ns(&ProbeKind::ALL), 900);
        assert_eq!(cost.largest_added_ns(&[ProbeKind::EmulatedAlloc]), 400);
        assert_eq!(cost.largest_added_ns(&[ProbeKind::EmulatedFree]), 0);
        // Only the kinds in use count.
        assert_eq!(cost.resolution_ns(&[ProbeKind::EmulatedFree]), 1);
    }

    #[test]
    fn correction_takes_the_added_latency_off_and_stops_at_zero() {
        let cost = ProbeCost::from_samples(&[around(ProbeKind::EmulatedAlloc, 400, 1)]);
        assert_eq!(cost.correct(ProbeKind::EmulatedAlloc, 3400, 260).0, 3000);
        assert_eq!(cost.correct(ProbeKind::EmulatedAlloc, 300, 255).0, 0);
        // An uncalibrated kind is left as measured.
        assert_eq!(cost.correct(ProbeKind::SteppedAlloc, 3400, 260).0, 3400);
    }

    #[test]
    fn a_call_run_at_another_pace_has_the_cost_scaled() {
        let cost = ProbeCost::from_samples(&[around(ProbeKind::EmulatedAlloc, 400, 1)]);
        // Within the calibration's 10-90% pace range and its margin: as
        // calibrated.
        assert_eq!(cost.added_at(ProbeKind::EmulatedAlloc, 283), (400, false));
        // A slow stretch: the probe ran at 325 ns for 260 at calibration.
        assert_eq!(cost.added_at(ProbeKind::EmulatedAlloc, 325), (500, true));
        assert_eq!(
            cost.correct(ProbeKind::EmulatedAlloc, 3500, 325),
            (3000, true)
        );
        // Faster than calibrated.
        assert_eq!(cost.added_at(ProbeKind::EmulatedAlloc, 195), (300, true));
        // No pace (an older record, or none measured): as calibrated.
        assert_eq!(cost.added_at(ProbeKind::EmulatedAlloc, 0), (400, false));
    }

    #[test]
    fn a_calibration_partly_in_a_slow_stretch_keeps_its_quiet_calls() {
        // 300 quiet calls at 400 ns (paces 250-270), then 300 slow ones at
        // 550 ns (paces 340-360), as when a round falls in a slow stretch.
        let mut c = around(ProbeKind::EmulatedAlloc, 400, 1);
        c.calls.truncate(150);
        let mut slow = around(ProbeKind::EmulatedAlloc, 550, 1);
        slow.calls.iter_mut().for_each(|(_, p)| *p += 90);
        c.calls.extend(slow.calls);
        let cost = ProbeCost::from_samples(&[c]);
        let k = cost.kind(ProbeKind::EmulatedAlloc).unwrap();
        assert_eq!((k.added_ns, k.calls), (400, 150), "{k:?}");
        assert!(k.pace_ns < 275 && k.pace_range_ns.1 < 300, "{k:?}");
        // Paces spread evenly (250, 252, ... 648): too few calls near the
        // fastest to tell a quiet stretch, so all of them.
        let mut spread = around(ProbeKind::SteppedFree, 550, 1);
        (spread.calls.iter_mut().enumerate()).for_each(|(i, (_, p))| *p = 250 + 2 * i as u32);
        let k = ProbeCost::from_samples(&[spread])
            .kind(ProbeKind::SteppedFree)
            .unwrap();
        assert_eq!(k.calls, 200);
    }

    #[test]
    fn too_few_calls_or_none_calibrate_nothing() {
        let few = Calibration {
            kind: ProbeKind::EmulatedAlloc,
            calls: vec![(400, 260); 10],
            cpu_ns: 1,
        };
        let cost = ProbeCost::from_samples(&[few]);
        assert!(!cost.is_calibrated());
        assert_eq!(cost.resolution_ns(&ProbeKind::ALL), 1);
        assert_eq!(
            ProbeCost::default()
                .correct(ProbeKind::EmulatedFree, 5, 260)
                .0,
            5
        );
    }

    #[test]
    fn kinds_follow_placement_and_operation() {
        assert_eq!(ProbeKind::of(true, false), ProbeKind::EmulatedAlloc);
        assert_eq!(ProbeKind::of(false, true), ProbeKind::SteppedFree);
        let names: Vec<_> = ProbeKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), 4);
    }
}

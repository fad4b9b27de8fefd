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
//! Pure: fed with the calibration's durations.

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
}

/// The probes' own cost per kind, as calibrated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeCost {
    kinds: [Option<KindCost>; 4],
}

/// Fewest calls a kind must have been measured with to be used.
pub const MIN_CALLS: usize = 100;

impl ProbeCost {
    /// From each kind's traced durations and its per-call wall-time cost
    /// (`cpu_ns`). Kinds with fewer than [`MIN_CALLS`] durations stay
    /// uncalibrated (nothing is subtracted for them).
    pub fn from_samples(samples: &mut [(ProbeKind, Vec<u64>, u64)]) -> Self {
        let mut cost = Self::default();
        for (kind, durations, cpu_ns) in samples.iter_mut() {
            if durations.len() < MIN_CALLS {
                continue;
            }
            durations.sort_unstable();
            let at = |q: f64| durations[((durations.len() - 1) as f64 * q).round() as usize];
            cost.kinds[kind.index()] = Some(KindCost {
                added_ns: at(0.5),
                spread_ns: at(0.75) - at(0.25),
                cpu_ns: *cpu_ns,
                calls: durations.len() as u64,
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
    /// what the probes add (never below 0).
    pub fn correct(&self, kind: ProbeKind, duration_ns: u64) -> u64 {
        duration_ns.saturating_sub(self.kind(kind).map_or(0, |k| k.added_ns))
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

    /// 200 durations around `center`: center-10 .. center+10, evenly.
    fn around(center: u64) -> Vec<u64> {
        (0..200).map(|i| center - 10 + i % 21).collect()
    }

    #[test]
    fn each_kind_is_its_median_with_its_spread() {
        let cost = ProbeCost::from_samples(&mut [
            (ProbeKind::EmulatedAlloc, around(400), 1500),
            (ProbeKind::SteppedFree, around(900), 3000),
        ]);
        let k = cost.kind(ProbeKind::EmulatedAlloc).expect("calibrated");
        assert_eq!((k.added_ns, k.cpu_ns, k.calls), (400, 1500, 200));
        assert!((9..=11).contains(&k.spread_ns), "{k:?}");
        assert_eq!(cost.kind(ProbeKind::EmulatedFree), None);
        assert!(cost.is_calibrated());
        assert_eq!(cost.resolution_ns(&ProbeKind::ALL), k.spread_ns);
        // Only the kinds in use count.
        assert_eq!(cost.resolution_ns(&[ProbeKind::EmulatedFree]), 1);
    }

    #[test]
    fn correction_takes_the_added_latency_off_and_stops_at_zero() {
        let cost = ProbeCost::from_samples(&mut [(ProbeKind::EmulatedAlloc, around(400), 1)]);
        assert_eq!(cost.correct(ProbeKind::EmulatedAlloc, 3400), 3000);
        assert_eq!(cost.correct(ProbeKind::EmulatedAlloc, 300), 0);
        // An uncalibrated kind is left as measured.
        assert_eq!(cost.correct(ProbeKind::SteppedAlloc, 3400), 3400);
    }

    #[test]
    fn too_few_calls_or_none_calibrate_nothing() {
        let cost = ProbeCost::from_samples(&mut [(ProbeKind::EmulatedAlloc, vec![400; 10], 1)]);
        assert!(!cost.is_calibrated());
        assert_eq!(cost.resolution_ns(&ProbeKind::ALL), 1);
        assert_eq!(ProbeCost::default().correct(ProbeKind::EmulatedFree, 5), 5);
    }

    #[test]
    fn kinds_follow_placement_and_operation() {
        assert_eq!(ProbeKind::of(true, false), ProbeKind::EmulatedAlloc);
        assert_eq!(ProbeKind::of(false, true), ProbeKind::SteppedFree);
        let names: Vec<_> = ProbeKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), 4);
    }
}

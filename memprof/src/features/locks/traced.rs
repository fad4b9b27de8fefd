//! What the lock uprobes add to the report: acquisitions (scaled by the
//! calls the kernel counted), hold times and critical sections of each
//! lock, the locks not listed one by one as one "other locks" entry, and
//! the rules that keep the numbers consistent with the waits.

use std::collections::HashMap;

use memprof_common::locks::lock_op;

use super::{
    analysis::{Durations, HoldStats, LockProfile},
    holds::OTHER_SITES,
    sites::{key, SiteKey, SITES},
};
use crate::{
    kernel::{
        calls::{
            CallEstimate, FEW_WINDOWS_ERROR_FLOOR, MAX_ACQUISITIONS_ERROR, RATE_ERROR_FLOOR,
            WINDOWS_FOR_SPREAD,
        },
        maps::Counters,
        windows::{Mode, Windowed},
    },
    report::{
        model::{
            source_label, LockAddress, LockEntry, LockKind, LockTracing, SectionEntry, TraceMode,
        },
        names::Names,
    },
};

/// How the lock uprobes ran, for the report.
pub fn tracing(
    tracer: Option<&Windowed>,
    estimate: Option<&CallEstimate>,
    counters: &Counters,
) -> Option<LockTracing> {
    let tracer = tracer?;
    let mut functions: Vec<String> = tracer.ops().into_iter().map(function).collect();
    functions.sort();
    functions.dedup();
    let mut always: Vec<String> = tracer.resident_ops().into_iter().map(function).collect();
    always.sort();
    always.dedup();
    let (traced_fraction, acquisitions_error) = match (tracer.settings.mode, estimate) {
        // Never attached: the default mode waits for a futex wait.
        (Mode::Sampled, _) if tracer.windows == 0 => (0.0, None),
        (Mode::Sampled, Some(e)) => (e.traced_fraction, e.error),
        _ => (1.0, None),
    };
    Some(LockTracing {
        mode: match tracer.settings.mode {
            Mode::Sampled => TraceMode::Sampled,
            Mode::Full | Mode::Floor => TraceMode::Full,
        },
        library: tracer.path.to_string(),
        traced_fraction,
        acquisitions_error,
        windows: tracer.windows,
        functions,
        always_traced: always,
        sections_lost: counters.hold_events_lost,
        unmatched_unlocks: counters.unmatched_unlocks,
        held_overflow: counters.held_overflow,
    })
}

/// A probed function as the report names it: `pthread_mutex_lock`'s path
/// for other mutex kinds is probed apart (and may stay attached while the
/// main path is not).
fn function(op: u32) -> String {
    if op == lock_op::MUTEX_LOCK_OTHER_KINDS {
        format!("{} (other mutex kinds)", lock_op::symbol(op))
    } else {
        lock_op::symbol(op).to_string()
    }
}

/// The note saying how acquisitions were estimated.
pub fn estimate_note(t: &LockTracing, e: &CallEstimate) -> Option<String> {
    let error = t.acquisitions_error?;
    Some(format!(
        "lock calls were traced {:.1}% of the time ({} windows) to stay within the budget; \
         acquisitions are scaled estimates: the calls the kernel counted while attached, extrapolated \
         over each gap at the rate of the window before it (corrected for the probes' slowdown \
         of the target), shared among the locks as their sections were seen; claimed error \
         ±{:.0}% (the spread of the windows' rates, as large as so few windows allow it to be, \
         their counting noise, the slowdown correction, and a floor for changes no window saw: \
         {:.0}%, or {:.0}% with fewer than {} windows, which stands for their spread and the \
         correction unless either is larger); {}",
        t.traced_fraction * 100.0,
        t.windows,
        error * 100.0,
        RATE_ERROR_FLOOR * 100.0,
        FEW_WINDOWS_ERROR_FLOOR * 100.0,
        WINDOWS_FOR_SPREAD,
        if error <= MAX_ACQUISITIONS_ERROR {
            "a lock with few sections seen is rougher".to_string()
        } else {
            format!(
                "above {:.0}%, so acquisitions are unknown (null; the critical sections seen \
                 are listed as seen, and contentions stay exact): {}",
                MAX_ACQUISITIONS_ERROR * 100.0,
                e.why_rough()
            )
        }
    ))
}

/// How each operation's sections seen are scaled to acquisitions.
#[derive(Debug, Clone, PartialEq)]
pub struct Scale {
    /// Per operation; None when its estimate is too rough to show (its
    /// claimed error above [`MAX_ACQUISITIONS_ERROR`]).
    factors: Vec<Option<f64>>,
}

impl Scale {
    /// Every count as seen (every call traced).
    pub fn exact() -> Self {
        Self {
            factors: vec![Some(1.0); lock_op::COUNT as usize],
        }
    }

    /// From the calls the kernel counted and the sections seen per
    /// operation.
    pub fn new(estimate: &CallEstimate, profile: &LockProfile) -> Self {
        let seen = profile.hold_table().seen_by_op();
        Self {
            factors: (0..lock_op::COUNT as usize)
                .map(|op| estimate.shown_scale(op, seen[op], MAX_ACQUISITIONS_ERROR))
                .collect(),
        }
    }

    /// `n` calls of `op` seen, scaled; None when its estimate is unknown.
    fn scaled(&self, n: u64, op: u32) -> Option<f64> {
        match self.factors.get(op as usize) {
            Some(Some(f)) => Some(n as f64 * f),
            Some(None) if n > 0 => None,
            _ => Some(n as f64),
        }
    }

    fn acquisitions(&self, h: &HoldStats) -> Option<f64> {
        (h.acquired_by_op.iter().enumerate())
            .map(|(op, n)| self.scaled(*n, op as u32))
            .sum()
    }
}

/// What the lock uprobes add to a lock.
pub(super) struct Traced {
    /// Scaled acquisitions and failed calls (rounded at the end); None
    /// once a part of them is unknown.
    acquisitions: Option<f64>,
    failed: Option<f64>,
    acquire: Durations,
    hold: Durations,
    /// (lock call site, release label) → (count, hold ns, longest hold).
    sections: HashMap<(SiteKey, Option<String>), (u64, u64, u64)>,
}

impl Traced {
    pub(super) fn new() -> Self {
        Self {
            acquisitions: Some(0.0),
            failed: Some(0.0),
            acquire: Durations::default(),
            hold: Durations::default(),
            sections: HashMap::new(),
        }
    }

    /// Adds one lock's uprobe statistics, scaled.
    pub(super) fn add(
        &mut self,
        profile: &LockProfile,
        h: &HoldStats,
        scale: &Scale,
        names: &mut dyn Names,
    ) {
        let add = |sum: Option<f64>, n: Option<f64>| Some(sum? + n?);
        self.acquisitions = add(self.acquisitions, scale.acquisitions(h));
        self.failed = add(self.failed, scale.scaled(h.failed, lock_op::MUTEX_TRYLOCK));
        self.acquire.add(&h.acquire);
        self.hold.add(&h.hold);
        for (&(lock_site, unlock_site), s) in &h.sections {
            if (lock_site, unlock_site) == OTHER_SITES {
                continue; // beyond the sites kept: in the totals only
            }
            let frame =
                |site: u64, names: &mut dyn Names| profile.site_place(site).map(|p| names.code(p));
            let Some(taken) = frame(lock_site, names) else {
                continue; // not mapped when seen
            };
            let released = frame(unlock_site, names)
                .map(|f| source_label(f.file.as_deref(), f.line, &f.module));
            let e = self.sections.entry((key(taken), released)).or_default();
            e.0 += s.count;
            e.1 += s.hold_ns;
            e.2 = e.2.max(s.hold_max_ns);
        }
    }

    /// Fills in what the uprobes add to a lock's entry, whose
    /// contentions are set.
    pub(super) fn fill(self, entry: &mut LockEntry) {
        let mut sections: Vec<SectionEntry> = self
            .sections
            .into_iter()
            .map(
                |(((function, file, line, module), released_at), (count, hold_ns, max))| {
                    SectionEntry {
                        function,
                        file,
                        line,
                        module,
                        released_at,
                        count,
                        hold_ns,
                        hold_max_ns: max,
                        delay_caused_ns: 0,
                    }
                },
            )
            .collect();
        sections.sort_by(|a, b| b.hold_ns.cmp(&a.hold_ns).then(b.count.cmp(&a.count)));
        sections.truncate(SITES);
        let acquisitions = self.acquisitions.map(|a| a.round() as u64);
        entry.acquisitions = acquisitions;
        entry.contention_rate = acquisitions
            .filter(|&a| a > 0)
            .map(|a| entry.contentions as f64 / a as f64);
        entry.failed_attempts = self.failed.map(|f| f.round() as u64);
        if !self.acquire.is_empty() {
            entry.acquire_p99_ns = Some(self.acquire.p99_ns());
            entry.acquire_max_ns = Some(self.acquire.max_ns);
        }
        if !self.hold.is_empty() {
            entry.hold_p99_ns = Some(self.hold.p99_ns());
            entry.hold_mean_ns = Some(self.hold.mean_ns());
            entry.hold_max_ns = Some(self.hold.max_ns);
            entry.hold_total_ns = Some(self.hold.total_ns);
            entry.hold_histogram = self.hold.log2_buckets();
        }
        entry.sections = sections;
    }
}

/// The name of the entry of the locks not listed one by one.
pub fn other_locks_name(locks: usize, lower_bound: bool) -> String {
    let plus = if lower_bound { "+" } else { "" };
    format!("other locks ({locks}{plus} taken, aggregated by lock call site)")
}

/// The locks the uprobes saw that are not listed one by one: those not
/// tracked individually (see `holds`) and `unlisted`, as one entry with
/// their critical sections by call site.
pub(super) fn other_locks_entry(
    profile: &LockProfile,
    unlisted: &[&HoldStats],
    scale: &Scale,
    names: &mut dyn Names,
) -> Option<LockEntry> {
    let other = &profile.hold_table().other;
    if other.is_empty() && unlisted.is_empty() {
        return None;
    }
    let (aggregated, lower_bound) = other.locks();
    let mut traced = Traced::new();
    traced.add(profile, &other.stats, scale, names);
    let mut threads = other.stats.thread_count();
    let mutex_taken = |h: &HoldStats| -> u64 {
        (h.acquired_by_op.iter().enumerate())
            .filter(|(op, _)| !lock_op::is_rwlock(*op as u32))
            .map(|(_, n)| n)
            .sum()
    };
    let mut mutexes = mutex_taken(&other.stats);
    for h in unlisted {
        traced.add(profile, h, scale, names);
        threads = threads.max(h.thread_count());
        mutexes += mutex_taken(h);
    }
    let mut entry = LockEntry {
        address: LockAddress::Other,
        name: Some(other_locks_name(
            aggregated + unlisted.len(),
            lower_bound || other.stats.threads_more,
        )),
        // Mutexes, unless only rwlocks were taken.
        kind: if mutexes == 0 {
            LockKind::Rwlock
        } else {
            LockKind::Mutex
        },
        threads,
        ..LockEntry::default()
    };
    traced.fill(&mut entry);
    Some(entry)
}

/// Makes the entries consistent: a lock acquired fewer times than it was
/// waited for (an estimate that came out low beyond its claim, or a waiter
/// that waited more than once per acquisition) shows its acquisitions as
/// unknown, and no contention rate. `acquisitions_error` is the claimed
/// relative error of estimated acquisitions (None: exact). Returns how
/// many were changed.
///
/// Both figures may be estimates: they contradict each other only when
/// the most the acquisitions may be is below the least the waits may be.
/// A lock whose every acquisition waits has the two equal in truth, so
/// any estimate a little low fell below the waits (bursty workload: the
/// estimate 3-16% low against a claim of ±32%, the waits 4-21% low;
/// unknown in 3 sessions of 10); its contention rate is then shown as
/// 100%.
pub fn make_consistent(entries: &mut [LockEntry], acquisitions_error: Option<f64>) -> usize {
    let mut changed = 0;
    for e in entries.iter_mut() {
        let least = match e.contention_error {
            Some(err) => (e.contentions as f64 * (1.0 - err)).floor() as u64,
            None => e.contentions,
        };
        let most = |a: u64| match acquisitions_error {
            Some(err) => (a as f64 * (1.0 + err)).ceil() as u64,
            None => a,
        };
        match e.acquisitions {
            Some(a) if most(a) < least => {
                e.acquisitions = None;
                e.contention_rate = None;
                changed += 1;
            }
            Some(a) if a > 0 => {
                e.contention_rate = Some((e.contentions as f64 / a as f64).min(1.0));
            }
            _ => e.contention_rate = None,
        }
    }
    changed
}

/// The note for [`make_consistent`]'s changes.
pub fn consistency_note(changed: usize) -> Option<String> {
    (changed > 0).then(|| {
        format!(
            "{changed} lock(s) had fewer acquisitions traced or estimated than futex waits, \
             beyond what either estimate claims (a waiter may wait more than once per \
             acquisition): their acquisitions are shown as unknown"
        )
    })
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use super::*;
    use crate::kernel::{
        calls::Doubt,
        uprobes::{Family, ProbePoint},
        windows::WindowSettings,
    };

    /// Lock uprobes in `mode`, nothing elapsed yet.
    fn tracer(points: Vec<ProbePoint>, mode: Mode) -> Windowed {
        let settings = WindowSettings {
            mode,
            budget: 0.05,
            aim: 0.8,
            trap_cost_s: 1e-6,
            trap_cost_error: 1.0,
            floor_holds_slowdown: true,
            window: Duration::from_millis(100),
            first_window: Duration::from_millis(100),
            max_gap: Duration::from_secs(1),
        };
        Windowed::new(
            Family::Locks,
            Arc::from("/usr/lib/libc.so.6"),
            points,
            settings,
            1,
        )
    }

    #[test]
    fn tracing_lists_the_probed_functions_once() {
        assert_eq!(tracing(None, None, &Counters::default()), None);
        let point = |op| ProbePoint { op, file_offset: 0 };
        let points = vec![
            point(lock_op::MUTEX_UNLOCK),
            point(lock_op::MUTEX_LOCK),
            point(lock_op::MUTEX_LOCK_OTHER_KINDS),
        ];
        let counters = Counters {
            hold_events_lost: 1,
            unmatched_unlocks: 2,
            held_overflow: 3,
            ..Counters::default()
        };
        let t = tracing(Some(&tracer(points, Mode::Floor)), None, &counters).unwrap();
        assert_eq!(t.mode, TraceMode::Full);
        assert_eq!(t.library, "/usr/lib/libc.so.6");
        assert_eq!(
            t.functions,
            [
                "pthread_mutex_lock",
                "pthread_mutex_lock (other mutex kinds)",
                "pthread_mutex_unlock"
            ]
        );
        assert!(t.always_traced.is_empty());
        assert_eq!(
            (t.sections_lost, t.unmatched_unlocks, t.held_overflow),
            (1, 2, 3)
        );
        let sampled = tracing(Some(&tracer(vec![], Mode::Sampled)), None, &counters).unwrap();
        assert_eq!(sampled.mode, TraceMode::Sampled);
    }

    fn entry(contentions: u64, acquisitions: Option<u64>) -> LockEntry {
        LockEntry {
            contentions,
            acquisitions,
            contention_rate: Some(9.0),
            ..LockEntry::default()
        }
    }

    #[test]
    fn sampled_contentions_contradict_only_below_their_error() {
        let mut entries = vec![entry(50, Some(45)), entry(50, Some(35))];
        for e in &mut entries {
            e.contention_error = Some(0.2);
        }
        assert_eq!(make_consistent(&mut entries, None), 1);
        assert_eq!(entries[0].acquisitions, Some(45));
        assert_eq!(entries[0].contention_rate, Some(1.0));
        assert_eq!(entries[1].acquisitions, None);
    }

    #[test]
    fn estimated_acquisitions_contradict_the_waits_only_beyond_both_claims() {
        // Every acquisition waits: the estimate 10% low (claim ±32%)
        // agrees with the waits; 40% low it does not.
        let mut entries = vec![entry(100, Some(90)), entry(100, Some(60))];
        for e in &mut entries {
            e.contention_error = Some(0.05);
        }
        assert_eq!(make_consistent(&mut entries, Some(0.32)), 1);
        assert_eq!(entries[0].acquisitions, Some(90));
        assert_eq!(entries[0].contention_rate, Some(1.0));
        assert_eq!(entries[1].acquisitions, None);
        assert_eq!(entries[1].contention_rate, None);
    }

    #[test]
    fn acquisitions_never_fall_below_contentions() {
        let mut entries = vec![
            entry(10, Some(40)),
            entry(50, Some(40)),
            entry(40, Some(40)),
            entry(0, Some(0)),
            entry(5, None),
        ];
        assert_eq!(make_consistent(&mut entries, None), 1);
        let seen: Vec<_> = entries
            .iter()
            .map(|e| (e.acquisitions, e.contention_rate))
            .collect();
        assert_eq!(
            seen,
            [
                (Some(40), Some(0.25)),
                (None, None),
                (Some(40), Some(1.0)),
                (Some(0), None),
                (None, None)
            ]
        );
        assert!(consistency_note(1).unwrap().contains("unknown"));
        assert_eq!(consistency_note(0), None);
    }

    #[test]
    fn the_other_kinds_path_is_named_apart() {
        assert_eq!(function(lock_op::MUTEX_LOCK), "pthread_mutex_lock");
        assert_eq!(
            function(lock_op::MUTEX_LOCK_OTHER_KINDS),
            "pthread_mutex_lock (other mutex kinds)"
        );
        assert_eq!(
            other_locks_name(12, true),
            "other locks (12+ taken, aggregated by lock call site)"
        );
    }

    #[test]
    fn scaling_uses_each_operation_s_factor() {
        let estimate = CallEstimate {
            calls: {
                let mut c = vec![0.0; lock_op::COUNT as usize];
                c[lock_op::MUTEX_LOCK as usize] = 3000.0;
                c[lock_op::RW_RDLOCK as usize] = 50.0;
                c
            },
            exact: {
                let mut e = vec![true; lock_op::COUNT as usize];
                e[lock_op::MUTEX_LOCK as usize] = false;
                e
            },
            traced_fraction: 0.1,
            error: Some(0.2),
            windows: 3,
            doubt: Some(Doubt::Spread { upper: 0.2, n: 3 }),
        };
        let mut p = LockProfile::new();
        for (lock, op) in [
            (1, lock_op::MUTEX_LOCK),
            (2, lock_op::MUTEX_LOCK),
            (2, lock_op::RW_RDLOCK),
        ] {
            for _ in 0..50 {
                p.add_section(crate::features::locks::holds::Section {
                    lock,
                    tid: 1,
                    op,
                    flags: 0,
                    acquire_ns: 1,
                    hold_ns: 1,
                    lock_site: 1,
                    unlock_site: 2,
                });
            }
        }
        let scale = Scale::new(&estimate, &p);
        // 100 mutex sections seen for 3000 calls: ×30; rwlock reads exact.
        let h = p.hold_table().get(2).unwrap();
        let acquired = scale.acquisitions(h).unwrap();
        assert!((acquired - (50.0 * 30.0 + 50.0)).abs() < 1e-9);
        assert_eq!(Scale::exact().acquisitions(h), Some(100.0));
        // Claimed ±68% (two windows): the windowed mutex calls are
        // unknown, so are the acquisitions of every lock taken by them;
        // a lock taken only by the exact rwlock path stays a number.
        let rough = CallEstimate {
            error: Some(0.68),
            windows: 2,
            doubt: Some(Doubt::Spread { upper: 0.7, n: 2 }),
            ..estimate.clone()
        };
        let scale = Scale::new(&rough, &p);
        assert_eq!(scale.acquisitions(h), None);
        let mut reads_only = LockProfile::new();
        for _ in 0..7 {
            reads_only.add_section(crate::features::locks::holds::Section {
                lock: 3,
                tid: 1,
                op: lock_op::RW_RDLOCK,
                flags: 0,
                acquire_ns: 1,
                hold_ns: 1,
                lock_site: 1,
                unlock_site: 2,
            });
        }
        let h = reads_only.hold_table().get(3).unwrap();
        assert_eq!(scale.acquisitions(h), Some(7.0));
        let t = LockTracing {
            mode: TraceMode::Sampled,
            library: "libc.so.6".into(),
            traced_fraction: 0.01,
            acquisitions_error: rough.error,
            windows: 2,
            functions: vec![],
            always_traced: vec![],
            sections_lost: 0,
            unmatched_unlocks: 0,
            held_overflow: 0,
        };
        let note = estimate_note(&t, &rough).unwrap();
        assert!(
            note.contains("±68%") && note.contains("acquisitions are unknown"),
            "{note}"
        );
        assert!(
            note.contains("the rate varied between the 2 windows that measured it (±70%"),
            "{note}"
        );
        let fine = estimate_note(
            &LockTracing {
                acquisitions_error: Some(0.38),
                ..t
            },
            &estimate,
        );
        assert!(!fine.unwrap().contains("unknown"));
    }
}

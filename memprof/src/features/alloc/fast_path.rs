//! The median latency of calls too short for the probes to time.
//!
//! A traced call's duration carries the probes' traps, taken off by the
//! calibration; what is left is known only to within the calibration's
//! spread (its resolution: 130-510 ns on these VMs), while a small malloc
//! takes 10-60 ns. The helper process's untraced loop ([`super::untraced`])
//! times the same allocator's malloc, free and calloc of a small block
//! without any trap, to a nanosecond. For a small malloc, free or calloc
//! whose traced median is below the resolution, or as near the loop's
//! cost as the correction can tell ([`agreement_ns`]), the two
//! measurements agree and the loop's is the finer: it becomes the median,
//! labelled so (`p50_basis`). A traced median further from the loop's
//! cost is the program's calls really being slower (contention, cold
//! caches, a slower path than the loop's) and stays. The mean, p99 and
//! max stay the traced calls': the loop says nothing of the slow tail.
//!
//! Measured (shims of 50 and 200 ns preloaded, `alloc loop` in full mode,
//! the workload's own untraced pair as truth): the corrected traced
//! medians were 25-60 ns high for malloc and 20 ns low for free with a
//! calibration spread of 10-29 ns; the loop's were within 2%.

use memprof_common::alloc_op;

use super::untraced::UntracedCost;
use crate::report::model::{AllocOp, LatencyBasis, OpStats, SizeClass};

/// How far a corrected traced latency is known to be off besides the
/// calibration's spread: the calls run at another pace than the
/// calibration's are left 50-70 ns high (see `analysis::probe_cost`), and
/// the traps slow the allocator's own code after them (its caches and
/// branch history; 25-60 ns measured on the shims above).
const CORRECTION_ERROR_NS: u64 = 70;
/// The same, relative to the call: the traps' effect on the call's body
/// grows with it (slowalloc's 1 us free read 17% high before the
/// calibration's body imitated an allocator's).
const CORRECTION_ERROR_SHARE: f64 = 0.15;

/// The same, relative to what the probes add to a call: the correction
/// scales that cost by each call's pace, and on a VM whose vCPU slows in
/// stretches the scaling misses by a share of it. Measured: mimalloc's
/// probes are single-stepped (4.8 us added a call), and in a run with 78%
/// of the calls at another pace than the calibration's the corrected
/// small-malloc median was 325 ns against a 4 ns loop (a 6% miss); a
/// 50 ns shim (emulated probes, ~1.1 us added) once read 330 ns against
/// its 100 ns (21%).
const ADDED_ERROR_SHARE: f64 = 0.25;

/// What the correction took off the traced calls and how finely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Correction {
    /// The calibration's spread (`probe_cost_ns.resolution_ns`).
    pub resolution_ns: u64,
    /// The largest cost the probes add to a call, of the kinds in use.
    pub added_ns: u64,
}

/// How far a traced median and the loop's cost `untraced` may differ and
/// still be one measurement of the same calls: the widest of the
/// correction's known errors.
fn agreement_ns(untraced: u64, c: Correction) -> u64 {
    let share = |ns: u64, of: f64| (ns as f64 * of).round() as u64;
    c.resolution_ns
        .max(CORRECTION_ERROR_NS)
        .max(share(untraced, CORRECTION_ERROR_SHARE))
        .max(share(c.added_ns, ADDED_ERROR_SHARE))
}

/// The operation's code when the untraced loop times it.
fn timed_op(op: AllocOp) -> Option<u32> {
    match op {
        AllocOp::Malloc => Some(alloc_op::MALLOC),
        AllocOp::Free => Some(alloc_op::FREE),
        AllocOp::Calloc => Some(alloc_op::CALLOC),
        _ => None,
    }
}

/// Gives the small timed operations' rows the untraced loop's cost as
/// their median where the traced median cannot tell it apart (None
/// when the probes were not calibrated: nothing changes). Returns how
/// many rows took it.
pub fn settle_medians(
    ops: &mut [OpStats],
    cost: &UntracedCost,
    correction: Option<Correction>,
) -> usize {
    let Some(correction) = correction else {
        return 0;
    };
    let mut settled = 0;
    for row in ops.iter_mut().filter(|r| r.class == SizeClass::Small) {
        let Some(op) = timed_op(row.op) else {
            continue;
        };
        let untraced = cost.of_op(op).round().max(1.0) as u64;
        let agrees = row
            .p50_ns
            .is_none_or(|traced| traced.abs_diff(untraced) <= agreement_ns(untraced, correction));
        // One distribution: the median is not above the traced p99 (below
        // the resolution when that is null).
        let p99_bound = row
            .p99_ns
            .unwrap_or(correction.resolution_ns.saturating_sub(1));
        if agrees && untraced <= p99_bound {
            row.p50_ns = Some(untraced);
            row.p50_basis = Some(LatencyBasis::UntracedLoop);
            settled += 1;
        }
    }
    settled
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::model::ThreadPhase;

    fn cost() -> UntracedCost {
        UntracedCost {
            malloc_ns: 20.0,
            free_ns: 10.0,
            calloc_ns: 40.0,
            pair_ns: 30.0,
            heap_spread: 0.0,
            rounds: 100,
            measurements: 4,
            drift: 0.01,
            pair_range_ns: [29.0, 31.0],
        }
    }

    /// A correction with this resolution, adding 200 ns a call.
    fn fine(resolution_ns: u64) -> Option<Correction> {
        Some(Correction {
            resolution_ns,
            added_ns: 200,
        })
    }

    fn row(op: AllocOp, class: SizeClass, p50_ns: Option<u64>) -> OpStats {
        OpStats {
            op,
            class,
            origin: None,
            phase: ThreadPhase::Serial,
            count: Some(10),
            traced: 10,
            mean_ns: p50_ns,
            p50_ns,
            p50_basis: p50_ns.map(|_| LatencyBasis::Traced),
            p99_ns: p50_ns,
            max_ns: p50_ns,
            histogram: vec![],
            syscalls: 0,
            syscall_ns: 0,
            page_faults: 0,
        }
    }

    #[test]
    fn below_the_resolution_the_loop_gives_the_median() {
        let mut ops = [
            row(AllocOp::Malloc, SizeClass::Small, None),
            row(AllocOp::Free, SizeClass::Small, None),
            row(AllocOp::Calloc, SizeClass::Small, None),
        ];
        assert_eq!(settle_medians(&mut ops, &cost(), fine(300)), 3);
        let p50: Vec<_> = ops.iter().map(|r| r.p50_ns).collect();
        // The batch and pair patterns agree here: each op's own cost.
        assert_eq!(p50, [Some(20), Some(10), Some(40)]);
        assert!(ops
            .iter()
            .all(|r| r.p50_basis == Some(LatencyBasis::UntracedLoop)));
        // The rest stays the traced calls' (unknown here).
        assert!(ops
            .iter()
            .all(|r| r.mean_ns.is_none() && r.p99_ns.is_none()));
    }

    #[test]
    fn slower_traced_calls_keep_their_own_median() {
        // 3 us traced against a 20 ns loop: the program's calls are slow.
        let mut ops = [row(AllocOp::Malloc, SizeClass::Small, Some(3_000))];
        assert_eq!(settle_medians(&mut ops, &cost(), fine(300)), 0);
        assert_eq!(ops[0].p50_ns, Some(3_000));
        assert_eq!(ops[0].p50_basis, Some(LatencyBasis::Traced));
        // Within the resolution of the loop: the loop's, the finer.
        let mut ops = [row(AllocOp::Malloc, SizeClass::Small, Some(250))];
        assert_eq!(settle_medians(&mut ops, &cost(), fine(300)), 1);
        assert_eq!(ops[0].p50_ns, Some(20));
        // A fine calibration still leaves the correction's known error.
        let mut ops = [
            row(AllocOp::Malloc, SizeClass::Small, Some(85)),
            row(AllocOp::Free, SizeClass::Small, Some(95)),
        ];
        assert_eq!(settle_medians(&mut ops, &cost(), fine(10)), 1);
        assert_eq!(ops.map(|r| r.p50_ns), [Some(20), Some(95)]);
    }

    #[test]
    fn the_median_stays_below_the_traced_p99() {
        // Two slow frees traced at ~0.9 us (p99 965 ns) and a 1,068 ns
        // loop: the traced median stays, the rows stay ordered.
        let mut slow = cost();
        slow.free_ns = 1_068.0;
        slow.malloc_ns = 1_068.0;
        slow.pair_ns = 2_136.0;
        let mut ops = [row(AllocOp::Free, SizeClass::Small, Some(965))];
        assert_eq!(settle_medians(&mut ops, &slow, fine(100)), 0);
        assert_eq!(ops[0].p50_ns, Some(965));
        // Every traced call below a 100 ns resolution: a 1 us loop is
        // another distribution.
        let mut ops = [row(AllocOp::Free, SizeClass::Small, None)];
        assert_eq!(settle_medians(&mut ops, &slow, fine(100)), 0);
        assert_eq!(ops[0].p50_ns, None);
    }

    #[test]
    fn the_agreement_is_the_widest_known_error() {
        let c = |resolution_ns, added_ns| Correction {
            resolution_ns,
            added_ns,
        };
        assert_eq!(agreement_ns(20, c(10, 200)), CORRECTION_ERROR_NS);
        assert_eq!(agreement_ns(20, c(300, 500)), 300);
        assert_eq!(agreement_ns(3_000, c(100, 500)), 450);
        // Single-stepped probes: the pace scaling's miss dominates.
        assert_eq!(agreement_ns(4, c(120, 4_800)), 1_200);
    }

    #[test]
    fn only_small_timed_operations_and_only_when_calibrated() {
        let mut ops = [
            row(AllocOp::Malloc, SizeClass::Large, None),
            row(AllocOp::Realloc, SizeClass::Small, None),
            row(AllocOp::Free, SizeClass::Unknown, None),
        ];
        assert_eq!(settle_medians(&mut ops, &cost(), fine(300)), 0);
        assert!(ops
            .iter()
            .all(|r| r.p50_ns.is_none() && r.p50_basis.is_none()));
        let mut ops = [row(AllocOp::Malloc, SizeClass::Small, None)];
        assert_eq!(settle_medians(&mut ops, &cost(), None), 0);
        assert_eq!(ops[0].p50_ns, None);
    }
}

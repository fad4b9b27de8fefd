//! Latency splits: what a call's latency is filed under (operation, size
//! class, new or reused address, serial or parallel phase) and the
//! histogram of each split.

use hdrhistogram::Histogram;
use memprof_common::alloc_op;

use super::AllocProfile;
use crate::features::latency_histogram;

/// Size class of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    Small,
    Large,
    Unknown,
}

impl Class {
    pub fn name(self) -> &'static str {
        match self {
            Class::Small => "small",
            Class::Large => "large",
            Class::Unknown => "unknown",
        }
    }
}

/// Whether the address handed out was handed out before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Origin {
    New,
    Reused,
}

impl Origin {
    pub fn name(self) -> &'static str {
        match self {
            Origin::New => "new",
            Origin::Reused => "reused",
        }
    }
}

/// One live thread in the target, or several.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    Serial,
    Parallel,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Serial => "serial",
            Phase::Parallel => "parallel",
        }
    }
}

/// A latency split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SplitKey {
    pub op: u32,
    pub class: Class,
    pub origin: Option<Origin>,
    pub phase: Phase,
}

/// Display name of an operation.
pub fn op_name(op: u32) -> &'static str {
    match op {
        alloc_op::NEW => "operator new",
        alloc_op::NEW_ARRAY => "operator new[]",
        alloc_op::DELETE => "operator delete",
        alloc_op::DELETE_ARRAY => "operator delete[]",
        op => alloc_op::SYMBOLS
            .get(op as usize)
            .copied()
            .unwrap_or("unknown"),
    }
}

/// Latency of one split.
#[derive(Debug, Clone)]
pub struct SplitStats {
    pub histogram: Histogram<u64>,
    /// Calls per log2 bucket of nanoseconds (bucket i: < 2^(i+1) ns).
    pub log2: [u64; 40],
    /// Syscalls made inside these calls, their time, and page faults.
    pub syscalls: u64,
    pub syscall_ns: u64,
    pub page_faults: u64,
}

impl SplitStats {
    pub(super) fn new() -> Self {
        Self {
            // 3 significant digits from 1 ns to ~18 minutes: fixed memory,
            // any latency fits.
            histogram: latency_histogram(),
            log2: [0; 40],
            syscalls: 0,
            syscall_ns: 0,
            page_faults: 0,
        }
    }

    pub(super) fn record(&mut self, ns: u64) {
        let ns = ns.clamp(1, 1 << 40);
        // Cannot fail: the value was clamped into the bounds.
        let _ = self.histogram.record(ns);
        let bucket = (63 - ns.leading_zeros()) as usize;
        self.log2[bucket.min(39)] += 1;
    }
}

impl AllocProfile {
    /// Latency splits, busiest first.
    pub fn splits(&self) -> Vec<(SplitKey, &SplitStats)> {
        let mut v: Vec<_> = self.splits.iter().map(|(k, s)| (*k, s)).collect();
        v.sort_by(|a, b| {
            b.1.histogram
                .len()
                .cmp(&a.1.histogram.len())
                .then(a.0.cmp(&b.0))
        });
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc_op::*;

    #[test]
    fn op_names() {
        assert_eq!(op_name(MALLOC), "malloc");
        assert_eq!(op_name(NEW_ARRAY), "operator new[]");
        assert_eq!(op_name(99), "unknown");
    }
}

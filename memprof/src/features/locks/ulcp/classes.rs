//! The classes of unnecessary lock contention: each hand-off pair is
//! classified by the shared words its two sides were sampled touching,
//! and a lock's verdict sums its pairs by class (see [`super::analysis`]
//! for where the sets come from).

use super::analysis::{LockUse, Participant, Stored, WordUse, CONFLICT_SHARE};
use crate::features::FastMap;

/// Whether two sides' conflicting uses of one word are redundant writes
/// of one constant: every sampled write to it, by anyone, in a section
/// or not (`everywhere`), stores the same constant at the same place, so
/// once written it never changes.
fn redundant(a: &WordUse, b: &WordUse, everywhere: Stored) -> bool {
    let constant = |s: Stored| matches!(s, Stored::Nothing) || s == everywhere;
    matches!(everywhere, Stored::Constant { .. }) && constant(a.stored) && constant(b.stored)
}

/// PerfPlay's classes of a pair of critical sections of one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// No shared memory touched by (at least) one of the two.
    Null,
    /// Both only read the shared memory they touch.
    ReadRead,
    /// They write shared memory, never the bytes the other touches.
    DisjointWrite,
    /// They touch the same data without conflict: every write to what
    /// both touch stores one constant.
    Benign,
    /// One writes bytes the other reads or writes.
    True,
}

impl Class {
    pub fn name(self) -> &'static str {
        match self {
            Class::Null => "null",
            Class::ReadRead => "read-read",
            Class::DisjointWrite => "disjoint-write",
            Class::Benign => "benign",
            Class::True => "true",
        }
    }

    pub fn unnecessary(self) -> bool {
        self != Class::True
    }
}

/// The shared words of a participant.
fn shared_words<'a>(
    p: &'a Participant,
    shared: &'a dyn Fn(u64) -> bool,
) -> impl Iterator<Item = (u64, &'a WordUse)> + 'a {
    p.words
        .iter()
        .filter(move |(w, _)| shared(**w))
        .map(|(w, u)| (*w, u))
}

/// The class of a pair of participants, from their shared words.
/// `shared` says whether an address is shared memory, `stored` what
/// every sampled write to a word stored.
pub fn pair_class(
    a: &Participant,
    b: &Participant,
    shared: &dyn Fn(u64) -> bool,
    stored: &dyn Fn(u64) -> Stored,
) -> Class {
    if a.words_unkept > 0 || b.words_unkept > 0 {
        return Class::True; // part of the sets is unknown: assume a conflict
    }
    let (mut any_a, mut any_b, mut writes, mut benign) = (false, false, false, false);
    for (w, ua) in shared_words(a, shared) {
        any_a = true;
        writes |= ua.writes > 0;
        if let Some(ub) = b.words.get(&w) {
            let conflict = (ua.write_bytes & ub.bytes()) | (ub.write_bytes & ua.bytes());
            if conflict != 0 {
                if !redundant(ua, ub, stored(w)) {
                    return Class::True;
                }
                benign = true;
            }
        }
    }
    for (_, ub) in shared_words(b, shared) {
        any_b = true;
        writes |= ub.writes > 0;
    }
    if benign {
        Class::Benign
    } else if !any_a || !any_b {
        Class::Null
    } else if !writes {
        Class::ReadRead
    } else {
        Class::DisjointWrite
    }
}

/// The probability that a conflicting access making up
/// [`CONFLICT_SHARE`] of the pair's accesses would have been sampled,
/// given `n` sampled accesses on the less sampled side.
pub fn confidence(n: u64) -> f64 {
    1.0 - (1.0 - CONFLICT_SHARE).powf(n as f64)
}

/// The hand-offs of one class.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ClassTotals {
    pub pairs: u64,
    pub wait_ns: u64,
    /// Wait-weighted confidence (see [`confidence`]).
    confidence_wait: f64,
}

/// A lock's hand-offs classified.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The class holding most of the wait.
    pub class: Class,
    pub by_class: Vec<(Class, ClassTotals)>,
    /// Hand-offs not classified: a side without any sampled access.
    pub unsampled: ClassTotals,
    /// Waits in classified hand-offs, and in unnecessary ones.
    pub wait_ns: u64,
    pub unnecessary_wait_ns: u64,
    /// Wait-weighted confidence of the unnecessary claims (1 for true
    /// contention, which a sampled conflict shows).
    pub confidence: f64,
    /// The least sampled accesses on a side of the class's pairs.
    pub min_accesses: u64,
    /// The most inferred accesses on the less inferred side of a pair
    /// ([`super::analysis::SectionCode`]).
    pub inferred: u64,
}

impl Verdict {
    /// Share of the waits behind unnecessary hand-offs.
    pub fn unnecessary_share(&self) -> f64 {
        if self.wait_ns == 0 {
            0.0
        } else {
            self.unnecessary_wait_ns as f64 / self.wait_ns as f64
        }
    }
}

pub(super) fn verdict(
    l: &LockUse,
    shared: &dyn Fn(u64) -> bool,
    stored: &dyn Fn(u64) -> Stored,
) -> Option<Verdict> {
    let mut totals: FastMap<Class, (ClassTotals, u64)> = FastMap::default();
    let mut unsampled = ClassTotals::default();
    let mut inferred = 0;
    let empty = Participant::default();
    for ((h, w), handoff) in &l.handoffs {
        let a = l.participants.get(h).unwrap_or(&empty);
        let b = l.participants.get(w).unwrap_or(&empty);
        // Nothing known of one side: no class at all. Inferred accesses
        // give a class, but not confidence (their instruction was seen
        // in the lock's sections; the sample itself was not).
        if a.accesses + a.inferred == 0 || b.accesses + b.inferred == 0 {
            unsampled.pairs += handoff.count;
            unsampled.wait_ns += handoff.wait_ns;
            continue;
        }
        let n = a.accesses.min(b.accesses);
        inferred = inferred.max(a.inferred.min(b.inferred));
        let class = pair_class(a, b, shared, stored);
        let (t, least) = totals
            .entry(class)
            .or_insert((ClassTotals::default(), u64::MAX));
        t.pairs += handoff.count;
        t.wait_ns += handoff.wait_ns;
        t.confidence_wait += confidence(n) * handoff.wait_ns as f64;
        *least = (*least).min(n);
    }
    let wait_ns: u64 = totals.values().map(|(t, _)| t.wait_ns).sum();
    if wait_ns == 0 {
        return None;
    }
    let (&class, &(top, least)) = totals
        .iter()
        .max_by_key(|(c, (t, _))| (t.wait_ns, **c == Class::True))?;
    let unnecessary: Vec<&ClassTotals> = totals
        .iter()
        .filter(|(c, _)| c.unnecessary())
        .map(|(_, (t, _))| t)
        .collect();
    let unnecessary_wait_ns = unnecessary.iter().map(|t| t.wait_ns).sum();
    let confidence = if class == Class::True {
        1.0
    } else {
        top.confidence_wait / top.wait_ns.max(1) as f64
    };
    let mut by_class: Vec<(Class, ClassTotals)> =
        totals.into_iter().map(|(c, (t, _))| (c, t)).collect();
    by_class.sort_by(|a, b| b.1.wait_ns.cmp(&a.1.wait_ns).then(a.0.cmp(&b.0)));
    Some(Verdict {
        class,
        by_class,
        unsampled,
        wait_ns,
        unnecessary_wait_ns,
        confidence,
        min_accesses: least,
        inferred,
    })
}

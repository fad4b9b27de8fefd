//! Unnecessary lock contention (PerfPlay's ULCPs), from sampled data
//! accesses and the critical sections the lock uprobes saw, without
//! replay.
//!
//! A sampled access belongs to the sections its thread was in when it was
//! taken (same clock, same thread: [`UlcpProfile::settle`] joins them a
//! little behind the newest record of both streams, whichever arrives
//! first). Each section's accesses go to its *participant*: the lock
//! call's site on one thread. A section whose lock call waited while
//! another thread's section held the lock was serialized behind it: that
//! pair (holder, waiter) is a *hand-off*, weighted by the overlap.
//!
//! At report time each hand-off is classified by the access sets of its
//! two participants, word by word, after leaving out the private memory
//! (pages only one thread was ever sampled touching: stacks, TLS, a
//! thread's own buffers; a page, not a line, because a shared table read
//! at random gets too few samples per line to see two threads on each). Sets are those of the whole session, so a pair
//! is called unnecessary only if its participants never touched the same
//! shared bytes in a conflicting way: conservative, where PerfPlay judges
//! each dynamic pair. Redundant writes of the same value (PerfPlay's
//! "benign" class) are seen where the code says the value: stores of one
//! immediate constant (`flag = 1`) by every sampled write to the words
//! the two sides share; a value computed at run time is not seen, and
//! such pairs are reported as true contention.

use std::collections::VecDeque;

use super::classes::verdict;
pub use super::classes::{confidence, pair_class, Class, ClassTotals, Verdict};
pub use super::sets::{Participant, Stored, WordUse};
use crate::features::FastMap;

pub const WORD_BYTES: u64 = 8;
pub const LINE_BYTES: u64 = 64;

/// Locks whose sections are analyzed one by one (the rest are counted).
pub const LOCKS_MAX: usize = 256;
/// Participants (site, thread) per lock.
pub const PARTICIPANTS_MAX: usize = 256;
/// Words remembered per participant, and in all (about 40 bytes each):
/// the bound on the analysis's memory whatever the locks.
pub const WORDS_MAX: usize = 4096;
pub const WORDS_TOTAL_MAX: usize = 1 << 20;
/// Hand-off pairs per lock.
pub const HANDOFFS_MAX: usize = 1024;
/// Words whose stored values are followed across every sampled write.
pub const STORED_WORDS_MAX: usize = 1 << 16;
/// Memory is private or shared page by page.
pub const PAGE_BYTES: u64 = 4096;
/// Pages whose threads are remembered; accesses to any other page are
/// taken as shared (which never makes a pair look unnecessary).
pub const PAGES_MAX: usize = 1 << 18;
/// Sections waiting to be joined with their samples; beyond, those the
/// samples have caught up with are joined, and if still too many, the
/// older half with what has arrived of their samples.
pub const PENDING_MAX: usize = 200_000;
/// Samples are joined with sections ending this long before the newest
/// record of both streams (the rings are drained in turn).
pub const JOIN_SLACK_NS: u64 = 50_000_000;
/// Samples kept for sections still open (longer sections lose their
/// earliest samples).
pub const SAMPLES_KEPT_NS: u64 = 2_000_000_000;
/// A lock call waited behind a section if that section still held the
/// lock this long after the call began: the entry probe's own time
/// (about 1 µs between its clock read and the lock attempt) is not a
/// wait.
pub const HANDOFF_MIN_NS: u64 = 2_000;
/// A conflicting access making up this share of a pair's sampled
/// accesses would be seen with the probability given as the confidence.
pub const CONFLICT_SHARE: f64 = 0.05;

/// A sampled data access of the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    pub time_ns: u64,
    pub tid: u32,
    /// The sampled instruction; 0 for code never taken as a section's
    /// own ([`SectionCode`]): the lock implementation (its lock and
    /// unlock run in and out of every section) and the C library.
    pub ip: u64,
    pub addr: u64,
    pub size: u32,
    pub write: bool,
    /// Known not to conflict whoever else touches it: read-only memory
    /// (code, constants, a relocated GOT) or a thread's stack.
    pub private: bool,
    /// For a write: the constant its instruction stores, when it stores
    /// an immediate (every execution writes the same value).
    pub value: Option<u64>,
}

/// A critical section: `lock` held by `tid` from `start_ns` to `end_ns`,
/// taken at `site` after a lock call of `wait_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub lock: u64,
    pub tid: u32,
    pub site: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub wait_ns: u64,
    /// Held for reading (an rwlock's read side): readers do not wait
    /// for each other.
    pub read: bool,
}

/// A lock call site on one thread.
pub type Who = (u64, u32);

/// The site of the sections seen through futex waits ([`Wait`]): their
/// lock calls were not traced, so one participant per thread.
pub const WAITED_SITE: u64 = u64::MAX;

/// A futex wait whose waker owned the lock when it began: the holder
/// was inside its critical section from `start_ns` (the waiter's sleep)
/// to `woken_ns` (its release's wake), and the waiter took the lock
/// about `end_ns`. What the default mode knows of sections, with no lock
/// call traced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    pub lock: u64,
    pub waiter: u32,
    pub holder: u32,
    pub start_ns: u64,
    pub woken_ns: u64,
    pub end_ns: u64,
}

/// Holders whose last section seen through a wait is remembered (waits
/// on one holder overlap: each of its samples joins one section).
const HOLDERS_MAX: usize = 1 << 16;
/// Instructions remembered as section code ([`SectionCode`]).
pub const SECTION_CODE_MAX: usize = 1 << 16;
/// Samples at an instruction that fell in one lock's sections before a
/// sample there outside any known section is taken as that lock's.
pub const SECTION_CODE_MIN_JOINS: u32 = 2;

/// Where an instruction was sampled inside known sections: always in one
/// lock's (at `site`, and through futex waits if `waited`), or in more
/// than one lock's (`lock` 0: nested sections, shared code).
///
/// The known sections cover a sliver of the run (lock calls traced in
/// windows, the holder's part of 1 in N futex waits), so most samples
/// taken inside sections fall outside every known one. A sample at an
/// instruction only ever seen inside one lock's sections is taken as
/// inside that lock's section too: its access is *inferred* evidence. It
/// adds to the access sets the classes are read from (an access can only
/// add a conflict), not to the count the confidence is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectionCode {
    pub lock: u64,
    pub site: u64,
    pub waited: bool,
    pub joins: u32,
}

/// Hand-offs between two participants: how many, and the waiter's time
/// blocked behind the holder.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Handoff {
    pub count: u64,
    pub wait_ns: u64,
}

/// One lock's participants and hand-offs.
#[derive(Debug, Clone, Default)]
pub struct LockUse {
    pub participants: FastMap<Who, Participant>,
    pub handoffs: FastMap<(Who, Who), Handoff>,
    /// Sections beyond [`PARTICIPANTS_MAX`], and hand-offs beyond
    /// [`HANDOFFS_MAX`] (their wait counts in `unpaired_wait_ns`).
    pub sections_unkept: u64,
    pub unpaired_wait_ns: u64,
    /// The latest sections, for the waits of the next ones.
    recent: VecDeque<Span>,
}

/// Sections kept per lock to find whom a later section waited for.
const RECENT: usize = 64;

impl LockUse {
    /// Pairs `s` with the sections it waited behind, then keeps it.
    fn add_span(&mut self, s: &Span) {
        let who = (s.site, s.tid);
        if s.wait_ns >= HANDOFF_MIN_NS {
            let from = s.start_ns.saturating_sub(s.wait_ns);
            // Readers do not wait for readers; a writer waiting behind
            // several readers at once waited once: the overlaps are
            // scaled to the wait.
            let behind: Vec<(Who, u64)> = self
                .recent
                .iter()
                .filter(|h| h.tid != s.tid && !(h.read && s.read))
                .filter(|h| h.end_ns >= from + HANDOFF_MIN_NS)
                .map(|h| {
                    let overlap = h
                        .end_ns
                        .min(s.start_ns)
                        .saturating_sub(h.start_ns.max(from));
                    ((h.site, h.tid), overlap)
                })
                .filter(|(_, overlap)| *overlap > 0)
                .collect();
            let sum: u64 = behind.iter().map(|b| b.1).sum();
            let scale = (s.wait_ns as f64 / sum.max(1) as f64).min(1.0);
            for (holder, overlap) in behind {
                let overlap = (overlap as f64 * scale).round() as u64;
                let key = (holder, who);
                if !self.handoffs.contains_key(&key) && self.handoffs.len() >= HANDOFFS_MAX {
                    self.unpaired_wait_ns += overlap;
                    continue;
                }
                let e = self.handoffs.entry(key).or_default();
                e.count += 1;
                e.wait_ns += overlap;
            }
        }
        if self.recent.len() >= RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(*s);
    }

    fn participant(&mut self, who: Who) -> Option<&mut Participant> {
        if !self.participants.contains_key(&who) && self.participants.len() >= PARTICIPANTS_MAX {
            self.sections_unkept += 1;
            return None;
        }
        Some(self.participants.entry(who).or_default())
    }
}

/// Who touched a page: its first thread, and whether another did too.
#[derive(Debug, Clone, Copy)]
struct PageThreads {
    first: u32,
    shared: bool,
}

/// The analysis: the joins so far, and what still waits to be joined.
#[derive(Debug, Default)]
pub struct UlcpProfile {
    locks: FastMap<u64, LockUse>,
    pages: FastMap<u64, PageThreads>,
    /// Sections and samples not yet joined (samples per thread, and
    /// whether one joined a known section).
    pending: Vec<Span>,
    samples: FastMap<u32, Vec<(Access, bool)>>,
    /// Per instruction: the known sections it was sampled in.
    section_code: FastMap<u64, SectionCode>,
    newest_sample_ns: u64,
    newest_span_ns: u64,
    /// What every sampled write to a word stored, in sections or not.
    stored: FastMap<u64, Stored>,
    /// Words the participants hold ([`WORDS_TOTAL_MAX`]).
    words_used: usize,
    /// Per (lock, holder): the end of its last section seen through a
    /// wait.
    holder_until: FastMap<(u64, u32), u64>,
    /// Waits given as sections ([`UlcpProfile::on_wait`]), and those left
    /// out (no wake after the sleep).
    pub waits: u64,
    /// Sections of locks beyond [`LOCKS_MAX`].
    pub sections_of_other_locks: u64,
    /// Sampled accesses that fell in a section (one in nested sections
    /// counts once per section).
    pub joined: u64,
    /// Sections joined before the samples of their time had arrived
    /// (more than [`PENDING_MAX`] waiting).
    pub joined_early: u64,
    /// Sampled accesses outside every known section taken as a lock's
    /// ([`SectionCode`]).
    pub inferred: u64,
}

impl UlcpProfile {
    /// A sampled access of the target.
    pub fn on_access(&mut self, a: Access) {
        let page = a.addr & !(PAGE_BYTES - 1);
        let room = self.pages.len() < PAGES_MAX;
        match self.pages.get_mut(&page) {
            Some(l) => l.shared |= l.first != a.tid,
            None if room => {
                let first = PageThreads {
                    first: a.tid,
                    shared: false,
                };
                self.pages.insert(page, first);
            }
            None => {}
        }
        if a.write && !a.private {
            self.note_store(&a);
        }
        self.saw(a.time_ns);
        self.samples.entry(a.tid).or_default().push((a, false));
    }

    /// A sample of the target at `time_ns`, with an address or not: the
    /// samples have arrived up to there.
    pub fn saw(&mut self, time_ns: u64) {
        self.newest_sample_ns = self.newest_sample_ns.max(time_ns);
    }

    /// Follows what the writes to each word store (a word beyond the
    /// table's bound is taken as varying).
    fn note_store(&mut self, a: &Access) {
        let word = a.addr & !(WORD_BYTES - 1);
        let room = self.stored.len() < STORED_WORDS_MAX;
        match self.stored.get_mut(&word) {
            Some(s) => *s = s.add(a, word),
            None if room => {
                self.stored.insert(word, Stored::Nothing.add(a, word));
            }
            None => {}
        }
    }

    /// What every sampled write to `word` stored ([`Stored::Varies`] when
    /// not followed).
    pub fn stored(&self, word: u64) -> Stored {
        self.stored.get(&word).copied().unwrap_or(Stored::Varies)
    }

    /// A critical section from the lock uprobes.
    pub fn on_span(&mut self, s: Span) {
        self.newest_span_ns = self.newest_span_ns.max(s.end_ns);
        self.pending.push(s);
        if self.pending.len() < PENDING_MAX {
            return;
        }
        self.settle();
        if self.pending.len() >= PENDING_MAX {
            // The samples lag far behind the sections: join the older
            // half now, with what has arrived of their samples.
            let mut ends: Vec<u64> = self.pending.iter().map(|s| s.end_ns).collect();
            let mid = ends.len() / 2;
            let horizon = *ends.select_nth_unstable(mid).1;
            self.joined_early += self.pending.iter().filter(|s| s.end_ns <= horizon).count() as u64;
            self.join(horizon);
        }
    }

    /// A futex wait: the holder's section as far as the wait shows it
    /// (after any part an earlier wait already gave), and the waiter's
    /// acquisition behind it, an empty section that waited from the
    /// sleep.
    pub fn on_wait(&mut self, w: Wait) {
        if w.woken_ns <= w.start_ns || w.end_ns < w.woken_ns || w.holder == w.waiter {
            return;
        }
        self.waits += 1;
        if self.holder_until.len() >= HOLDERS_MAX {
            self.holder_until.clear();
        }
        let until = self.holder_until.entry((w.lock, w.holder)).or_default();
        let start = w.start_ns.max(*until);
        if w.woken_ns > start {
            *until = w.woken_ns;
            self.on_span(Span {
                lock: w.lock,
                tid: w.holder,
                site: WAITED_SITE,
                start_ns: start,
                end_ns: w.woken_ns,
                wait_ns: 0,
                read: false,
            });
        }
        self.on_span(Span {
            lock: w.lock,
            tid: w.waiter,
            site: WAITED_SITE,
            start_ns: w.end_ns,
            end_ns: w.end_ns,
            wait_ns: w.end_ns - w.start_ns,
            read: false,
        });
    }

    /// Joins the sections that ended a little before the newest record
    /// of both streams.
    pub fn settle(&mut self) {
        let newest = self.newest_sample_ns.min(self.newest_span_ns);
        self.join(newest.saturating_sub(JOIN_SLACK_NS));
    }

    /// Joins everything (tracing has stopped), and takes what is left of
    /// the samples outside known sections as inferred evidence.
    pub fn finish(&mut self) {
        self.join(u64::MAX);
        let samples = std::mem::take(&mut self.samples);
        for (a, joined) in samples.into_values().flatten() {
            if !joined {
                self.infer(&a);
            }
        }
    }

    /// Remembers that the sample at `ip` fell in a section of `lock` at
    /// `site`.
    fn learn(code: &mut FastMap<u64, SectionCode>, ip: u64, lock: u64, site: u64) {
        if ip == 0 || (!code.contains_key(&ip) && code.len() >= SECTION_CODE_MAX) {
            return;
        }
        let c = code.entry(ip).or_insert(SectionCode {
            lock,
            site,
            waited: false,
            joins: 0,
        });
        if c.lock != lock {
            c.lock = 0;
            return;
        }
        c.joins = c.joins.saturating_add(1);
        if site == WAITED_SITE {
            c.waited = true;
        } else if c.site == WAITED_SITE {
            c.site = site;
        }
    }

    /// A sample that fell in no known section: taken as inside the
    /// section of the one lock its instruction was seen in
    /// ([`SectionCode`]), at that site and in the futex waits' section.
    fn infer(&mut self, a: &Access) {
        let Some(&c) = self.section_code.get(&a.ip) else {
            return;
        };
        if c.lock == 0 || c.joins < SECTION_CODE_MIN_JOINS {
            return;
        }
        let Some(lock) = self.locks.get_mut(&c.lock) else {
            return;
        };
        // Its site, and the futex waits' section if seen there too (no
        // allocation: this runs for every expiring sample).
        let waited = (c.waited && c.site != WAITED_SITE).then_some(WAITED_SITE);
        for site in std::iter::once(c.site).chain(waited) {
            if let Some(p) = lock.participant((site, a.tid)) {
                p.add_inferred(a, &mut self.words_used);
                self.inferred += 1;
            }
        }
    }

    /// Joins the pending sections that ended by `horizon` with their
    /// samples, in start order per lock, then forgets the samples too old
    /// for any section still to come.
    fn join(&mut self, horizon: u64) {
        for samples in self.samples.values_mut() {
            samples.sort_unstable_by_key(|(a, _)| a.time_ns);
        }
        let (mut ready, waiting): (Vec<Span>, Vec<Span>) =
            self.pending.drain(..).partition(|s| s.end_ns <= horizon);
        self.pending = waiting;
        ready.sort_unstable_by_key(|s| (s.lock, s.start_ns));
        for s in &ready {
            self.join_span(s);
        }
        // A section still open (not yet received) may have begun that
        // long ago.
        let keep_from = horizon
            .min(self.newest_sample_ns)
            .saturating_sub(SAMPLES_KEPT_NS);
        let mut outside = Vec::new();
        self.samples.retain(|_, v| {
            v.retain(|&(a, joined)| {
                let keep = a.time_ns >= keep_from;
                if !keep && !joined {
                    outside.push(a);
                }
                keep
            });
            !v.is_empty()
        });
        for a in &outside {
            self.infer(a);
        }
    }

    fn join_span(&mut self, s: &Span) {
        if !self.locks.contains_key(&s.lock) && self.locks.len() >= LOCKS_MAX {
            self.sections_of_other_locks += 1;
            return;
        }
        let used = &mut self.words_used;
        let lock = self.locks.entry(s.lock).or_default();
        lock.add_span(s);
        let Some(p) = lock.participant((s.site, s.tid)) else {
            return;
        };
        // A waiter's acquisition seen through a wait is not a section of
        // its own (its section shows when it holds while others wait).
        if s.end_ns == s.start_ns && s.site == WAITED_SITE {
            return;
        }
        p.sections += 1;
        let Some(samples) = self.samples.get_mut(&s.tid) else {
            return;
        };
        let first = samples.partition_point(|(a, _)| a.time_ns < s.start_ns);
        let inside = samples[first..]
            .iter_mut()
            .take_while(|(a, _)| a.time_ns <= s.end_ns);
        let before = p.accesses;
        for (a, joined) in inside {
            p.add(a, used);
            *joined = true;
            Self::learn(&mut self.section_code, a.ip, s.lock, s.site);
        }
        if p.accesses > before {
            p.sampled_sections += 1;
            self.joined += p.accesses - before;
        }
    }

    /// One lock's joins, if it had any section.
    pub fn lock(&self, lock: u64) -> Option<&LockUse> {
        self.locks.get(&lock)
    }

    /// Whether more than one thread was sampled touching the page of
    /// `addr` (a page not remembered is taken as shared).
    pub fn shared(&self, addr: u64) -> bool {
        self.pages
            .get(&(addr & !(PAGE_BYTES - 1)))
            .is_none_or(|l| l.shared)
    }

    /// Classifies `lock`'s hand-offs.
    pub fn verdict(&self, lock: u64) -> Option<Verdict> {
        let l = self.locks.get(&lock)?;
        verdict(l, &|addr| self.shared(addr), &|word| self.stored(word))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCK: u64 = 0x5000;
    const SITE: u64 = 0x4000;
    const SHARED: u64 = 0x9000;

    fn span(tid: u32, start: u64, end: u64, wait: u64) -> Span {
        Span {
            lock: LOCK,
            tid,
            site: SITE,
            start_ns: start,
            end_ns: end,
            wait_ns: wait,
            read: false,
        }
    }

    fn access(tid: u32, time: u64, addr: u64, write: bool) -> Access {
        Access {
            time_ns: time,
            tid,
            ip: 0,
            addr,
            size: 8,
            write,
            private: false,
            value: None,
        }
    }

    /// Threads 1 and 2 take turns, each waiting for the other; in each
    /// section, thread t touches `addr(t, i)` (write or not), and once
    /// outside any section both touch each line the sections touch.
    fn alternate(addr: impl Fn(u32, u64) -> u64, write: bool) -> UlcpProfile {
        let mut p = UlcpProfile::default();
        let mut t = 1_000_000;
        for i in 0..200u64 {
            let tid = 1 + (i % 2) as u32;
            p.on_access(access(tid, t + 500, addr(tid, i), write));
            p.on_span(span(tid, t, t + 4_000, if i == 0 { 0 } else { 4_000 }));
            t += 4_000;
        }
        // Outside sections: pages seen by both threads are shared.
        for tid in [1, 2] {
            p.on_access(access(tid, t + 10, SHARED, false));
        }
        p.finish();
        p
    }

    #[test]
    fn a_shared_counter_is_true_contention() {
        let p = alternate(|_, _| SHARED, true);
        let v = p.verdict(LOCK).unwrap();
        assert_eq!(v.class, Class::True);
        assert_eq!(v.unnecessary_wait_ns, 0);
        assert_eq!(v.by_class[0].1.pairs, 199);
        // Each waiter waited behind the previous section: its overlap.
        assert_eq!(v.wait_ns, 199 * 4_000);
    }

    #[test]
    fn per_thread_slots_of_a_shared_line_are_disjoint_writes() {
        let p = alternate(|tid, _| SHARED + 8 * u64::from(tid), true);
        let v = p.verdict(LOCK).unwrap();
        assert_eq!(v.class, Class::DisjointWrite);
        assert_eq!(v.unnecessary_share(), 1.0);
        assert!(v.confidence > 0.99, "{}", v.confidence);
    }

    #[test]
    fn reads_of_a_shared_table_are_read_read() {
        let p = alternate(|_, i| SHARED + 8 * (i % 64), false);
        let v = p.verdict(LOCK).unwrap();
        assert_eq!(v.class, Class::ReadRead);
    }

    #[test]
    fn thread_private_work_is_a_null_lock() {
        let mut p = UlcpProfile::default();
        let mut t = 1_000_000;
        for i in 0..100u64 {
            let tid = 1 + (i % 2) as u32;
            // Each thread's own buffer, lines nobody else touches.
            p.on_access(access(
                tid,
                t + 500,
                0x10_0000 * u64::from(tid) + i * 8,
                true,
            ));
            p.on_span(span(tid, t, t + 1_000, 8_000));
            t += 1_000;
        }
        p.finish();
        let v = p.verdict(LOCK).unwrap();
        assert_eq!(v.class, Class::Null);
        assert_eq!(v.min_accesses, 50);
    }

    #[test]
    fn sections_without_samples_are_not_classified() {
        let mut p = UlcpProfile::default();
        p.on_span(span(1, 1_000, 5_000, 0));
        p.on_span(span(2, 5_000, 9_000, 6_000));
        p.on_access(access(2, 9_500, 0x20_0000, true));
        p.on_span(span(1, 9_000, 13_000, 6_000));
        p.finish();
        // Thread 1's sections were never sampled: neither hand-off has a
        // class, however empty its access set looks.
        assert_eq!(p.verdict(LOCK), None);
        assert_eq!(p.lock(LOCK).unwrap().handoffs.len(), 2);
    }

    #[test]
    fn a_weak_claim_says_so() {
        let mut p = UlcpProfile::default();
        p.on_access(access(1, 1_500, 0x10_0000, true));
        p.on_span(span(1, 1_000, 2_000, 0));
        p.on_access(access(2, 2_500, 0x20_0000, true));
        p.on_span(span(2, 2_000, 3_000, 9_000));
        p.finish();
        let v = p.verdict(LOCK).unwrap();
        assert_eq!(v.class, Class::Null);
        assert!(v.confidence < 0.1, "{}", v.confidence);
    }

    #[test]
    fn redundant_stores_of_one_constant_are_benign() {
        let store = |tid: u32, value: Option<u64>| Access {
            value,
            ..access(tid, 0, SHARED, true)
        };
        let all = |_| true;
        // Every sampled write anywhere stored 1 in the whole word.
        let ones = |_| Stored::Nothing.add(&store(1, Some(1)), SHARED);
        let (mut a, mut b) = (Participant::default(), Participant::default());
        a.add(&store(1, Some(1)), &mut 0);
        b.add(&store(2, Some(1)), &mut 0);
        assert_eq!(pair_class(&a, &b, &all, &ones), Class::Benign);
        // A read of the flag sees the constant once it is written.
        let mut r = Participant::default();
        r.add(&access(3, 0, SHARED, false), &mut 0);
        assert_eq!(pair_class(&a, &r, &all, &ones), Class::Benign);
        // Unless some other code stores something else to it.
        let varies = |_| Stored::Varies;
        assert_eq!(pair_class(&a, &r, &all, &varies), Class::True);
        // Another constant, or a computed value, conflicts.
        let mut c = Participant::default();
        c.add(&store(2, Some(0)), &mut 0);
        assert_eq!(pair_class(&a, &c, &all, &ones), Class::True);
        b.add(&store(2, None), &mut 0);
        assert_eq!(pair_class(&a, &b, &all, &ones), Class::True);
        // The same value at another place or width is another store.
        let byte = Access {
            size: 1,
            ..store(1, Some(1))
        };
        assert_ne!(Stored::Nothing.add(&byte, SHARED), ones(0));
    }

    #[test]
    fn the_profile_follows_what_every_write_stores() {
        let mut p = UlcpProfile::default();
        let store = |value| Access {
            value,
            ..access(1, 0, SHARED, true)
        };
        p.on_access(store(Some(1)));
        p.on_access(store(Some(1)));
        assert!(matches!(
            p.stored(SHARED),
            Stored::Constant { value: 1, .. }
        ));
        p.on_access(store(Some(0)));
        assert_eq!(p.stored(SHARED), Stored::Varies);
        assert_eq!(
            p.stored(SHARED + 64),
            Stored::Varies,
            "never written: unknown"
        );
    }

    #[test]
    fn a_writer_behind_several_readers_waited_once() {
        let mut p = UlcpProfile::default();
        let reader = |tid, start, end, wait| Span {
            read: true,
            ..span(tid, start, end, wait)
        };
        // Two readers hold together; a third reader's slow call is no
        // wait for them; the writer waits 10 us behind both.
        p.on_span(reader(1, 0, 10_000, 0));
        p.on_span(reader(2, 0, 10_000, 0));
        p.on_span(reader(3, 5_000, 10_000, 5_000));
        p.on_span(span(4, 10_000, 11_000, 10_000));
        p.finish();
        let l = p.lock(LOCK).unwrap();
        let total: u64 = l.handoffs.values().map(|h| h.wait_ns).sum();
        assert_eq!(total, 10_000, "{:?}", l.handoffs);
        assert_eq!(l.handoffs.len(), 3, "the writer behind each reader");
    }

    #[test]
    fn sub_word_accesses_conflict_only_on_common_bytes() {
        let mut a = Participant::default();
        let mut b = Participant::default();
        a.add(
            &Access {
                size: 4,
                ..access(1, 0, SHARED, true)
            },
            &mut 0,
        );
        b.add(
            &Access {
                size: 4,
                ..access(2, 0, SHARED + 4, true)
            },
            &mut 0,
        );
        let all = |_| true;
        let one = |_| Stored::Varies;
        assert_eq!(pair_class(&a, &b, &all, &one), Class::DisjointWrite);
        b.add(
            &Access {
                size: 2,
                ..access(2, 0, SHARED + 2, false)
            },
            &mut 0,
        );
        assert_eq!(pair_class(&a, &b, &all, &one), Class::True);
        // An access across two words marks both.
        let mut c = Participant::default();
        c.add(
            &Access {
                size: 8,
                ..access(1, 0, SHARED + 4, false)
            },
            &mut 0,
        );
        assert_eq!(c.words.len(), 2);
        assert_eq!(c.words[&SHARED].read_bytes, 0xf0);
        assert_eq!(c.words[&(SHARED + 8)].read_bytes, 0x0f);
    }

    #[test]
    fn samples_arriving_after_their_section_are_joined() {
        let mut p = UlcpProfile::default();
        p.on_span(span(1, 1_000, 2_000, 0));
        p.settle(); // no sample yet: nothing joined, the span waits
        p.on_access(access(1, 1_500, SHARED, true));
        p.on_access(access(1, 2_500, SHARED + 64, true)); // after it
        p.finish();
        assert_eq!(p.joined, 1);
        let l = p.lock(LOCK).unwrap();
        assert_eq!(l.participants[&(SITE, 1)].sampled_sections, 1);
    }

    #[test]
    fn nested_sections_both_get_the_sample() {
        let mut p = UlcpProfile::default();
        p.on_access(access(1, 1_500, SHARED, true));
        p.on_span(Span {
            lock: LOCK + 64,
            ..span(1, 1_200, 1_800, 0)
        });
        p.on_span(span(1, 1_000, 2_000, 0));
        p.finish();
        assert_eq!(p.joined, 2);
    }

    #[test]
    fn waits_without_another_holder_are_not_hand_offs() {
        let mut p = UlcpProfile::default();
        p.on_span(span(1, 10_000, 11_000, 0));
        // Waited (slow call) after the other section ended; and a
        // thread never waits for itself.
        p.on_span(span(2, 20_000, 21_000, 5_000));
        p.on_span(span(2, 21_500, 22_000, 5_000));
        p.finish();
        assert!(p.lock(LOCK).unwrap().handoffs.is_empty());
        assert_eq!(p.verdict(LOCK), None);
    }

    #[test]
    fn sections_wait_for_lagging_samples_within_a_bound() {
        let mut p = UlcpProfile::default();
        p.on_access(access(1, 500, SHARED, true));
        // Sections keep coming while no newer sample arrives: they wait,
        // up to the bound, then the older half is joined.
        for i in 0..PENDING_MAX as u64 {
            p.on_span(span(1, 1_000 + i * 10, 1_005 + i * 10, 0));
        }
        assert_eq!(p.pending.len(), PENDING_MAX - PENDING_MAX / 2 - 1);
        assert_eq!(p.joined_early, PENDING_MAX as u64 / 2 + 1);
        // A sample of a waiting section still joins it.
        let t = 1_000 + (PENDING_MAX as u64 - 1) * 10 + 2;
        p.on_access(access(1, t, SHARED, true));
        p.finish();
        assert_eq!(p.joined, 1);
    }

    /// Threads 1 and 2 hand the lock to each other through futex waits
    /// only (no lock call traced): in each wait, the holder is sampled
    /// touching `addr(holder, i)` before its wake, and once after it
    /// (outside its section) touching `outside`.
    fn handed_through_waits(addr: impl Fn(u32, u64) -> u64, write: bool) -> UlcpProfile {
        let mut p = UlcpProfile::default();
        let mut t = 1_000_000;
        for i in 0..200u64 {
            let holder = 1 + (i % 2) as u32;
            let waiter = 3 - holder;
            p.on_access(access(holder, t + 1_000, addr(holder, i), write));
            p.on_access(access(holder, t + 5_000, SHARED + 0x100, true));
            p.on_wait(Wait {
                lock: LOCK,
                waiter,
                holder,
                start_ns: t,
                woken_ns: t + 4_000,
                end_ns: t + 4_500,
            });
            t += 6_000;
        }
        for tid in [1, 2] {
            p.on_access(access(tid, t + 10, SHARED, false));
        }
        p.finish();
        p
    }

    #[test]
    fn waits_alone_classify_their_holders_sections() {
        let p = handed_through_waits(|_, i| SHARED + 8 * (i % 64), false);
        let v = p.verdict(LOCK).unwrap();
        assert_eq!(v.class, Class::ReadRead, "{v:?}");
        // Each wait's time behind its holder's section, up to the wake.
        assert_eq!(v.wait_ns, 200 * 4_000);
        assert_eq!(p.waits, 200);
        let l = p.lock(LOCK).unwrap();
        let holder = &l.participants[&(WAITED_SITE, 1)];
        // The samples after the wakes (the conflicting writes) are outside.
        assert_eq!((holder.sections, holder.accesses), (100, 100));
        let p = handed_through_waits(|_, _| SHARED, true);
        assert_eq!(p.verdict(LOCK).unwrap().class, Class::True);
        let p = handed_through_waits(|tid, _| SHARED + 8 * u64::from(tid), true);
        assert_eq!(p.verdict(LOCK).unwrap().class, Class::DisjointWrite);
    }

    #[test]
    fn overlapping_waits_on_one_holder_join_its_samples_once() {
        let mut p = UlcpProfile::default();
        p.on_access(access(1, 2_000, SHARED, false));
        p.on_access(access(2, 9_000, SHARED + 8, false));
        // Threads 2 and 3 both sleep on thread 1's section.
        for (waiter, start) in [(2, 1_000), (3, 1_500)] {
            p.on_wait(Wait {
                lock: LOCK,
                waiter,
                holder: 1,
                start_ns: start,
                woken_ns: 5_000,
                end_ns: 6_000,
            });
        }
        // Thread 2 holds next while thread 3 waits again.
        p.on_wait(Wait {
            lock: LOCK,
            waiter: 3,
            holder: 2,
            start_ns: 8_000,
            woken_ns: 10_000,
            end_ns: 10_500,
        });
        // A wait without a wake after its sleep, and one on itself, are no
        // evidence.
        for (holder, woken) in [(1, 900), (3, 20_000)] {
            p.on_wait(Wait {
                lock: LOCK,
                waiter: 3,
                holder,
                start_ns: 1_000,
                woken_ns: woken,
                end_ns: 30_000,
            });
        }
        p.finish();
        assert_eq!(p.waits, 3);
        let l = p.lock(LOCK).unwrap();
        let one = &l.participants[&(WAITED_SITE, 1)];
        assert_eq!((one.sections, one.accesses), (1, 1));
        assert_eq!(l.participants[&(WAITED_SITE, 3)].sections, 0);
        let pairs: Vec<_> = l.handoffs.keys().map(|(h, w)| (h.1, w.1)).collect();
        assert_eq!(pairs.len(), 3, "{pairs:?}");
        let v = p.verdict(LOCK).unwrap();
        // Thread 3 was never sampled holding: its pairs are unsampled.
        assert_eq!(v.class, Class::ReadRead);
        assert_eq!(v.by_class[0].1.pairs, 1);
        assert_eq!(v.unsampled.pairs, 2);
    }

    #[test]
    fn old_samples_are_forgotten() {
        let mut p = UlcpProfile::default();
        p.on_access(access(1, 1_000, SHARED, true));
        let later = 1_000 + SAMPLES_KEPT_NS + 2 * JOIN_SLACK_NS;
        p.on_access(access(1, later, SHARED, true));
        p.on_span(span(1, later - 10, later + 10, 0));
        p.settle();
        p.on_span(span(1, later + 20, later + 30, 0));
        p.settle();
        assert_eq!(p.samples.values().map(Vec::len).sum::<usize>(), 1);
    }

    /// Two threads take turns on a lock writing their own slot of one
    /// line at instruction `IP`; one section in 20 is known (traced),
    /// the others' samples fall outside every known section.
    fn sliver(ip: u64) -> UlcpProfile {
        let mut p = UlcpProfile::default();
        let mut t = 1_000_000;
        for i in 0..400u64 {
            let tid = 1 + (i % 2) as u32;
            let slot = SHARED + 8 * u64::from(tid);
            p.on_access(Access {
                ip,
                ..access(tid, t + 500, slot, true)
            });
            if i % 20 < 4 {
                p.on_span(span(tid, t, t + 4_000, if i % 20 == 0 { 0 } else { 4_000 }));
            }
            t += 4_000;
        }
        for tid in [1, 2] {
            p.on_access(access(tid, t + 10, SHARED, false));
        }
        p.finish();
        p
    }

    #[test]
    fn samples_at_a_locks_section_code_outside_known_sections_are_inferred() {
        const IP: u64 = 0x40_1234;
        let p = sliver(IP);
        let l = p.lock(LOCK).unwrap();
        let one = &l.participants[&(SITE, 1)];
        // 40 known sections of thread 1 (one sample each) and 160 more
        // samples at the same instruction outside them.
        assert_eq!((one.accesses, one.inferred), (40, 160));
        assert_eq!(p.inferred, 320);
        let v = p.verdict(LOCK).unwrap();
        assert_eq!(v.class, Class::DisjointWrite);
        assert_eq!((v.min_accesses, v.inferred), (40, 160));
        // The confidence is the known samples' alone.
        assert!(
            (v.confidence - confidence(40)).abs() < 1e-9,
            "{}",
            v.confidence
        );
    }

    #[test]
    fn code_of_the_lock_implementation_or_of_two_locks_infers_nothing() {
        // No instruction (the C library's samples come with ip 0).
        let p = sliver(0);
        assert_eq!(p.inferred, 0);
        assert_eq!(p.lock(LOCK).unwrap().participants[&(SITE, 1)].accesses, 40);
        // An instruction seen in the sections of two locks (nested
        // sections, code shared by both): whose it is, is not known.
        let mut p = UlcpProfile::default();
        const IP: u64 = 0x40_1234;
        for (i, lock) in [LOCK, LOCK, LOCK + 64, LOCK + 64].into_iter().enumerate() {
            let t = 1_000_000 + 10_000 * i as u64;
            p.on_access(Access {
                ip: IP,
                ..access(1, t + 500, SHARED, true)
            });
            p.on_span(Span {
                lock,
                ..span(1, t, t + 4_000, 0)
            });
        }
        p.on_access(Access {
            ip: IP,
            ..access(1, 2_000_000, SHARED, true)
        });
        p.finish();
        assert_eq!(p.section_code[&IP].lock, 0);
        assert_eq!(p.inferred, 0);
        // A single join is not enough to learn from.
        let mut p = UlcpProfile::default();
        p.on_access(Access {
            ip: IP,
            ..access(1, 1_000_500, SHARED, true)
        });
        p.on_span(span(1, 1_000_000, 1_004_000, 0));
        p.on_access(Access {
            ip: IP,
            ..access(1, 2_000_000, SHARED, true)
        });
        p.finish();
        assert_eq!(p.inferred, 0);
    }
}

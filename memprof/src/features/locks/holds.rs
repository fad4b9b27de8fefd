//! What the lock uprobes saw, in memory bounded whatever the target.
//!
//! A program may take hundreds of thousands of distinct locks (memcached's
//! item-lock table, a table of 100,000 mutexes): each lock seen cannot
//! keep state for the whole session. At most [`LOCKS_MAX`] locks are
//! tracked one by one; a section of any other lock goes to one aggregate,
//! [`Holds::other`], whose critical sections keep their call sites. At
//! report time, when the table is full ([`Holds::prune`]), the locks that
//! matter most — contended first, then most held — keep their own state
//! (up to [`LOCKS_KEPT`]) and the rest are folded into the aggregate, which
//! makes room for locks that get busy later.
//!
//! Each table has a stated bound; with them the uprobe side of the loader
//! stays under 60 MiB whatever the number of locks (about 20 MiB with a
//! few sites and threads per lock):
//! - a lock: 2 × 344 bytes of durations, 144 of counts, at most
//!   [`SECTION_SITES_MAX`] section sites (40 bytes each, with the table's
//!   overhead) and [`THREADS_MAX`] thread ids: about 1.2 KiB, at most
//!   3.5 KiB, × [`LOCKS_MAX`];
//! - the aggregate: one lock's state with [`OTHER_SECTION_SITES_MAX`]
//!   sites (under 50 KiB), and the distinct locks it holds, counted up to
//!   [`OTHER_LOCKS_COUNTED_MAX`] (16 bytes each: 2 MiB);
//! - resolved call sites: [`SITE_PLACES_MAX`] places (about 48 bytes
//!   each: 3 MiB).

use memprof_common::locks::{hold_flag, lock_op};

use super::durations::Durations;
use crate::{
    features::{FastMap, FastSet},
    process::maps::Place,
};

/// Locks tracked one by one: every contended lock of most programs (a
/// report lists those, and the 20 most held others), with room for
/// newcomers.
pub const LOCKS_MAX: usize = 16384;
/// Locks kept one by one when pruning a full table (the rest go to the
/// aggregate), so that `LOCKS_MAX - LOCKS_KEPT` new locks get their own
/// state before the next report.
pub const LOCKS_KEPT: usize = LOCKS_MAX * 3 / 4;
/// (lock site, unlock site) pairs kept per lock; sections at other pairs
/// count in the lock's totals under [`OTHER_SITES`].
pub const SECTION_SITES_MAX: usize = 32;
/// Section site pairs kept in the aggregate of other locks.
pub const OTHER_SECTION_SITES_MAX: usize = 256;
/// Threads remembered per lock: beyond, the count is a lower bound.
pub const THREADS_MAX: usize = 64;
/// Distinct locks counted in the aggregate: beyond, a lower bound.
pub const OTHER_LOCKS_COUNTED_MAX: usize = 1 << 17;
/// Lock and unlock call sites resolved to code places: beyond, sections
/// at new sites are counted but not placed.
pub const SITE_PLACES_MAX: usize = 1 << 16;
/// The site pair under which sections beyond [`SECTION_SITES_MAX`] are
/// counted (no return address is 0).
pub const OTHER_SITES: (u64, u64) = (0, 0);

/// A critical section (or a failed try/timed lock call) seen by the lock
/// uprobes. Sites are return addresses; the report resolves them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    pub lock: u64,
    pub tid: u32,
    /// `memprof_common::locks::lock_op` code of the call that took it.
    pub op: u32,
    /// `memprof_common::locks::hold_flag` bits.
    pub flags: u32,
    pub acquire_ns: u64,
    pub hold_ns: u64,
    pub lock_site: u64,
    pub unlock_site: u64,
}

/// Totals of one critical-section site pair.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SectionSite {
    pub count: u64,
    pub hold_ns: u64,
    pub hold_max_ns: u64,
}

impl SectionSite {
    fn add(&mut self, other: &SectionSite) {
        self.count += other.count;
        self.hold_ns = self.hold_ns.saturating_add(other.hold_ns);
        self.hold_max_ns = self.hold_max_ns.max(other.hold_max_ns);
    }
}

/// What the lock uprobes saw of one lock (or of the aggregate).
#[derive(Debug, Clone)]
pub struct HoldStats {
    /// Lock calls that took it, per operation (scaled at report time by
    /// the calls the kernel counted).
    pub acquired_by_op: [u64; lock_op::COUNT as usize],
    /// Try and timed calls that did not take it.
    pub failed: u64,
    /// Time to take it (lock calls only).
    pub acquire: Durations,
    /// Hold times of every section, including those a condvar wait ended
    /// or began.
    pub hold: Durations,
    /// Per (lock site, unlock site): the critical sections' code; at most
    /// [`SECTION_SITES_MAX`] pairs, the rest under [`OTHER_SITES`].
    pub sections: FastMap<(u64, u64), SectionSite>,
    /// Threads that took it: at most [`THREADS_MAX`] remembered.
    pub threads: FastSet<u32>,
    /// More threads took it than remembered.
    pub threads_more: bool,
}

impl Default for HoldStats {
    fn default() -> Self {
        Self {
            acquired_by_op: [0; lock_op::COUNT as usize],
            failed: 0,
            acquire: Durations::default(),
            hold: Durations::default(),
            sections: FastMap::default(),
            threads: FastSet::default(),
            threads_more: false,
        }
    }
}

impl HoldStats {
    /// Acquisitions seen (not scaled).
    pub fn acquisitions(&self) -> u64 {
        self.acquired_by_op.iter().sum()
    }

    /// Whether it is an rwlock (taken by rwlock calls).
    pub fn is_rwlock(&self) -> bool {
        self.acquired_by_op
            .iter()
            .enumerate()
            .any(|(op, n)| *n > 0 && lock_op::is_rwlock(op as u32))
    }

    /// Threads seen taking it (a lower bound when `threads_more`).
    pub fn thread_count(&self) -> usize {
        self.threads.len()
    }

    fn add_thread(&mut self, tid: u32) {
        if self.threads.len() < THREADS_MAX {
            self.threads.insert(tid);
        } else if !self.threads.contains(&tid) {
            self.threads_more = true;
        }
    }

    fn add_site(&mut self, sites: (u64, u64), s: &SectionSite, max: usize) {
        let key = if self.sections.len() < max || self.sections.contains_key(&sites) {
            sites
        } else {
            OTHER_SITES
        };
        self.sections.entry(key).or_default().add(s);
    }

    /// Adds one section; at most `max_sites` site pairs are kept.
    fn add(&mut self, s: &Section, max_sites: usize) {
        self.add_thread(s.tid);
        if s.flags & hold_flag::FAILED != 0 {
            self.failed += 1;
            return;
        }
        if s.flags & hold_flag::REACQUIRED == 0 {
            if let Some(n) = self.acquired_by_op.get_mut(s.op as usize) {
                *n += 1;
            }
            self.acquire.record(s.acquire_ns);
        }
        self.hold.record(s.hold_ns);
        let site = SectionSite {
            count: 1,
            hold_ns: s.hold_ns,
            hold_max_ns: s.hold_ns,
        };
        self.add_site((s.lock_site, s.unlock_site), &site, max_sites);
    }

    /// Adds another lock's statistics (keeping at most `max_sites` site
    /// pairs).
    pub fn merge(&mut self, other: &HoldStats, max_sites: usize) {
        for (a, b) in self.acquired_by_op.iter_mut().zip(other.acquired_by_op) {
            *a += b;
        }
        self.failed += other.failed;
        self.acquire.add(&other.acquire);
        self.hold.add(&other.hold);
        for (sites, s) in &other.sections {
            self.add_site(*sites, s, max_sites);
        }
        for tid in &other.threads {
            self.add_thread(*tid);
        }
        self.threads_more |= other.threads_more;
    }
}

/// Locks taken that are not tracked one by one, as one.
#[derive(Debug, Default)]
pub struct OtherLocks {
    pub stats: HoldStats,
    /// The distinct locks in it, up to [`OTHER_LOCKS_COUNTED_MAX`].
    locks: FastSet<u64>,
    locks_more: bool,
}

impl OtherLocks {
    fn count_lock(&mut self, lock: u64) {
        if self.locks.len() < OTHER_LOCKS_COUNTED_MAX {
            self.locks.insert(lock);
        } else if !self.locks.contains(&lock) {
            self.locks_more = true;
        }
    }

    /// Distinct locks aggregated, and whether that is a lower bound.
    pub fn locks(&self) -> (usize, bool) {
        (self.locks.len(), self.locks_more)
    }

    pub fn is_empty(&self) -> bool {
        self.locks.is_empty()
    }
}

/// The lock uprobes' view of a session, bounded.
#[derive(Debug, Default)]
pub struct Holds {
    locks: FastMap<u64, HoldStats>,
    pub other: OtherLocks,
    /// Sections seen per operation (acquisitions and failed calls) over
    /// every lock: what the kernel's call counts are compared with.
    seen_by_op: [u64; lock_op::COUNT as usize],
    /// Code place of each lock/unlock site seen (return address → the
    /// call's place), resolved once by the collector.
    site_places: FastMap<u64, Place>,
    /// Sites not placed because [`SITE_PLACES_MAX`] was reached.
    pub sites_unplaced: u64,
}

impl Holds {
    /// A critical section (or failed lock call).
    pub fn add(&mut self, s: &Section) {
        if s.flags & hold_flag::REACQUIRED == 0 {
            if let Some(n) = self.seen_by_op.get_mut(s.op as usize) {
                *n += 1;
            }
        }
        if let Some(h) = self.locks.get_mut(&s.lock) {
            h.add(s, SECTION_SITES_MAX);
        } else if self.locks.len() < LOCKS_MAX {
            self.locks
                .entry(s.lock)
                .or_default()
                .add(s, SECTION_SITES_MAX);
        } else {
            self.other.count_lock(s.lock);
            self.other.stats.add(s, OTHER_SECTION_SITES_MAX);
        }
    }

    /// Sections seen per operation (acquisitions and failed calls).
    pub fn seen_by_op(&self) -> &[u64; lock_op::COUNT as usize] {
        &self.seen_by_op
    }

    pub fn get(&self, lock: u64) -> Option<&HoldStats> {
        self.locks.get(&lock)
    }

    pub fn len(&self) -> usize {
        self.locks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.locks.is_empty()
    }

    /// The locks tracked one by one, most hold time first.
    pub fn ranked(&self) -> Vec<(u64, &HoldStats)> {
        let mut v: Vec<_> = self.locks.iter().map(|(a, h)| (*a, h)).collect();
        v.sort_by(|a, b| {
            b.1.hold
                .total_ns
                .cmp(&a.1.hold.total_ns)
                .then(a.0.cmp(&b.0))
        });
        v
    }

    /// When the table is full, keeps [`LOCKS_KEPT`] locks one by one —
    /// those waited for longest (`wait_ns` of a lock: its futex waits),
    /// then the most held — and folds the others into the aggregate.
    pub fn prune(&mut self, wait_ns: impl Fn(u64) -> u64) {
        if self.locks.len() < LOCKS_MAX {
            return;
        }
        let mut ranked: Vec<(u64, u64, u64)> = self
            .locks
            .iter()
            .map(|(a, h)| (wait_ns(*a), h.hold.total_ns, *a))
            .collect();
        ranked.sort_unstable_by(|a, b| b.cmp(a));
        for &(_, _, lock) in &ranked[LOCKS_KEPT..] {
            if let Some(h) = self.locks.remove(&lock) {
                self.other.count_lock(lock);
                self.other.stats.merge(&h, OTHER_SECTION_SITES_MAX);
            }
        }
        self.locks.shrink_to(LOCKS_MAX);
    }

    pub fn knows_site(&self, site: u64) -> bool {
        self.site_places.contains_key(&site)
    }

    /// Whether another site can be placed.
    pub fn can_place_site(&self) -> bool {
        self.site_places.len() < SITE_PLACES_MAX
    }

    pub fn set_site_place(&mut self, site: u64, place: Place) {
        if self.can_place_site() || self.site_places.contains_key(&site) {
            self.site_places.insert(site, place);
        } else {
            self.sites_unplaced += 1;
        }
    }

    /// The place of a site's call, once resolved.
    pub fn site_place(&self, site: u64) -> Option<&Place> {
        self.site_places.get(&site)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(lock: u64, tid: u32, hold_ns: u64, sites: (u64, u64)) -> Section {
        Section {
            lock,
            tid,
            op: lock_op::MUTEX_LOCK,
            flags: 0,
            acquire_ns: 10,
            hold_ns,
            lock_site: sites.0,
            unlock_site: sites.1,
        }
    }

    #[test]
    fn locks_beyond_the_cap_go_to_the_aggregate_and_nothing_is_lost() {
        let mut h = Holds::default();
        let n = LOCKS_MAX as u64 + 100;
        for lock in 0..n {
            h.add(&section(0x1000 + lock * 64, 1, 5, (1, 2)));
        }
        assert_eq!(h.len(), LOCKS_MAX);
        assert_eq!(h.other.locks(), (100, false));
        // Known locks still count one by one when the table is full.
        h.add(&section(0x1000, 2, 7, (1, 2)));
        assert_eq!(h.get(0x1000).unwrap().acquisitions(), 2);
        let total: u64 = h
            .ranked()
            .iter()
            .map(|(_, s)| s.acquisitions())
            .sum::<u64>()
            + h.other.stats.acquisitions();
        assert_eq!(total, n + 1, "every section counts somewhere");
        assert_eq!(h.seen_by_op()[lock_op::MUTEX_LOCK as usize], n + 1);
    }

    #[test]
    fn pruning_keeps_contended_then_most_held_locks() {
        let mut h = Holds::default();
        let n = LOCKS_MAX as u64;
        for lock in 0..n {
            // Hold time grows with the address: the first are the least
            // held.
            h.add(&section(lock, 1, 100 + lock, (1, 2)));
        }
        // Lock 3 is little held but contended.
        h.prune(|lock| if lock == 3 { 1_000 } else { 0 });
        assert_eq!(h.len(), LOCKS_KEPT);
        assert!(h.get(3).is_some(), "contended locks stay");
        assert!(h.get(n - 1).is_some(), "the most held stay");
        let demoted: Vec<u64> = (0..n).filter(|l| h.get(*l).is_none()).collect();
        let expected: Vec<u64> = (0..=(n - LOCKS_KEPT as u64)).filter(|l| *l != 3).collect();
        assert_eq!(demoted, expected);
        assert_eq!(h.other.locks(), (expected.len(), false));
        let other = &h.other.stats;
        assert_eq!(other.acquisitions(), expected.len() as u64);
        assert_eq!(
            other.hold.total_ns,
            expected.iter().map(|l| 100 + l).sum::<u64>()
        );
        assert_eq!(
            other.sections.get(&(1, 2)).map(|s| s.count),
            Some(expected.len() as u64)
        );
        // Below a full table, nothing moves.
        h.prune(|_| 0);
        assert_eq!(h.len(), LOCKS_KEPT);
    }

    #[test]
    fn sites_and_threads_per_lock_are_capped() {
        let mut h = Holds::default();
        for i in 0..(SECTION_SITES_MAX as u64 + 5) {
            h.add(&section(0x40, i as u32, 10, (100 + i, 200)));
        }
        for tid in 0..(THREADS_MAX as u32 * 2) {
            h.add(&section(0x40, tid, 10, (100, 200)));
        }
        let s = h.get(0x40).unwrap();
        assert_eq!(s.sections.len(), SECTION_SITES_MAX + 1);
        assert_eq!(s.sections.get(&OTHER_SITES).map(|s| s.count), Some(5));
        let counted: u64 = s.sections.values().map(|s| s.count).sum();
        assert_eq!(counted, s.hold.count(), "no section lost to the cap");
        assert_eq!(s.thread_count(), THREADS_MAX);
        assert!(s.threads_more);
    }

    #[test]
    fn site_places_are_capped() {
        let mut h = Holds::default();
        let place = |o| Place::File {
            path: std::sync::Arc::from("/bin/p"),
            file_offset: o,
        };
        for site in 1..=(SITE_PLACES_MAX as u64 + 3) {
            h.set_site_place(site, place(site));
        }
        assert!(!h.can_place_site());
        assert_eq!(h.sites_unplaced, 3);
        assert_eq!(h.site_place(1), Some(&place(1)));
        assert_eq!(h.site_place(SITE_PLACES_MAX as u64 + 1), None);
    }

    #[test]
    fn failed_and_reacquired_sections_count_apart() {
        let mut h = Holds::default();
        h.add(&Section {
            flags: hold_flag::FAILED,
            op: lock_op::MUTEX_TRYLOCK,
            ..section(1, 1, 0, (1, 0))
        });
        h.add(&Section {
            flags: hold_flag::REACQUIRED,
            op: lock_op::COND_WAIT,
            ..section(1, 1, 30, (3, 2))
        });
        let s = h.get(1).unwrap();
        assert_eq!((s.failed, s.acquisitions(), s.hold.count()), (1, 0, 1));
        assert_eq!(h.seen_by_op()[lock_op::MUTEX_TRYLOCK as usize], 1);
        assert_eq!(h.seen_by_op()[lock_op::COND_WAIT as usize], 0);
    }
}

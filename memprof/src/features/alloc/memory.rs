//! Where the allocator's memory goes: the arithmetic of memory overhead.
//!
//! Fed with allocations, frees and the allocator's own mapping calls, it
//! tracks, at every moment:
//! - *requested*: bytes the program asked for and has not freed;
//! - *usable*: the blocks the allocator actually handed out for them
//!   (requested + internal fragmentation);
//! - *blowup*, as the research design defines it, per size class (the
//!   allocator's real classes, see `classes`; large objects are one more
//!   class): an upper bound, the freed bytes whose blocks were not handed
//!   out again, minus the recently-freed counter, which every free raises
//!   and every allocation in the class lowers while it is above zero.
//!   Memory freed in one place while the program's demand in that class
//!   was met with new memory is blowup: freed 100 blocks, then allocated
//!   100 that did not reuse them, is 100 blocks of blowup; freed 100 and
//!   allocated nothing since is none (nothing needed them); freed and
//!   reused is none. Unmapping does not change it;
//! - *mapped*: what the allocator got from the kernel (mmap, mremap, brk,
//!   minus munmap);
//! - *external fragmentation and metadata*: the rest, mapped − usable −
//!   blowup.
//!
//! All of it is reported at the moment mapped memory peaked. Pure and
//! allocator-agnostic: the size class and usable size come with each event.

use crate::features::FastMap;

/// Freed blocks remembered (by address) for the upper bound; beyond, frees
/// are counted as untracked and the bound is low by their bytes.
pub const UNREUSED_CAP: usize = 1 << 20;

/// One event for the memory account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemEvent {
    /// A block of `usable` bytes (class `class`) at `addr` handed out for
    /// `requested`.
    Alloc {
        requested: u64,
        usable: u64,
        class: u32,
        addr: u64,
    },
    /// A block given back (its sizes as when it was allocated).
    Free {
        requested: u64,
        usable: u64,
        class: u32,
        addr: u64,
    },
    /// The allocator mapped `bytes` more (mmap, brk growth, mremap growth).
    Map { bytes: u64 },
    /// The allocator unmapped `bytes` (munmap, brk shrink, mremap shrink).
    Unmap { bytes: u64 },
}

/// The composition of memory at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Composition {
    pub requested: u64,
    pub usable: u64,
    pub blowup: u64,
    pub mapped: u64,
}

impl Composition {
    /// Usable bytes beyond what was requested.
    pub fn internal_fragmentation(&self) -> u64 {
        self.usable.saturating_sub(self.requested)
    }

    /// Mapped bytes that are neither live blocks nor blowup: free space the
    /// allocator cannot use for the current requests, and its metadata.
    /// Zero when the mapping calls were not all seen (e.g. memory mapped
    /// before attach).
    pub fn external_fragmentation(&self) -> u64 {
        self.mapped
            .saturating_sub(self.usable)
            .saturating_sub(self.blowup)
    }

    /// `part / mapped`, 0 when nothing is mapped.
    pub fn share_of_mapped(&self, part: u64) -> f64 {
        if self.mapped == 0 {
            0.0
        } else {
            part as f64 / self.mapped as f64
        }
    }
}

/// One size class's blowup terms, in bytes.
#[derive(Debug, Clone, Copy, Default)]
struct ClassTerms {
    /// Freed and not handed out again (the upper bound).
    unreused: u64,
    /// The recently-freed counter.
    counter: u64,
}

impl ClassTerms {
    fn blowup(self) -> u64 {
        self.unreused.saturating_sub(self.counter)
    }
}

/// The running account.
#[derive(Debug, Clone, Default)]
pub struct MemoryAccount {
    now: Composition,
    classes: FastMap<u32, ClassTerms>,
    /// Freed blocks not handed out again: address → (class, usable).
    unreused: FastMap<u64, (u32, u64)>,
    /// Frees not remembered ([`UNREUSED_CAP`] reached).
    untracked_frees: u64,
    peak: Composition,
    peak_requested: u64,
}

impl MemoryAccount {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn apply(&mut self, event: MemEvent) {
        match event {
            MemEvent::Alloc {
                requested,
                usable,
                class,
                addr,
            } => {
                self.now.requested += requested;
                self.now.usable += usable;
                if let Some((old, bytes)) = self.unreused.remove(&addr) {
                    self.update(old, |t| t.unreused = t.unreused.saturating_sub(bytes));
                }
                self.update(class, |t| t.counter = t.counter.saturating_sub(usable));
                self.peak_requested = self.peak_requested.max(self.now.requested);
            }
            MemEvent::Free {
                requested,
                usable,
                class,
                addr,
            } => {
                // A free of a block allocated before we looked: its sizes
                // were never added, so do not go below zero.
                self.now.requested = self.now.requested.saturating_sub(requested);
                self.now.usable = self.now.usable.saturating_sub(usable);
                let remembered =
                    self.unreused.len() < UNREUSED_CAP || self.unreused.contains_key(&addr);
                if remembered {
                    if let Some((old, bytes)) = self.unreused.insert(addr, (class, usable)) {
                        self.update(old, |t| t.unreused = t.unreused.saturating_sub(bytes));
                    }
                } else {
                    self.untracked_frees += 1;
                }
                self.update(class, |t| {
                    t.counter += usable;
                    if remembered {
                        t.unreused += usable;
                    }
                });
            }
            MemEvent::Map { bytes } => self.now.mapped += bytes,
            MemEvent::Unmap { bytes } => {
                self.now.mapped = self.now.mapped.saturating_sub(bytes);
            }
        }
        let now = self.now;
        if now.mapped > self.peak.mapped
            || (now.mapped == self.peak.mapped && now.usable > self.peak.usable)
        {
            self.peak = now;
        }
    }

    /// Changes one class's terms, keeping the total blowup in step.
    fn update(&mut self, class: u32, change: impl FnOnce(&mut ClassTerms)) {
        let terms = self.classes.entry(class).or_default();
        let before = terms.blowup();
        change(terms);
        let after = terms.blowup();
        self.now.blowup = self.now.blowup - before + after;
    }

    /// Memory now.
    pub fn now(&self) -> Composition {
        self.now
    }

    /// Memory at the moment mapped memory peaked (if no mapping calls were
    /// seen, when usable memory peaked).
    pub fn at_peak(&self) -> Composition {
        self.peak
    }

    /// Highest live requested bytes at any moment.
    pub fn requested_peak(&self) -> u64 {
        self.peak_requested
    }

    /// Frees whose blocks were not remembered for the blowup's upper bound
    /// (more than [`UNREUSED_CAP`] freed blocks not reused).
    pub fn untracked_frees(&self) -> u64 {
        self.untracked_frees
    }

    /// Blowup now, per size class (classes with none left out).
    pub fn blowup_by_class(&self) -> Vec<(u32, u64)> {
        let mut by_class: Vec<(u32, u64)> = self
            .classes
            .iter()
            .map(|(c, t)| (*c, t.blowup()))
            .filter(|(_, b)| *b > 0)
            .collect();
        by_class.sort_unstable();
        by_class
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use MemEvent::*;

    fn account(events: &[MemEvent]) -> MemoryAccount {
        let mut a = MemoryAccount::new();
        for &e in events {
            a.apply(e);
        }
        a
    }

    /// `n` blocks of 112 usable bytes (class 7) at `base`, `base + 0x100`...
    /// handed out, or (`freed`) given back.
    fn blocks(n: u64, base: u64, freed: bool) -> impl Iterator<Item = MemEvent> {
        (0..n).map(move |i| {
            let (requested, usable, class, addr) = (100, 112, 7, base + i * 0x100);
            if freed {
                Free {
                    requested,
                    usable,
                    class,
                    addr,
                }
            } else {
                Alloc {
                    requested,
                    usable,
                    class,
                    addr,
                }
            }
        })
    }

    fn allocs(n: u64, base: u64) -> impl Iterator<Item = MemEvent> {
        blocks(n, base, false)
    }

    fn frees(n: u64, base: u64) -> impl Iterator<Item = MemEvent> {
        blocks(n, base, true)
    }

    const T1: u64 = 0x10_0000;
    const T2: u64 = 0x90_0000;

    #[test]
    fn empty_account_is_all_zero() {
        let a = MemoryAccount::new();
        assert_eq!(a.now(), Composition::default());
        assert_eq!(a.at_peak().share_of_mapped(10), 0.0);
        assert_eq!(a.at_peak().external_fragmentation(), 0);
        assert!(a.blowup_by_class().is_empty());
    }

    #[test]
    fn internal_fragmentation_is_usable_minus_requested() {
        let a = account(&[
            Map { bytes: 4096 },
            Alloc {
                requested: 10,
                usable: 24,
                class: 1,
                addr: T1,
            },
        ]);
        let c = a.now();
        assert_eq!(
            (c.requested, c.usable, c.internal_fragmentation()),
            (10, 24, 14)
        );
        assert_eq!(c.external_fragmentation(), 4096 - 24);
    }

    /// Thread 1 frees 100 blocks, thread 2 then allocates 100 of the same
    /// class that do not reuse them: 100 blocks of blowup.
    #[test]
    fn freed_blocks_not_reused_while_the_class_allocates_anew_are_blowup() {
        let mut events: Vec<MemEvent> = allocs(100, T1).collect();
        events.extend(frees(100, T1));
        events.extend(allocs(100, T2));
        let a = account(&events);
        assert_eq!(a.now().blowup, 100 * 112);
        assert_eq!(a.blowup_by_class(), vec![(7, 100 * 112)]);
        assert_eq!(a.now().usable, 100 * 112);
    }

    /// Freed and nothing allocated since: nothing needed the memory.
    #[test]
    fn freed_blocks_with_no_demand_since_are_not_blowup() {
        let mut events: Vec<MemEvent> = allocs(100, T1).collect();
        events.extend(frees(100, T1));
        let a = account(&events);
        assert_eq!(a.now().blowup, 0);
        assert!(a.blowup_by_class().is_empty());
    }

    /// Freed, then handed out again for the next requests: pure reuse.
    #[test]
    fn reused_blocks_are_not_blowup() {
        let mut events: Vec<MemEvent> = allocs(100, T1).collect();
        events.extend(frees(100, T1));
        events.extend(allocs(100, T1));
        let a = account(&events);
        assert_eq!(a.now().blowup, 0);
    }

    /// Demand in another class does not use a class's freed blocks.
    #[test]
    fn allocations_of_another_class_leave_the_blowup_alone() {
        let mut events: Vec<MemEvent> = allocs(8, T1).collect();
        events.extend(frees(8, T1));
        events.extend((0..4).map(|i| Alloc {
            requested: 200,
            usable: 208,
            class: 9,
            addr: T2 + i * 0x100,
        }));
        let a = account(&events);
        assert_eq!(
            a.now().blowup,
            0,
            "class 7's counter still covers its frees"
        );
        // Half of class 7's freed blocks wanted again, from new memory.
        let mut a = a;
        for e in allocs(4, T2 + 0x10_0000) {
            a.apply(e);
        }
        assert_eq!(a.now().blowup, 4 * 112);
    }

    #[test]
    fn unmapping_leaves_the_blowup_and_the_peak_is_kept() {
        let mut events: Vec<MemEvent> = vec![Map { bytes: 1 << 20 }];
        events.extend(allocs(10, T1));
        events.extend(frees(10, T1));
        events.extend(allocs(10, T2));
        let mut a = account(&events);
        assert_eq!(a.now().blowup, 10 * 112);
        a.apply(Unmap { bytes: 4096 });
        let now = a.now();
        assert_eq!((now.blowup, now.mapped), (10 * 112, (1 << 20) - 4096));
        let peak = a.at_peak();
        assert_eq!(peak.mapped, 1 << 20);
        assert_eq!(
            peak.usable,
            10 * 112,
            "the peak is the moment mapped memory was highest"
        );
        assert!((peak.share_of_mapped(1 << 19) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn frees_of_blocks_from_before_attach_do_not_underflow() {
        let a = account(&[
            Free {
                requested: 64,
                usable: 80,
                class: 3,
                addr: T1,
            },
            Unmap { bytes: 1 << 30 },
        ]);
        let c = a.now();
        assert_eq!((c.requested, c.usable, c.mapped, c.blowup), (0, 0, 0, 0));
    }
}

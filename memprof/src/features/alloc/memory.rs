//! Where the allocator's memory goes: the arithmetic of memory overhead.
//!
//! Fed with allocations, frees and the allocator's own mapping calls, it
//! tracks, at every moment:
//! - *requested*: bytes the program asked for and has not freed;
//! - *usable*: the blocks the allocator actually handed out for them
//!   (requested + internal fragmentation);
//! - *blowup*, by the recently-freed-counter method: per size class a
//!   counter goes up by the bytes freed and down by the bytes then
//!   allocated in that class (not below zero). What is left is memory freed
//!   by one part of the program and held by the allocator without being
//!   reused for the same class;
//! - *mapped*: what the allocator got from the kernel (mmap, mremap, brk,
//!   minus munmap);
//! - *external fragmentation and metadata*: the rest, mapped − usable −
//!   blowup.
//!
//! All of it is reported at the moment mapped memory peaked. Pure and
//! allocator-agnostic: the size class and usable size come with each event.

use std::collections::BTreeMap;

/// One event for the memory account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemEvent {
    /// A block of `usable` bytes (class `class`) handed out for `requested`.
    Alloc {
        requested: u64,
        usable: u64,
        class: u32,
    },
    /// A block given back (its sizes as when it was allocated).
    Free {
        requested: u64,
        usable: u64,
        class: u32,
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

/// The running account.
#[derive(Debug, Clone, Default)]
pub struct MemoryAccount {
    now: Composition,
    /// Recently freed bytes per size class (blowup).
    freed: BTreeMap<u32, u64>,
    peak: Composition,
    peak_requested: u64,
}

impl MemoryAccount {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn apply(&mut self, event: MemEvent) {
        let now = &mut self.now;
        match event {
            MemEvent::Alloc {
                requested,
                usable,
                class,
            } => {
                now.requested += requested;
                now.usable += usable;
                if let Some(held) = self.freed.get_mut(&class) {
                    let reused = (*held).min(usable);
                    *held -= reused;
                    now.blowup -= reused;
                }
                self.peak_requested = self.peak_requested.max(now.requested);
            }
            MemEvent::Free {
                requested,
                usable,
                class,
            } => {
                // A free of a block allocated before we looked: its sizes
                // were never added, so do not go below zero.
                now.requested = now.requested.saturating_sub(requested);
                now.usable = now.usable.saturating_sub(usable);
                *self.freed.entry(class).or_default() += usable;
                now.blowup += usable;
            }
            MemEvent::Map { bytes } => now.mapped += bytes,
            MemEvent::Unmap { bytes } => {
                now.mapped = now.mapped.saturating_sub(bytes);
                // Memory returned to the kernel is no longer held by the
                // allocator: take it from the blowup first (largest
                // classes first: large blocks are the ones unmapped).
                let mut left = bytes.min(now.blowup);
                now.blowup -= left;
                for held in self.freed.values_mut().rev() {
                    let take = (*held).min(left);
                    *held -= take;
                    left -= take;
                    if left == 0 {
                        break;
                    }
                }
            }
        }
        if self.now.mapped > self.peak.mapped
            || (self.now.mapped == self.peak.mapped && self.now.usable > self.peak.usable)
        {
            self.peak = self.now;
        }
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

    /// Blowup now, per size class (classes with none left out).
    pub fn blowup_by_class(&self) -> Vec<(u32, u64)> {
        self.freed
            .iter()
            .filter(|(_, b)| **b > 0)
            .map(|(c, b)| (*c, *b))
            .collect()
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
            },
        ]);
        let c = a.now();
        assert_eq!(
            (c.requested, c.usable, c.internal_fragmentation()),
            (10, 24, 14)
        );
        assert_eq!(c.external_fragmentation(), 4096 - 24);
    }

    #[test]
    fn freed_memory_reused_by_the_same_class_is_not_blowup() {
        let a = account(&[
            Map { bytes: 1000 },
            Alloc {
                requested: 100,
                usable: 112,
                class: 7,
            },
            Free {
                requested: 100,
                usable: 112,
                class: 7,
            },
            Alloc {
                requested: 100,
                usable: 112,
                class: 7,
            },
        ]);
        assert_eq!(a.now().blowup, 0);
        assert_eq!(a.now().usable, 112);
    }

    #[test]
    fn freed_memory_not_reused_by_its_class_is_blowup() {
        // Threads free 8 blocks of class 7; the program then allocates in
        // class 9 only: the class-7 memory is held, unused.
        let mut events = vec![Map { bytes: 4096 }];
        events.extend((0..8).map(|_| Alloc {
            requested: 100,
            usable: 112,
            class: 7,
        }));
        events.extend((0..8).map(|_| Free {
            requested: 100,
            usable: 112,
            class: 7,
        }));
        events.extend((0..4).map(|_| Alloc {
            requested: 200,
            usable: 208,
            class: 9,
        }));
        let a = account(&events);
        let c = a.now();
        assert_eq!(c.blowup, 8 * 112);
        assert_eq!(a.blowup_by_class(), vec![(7, 8 * 112)]);
        assert_eq!(c.usable, 4 * 208);
        assert_eq!(c.external_fragmentation(), 4096 - 4 * 208 - 8 * 112);
        assert_eq!(a.requested_peak(), 800);
        // Partial reuse lowers the counter, never below zero.
        let mut a = a;
        a.apply(Alloc {
            requested: 2000,
            usable: 2000,
            class: 7,
        });
        assert_eq!(a.now().blowup, 0);
    }

    #[test]
    fn unmapping_takes_from_the_blowup_and_the_peak_is_kept() {
        let mut a = account(&[
            Map { bytes: 1 << 20 },
            Alloc {
                requested: 200_000,
                usable: 200_704,
                class: 40,
            },
            Free {
                requested: 200_000,
                usable: 200_704,
                class: 40,
            },
        ]);
        assert_eq!(a.now().blowup, 200_704);
        a.apply(Unmap { bytes: 200_704 });
        let now = a.now();
        assert_eq!((now.blowup, now.mapped), (0, (1 << 20) - 200_704));
        let peak = a.at_peak();
        assert_eq!(peak.mapped, 1 << 20);
        assert_eq!(
            peak.usable, 200_704,
            "the peak is the moment mapped memory was highest"
        );
        assert!(
            (peak.share_of_mapped(peak.usable) - 200_704.0 / (1u64 << 20) as f64).abs() < 1e-12
        );
    }

    #[test]
    fn frees_of_blocks_from_before_attach_do_not_underflow() {
        let a = account(&[
            Free {
                requested: 64,
                usable: 80,
                class: 3,
            },
            Unmap { bytes: 1 << 30 },
        ]);
        let c = a.now();
        assert_eq!((c.requested, c.usable, c.mapped, c.blowup), (0, 0, 0, 0));
    }
}

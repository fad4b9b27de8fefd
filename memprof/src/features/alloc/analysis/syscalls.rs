//! The allocator's syscalls: time and bytes per (syscall, allocator call
//! in progress, traced) split, and the memory the allocator maps, which
//! the memory account follows.

use std::collections::BTreeMap;

use memprof_common::syscall;

use super::AllocProfile;
use crate::features::alloc::memory::MemEvent;

/// One allocator-kind syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyscallCall {
    pub nr: u32,
    pub tid: u32,
    /// Allocator operation in progress on the thread.
    pub inside: Option<u32>,
    /// Whether the allocator probes were attached at the time.
    pub traced: bool,
    pub duration_ns: u64,
    pub args: [u64; 4],
    pub ret: i64,
}

/// Syscall totals of one (syscall, inside, traced) split.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyscallStats {
    pub count: u64,
    pub total_ns: u64,
    pub bytes: u64,
}

/// A syscall split: (syscall code, allocator op in progress, traced).
pub type SyscallKey = (u32, Option<u32>, bool);

/// `PROT_NONE`, `MREMAP_*` and friends from `<sys/mman.h>`.
const PROT_NONE: u64 = 0;

impl AllocProfile {
    /// Records one syscall; those made inside the allocator change its
    /// mapped memory.
    pub fn add_syscall(&mut self, call: SyscallCall) {
        let length = match call.nr {
            syscall::MMAP | syscall::MUNMAP | syscall::MADVISE | syscall::MPROTECT => call.args[1],
            syscall::MREMAP => call.args[2],
            _ => 0,
        };
        let bytes = if call.nr == syscall::BRK {
            self.brk_delta(&call)
        } else {
            length
        };
        let s = self
            .syscalls
            .entry((call.nr, call.inside, call.traced))
            .or_default();
        s.count += 1;
        s.total_ns += call.duration_ns;
        s.bytes += bytes;
        if call.inside.is_some() {
            let c = self.inside_calls.entry(call.tid).or_default();
            c.0 += 1;
            c.1 += call.duration_ns;
        }
        if call.ret < 0 && call.nr != syscall::BRK {
            return;
        }
        let inside = call.inside.is_some();
        let [a0, a1, a2, _] = call.args;
        let (mapped, unmapped) = match call.nr {
            syscall::MMAP if inside => {
                let at = call.ret as u64;
                if a2 == PROT_NONE {
                    self.reserved.add(at, a1);
                    (0, 0)
                } else {
                    (self.committed.add(at, a1), 0)
                }
            }
            syscall::MPROTECT if inside && a2 != PROT_NONE => {
                self.reserved.remove(a0, a1);
                (self.committed.add(a0, a1), 0)
            }
            syscall::MUNMAP => {
                self.reserved.remove(a0, a1);
                (0, self.committed.remove(a0, a1))
            }
            syscall::MREMAP => {
                let gone = self.committed.remove(a0, a1);
                if inside || gone > 0 {
                    (self.committed.add(call.ret as u64, a2), gone)
                } else {
                    (0, 0)
                }
            }
            syscall::BRK => self.brk_change(&call),
            _ => (0, 0),
        };
        // Unmap first: a moving mremap frees and maps in one call.
        if unmapped > 0 {
            self.memory.apply(MemEvent::Unmap { bytes: unmapped });
        }
        if mapped > 0 {
            self.memory.apply(MemEvent::Map { bytes: mapped });
        }
    }

    /// Forgets where the heap ends: `brk` calls were not seen since.
    pub fn forget_brk_end(&mut self) {
        self.brk_end = None;
    }

    fn brk_delta(&self, call: &SyscallCall) -> u64 {
        match self.brk_end {
            // brk(0) asks where the heap ends: it moves nothing (and is
            // the first call of a new program image, whose heap is
            // elsewhere: after an exec the old end means nothing).
            Some(_) if call.args[0] == 0 => 0,
            Some(end) => (call.ret as u64).abs_diff(end),
            None => 0,
        }
    }

    /// Heap growth or shrink through `brk` (which returns the new end).
    fn brk_change(&mut self, call: &SyscallCall) -> (u64, u64) {
        let new_end = call.ret as u64;
        let change = match self.brk_end {
            _ if call.args[0] == 0 => (0, 0),
            Some(end) if new_end > end && call.inside.is_some() => {
                (self.committed.add(end, new_end - end), 0)
            }
            Some(end) if new_end < end => (0, self.committed.remove(new_end, end - new_end)),
            _ => (0, 0),
        };
        self.brk_end = Some(new_end);
        change
    }

    /// Syscall splits: ((syscall, inside op, traced), totals), most time first.
    pub fn syscalls(&self) -> Vec<(SyscallKey, SyscallStats)> {
        let mut v: Vec<_> = self.syscalls.iter().map(|(k, s)| (*k, *s)).collect();
        v.sort_by(|a, b| b.1.total_ns.cmp(&a.1.total_ns).then(a.0.cmp(&b.0)));
        v
    }

    /// Whether `addr` lies in memory the allocator mapped while traced.
    pub fn maps_address(&self, addr: u64) -> bool {
        self.committed.contains(addr) || self.reserved.contains(addr)
    }
}

/// A set of disjoint address ranges, measured in bytes.
#[derive(Debug, Clone, Default)]
pub(super) struct RangeSet {
    /// start → end (exclusive), disjoint and not touching.
    ranges: BTreeMap<u64, u64>,
}

impl RangeSet {
    /// Whether `addr` is in one of the ranges.
    fn contains(&self, addr: u64) -> bool {
        self.ranges
            .range(..=addr)
            .next_back()
            .is_some_and(|(_, &end)| addr < end)
    }

    /// Adds `[start, start+len)`; returns the bytes that were not in yet.
    fn add(&mut self, start: u64, len: u64) -> u64 {
        let end = start.saturating_add(len);
        if len == 0 {
            return 0;
        }
        let before = self.covered(start, end);
        let mut new_start = start;
        let mut new_end = end;
        let overlapping: Vec<(u64, u64)> = self
            .ranges
            .range(..=end)
            .filter(|(_, &e)| e >= start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in overlapping {
            self.ranges.remove(&s);
            new_start = new_start.min(s);
            new_end = new_end.max(e);
        }
        self.ranges.insert(new_start, new_end);
        len - before
    }

    /// Removes `[start, start+len)`; returns the bytes that were in.
    fn remove(&mut self, start: u64, len: u64) -> u64 {
        let end = start.saturating_add(len);
        if len == 0 {
            return 0;
        }
        let removed = self.covered(start, end);
        let overlapping: Vec<(u64, u64)> = self
            .ranges
            .range(..end)
            .filter(|(_, &e)| e > start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in overlapping {
            self.ranges.remove(&s);
            if s < start {
                self.ranges.insert(s, start);
            }
            if e > end {
                self.ranges.insert(end, e);
            }
        }
        removed
    }

    /// Bytes of `[start, end)` in the set.
    fn covered(&self, start: u64, end: u64) -> u64 {
        self.ranges
            .range(..end)
            .filter(|(_, &e)| e > start)
            .map(|(&s, &e)| e.min(end) - s.max(start))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use memprof_common::alloc_op::*;

    use super::*;
    use crate::features::alloc::analysis::LargeRule;
    use crate::features::alloc::classes::SizeClasses;

    fn sys(nr: u32, inside: Option<u32>, args: [u64; 4], ret: i64) -> SyscallCall {
        SyscallCall {
            nr,
            tid: 1,
            inside,
            traced: true,
            duration_ns: 1000,
            args,
            ret,
        }
    }

    #[test]
    fn mapped_memory_follows_the_allocators_syscalls() {
        let mut p = AllocProfile::new(LargeRule::GlibcChunk, false, SizeClasses::Glibc);
        // brk(0) at start-up, outside: the heap's start.
        p.add_syscall(sys(syscall::BRK, None, [0; 4], 0x10_0000));
        // malloc grows the heap by 132 KiB.
        p.add_syscall(sys(
            syscall::BRK,
            Some(MALLOC),
            [0x12_1000, 0, 0, 0],
            0x12_1000,
        ));
        assert_eq!(p.memory_now().mapped, 0x21000);
        // A thread arena: reserve 64 MiB, commit 132 KiB of it.
        p.add_syscall(sys(
            syscall::MMAP,
            Some(MALLOC),
            [0, 64 << 20, 0, 0x22],
            0x7000_0000,
        ));
        assert_eq!(p.memory_now().mapped, 0x21000);
        p.add_syscall(sys(
            syscall::MPROTECT,
            Some(MALLOC),
            [0x7000_0000, 0x21000, 3, 0],
            0,
        ));
        assert_eq!(p.memory_now().mapped, 0x42000);
        // A large block: mmap then munmap inside free.
        p.add_syscall(sys(
            syscall::MMAP,
            Some(MALLOC),
            [0, 0x101000, 3, 0x22],
            0x7100_0000,
        ));
        assert_eq!(p.memory_now().mapped, 0x42000 + 0x101000);
        p.add_syscall(sys(
            syscall::MUNMAP,
            Some(FREE),
            [0x7100_0000, 0x101000, 0, 0],
            0,
        ));
        assert_eq!(p.memory_now().mapped, 0x42000);
        assert_eq!(p.memory_at_peak().mapped, 0x42000 + 0x101000);
        // The program's own mmap is not the allocator's memory.
        p.add_syscall(sys(syscall::MMAP, None, [0, 4096, 3, 0x22], 0x7200_0000));
        assert_eq!(p.memory_now().mapped, 0x42000);
        let rows = p.syscalls();
        let mmap_in_malloc = rows
            .iter()
            .find(|(k, _)| *k == (syscall::MMAP, Some(MALLOC), true))
            .unwrap()
            .1;
        assert_eq!(mmap_in_malloc.count, 2);
        assert_eq!(mmap_in_malloc.bytes, (64 << 20) + 0x101000);
        let brk = rows
            .iter()
            .find(|(k, _)| *k == (syscall::BRK, Some(MALLOC), true))
            .unwrap()
            .1;
        assert_eq!(brk.bytes, 0x21000);
    }

    /// After an exec (a launch through `env`), the new image's heap is
    /// elsewhere: its brk(0) moves nothing, and its growth is measured
    /// from there.
    #[test]
    fn a_new_images_heap_starts_at_its_brk_query() {
        let mut p = AllocProfile::new(LargeRule::GlibcChunk, false, SizeClasses::Glibc);
        p.add_syscall(sys(syscall::BRK, None, [0; 4], 0x5555_0000_0000));
        p.add_syscall(sys(syscall::BRK, None, [0; 4], 0x10_0000));
        p.add_syscall(sys(
            syscall::BRK,
            Some(MALLOC),
            [0x12_1000, 0, 0, 0],
            0x12_1000,
        ));
        let bytes = |inside| {
            p.syscalls()
                .into_iter()
                .find(|(k, _)| *k == (syscall::BRK, inside, true))
                .map(|(_, s)| s.bytes)
        };
        assert_eq!(bytes(None), Some(0), "queries move nothing");
        assert_eq!(bytes(Some(MALLOC)), Some(0x21000));
        assert_eq!(p.memory_now().mapped, 0x21000);
    }

    #[test]
    fn range_set_counts_overlaps_once() {
        let mut r = RangeSet::default();
        assert_eq!(r.add(100, 100), 100);
        assert_eq!(r.add(150, 100), 50);
        assert_eq!(r.add(0, 400), 250);
        assert_eq!(r.remove(50, 100), 100);
        assert_eq!(r.covered(0, 400), 300);
        assert_eq!(r.remove(0, 1000), 300);
        assert_eq!(r.covered(0, 1000), 0);
        assert_eq!(r.add(10, 0), 0);
    }
}

//! The allocator profile: latency per split, the live-block tracker,
//! allocation sites, syscall attribution and the memory account.
//!
//! Pure: fed with plain [`AllocCall`] and [`SyscallCall`] values (the
//! collector resolves addresses and threads first), so every rule here is
//! unit-tested without root.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use memprof_common::{alloc_op, syscall};

use super::memory::{Composition, MemEvent, MemoryAccount};
use crate::features::{latency_histogram, FastMap, FastSet};
use crate::process::maps::Place;

/// How a block is classified as large.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LargeRule {
    /// glibc: the block was mmapped (bit 1 of its chunk header). glibc's
    /// mmap threshold moves at run time, so no fixed size is right.
    GlibcChunk,
    /// Larger than this many bytes (the allocator's own limit, or a flag).
    Above(u64),
}

impl LargeRule {
    pub fn describe(self) -> String {
        match self {
            LargeRule::GlibcChunk => "glibc mmapped chunk (the allocator's own threshold)".into(),
            LargeRule::Above(n) => format!("> {n} bytes"),
        }
    }
}

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

/// One allocator call, as the analysis sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocCall {
    pub op: u32,
    pub tid: u32,
    pub start_ns: u64,
    pub duration_ns: u64,
    /// Block returned (allocations, 0 on failure) or given back (frees).
    pub ptr: u64,
    /// `realloc`'s old block (0 if none).
    pub old_ptr: u64,
    pub size: u64,
    /// glibc chunk header, 0 when unknown.
    pub chunk: u64,
    /// The call site: the address of the call instruction in the caller
    /// (its place is given once, with [`AllocProfile::set_site_place`]).
    pub site: u64,
    /// Live threads in the target when the call started.
    pub live_threads: u32,
}

/// One allocator-kind syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyscallCall {
    pub nr: u32,
    /// Allocator operation in progress on the thread.
    pub inside: Option<u32>,
    /// Whether the allocator probes were attached at the time.
    pub traced: bool,
    pub duration_ns: u64,
    pub args: [u64; 4],
    pub ret: i64,
}

/// A block the program holds: what the tracker knows about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    pub size: u64,
    pub usable: u64,
    pub class: Class,
    pub origin: Origin,
    /// Address of the allocating call ([`AllocProfile::site_place`]).
    pub site: u64,
    pub tid: u32,
    pub time_ns: u64,
}

/// Latency of one split.
#[derive(Debug, Clone)]
pub struct SplitStats {
    pub histogram: Histogram<u64>,
    /// Calls per log2 bucket of nanoseconds (bucket i: < 2^(i+1) ns).
    pub log2: [u64; 40],
}

impl SplitStats {
    fn new() -> Self {
        Self {
            // 3 significant digits from 1 ns to ~18 minutes: fixed memory,
            // any latency fits.
            histogram: latency_histogram(),
            log2: [0; 40],
        }
    }

    fn record(&mut self, ns: u64) {
        let ns = ns.clamp(1, 1 << 40);
        // Cannot fail: the value was clamped into the bounds.
        let _ = self.histogram.record(ns);
        let bucket = (63 - ns.leading_zeros()) as usize;
        self.log2[bucket.min(39)] += 1;
    }
}

/// Allocations made at one site.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SiteStats {
    pub count: u64,
    pub bytes: u64,
    pub live_bytes: u64,
    pub live_blocks: u64,
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

/// The allocator profile of one session.
#[derive(Debug)]
pub struct AllocProfile {
    rule: LargeRule,
    /// Drop the first allocation from the latency splits (allocator
    /// initialisation), for processes traced from their start.
    skip_first: bool,
    seen_alloc: bool,
    usable_known: bool,
    splits: FastMap<SplitKey, SplitStats>,
    handed_out: FastSet<u64>,
    /// Live blocks by start address (hashed: the per-call path; ordered
    /// lookups go through a [`BlockIndex`]).
    live: FastMap<u64, Block>,
    sites: FastMap<u64, SiteStats>,
    site_places: FastMap<u64, Place>,
    syscalls: FastMap<SyscallKey, SyscallStats>,
    memory: MemoryAccount,
    /// Memory the allocator has from the kernel, as address ranges.
    committed: RangeSet,
    /// Reserved by the allocator with PROT_NONE (committed by mprotect).
    reserved: RangeSet,
    brk_end: Option<u64>,
    calls: u64,
    /// Frees of blocks the tracker did not know (allocated before).
    unknown_frees: u64,
}

impl AllocProfile {
    pub fn new(rule: LargeRule, skip_first: bool, usable_known: bool) -> Self {
        Self {
            rule,
            skip_first,
            seen_alloc: false,
            usable_known,
            splits: FastMap::default(),
            handed_out: FastSet::default(),
            live: FastMap::default(),
            sites: FastMap::default(),
            site_places: FastMap::default(),
            syscalls: FastMap::default(),
            memory: MemoryAccount::new(),
            committed: RangeSet::default(),
            reserved: RangeSet::default(),
            brk_end: None,
            calls: 0,
            unknown_frees: 0,
        }
    }

    pub fn rule(&self) -> LargeRule {
        self.rule
    }

    /// Whether usable sizes come from the allocator (glibc headers).
    pub fn usable_known(&self) -> bool {
        self.usable_known
    }

    /// Calls recorded.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// Frees of blocks allocated before tracing (or in an untraced window).
    pub fn unknown_frees(&self) -> u64 {
        self.unknown_frees
    }

    /// (class, usable bytes) of a block from its size and glibc header.
    fn classify(&self, size: u64, chunk: u64) -> (Class, u64) {
        let glibc = (chunk != 0).then(|| {
            let chunk_size = chunk & !7;
            let mmapped = chunk & 2 != 0;
            let usable = chunk_size.saturating_sub(if mmapped { 16 } else { 8 });
            (mmapped, usable)
        });
        let usable = glibc.map_or(size, |(_, u)| u.max(size));
        let class = match (self.rule, glibc) {
            (LargeRule::GlibcChunk, Some((mmapped, _))) => {
                if mmapped {
                    Class::Large
                } else {
                    Class::Small
                }
            }
            (LargeRule::GlibcChunk, None) => Class::Unknown,
            (LargeRule::Above(n), _) => {
                if size > n {
                    Class::Large
                } else {
                    Class::Small
                }
            }
        };
        (class, usable)
    }

    /// Records one call.
    pub fn add_call(&mut self, call: AllocCall) {
        self.calls += 1;
        let phase = if call.live_threads > 1 {
            Phase::Parallel
        } else {
            Phase::Serial
        };
        let (class, origin) = if alloc_op::is_free(call.op) {
            if call.ptr == 0 {
                return; // free(NULL): no block, nothing to learn
            }
            match self.release(call.ptr) {
                Some(block) => (block.class, Some(block.origin)),
                None => {
                    self.unknown_frees += 1;
                    let class = if call.chunk != 0 {
                        self.classify(0, call.chunk).0
                    } else {
                        Class::Unknown
                    };
                    (class, None)
                }
            }
        } else {
            if call.old_ptr != 0 {
                self.release(call.old_ptr);
            }
            if call.ptr == 0 {
                // Failed allocation: latency still counts.
                let (class, _) = self.classify(call.size, 0);
                (class, None)
            } else {
                let (class, usable) = self.classify(call.size, call.chunk);
                let origin = if self.handed_out.insert(call.ptr) {
                    Origin::New
                } else {
                    Origin::Reused
                };
                self.hold(call.ptr, &call, class, usable, origin);
                let first = !self.seen_alloc;
                self.seen_alloc = true;
                if first && self.skip_first {
                    return;
                }
                (class, Some(origin))
            }
        };
        self.splits
            .entry(SplitKey {
                op: call.op,
                class,
                origin,
                phase,
            })
            .or_insert_with(SplitStats::new)
            .record(call.duration_ns);
    }

    fn hold(&mut self, ptr: u64, call: &AllocCall, class: Class, usable: u64, origin: Origin) {
        let site = self.sites.entry(call.site).or_default();
        site.count += 1;
        site.bytes += call.size;
        site.live_bytes += call.size;
        site.live_blocks += 1;
        self.memory.apply(MemEvent::Alloc {
            requested: call.size,
            usable,
            class: size_class(usable),
        });
        let block = Block {
            size: call.size,
            usable,
            class,
            origin,
            site: call.site,
            tid: call.tid,
            time_ns: call.start_ns,
        };
        if let Some(stale) = self.live.insert(ptr, block) {
            // Handed out twice without a free we saw (a free in an
            // untraced window): the old block is gone.
            self.forget(&stale);
        }
    }

    fn release(&mut self, ptr: u64) -> Option<Block> {
        let block = self.live.remove(&ptr)?;
        self.forget(&block);
        Some(block)
    }

    fn forget(&mut self, block: &Block) {
        if let Some(site) = self.sites.get_mut(&block.site) {
            site.live_bytes = site.live_bytes.saturating_sub(block.size);
            site.live_blocks = site.live_blocks.saturating_sub(1);
        }
        self.memory.apply(MemEvent::Free {
            requested: block.size,
            usable: block.usable,
            class: size_class(block.usable),
        });
    }

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

    fn brk_delta(&self, call: &SyscallCall) -> u64 {
        match self.brk_end {
            Some(end) => (call.ret as u64).abs_diff(end),
            None => 0,
        }
    }

    /// Heap growth or shrink through `brk` (which returns the new end).
    fn brk_change(&mut self, call: &SyscallCall) -> (u64, u64) {
        let new_end = call.ret as u64;
        let change = match self.brk_end {
            Some(end) if new_end > end && call.inside.is_some() => {
                (self.committed.add(end, new_end - end), 0)
            }
            Some(end) if new_end < end => (0, self.committed.remove(new_end, end - new_end)),
            _ => (0, 0),
        };
        self.brk_end = Some(new_end);
        change
    }

    /// An index of the live blocks by address, for many
    /// [`BlockIndex::containing`] queries (the false-sharing analysis
    /// names heap objects with it). Building it sorts the live blocks.
    pub fn block_index(&self) -> BlockIndex<'_> {
        let mut starts: Vec<u64> = self.live.keys().copied().collect();
        starts.sort_unstable();
        BlockIndex {
            profile: self,
            starts,
        }
    }

    /// The live block containing `addr`, with its start address. For one
    /// query; use [`AllocProfile::block_index`] for many.
    pub fn block_containing(&self, addr: u64) -> Option<(u64, &Block)> {
        self.block_index().containing(addr)
    }

    /// Live blocks by start address, in no particular order.
    pub fn live_blocks(&self) -> impl Iterator<Item = (u64, &Block)> {
        self.live.iter().map(|(a, b)| (*a, b))
    }

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

    /// Syscall splits: ((syscall, inside op, traced), totals), most time first.
    pub fn syscalls(&self) -> Vec<(SyscallKey, SyscallStats)> {
        let mut v: Vec<_> = self.syscalls.iter().map(|(k, s)| (*k, *s)).collect();
        v.sort_by(|a, b| b.1.total_ns.cmp(&a.1.total_ns).then(a.0.cmp(&b.0)));
        v
    }

    /// Whether the place of call site `addr` is known.
    pub fn knows_site(&self, addr: u64) -> bool {
        self.site_places.contains_key(&addr)
    }

    /// Records where call site `addr` is (once per site: resolving an
    /// address per call would cost more than the rest of the analysis).
    pub fn set_site_place(&mut self, addr: u64, place: Place) {
        self.site_places.insert(addr, place);
    }

    /// Sites whose place was never given.
    pub fn unplaced_sites(&self) -> Vec<u64> {
        self.sites
            .keys()
            .filter(|a| !self.site_places.contains_key(a))
            .copied()
            .collect()
    }

    /// Whether `addr` lies in memory the allocator mapped while traced.
    pub fn maps_address(&self, addr: u64) -> bool {
        self.committed.contains(addr) || self.reserved.contains(addr)
    }

    /// The place of call site `addr` (unmapped if never given).
    pub fn site_place(&self, addr: u64) -> Place {
        self.site_places
            .get(&addr)
            .cloned()
            .unwrap_or(Place::Unmapped { address: addr })
    }

    /// Sites with their places, in no particular order.
    pub fn sites(&self) -> impl Iterator<Item = (Place, &SiteStats)> {
        self.sites.iter().map(|(&a, s)| (self.site_place(a), s))
    }

    /// Memory at the peak of mapped memory.
    pub fn memory_at_peak(&self) -> Composition {
        self.memory.at_peak()
    }

    pub fn requested_peak(&self) -> u64 {
        self.memory.requested_peak()
    }

    pub fn memory_now(&self) -> Composition {
        self.memory.now()
    }
}

/// Live blocks sorted by address: which block holds an address.
pub struct BlockIndex<'a> {
    profile: &'a AllocProfile,
    starts: Vec<u64>,
}

impl<'a> BlockIndex<'a> {
    /// The live block containing `addr`, with its start address.
    pub fn containing(&self, addr: u64) -> Option<(u64, &'a Block)> {
        let at = self.starts.partition_point(|&s| s <= addr);
        let start = *self.starts.get(at.checked_sub(1)?)?;
        let block = self.profile.live.get(&start)?;
        (addr < start + block.size.max(1)).then_some((start, block))
    }
}

/// The blowup class of a block: its usable size for glibc (its bin), else
/// the next power of two (what size-class allocators round to, roughly).
fn size_class(usable: u64) -> u32 {
    u32::try_from(usable.next_power_of_two()).unwrap_or(u32::MAX)
}

/// A set of disjoint address ranges, measured in bytes.
#[derive(Debug, Clone, Default)]
struct RangeSet {
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
    use std::sync::Arc;

    use super::*;
    use alloc_op::*;

    fn place(offset: u64) -> Place {
        Place::File {
            path: Arc::from("/bin/prog"),
            file_offset: offset,
        }
    }

    fn call(op: u32, ptr: u64, size: u64) -> AllocCall {
        AllocCall {
            op,
            tid: 1,
            start_ns: 0,
            duration_ns: 100,
            ptr,
            old_ptr: 0,
            size,
            chunk: 0,
            site: 0x10,
            live_threads: 1,
        }
    }

    fn count(p: &AllocProfile, f: impl Fn(&SplitKey) -> bool) -> u64 {
        p.splits()
            .iter()
            .filter(|(k, _)| f(k))
            .map(|(_, s)| s.histogram.len())
            .sum()
    }

    #[test]
    fn addresses_handed_out_before_are_reused() {
        let mut p = AllocProfile::new(LargeRule::Above(1000), false, false);
        p.add_call(call(MALLOC, 0x1000, 64));
        p.add_call(call(FREE, 0x1000, 0));
        p.add_call(call(MALLOC, 0x1000, 64));
        p.add_call(call(MALLOC, 0x2000, 64));
        let new = count(&p, |k| k.op == MALLOC && k.origin == Some(Origin::New));
        let reused = count(&p, |k| k.op == MALLOC && k.origin == Some(Origin::Reused));
        assert_eq!((new, reused), (2, 1));
        // The free inherits the freed block's origin and class.
        assert_eq!(
            count(&p, |k| k.op == FREE
                && k.origin == Some(Origin::New)
                && k.class == Class::Small),
            1
        );
    }

    #[test]
    fn the_first_allocation_is_left_out_of_latency_only() {
        let mut p = AllocProfile::new(LargeRule::Above(1000), true, false);
        p.add_call(call(MALLOC, 0x1000, 64));
        p.add_call(call(MALLOC, 0x2000, 64));
        assert_eq!(count(&p, |k| k.op == MALLOC), 1);
        assert_eq!(p.live_blocks().count(), 2);
        assert_eq!(p.sites().next().unwrap().1.count, 2);
    }

    #[test]
    fn glibc_classes_come_from_the_chunk_header() {
        let mut p = AllocProfile::new(LargeRule::GlibcChunk, false, true);
        // 1 MiB mmapped chunk: size 0x101000 | IS_MMAPPED.
        let mut big = call(MALLOC, 0x7f00_0000_0010, 1 << 20);
        big.chunk = 0x101002;
        p.add_call(big);
        // A 200000-byte block from the heap (the threshold moved).
        let mut heap = call(MALLOC, 0x5000_0010, 200_000);
        heap.chunk = 0x30d51;
        p.add_call(heap);
        assert_eq!(count(&p, |k| k.class == Class::Large), 1);
        assert_eq!(count(&p, |k| k.class == Class::Small), 1);
        let (_, b) = p.block_containing(0x7f00_0000_0010 + 4096).unwrap();
        assert_eq!(b.usable, 0x101000 - 16);
        let (_, b) = p.block_containing(0x5000_0010).unwrap();
        assert_eq!(b.usable, 0x30d50 - 8);
        // A free of an unknown block is classed by its header too.
        let mut f = call(FREE, 0x9000, 0);
        f.chunk = 0x21;
        p.add_call(f);
        assert_eq!(
            count(&p, |k| k.op == FREE
                && k.class == Class::Small
                && k.origin.is_none()),
            1
        );
        assert_eq!(p.unknown_frees(), 1);
    }

    #[test]
    fn phases_follow_the_live_thread_count() {
        let mut p = AllocProfile::new(LargeRule::Above(1000), false, false);
        p.add_call(call(MALLOC, 0x1000, 8));
        let mut c = call(MALLOC, 0x2000, 8);
        c.live_threads = 3;
        p.add_call(c);
        assert_eq!(count(&p, |k| k.phase == Phase::Serial), 1);
        assert_eq!(count(&p, |k| k.phase == Phase::Parallel), 1);
    }

    #[test]
    fn free_of_null_is_ignored_and_realloc_moves_the_block() {
        let mut p = AllocProfile::new(LargeRule::Above(1000), false, false);
        p.add_call(call(FREE, 0, 0));
        assert_eq!(p.splits().len(), 0);
        p.add_call(call(MALLOC, 0x1000, 10));
        let mut r = call(REALLOC, 0x3000, 500);
        r.old_ptr = 0x1000;
        p.add_call(r);
        assert!(p.block_containing(0x1000).is_none());
        assert_eq!(p.block_containing(0x3000 + 499).unwrap().1.size, 500);
        assert!(p.block_containing(0x3000 + 500).is_none());
        assert_eq!(p.memory_now().requested, 500);
    }

    #[test]
    fn sites_keep_live_bytes_for_leaks() {
        let mut p = AllocProfile::new(LargeRule::Above(1000), false, false);
        p.set_site_place(0x40, place(0x40));
        p.set_site_place(0x10, place(0x10));
        assert!(p.knows_site(0x40) && !p.knows_site(0x50));
        assert_eq!(p.site_place(0x50), Place::Unmapped { address: 0x50 });
        let mut leak = call(MALLOC, 0x1000, 100);
        leak.site = 0x40;
        p.add_call(leak);
        p.add_call(call(MALLOC, 0x2000, 200));
        p.add_call(call(FREE, 0x2000, 0));
        let leaky = p.sites().find(|(s, _)| *s == place(0x40)).unwrap().1;
        assert_eq!((leaky.live_bytes, leaky.live_blocks), (100, 1));
        let other = p.sites().find(|(s, _)| *s == place(0x10)).unwrap().1;
        assert_eq!((other.count, other.bytes, other.live_bytes), (1, 200, 0));
    }

    fn sys(nr: u32, inside: Option<u32>, args: [u64; 4], ret: i64) -> SyscallCall {
        SyscallCall {
            nr,
            inside,
            traced: true,
            duration_ns: 1000,
            args,
            ret,
        }
    }

    #[test]
    fn mapped_memory_follows_the_allocators_syscalls() {
        let mut p = AllocProfile::new(LargeRule::GlibcChunk, false, true);
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

    #[test]
    fn op_names() {
        assert_eq!(op_name(MALLOC), "malloc");
        assert_eq!(op_name(NEW_ARRAY), "operator new[]");
        assert_eq!(op_name(99), "unknown");
    }
}

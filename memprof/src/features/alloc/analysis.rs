//! The allocator profile: latency per split, the live-block tracker,
//! allocation sites, syscall attribution and the memory account.
//!
//! Pure: fed with plain [`AllocCall`] and [`SyscallCall`] values (the
//! collector resolves addresses and threads first), so every rule here is
//! unit-tested without root.
//!
//! [`AllocProfile`] and the call's way in ([`AllocProfile::add_call`]) are
//! here; each concern it keeps is in its own file: `latency` (the splits),
//! `blocks` (the live blocks), `sites` and `syscalls` (with the mapped
//! memory).

mod blocks;
mod latency;
pub mod probe_cost;
mod sites;
mod syscalls;

use memprof_common::alloc_op;

pub use blocks::{Block, BlockIndex};
pub use latency::{op_name, Class, Origin, Phase, SplitKey, SplitStats};
pub use probe_cost::{Calibration, ProbeCost, ProbeKind};
pub use sites::SiteStats;
pub use syscalls::{SyscallCall, SyscallKey, SyscallStats};

use super::classes::SizeClasses;
use super::memory::{Composition, MemoryAccount};
use crate::features::{FastMap, FastSet};
use crate::process::maps::Place;
use syscalls::RangeSet;

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
    /// The call site: the address of the call instruction in the first
    /// caller that is no allocation wrapper (its place is given once,
    /// with [`AllocProfile::set_site_place`]).
    pub site: u64,
    /// The call inside the wrapper the site went through (the
    /// allocator's own caller), 0 when the site called it directly.
    pub via: u64,
    /// Live threads in the target when the call started.
    pub live_threads: u32,
    /// Page faults the thread took during the call.
    pub page_faults: u32,
    /// The entry program's own run time (0: not measured).
    pub pace_ns: u32,
}

/// The allocator profile of one session.
#[derive(Debug)]
pub struct AllocProfile {
    rule: LargeRule,
    /// Drop the first allocation from the latency splits (allocator
    /// initialisation), for processes traced from their start.
    skip_first: bool,
    seen_alloc: bool,
    /// The allocator's size classes and usable sizes.
    classes: SizeClasses,
    splits: FastMap<SplitKey, SplitStats>,
    handed_out: FastSet<u64>,
    /// Live blocks by start address (hashed: the per-call path; ordered
    /// lookups go through a [`BlockIndex`]).
    live: FastMap<u64, Block>,
    sites: FastMap<u64, SiteStats>,
    site_places: FastMap<u64, Place>,
    syscalls: FastMap<SyscallKey, SyscallStats>,
    /// Per thread: syscalls (count, ns) made inside the allocator call in
    /// progress, filed under that call's split when it returns.
    inside_calls: FastMap<u32, (u64, u64)>,
    memory: MemoryAccount,
    /// Memory the allocator has from the kernel, as address ranges.
    committed: RangeSet,
    /// Reserved by the allocator with PROT_NONE (committed by mprotect).
    reserved: RangeSet,
    brk_end: Option<u64>,
    calls: u64,
    /// Frees of blocks the tracker did not know (allocated before).
    unknown_frees: u64,
    /// Most live blocks tracked (see [`MAX_LIVE_BLOCKS`]).
    live_cap: usize,
    /// Blocks handed out while `live_cap` blocks were live: not tracked.
    untracked_blocks: u64,
    /// What the probes add to each call's duration, by kind.
    probe_cost: ProbeCost,
    /// The probe kind of each operation code (emulated or single-stepped).
    kinds: Vec<ProbeKind>,
    /// Calls whose probe cost was taken off, and those of them whose
    /// pace was outside the calibration's (the cost scaled).
    corrected: u64,
    paced: u64,
}

/// Most live blocks the tracker holds: 48 bytes each in its table (the
/// address and a [`Block`]), so 192 MiB at most, twice that while the
/// table grows. Blocks allocated beyond are counted, not tracked.
pub const MAX_LIVE_BLOCKS: usize = 1 << 22;

impl AllocProfile {
    pub fn new(rule: LargeRule, skip_first: bool, classes: SizeClasses) -> Self {
        Self {
            rule,
            skip_first,
            seen_alloc: false,
            classes,
            splits: FastMap::default(),
            handed_out: FastSet::default(),
            live: FastMap::default(),
            sites: FastMap::default(),
            site_places: FastMap::default(),
            syscalls: FastMap::default(),
            inside_calls: FastMap::default(),
            memory: MemoryAccount::new(),
            committed: RangeSet::default(),
            reserved: RangeSet::default(),
            brk_end: None,
            calls: 0,
            unknown_frees: 0,
            live_cap: MAX_LIVE_BLOCKS,
            untracked_blocks: 0,
            probe_cost: ProbeCost::default(),
            kinds: Vec::new(),
            corrected: 0,
            paced: 0,
        }
    }

    /// Takes `cost` off every duration recorded from now on; `emulated[op]`
    /// says how operation `op`'s probe is placed.
    pub fn set_probe_cost(&mut self, cost: ProbeCost, emulated: &[bool]) {
        self.kinds = (0..alloc_op::COUNT)
            .map(|op| {
                let emulated = emulated.get(op as usize).copied().unwrap_or(true);
                ProbeKind::of(emulated, alloc_op::is_free(op))
            })
            .collect();
        self.probe_cost = cost;
    }

    pub fn probe_cost(&self) -> &ProbeCost {
        &self.probe_cost
    }

    /// Calls corrected for the probes' cost, and those whose cost was
    /// scaled by their pace.
    pub fn paced(&self) -> (u64, u64) {
        (self.corrected, self.paced)
    }

    /// The probe kinds of the operations (each once).
    pub fn probe_kinds(&self) -> Vec<ProbeKind> {
        let mut kinds: Vec<ProbeKind> = Vec::new();
        for &k in &self.kinds {
            if !kinds.contains(&k) {
                kinds.push(k);
            }
        }
        kinds
    }

    pub fn rule(&self) -> LargeRule {
        self.rule
    }

    /// Whether usable sizes are the allocator's (glibc's headers, or the
    /// size classes of jemalloc and mimalloc).
    pub fn usable_known(&self) -> bool {
        self.classes.usable_known()
    }

    /// The memory account's class of a block.
    pub(super) fn size_class(&self, usable: u64, class: Class) -> u32 {
        let mmapped = self.rule == LargeRule::GlibcChunk && class == Class::Large;
        self.classes.class(usable, mmapped)
    }

    /// Calls recorded.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// Frees of blocks allocated before tracing (or in an untraced window).
    pub fn unknown_frees(&self) -> u64 {
        self.unknown_frees
    }

    /// Blocks handed out while the tracker was full ([`MAX_LIVE_BLOCKS`]):
    /// live bytes, leaks and the memory account leave them out.
    pub fn untracked_blocks(&self) -> u64 {
        self.untracked_blocks
    }

    /// (class, usable bytes) of a block from its size and glibc header.
    fn classify(&self, size: u64, chunk: u64) -> (Class, u64) {
        let glibc = (chunk != 0).then(|| {
            let chunk_size = chunk & !7;
            let mmapped = chunk & 2 != 0;
            let usable = chunk_size.saturating_sub(if mmapped { 16 } else { 8 });
            (mmapped, usable)
        });
        let usable = match glibc {
            Some((_, u)) => u.max(size),
            None => self.classes.usable(size).unwrap_or(size),
        };
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
        let (syscalls, syscall_ns) = self.inside_calls.remove(&call.tid).unwrap_or_default();
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
        let duration = match self.kinds.get(call.op as usize) {
            Some(&kind) if self.probe_cost.kind(kind).is_some() => {
                let (latency, scaled) =
                    (self.probe_cost).correct(kind, call.duration_ns, call.pace_ns);
                self.corrected += 1;
                self.paced += u64::from(scaled);
                latency
            }
            _ => call.duration_ns,
        };
        let split = self
            .splits
            .entry(SplitKey {
                op: call.op,
                class,
                origin,
                phase,
            })
            .or_insert_with(SplitStats::new);
        split.record(duration);
        split.syscalls += syscalls;
        split.syscall_ns += syscall_ns;
        split.page_faults += u64::from(call.page_faults);
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

#[cfg(test)]
mod tests {
    use super::*;
    use alloc_op::*;

    use crate::process::maps::prog_place as place;

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
            via: 0,
            live_threads: 1,
            page_faults: 0,
            pace_ns: 0,
        }
    }

    #[test]
    fn the_live_block_tracker_is_bounded() {
        // The table's entry: the address and a block.
        assert!(std::mem::size_of::<(u64, Block)>() <= 48);
        let mut p = AllocProfile::new(LargeRule::Above(1000), false, SizeClasses::Unknown);
        p.live_cap = 3;
        for i in 0..5 {
            p.add_call(call(MALLOC, 0x1000 + i * 0x100, 64));
        }
        assert_eq!(p.live.len(), 3);
        assert_eq!(p.untracked_blocks(), 2);
        assert_eq!(
            p.memory_now().requested,
            3 * 64,
            "untracked blocks are left out"
        );
        // The site still counts every call.
        assert_eq!(
            p.sites.get(&0x10).map(|s| (s.count, s.live_blocks)),
            Some((5, 3))
        );
        // A freed slot is used again.
        p.add_call(call(FREE, 0x1000, 0));
        p.add_call(call(MALLOC, 0x9000, 64));
        assert_eq!((p.live.len(), p.untracked_blocks()), (3, 2));
    }

    /// The research design's split of the allocator's kernel work: the
    /// syscalls a call made (they come first, from its thread) and its
    /// page faults are filed under the call's own split.
    #[test]
    fn syscalls_and_faults_inside_a_call_go_to_its_split() {
        let mut p = AllocProfile::new(LargeRule::Above(1000), false, SizeClasses::Unknown);
        let mmap = |tid, inside: Option<u32>| SyscallCall {
            nr: memprof_common::syscall::MMAP,
            tid,
            inside,
            traced: true,
            duration_ns: 7000,
            args: [0, 1 << 20, 3, 0],
            ret: 0x7f00_0000_0000,
        };
        p.add_syscall(mmap(1, Some(MALLOC)));
        p.add_syscall(mmap(2, None)); // another thread, outside
        p.add_call(AllocCall {
            page_faults: 3,
            ..call(MALLOC, 0x10_0000, 5000)
        });
        p.add_call(call(MALLOC, 0x20_0000, 10)); // nothing inside
        let stats = |class| {
            p.splits()
                .into_iter()
                .find(|(k, _)| k.class == class)
                .map(|(_, s)| (s.syscalls, s.syscall_ns, s.page_faults))
        };
        assert_eq!(stats(Class::Large), Some((1, 7000, 3)));
        assert_eq!(stats(Class::Small), Some((0, 0, 0)));
        assert!(p.inside_calls.is_empty());
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
        let mut p = AllocProfile::new(LargeRule::Above(1000), false, SizeClasses::Unknown);
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
        let mut p = AllocProfile::new(LargeRule::Above(1000), true, SizeClasses::Unknown);
        p.add_call(call(MALLOC, 0x1000, 64));
        p.add_call(call(MALLOC, 0x2000, 64));
        assert_eq!(count(&p, |k| k.op == MALLOC), 1);
        assert_eq!(p.live_blocks().count(), 2);
        assert_eq!(p.sites().next().unwrap().1.count, 2);
    }

    #[test]
    fn glibc_classes_come_from_the_chunk_header() {
        let mut p = AllocProfile::new(LargeRule::GlibcChunk, false, SizeClasses::Glibc);
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
        let mut p = AllocProfile::new(LargeRule::Above(1000), false, SizeClasses::Unknown);
        p.add_call(call(MALLOC, 0x1000, 8));
        let mut c = call(MALLOC, 0x2000, 8);
        c.live_threads = 3;
        p.add_call(c);
        assert_eq!(count(&p, |k| k.phase == Phase::Serial), 1);
        assert_eq!(count(&p, |k| k.phase == Phase::Parallel), 1);
    }

    #[test]
    fn free_of_null_is_ignored_and_realloc_moves_the_block() {
        let mut p = AllocProfile::new(LargeRule::Above(1000), false, SizeClasses::Unknown);
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
        let mut p = AllocProfile::new(LargeRule::Above(1000), false, SizeClasses::Unknown);
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
}

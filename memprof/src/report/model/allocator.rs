//! The allocator part: latency per split, syscalls, the memory account,
//! allocation sites and kernel-side cost per thread.

use serde::{Deserialize, Serialize};

use super::{source_label, CallerRef, CodeRef, TraceMode};

schema_enum! {
    /// An allocator entry point.
    pub enum AllocOp {
        Malloc = "malloc",
        Calloc = "calloc",
        Realloc = "realloc",
        Reallocarray = "reallocarray",
        Free = "free",
        PosixMemalign = "posix_memalign",
        AlignedAlloc = "aligned_alloc",
        Memalign = "memalign",
        Valloc = "valloc",
        Pvalloc = "pvalloc",
        /// C++ `operator new(size_t)`.
        New = "operator new",
        NewArray = "operator new[]",
        Delete = "operator delete",
        DeleteArray = "operator delete[]",
        /// jemalloc's own API.
        Mallocx = "mallocx",
        Rallocx = "rallocx",
        Xallocx = "xallocx",
        Sdallocx = "sdallocx",
        Dallocx = "dallocx",
        /// A code the profiler does not know.
        Unknown = "unknown",
    }
}

impl AllocOp {
    /// The operation of an `alloc_op` code.
    pub fn from_code(op: u32) -> Self {
        use memprof_common::alloc_op;
        match op {
            alloc_op::MALLOC => AllocOp::Malloc,
            alloc_op::CALLOC => AllocOp::Calloc,
            alloc_op::REALLOC => AllocOp::Realloc,
            alloc_op::REALLOCARRAY => AllocOp::Reallocarray,
            alloc_op::FREE => AllocOp::Free,
            alloc_op::POSIX_MEMALIGN => AllocOp::PosixMemalign,
            alloc_op::ALIGNED_ALLOC => AllocOp::AlignedAlloc,
            alloc_op::MEMALIGN => AllocOp::Memalign,
            alloc_op::VALLOC => AllocOp::Valloc,
            alloc_op::PVALLOC => AllocOp::Pvalloc,
            alloc_op::NEW => AllocOp::New,
            alloc_op::NEW_ARRAY => AllocOp::NewArray,
            alloc_op::DELETE => AllocOp::Delete,
            alloc_op::DELETE_ARRAY => AllocOp::DeleteArray,
            alloc_op::MALLOCX => AllocOp::Mallocx,
            alloc_op::RALLOCX => AllocOp::Rallocx,
            alloc_op::XALLOCX => AllocOp::Xallocx,
            alloc_op::SDALLOCX => AllocOp::Sdallocx,
            alloc_op::DALLOCX => AllocOp::Dallocx,
            _ => AllocOp::Unknown,
        }
    }
}

schema_enum! {
    /// Size class of an allocator call.
    pub enum SizeClass {
        Small = "small",
        Large = "large",
        /// A free of a block allocated before tracing, by an allocator
        /// without a readable block header.
        Unknown = "unknown",
    }
}

schema_enum! {
    /// Whether the address an allocation handed out was handed out before.
    pub enum BlockOrigin {
        /// Never handed out before.
        New = "new",
        Reused = "reused",
    }
}

schema_enum! {
    /// How many threads of the target were alive during a call.
    pub enum ThreadPhase {
        /// One.
        Serial = "serial",
        /// Several.
        Parallel = "parallel",
    }
}

schema_enum! {
    /// A syscall the allocator makes to get or give back memory.
    pub enum Syscall {
        Mmap = "mmap",
        Munmap = "munmap",
        Mremap = "mremap",
        Madvise = "madvise",
        Brk = "brk",
        Mprotect = "mprotect",
        /// A code the profiler does not know.
        Unknown = "?",
    }
}

impl Syscall {
    /// The syscall of a `memprof_common::syscall` code.
    pub fn from_code(nr: u32) -> Self {
        use memprof_common::syscall;
        match nr {
            syscall::MMAP => Syscall::Mmap,
            syscall::MUNMAP => Syscall::Munmap,
            syscall::MREMAP => Syscall::Mremap,
            syscall::MADVISE => Syscall::Madvise,
            syscall::BRK => Syscall::Brk,
            syscall::MPROTECT => Syscall::Mprotect,
            _ => Syscall::Unknown,
        }
    }
}

/// What the allocator profiler found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocatorReport {
    /// "glibc 2.36", "jemalloc 5.3.0", ...; null when none was found or
    /// allocator tracing was off.
    pub library: Option<String>,
    /// The object file whose `malloc` was probed.
    pub path: Option<String>,
    /// "full", "sampled" or "off".
    pub mode: TraceMode,
    /// Fraction of the session the allocator probes were attached (1 in
    /// full mode). Counts are scaled by its inverse when `sampled`.
    pub traced_fraction: f64,
    /// Counts in `ops` and `sites` are estimates: the calls the kernel
    /// counted while the probes were attached, extrapolated over the gaps
    /// (see `count_error`). True whenever an operation was not traced all
    /// the time.
    pub sampled: bool,
    /// Claimed relative error of the estimated counts (0.1: ±10%); null
    /// when they are exact. Above 0.3 the counts are null (unknown) and a
    /// note says why.
    pub count_error: Option<f64>,
    /// How "large" was decided: "glibc mmapped chunk" or "> N bytes".
    pub large_rule: String,
    /// Allocator calls traced (unscaled).
    pub calls_traced: u64,
    /// Sampled mode: operations called so rarely that their probes stay
    /// attached all the time (their counts are exact, not scaled).
    pub always_traced: Vec<AllocOp>,
    /// Allocator events lost (ring buffer full), unscaled.
    pub lost: u64,
    /// Blocks handed out while the live-block tracker was full (4,194,304
    /// live blocks): live bytes, leaks and memory leave them out.
    pub untracked_blocks: u64,
    /// Allocation calls named at a wrapper's line rather than past it:
    /// made from a call site met for the first time while the cap of
    /// chains for such sites (20,000/s) was spent.
    pub named_at_wrapper: u64,
    /// What the probes themselves add to a traced call, measured at start
    /// and already taken off every latency in `ops`; null when not
    /// calibrated (latencies then include it).
    pub probe_cost_ns: Option<ProbeCostReport>,
    /// Latency per split, busiest first.
    pub ops: Vec<OpStats>,
    pub syscalls: Vec<SyscallStats>,
    /// Memory composition at peak (full mode only: it needs every call).
    pub memory: Option<MemoryReport>,
    /// Top allocation sites: by bytes, by count and by live bytes (each
    /// site once).
    pub sites: Vec<SiteEntry>,
    /// Allocations sampled by bytes with their call chains, named at the
    /// first frame outside allocation wrappers; null when not sampled.
    pub heap_profile: Option<HeapProfileReport>,
    /// Kernel-side cost per thread: page faults and `mmap_lock` waits.
    pub kernel: Vec<KernelThreadEntry>,
    /// The allocator's share of the CPU samples (every mode: from the
    /// samples, not the probes); null when no sample was taken.
    pub cpu: Option<AllocatorCpu>,
    /// What the allocator's small calls cost without a probe, timed all
    /// session long in a helper process running the same allocator; null
    /// when not measured (a note says why).
    pub untraced_ns: Option<UntracedCostReport>,
    /// How the estimated counts were made (null when exact): from the
    /// windows' rates, or from the CPU time in the allocator over the
    /// untraced cost per call.
    pub count_basis: Option<CountBasis>,
}

/// The allocator's untraced cost per call, in ns: the mean of the
/// fastest 90% of rounds of six calls of `size` bytes each (six mallocs,
/// their frees, six callocs; six malloc-free pairs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UntracedCostReport {
    pub size: u64,
    pub malloc_ns: f64,
    pub free_ns: f64,
    pub calloc_ns: f64,
    /// A malloc and its free at once, per pair: the mean of pairs timed
    /// alone and beside a kept block of their size.
    pub pair_ns: f64,
    /// How far those two differ, relatively: |alone - kept| / (alone +
    /// kept), part of a count's claimed error (mimalloc's pairs cost more
    /// when they empty a page).
    #[serde(default)]
    pub heap_spread: f64,
    pub rounds: u64,
    /// Runs of the loop (one every 100 ms), averaged.
    pub measurements: u32,
    /// How far the runs differ, relatively (the machine's pace drifts).
    pub drift: f64,
    /// The fastest and the slowest run's `pair_ns`.
    #[serde(default)]
    pub pair_range_ns: [f64; 2],
}

/// What estimated counts were extrapolated from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CountBasis {
    /// The calls counted while the probes were attached, extrapolated
    /// over the gaps at each window's rate.
    Windows,
    /// The CPU samples in the allocator's code over the untraced cost of
    /// a call, split by the mix of operations the windows traced.
    CpuTime,
}

/// What a latency was measured from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LatencyBasis {
    /// The traced calls, the probes' calibrated cost taken off.
    Traced,
    /// The allocator's untraced cost per call, timed in a helper process
    /// (`untraced_ns`): the traced calls were too short to tell apart
    /// from the probes' own cost, or agreed with it within the
    /// calibration's resolution.
    UntracedLoop,
}

/// The CPU samples whose instruction was allocator code (user mode: its
/// syscalls are in `syscalls`), among the report's hottest functions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocatorCpu {
    pub samples: u64,
    /// Of all the target's samples (kernel ones included).
    pub share: f64,
    /// The allocator's functions that took them, hottest first.
    pub functions: Vec<AllocatorFunctionCpu>,
    /// The allocation calls that took them, by the call site the copied
    /// stack was unwound to (past allocation wrappers), hottest first.
    pub sites: Vec<AllocatorSiteCpu>,
    /// The allocator's samples that came with a stack copy: the sites'
    /// shares are of these.
    pub site_samples: u64,
    /// Of those, samples whose stack could not be unwound out of the
    /// allocator.
    pub sites_unknown: u64,
}

/// The allocator's CPU samples spent for the calls of one site.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocatorSiteCpu {
    pub site: CodeRef,
    pub samples: u64,
    /// Of `site_samples`.
    pub share: f64,
}

/// One allocator function's samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocatorFunctionCpu {
    pub function: String,
    /// The entry point it is (null: an internal function).
    pub op: Option<AllocOp>,
    pub samples: u64,
    pub share: f64,
}

/// The probes' calibrated cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeCostReport {
    /// Latencies below this cannot be told from zero (the calibration's
    /// spread): the summary shows them as "< N ns".
    pub resolution_ns: u64,
    pub kinds: Vec<ProbeKindCost>,
    /// Calls whose probes ran at another pace than at calibration (the
    /// entry program's run time outside its calibrated range), over the
    /// calls corrected: their probe cost was scaled by their pace.
    pub paced_calls: u64,
    pub corrected_calls: u64,
}

/// The calibration of one probe kind.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeKindCost {
    /// "emulated, allocation", "single-stepped, free", ...: how the kernel
    /// handles the probed instruction, and which programs run.
    pub kind: String,
    /// Latency the probes add to a call (median), taken off.
    pub added_ns: u64,
    /// Interquartile range of the calibration's durations.
    pub spread_ns: u64,
    /// What a traced call costs the program in all (entry and return).
    pub cpu_ns: u64,
    /// Calls measured.
    pub calls: u64,
    /// The entry program's run time at calibration (median) and its
    /// 10-90% range.
    pub pace_ns: u32,
    pub pace_range_ns: [u32; 2],
}

/// Latency of one split of one operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpStats {
    /// "malloc", "free", "calloc", "realloc", "operator new", ...
    pub op: AllocOp,
    /// "small", "large", or "unknown" (a free of a block allocated before
    /// tracing, by an allocator without a readable block header).
    pub class: SizeClass,
    /// "new" (address never handed out before) or "reused"; for frees, the
    /// origin of the block freed; null when unknown.
    pub origin: Option<BlockOrigin>,
    /// "serial" (one live thread) or "parallel".
    pub phase: ThreadPhase,
    /// Calls (estimated when sampled; null when no estimate within 30%
    /// is possible: see `traced`).
    pub count: Option<u64>,
    /// Calls traced (unscaled).
    pub traced: u64,
    /// Latencies with the probes' own cost taken off; null when below the
    /// calibration's resolution (`probe_cost_ns.resolution_ns`): shorter
    /// than that, which the probes cannot tell from zero (a number there
    /// would be the correction's noise, e.g. "1 ns" for glibc's fast path).
    pub mean_ns: Option<u64>,
    /// The median; for a small malloc, free or calloc whose traced median
    /// is below the resolution or agrees with the allocator's untraced
    /// cost within it, that cost (`untraced_ns`), the finer of the two
    /// measurements: see `p50_basis`.
    pub p50_ns: Option<u64>,
    /// Where `p50_ns` comes from; null when it is null.
    pub p50_basis: Option<LatencyBasis>,
    pub p99_ns: Option<u64>,
    pub max_ns: Option<u64>,
    /// Latency histogram: (upper bound in ns, calls traced), log2 buckets.
    pub histogram: Vec<(u64, u64)>,
    /// Syscalls made inside the traced calls (mmap, munmap, brk, ...),
    /// their time, and the page faults the calls took (unscaled).
    pub syscalls: u64,
    pub syscall_ns: u64,
    pub page_faults: u64,
}

/// One syscall, split by the allocator operation it ran inside.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyscallStats {
    /// "mmap", "munmap", "mremap", "madvise", "brk", "mprotect".
    pub name: Syscall,
    /// The allocator operation in progress on that thread, or null
    /// (outside the allocator, or while the probes were detached: see
    /// `traced`).
    pub inside: Option<AllocOp>,
    /// false for calls made while the allocator probes were detached
    /// (sampled mode): where they came from is unknown.
    pub traced: bool,
    pub count: u64,
    pub total_ns: u64,
    /// Bytes mapped, unmapped or advised (length argument).
    pub bytes: u64,
}

/// Where the allocator's memory went, at the moment of peak mapped memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryReport {
    /// Highest live requested bytes at any moment.
    pub requested_peak: u64,
    /// Live requested bytes at the peak.
    pub requested_at_peak: u64,
    /// Live usable bytes (block sizes) at the peak.
    pub usable_peak: u64,
    pub internal_fragmentation: u64,
    pub blowup: u64,
    pub external_fragmentation: u64,
    /// Memory the allocator had from the kernel (mmap, brk, mremap) at the
    /// peak, counting only what was mapped while traced.
    pub mapped_peak: u64,
    /// Live requested bytes when tracing ended.
    pub requested_end: u64,
    /// Usable bytes of the blocks live when tracing ended (allocated
    /// while traced): comparable with an allocator's own count of
    /// `malloc_usable_size` (redis's `used_memory`) over the session.
    pub usable_end: u64,
    /// Whether usable sizes are real (glibc's block headers, jemalloc's and
    /// mimalloc's size classes) or equal to the requested sizes
    /// (allocators whose classes are not known: tcmalloc, others).
    pub usable_known: bool,
}

/// One allocation site (the caller of the allocation function).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SiteEntry {
    /// The innermost function making the call, at the call's line.
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: String,
    /// The functions the call was inlined into, each at the line of the
    /// inlined call, the compiled function last; empty when not inlined.
    pub inlined_into: Vec<CallerRef>,
    /// The allocation wrapper called here (passed over to name the site
    /// by its caller), if any.
    pub via: Option<String>,
    /// Allocations (estimated when sampled, as malloc's calls; null when
    /// unknown).
    pub count: Option<u64>,
    /// Allocations traced here (unscaled): what `live_blocks` is part of.
    pub traced: u64,
    /// Bytes requested (estimated when sampled; null when unknown).
    pub bytes: Option<u64>,
    /// Bytes allocated here and not freed when tracing ended (leak
    /// candidates; unscaled).
    pub live_bytes: u64,
    pub live_blocks: u64,
}

impl SiteEntry {
    /// `file.c:12`, or `(module)` without debug info, for display.
    pub fn source_label(&self) -> String {
        source_label(self.file.as_deref(), self.line, &self.module)
    }
}

/// The byte-sampled heap profile: estimates of all allocations per site,
/// from a sample of them (pprof's `alloc_space`, `alloc_objects`,
/// `inuse_space`, `inuse_objects`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HeapProfileReport {
    /// Mean bytes allocated between two samples (per thread).
    pub sample_mean_bytes: u64,
    /// Allocations sampled (call chains received).
    pub samples: u64,
    /// Samples the per-second cap held back (the others stand for them).
    pub capped: u64,
    /// How the estimates were made: the sampling, the cap, the windows.
    pub basis: String,
    /// Sites by estimated bytes allocated, then by bytes in use (each
    /// site once).
    pub sites: Vec<HeapSite>,
}

/// One allocation site of the heap profile: the first frame outside the
/// allocation wrappers of the chains that end there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeapSite {
    /// The function making the call (innermost, when inlined), at the
    /// call's line.
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: String,
    pub inlined_into: Vec<CallerRef>,
    /// The wrapper functions the allocation went through, innermost
    /// first (`zmalloc`, `operator new`, ...); empty when called directly.
    pub wrappers: Vec<String>,
    /// The heaviest call chain through the site, innermost first: the
    /// wrappers, the site, then its callers (as far as unwound).
    pub chain: Vec<CallerRef>,
    /// Samples taken here.
    pub samples: u64,
    /// This site's share of all bytes allocated (known even when the
    /// totals are not).
    pub alloc_share: f64,
    /// Estimated bytes and allocations made here (null when the session's
    /// allocation count is unknown).
    pub alloc_space: Option<u64>,
    pub alloc_objects: Option<u64>,
    /// Estimated bytes and blocks allocated here and still live when
    /// tracing ended (null unless every free was traced: full mode).
    pub inuse_space: Option<u64>,
    pub inuse_objects: Option<u64>,
}

/// What one thread suffered in the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelThreadEntry {
    pub tid: u32,
    pub page_faults: u64,
    /// Page faults taken inside an allocator call (traced windows only).
    pub page_faults_in_allocator: u64,
    /// `mmap_lock` acquisitions that had to wait (were not immediate).
    pub mmap_lock_waits: u64,
    pub mmap_lock_wait_ns: u64,
}

//! Names of the maps the loader opens or may inspect, as the programs
//! declare them (`#[map(name = ...)]`). Per-thread scratch maps only the
//! programs use are not listed.

/// Ring buffer of [`crate::SampleEvent`].
pub const SAMPLES: &str = "SAMPLES";
/// Ring buffer of [`crate::TaskEvent`].
pub const TASK_EVENTS: &str = "TASK_EVENTS";
/// `BPF_MAP_TYPE_STACK_TRACE` of user stacks.
pub const STACKS: &str = "STACKS";
/// Per-CPU `u64` counters indexed by [`crate::counter`].
pub const COUNTERS: &str = "COUNTERS";
/// Ring buffer of [`crate::AllocEvent`] and [`crate::SyscallEvent`]
/// (one ring, so a block's allocation is always read before its free).
pub const ALLOC_EVENTS: &str = "ALLOC_EVENTS";
/// `u64` array: [`crate::ALLOC_CTL_GENERATION`] (bumped by the loader
/// per window).
pub const ALLOC_CTL: &str = "ALLOC_CTL";
/// `u32` array: [`crate::ALLOC_SAMPLE_GAPS`] byte gaps between sampled
/// allocations, quantiles of an exponential distribution.
pub const ALLOC_SAMPLE_GAPS: &str = "ALLOC_SAMPLE_GAPS";
/// Hash: return address of an allocation call → [`crate::SiteRule`],
/// written by the loader as it classifies new call sites.
pub const ALLOC_SITES: &str = "ALLOC_SITES";
/// Hash: process id → [`crate::TextRange`] of its allocator's code, where
/// a CPU sample also sends its stack ([`crate::AllocCpuEvent`]).
pub const ALLOC_TEXT: &str = "ALLOC_TEXT";
/// Per-thread kernel-side statistics ([`crate::KernelStats`]).
pub const KERNEL_STATS: &str = "KERNEL_STATS";
/// Ring buffer of [`crate::LockEvent`] (stack samples).
pub const LOCK_EVENTS: &str = "LOCK_EVENTS";
/// Ring buffer of [`crate::WaitSpan`] (traced waits and their holders).
pub const WAIT_SPANS: &str = "WAIT_SPANS";
/// Hash: [`crate::ContentionKey`] → [`crate::Contention`], per lock.
pub const CONTENTION: &str = "CONTENTION";
/// Hash: the same, `addr` 0, once [`CONTENTION`] is full.
pub const CONTENTION_OTHER: &str = "CONTENTION_OTHER";
/// LRU hash: [`crate::WaiterKey`] → 1, the threads that waited on each
/// futex word.
pub const WAITER_THREADS: &str = "WAITER_THREADS";
/// `u64` array indexed by [`crate::futex_ctl`]: the governor's stride,
/// written by the loader.
pub const FUTEX_CTL: &str = "FUTEX_CTL";
/// Hash: syscall instruction → [`crate::SiteHint`], written by the loader.
pub const SITE_HINTS: &str = "SITE_HINTS";
/// LRU hash: cache-line address → [`crate::sharing::LineState`].
pub const LINES: &str = "LINES";
/// LRU hash: cache-line address → [`crate::sharing::LineWords`].
pub const WORDS: &str = "WORDS";
/// `u32` array: `[0]` = 1 when precise memory events are attached.
pub const SAMPLER_CTL: &str = "SAMPLER_CTL";
/// Hash: instruction address → [`crate::sharing::AccessRecipe`],
/// written by the loader as it decodes newly sampled instructions.
pub const RECIPES: &str = "RECIPES";
/// Ring buffer of [`crate::locks::HoldEvent`].
pub const HOLD_EVENTS: &str = "HOLD_EVENTS";
/// LRU hash: thread id → [`crate::locks::HeldLocks`], the locks each
/// thread holds now.
pub const HELD_LOCKS: &str = "HELD_LOCKS";
/// `u64` array: [`crate::locks::LOCK_CTL_GENERATION`].
pub const LOCK_CTL: &str = "LOCK_CTL";
/// Hash: tgid → code layout ([`crate::procs::recipe_key`]) of every
/// traced process; the sampler follows only these. Forked children are
/// added by the kernel when children are followed.
pub const TRACED: &str = "TRACED";
/// Hash: cgroup id → 1, the `--cgroup` cgroup and those below it (kept
/// up to date by the loader): a process that `exec`s in one of them is
/// traced from then on.
pub const TRACED_CGROUPS: &str = "TRACED_CGROUPS";
/// Hash: [`crate::procs::shared_slot`] → [`crate::procs::SharedRange`],
/// the `MAP_SHARED` mappings of each traced process, slots from 0 on.
pub const SHARED_RANGES: &str = "SHARED_RANGES";

//! Indices into the per-CPU [`maps::COUNTERS`](crate::maps::COUNTERS)
//! array: one index space for every program, where the per-operation
//! ranges are as long as their operation lists.

/// Samples of the target's threads seen by the sampler.
pub const SAMPLES_SEEN: u32 = 0;
/// Samples dropped because the sample ring buffer was full.
pub const SAMPLES_LOST: u32 = 1;
/// Task events dropped because their ring buffer was full.
pub const TASK_EVENTS_LOST: u32 = 2;
/// Samples whose user stack was lost to a full or colliding stack map
/// (not those with no caller frames to walk).
pub const STACK_ERRORS: u32 = 3;
/// Allocator and syscall events dropped (ring buffer full).
pub const ALLOC_EVENTS_LOST: u32 = 4;
/// Allocator calls whose per-thread state could not be stored.
pub const ALLOC_STATE_ERRORS: u32 = 5;
/// Allocator calls seen at entry (whether or not their event made it),
/// per operation: `ALLOC_OP_CALLS + op`.
pub const ALLOC_OP_CALLS: u32 = 6;
/// Lock stack samples dropped (ring buffer full).
pub const LOCK_EVENTS_LOST: u32 = ALLOC_OP_CALLS + crate::alloc_op::COUNT;
/// User-mode samples of the target (those that could yield an address).
pub const USER_SAMPLES: u32 = LOCK_EVENTS_LOST + 1;
/// User samples whose instruction had no recipe yet (sent to the
/// loader to decode).
pub const NO_RECIPE: u32 = USER_SAMPLES + 1;
/// User samples whose instruction has no usable memory operand.
pub const NO_OPERAND: u32 = USER_SAMPLES + 2;
/// User samples that yielded a data address.
pub const ADDRESSES: u32 = USER_SAMPLES + 3;
/// Lines and word tables created (minus those still in the maps at
/// the end: evicted by the LRU).
pub const LINES_NEW: u32 = USER_SAMPLES + 4;
pub const WORDS_NEW: u32 = USER_SAMPLES + 5;
/// Lines whose entry could not be created or found.
pub const LINE_ERRORS: u32 = USER_SAMPLES + 6;
/// Lock-function calls seen at entry, per operation:
/// `LOCK_OP_CALLS + op` ([`crate::locks::lock_op`]).
pub const LOCK_OP_CALLS: u32 = LINE_ERRORS + 1;
/// Critical-section records dropped (ring buffer full).
pub const HOLD_EVENTS_LOST: u32 = LOCK_OP_CALLS + crate::locks::lock_op::COUNT;
/// Unlocks of a lock the thread was not seen taking (taken before the
/// probes were attached, or by an untraced path).
pub const UNMATCHED_UNLOCKS: u32 = HOLD_EVENTS_LOST + 1;
/// Locks taken while the thread already held [`crate::locks::HELD_MAX`].
pub const HELD_OVERFLOW: u32 = HOLD_EVENTS_LOST + 2;
/// Lock calls whose per-thread state could not be stored.
pub const LOCK_STATE_ERRORS: u32 = HOLD_EVENTS_LOST + 3;
/// User samples placed through a backward slice that read user memory
/// (also counted in [`ADDRESSES`]).
pub const ADDRESSES_LOADED: u32 = LOCK_STATE_ERRORS + 1;
/// User samples whose slice could not read the memory it needed.
pub const SLICE_FAULTS: u32 = LOCK_STATE_ERRORS + 2;
/// Futex calls and kernel lock waits aggregated by site alone (their
/// lock's own key did not fit in [`crate::CONTENTION_KEYS`]).
pub const CONTENTION_OVERFLOW: u32 = LOCK_STATE_ERRORS + 3;
/// Futex calls and kernel lock waits not aggregated at all (both tables
/// full).
pub const CONTENTION_DROPPED: u32 = LOCK_STATE_ERRORS + 4;
/// Lock stack samples sent to the loader.
pub const LOCK_SAMPLES: u32 = LOCK_STATE_ERRORS + 5;
/// Allocation call chains sent to the loader, and those the per-second
/// cap ([`crate::ALLOC_STACKS_PER_S`]) held back.
pub const ALLOC_STACKS: u32 = LOCK_STATE_ERRORS + 6;
pub const ALLOC_STACKS_CAPPED: u32 = LOCK_STATE_ERRORS + 7;
/// Futex waits lost because other threads' waits in progress held every
/// slot of their group in the sched hooks' table ([`crate::FUTEX_SLOTS`],
/// [`crate::FUTEX_SLOT_GROUP`]).
pub const FUTEX_SLOT_COLLISIONS: u32 = LOCK_STATE_ERRORS + 8;
/// Futex waits the sched hooks saw but left untraced because the
/// governor's stride ([`crate::futex_ctl::STRIDE`]) skipped them.
pub const FUTEX_WAITS_SKIPPED: u32 = LOCK_STATE_ERRORS + 9;
/// Futex waits the sched hooks traced (each weighted by the stride).
pub const FUTEX_WAITS_TRACED: u32 = LOCK_STATE_ERRORS + 10;
/// Syscalls of the target seen while the allocator's syscall hooks were
/// attached (what the syscall slow path costs it).
pub const SYSCALLS_SEEN: u32 = LOCK_STATE_ERRORS + 11;
/// Nanoseconds the lock-contention programs spent on the waits they
/// traced (the part of their cost the governor's stride can lower).
pub const FUTEX_HIT_NS: u32 = LOCK_STATE_ERRORS + 12;
/// Wait spans sent ([`crate::WaitSpan`]), and those the ring had no room
/// for.
pub const WAIT_SPANS: u32 = LOCK_STATE_ERRORS + 13;
pub const WAIT_SPANS_LOST: u32 = LOCK_STATE_ERRORS + 14;
/// Allocation calls sent with their chain because a return address on
/// their way out of the wrappers was not classified yet, and those the
/// per-second cap ([`crate::ALLOC_SITE_CHAINS_PER_S`]) sent without.
pub const ALLOC_SITE_CHAINS: u32 = LOCK_STATE_ERRORS + 15;
pub const ALLOC_SITE_CHAINS_CAPPED: u32 = LOCK_STATE_ERRORS + 16;
/// Number of counters.
pub const COUNT: u32 = LOCK_STATE_ERRORS + 17;

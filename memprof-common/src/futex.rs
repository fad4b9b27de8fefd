//! Lock contention as the kernel sees it: the record of a futex wait or
//! wake of one of the target's threads, or of a kernel lock it waited for.

use crate::record::records;

/// Log2 buckets of the kernel's wait-time histograms (and the loader's
/// lock durations): bucket 0 counts 0 ns, bucket `i` `[2^(i-1), 2^i)` ns;
/// the last one everything from 2^38 ns (4.6 minutes) up.
pub const LOCK_HIST_BUCKETS: usize = 40;

/// The bucket of a duration of `ns` nanoseconds.
#[inline(always)]
pub const fn log2_bucket(ns: u64) -> usize {
    let i = (64 - ns.leading_zeros()) as usize;
    if i < LOCK_HIST_BUCKETS {
        i
    } else {
        LOCK_HIST_BUCKETS - 1
    }
}

/// Byte size of the lock event ring buffer (only contended locks and
/// kernel lock contention produce events).
pub const LOCK_RING_BYTES: u32 = 4 << 20;
/// User stack words copied with a futex call, from the stack pointer: the
/// loader finds the return addresses among them (the lock implementation
/// in libc has no frame pointers to walk).
pub const LOCK_STACK_WORDS: usize = 48;

/// [`LockEvent::kind`].
pub mod lock_event {
    /// A thread enters a futex wait (`LockEvent::stack` is filled).
    pub const WAIT_BEGIN: u32 = 1;
    /// A thread enters a futex wake.
    pub const WAKE_BEGIN: u32 = 2;
    /// The futex call of `tid` returned (`ret`, `duration_ns`).
    pub const END: u32 = 3;
    /// A kernel lock the thread waited for (`lock:contention_*`); `op` is
    /// the lock's flags, `uaddr` the lock's kernel address.
    pub const KERNEL: u32 = 4;
}

/// A futex call or kernel lock wait of one of the target's threads.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockEvent {
    /// [`lock_event`] kind.
    pub kind: u32,
    pub tid: u32,
    /// Futex command (`op & FUTEX_CMD_MASK`), or kernel lock flags.
    pub op: u32,
    /// The u32 8 bytes after the futex word when it waited: a glibc
    /// mutex's owner thread (`__owner`).
    pub owner: u32,
    pub uaddr: u64,
    pub time_ns: u64,
    /// For `END` and `KERNEL`: how long the call or wait took.
    pub duration_ns: u64,
    /// For `END`: the return value (woken threads for a wake).
    pub ret: i64,
    /// User instruction, stack and frame pointers at the call.
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// For `WAIT_BEGIN` and `WAKE_BEGIN`: the return address of a traced
    /// lock call or condvar wait in progress on the thread (0 if none).
    /// Its return probe replaced that address on the stack with the
    /// kernel's trampoline, which the loader swaps back.
    pub lock_site: u64,
    /// For `WAIT_BEGIN` and `WAKE_BEGIN`: the top of the user stack.
    pub stack: [u64; LOCK_STACK_WORDS],
}

// The kernel writes this record and userspace reads it; a change in size is
// a layout change both sides must see.
const _: () = assert!(core::mem::size_of::<LockEvent>() == 80 + 8 * LOCK_STACK_WORDS);

// SAFETY: `#[repr(C)]`, four u32 then u64s, an i64 and a u64 array (size
// asserted above), naturally aligned so no padding; any bit pattern is a
// valid value.
records!(LockEvent);

//! The lock uprobes: which functions are probed, the per-thread state the
//! kernel keeps between a lock call and its unlock, and the record of a
//! critical section.
//!
//! A lock call's entry remembers the lock and the time; its return (when
//! it succeeded) pushes the lock onto the thread's [`HeldLocks`]; the
//! unlock pops it and reports a [`HoldEvent`]. A condition-variable wait
//! releases its mutex inside libc (no `pthread_mutex_unlock` call), so the
//! wait's entry ends the section and its return starts a new one.

use crate::record::records;

/// Lock operations, passed as the uprobe attach cookie.
pub mod lock_op {
    pub const MUTEX_LOCK: u32 = 0;
    pub const MUTEX_TRYLOCK: u32 = 1;
    pub const MUTEX_TIMEDLOCK: u32 = 2;
    pub const MUTEX_CLOCKLOCK: u32 = 3;
    pub const RW_RDLOCK: u32 = 4;
    pub const RW_TRYRDLOCK: u32 = 5;
    pub const RW_TIMEDRDLOCK: u32 = 6;
    pub const RW_CLOCKRDLOCK: u32 = 7;
    pub const RW_WRLOCK: u32 = 8;
    pub const RW_TRYWRLOCK: u32 = 9;
    pub const RW_TIMEDWRLOCK: u32 = 10;
    pub const RW_CLOCKWRLOCK: u32 = 11;
    pub const MUTEX_UNLOCK: u32 = 12;
    pub const RW_UNLOCK: u32 = 13;
    /// `pthread_cond_*wait(cond, mutex, ...)`: releases and retakes `mutex`.
    pub const COND_WAIT: u32 = 14;
    pub const COND_TIMEDWAIT: u32 = 15;
    pub const COND_CLOCKWAIT: u32 = 16;
    /// `pthread_mutex_lock` probed on its path for other mutex kinds
    /// (recursive, error-checking, robust, PI), which branches away before
    /// the default path's probe. A code of its own so that, rarely taken,
    /// it can stay attached while the hot path is cycled in windows.
    pub const MUTEX_LOCK_OTHER_KINDS: u32 = 17;
    /// Number of operations.
    pub const COUNT: u32 = 18;

    /// The C symbol of each function, indexed by operation code (the last
    /// operation shares `pthread_mutex_lock`'s).
    pub const SYMBOLS: [&str; MUTEX_LOCK_OTHER_KINDS as usize] = [
        "pthread_mutex_lock",
        "pthread_mutex_trylock",
        "pthread_mutex_timedlock",
        "pthread_mutex_clocklock",
        "pthread_rwlock_rdlock",
        "pthread_rwlock_tryrdlock",
        "pthread_rwlock_timedrdlock",
        "pthread_rwlock_clockrdlock",
        "pthread_rwlock_wrlock",
        "pthread_rwlock_trywrlock",
        "pthread_rwlock_timedwrlock",
        "pthread_rwlock_clockwrlock",
        "pthread_mutex_unlock",
        "pthread_rwlock_unlock",
        "pthread_cond_wait",
        "pthread_cond_timedwait",
        "pthread_cond_clockwait",
    ];

    /// The function an operation probes.
    pub const fn symbol(op: u32) -> &'static str {
        if op == MUTEX_LOCK_OTHER_KINDS {
            SYMBOLS[MUTEX_LOCK as usize]
        } else if op < MUTEX_LOCK_OTHER_KINDS {
            SYMBOLS[op as usize]
        } else {
            "?"
        }
    }

    /// Takes a lock (entry and return probes).
    pub const fn is_acquire(op: u32) -> bool {
        op <= RW_CLOCKWRLOCK || op == MUTEX_LOCK_OTHER_KINDS
    }

    /// Releases a lock (entry probe only; the lock is argument 0).
    pub const fn is_unlock(op: u32) -> bool {
        matches!(op, MUTEX_UNLOCK | RW_UNLOCK)
    }

    /// A condition-variable wait (its mutex is argument 1).
    pub const fn is_cond(op: u32) -> bool {
        matches!(op, COND_WAIT | COND_TIMEDWAIT | COND_CLOCKWAIT)
    }

    /// May fail without taking the lock (try, timed).
    pub const fn may_fail(op: u32) -> bool {
        is_acquire(op)
            && !matches!(
                op,
                MUTEX_LOCK | MUTEX_LOCK_OTHER_KINDS | RW_RDLOCK | RW_WRLOCK
            )
    }

    /// An rwlock operation.
    pub const fn is_rwlock(op: u32) -> bool {
        matches!(op, RW_RDLOCK..=RW_CLOCKWRLOCK | RW_UNLOCK)
    }

    /// Takes an rwlock for reading.
    pub const fn is_read(op: u32) -> bool {
        matches!(op, RW_RDLOCK..=RW_CLOCKRDLOCK)
    }
}

/// [`HoldEvent::flags`].
pub mod hold_flag {
    /// A try or timed lock call that did not take the lock: only `lock`,
    /// `op`, `tid`, `lock_site`, `acquired_ns` (the call's start) and
    /// `acquire_ns` (its duration) are set.
    pub const FAILED: u32 = 1;
    /// The section began when a condition-variable wait retook its mutex
    /// (`lock_site` is the wait's call site; no acquire time).
    pub const REACQUIRED: u32 = 2;
    /// The section ended at a condition-variable wait, not an unlock.
    pub const COND_RELEASE: u32 = 4;
}

/// Locks one thread can be seen holding at once; deeper nesting is
/// counted ([`crate::counter::HELD_OVERFLOW`]) and not traced.
pub const HELD_MAX: usize = 8;

/// A lock a thread holds now.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeldLock {
    pub lock: u64,
    /// When the lock call returned (the section's start).
    pub acquired_ns: u64,
    /// The lock call's duration (0 for a condvar's retake).
    pub acquire_ns: u64,
    /// Return address of the lock call.
    pub site: u64,
    /// [`lock_op`] code of the call that took it.
    pub op: u32,
    /// [`hold_flag::REACQUIRED`] or 0.
    pub flags: u32,
}

/// The locks a thread holds now (values of [`crate::maps::HELD_LOCKS`]):
/// an unlock finds its section here, and the section's record counts the
/// other locks held ([`HoldEvent::depth`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeldLocks {
    /// Window generation the entries belong to: entries of an older one
    /// (whose unlock may have been missed while detached) are dropped.
    pub generation: u32,
    pub count: u32,
    pub locks: [HeldLock; HELD_MAX],
}

/// A lock call in progress on a thread (entry seen, return not yet).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingLock {
    pub lock: u64,
    pub entry_ns: u64,
    /// Return address of the call.
    pub site: u64,
    pub op: u32,
    /// Window generation of the entry, and 1 while the call is in progress.
    pub generation: u32,
    pub active: u32,
    pub _pad: u32,
}

/// One critical section (or a failed try/timed lock call).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HoldEvent {
    pub lock: u64,
    /// When the lock was taken (`bpf_ktime_get_ns`).
    pub acquired_ns: u64,
    /// Taken → released.
    pub hold_ns: u64,
    /// The lock call's duration: its wait to take the lock.
    pub acquire_ns: u64,
    /// Return addresses of the lock call and of the unlock (or condvar
    /// wait) call.
    pub lock_site: u64,
    pub unlock_site: u64,
    pub tid: u32,
    /// [`lock_op`] code of the call that took the lock.
    pub op: u32,
    /// [`hold_flag`] bits.
    pub flags: u32,
    /// Other locks the thread held when it took this one.
    pub depth: u32,
}

/// Index in [`crate::maps::LOCK_CTL`] of the window generation.
pub const LOCK_CTL_GENERATION: u32 = 0;

/// Byte size of the critical-section ring: 64 bytes a record, 8 MiB holds
/// about 120k sections, more than a second of a fully traced hot mutex
/// (three traps, ~4 µs, per section) on every CPU of a small machine.
pub const HOLD_RING_BYTES: u32 = 8 << 20;
/// Threads whose held locks are remembered.
pub const LOCK_THREADS_CAPACITY: u32 = 4096;

const _: () = assert!(core::mem::size_of::<HeldLock>() == 40);
const _: () = assert!(core::mem::size_of::<HeldLocks>() == 8 + 40 * HELD_MAX);
const _: () = assert!(core::mem::size_of::<PendingLock>() == 40);
const _: () = assert!(core::mem::size_of::<HoldEvent>() == 64);

// SAFETY: both `#[repr(C)]` and made of integers only, naturally aligned so
// without padding (sizes asserted above): `HoldEvent` is six u64 then four
// u32; `HeldLocks` two u32 and an array of `HeldLock`, four u64 and two u32
// each. Any bit pattern is a valid value.
records!(HoldEvent, HeldLocks);

#[cfg(test)]
mod tests {
    use super::lock_op::*;

    #[test]
    fn operations_fall_in_one_class_each() {
        for op in 0..COUNT {
            let classes = [is_acquire(op), is_unlock(op), is_cond(op)];
            assert_eq!(classes.iter().filter(|c| **c).count(), 1, "{}", symbol(op));
            assert_eq!(is_rwlock(op), symbol(op).contains("rwlock"));
            assert_eq!(
                may_fail(op),
                ["try", "timed", "clock"]
                    .iter()
                    .any(|w| symbol(op).contains(w))
                    && is_acquire(op)
            );
            assert_eq!(is_read(op), symbol(op).contains("rdlock"));
        }
    }
}

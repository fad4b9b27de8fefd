//! Lock calls from the user's side: uprobes on the pthread lock, unlock
//! and condvar-wait functions give acquisitions, the time to take a lock,
//! and how long it was held (lock return → unlock entry).
//!
//! Each thread keeps the locks it holds now in `HELD_LOCKS` (the
//! critical-section boundaries). The loader attaches these probes in
//! windows under its overhead budget, bumping the generation in `LOCK_CTL`
//! for each: state left by an earlier window, whose unlock may have been
//! missed while detached, is dropped.

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_get_attach_cookie, bpf_probe_read_user},
    macros::{map, uprobe, uretprobe},
    maps::{Array, LruHashMap, RingBuf},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext,
};
use memprof_common::{
    counter,
    locks::{
        hold_flag, lock_op, HeldLock, HeldLocks, HoldEvent, PendingLock, HELD_MAX, HOLD_RING_BYTES,
        LOCK_CTL_GENERATION, LOCK_THREADS_CAPACITY,
    },
};

use crate::maps::{bpf_now, count, current_ids};

#[map(name = "HOLD_EVENTS")]
static HOLD_EVENTS: RingBuf = RingBuf::with_byte_size(HOLD_RING_BYTES, 0);

#[map(name = "LOCK_CTL")]
static LOCK_CTL: Array<u64> = Array::with_max_entries(1, 0);

#[map(name = "HELD_LOCKS")]
static HELD_LOCKS: LruHashMap<u32, HeldLocks> =
    LruHashMap::with_max_entries(LOCK_THREADS_CAPACITY, 0);

#[map(name = "LOCK_PENDING")]
pub(crate) static PENDING: LruHashMap<u32, PendingLock> =
    LruHashMap::with_max_entries(LOCK_THREADS_CAPACITY, 0);

/// The return address of the traced lock call in progress on `tid`, if
/// any (its return probe hides it on the stack).
#[inline(always)]
pub(crate) fn call_site(tid: u32) -> u64 {
    match PENDING.get_ptr(tid) {
        // SAFETY: the pointer comes from the map lookup.
        Some(p) => unsafe {
            if (*p).active != 0 && (*p).generation == generation() {
                (*p).site
            } else {
                0
            }
        },
        None => 0,
    }
}

/// A zeroed [`HeldLocks`] to insert from: at 328 bytes it does not fit on
/// the BPF stack beside the rest.
#[map(name = "ZERO_HELD")]
static ZERO_HELD: Array<HeldLocks> = Array::with_max_entries(1, 0);

#[inline(always)]
fn generation() -> u32 {
    LOCK_CTL.get(LOCK_CTL_GENERATION).copied().unwrap_or(0) as u32
}

#[inline(always)]
fn cookie(ctx: &ProbeContext) -> u32 {
    // SAFETY: reads the cookie the loader attached this probe with; the
    // context pointer is the one the kernel passed.
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) as u32 }
}

/// The return address at the top of the stack (at a function's entry).
#[inline(always)]
fn return_address(sp: u64) -> u64 {
    // SAFETY: bpf_probe_read_user fails cleanly on a bad address.
    unsafe { bpf_probe_read_user(sp as *const u64) }.unwrap_or(0)
}

/// The thread's held locks, emptied if they belong to an older window;
/// created when missing.
#[inline(always)]
fn held_of(tid: u32, generation: u32) -> Option<&'static mut HeldLocks> {
    let held = match HELD_LOCKS.get_ptr_mut(tid) {
        Some(h) => h,
        None => {
            let zero = ZERO_HELD.get(0)?;
            if HELD_LOCKS.insert(tid, zero, 0).is_err() {
                count(counter::LOCK_STATE_ERRORS);
                return None;
            }
            HELD_LOCKS.get_ptr_mut(tid)?
        }
    };
    // SAFETY: the pointer comes from the map lookup; only this thread
    // touches its own entry, and the map keeps it while the program runs.
    let held = unsafe { &mut *held };
    if held.generation != generation {
        held.generation = generation;
        held.count = 0;
    }
    Some(held)
}

/// Sends one record; wakes the loader only once a quarter of the ring is
/// waiting (it drains on a timer otherwise).
#[inline(always)]
fn send(event: &HoldEvent) {
    let waiting = HOLD_EVENTS.query(BPF_RB_AVAIL_DATA as u64);
    let flags = if waiting >= u64::from(HOLD_RING_BYTES / 4) {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    if HOLD_EVENTS
        .output::<HoldEvent>(event, flags as u64)
        .is_err()
    {
        count(counter::HOLD_EVENTS_LOST);
    }
}

/// Ends the section of `lock` the thread holds (the most recent one, for
/// a recursive mutex), reporting it; false if the thread holds no such
/// section.
#[inline(always)]
fn release(tid: u32, lock: u64, site: u64, flags: u32) -> bool {
    let Some(held) = held_of(tid, generation()) else {
        return false;
    };
    let n = held.count as usize;
    // Forward, remembering the last match: a countdown index compiles to
    // a pointer walking backwards, whose bounds the verifier loses.
    let mut found = HELD_MAX;
    for i in 0..HELD_MAX {
        if i >= n {
            break;
        }
        if held.locks[i].lock == lock {
            found = i;
        }
    }
    if found >= HELD_MAX {
        return false;
    }
    let entry = held.locks[found];
    let end = bpf_now();
    send(&HoldEvent {
        lock,
        acquired_ns: entry.acquired_ns,
        hold_ns: end.saturating_sub(entry.acquired_ns),
        acquire_ns: entry.acquire_ns,
        lock_site: entry.site,
        unlock_site: site,
        tid,
        op: entry.op,
        flags: entry.flags | flags,
        depth: (n - 1) as u32,
    });
    // Swap-remove: the order of held locks carries nothing.
    let last = n - 1;
    if last < HELD_MAX {
        held.locks[found] = held.locks[last];
    }
    held.count = last as u32;
    true
}

/// Entry of a lock call (or a condvar wait, which releases its mutex).
#[uprobe]
pub fn mp_lock_enter(ctx: ProbeContext) -> u32 {
    let op = cookie(&ctx);
    if op < lock_op::COUNT {
        count(counter::LOCK_OP_CALLS + op);
    }
    let (_, tid) = current_ids();
    // SAFETY: `regs` is the trapped thread's register set from the kernel;
    // the probe sits where the stack pointer points at the return address
    // (the loader checks the instructions before it).
    let (sp, arg0, arg1) = unsafe { ((*ctx.regs).rsp, (*ctx.regs).rdi, (*ctx.regs).rsi) };
    let site = return_address(sp);
    let lock = if lock_op::is_cond(op) {
        release(tid, arg1, site, hold_flag::COND_RELEASE);
        arg1
    } else {
        arg0
    };
    let state = PendingLock {
        lock,
        entry_ns: 0,
        site,
        op,
        generation: generation(),
        active: 1,
        _pad: 0,
    };
    match PENDING.get_ptr_mut(tid) {
        Some(p) => {
            // SAFETY: the pointer comes from the map lookup; only this
            // thread touches its own entry.
            let p = unsafe { &mut *p };
            *p = state;
            p.entry_ns = bpf_now();
        }
        None => {
            let state = PendingLock {
                entry_ns: bpf_now(),
                ..state
            };
            if PENDING.insert(tid, state, 0).is_err() {
                count(counter::LOCK_STATE_ERRORS);
            }
        }
    }
    0
}

/// Return of a lock call or condvar wait: the lock is now held.
#[uretprobe]
pub fn mp_lock_exit(ctx: RetProbeContext) -> u32 {
    let end = bpf_now();
    let (_, tid) = current_ids();
    let Some(p) = PENDING.get_ptr_mut(tid) else {
        return 0; // entered before the probes were attached
    };
    // SAFETY: the pointer comes from the map lookup; only this thread
    // touches its own entry.
    let p = unsafe { &mut *p };
    let generation = generation();
    if p.active == 0 || p.generation != generation {
        return 0; // stale: from a window whose return probe was detached
    }
    p.active = 0;
    let ret: u64 = ctx.ret();
    let cond = lock_op::is_cond(p.op);
    // A condvar wait retakes its mutex even when it times out.
    if ret as u32 != 0 && !cond {
        send(&HoldEvent {
            lock: p.lock,
            acquired_ns: p.entry_ns,
            hold_ns: 0,
            acquire_ns: end.saturating_sub(p.entry_ns),
            lock_site: p.site,
            unlock_site: 0,
            tid,
            op: p.op,
            flags: hold_flag::FAILED,
            depth: 0,
        });
        return 0;
    }
    let Some(held) = held_of(tid, generation) else {
        return 0;
    };
    let n = held.count as usize;
    if n >= HELD_MAX {
        count(counter::HELD_OVERFLOW);
        return 0;
    }
    let (acquire_ns, flags) = if cond {
        (0, hold_flag::REACQUIRED)
    } else {
        (end.saturating_sub(p.entry_ns), 0)
    };
    held.locks[n] = HeldLock {
        lock: p.lock,
        acquired_ns: end,
        acquire_ns,
        site: p.site,
        op: p.op,
        flags,
    };
    held.count = n as u32 + 1;
    0
}

/// Entry of an unlock: the section of the lock ends.
#[uprobe]
pub fn mp_unlock(ctx: ProbeContext) -> u32 {
    let op = cookie(&ctx);
    if op < lock_op::COUNT {
        count(counter::LOCK_OP_CALLS + op);
    }
    let (_, tid) = current_ids();
    // SAFETY: as in `mp_lock_enter`.
    let (sp, lock) = unsafe { ((*ctx.regs).rsp, (*ctx.regs).rdi) };
    if !release(tid, lock, return_address(sp), 0) {
        count(counter::UNMATCHED_UNLOCKS);
    }
    0
}

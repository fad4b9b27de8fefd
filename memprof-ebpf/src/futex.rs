//! Lock contention as the kernel sees it: futex waits and wakes of the
//! target's threads (every contended user-space lock ends in one), and
//! kernel locks they wait for.
//!
//! An uncontended lock never enters the kernel and costs nothing here. A
//! futex wait or wake sends its user stack top (the lock implementation in
//! libc keeps no frame pointers, so the loader finds the return addresses
//! in it) and, for a wait, the word 8 bytes after the futex: a glibc
//! mutex's owner thread.

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_task_btf, bpf_probe_read_kernel, bpf_probe_read_user, bpf_task_pt_regs,
    },
    macros::{map, tracepoint},
    maps::{LruHashMap, RingBuf},
    programs::TracePointContext,
    Global,
};
use memprof_common::{
    counter, lock_event, LockEvent, ALLOC_THREADS_CAPACITY, LOCK_RING_BYTES, LOCK_STACK_WORDS,
};

use crate::maps::{
    bpf_now, count, current_ids, syscall_args_offset, syscall_ret_offset, target_tgid,
};

// SAFETY (no_mangle, both): the loader finds each global by this exact
// name; no other symbol in the object has it.
#[unsafe(no_mangle)]
static KLOCK_ADDR_OFFSET: Global<u32> = Global::new(8);
#[unsafe(no_mangle)]
static KLOCK_FLAGS_OFFSET: Global<u32> = Global::new(16);

#[map(name = "LOCK_EVENTS")]
static LOCK_EVENTS: RingBuf = RingBuf::with_byte_size(LOCK_RING_BYTES, 0);

/// Threads in a futex call we reported the start of (tid → start time).
#[map(name = "FUTEX_INFLIGHT")]
static FUTEX_INFLIGHT: LruHashMap<u32, u64> =
    LruHashMap::with_max_entries(ALLOC_THREADS_CAPACITY, 0);

/// A kernel lock wait in progress on a thread.
#[repr(C)]
#[derive(Clone, Copy)]
struct KernelWait {
    start_ns: u64,
    addr: u64,
    flags: u32,
    _pad: u32,
}

#[map(name = "KLOCK_INFLIGHT")]
static KLOCK_INFLIGHT: LruHashMap<u32, KernelWait> =
    LruHashMap::with_max_entries(ALLOC_THREADS_CAPACITY, 0);

/// `FUTEX_CMD_MASK`: the command without the private and clock flags.
const FUTEX_CMD_MASK: u64 = !(128 | 256);

/// Whether futex command `cmd` waits, wakes, or neither (0).
fn futex_kind(cmd: u64) -> u32 {
    match cmd {
        // WAIT, LOCK_PI, WAIT_BITSET, WAIT_REQUEUE_PI, LOCK_PI2
        0 | 6 | 9 | 11 | 13 => lock_event::WAIT_BEGIN,
        // WAKE, REQUEUE, CMP_REQUEUE, WAKE_OP, UNLOCK_PI, WAKE_BITSET,
        // CMP_REQUEUE_PI
        1 | 3 | 4 | 5 | 7 | 10 | 12 => lock_event::WAKE_BEGIN,
        _ => 0,
    }
}

/// The thread's user-mode instruction, stack and frame pointers.
#[inline(always)]
fn user_regs() -> (u64, u64, u64) {
    // SAFETY: the current task is valid while the program runs, and
    // bpf_task_pt_regs returns its saved user registers; the reads use
    // bpf_probe_read_kernel, which fails cleanly. 128, 152 and 32 are the
    // offsets of `ip`, `sp` and `bp` in x86-64's `struct pt_regs` (a user
    // ABI: ptrace exposes the same layout).
    unsafe {
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const u8;
        let ip = bpf_probe_read_kernel(regs.add(128) as *const u64).unwrap_or(0);
        let sp = bpf_probe_read_kernel(regs.add(152) as *const u64).unwrap_or(0);
        let bp = bpf_probe_read_kernel(regs.add(32) as *const u64).unwrap_or(0);
        (ip, sp, bp)
    }
}

/// Reports the start of a futex wait or wake on `uaddr`.
#[inline(always)]
fn futex_begin(kind: u32, cmd: u32, uaddr: u64) {
    let (tgid, tid) = current_ids();
    if tgid != target_tgid() {
        return;
    }
    let Some(mut entry) = LOCK_EVENTS.reserve::<LockEvent>(0) else {
        count(counter::LOCK_EVENTS_LOST);
        return;
    };
    let (ip, sp, bp) = user_regs();
    let owner = if kind == lock_event::WAIT_BEGIN {
        // SAFETY: bpf_probe_read_user fails cleanly on a bad address.
        unsafe { bpf_probe_read_user((uaddr + 8) as *const u32) }.unwrap_or(0)
    } else {
        0
    };
    let e = entry.as_mut_ptr();
    // SAFETY: `e` points at the reserved record, valid and exclusively ours
    // until submit; every field is written before it.
    unsafe {
        (*e).kind = kind;
        (*e).tid = tid;
        (*e).op = cmd;
        (*e).owner = owner;
        (*e).uaddr = uaddr;
        (*e).duration_ns = 0;
        (*e).ret = 0;
        (*e).ip = ip;
        (*e).sp = sp;
        (*e).bp = bp;
        (*e).lock_site = crate::locks::call_site(tid);
        let stack = (*e).stack.as_mut_ptr() as *mut core::ffi::c_void;
        let size = (LOCK_STACK_WORDS * 8) as u32;
        if aya_ebpf::helpers::generated::bpf_probe_read_user(
            stack,
            size,
            sp as *const core::ffi::c_void,
        ) != 0
        {
            // Near the top of the stack: keep what fits in a smaller read.
            let half = size / 4;
            if aya_ebpf::helpers::generated::bpf_probe_read_user(
                stack,
                half,
                sp as *const core::ffi::c_void,
            ) != 0
            {
                (*e).stack[0] = 0;
            }
        }
        let t = bpf_now();
        (*e).time_ns = t;
        let _ = FUTEX_INFLIGHT.insert(tid, t, 0);
    }
    submit_entry(entry);
}

#[inline(always)]
fn submit_entry(entry: aya_ebpf::maps::ring_buf::RingBufEntry<LockEvent>) {
    // Contended locks are rare next to allocator calls: wake the loader
    // once a quarter of the ring is waiting, on a timer otherwise.
    let waiting = LOCK_EVENTS.query(BPF_RB_AVAIL_DATA as u64);
    entry.submit(if waiting >= u64::from(LOCK_RING_BYTES / 4) {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    });
}

/// Reports the end of a futex call reported by `futex_begin`.
#[inline(always)]
fn futex_end(ctx: &TracePointContext) {
    let end = bpf_now();
    let (tgid, tid) = current_ids();
    if tgid != target_tgid() {
        return;
    }
    let Some(start) = FUTEX_INFLIGHT.get_ptr(tid) else {
        return;
    };
    // SAFETY: the pointer comes from the map lookup.
    let start = unsafe { *start };
    let _ = FUTEX_INFLIGHT.remove(tid);
    // SAFETY: the offset comes from this kernel's format file.
    let ret = unsafe { ctx.read_at::<i64>(syscall_ret_offset()) }.unwrap_or(0);
    let Some(mut entry) = LOCK_EVENTS.reserve::<LockEvent>(0) else {
        count(counter::LOCK_EVENTS_LOST);
        return;
    };
    let e = entry.as_mut_ptr();
    // SAFETY: as in `futex_begin`; the stack is not read for an end.
    unsafe {
        (*e).kind = lock_event::END;
        (*e).tid = tid;
        (*e).op = 0;
        (*e).owner = 0;
        (*e).uaddr = 0;
        (*e).time_ns = start;
        (*e).duration_ns = end.saturating_sub(start);
        (*e).ret = ret;
        (*e).ip = 0;
        (*e).sp = 0;
        (*e).bp = 0;
        (*e).lock_site = 0;
    }
    submit_entry(entry);
}

#[inline(always)]
fn arg(ctx: &TracePointContext, n: usize) -> u64 {
    // SAFETY: the offset comes from this kernel's format file.
    unsafe { ctx.read_at::<u64>(syscall_args_offset() + 8 * n) }.unwrap_or(0)
}

/// `futex(uaddr, op, ...)`.
#[tracepoint]
pub fn mp_futex_in(ctx: TracePointContext) -> u32 {
    let cmd = arg(&ctx, 1) & FUTEX_CMD_MASK;
    let kind = futex_kind(cmd);
    if kind != 0 {
        futex_begin(kind, cmd as u32, arg(&ctx, 0));
    }
    0
}

/// `futex_wait(uaddr, val, mask, flags, ...)` (futex2).
#[tracepoint]
pub fn mp_futexw_in(ctx: TracePointContext) -> u32 {
    futex_begin(lock_event::WAIT_BEGIN, 0, arg(&ctx, 0));
    0
}

/// `futex_wake(uaddr, mask, nr, flags)` (futex2).
#[tracepoint]
pub fn mp_futexk_in(ctx: TracePointContext) -> u32 {
    futex_begin(lock_event::WAKE_BEGIN, 1, arg(&ctx, 0));
    0
}

#[tracepoint]
pub fn mp_futex_out(ctx: TracePointContext) -> u32 {
    futex_end(&ctx);
    0
}

/// Attached to the exits of both futex2 calls.
#[tracepoint]
pub fn mp_futex2_out(ctx: TracePointContext) -> u32 {
    futex_end(&ctx);
    0
}

#[tracepoint]
pub fn mp_klock_begin(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    if tgid != target_tgid() {
        return 0;
    }
    // SAFETY: the offsets come from this kernel's format file.
    let (addr, flags) = unsafe {
        (
            ctx.read_at::<u64>(KLOCK_ADDR_OFFSET.load() as usize),
            ctx.read_at::<u32>(KLOCK_FLAGS_OFFSET.load() as usize),
        )
    };
    let wait = KernelWait {
        start_ns: bpf_now(),
        addr: addr.unwrap_or(0),
        flags: flags.unwrap_or(0),
        _pad: 0,
    };
    let _ = KLOCK_INFLIGHT.insert(tid, wait, 0);
    0
}

#[tracepoint]
pub fn mp_klock_end(_ctx: TracePointContext) -> u32 {
    let end = bpf_now();
    let (tgid, tid) = current_ids();
    if tgid != target_tgid() {
        return 0;
    }
    let Some(w) = KLOCK_INFLIGHT.get_ptr(tid) else {
        return 0;
    };
    // SAFETY: the pointer comes from the map lookup.
    let w = unsafe { *w };
    let _ = KLOCK_INFLIGHT.remove(tid);
    let Some(mut entry) = LOCK_EVENTS.reserve::<LockEvent>(0) else {
        count(counter::LOCK_EVENTS_LOST);
        return 0;
    };
    let (ip, sp, bp) = user_regs();
    let e = entry.as_mut_ptr();
    // SAFETY: as in `futex_begin`; no stack for kernel waits.
    unsafe {
        (*e).kind = lock_event::KERNEL;
        (*e).tid = tid;
        (*e).op = w.flags;
        (*e).owner = 0;
        (*e).uaddr = w.addr;
        (*e).time_ns = w.start_ns;
        (*e).duration_ns = end.saturating_sub(w.start_ns);
        (*e).ret = 0;
        (*e).ip = ip;
        (*e).sp = sp;
        (*e).bp = bp;
        (*e).lock_site = 0;
    }
    submit_entry(entry);
    0
}

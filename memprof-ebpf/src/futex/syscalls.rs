//! The fallback futex path: the `syscalls:sys_{enter,exit}_futex*`
//! tracepoints, for kernels where the sched hooks ([`super::sched`])
//! cannot be used. Every futex call of the target is seen, waits that
//! never slept and wakes that woke nobody included, but enabling a
//! syscall tracepoint sends every syscall on the machine down the slow
//! path, and the work at a wake's entry sits on the lock hand-off.

use aya_ebpf::{
    helpers::bpf_probe_read_user,
    macros::{map, tracepoint},
    maps::LruHashMap,
    programs::TracePointContext,
};
use memprof_common::{lock_event, ContentionKey, ALLOC_THREADS_CAPACITY};

use super::{
    blame, contention_of, count_waiter, futex_kind, record, released, sample_now, send_sample,
    site_of, user_ip_sp, Sample, FUTEX_CMD_MASK,
};
use crate::maps::{bpf_now, current_ids, syscall_args_offset, syscall_ret_offset, target_tgid};

/// A futex call in progress on a thread.
#[repr(C)]
#[derive(Clone, Copy)]
struct FutexCall {
    start_ns: u64,
    addr: u64,
    site: u64,
    kind: u32,
    op: u32,
    owner: u32,
    _pad: u32,
    /// The last futex word this thread was counted waiting on (in
    /// `WAITER_THREADS`): a thread waiting on the same lock again skips
    /// the lookup.
    seen: u64,
}

#[map(name = "FUTEX_INFLIGHT")]
static FUTEX_INFLIGHT: LruHashMap<u32, FutexCall> =
    LruHashMap::with_max_entries(ALLOC_THREADS_CAPACITY, 0);

/// The start of a futex wait or wake on `uaddr`.
#[inline(always)]
fn futex_begin(kind: u32, cmd: u32, uaddr: u64) {
    let (tgid, tid) = current_ids();
    if tgid != target_tgid() {
        return;
    }
    let (ip, sp) = user_ip_sp();
    let site = site_of(kind, ip, sp, crate::locks::call_site(tid));
    let owner = if kind == lock_event::WAIT {
        // SAFETY: bpf_probe_read_user fails cleanly on a bad address.
        unsafe { bpf_probe_read_user((uaddr + 8) as *const u32) }.unwrap_or(0)
    } else {
        released(uaddr, site);
        0
    };
    let call = FutexCall {
        start_ns: bpf_now(),
        addr: uaddr,
        site,
        kind,
        op: cmd,
        owner,
        _pad: 0,
        seen: 0,
    };
    // Each thread reuses its entry (marked done at the call's end rather
    // than deleted): a lookup instead of an LRU insert and delete per call.
    match FUTEX_INFLIGHT.get_ptr_mut(tid) {
        // SAFETY: the pointer comes from the map lookup; only this thread
        // touches its own entry.
        Some(p) => unsafe {
            *p = FutexCall {
                seen: (*p).seen,
                ..call
            }
        },
        None => {
            let _ = FUTEX_INFLIGHT.insert(tid, call, 0);
        }
    }
}

/// The end of a futex call `futex_begin` saw start: aggregated, the wait
/// charged to the wake that ended it, and maybe sampled.
#[inline(always)]
fn futex_end(ctx: &TracePointContext) {
    let end = bpf_now();
    let (tgid, tid) = current_ids();
    if tgid != target_tgid() {
        return;
    }
    let Some(entry) = FUTEX_INFLIGHT.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: the pointer comes from the map lookup; only this thread
    // touches its own entry. A start of 0 marks it done.
    let call = unsafe {
        let call = *entry;
        (*entry).start_ns = 0;
        call
    };
    if call.start_ns == 0 {
        return;
    }
    // SAFETY: the offset comes from this kernel's format file.
    let ret = unsafe { ctx.read_at::<i64>(syscall_ret_offset()) }.unwrap_or(0);
    let ns = end.saturating_sub(call.start_ns);
    let key = ContentionKey {
        addr: call.addr,
        site: call.site,
        kind: call.kind,
        _pad: 0,
    };
    let Some(c) = contention_of(&key) else {
        return;
    };
    let woken = if call.kind == lock_event::WAKE && ret > 0 {
        ret as u64
    } else {
        0
    };
    record(c, ns, woken);
    if call.kind == lock_event::WAIT {
        if ret == 0 {
            blame(call.addr, call.start_ns, end);
        }
        if call.seen != call.addr {
            count_waiter(call.addr, tid);
            // SAFETY: `entry` is this thread's map value, looked up above.
            unsafe { (*entry).seen = call.addr };
        }
    }
    if sample_now(c, end) {
        send_sample(&Sample {
            kind: call.kind,
            tid,
            op: call.op,
            owner: call.owner,
            addr: call.addr,
            site: call.site,
            start_ns: call.start_ns,
            duration_ns: ns,
            ret,
            lock_site: crate::locks::call_site(tid),
        });
    }
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
    futex_begin(lock_event::WAIT, 0, arg(&ctx, 0));
    0
}

/// `futex_wake(uaddr, mask, nr, flags)` (futex2).
#[tracepoint]
pub fn mp_futexk_in(ctx: TracePointContext) -> u32 {
    futex_begin(lock_event::WAKE, 1, arg(&ctx, 0));
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

//! Kernel lock waits of the target's threads (`lock:contention_*`, raw
//! tracepoints), aggregated per (lock kind, user call site).

use aya_ebpf::{
    macros::{map, raw_tracepoint},
    maps::LruHashMap,
    programs::RawTracePointContext,
};
use memprof_common::{counter, lock_event, ContentionKey, ALLOC_THREADS_CAPACITY};

use super::{
    before_window, contention_of, record_weighted, sample_now, send_sample, site_of, stride_weight,
    user_ip_sp, Sample,
};
use crate::maps::{bpf_now, count, count_by, current_ids, target_tgid};

/// A kernel lock wait in progress on a thread.
#[repr(C)]
#[derive(Clone, Copy)]
struct KernelWait {
    start_ns: u64,
    addr: u64,
    flags: u32,
    /// How many waits this one stands for (the governor's stride).
    weight: u32,
}

#[map(name = "KLOCK_INFLIGHT")]
static KLOCK_INFLIGHT: LruHashMap<u32, KernelWait> =
    LruHashMap::with_max_entries(ALLOC_THREADS_CAPACITY, 0);

/// `lock:contention_begin(void *lock, unsigned int flags)`, as a raw
/// tracepoint (see `mp_page_fault`).
#[raw_tracepoint(tracepoint = "contention_begin")]
pub fn mp_klock_begin(ctx: RawTracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    if tgid != target_tgid() {
        return 0;
    }
    let Some(weight) = stride_weight() else {
        return 0;
    };
    count(counter::FUTEX_WAITS_TRACED);
    let wait = KernelWait {
        start_ns: bpf_now(),
        addr: ctx.arg::<u64>(0),
        flags: ctx.arg::<u64>(1) as u32,
        weight,
    };
    match KLOCK_INFLIGHT.get_ptr_mut(tid) {
        // SAFETY: the pointer comes from the map lookup; only this thread
        // touches its own entry (reused, as the futex calls' are).
        Some(p) => unsafe { *p = wait },
        None => {
            let _ = KLOCK_INFLIGHT.insert(tid, wait, 0);
        }
    }
    0
}

/// The end of a kernel lock wait: aggregated per (lock kind, user site).
#[raw_tracepoint(tracepoint = "contention_end")]
pub fn mp_klock_end(_ctx: RawTracePointContext) -> u32 {
    let end = bpf_now();
    let (tgid, tid) = current_ids();
    if tgid != target_tgid() {
        return 0;
    }
    let Some(entry) = KLOCK_INFLIGHT.get_ptr_mut(tid) else {
        return 0;
    };
    // SAFETY: the pointer comes from the map lookup; only this thread
    // touches its own entry. A start of 0 marks it done.
    let w = unsafe {
        let w = *entry;
        (*entry).start_ns = 0;
        w
    };
    if w.start_ns == 0 || before_window(w.start_ns) {
        return 0;
    }
    let (ip, sp) = user_ip_sp();
    let key = ContentionKey {
        addr: u64::from(w.flags),
        site: site_of(lock_event::KERNEL, ip, sp, 0),
        kind: lock_event::KERNEL,
        _pad: 0,
    };
    let Some(c) = contention_of(&key) else {
        return 0;
    };
    let ns = end.saturating_sub(w.start_ns);
    record_weighted(c, ns, 0, u64::from(w.weight.max(1)));
    if sample_now(c, end) {
        send_sample(&Sample {
            kind: lock_event::KERNEL,
            tid,
            op: w.flags,
            owner: 0,
            addr: key.addr,
            site: key.site,
            start_ns: w.start_ns,
            duration_ns: ns,
            ret: 0,
            lock_site: 0,
        });
    }
    count_by(counter::FUTEX_HIT_NS, bpf_now().saturating_sub(end));
    0
}

//! Lock contention as the kernel sees it: futex waits and wakes of the
//! target's threads (every contended user-space lock ends in one), and
//! kernel locks they wait for.
//!
//! An uncontended lock never enters the kernel and costs nothing here. A
//! contended one is aggregated in place, per (lock, kind, call site), in
//! `CONTENTION`: counts, total and longest time, log2 buckets, and for a
//! wake the waits it ended (its holder's blame). The loader reads the map
//! on its dashboard tick and at the end. The ring carries only user-stack
//! samples, so the loader can name the sites: the first call of each key,
//! then at most one per key every 250 ms and 200 a second overall.

use aya_ebpf::{
    bindings::{BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_task_btf, bpf_probe_read_kernel, bpf_probe_read_user, bpf_task_pt_regs,
    },
    macros::{map, raw_tracepoint, tracepoint},
    maps::{Array, HashMap, LruHashMap, RingBuf},
    programs::{RawTracePointContext, TracePointContext},
};
use memprof_common::{
    counter, hint_key, key_may_sample, lock_event, log2_bucket, mix_site, take_token, wait_shares,
    Contention, ContentionKey, LockEvent, Releases, SiteHint, WaiterKey, ALLOC_THREADS_CAPACITY,
    CONTENTION_KEYS, CONTENTION_OTHER_KEYS, LOCK_RING_BYTES, LOCK_STACK_WORDS, RELEASES_KEPT,
    SAMPLES_PER_S, SITE_HINTS, SITE_HINT_FRAMES, WAITER_THREADS_CAPACITY,
};

use crate::maps::{
    bpf_now, count, current_ids, syscall_args_offset, syscall_ret_offset, target_tgid,
};

#[map(name = "LOCK_EVENTS")]
static LOCK_EVENTS: RingBuf = RingBuf::with_byte_size(LOCK_RING_BYTES, 0);

#[map(name = "CONTENTION")]
static CONTENTION: HashMap<ContentionKey, Contention> =
    HashMap::with_max_entries(CONTENTION_KEYS, 0);

#[map(name = "CONTENTION_OTHER")]
static CONTENTION_OTHER: HashMap<ContentionKey, Contention> =
    HashMap::with_max_entries(CONTENTION_OTHER_KEYS, 0);

#[map(name = "WAITER_THREADS")]
static WAITER_THREADS: LruHashMap<WaiterKey, u64> =
    LruHashMap::with_max_entries(WAITER_THREADS_CAPACITY, 0);

#[map(name = "SITE_HINTS")]
static SITE_HINTS_MAP: HashMap<u64, SiteHint> = HashMap::with_max_entries(SITE_HINTS, 0);

/// A zeroed [`Contention`] to insert from (376 bytes: too big for the
/// BPF stack beside the rest).
#[map(name = "ZERO_CONTENTION")]
static ZERO_CONTENTION: Array<Contention> = Array::with_max_entries(1, 0);

/// The sample token bucket: `[0]` credit in ns, `[1]` when last refilled.
#[map(name = "LOCK_SAMPLE_BUCKET")]
static SAMPLE_BUCKET: Array<u64> = Array::with_max_entries(2, 0);

/// The last releases (wakes) of each futex word, when and where: a
/// waiter charges each part of its wait to the holder that released at
/// its end.
#[map(name = "FUTEX_RELEASES")]
static RELEASES: LruHashMap<u64, Releases> = LruHashMap::with_max_entries(CONTENTION_KEYS, 0);

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
        0 | 6 | 9 | 11 | 13 => lock_event::WAIT,
        // WAKE, REQUEUE, CMP_REQUEUE, WAKE_OP, UNLOCK_PI, WAKE_BITSET,
        // CMP_REQUEUE_PI
        1 | 3 | 4 | 5 | 7 | 10 | 12 => lock_event::WAKE,
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

/// The thread's user-mode instruction and stack pointers, in one read
/// (`ip`, `cs`, `flags` and `sp` follow each other in `struct pt_regs`).
#[inline(always)]
fn user_ip_sp() -> (u64, u64) {
    // SAFETY: as in `user_regs`; 128 is the offset of `ip`, and `sp` is
    // the fourth word from there (152).
    unsafe {
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const u8;
        match bpf_probe_read_kernel(regs.add(128) as *const [u64; 4]) {
            Ok(words) => (words[0], words[3]),
            Err(_) => (0, 0),
        }
    }
}

/// The call site's hash: the instruction, the return addresses the
/// loader's hint names for it, and the traced lock call in progress
/// (whose return probe hides its return address on the stack).
#[inline(always)]
fn site_of(kind: u32, ip: u64, sp: u64, lock_site: u64) -> u64 {
    // The kind first: a wait and a wake at one instruction (libc's
    // `syscall()`) are different sites even before their hints exist.
    let mut h = mix_site(u64::from(kind), ip);
    // SAFETY: a map lookup; the hint is plain data, copied out.
    if let Some(hint) = unsafe { SITE_HINTS_MAP.get(hint_key(ip, kind)) }.copied() {
        for i in 0..SITE_HINT_FRAMES {
            if i as u32 >= hint.count {
                break;
            }
            let at = sp + u64::from(hint.slots[i]);
            // SAFETY: bpf_probe_read_user fails cleanly on a bad address.
            let word = unsafe { bpf_probe_read_user(at as *const u64) }.unwrap_or(0);
            h = mix_site(h, word);
        }
    }
    if lock_site != 0 {
        h = mix_site(h, lock_site);
    }
    h | 1
}

/// Adds `v` to the u64 at `p` atomically (other CPUs update the same key).
#[inline(always)]
fn add(p: *mut u64, v: u64) {
    // SAFETY: `p` points into a map value the caller looked up, valid
    // while the program runs; the add is the BPF atomic instruction.
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            p, v,
        )
    };
}

/// The aggregate of `key`, created if missing; once the table of
/// individual locks is full, the aggregate of its site (`addr` 0).
#[inline(always)]
fn contention_of(key: &ContentionKey) -> Option<*mut Contention> {
    if let Some(p) = CONTENTION.get_ptr_mut(key) {
        return Some(p);
    }
    let zero = ZERO_CONTENTION.get(0)?;
    // Fails when another CPU created it first (found next) or when full.
    let _ = CONTENTION.insert(key, zero, BPF_NOEXIST as u64);
    if let Some(p) = CONTENTION.get_ptr_mut(key) {
        return Some(p);
    }
    count(counter::CONTENTION_OVERFLOW);
    let other = ContentionKey { addr: 0, ..*key };
    if let Some(p) = CONTENTION_OTHER.get_ptr_mut(other) {
        return Some(p);
    }
    let _ = CONTENTION_OTHER.insert(other, zero, BPF_NOEXIST as u64);
    let p = CONTENTION_OTHER.get_ptr_mut(other);
    if p.is_none() {
        count(counter::CONTENTION_DROPPED);
    }
    p
}

/// Counts one call of `ns` into `c`; `woken` for a wake.
#[inline(always)]
fn record(c: *mut Contention, ns: u64, woken: u64) {
    // SAFETY: `c` comes from `contention_of`: a map value valid while the
    // program runs. Counters use atomic adds; the longest is a racy
    // compare and store (a maximum set at the same instant may be missed).
    unsafe {
        add(&raw mut (*c).count, 1);
        add(&raw mut (*c).total_ns, ns);
        if woken > 0 {
            add(&raw mut (*c).woken, woken);
        }
        let b = log2_bucket(ns);
        if b < (*c).buckets.len() {
            add(&raw mut (*c).buckets[b], 1);
        }
        if ns > (*c).max_ns {
            (*c).max_ns = ns;
        }
    }
}

/// Whether to send a stack sample of `c` now: the first call of a key,
/// then one per interval, within the overall rate. Claims the slot.
#[inline(always)]
fn sample_now(c: *mut Contention, now: u64) -> bool {
    // SAFETY: as in `record`; racing CPUs may both sample once.
    let last = unsafe { (*c).last_sample_ns };
    if !key_may_sample(last, now) {
        return false;
    }
    let (Some(credit), Some(refilled)) =
        (SAMPLE_BUCKET.get_ptr_mut(0), SAMPLE_BUCKET.get_ptr_mut(1))
    else {
        return false;
    };
    let cost = 1_000_000_000 / SAMPLES_PER_S;
    // SAFETY: both pointers come from the map lookups. The bucket is
    // updated without atomics: a race lets a sample or two more through.
    unsafe {
        let (ok, left) = take_token(*credit, *refilled, now, cost, 1_000_000_000);
        *credit = left;
        *refilled = now;
        if ok {
            (*c).last_sample_ns = now;
        }
        ok
    }
}

/// The sample of a call: what the loader needs to name its site.
struct Sample {
    kind: u32,
    tid: u32,
    op: u32,
    owner: u32,
    addr: u64,
    site: u64,
    start_ns: u64,
    duration_ns: u64,
    ret: i64,
    lock_site: u64,
}

/// Sends a stack sample.
#[inline(always)]
fn send_sample(s: &Sample) {
    let Some(mut entry) = LOCK_EVENTS.reserve::<LockEvent>(0) else {
        count(counter::LOCK_EVENTS_LOST);
        return;
    };
    let (ip, sp, bp) = user_regs();
    let e = entry.as_mut_ptr();
    // SAFETY: `e` points at the reserved record, valid and exclusively ours
    // until submit; every field is written before it.
    unsafe {
        (*e).kind = s.kind;
        (*e).tid = s.tid;
        (*e).op = s.op;
        (*e).owner = s.owner;
        (*e).addr = s.addr;
        (*e).site = s.site;
        (*e).time_ns = s.start_ns;
        (*e).duration_ns = s.duration_ns;
        (*e).ret = s.ret;
        (*e).ip = ip;
        (*e).sp = sp;
        (*e).bp = bp;
        (*e).lock_site = s.lock_site;
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
    }
    count(counter::LOCK_SAMPLES);
    // Samples are few: wake the loader once a quarter of the ring waits,
    // on a timer otherwise.
    let waiting = LOCK_EVENTS.query(BPF_RB_AVAIL_DATA as u64);
    entry.submit(if waiting >= u64::from(LOCK_RING_BYTES / 4) {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    });
}

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
            let waiter = WaiterKey {
                addr: call.addr,
                tid,
                _pad: 0,
            };
            if WAITER_THREADS.get_ptr(waiter).is_none() {
                let _ = WAITER_THREADS.insert(waiter, 1, 0);
            }
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

/// Records a release (wake) of `uaddr` from `site`, in place when the
/// word has an entry (an LRU insert costs several times a lookup).
#[inline(always)]
fn released(uaddr: u64, site: u64) {
    let now = bpf_now();
    match RELEASES.get_ptr_mut(uaddr) {
        // SAFETY: the pointer comes from the map lookup. Two releases of
        // one word at the same instant may take one slot (the lock is
        // released once; the other is a spurious wake).
        Some(r) => unsafe {
            let slot = ((*r).next as usize) % RELEASES_KEPT;
            (*r).times[slot] = now;
            (*r).sites[slot] = site;
            (*r).next += 1;
        },
        None => {
            let mut r = Releases::default();
            r.times[0] = now;
            r.sites[0] = site;
            r.next = 1;
            let _ = RELEASES.insert(uaddr, r, 0);
        }
    }
}

/// Charges a wait on `uaddr` from `start` to `end` that a wake ended to
/// the holders that released the lock during it, each for its part.
#[inline(always)]
fn blame(uaddr: u64, start: u64, end: u64) {
    // SAFETY: a map lookup; the releases are plain data, copied out.
    let Some(r) = (unsafe { RELEASES.get(uaddr) }).copied() else {
        return;
    };
    let (shares, last) = wait_shares(&r, start, end);
    for (slot, &ns) in shares.iter().enumerate() {
        if ns == 0 {
            continue;
        }
        let key = ContentionKey {
            addr: uaddr,
            site: r.sites[slot],
            kind: lock_event::WAKE,
            _pad: 0,
        };
        if let Some(c) = contention_of(&key) {
            // SAFETY: `c` is a map value from `contention_of`.
            unsafe {
                add(&raw mut (*c).caused_ns, ns);
                if last == Some(slot) {
                    add(&raw mut (*c).caused_waits, 1);
                }
            }
        }
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

/// `lock:contention_begin(void *lock, unsigned int flags)`, as a raw
/// tracepoint (see `mp_page_fault`).
#[raw_tracepoint(tracepoint = "contention_begin")]
pub fn mp_klock_begin(ctx: RawTracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    if tgid != target_tgid() {
        return 0;
    }
    let wait = KernelWait {
        start_ns: bpf_now(),
        addr: ctx.arg::<u64>(0),
        flags: ctx.arg::<u64>(1) as u32,
        _pad: 0,
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
    if w.start_ns == 0 {
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
    record(c, ns, 0);
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
    0
}

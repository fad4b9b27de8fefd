//! The allocator: entry and return of its functions (uprobes), the
//! syscalls it makes (raw syscall tracepoints), and what the kernel does
//! for it (page faults, `mmap_lock` waits).
//!
//! The uprobes are attached by the loader to the object that defines
//! `malloc`, one attachment per entry point with the operation as cookie,
//! and only for the target process; the loader attaches and detaches them
//! in windows to keep within the overhead budget, and the syscall
//! tracepoints in windows of their own. The fault and lock tracepoints
//! stay on.

use aya_ebpf::{
    bindings::{BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_attach_cookie, bpf_get_prandom_u32, bpf_probe_read_kernel, bpf_probe_read_user,
    },
    macros::{map, raw_tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, LruHashMap, RingBuf},
    programs::{ProbeContext, RawTracePointContext, RetProbeContext},
    EbpfContext, Global,
};
use memprof_common::{
    alloc_flag, alloc_op, counter, site_base, take_token, AllocCpuEvent, AllocEvent,
    AllocStackEvent, KernelStats, SiteRule, SyscallEvent, TextRange, ALLOC_CTL_GENERATION,
    ALLOC_RING_BYTES, ALLOC_SAMPLE_GAPS, ALLOC_SITES_CAPACITY, ALLOC_SITE_CHAINS_PER_S,
    ALLOC_STACKS_PER_S, ALLOC_STACK_WORDS, ALLOC_TEXT_CAPACITY, ALLOC_THREADS_CAPACITY,
    ALLOC_WAKEUP_BYTES, ALLOC_WRAPPER_DEPTH, EVENT_ALLOC, EVENT_ALLOC_CPU, EVENT_ALLOC_STACK,
    EVENT_SYSCALL,
};

use crate::maps::{bpf_now, count, current_ids, target_tgid};

/// 1 when the allocator keeps glibc's chunk header at `ptr - 8`.
// SAFETY (no_mangle): the loader finds the global by this exact name; no
// other symbol in the object has it.
#[unsafe(no_mangle)]
static ALLOC_GLIBC_HEADER: Global<u32> = Global::new(0);

#[map(name = "ALLOC_EVENTS")]
static ALLOC_EVENTS: RingBuf = RingBuf::with_byte_size(ALLOC_RING_BYTES, 0);

#[map(name = "ALLOC_CTL")]
static ALLOC_CTL: Array<u64> = Array::with_max_entries(1, 0);

/// Byte gaps between sampled allocations (exponential quantiles, written
/// by the loader; all 0 leaves sampling off).
#[map(name = "ALLOC_SAMPLE_GAPS")]
static SAMPLE_GAPS: Array<u32> = Array::with_max_entries(ALLOC_SAMPLE_GAPS, 0);

/// Token buckets of the call chains' per-second caps (credit, last
/// refill): the heap profile's samples, then the unclassified sites';
/// last, the heap profile's samples held back since the last one sent.
#[map(name = "ALLOC_STACK_BUCKET")]
static STACK_BUCKET: Array<u64> = Array::with_max_entries(5, 0);

/// Return addresses of allocation calls the loader has classified: plain
/// sites, and calls inside wrappers with the way out of their frame.
#[map(name = "ALLOC_SITES")]
static ALLOC_SITES: HashMap<u64, SiteRule> = HashMap::with_max_entries(ALLOC_SITES_CAPACITY, 0);

/// Each traced process's allocator code (written by the loader once the
/// allocator is mapped): CPU samples there also send their stack.
#[map(name = "ALLOC_TEXT")]
static ALLOC_TEXT: HashMap<u32, TextRange> = HashMap::with_max_entries(ALLOC_TEXT_CAPACITY, 0);

#[map(name = "KERNEL_STATS")]
static KERNEL_STATS: LruHashMap<u32, KernelStats> =
    LruHashMap::with_max_entries(ALLOC_THREADS_CAPACITY, 0);

/// An allocator call in progress on a thread.
#[repr(C)]
#[derive(Clone, Copy)]
struct InFlight {
    start_ns: u64,
    size: u64,
    /// Freed block, `realloc`'s old block, or `posix_memalign`'s out-pointer.
    ptr: u64,
    caller: u64,
    /// [`AllocEvent::outer`].
    outer: u64,
    /// Stack pointer at entry: a call made from inside this one (an
    /// operator new on top of malloc) runs deeper, and its return is
    /// not this call's return, which leaves the stack above it.
    sp: u64,
    /// Bytes the thread still allocates before its next call chain is
    /// sampled (kept from call to call).
    countdown: i64,
    op: u32,
    /// 1 while the call is in progress.
    active: u32,
    generation: u32,
    /// Page faults taken during the call (counted by `mp_page_fault`).
    faults: u32,
    /// The entry program's run time up to `start_ns` ([`AllocEvent::pace_ns`]).
    pace_ns: u32,
    /// [`alloc_flag`] bits known at entry.
    flags: u32,
}

#[map(name = "ALLOC_INFLIGHT")]
static INFLIGHT: LruHashMap<u32, InFlight> =
    LruHashMap::with_max_entries(ALLOC_THREADS_CAPACITY, 0);

/// A syscall in progress on a thread.
#[repr(C)]
#[derive(Clone, Copy)]
struct SysInFlight {
    start_ns: u64,
    args: [u64; 4],
    nr: u32,
    inside: u32,
}

#[map(name = "SYS_INFLIGHT")]
static SYS_INFLIGHT: LruHashMap<u32, SysInFlight> =
    LruHashMap::with_max_entries(ALLOC_THREADS_CAPACITY, 0);

#[inline(always)]
fn ctl(index: u32) -> u32 {
    ALLOC_CTL.get(index).copied().unwrap_or(0) as u32
}

/// Reads a `u64` from the target's memory (0 when it cannot be read).
#[inline(always)]
fn read_user_u64(addr: u64) -> u64 {
    // SAFETY: bpf_probe_read_user checks the address and fails cleanly on
    // unmapped or kernel memory.
    unsafe { bpf_probe_read_user(addr as *const u64) }.unwrap_or(0)
}

/// glibc's chunk header of block `ptr` (0 if not glibc or unreadable).
#[inline(always)]
fn chunk_header(ptr: u64) -> u64 {
    if ALLOC_GLIBC_HEADER.load() == 0 || ptr < 8 || ptr & 7 != 0 {
        return 0;
    }
    read_user_u64(ptr - 8)
}

/// Follows the return address `caller` out of the allocation wrappers
/// the loader has classified ([`SiteRule`]): the first return address
/// that is no wrapper's, and [`alloc_flag::UNCLASSIFIED`] when one on the
/// way is not classified yet. `sp` is the stack pointer at the
/// allocator's entry (at the return address), `bp` the frame pointer
/// there (the caller's: the entry has not touched it).
#[inline(always)]
fn past_wrappers(caller: u64, sp: u64, bp: u64) -> (u64, u32) {
    let (mut ra, mut bp) = (caller, bp);
    // The stack pointer the caller has once the call returns: the
    // callee's canonical frame address.
    let mut cfa = sp.wrapping_add(8);
    for _ in 0..ALLOC_WRAPPER_DEPTH {
        // SAFETY: a lookup in a map the loader writes and this program
        // only adds to; the value is copied out at once.
        let Some(rule) = (unsafe { ALLOC_SITES.get(ra) }).copied() else {
            // Met first here: marked so later calls do not wake the
            // loader again (an insert fails when another CPU was first).
            let pending = SiteRule {
                base: site_base::PENDING,
                ..SiteRule::default()
            };
            let new = ALLOC_SITES.insert(ra, pending, BPF_NOEXIST as u64).is_ok();
            let flags = if new { alloc_flag::NEW_SITE } else { 0 };
            return (ra, alloc_flag::UNCLASSIFIED | flags);
        };
        let base = match rule.base {
            site_base::SP => cfa,
            site_base::BP => bp,
            site_base::PENDING => return (ra, alloc_flag::UNCLASSIFIED),
            _ => return (ra, 0),
        };
        let frame = base.wrapping_add(rule.cfa_offset as i64 as u64);
        let next = read_user_u64(frame.wrapping_add(rule.ra_offset as i64 as u64));
        if next == 0 {
            return (ra, 0);
        }
        if rule.bp_offset != 0 {
            bp = read_user_u64(frame.wrapping_add(rule.bp_offset as i64 as u64));
        }
        (ra, cfa) = (next, frame);
    }
    (ra, 0)
}

#[uprobe]
pub fn mp_alloc_enter(ctx: ProbeContext) -> u32 {
    // First: the program's own run time up to `start_ns` tells how fast
    // the CPU runs the probe at this call.
    let began = bpf_now();
    // SAFETY: the helper reads the cookie the loader attached this probe
    // with; the context pointer is the one the kernel passed.
    let op = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    let (tgid, tid) = current_ids();
    if op < alloc_op::COUNT {
        count(counter::ALLOC_OP_CALLS + op);
    }
    let generation = ctl(ALLOC_CTL_GENERATION);
    // SAFETY: `regs` is the trapped thread's register set from the kernel.
    // The probe sits where the stack pointer still points at the return
    // address (the loader checks the instructions before it).
    let sp = unsafe { (*ctx.regs).rsp };
    // Each thread keeps its entry: updating it in place costs one lookup,
    // where an insert and a delete per call would cost several times more.
    let slot = INFLIGHT.get_ptr_mut(tid);
    if let Some(f) = slot {
        // SAFETY: the pointer comes from the map lookup; only this thread
        // touches its own entry.
        let f = unsafe { &*f };
        if f.generation == generation && f.active != 0 && sp < f.sp {
            // Called from inside another probed function: the outer call
            // is the one reported. (An entry whose return was never seen,
            // e.g. cut by a detach, is not deeper: it is overwritten.)
            return 0;
        }
    }
    let arg = |n: usize| ctx.arg::<u64>(n).unwrap_or(0);
    let (size, ptr) = match op {
        alloc_op::CALLOC => (arg(0).wrapping_mul(arg(1)), 0),
        op if alloc_op::is_resize(op) => (arg(1), arg(0)),
        alloc_op::REALLOCARRAY => (arg(1).wrapping_mul(arg(2)), arg(0)),
        alloc_op::POSIX_MEMALIGN => (arg(2), arg(0)),
        alloc_op::ALIGNED_ALLOC | alloc_op::MEMALIGN => (arg(1), 0),
        op if alloc_op::is_free(op) => (0, arg(0)),
        _ => (arg(0), 0),
    };
    // A read of user memory is a large part of this program's cost, so
    // frees read nothing: their block's size and class come from the
    // loader's block tracker, and sites are allocation sites.
    let (caller, outer, flags, walk_ns) = if alloc_op::is_free(op) {
        (0, 0, 0, 0)
    } else {
        // The way out of the wrappers is left out of the pace: the
        // loader's calibration calls (another process) walk none, and a
        // pace longer than theirs would scale the cost taken off this
        // call up. Both time the part they leave out alike.
        let walk_began = bpf_now();
        let caller = read_user_u64(sp);
        let (outer, flags) = if tgid == target_tgid() {
            // SAFETY: as for `rsp` above.
            let bp = unsafe { (*ctx.regs).rbp };
            past_wrappers(caller, sp, bp)
        } else {
            (0, 0)
        };
        (caller, outer, flags, bpf_now().saturating_sub(walk_began))
    };
    let state = InFlight {
        start_ns: 0,
        size,
        ptr,
        caller,
        outer,
        sp,
        countdown: 0,
        op,
        active: 1,
        generation,
        faults: 0,
        pace_ns: 0,
        flags,
    };
    match slot {
        Some(f) => {
            // SAFETY: as above.
            let f = unsafe { &mut *f };
            *f = InFlight {
                countdown: f.countdown,
                ..state
            };
            f.start_ns = bpf_now();
            f.pace_ns = f.start_ns.saturating_sub(began + walk_ns) as u32;
        }
        None => {
            let start_ns = bpf_now();
            let state = InFlight {
                countdown: sample_gap(),
                start_ns,
                pace_ns: start_ns.saturating_sub(began + walk_ns) as u32,
                ..state
            };
            if INFLIGHT.insert(tid, state, 0).is_err() {
                count(counter::ALLOC_STATE_ERRORS);
            }
        }
    }
    0
}

#[uretprobe]
pub fn mp_alloc_exit(ctx: RetProbeContext) -> u32 {
    let end = bpf_now();
    let (_, tid) = current_ids();
    let Some(f) = INFLIGHT.get_ptr_mut(tid) else {
        return 0; // entered before the probes were attached
    };
    // SAFETY: the pointer comes from the map lookup; only this thread
    // touches its own entry.
    let f = unsafe { &mut *f };
    // SAFETY: as at entry; after the return the stack pointer is above the
    // return address the call was entered with.
    let sp = unsafe { (*ctx.regs).rsp };
    if f.active == 0 || f.generation != ctl(ALLOC_CTL_GENERATION) || sp <= f.sp {
        return 0; // not this call's return (a nested call's), or stale
    }
    f.active = 0;
    let ret: u64 = ctx.ret();
    let (ptr, old_ptr, chunk) = match f.op {
        op if alloc_op::is_free(op) => (f.ptr, 0, 0),
        alloc_op::POSIX_MEMALIGN => {
            let p = if ret == 0 { read_user_u64(f.ptr) } else { 0 };
            (p, 0, chunk_header(p))
        }
        alloc_op::REALLOC | alloc_op::REALLOCARRAY | alloc_op::RALLOCX => {
            (ret, f.ptr, chunk_header(ret))
        }
        // Resized in place (or not at all): the block's usable size is
        // what it returns.
        alloc_op::XALLOCX => {
            f.size = ret;
            (f.ptr, f.ptr, 0)
        }
        _ => (ret, 0, chunk_header(ret)),
    };
    let mut event = AllocEvent {
        kind: EVENT_ALLOC,
        op: f.op,
        tid,
        page_faults: f.faults,
        start_ns: f.start_ns,
        duration_ns: end.saturating_sub(f.start_ns),
        ptr,
        old_ptr,
        size: f.size,
        chunk,
        caller: f.caller,
        pace_ns: f.pace_ns,
        flags: f.flags,
        outer: f.outer,
    };
    if ptr != 0 && f.size != 0 && !alloc_op::is_free(f.op) {
        f.countdown = f.countdown.saturating_sub(f.size as i64);
        if f.countdown <= 0 {
            f.countdown = sample_gap();
            event.flags |= alloc_flag::SAMPLED;
        }
    }
    // A sampled chain (the heap profile's cap), or one the loader needs
    // to find the site past wrappers it has not classified yet (a cap of
    // its own, so the heap profile's scaling counts its samples alone).
    let held_back = if event.flags & alloc_flag::SAMPLED != 0 {
        take_stack_token(end)
    } else {
        None
    };
    if held_back.is_none() {
        event.flags &= !alloc_flag::SAMPLED;
    }
    if held_back.is_some() || event.flags & alloc_flag::UNCLASSIFIED != 0 && take_site_token(end) {
        // SAFETY: as above; the frame pointer is the caller's again
        // (callee-saved).
        let bp = unsafe { (*ctx.regs).rbp };
        submit_stack(&event, sp, bp, held_back.unwrap_or(0));
        return 0;
    }
    let wake = event.flags & alloc_flag::NEW_SITE != 0;
    submit(event, wake);
    0
}

/// A byte gap to the next sampled allocation, or "never" when the loader
/// wrote no gaps.
#[inline(always)]
fn sample_gap() -> i64 {
    // SAFETY: the helper only returns a pseudo-random number.
    let i = unsafe { bpf_get_prandom_u32() } % ALLOC_SAMPLE_GAPS;
    match SAMPLE_GAPS.get(i).copied().unwrap_or(0) {
        0 => i64::MAX,
        gap => i64::from(gap),
    }
}

/// Whether the heap profile's per-second cap lets one more sampled call
/// chain through (counted either way): if so, the chains held back since
/// the last one let through, which this one stands for too.
#[inline(always)]
fn take_stack_token(now: u64) -> Option<u64> {
    let ok = take_bucket_token(0, now, ALLOC_STACKS_PER_S);
    count(if ok {
        counter::ALLOC_STACKS
    } else {
        counter::ALLOC_STACKS_CAPPED
    });
    let Some(held) = STACK_BUCKET.get_ptr_mut(4) else {
        return ok.then_some(0);
    };
    // SAFETY: the pointer comes from the map lookup. Updated without
    // atomics: a race may give a held-back chain to two samples or none
    // (the loader's session total covers what is left).
    unsafe {
        if ok {
            let n = *held;
            *held = 0;
            Some(n)
        } else {
            *held += 1;
            None
        }
    }
}

/// Whether the cap of chains sent for unclassified return addresses lets
/// one more through (counted either way).
#[inline(always)]
fn take_site_token(now: u64) -> bool {
    let ok = take_bucket_token(2, now, ALLOC_SITE_CHAINS_PER_S);
    count(if ok {
        counter::ALLOC_SITE_CHAINS
    } else {
        counter::ALLOC_SITE_CHAINS_CAPPED
    });
    ok
}

/// One token of the bucket at `first` (credit) and `first + 1` (last
/// refill) of [`STACK_BUCKET`], refilled at `per_s` a second up to one
/// second's worth.
#[inline(always)]
fn take_bucket_token(first: u32, now: u64, per_s: u64) -> bool {
    let (Some(credit), Some(refilled)) = (
        STACK_BUCKET.get_ptr_mut(first),
        STACK_BUCKET.get_ptr_mut(first + 1),
    ) else {
        return false;
    };
    // SAFETY: both pointers come from the map lookups. Updated without
    // atomics: a race lets a chain or two more through.
    unsafe {
        let (ok, left) = take_token(
            *credit,
            *refilled,
            now,
            1_000_000_000 / per_s,
            1_000_000_000,
        );
        *credit = left;
        *refilled = now;
        ok
    }
}

/// Copies the user stack from `sp` into `stack`: all of it, or, near the
/// top of the stack (or where it is not resident), the first quarter;
/// when neither can be read, the first word is zero and the loader knows.
#[inline(always)]
fn copy_stack_top(stack: &mut [u64; ALLOC_STACK_WORDS], sp: u64) {
    let to = stack.as_mut_ptr() as *mut core::ffi::c_void;
    let size = (ALLOC_STACK_WORDS * 8) as u32;
    let from = sp as *const core::ffi::c_void;
    // SAFETY: `to` is `size` writable bytes; bpf_probe_read_user checks the
    // user address and fails cleanly (leaving zeroes) when it cannot read.
    unsafe {
        if aya_ebpf::helpers::generated::bpf_probe_read_user(to, size, from) != 0
            && aya_ebpf::helpers::generated::bpf_probe_read_user(to, size / 4, from) != 0
        {
            stack[0] = 0;
        }
    }
}

/// Sends an allocation with its caller's stack: `sp` and `bp` are the
/// caller's right after the return, `call.caller` its next instruction.
#[inline(always)]
fn submit_stack(call: &AllocEvent, sp: u64, bp: u64, held_back: u64) {
    let Some(mut entry) = ALLOC_EVENTS.reserve::<AllocStackEvent>(0) else {
        count(counter::ALLOC_EVENTS_LOST);
        return;
    };
    let e = entry.as_mut_ptr();
    // SAFETY: `e` points at the reserved record, valid and exclusively ours
    // until submit; every field is written before it.
    unsafe {
        (*e).call = AllocEvent {
            kind: EVENT_ALLOC_STACK,
            ..*call
        };
        (*e).ip = call.caller;
        (*e).sp = sp;
        (*e).bp = bp;
        (*e).held_back = held_back;
        copy_stack_top(&mut (*e).stack, sp);
    }
    // A return address met for the first time: the loader classifies it
    // now rather than at its next drain, so few calls go unclassified.
    entry.submit(if call.flags & alloc_flag::NEW_SITE != 0 {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    });
}

/// A CPU sample of user code at `ip`: when it is the allocator's code,
/// sends the thread's registers and stack top, for the loader to find the
/// allocation call the time is spent for. No frame pointer can be
/// trusted there, so the stack is copied rather than walked.
#[inline(always)]
pub fn sample_in_allocator(tgid: u32, tid: u32, time_ns: u64, ip: u64, sp: u64, bp: u64) {
    // SAFETY: a read of a map value, copied out at once.
    let Some(range) = (unsafe { ALLOC_TEXT.get(tgid) }).copied() else {
        return;
    };
    if ip < range.start || ip >= range.end {
        return;
    }
    let Some(mut entry) = ALLOC_EVENTS.reserve::<AllocCpuEvent>(0) else {
        count(counter::ALLOC_EVENTS_LOST);
        return;
    };
    let e = entry.as_mut_ptr();
    // SAFETY: `e` points at the reserved record, valid and exclusively ours
    // until submit; every field is written before it.
    unsafe {
        (*e).kind = EVENT_ALLOC_CPU;
        (*e).tid = tid;
        (*e).tgid = tgid;
        (*e)._pad = 0;
        (*e).time_ns = time_ns;
        (*e).ip = ip;
        (*e).sp = sp;
        (*e).bp = bp;
        copy_stack_top(&mut (*e).stack, sp);
    }
    entry.submit(BPF_RB_NO_WAKEUP as u64);
}

/// The cheapest possible entry probe: for the benchmark's "bare uprobe
/// floor" (the trap cost alone), attached where `mp_alloc_enter` would be.
#[uprobe]
pub fn mp_alloc_floor(_ctx: ProbeContext) -> u32 {
    0
}

/// The return-probe half of the floor.
#[uretprobe]
pub fn mp_alloc_flret(_ctx: RetProbeContext) -> u32 {
    0
}

/// Writes one record to the allocator ring, waking the loader when `wake`
/// or when a good part of it is waiting (it drains on a timer otherwise).
#[inline(always)]
fn submit<T: 'static>(event: T, wake: bool) {
    let Some(mut entry) = ALLOC_EVENTS.reserve::<T>(0) else {
        count(counter::ALLOC_EVENTS_LOST);
        return;
    };
    entry.write(event);
    // Wake the loader once, as the waiting data crosses the threshold (not
    // at every record after it: at a million calls a second that is a
    // storm of wake-ups). The loader drains every 100 ms anyway, and the
    // ring holds several times what comes in meanwhile.
    let waiting = ALLOC_EVENTS.query(BPF_RB_AVAIL_DATA as u64);
    let crossing = (ALLOC_WAKEUP_BYTES..ALLOC_WAKEUP_BYTES + 4096).contains(&waiting);
    entry.submit(if crossing || wake {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    });
}

/// The allocator operation in progress on `tid` (`op + 1`), or 0.
#[inline(always)]
fn op_in_progress(tid: u32) -> u32 {
    match INFLIGHT.get_ptr(tid) {
        // SAFETY: the pointer comes from the map lookup.
        Some(f) => unsafe {
            if (*f).active != 0 && (*f).generation == ctl(ALLOC_CTL_GENERATION) {
                (*f).op + 1
            } else {
                0
            }
        },
        None => 0,
    }
}

/// Our code ([`memprof_common::syscall`]) of x86-64 syscall `nr`, if it
/// is one of the allocator's.
#[inline(always)]
fn alloc_syscall(nr: u64) -> Option<u32> {
    use memprof_common::syscall::*;
    match nr {
        9 => Some(MMAP),
        11 => Some(MUNMAP),
        25 => Some(MREMAP),
        28 => Some(MADVISE),
        12 => Some(BRK),
        10 => Some(MPROTECT),
        _ => None,
    }
}

/// `raw_syscalls:sys_enter(struct pt_regs *regs, long id)`, every syscall
/// on the machine while attached: the loader attaches it with the
/// allocator's windows (see `features::alloc::syscalls`), because an
/// enabled syscall tracepoint sends every syscall down the slow path.
/// Counts the target's syscalls (what that path costs it) and starts the
/// allocator's.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn mp_sc_enter(ctx: RawTracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    if tgid != target_tgid() {
        return 0;
    }
    count(counter::SYSCALLS_SEEN);
    let Some(nr) = alloc_syscall(ctx.arg::<u64>(1)) else {
        return 0;
    };
    let regs = ctx.arg::<u64>(0) as *const u8;
    // SAFETY: `regs` is the tracepoint's `struct pt_regs *`; the read goes
    // through bpf_probe_read_kernel, which fails cleanly. From offset 56 of
    // x86-64's pt_regs: r10, r9, r8, ax, cx, dx, si, di (the arguments are
    // di, si, dx, r10).
    let Ok(w) = (unsafe { bpf_probe_read_kernel(regs.add(56) as *const [u64; 8]) }) else {
        return 0;
    };
    let state = SysInFlight {
        start_ns: bpf_now(),
        args: [w[7], w[6], w[5], w[0]],
        nr,
        inside: op_in_progress(tid),
    };
    let _ = SYS_INFLIGHT.insert(tid, state, 0);
    0
}

/// `raw_syscalls:sys_exit(struct pt_regs *regs, long ret)`: the end of an
/// allocator syscall `mp_sc_enter` saw start.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn mp_sc_exit(ctx: RawTracePointContext) -> u32 {
    let end = bpf_now();
    let (tgid, tid) = current_ids();
    if tgid != target_tgid() {
        return 0;
    }
    let regs = ctx.arg::<u64>(0) as *const u8;
    // SAFETY: as in `mp_sc_enter`; 120 is the offset of `orig_ax`, the
    // syscall number.
    let nr = unsafe { bpf_probe_read_kernel(regs.add(120) as *const u64) }.unwrap_or(u64::MAX);
    let Some(nr) = alloc_syscall(nr) else {
        return 0;
    };
    let Some(s) = SYS_INFLIGHT.get_ptr(tid) else {
        return 0;
    };
    // SAFETY: the pointer comes from the map lookup; this thread's entry.
    let s = unsafe { *s };
    let _ = SYS_INFLIGHT.remove(tid);
    if s.nr != nr {
        return 0;
    }
    submit(
        SyscallEvent {
            kind: EVENT_SYSCALL,
            nr,
            tid,
            inside: s.inside,
            start_ns: s.start_ns,
            duration_ns: end.saturating_sub(s.start_ns),
            args: s.args,
            ret: ctx.arg::<i64>(1),
        },
        false,
    );
    0
}

/// This thread's kernel statistics, created on first use.
#[inline(always)]
fn stats(tid: u32) -> Option<&'static mut KernelStats> {
    if KERNEL_STATS.get_ptr_mut(tid).is_none() {
        let _ = KERNEL_STATS.insert(tid, KernelStats::default(), 0);
    }
    // SAFETY: the pointer comes from the map lookup; only this thread
    // updates its own entry, so there is no concurrent writer.
    KERNEL_STATS.get_ptr_mut(tid).map(|p| unsafe { &mut *p })
}

// The three below read no argument: raw tracepoints, whose links the
// kernel removes without the grace period a perf-event tracepoint waits
// for under a global mutex (~40-90 ms each, one after the other, at exit).
#[raw_tracepoint(tracepoint = "page_fault_user")]
pub fn mp_page_fault(_ctx: RawTracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    if tgid != target_tgid() {
        return 0;
    }
    // The call in progress counts its own faults, for the loader's split.
    let mut in_alloc = false;
    if let Some(f) = INFLIGHT.get_ptr_mut(tid) {
        // SAFETY: the pointer comes from the map lookup; only this thread
        // touches its own entry (a fault runs on the faulting thread).
        let f = unsafe { &mut *f };
        if f.active != 0 && f.generation == ctl(ALLOC_CTL_GENERATION) {
            in_alloc = true;
            f.faults = f.faults.saturating_add(1);
        }
    }
    if let Some(s) = stats(tid) {
        s.page_faults += 1;
        if in_alloc {
            s.page_faults_in_alloc += 1;
        }
    }
    0
}

#[raw_tracepoint(tracepoint = "mmap_lock_start_locking")]
pub fn mp_mmlock_start(_ctx: RawTracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    if tgid == target_tgid() {
        if let Some(s) = stats(tid) {
            s.mmap_lock_start_ns = bpf_now();
        }
    }
    0
}

/// An acquisition slower than this waited for another holder (an
/// uncontended one takes well under a microsecond, tracing included).
const MMAP_LOCK_WAIT_NS: u64 = 2_000;

#[raw_tracepoint(tracepoint = "mmap_lock_acquire_returned")]
pub fn mp_mmlock_done(_ctx: RawTracePointContext) -> u32 {
    let end = bpf_now();
    let (tgid, tid) = current_ids();
    if tgid != target_tgid() {
        return 0;
    }
    if let Some(s) = KERNEL_STATS.get_ptr_mut(tid) {
        // SAFETY: as in `stats`.
        let s = unsafe { &mut *s };
        if s.mmap_lock_start_ns != 0 {
            let waited = end.saturating_sub(s.mmap_lock_start_ns);
            s.mmap_lock_start_ns = 0;
            if waited >= MMAP_LOCK_WAIT_NS {
                s.mmap_lock_waits += 1;
                s.mmap_lock_wait_ns += waited;
            }
        }
    }
    0
}

//! Futex waits seen as the sleeps they are, from the scheduler's raw
//! tracepoints, with nothing on the futex syscalls themselves.
//!
//! A syscall tracepoint, once enabled, sends every syscall on the machine
//! down the slow path, and work at a wake's entry delays the hand-off of
//! the lock it releases. Here a futex call that does not sleep (an
//! uncontended wake, a wait whose word already changed) costs nothing:
//! - `sched_switch`, the thread going to sleep (`prev`, still the current
//!   task, so its stack can be read): if it sleeps inside a futex wait,
//!   its word, call site and the mutex's owner go into its slot of
//!   `FUTEX_WAITING`, found by hashing its task pointer (an array
//!   lookup, cheap enough for every context switch on the machine);
//! - `sched_waking`, in the waker's context before the sleeper is queued
//!   to run: if the sleeper has a wait in progress and the waker is in a
//!   futex wake of the target, the waker's call site and the time; a
//!   futex wake of the target that wakes a task with no wait in progress
//!   (a waiter not yet asleep) counts as the waker's release;
//! - `sched_switch` again, the sleeper coming back (`next`): the wait is
//!   aggregated, the release recorded and the wait charged to the
//!   holders that released the lock during it (as the syscall path does
//!   at the futex call's exit).
//!
//! The governor's stride (`FUTEX_CTL`) makes the sleep side trace each
//! wait with probability 1/N, a traced wait then counting for N.

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{
        bpf_get_current_task_btf, bpf_probe_read_kernel, bpf_probe_read_user, bpf_task_pt_regs,
    },
    macros::{map, raw_tracepoint},
    maps::Array,
    programs::RawTracePointContext,
};
use memprof_common::{
    counter, futex_ctl, futex_nr, futex_slot, key_may_sample, lock_event, sample_slot,
    ContentionKey, WaitSpan, FUTEX_SLOTS, FUTEX_SLOT_GROUP, SAMPLE_SLOTS, SPANS_PER_S,
};

use super::{
    before_window, blame_weighted, contention_of, count_waiter, futex_kind, record_weighted,
    released_at, send_sample, site_of, stride_weight, take_bucket_token, take_sample_token, Sample,
    CTL, FUTEX_CMD_MASK, SPAN_BUCKET, WAIT_SPANS,
};
use crate::{
    locks::call_site,
    maps::{bpf_now, count, count_by, current_ids, target_tgid},
};

/// A futex wait in progress (`start_ns` ≠ 0) or the last one of the
/// thread whose task pointer is `task`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Waiting {
    task: u64,
    /// When it went to sleep; 0 when no wait is in progress. Written last
    /// at the sleep and read first by the others.
    start_ns: u64,
    addr: u64,
    site: u64,
    /// When a waker woke it (0: not yet), and the waker's site (0: not a
    /// futex wake of the target: a signal, a time-out, another process).
    woken_ns: u64,
    waker_site: u64,
    /// The last futex word the thread was counted waiting on
    /// (`WAITER_THREADS`): waiting on it again skips the lookup.
    seen: u64,
    tid: u32,
    /// The u32 8 bytes after the word at the sleep (a glibc mutex's
    /// `__owner`).
    owner: u32,
    /// How many waits this one stands for (the stride when it slept); 0
    /// for a wait the stride skipped ([`mark_untraced`]).
    weight: u32,
    op: u32,
    /// The waker's thread (with `waker_site`).
    waker_tid: u32,
    /// The owner's count of releases (`RELEASES_BY`) at the sleep.
    owner_releases: u32,
    /// Non-zero once a thread hashed here found another's wait in
    /// progress and took another slot of the group ([`slot_of`]).
    spilled: u32,
    _pad: u32,
}

#[map(name = "FUTEX_WAITING")]
static WAITING: Array<Waiting> = Array::with_max_entries(FUTEX_SLOTS, 0);

/// Per thread (tid modulo the size): the futex wakes it made that woke a
/// wait of the target, traced or skipped by the stride, or a task with
/// no wait in progress ([`release_before_sleep`]; counted while spans are
/// wanted). An owner that woke a waiter with no other wake since that
/// waiter's sleep held the lock throughout: the wait's span is its
/// section ([`send_span`]). Counting a wake that was no release only
/// withholds a span.
#[map(name = "FUTEX_RELEASES_BY")]
static RELEASES_BY: Array<u32> = Array::with_max_entries(FUTEX_SLOTS, 0);

/// The releases counted for thread `tid` so far, and its counter.
#[inline(always)]
fn releases_by(tid: u32) -> Option<*mut u32> {
    RELEASES_BY.get_ptr_mut(tid & (FUTEX_SLOTS - 1))
}

/// Per-key sample clocks: `[tag, last sample time]`.
#[map(name = "FUTEX_SAMPLE_CLOCK")]
static SAMPLE_CLOCK: Array<[u64; 2]> = Array::with_max_entries(SAMPLE_SLOTS, 0);

/// What the current thread's saved user registers say about its syscall.
struct SyscallRegs {
    nr: u64,
    arg0: u64,
    arg1: u64,
    ip: u64,
    sp: u64,
}

/// The current thread's syscall number, first two arguments, instruction
/// and stack pointers, in one read.
#[inline(always)]
fn syscall_regs() -> Option<SyscallRegs> {
    // SAFETY: the current task is valid while the program runs, and
    // bpf_task_pt_regs returns its saved user registers, read with
    // bpf_probe_read_kernel, which fails cleanly. From offset 104 of
    // x86-64's `struct pt_regs` (a user ABI: ptrace exposes the same
    // layout): si, di, orig_ax (the syscall number), ip, cs, flags, sp.
    let w = unsafe {
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const u8;
        bpf_probe_read_kernel(regs.add(104) as *const [u64; 7]).ok()?
    };
    Some(SyscallRegs {
        nr: w[2],
        arg0: w[1],
        arg1: w[0],
        ip: w[3],
        sp: w[6],
    })
}

/// Whether a wait of this kind may be sampled now: the first of its key
/// (as far as its clock slot can tell), then one per interval, within
/// the overall rate. Claims the slot.
#[inline(always)]
fn key_sample_now(addr: u64, site: u64, kind: u32, now: u64) -> bool {
    let (slot, tag) = sample_slot(addr, site, kind);
    let Some(p) = SAMPLE_CLOCK.get_ptr_mut(slot) else {
        return false;
    };
    // SAFETY: the pointer comes from the map lookup; racing CPUs may
    // both sample once.
    unsafe {
        let last = if (*p)[0] == tag { (*p)[1] } else { 0 };
        if !key_may_sample(last, now) || !take_sample_token(now) {
            return false;
        }
        (*p)[0] = tag;
        (*p)[1] = now;
    }
    true
}

/// `prev` (the current task) goes to sleep: note the wait if it sleeps in
/// a futex wait of the target.
#[inline(always)]
fn sleeping(task: u64) {
    let (tgid, tid) = current_ids();
    if tgid != target_tgid() {
        return;
    }
    let Some(r) = syscall_regs() else {
        return;
    };
    let op = match r.nr {
        futex_nr::FUTEX => {
            let cmd = r.arg1 & FUTEX_CMD_MASK;
            if futex_kind(cmd) != lock_event::WAIT {
                return;
            }
            cmd as u32
        }
        futex_nr::FUTEX_WAIT => 0,
        _ => return,
    };
    let Some(weight) = stride_weight() else {
        skipped(task, r.arg0, tid);
        return;
    };
    let now = bpf_now();
    let addr = r.arg0;
    let lock_site = call_site(tid);
    let site = site_of(lock_event::WAIT, r.ip, r.sp, lock_site);
    // SAFETY: bpf_probe_read_user fails cleanly on a bad address.
    let owner = unsafe { bpf_probe_read_user((addr + 8) as *const u32) }.unwrap_or(0);
    // SAFETY: the pointer comes from the map lookup; a plain integer.
    let owner_releases = releases_by(owner).map_or(0, |c| unsafe { *c });
    let Some(w) = claim_slot(task) else {
        return;
    };
    // SAFETY: the pointer comes from the map lookup. Only this thread's
    // sleep writes a slot it owns; `start_ns` goes last, so a waker on
    // another CPU sees either no wait or a whole one.
    unsafe {
        (*w).addr = addr;
        (*w).site = site;
        (*w).woken_ns = 0;
        (*w).waker_site = 0;
        (*w).waker_tid = 0;
        (*w).owner_releases = owner_releases;
        (*w).tid = tid;
        (*w).owner = owner;
        (*w).weight = weight;
        (*w).op = op;
        (*w).start_ns = now;
    }
    count(counter::FUTEX_WAITS_TRACED);
    if key_sample_now(addr, site, lock_event::WAIT, now) {
        send_sample(&Sample {
            kind: lock_event::WAIT,
            tid,
            op,
            owner,
            addr,
            site,
            start_ns: now,
            duration_ns: 0,
            ret: 0,
            lock_site,
        });
    }
    count_by(counter::FUTEX_HIT_NS, bpf_now().saturating_sub(now));
}

/// Whether the loader asked for wait spans ([`send_span`]).
#[inline(always)]
fn spans_wanted() -> bool {
    CTL.get(futex_ctl::SPANS).copied().unwrap_or(0) != 0
}

/// The slot of the thread whose task pointer is `task`, about to go to
/// sleep: its hashed slot, or, when another thread's wait is in progress
/// there, the first other slot of its group of [`FUTEX_SLOT_GROUP`] that
/// is free or already its own. All held is a collision, counted: the
/// older wait in its hashed slot is lost. (In a convoy every thread
/// sleeps nearly always: with one slot, two of 64 threads shared it one
/// run in 16, and a CI run's 64-thread report lost 184 waits and a
/// thread; with pairs, three of 256 threads shared one about one run in
/// a hundred, and a CI run's 256-thread convoy lost 16 waits.)
#[inline(always)]
fn claim_slot(task: u64) -> Option<*mut Waiting> {
    let slot = futex_slot(task);
    let w = WAITING.get_ptr_mut(slot)?;
    // SAFETY: the pointers come from the map lookups; only a sleeping
    // thread writes `task`, `seen` and `spilled` of the slots it takes.
    unsafe {
        if (*w).task == task {
            return Some(w);
        }
        if (*w).start_ns != 0 {
            for k in 1..FUTEX_SLOT_GROUP {
                if let Some(v) = WAITING.get_ptr_mut(slot ^ k) {
                    if (*v).task == task || (*v).start_ns == 0 {
                        (*w).spilled = 1;
                        take_slot(v, task);
                        return Some(v);
                    }
                }
            }
            count(counter::FUTEX_SLOT_COLLISIONS);
        }
        take_slot(w, task);
    }
    Some(w)
}

/// Makes slot `w` the thread `task`'s.
///
/// # Safety
/// `w` comes from a lookup of `WAITING`.
#[inline(always)]
unsafe fn take_slot(w: *mut Waiting, task: u64) {
    // SAFETY: the caller's pointer is a map value.
    unsafe {
        if (*w).task != task {
            (*w).task = task;
            (*w).seen = 0;
        }
    }
}

/// The slot the thread whose task pointer is `task` took at its last
/// sleep ([`claim_slot`]), if it still holds it: its hashed slot, or
/// another of its group when the hashed one has `spilled` (more lookups
/// only then: this runs on every context switch of the machine), the
/// first with its task, as [`claim_slot`] takes them.
#[inline(always)]
fn slot_of(task: u64) -> Option<*mut Waiting> {
    let slot = futex_slot(task);
    let p = WAITING.get_ptr_mut(slot)?;
    // SAFETY: the pointer comes from the map lookup; plain integers.
    unsafe {
        if (*p).task == task {
            return Some(p);
        }
        if (*p).spilled == 0 {
            return None;
        }
    }
    for k in 1..FUTEX_SLOT_GROUP {
        let q = WAITING.get_ptr_mut(slot ^ k)?;
        // SAFETY: as above.
        if unsafe { (*q).task } == task {
            return Some(q);
        }
    }
    None
}

/// A wait the stride skips: its thread still waited on the lock
/// (`WAITER_THREADS`, once per thread and lock: a 64-thread convoy's
/// report missed a thread whose few waits the stride all skipped); and,
/// when spans are wanted, it is marked ([`mark_untraced`]). The thread's
/// slot remembers the lock it was last counted on. Without spans, a slot
/// another thread holds is not taken for that (its wait may be in
/// progress): the map is asked instead. With spans the slot is claimed
/// first and serves both, one lookup instead of two on this path, which
/// runs before the waiter sleeps (a slot taken from another thread starts
/// with nothing seen, so the lock is counted, as the map would be asked).
#[inline(always)]
fn skipped(task: u64, addr: u64, tid: u32) {
    let spans = spans_wanted();
    let slot = if spans {
        claim_slot(task)
    } else {
        slot_of(task)
    };
    let Some(w) = slot else {
        count_waiter(addr, tid);
        return;
    };
    // SAFETY: the pointer comes from the map lookup; only this thread's
    // sleep writes `seen` of a slot it holds.
    unsafe {
        if (*w).seen != addr {
            (*w).seen = addr;
            count_waiter(addr, tid);
        }
    }
    if spans {
        mark_untraced(w);
    }
}

/// A wait the stride skips still counts its waker's release
/// (`RELEASES_BY`), or a traced wait could not tell whether its owner
/// released the lock to a skipped one first. The slot says only that a
/// wait is in progress (`weight` 0): nothing is timed or aggregated.
#[inline(always)]
fn mark_untraced(w: *mut Waiting) {
    // SAFETY: the pointer comes from the map lookup; as in `sleeping`,
    // `start_ns` goes last.
    unsafe {
        (*w).woken_ns = 0;
        (*w).weight = 0;
        (*w).start_ns = 1;
    }
}

/// Sends the span of wait `w`, which ended at `end`, when the loader
/// asked for them, within [`SPANS_PER_S`], if its owner released the
/// lock only once during it (the wake that ended it). Written in place
/// in the ring (a copy on the stack beside the rest makes the compiler
/// zero it with a call the verifier rejects).
#[inline(always)]
fn send_span(w: &Waiting, end: u64) {
    if !spans_wanted() {
        return;
    }
    // SAFETY: the pointer comes from the map lookup; a plain integer.
    let since = releases_by(w.owner).map_or(0, |c| unsafe { *c });
    if since != w.owner_releases.wrapping_add(1) {
        // It released the lock to another waiter first: it was out of
        // its section for part of the wait.
        return;
    }
    if !take_bucket_token(&SPAN_BUCKET, end, 1_000_000_000 / SPANS_PER_S) {
        return;
    }
    let Some(mut entry) = WAIT_SPANS.reserve::<WaitSpan>(0) else {
        count(counter::WAIT_SPANS_LOST);
        return;
    };
    let e = entry.as_mut_ptr();
    // SAFETY: `e` points at the reserved record, valid and exclusively ours
    // until submit; every field is written before it.
    unsafe {
        (*e).addr = w.addr;
        (*e).start_ns = w.start_ns;
        (*e).woken_ns = w.woken_ns;
        (*e).end_ns = end;
        (*e).waiter = w.tid;
        (*e).holder = w.owner;
        (*e).weight = w.weight;
        (*e)._pad = 0;
    }
    entry.submit(BPF_RB_NO_WAKEUP as u64);
    count(counter::WAIT_SPANS);
}

/// `next` comes back on a CPU: the end of its futex wait, if one is in
/// progress. Runs on every context switch, so the miss is one array
/// lookup and a compare.
#[inline(always)]
fn woke(task: u64) {
    let Some(p) = slot_of(task) else {
        return;
    };
    // SAFETY: the pointer comes from the map lookup; the thread is not
    // running, so nothing else writes its slot but a late waker's
    // `woken_ns`, which this copy has or misses as a whole wake.
    let w = unsafe {
        if (*p).task != task || (*p).start_ns == 0 {
            return;
        }
        if (*p).weight == 0 || before_window((*p).start_ns) {
            // A skipped wait ([`mark_untraced`]), or one that slept
            // before the hooks' window opened (its end unseen).
            (*p).start_ns = 0;
            return;
        }
        let w = *p;
        (*p).start_ns = 0;
        if w.seen != w.addr {
            (*p).seen = w.addr;
        }
        w
    };
    let end = bpf_now();
    let ns = end.saturating_sub(w.start_ns);
    let weight = u64::from(w.weight.max(1));
    let key = ContentionKey {
        addr: w.addr,
        site: w.site,
        kind: lock_event::WAIT,
        _pad: 0,
    };
    if let Some(c) = contention_of(&key) {
        record_weighted(c, ns, 0, weight);
    }
    if w.waker_site != 0 {
        released_at(w.addr, w.waker_site, w.woken_ns, (w.waker_tid, w.tid, end));
        let key = ContentionKey {
            addr: w.addr,
            site: w.waker_site,
            kind: lock_event::WAKE,
            _pad: 0,
        };
        if let Some(c) = contention_of(&key) {
            record_weighted(c, 0, 1, weight);
        }
        blame_weighted(w.addr, w.start_ns, end, weight);
        if w.owner != 0 && w.owner == w.waker_tid {
            send_span(&w, end);
        }
    }
    if w.seen != w.addr {
        count_waiter(w.addr, w.tid);
    }
    count_by(counter::FUTEX_HIT_NS, bpf_now().saturating_sub(end));
}

/// Every context switch on the machine: the end of a wait for `next`,
/// the start of one for `prev` when it blocks (not when preempted).
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn mp_futex_sw(ctx: RawTracePointContext) -> u32 {
    // sched_switch(bool preempt, struct task_struct *prev,
    //              struct task_struct *next, unsigned int prev_state)
    woke(ctx.arg::<u64>(2));
    let preempt = ctx.arg::<u64>(0) & 0xff;
    let state = ctx.arg::<u64>(3) & 0xffff_ffff;
    // TASK_INTERRUPTIBLE | TASK_UNINTERRUPTIBLE
    if preempt == 0 && state & 3 != 0 {
        sleeping(ctx.arg::<u64>(1));
    }
    0
}

/// Every wake-up on the machine, in the waker's context: for a sleeper
/// with a futex wait in progress, the waker's site if it is the target
/// in a futex wake; for a task with none, the waker's release
/// ([`release_before_sleep`]). A sleeper already woken is not woken
/// again (it is running until its `sched_switch` ends the wait), so its
/// waker's release was counted by the first wake.
#[raw_tracepoint(tracepoint = "sched_waking")]
pub fn mp_futex_wk(ctx: RawTracePointContext) -> u32 {
    let task = ctx.arg::<u64>(0);
    let Some(p) = slot_of(task) else {
        release_before_sleep();
        return 0;
    };
    // SAFETY: the pointer comes from the map lookup; plain integers.
    let (addr, owner, weight, start) = unsafe {
        if (*p).task != task || (*p).start_ns == 0 {
            release_before_sleep();
            return 0;
        }
        if (*p).woken_ns != 0 {
            return 0;
        }
        ((*p).addr, (*p).owner, (*p).weight, (*p).start_ns)
    };
    if weight == 0 || before_window(start) {
        // A skipped wait, or one from before the hooks' window (dropped
        // when it ends): only the waker's release is counted, as cheaply
        // as it can be (no clock, no registers). A thread of the target
        // that wakes a futex sleeper other than by a futex wake (a
        // signal) is counted too, which only withholds spans.
        let (tgid, tid) = current_ids();
        if tgid == target_tgid() {
            count_release(tid);
        }
        // SAFETY: as above; any non-zero value marks it woken.
        unsafe { (*p).woken_ns = 1 };
        return 0;
    }
    let now = bpf_now();
    let (site, tid, op) = waker();
    // SAFETY: as above; the sleeper reads these when it comes back.
    unsafe {
        (*p).waker_site = site;
        (*p).waker_tid = tid;
        (*p).woken_ns = now;
    }
    if site != 0 {
        count_release(tid);
    }
    if site != 0 && key_sample_now(addr, site, lock_event::WAKE, now) {
        send_sample(&Sample {
            kind: lock_event::WAKE,
            tid,
            op,
            owner,
            addr,
            site,
            start_ns: now,
            duration_ns: 0,
            ret: 1,
            lock_site: call_site(tid),
        });
    }
    count_by(counter::FUTEX_HIT_NS, bpf_now().saturating_sub(now));
    0
}

/// A wake-up of a task with no wait in progress: a waiter that queued on
/// the futex but had not gone to sleep yet (its `sched_switch` comes
/// later, if at all: the wake sets it running first) may have been
/// handed the lock by its waker. Such a wake is counted as the waker's
/// release when the waker is a thread of the target in a futex wake, or
/// the owner would look as if it held the lock through a later wait it
/// ended (that span would take in the code it ran between its sections:
/// 4.4% of the `ulcp` workload's wakes between its threads came to a
/// thread not asleep, measured with bpftrace). Counting a wake that was
/// none (of another process, or from an interrupt during a futex wake)
/// only withholds a span. Only while spans are wanted, the one use of
/// the count; this is the path of every other wake-up on the machine,
/// so the cheapest test first.
#[inline(always)]
fn release_before_sleep() {
    if !spans_wanted() {
        return;
    }
    let (tgid, tid) = current_ids();
    if tgid != target_tgid() {
        return;
    }
    if syscall_regs().and_then(|r| futex_wake_op(&r)).is_some() {
        count_release(tid);
    }
}

/// The futex command of a wake, from the current thread's syscall
/// registers; None when it is not in a futex wake.
#[inline(always)]
fn futex_wake_op(r: &SyscallRegs) -> Option<u32> {
    match r.nr {
        futex_nr::FUTEX => {
            let cmd = r.arg1 & FUTEX_CMD_MASK;
            (futex_kind(cmd) == lock_event::WAKE).then_some(cmd as u32)
        }
        futex_nr::FUTEX_WAKE => Some(1),
        _ => None,
    }
}

/// Counts a futex wake by thread `tid` as a release (see
/// [`RELEASES_BY`]).
#[inline(always)]
fn count_release(tid: u32) {
    if let Some(c) = releases_by(tid) {
        // SAFETY: the pointer comes from the map lookup; only this
        // thread's wakes write its counter.
        unsafe { *c = (*c).wrapping_add(1) };
    }
}

/// The current thread's futex wake site, thread and command, when it is
/// a thread of the target in a futex wake; site 0 otherwise.
#[inline(always)]
fn waker() -> (u64, u32, u32) {
    let (tgid, tid) = current_ids();
    if tgid != target_tgid() {
        return (0, tid, 0);
    }
    let Some(r) = syscall_regs() else {
        return (0, tid, 0);
    };
    let Some(op) = futex_wake_op(&r) else {
        return (0, tid, 0);
    };
    (
        site_of(lock_event::WAKE, r.ip, r.sp, call_site(tid)),
        tid,
        op,
    )
}

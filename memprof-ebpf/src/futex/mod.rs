//! Lock contention as the kernel sees it: futex waits and wakes of the
//! target's threads (every contended user-space lock ends in one), and
//! kernel locks they wait for ([`kernel`]).
//!
//! Futex waits are seen by [`sched`] as the sleeps they are (the default),
//! or by [`syscalls`] at the futex syscalls (the fallback); both aggregate
//! and sample here.
//!
//! An uncontended lock never enters the kernel and costs nothing here. A
//! contended one is aggregated in place, per (lock, kind, call site), in
//! `CONTENTION`: counts, total and longest time, log2 buckets, and for a
//! wake the waits it ended (its holder's blame). The loader reads the map
//! on its dashboard tick and at the end. The ring carries only user-stack
//! samples, so the loader can name the sites: the first call of each key,
//! then at most one per key every 250 ms and 200 a second overall.

mod kernel;
mod sched;
mod syscalls;

use aya_ebpf::{
    bindings::{BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_task_btf, bpf_get_prandom_u32, bpf_probe_read_kernel, bpf_probe_read_user,
        bpf_task_pt_regs,
    },
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use memprof_common::{
    counter, for_each_share, futex_ctl, hint_key, hint_word_fits, key_may_sample, lock_event,
    log2_bucket, mix_site, take_token, Contention, ContentionKey, LockEvent, Releases, SiteHint,
    WaiterKey, CONTENTION_KEYS, CONTENTION_OTHER_KEYS, LOCK_RING_BYTES, LOCK_STACK_WORDS,
    SAMPLES_PER_S, SITE_HINTS, SITE_HINT_FRAMES, SPAN_RING_BYTES, WAITER_THREADS_CAPACITY,
};

use crate::maps::{bpf_now, count};

#[map(name = "LOCK_EVENTS")]
static LOCK_EVENTS: RingBuf = RingBuf::with_byte_size(LOCK_RING_BYTES, 0);

#[map(name = "WAIT_SPANS")]
static WAIT_SPANS: RingBuf = RingBuf::with_byte_size(SPAN_RING_BYTES, 0);

/// The span token bucket: `[0]` credit in ns, `[1]` when last refilled.
#[map(name = "LOCK_SPAN_BUCKET")]
static SPAN_BUCKET: Array<u64> = Array::with_max_entries(2, 0);

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

/// A lock's releases copied out for one wait's blame: here rather than on
/// the stack, where its 136 bytes took the futex exit's frame to 480 and,
/// with the blame's out-of-line closure (80), past the verifier's 512
/// (seen on a fresh machine of this kind). One slot per CPU: the programs
/// that blame run with preemption off and never nest.
#[map(name = "FUTEX_RELEASES_COPY")]
static RELEASES_COPY: PerCpuArray<Releases> = PerCpuArray::with_max_entries(1, 0);

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
    // SAFETY: a map lookup; the hint is plain data, read in place (a hash
    // map update replaces the element whole, so the read sees one hint).
    if let Some(hint) = unsafe { SITE_HINTS_MAP.get(hint_key(ip, kind)) } {
        for i in 0..SITE_HINT_FRAMES {
            if i as u32 >= hint.count {
                break;
            }
            let at = sp + u64::from(hint.slots[i]);
            // SAFETY: bpf_probe_read_user fails cleanly on a bad address.
            let word = unsafe { bpf_probe_read_user(at as *const u64) }.unwrap_or(0);
            // Another caller's frames: data there, not a return address.
            if !hint_word_fits(word, hint.code[i]) {
                break;
            }
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
    record_weighted(c, ns, woken, 1);
}

/// Counts `weight` calls of `ns` each into `c` (one traced call standing
/// for the `weight - 1` the governor skipped beside it).
#[inline(always)]
fn record_weighted(c: *mut Contention, ns: u64, woken: u64, weight: u64) {
    // SAFETY: `c` comes from `contention_of`: a map value valid while the
    // program runs. Counters use atomic adds; the longest is a racy
    // compare and store (a maximum set at the same instant may be missed).
    unsafe {
        add(&raw mut (*c).count, weight);
        add(&raw mut (*c).total_ns, ns * weight);
        if woken > 0 {
            add(&raw mut (*c).woken, woken * weight);
        }
        let b = log2_bucket(ns);
        if b < (*c).buckets.len() {
            add(&raw mut (*c).buckets[b], weight);
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
    let ok = take_sample_token(now);
    if ok {
        // SAFETY: as above.
        unsafe { (*c).last_sample_ns = now };
    }
    ok
}

/// Takes a token of the overall sample rate, if one is left.
#[inline(always)]
fn take_sample_token(now: u64) -> bool {
    take_bucket_token(&SAMPLE_BUCKET, now, 1_000_000_000 / SAMPLES_PER_S)
}

/// A token of `bucket` (`[credit, refilled]`), each `cost` ns of credit.
#[inline(always)]
fn take_bucket_token(bucket: &Array<u64>, now: u64, cost: u64) -> bool {
    let (Some(credit), Some(refilled)) = (bucket.get_ptr_mut(0), bucket.get_ptr_mut(1)) else {
        return false;
    };
    // SAFETY: both pointers come from the map lookups. The bucket is
    // updated without atomics: a race lets a sample or two more through.
    unsafe {
        let (ok, left) = take_token(*credit, *refilled, now, cost, 1_000_000_000);
        *credit = left;
        *refilled = now;
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

/// Records a release (wake) of `uaddr` from `site`, in place when the
/// word has an entry (an LRU insert costs several times a lookup).
#[inline(always)]
fn released(uaddr: u64, site: u64) {
    released_at(uaddr, site, bpf_now(), (0, 0, 0));
}

/// Records a release of `uaddr` from `site` at `now`, by thread `by.0`,
/// which woke thread `by.1`, back on a CPU at `by.2` (zeros: not known).
#[inline(always)]
fn released_at(uaddr: u64, site: u64, now: u64, by: (u32, u32, u64)) {
    match RELEASES.get_ptr_mut(uaddr) {
        // SAFETY: the pointer comes from the map lookup. Two releases of
        // one word at the same instant may take one slot (the lock is
        // released once; the other is a spurious wake).
        Some(r) => unsafe { (*r).push(now, site, by.0, by.1, by.2) },
        None => {
            let mut r = Releases::default();
            r.push(now, site, by.0, by.1, by.2);
            let _ = RELEASES.insert(uaddr, r, 0);
        }
    }
}

/// Charges a wait on `uaddr` from `start` to `end` that a wake ended to
/// the holders that released the lock during it, each for its part.
#[inline(always)]
fn blame(uaddr: u64, start: u64, end: u64) {
    blame_weighted(uaddr, start, end, 1);
}

/// [`blame`] for a wait that stands for `weight` waits.
#[inline(always)]
fn blame_weighted(uaddr: u64, start: u64, end: u64, weight: u64) {
    let (Some(from), Some(copy)) = (RELEASES.get_ptr(uaddr), RELEASES_COPY.get_ptr_mut(0)) else {
        return;
    };
    // SAFETY: both pointers come from map lookups; the releases are plain
    // data, copied out so that a release on another CPU cannot change
    // them halfway through, into this CPU's own slot.
    let r = unsafe {
        *copy = *from;
        &*copy
    };
    for_each_share(r, start, end, |slot, ns, last| {
        let key = ContentionKey {
            addr: uaddr,
            site: r.sites[slot],
            kind: lock_event::WAKE,
            _pad: 0,
        };
        if let Some(c) = contention_of(&key) {
            // SAFETY: `c` is a map value from `contention_of`.
            unsafe {
                add(&raw mut (*c).caused_ns, ns * weight);
                if last {
                    add(&raw mut (*c).caused_waits, weight);
                }
            }
        }
    });
}

#[map(name = "FUTEX_CTL")]
static CTL: Array<u64> = Array::with_max_entries(futex_ctl::COUNT, 0);

/// The weight of a wait under the governor's stride N, or `None` when it
/// is left out: each sleep is traced with probability 1/N (random,
/// not every Nth, so that waits alternating between locks are not
/// aliased onto one of them), and a traced one counts for N.
#[inline(always)]
fn stride_weight() -> Option<u32> {
    let stride = CTL.get(futex_ctl::STRIDE).copied().unwrap_or(0);
    if stride <= 1 {
        return Some(1);
    }
    // SAFETY: helper without preconditions.
    let r = u64::from(unsafe { bpf_get_prandom_u32() });
    if r % stride == 0 {
        Some(stride as u32)
    } else {
        count(counter::FUTEX_WAITS_SKIPPED);
        None
    }
}

/// Whether a wait that began at `start_ns` began before the hooks' current
/// window opened: its end was in a gap, so its length is unknown.
#[inline(always)]
fn before_window(start_ns: u64) -> bool {
    start_ns < CTL.get(futex_ctl::WINDOW_START).copied().unwrap_or(0)
}

/// Counts `tid` among the threads that waited on `addr`.
#[inline(always)]
fn count_waiter(addr: u64, tid: u32) {
    let waiter = WaiterKey { addr, tid, _pad: 0 };
    if WAITER_THREADS.get_ptr(waiter).is_none() {
        let _ = WAITER_THREADS.insert(waiter, 1, 0);
    }
}

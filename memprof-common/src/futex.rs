//! Lock contention as the kernel sees it: futex waits and wakes of the
//! target's threads and the kernel locks they wait for, aggregated in the
//! kernel per (lock, kind, call site) ([`ContentionKey`] → [`Contention`]),
//! with user stacks sampled at a bounded rate ([`LockEvent`]) for the
//! loader to name the sites.

use crate::record::records;

/// Log2 buckets of the kernel's wait-time histograms (and the loader's
/// lock durations): bucket 0 counts 0 ns, bucket `i` `[2^(i-1), 2^i)` ns;
/// the last one everything from 2^38 ns (4.6 minutes) up.
pub const LOCK_HIST_BUCKETS: usize = 40;

/// The bucket of a duration of `ns` nanoseconds: one more than the index
/// of its highest set bit, at most the last bucket. Computed by halving
/// rather than `leading_zeros`, whose expansion on the BPF target leaves
/// the verifier unable to bound the index.
#[inline(always)]
pub const fn log2_bucket(ns: u64) -> usize {
    let (mut b, mut v) = (0usize, ns);
    if v >> 32 != 0 {
        b += 32;
        v >>= 32;
    }
    if v >> 16 != 0 {
        b += 16;
        v >>= 16;
    }
    if v >> 8 != 0 {
        b += 8;
        v >>= 8;
    }
    if v >> 4 != 0 {
        b += 4;
        v >>= 4;
    }
    if v >> 2 != 0 {
        b += 2;
        v >>= 2;
    }
    if v >> 1 != 0 {
        b += 1;
        v >>= 1;
    }
    b += v as usize;
    if b < LOCK_HIST_BUCKETS {
        b
    } else {
        LOCK_HIST_BUCKETS - 1
    }
}

/// Byte size of the lock sample ring: it carries only stack samples, at
/// most [`SAMPLES_PER_S`] a second (plus a burst), whatever the futex rate.
pub const LOCK_RING_BYTES: u32 = 1 << 20;
/// User stack words copied with a sample, from the stack pointer: the
/// loader unwinds them with the objects' call-frame information (the lock
/// implementation in libc has no frame pointers to walk).
pub const LOCK_STACK_WORDS: usize = 48;

/// Contention keys aggregated individually (per futex word or kernel lock
/// kind, wait or wake site); 376 bytes each, 6 MiB of kernel memory.
pub const CONTENTION_KEYS: u32 = 16384;
/// Keys aggregated by site alone once [`CONTENTION_KEYS`] is full (the
/// "other locks"); beyond that, calls are only counted
/// ([`crate::counter::CONTENTION_DROPPED`]).
pub const CONTENTION_OTHER_KEYS: u32 = 2048;
/// Instruction addresses with a site hint ([`SiteHint`]).
pub const SITE_HINTS: u32 = 4096;
/// Return-address slots a site hint names.
pub const SITE_HINT_FRAMES: usize = 4;

/// Stack samples per second, all keys together (a token bucket that
/// holds up to a second's worth).
pub const SAMPLES_PER_S: u64 = 200;
/// Shortest interval between two samples of one key (at most 4 a second).
pub const KEY_SAMPLE_INTERVAL_NS: u64 = 250_000_000;

/// Slots of the sched hooks' table of futex waits in progress, one per
/// sleeping thread, found by hashing its task pointer ([`futex_slot`]):
/// an array lookup where a per-thread hash map would cost a hash and a
/// bucket walk on every context switch of the machine. A thread whose
/// slot holds another's wait in progress takes another slot of its group
/// of [`FUTEX_SLOT_GROUP`], if one is free; all held, the older wait in
/// its slot is lost ([`crate::counter::FUTEX_SLOT_COLLISIONS`]).
pub const FUTEX_SLOTS: u32 = 1 << FUTEX_SLOT_BITS;
const FUTEX_SLOT_BITS: u32 = 15;
/// Slots a sleeping thread may take: its hashed slot `s` and `s ^ k` for
/// k below this (aligned groups). Waits are lost when more threads than
/// this, hashed into one group, sleep at once: for 256 threads from task
/// slabs (3 objects 9,856 bytes apart a slab), in 0.9% of convoys with
/// pairs, none of 20,000 simulated with fours.
pub const FUTEX_SLOT_GROUP: u32 = 4;

/// The slot of the task at kernel address `task` (a multiplicative hash:
/// `task_struct`s are cache-line aligned slab objects a few KiB apart).
#[inline(always)]
pub const fn futex_slot(task: u64) -> u32 {
    ((task >> 6).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - FUTEX_SLOT_BITS)) as u32
}

/// Slots of the per-key sample clock the sched hooks consult before
/// copying a stack ([`sample_slot`]): the first wait or wake of each
/// (lock, site, kind) is sampled, then at most one per
/// [`KEY_SAMPLE_INTERVAL_NS`]; two keys in one slot share its clock.
pub const SAMPLE_SLOTS: u32 = 1 << SAMPLE_SLOT_BITS;
const SAMPLE_SLOT_BITS: u32 = 14;

/// The sample-clock slot of a key and the tag that tells keys apart in it.
#[inline(always)]
pub const fn sample_slot(addr: u64, site: u64, kind: u32) -> (u32, u64) {
    let tag = mix_site(mix_site(kind as u64, addr), site) | 1;
    ((tag >> (64 - SAMPLE_SLOT_BITS)) as u32, tag)
}

/// Indices of the `FUTEX_CTL` array the loader writes.
pub mod futex_ctl {
    /// Trace a futex wait with probability 1 / this (0 and 1: every
    /// one); each traced wait then counts for this many in the aggregates.
    pub const STRIDE: u32 = 0;
    /// Non-zero: send the traced waits' spans ([`super::WaitSpan`]) for
    /// the unnecessary-contention analysis.
    pub const SPANS: u32 = 1;
    /// When the hooks' current window opened (`bpf_ktime_get_ns`; 0:
    /// they were never detached): a wait or kernel lock wait that began
    /// before is one whose end fell in a gap, and is dropped.
    pub const WINDOW_START: u32 = 2;
    pub const COUNT: u32 = 3;
}

/// Wait spans sent a second at most, all locks together (a token bucket
/// that holds up to a second's worth): the loader joins each with the
/// CPU samples of its holder.
pub const SPANS_PER_S: u64 = 20_000;
/// Byte size of the wait-span ring: 0.5 s of spans at the top rate.
pub const SPAN_RING_BYTES: u32 = 1 << 19;

/// A traced futex wait whose waker was the lock's owner when the wait
/// began (a glibc mutex's `__owner`) and made no other wake in between
/// (while every wait is traced, each release that ends a wait is one):
/// that thread held the lock from `start_ns` to `woken_ns`, so its CPU
/// samples in between are taken inside its critical section, with no
/// lock call traced.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitSpan {
    /// The futex word (a mutex's address).
    pub addr: u64,
    /// The waiter went to sleep, was woken, ran again.
    pub start_ns: u64,
    pub woken_ns: u64,
    pub end_ns: u64,
    pub waiter: u32,
    /// The owner at the sleep, who woke it.
    pub holder: u32,
    /// How many waits this one stands for (the governor's stride).
    pub weight: u32,
    pub _pad: u32,
}

/// x86-64 syscall numbers of the futex calls the sched hooks recognise in
/// a sleeping or waking thread's registers.
pub mod futex_nr {
    pub const FUTEX: u64 = 202;
    pub const FUTEX_WAKE: u64 = 454;
    pub const FUTEX_WAIT: u64 = 455;
}

/// [`ContentionKey::kind`] and [`LockEvent::kind`].
pub mod lock_event {
    /// A futex wait (`addr` is the futex word).
    pub const WAIT: u32 = 1;
    /// A futex wake (`addr` is the futex word).
    pub const WAKE: u32 = 2;
    /// A kernel lock wait (`lock:contention_*`): `addr` is the lock's
    /// `LCB_F_*` flags, its kind.
    pub const KERNEL: u32 = 4;
}

/// What the kernel aggregates by: one lock (futex word, or kernel lock
/// kind), one kind of call, one call site. `addr` 0 is the aggregate of
/// every lock at that site once the table of individual keys is full.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ContentionKey {
    pub addr: u64,
    /// Hash of the call site: the syscall's instruction, the return
    /// addresses the loader's [`SiteHint`] names, and the traced lock
    /// call in progress (never 0).
    pub site: u64,
    pub kind: u32,
    pub _pad: u32,
}

/// The calls of one [`ContentionKey`], updated with atomic adds (the
/// longest with a racy compare: it may miss a maximum set at the same
/// instant on another CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Contention {
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    /// Wakes: threads woken (the calls' return values).
    pub woken: u64,
    /// Wakes: the waits they ended (the waiter's whole wait), and how many.
    pub caused_ns: u64,
    pub caused_waits: u64,
    /// When the key was last sampled (0: never).
    pub last_sample_ns: u64,
    /// Durations by [`log2_bucket`].
    pub buckets: [u64; LOCK_HIST_BUCKETS],
}

impl Default for Contention {
    fn default() -> Self {
        Self {
            count: 0,
            total_ns: 0,
            max_ns: 0,
            woken: 0,
            caused_ns: 0,
            caused_waits: 0,
            last_sample_ns: 0,
            buckets: [0; LOCK_HIST_BUCKETS],
        }
    }
}

/// Where the return addresses are at one syscall instruction: byte
/// offsets from the stack pointer, found by the loader unwinding a sample
/// with the call-frame information. The kernel hashes the words there
/// into the site, so two callers of the same lock function are two sites.
///
/// The offsets hold only on the path the sample took: another caller of
/// the same lock function has frames of other sizes, and there a slot
/// past its own return address holds data (a loop counter, a pointer)
/// that would make every call a new site. So each slot also names the
/// code mapping its word was found in, `code[i]` = `[start, end)`; the
/// kernel stops hashing at the first word outside its slot's mapping
/// ([`hint_word_fits`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiteHint {
    pub slots: [u16; SITE_HINT_FRAMES],
    pub count: u32,
    pub _pad: u32,
    pub code: [[u64; 2]; SITE_HINT_FRAMES],
}

/// Whether `word`, read at a hint's slot, lies in the code mapping the
/// slot's return address was found in (`code` = `[start, end)`): a return
/// address of the hint's path, or of another caller with frames of the
/// same size, but not data.
#[inline(always)]
pub const fn hint_word_fits(word: u64, code: [u64; 2]) -> bool {
    word >= code[0] && word < code[1]
}

/// Key of [`crate::maps::WAITER_THREADS`]: a thread that waited on a
/// futex word (the report's count of waiting threads).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WaiterKey {
    pub addr: u64,
    pub tid: u32,
    pub _pad: u32,
}

/// Entries of [`crate::maps::WAITER_THREADS`] (an LRU: past it, the
/// oldest are forgotten and thread counts become lower bounds).
pub const WAITER_THREADS_CAPACITY: u32 = 65536;

/// Releases remembered per futex word ([`Releases`]).
pub const RELEASES_KEPT: usize = 4;

/// The last releases (wakes) of one futex word: when, and from which
/// site. A waiter charges each part of its wait to the holder that
/// released the lock at its end, so a long section is blamed for the
/// waiting it caused even when another holder's wake ended the wait.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Releases {
    /// Releases recorded so far: the next one goes to slot
    /// `next % RELEASES_KEPT`.
    pub next: u64,
    pub times: [u64; RELEASES_KEPT],
    pub sites: [u64; RELEASES_KEPT],
    /// When the thread a release woke came back to run (0: not known),
    /// which thread that was, and which thread released: a release whose
    /// thread is the one the release before woke began its section no
    /// earlier than `taken` of that one.
    pub taken: [u64; RELEASES_KEPT],
    pub to: [u32; RELEASES_KEPT],
    pub by: [u32; RELEASES_KEPT],
}

impl Releases {
    /// Records a release at `at` from `site` by thread `by`, which woke
    /// thread `to`, back on a CPU at `taken` (zeros when not known).
    #[inline(always)]
    pub fn push(&mut self, at: u64, site: u64, by: u32, to: u32, taken: u64) {
        let slot = (self.next as usize) % RELEASES_KEPT;
        self.times[slot] = at;
        self.sites[slot] = site;
        self.by[slot] = by;
        self.to[slot] = to;
        self.taken[slot] = taken;
        self.next += 1;
    }

    /// When the section ended by the release in `slot` began, as far as
    /// a wait's part from `from` knows: `from`, unless the release before
    /// (`prev`) woke the thread that made this one, and it came back to
    /// run after `from`: the time between was the hand-off (the woken
    /// thread's scheduling latency), nobody's section.
    #[inline(always)]
    fn section_start(&self, prev: Option<usize>, slot: usize, from: u64) -> u64 {
        match prev {
            Some(p)
                if self.to[p] != 0
                    && self.to[p] == self.by[slot]
                    && self.taken[p] > from
                    && self.taken[p] < self.times[slot] =>
            {
                self.taken[p]
            }
            _ => from,
        }
    }
}

/// The parts of a wait from `start` to `end` (ns) each kept release
/// caused, by slot: from the previous release in the wait (or the wait's
/// start) up to it, the oldest first. The wake-up after the last release
/// is nobody's hold (the scheduler's latency, or a barging thread's
/// section, which its own release then ends) and is not charged; nor is
/// a hand-off inside the wait, from a release to when the thread it woke
/// came back to run, when that thread made the next release
/// ([`Releases::section_start`]). Also
/// returns the last release in the wait (the one that ended it). With no
/// release inside the wait, the newest release before its end gets all
/// of it.
#[inline(always)]
pub fn wait_shares(r: &Releases, start: u64, end: u64) -> ([u64; RELEASES_KEPT], Option<usize>) {
    let mut shares = [0u64; RELEASES_KEPT];
    let last = for_each_share(r, start, end, |slot, ns, _| shares[slot] += ns);
    (shares, last)
}

/// [`wait_shares`] without the array: calls `f(slot, ns, last)` for each
/// slot with a share (`last`: the release that ended the wait), and
/// returns that release. The kernel's form: a zeroed array on the BPF
/// stack becomes a `memset` call whose result the verifier rejects.
#[inline(always)]
pub fn for_each_share(
    r: &Releases,
    start: u64,
    end: u64,
    mut f: impl FnMut(usize, u64, bool),
) -> Option<usize> {
    // First the releases inside the wait (the last of them) and the
    // newest before its end, then the shares.
    let mut from = start;
    let mut last = None;
    let mut newest: Option<usize> = None;
    for k in 0..RELEASES_KEPT {
        let slot = (r.next as usize).wrapping_add(k) % RELEASES_KEPT;
        let t = r.times[slot];
        if t == 0 || t > end {
            continue;
        }
        if newest.is_none_or(|n| r.times[n] <= t) {
            newest = Some(slot);
        }
        if t > from {
            from = t;
            last = Some(slot);
        }
    }
    let Some(last) = last else {
        match newest {
            Some(slot) if end > start => f(slot, end - start, true),
            _ => {}
        }
        return newest;
    };
    let mut from = start;
    // The release before the part being charged (one before the wait
    // counts: it may have woken the thread whose section ends the first).
    let mut prev: Option<usize> = None;
    for k in 0..RELEASES_KEPT {
        let slot = (r.next as usize).wrapping_add(k) % RELEASES_KEPT;
        let t = r.times[slot];
        if t == 0 || t > end {
            continue;
        }
        if t <= start {
            if prev.is_none_or(|p| r.times[p] <= t) {
                prev = Some(slot);
            }
        } else if t > from {
            f(slot, t - r.section_start(prev, slot, from), slot == last);
            from = t;
            prev = Some(slot);
        }
    }
    Some(last)
}

/// Mixes `word` into site hash `h` (a multiply and xor-shift: cheap in
/// the kernel, and call sites differ in few bits).
#[inline(always)]
pub const fn mix_site(h: u64, word: u64) -> u64 {
    let x = (h ^ word).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^ (x >> 29)
}

/// The key of the site hint for instruction `ip` reached as a `kind` event
/// (a [`lock_event`] code). One instruction is reached by paths of
/// different frame layouts: Rust's `Mutex` waits and wakes both through
/// libc's `syscall()`, and a wait read at a wake's slots found the stale
/// return address of the thread's last wake (every wait of a session was
/// once filed at the unlock line).
#[inline(always)]
pub const fn hint_key(ip: u64, kind: u32) -> u64 {
    ip ^ ((kind as u64) << 56)
}

/// A token bucket in nanoseconds of credit: every `cost_ns` of credit
/// buys one token; credit accrues with time up to `cap_ns`. Returns
/// whether a token was taken and the credit left.
#[inline(always)]
pub const fn take_token(
    credit_ns: u64,
    last_ns: u64,
    now_ns: u64,
    cost_ns: u64,
    cap_ns: u64,
) -> (bool, u64) {
    let mut credit = credit_ns.saturating_add(now_ns.saturating_sub(last_ns));
    if credit > cap_ns {
        credit = cap_ns;
    }
    if credit >= cost_ns {
        (true, credit - cost_ns)
    } else {
        (false, credit)
    }
}

/// Whether a key last sampled at `last_ns` may be sampled at `now_ns`.
#[inline(always)]
pub const fn key_may_sample(last_ns: u64, now_ns: u64) -> bool {
    last_ns == 0 || now_ns.saturating_sub(last_ns) >= KEY_SAMPLE_INTERVAL_NS
}

/// A stack sample of a futex call or kernel lock wait of one of the
/// target's threads, at a bounded rate: the first call of each key, then
/// at most one per [`KEY_SAMPLE_INTERVAL_NS`].
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
    /// The key's `addr` and `site`.
    pub addr: u64,
    pub site: u64,
    pub time_ns: u64,
    /// How long the call or wait took.
    pub duration_ns: u64,
    /// The call's return value (woken threads for a wake).
    pub ret: i64,
    /// User instruction, stack and frame pointers at the call.
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// The return address of a traced lock call or condvar wait in
    /// progress on the thread (0 if none). Its return probe replaced that
    /// address on the stack with the kernel's trampoline, which the loader
    /// swaps back.
    pub lock_site: u64,
    /// The top of the user stack.
    pub stack: [u64; LOCK_STACK_WORDS],
}

// The kernel writes these records and userspace reads them; a change in
// size is a layout change both sides must see.
const _: () = assert!(core::mem::size_of::<LockEvent>() == 88 + 8 * LOCK_STACK_WORDS);
const _: () = assert!(core::mem::size_of::<ContentionKey>() == 24);
const _: () = assert!(core::mem::size_of::<Contention>() == 56 + 8 * LOCK_HIST_BUCKETS);
const _: () = assert!(core::mem::size_of::<SiteHint>() == 16 + 16 * SITE_HINT_FRAMES);
const _: () = assert!(core::mem::size_of::<WaiterKey>() == 16);
const _: () = assert!(core::mem::size_of::<Releases>() == 8 + 32 * RELEASES_KEPT);
const _: () = assert!(core::mem::size_of::<WaitSpan>() == 48);

// SAFETY: all `#[repr(C)]` and made of integers and integer arrays,
// naturally aligned so without padding (sizes asserted above): the event
// is four u32 then u64s, an i64 and a u64 array; the key two u64 and two
// u32; the contention u64s; the hint four u16, two u32 and u64 pairs; the waiter
// key a u64 and two u32; the releases u64s; the span four u64 and four
// u32. Any bit pattern is a valid value.
records!(
    LockEvent,
    ContentionKey,
    Contention,
    SiteHint,
    WaiterKey,
    Releases,
    WaitSpan
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_slots_spread_slab_neighbours() {
        // Tasks from one slab: objects 9,856 bytes apart (a 6.x
        // task_struct), several slabs. Hundreds of threads must land in
        // distinct slots nearly always.
        let mut used = [false; FUTEX_SLOTS as usize];
        let mut clashes = 0;
        for slab in 0..100u64 {
            for i in 0..3u64 {
                let task = 0xffff_8880_0400_0000 + slab * 0x8000 + i * 9856;
                let s = futex_slot(task);
                assert!(s < FUTEX_SLOTS);
                if core::mem::replace(&mut used[s as usize], true) {
                    clashes += 1;
                }
            }
        }
        assert!(clashes <= 3, "{clashes} of 300 tasks share a slot");
    }

    #[test]
    fn a_task_slot_group_holds_a_convoy() {
        // 256 tasks from slabs of 3 at scattered addresses (a fixed
        // generator): no group of FUTEX_SLOT_GROUP slots gets more tasks
        // than it holds, in any of 200 convoys.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..200 {
            let mut load = [0u8; (FUTEX_SLOTS / FUTEX_SLOT_GROUP) as usize];
            for _ in 0..86 {
                let base = 0xffff_8880_0000_0000 + (next() % (1 << 24)) * 0x8000;
                for i in 0..3u64 {
                    let g = (futex_slot(base + i * 9856) / FUTEX_SLOT_GROUP) as usize;
                    load[g] += 1;
                    assert!(load[g] as u32 <= FUTEX_SLOT_GROUP, "a group overflows");
                }
            }
        }
    }

    #[test]
    fn sample_slots_are_in_range_and_tags_never_zero() {
        for (a, s, k) in [(0, 0, 0), (u64::MAX, u64::MAX, 4), (0x1000, 0xabc, 1)] {
            let (slot, tag) = sample_slot(a, s, k);
            assert!(slot < SAMPLE_SLOTS);
            assert_ne!(tag, 0);
        }
        assert_ne!(sample_slot(0x1000, 7, 1), sample_slot(0x1000, 7, 2));
    }

    #[test]
    fn buckets_split_at_powers_of_two() {
        assert_eq!(log2_bucket(0), 0);
        assert_eq!(log2_bucket(1), 1);
        assert_eq!((log2_bucket(2), log2_bucket(3)), (2, 2));
        assert_eq!((log2_bucket(1023), log2_bucket(1024)), (10, 11));
        assert_eq!(log2_bucket(u64::MAX), LOCK_HIST_BUCKETS - 1);
    }

    #[test]
    fn the_token_bucket_allows_a_rate_and_a_burst() {
        let cost = 1_000_000_000 / SAMPLES_PER_S;
        let cap = 1_000_000_000;
        // From empty, a token needs one cost of time.
        assert_eq!(take_token(0, 0, cost - 1, cost, cap), (false, cost - 1));
        assert_eq!(take_token(0, 0, cost, cost, cap), (true, 0));
        // After a long quiet spell the credit is capped: a second's burst.
        let (mut credit, mut last, mut taken) = (0, 0, 0);
        let now = 60_000_000_000;
        for _ in 0..1000 {
            let (ok, c) = take_token(credit, last, now, cost, cap);
            (credit, last) = (c, now);
            taken += ok as u64;
        }
        assert_eq!(taken, SAMPLES_PER_S);
        // Steady calls every microsecond for a second: the rate, not more.
        let (mut credit, mut last, mut taken) = (0, now, 0);
        for i in 1..=1_000_000u64 {
            let t = now + i * 1000;
            let (ok, c) = take_token(credit, last, t, cost, cap);
            (credit, last) = (c, t);
            taken += ok as u64;
        }
        assert_eq!(taken, SAMPLES_PER_S);
        // A clock that goes backwards (another CPU's older time) adds nothing.
        assert_eq!(take_token(5, 100, 50, cost, cap), (false, 5));
    }

    #[test]
    fn a_key_is_sampled_first_then_at_its_interval() {
        assert!(key_may_sample(0, 1));
        assert!(!key_may_sample(1_000, 1_000 + KEY_SAMPLE_INTERVAL_NS - 1));
        assert!(key_may_sample(1_000, 1_000 + KEY_SAMPLE_INTERVAL_NS));
    }

    fn releases(at: &[(u64, u64)]) -> Releases {
        let mut r = Releases::default();
        for &(t, site) in at {
            r.push(t, site, 0, 0, 0);
        }
        r
    }

    /// The shares of a wait from `start` to `end`, summed by site, the
    /// sites in increasing order (unused entries `(u64::MAX, 0)` last).
    fn shares_by_site(r: &Releases, start: u64, end: u64) -> [(u64, u64); RELEASES_KEPT] {
        let (shares, _) = wait_shares(r, start, end);
        let mut by = [(u64::MAX, 0); RELEASES_KEPT];
        for (s, &share) in shares.iter().enumerate() {
            if r.times[s] == 0 || share == 0 {
                continue;
            }
            let site = r.sites[s];
            if let Some(e) = by.iter_mut().find(|e| e.0 == site || e.0 == u64::MAX) {
                *e = (site, e.1 + share);
            }
        }
        by.sort_unstable();
        by
    }

    /// `want` in the form of [`shares_by_site`].
    fn sites(want: &[(u64, u64)]) -> [(u64, u64); RELEASES_KEPT] {
        let mut by = [(u64::MAX, 0); RELEASES_KEPT];
        by[..want.len()].copy_from_slice(want);
        by
    }

    #[test]
    fn a_hand_off_inside_a_wait_is_charged_to_nobody() {
        // The slow holder (thread 1, site 10) releases at 1,000 and wakes
        // thread 2, back on a CPU at 1,050; thread 2 (site 20) releases at
        // 1,052 and wakes the waiter, whose wait from 100 to 1,060 caused
        // 900 by the slow section and 2 by the fast one: the 50 between
        // were the hand-off.
        let mut r = Releases::default();
        r.push(1000, 10, 1, 2, 1050);
        r.push(1052, 20, 2, 3, 1060);
        assert_eq!(shares_by_site(&r, 100, 1060), sites(&[(10, 900), (20, 2)]));
        // The wait began during the hand-off: none of it before 1,050.
        assert_eq!(shares_by_site(&r, 1020, 1060), sites(&[(20, 2)]));
        // A barging thread (4) took the lock after the release instead:
        // its section is the whole part.
        let mut r = Releases::default();
        r.push(1000, 10, 1, 2, 1050);
        r.push(1052, 40, 4, 3, 1060);
        assert_eq!(shares_by_site(&r, 100, 1060), sites(&[(10, 900), (40, 52)]));
        // Not known when the woken thread ran (the syscall path): as
        // before.
        let mut r = Releases::default();
        r.push(1000, 10, 1, 2, 0);
        r.push(1052, 20, 2, 3, 0);
        assert_eq!(shares_by_site(&r, 100, 1060), sites(&[(10, 900), (20, 52)]));
    }

    #[test]
    fn a_wait_is_shared_by_the_holders_that_released_during_it() {
        // A slow holder releases at 1,000 and a fast one at 1,010; a wait
        // from 100 to 1,015 was caused 900 by the slow one, 10 by the fast
        // (the last 5 are the wake-up).
        let r = releases(&[(50, 7), (1000, 1), (1010, 2)]);
        let (shares, last) = wait_shares(&r, 100, 1015);
        let by_site = |site| -> u64 {
            (0..RELEASES_KEPT)
                .filter(|&s| r.sites[s] == site && r.times[s] != 0)
                .map(|s| shares[s])
                .sum()
        };
        assert_eq!((by_site(1), by_site(2), by_site(7)), (900, 10, 0));
        assert_eq!(last.map(|s| r.sites[s]), Some(2));
        // More releases than kept: the oldest kept one takes the start.
        let r = releases(&[(10, 9), (20, 1), (30, 2), (40, 3), (50, 4)]);
        let (shares, _) = wait_shares(&r, 0, 60);
        assert_eq!(shares.iter().sum::<u64>(), 50);
        // No release inside the wait: the newest before its end.
        let r = releases(&[(10, 1), (20, 2)]);
        let (shares, last) = wait_shares(&r, 30, 40);
        assert_eq!(
            (shares.iter().sum::<u64>(), last.map(|s| r.sites[s])),
            (10, Some(2))
        );
        assert_eq!(wait_shares(&Releases::default(), 0, 5).1, None);
    }

    #[test]
    fn sites_differ_by_any_word() {
        let a = mix_site(mix_site(0x1000, 0x4010), 0x5020);
        let b = mix_site(mix_site(0x1000, 0x4010), 0x5028);
        assert_ne!(a, b);
        assert_ne!(mix_site(0, 0x10), mix_site(0, 0x18));
    }
}

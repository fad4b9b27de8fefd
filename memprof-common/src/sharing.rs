//! False sharing: how a sampled instruction's data address is computed, and
//! the per-cache-line table the sampler keeps in the kernel.
//!
//! The table logic lives here, in plain Rust, so that the very code the
//! kernel runs is unit-tested on the host with hand-built access sequences.
//! The kernel side cannot lock (no `bpf_spin_lock` in tracing programs), so
//! two CPUs sampling the same line at the same instant may lose one update;
//! at sampling rates that is noise, not bias.

use crate::record::records;

/// Cache-line size assumed for x86-64.
pub const LINE_BYTES: u64 = 64;
/// Granularity of the word-level detail: 4 bytes, so `int` fields are told
/// apart (an 8-byte access covers two words).
pub const WORD_BYTES: u32 = 4;
/// Words per line.
pub const WORDS_PER_LINE: usize = (LINE_BYTES as usize) / (WORD_BYTES as usize);

/// Cache lines tracked at once (LRU: the least recently sampled go first).
pub const LINES_CAPACITY: u32 = 32 * 1024;
/// Lines with word-level detail tracked at once.
pub const WORDS_CAPACITY: u32 = 4 * 1024;
/// Instructions whose operand recipe is kept.
pub const RECIPES_CAPACITY: u32 = 64 * 1024;
/// A line gets word-level detail from its this-many-th sampled write on:
/// most lines are touched by one thread and never need it.
pub const WORD_DETAIL_WRITES: u64 = 2;

/// General-purpose registers, numbered as x86 encodes them (the index into
/// the register file the sampler builds from `pt_regs`).
pub mod reg {
    pub const RAX: u8 = 0;
    pub const RCX: u8 = 1;
    pub const RDX: u8 = 2;
    pub const RBX: u8 = 3;
    pub const RSP: u8 = 4;
    pub const RBP: u8 = 5;
    pub const RSI: u8 = 6;
    pub const RDI: u8 = 7;
    pub const R8: u8 = 8;
    pub const R15: u8 = 15;
    /// Number of registers in the file.
    pub const COUNT: usize = 16;
    /// No register (an absent base or index).
    pub const NONE: u8 = 0xff;
}

/// [`AccessRecipe::flags`] bits.
pub mod recipe {
    /// The instruction reads its memory operand.
    pub const READ: u32 = 1;
    /// The instruction writes its memory operand.
    pub const WRITE: u32 = 2;
    /// No usable memory operand: nothing to compute (the IP is remembered
    /// so it is not decoded again).
    pub const NO_OPERAND: u32 = 4;
    /// The recipe describes the instruction *before* the sampled IP (timer
    /// samples land mostly right after the access that took the time).
    pub const PREVIOUS: u32 = 8;
    /// A read whose value is stored back to the same operand a few
    /// instructions later with no branch between (`x++` on a plain or
    /// volatile variable): the sample stands for a write too. Timer samples
    /// land after the load, which takes the cache miss, far more often
    /// than after the store, which retires into the store buffer.
    pub const STORED_BACK: u32 = 16;
    /// The address comes from a backward slice: the instruction overwrote
    /// its own base register, whose value the recipe recomputes from the
    /// registers that still hold it, or reads again from the stack slot
    /// (or other memory) it was loaded from ([`super::AccessRecipe::loads`]).
    pub const SLICE: u32 = 32;
    /// The read of a jump or call through memory (`jmp *GOT(%rip)` in a
    /// PLT stub, a virtual call): a code pointer, not the program's data.
    pub const BRANCH: u32 = 64;
}

/// At most this many user-memory reads in one recipe.
pub const MAX_LOADS: usize = 2;

/// How to compute the data address of the instruction at (or right before)
/// a sampled IP from the sampled registers:
/// `base + index * scale + disp`. RIP-relative operands are resolved by the
/// loader into an absolute `disp` with no base.
///
/// With `loads` > 0 the base value is not in a register any more and is
/// read back from user memory first (a backward slice, [`recipe::SLICE`]):
/// `v = regs[base] + load_disp[0]; v = *(u64 *)v;` then, for a second
/// load, `v = *(u64 *)(v + load_disp[1]);` and the address is
/// `v + index * scale + disp`. For `mov -0x10(%rbp),%rax; mov
/// 0x8(%rax),%rax` sampled after the second move: `base` RBP, one load at
/// -0x10, `disp` 8.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessRecipe {
    pub disp: i64,
    /// [`reg`] number or [`reg::NONE`].
    pub base: u8,
    pub index: u8,
    /// 1, 2, 4 or 8.
    pub scale: u8,
    /// Bytes accessed (capped at 64).
    pub size: u8,
    /// [`recipe`] bits.
    pub flags: u32,
    /// Displacements of the user-memory reads, in order.
    pub load_disp: [i32; MAX_LOADS],
    /// User-memory reads before the base value is known (0 to
    /// [`MAX_LOADS`]).
    pub loads: u8,
    pub _pad: [u8; 7],
}

impl AccessRecipe {
    /// A recipe that says "no memory operand here".
    pub const fn none() -> Self {
        Self {
            disp: 0,
            base: reg::NONE,
            index: reg::NONE,
            scale: 1,
            size: 0,
            flags: recipe::NO_OPERAND,
            load_disp: [0; MAX_LOADS],
            loads: 0,
            _pad: [0; 7],
        }
    }

    /// A plain recipe: `base + index * scale + disp`, no reads.
    pub const fn plain(base: u8, index: u8, scale: u8, disp: i64, size: u8, flags: u32) -> Self {
        Self {
            disp,
            base,
            index,
            scale,
            size,
            flags,
            load_disp: [0; MAX_LOADS],
            loads: 0,
            _pad: [0; 7],
        }
    }

    /// The data address for the register file `regs`, or None when the
    /// recipe has no operand or names a register outside the file. A
    /// recipe with reads gets None here (see [`address_with`](Self::address_with)).
    #[inline(always)]
    pub fn address(&self, regs: &[u64; reg::COUNT]) -> Option<u64> {
        self.address_with(regs, |_| None)
    }

    /// As [`address`](Self::address), reading user memory with `read`
    /// (8 bytes at an address; None when unreadable).
    #[inline(always)]
    pub fn address_with(
        &self,
        regs: &[u64; reg::COUNT],
        read: impl Fn(u64) -> Option<u64>,
    ) -> Option<u64> {
        if self.flags & recipe::NO_OPERAND != 0 {
            return None;
        }
        let mut addr = self.disp as u64;
        if self.base != reg::NONE {
            let mut base = *regs.get(self.base as usize)?;
            if self.loads >= 1 {
                base = read(base.wrapping_add(self.load_disp[0] as i64 as u64))?;
            }
            if self.loads >= 2 {
                base = read(base.wrapping_add(self.load_disp[1] as i64 as u64))?;
            }
            addr = addr.wrapping_add(base);
        }
        if self.index != reg::NONE {
            let index = *regs.get(self.index as usize)?;
            addr = addr.wrapping_add(index.wrapping_mul(self.scale as u64));
        }
        Some(addr)
    }

    pub fn is_write(&self) -> bool {
        self.flags & recipe::WRITE != 0
    }
}

/// One entry of a line's two-entry access history (`tid` 0: empty).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HistoryEntry {
    pub tid: u32,
    /// 1 for a write, 0 for a read.
    pub write: u32,
}

/// What the kernel knows of one cache line (value of [`crate::maps::LINES`],
/// keyed by the line's address).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LineState {
    /// The two-entry history (Cheetah's rule, see [`LineState::record`]).
    pub history: [HistoryEntry; 2],
    /// Writes that would have invalidated another core's copy.
    pub invalidations: u64,
    /// Sampled reads and writes of the line.
    pub reads: u64,
    pub writes: u64,
    /// Inter-thread dependences between consecutive sampled accesses:
    /// read-after-write, write-after-write, write-after-read.
    pub raw: u64,
    pub waw: u64,
    pub war: u64,
    /// Last thread that wrote the line (0: none yet).
    pub last_writer: u32,
    /// Last thread that accessed it, and whether that was a write.
    pub last_tid: u32,
    pub last_write: u32,
    pub _pad: u32,
    /// First and last sampled access (`bpf_ktime_get_ns`).
    pub first_ns: u64,
    pub last_ns: u64,
}

impl LineState {
    /// Records one sampled access by thread `tid`; returns whether it
    /// counts as an invalidation.
    ///
    /// The two-entry rule: a read from a thread not already in a non-full
    /// table is recorded; a write causes an invalidation when the table is
    /// full or when its existing entry is another thread's, and then the
    /// table is flushed and holds the write alone; any other write leaves
    /// (or puts) the writer's own entry, marked as a write.
    #[inline(always)]
    pub fn record(&mut self, tid: u32, write: bool, now_ns: u64) -> bool {
        if write {
            self.writes += 1;
        } else {
            self.reads += 1;
        }
        if self.first_ns == 0 {
            self.first_ns = now_ns;
        }
        self.last_ns = now_ns;

        if self.last_tid != 0 && self.last_tid != tid {
            match (self.last_write != 0, write) {
                (true, false) => self.raw += 1,
                (true, true) => self.waw += 1,
                (false, true) => self.war += 1,
                (false, false) => {}
            }
        }
        self.last_tid = tid;
        self.last_write = write as u32;
        if write {
            self.last_writer = tid;
        }

        let [a, b] = self.history;
        let full = a.tid != 0 && b.tid != 0;
        if write {
            let other = (a.tid != 0 && a.tid != tid) || (b.tid != 0 && b.tid != tid);
            if full || other {
                self.invalidations += 1;
                self.history = [HistoryEntry { tid, write: 1 }, HistoryEntry::default()];
                return true;
            }
            // Empty, or holding only this thread's entry.
            self.history[0] = HistoryEntry { tid, write: 1 };
        } else if !full && a.tid != tid && b.tid != tid {
            let slot = if a.tid == 0 { 0 } else { 1 };
            self.history[slot] = HistoryEntry { tid, write: 0 };
        }
        false
    }
}

/// [`WordState::flags`]: more than one thread touched the word.
pub const WORD_MANY_THREADS: u32 = 1;
/// [`WordState::flags`]: more than one thread wrote the word.
pub const WORD_MANY_WRITERS: u32 = 2;

/// Sampled accesses to one 4-byte word of a line.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WordState {
    pub reads: u32,
    pub writes: u32,
    /// First thread that touched the word, and first that wrote it.
    pub tid: u32,
    pub writer: u32,
    /// `WORD_*` bits.
    pub flags: u32,
}

/// Word-level detail of one line (value of [`crate::maps::WORDS`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LineWords {
    pub words: [WordState; WORDS_PER_LINE],
}

impl LineWords {
    /// Records an access of `size` bytes at byte `offset` of the line by
    /// `tid` (the part past the line's end belongs to the next line).
    #[inline(always)]
    pub fn record(&mut self, offset: u32, size: u32, tid: u32, write: bool) {
        let mask = touched_words(offset, size);
        for (i, w) in (0u32..).zip(self.words.iter_mut()) {
            // A bit test, not `first <= i <= last`: a comparison with the
            // access's bounds narrows what the kernel's verifier knows of
            // them, so no two iterations' states were alike and it walked
            // every combination (0.31 s of CPU to load the sampler, against
            // 5 ms without this loop); a bit of a mask tells it nothing.
            if mask & (1 << i) != 0 {
                if write {
                    w.writes += 1;
                    if w.writer == 0 {
                        w.writer = tid;
                    } else if w.writer != tid {
                        w.flags |= WORD_MANY_WRITERS;
                    }
                } else {
                    w.reads += 1;
                }
                if w.tid == 0 {
                    w.tid = tid;
                } else if w.tid != tid {
                    w.flags |= WORD_MANY_THREADS;
                }
            }
        }
    }
}

/// The words of a line an access of `size` bytes at byte `offset` touches,
/// as a bit per word (the part past the line's end belongs to the next
/// line).
#[inline(always)]
pub fn touched_words(offset: u32, size: u32) -> u32 {
    let first = offset / WORD_BYTES;
    let last = (offset.saturating_add(size.max(1) - 1) / WORD_BYTES).min(WORDS_PER_LINE as u32 - 1);
    if first > last {
        return 0;
    }
    let ones = u32::MAX >> (31 - (last - first));
    ones << first
}

const _: () = assert!(WORDS_PER_LINE <= 32);
const _: () = assert!(core::mem::size_of::<AccessRecipe>() == 32);
const _: () = assert!(core::mem::size_of::<LineState>() == 96);
const _: () = assert!(core::mem::size_of::<LineWords>() == 20 * WORDS_PER_LINE);

// SAFETY: all three are `#[repr(C)]` and made of integers only, without
// padding (sizes asserted above): `AccessRecipe` is an i64, four u8, a
// u32, two i32 and eight u8; `LineState` two (u32, u32) entries, u64s and four u32; `LineWords`
// an array of five-u32 structs. Any bit pattern is a valid value.
records!(AccessRecipe, LineState, LineWords);

#[cfg(test)]
mod tests {
    use super::*;

    const T1: u32 = 101;
    const T2: u32 = 102;
    const T3: u32 = 103;

    fn run(accesses: &[(u32, bool)]) -> (LineState, u64) {
        let mut line = LineState::default();
        let mut inv = 0;
        for (i, &(tid, write)) in accesses.iter().enumerate() {
            if line.record(tid, write, 1000 + i as u64) {
                inv += 1;
            }
        }
        assert_eq!(inv, line.invalidations);
        (line, inv)
    }

    fn entry(tid: u32, write: bool) -> HistoryEntry {
        HistoryEntry {
            tid,
            write: write as u32,
        }
    }

    #[test]
    fn a_read_from_a_new_thread_fills_a_non_full_table() {
        let (line, inv) = run(&[(T1, false), (T2, false)]);
        assert_eq!(inv, 0);
        assert_eq!(line.history, [entry(T1, false), entry(T2, false)]);
    }

    #[test]
    fn a_read_from_a_thread_already_there_is_not_recorded_again() {
        let (line, _) = run(&[(T1, false), (T1, false)]);
        assert_eq!(line.history, [entry(T1, false), HistoryEntry::default()]);
        let (line, _) = run(&[(T1, true), (T1, false)]);
        assert_eq!(line.history[0], entry(T1, true), "the write entry stays");
        assert_eq!(line.history[1], HistoryEntry::default());
    }

    #[test]
    fn a_read_into_a_full_table_changes_nothing() {
        let (line, inv) = run(&[(T1, false), (T2, false), (T3, false)]);
        assert_eq!(inv, 0);
        assert_eq!(line.history, [entry(T1, false), entry(T2, false)]);
    }

    #[test]
    fn a_write_into_an_empty_table_is_recorded_without_invalidation() {
        let (line, inv) = run(&[(T1, true)]);
        assert_eq!(inv, 0);
        assert_eq!(line.history, [entry(T1, true), HistoryEntry::default()]);
        assert_eq!(line.last_writer, T1);
    }

    #[test]
    fn a_write_over_the_threads_own_entry_does_not_invalidate() {
        let (line, inv) = run(&[(T1, false), (T1, true), (T1, true)]);
        assert_eq!(inv, 0, "one thread initialising data is not sharing");
        assert_eq!(line.history[0], entry(T1, true));
    }

    #[test]
    fn a_write_over_another_threads_entry_invalidates_and_flushes() {
        let (line, inv) = run(&[(T1, false), (T2, true)]);
        assert_eq!(inv, 1);
        assert_eq!(line.history, [entry(T2, true), HistoryEntry::default()]);
        let (_, inv) = run(&[(T1, true), (T2, true)]);
        assert_eq!(inv, 1);
    }

    #[test]
    fn a_write_into_a_full_table_invalidates_even_from_a_thread_in_it() {
        let (line, inv) = run(&[(T1, false), (T2, false), (T1, true)]);
        assert_eq!(inv, 1);
        assert_eq!(line.history, [entry(T1, true), HistoryEntry::default()]);
    }

    #[test]
    fn ping_pong_writes_invalidate_every_time() {
        let seq: [(u32, bool); 10] =
            core::array::from_fn(|i| (if i % 2 == 0 { T1 } else { T2 }, true));
        let (line, inv) = run(&seq);
        assert_eq!(inv, 9);
        assert_eq!(line.waw, 9);
        assert_eq!(line.writes, 10);
    }

    #[test]
    fn dependences_are_counted_between_threads_only() {
        let (line, _) = run(&[
            (T1, true),  // -
            (T1, false), // same thread: nothing
            (T2, false), // T1 read -> T2 read: nothing (last access was a read)
            (T1, true),  // read -> write by another: WAR
            (T2, false), // RAW
            (T2, true),  // same thread
            (T1, true),  // WAW
        ]);
        assert_eq!((line.raw, line.waw, line.war), (1, 1, 1));
        assert_eq!(line.last_writer, T1);
        assert_eq!((line.reads, line.writes), (3, 4));
        assert_eq!((line.first_ns, line.last_ns), (1000, 1006));
    }

    #[test]
    fn touched_words_are_the_access_bytes_words_in_the_line() {
        assert_eq!(touched_words(0, 8), 0b11);
        assert_eq!(touched_words(4, 4), 0b10);
        assert_eq!(touched_words(6, 4), 0b110);
        assert_eq!(touched_words(0, 0), 0b1, "a zero size is one byte");
        assert_eq!(touched_words(60, 8), 1 << 15, "the rest is the next line");
        assert_eq!(touched_words(0, 64), 0xffff);
        assert_eq!(touched_words(0, u32::MAX), 0xffff);
        assert_eq!(touched_words(64, 4), 0, "past the line");
        assert_eq!(touched_words(u32::MAX, 8), 0);
        // The comparison it replaces, for every offset and size in a line.
        for offset in 0..64 {
            for size in 1..=64 {
                let (first, last) = (offset / WORD_BYTES, (offset + size - 1) / WORD_BYTES);
                let want = (0..WORDS_PER_LINE as u32)
                    .filter(|i| *i >= first && *i <= last)
                    .fold(0, |m, i| m | 1 << i);
                assert_eq!(touched_words(offset, size), want, "{offset} {size}");
            }
        }
    }

    #[test]
    fn words_record_threads_and_writers() {
        let mut w = LineWords::default();
        w.record(0, 8, T1, true); // words 0 and 1
        w.record(8, 8, T2, true); // words 2 and 3
        w.record(4, 4, T2, false); // word 1 read by T2
        w.record(60, 8, T1, true); // word 15 only: the rest is the next line
        assert_eq!(
            (w.words[0].writes, w.words[0].tid, w.words[0].flags),
            (1, T1, 0)
        );
        assert_eq!(w.words[1].flags, WORD_MANY_THREADS);
        assert_eq!(w.words[1].reads, 1);
        assert_eq!((w.words[2].writer, w.words[3].writer), (T2, T2));
        assert_eq!(w.words[15].writes, 1);
        assert_eq!(w.words[14], WordState::default());
        w.record(0, 4, T2, true);
        assert_eq!(w.words[0].flags, WORD_MANY_THREADS | WORD_MANY_WRITERS);
    }

    #[test]
    fn recipes_compute_addresses_from_registers() {
        let mut regs = [0u64; reg::COUNT];
        regs[reg::RDI as usize] = 0x1000;
        regs[reg::RCX as usize] = 3;
        let r = AccessRecipe::plain(reg::RDI, reg::RCX, 8, -8, 8, recipe::WRITE);
        assert_eq!(r.address(&regs), Some(0x1000 + 24 - 8));
        assert!(r.is_write());
        let abs = AccessRecipe::plain(reg::NONE, reg::NONE, 1, 0x4040, 4, recipe::READ);
        assert_eq!(abs.address(&regs), Some(0x4040));
        assert_eq!(AccessRecipe::none().address(&regs), None);
        let bad = AccessRecipe { base: 16, ..r };
        assert_eq!(bad.address(&regs), None);
    }

    #[test]
    fn sliced_recipes_read_the_base_back_from_memory() {
        let mut regs = [0u64; reg::COUNT];
        regs[reg::RBP as usize] = 0x7ff0;
        // rbp-0x10 holds 0x5000 (args); 0x5008 holds 0x9000 (points).
        let memory = |a: u64| match a {
            0x7fe0 => Some(0x5000),
            0x5008 => Some(0x9000),
            _ => None,
        };
        let one = AccessRecipe {
            load_disp: [-0x10, 0],
            loads: 1,
            ..AccessRecipe::plain(
                reg::RBP,
                reg::NONE,
                1,
                0x18,
                8,
                recipe::READ | recipe::SLICE,
            )
        };
        assert_eq!(one.address_with(&regs, memory), Some(0x5018));
        assert_eq!(one.address(&regs), None, "no reader: no address");
        let two = AccessRecipe {
            load_disp: [-0x10, 8],
            loads: 2,
            ..AccessRecipe::plain(reg::RBP, reg::NONE, 1, 4, 1, recipe::READ | recipe::SLICE)
        };
        assert_eq!(two.address_with(&regs, memory), Some(0x9004));
        regs[reg::RBP as usize] = 0x1234;
        assert_eq!(one.address_with(&regs, memory), None, "unreadable slot");
    }
}

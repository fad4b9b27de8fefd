//! Who used which word of a line, and when: what tells false sharing
//! (threads write different words) from true sharing (threads use the
//! same written word at the same time).
//!
//! Only concurrent use counts. Two threads share a word only if both used
//! it while both were running: successive generations of worker threads
//! that use the same bytes one after another do not share them, and a
//! main thread's initialisation before the workers start (or its final
//! read after they end) is left out before this point, as a serial
//! access. And only cross-thread accesses weigh as true sharing: one
//! sampled read by another thread does not turn a word that one thread
//! hammers into shared data.

use std::collections::{BTreeMap, BTreeSet};

use memprof_common::sharing::{LineWords, WORDS_PER_LINE, WORD_BYTES, WORD_MANY_THREADS};

/// A kind (false or true sharing) must carry this share of the line's
/// accesses for a line with both to be "mixed".
const MIXED_SHARE: f64 = 0.1;
/// A word is truly shared only when the accesses of the threads other
/// than its busiest one are at least this share of its accesses...
const MIN_CROSS_SHARE: f64 = 0.1;
/// ...and at least this many samples.
const MIN_CROSS_SAMPLES: u64 = 2;

/// How the threads share a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SharingKind {
    /// Threads write different words: the fix is layout.
    False,
    /// A written word is used by several threads: the data is shared.
    True,
    /// Both.
    Mixed,
}

impl SharingKind {
    pub fn name(self) -> &'static str {
        match self {
            SharingKind::False => "false",
            SharingKind::True => "true",
            SharingKind::Mixed => "mixed",
        }
    }
}

/// One thread's sampled use of a word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadUse {
    pub reads: u64,
    pub writes: u64,
    /// First and last sampled access (0 and `u64::MAX` when unknown).
    pub first_ns: u64,
    pub last_ns: u64,
    /// The bytes of the word it touched (bit i: byte i).
    pub bytes: u8,
}

impl Default for ThreadUse {
    fn default() -> Self {
        Self {
            reads: 0,
            writes: 0,
            first_ns: u64::MAX,
            last_ns: 0,
            bytes: 0,
        }
    }
}

impl ThreadUse {
    fn add(&mut self, reads: u64, writes: u64, first_ns: u64, last_ns: u64) {
        self.reads += reads;
        self.writes += writes;
        self.first_ns = self.first_ns.min(first_ns);
        self.last_ns = self.last_ns.max(last_ns);
    }

    fn accesses(&self) -> u64 {
        self.reads + self.writes
    }

    fn overlaps(&self, other: &ThreadUse) -> bool {
        self.first_ns <= other.last_ns && other.first_ns <= self.last_ns
    }

    /// Whether both used the same bytes at the same time, one writing:
    /// neighbouring bytes of one word (`char` counters) are false sharing.
    fn conflicts(&self, other: &ThreadUse) -> bool {
        self.overlaps(other)
            && self.bytes & other.bytes != 0
            && (self.writes > 0 || other.writes > 0)
    }
}

/// Accesses of one word of a line, per thread.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WordUse {
    /// Byte offset in the line.
    pub offset: u32,
    pub reads: u64,
    pub writes: u64,
    pub readers: BTreeSet<u32>,
    pub writers: BTreeSet<u32>,
    /// Each thread's use, with its time span. Empty when only the
    /// kernel's word table is known (which keeps no times).
    pub by_thread: BTreeMap<u32, ThreadUse>,
}

impl WordUse {
    fn new(offset: u32) -> Self {
        Self {
            offset,
            ..Self::default()
        }
    }

    /// Records `reads` and `writes` of thread `tid` to the `bytes` (bit
    /// mask) of the word between two times.
    pub fn add(
        &mut self,
        tid: u32,
        (reads, writes): (u64, u64),
        bytes: u8,
        first_ns: u64,
        last_ns: u64,
    ) {
        if reads > 0 {
            self.reads += reads;
            self.readers.insert(tid);
        }
        if writes > 0 {
            self.writes += writes;
            self.writers.insert(tid);
        }
        let used = self.by_thread.entry(tid).or_default();
        used.add(reads, writes, first_ns, last_ns);
        used.bytes |= bytes;
    }

    pub fn threads(&self) -> BTreeSet<u32> {
        self.readers.union(&self.writers).copied().collect()
    }

    fn accesses(&self) -> u64 {
        self.reads + self.writes
    }

    /// The accesses by the threads other than the busiest one, among the
    /// threads whose use of the word overlaps in time with another
    /// thread's, one of the two writing: the cross-thread part.
    pub fn cross_thread(&self) -> u64 {
        if self.by_thread.is_empty() {
            // The kernel's table: "many threads" without times or counts.
            return if !self.writers.is_empty() && self.threads().len() >= 2 {
                self.accesses()
            } else {
                0
            };
        }
        let conflicting: Vec<&ThreadUse> = self
            .by_thread
            .iter()
            .filter(|(t, a)| {
                self.by_thread
                    .iter()
                    .any(|(u, b)| u != *t && a.conflicts(b))
            })
            .map(|(_, a)| a)
            .collect();
        let total: u64 = conflicting.iter().map(|a| a.accesses()).sum();
        let busiest = conflicting.iter().map(|a| a.accesses()).max().unwrap_or(0);
        total - busiest
    }

    /// Whether threads use this written word concurrently, enough to be
    /// true sharing.
    pub fn shared(&self) -> bool {
        let cross = self.cross_thread();
        cross >= MIN_CROSS_SAMPLES && cross as f64 >= MIN_CROSS_SHARE * self.accesses() as f64
    }
}

/// One sampled (parallel-phase) access group: `n` accesses of thread `tid`
/// to `size` bytes at `offset`, between two times.
#[derive(Debug, Clone, Copy)]
pub struct Touch {
    pub tid: u32,
    pub offset: u32,
    pub size: u32,
    pub read: bool,
    pub write: bool,
    pub n: u64,
    pub first_ns: u64,
    pub last_ns: u64,
}

/// The words of a line from its sampled accesses, in offset order.
pub fn from_touches(touches: impl IntoIterator<Item = Touch>) -> Vec<WordUse> {
    let mut words: BTreeMap<u32, WordUse> = BTreeMap::new();
    for t in touches {
        let first = t.offset / WORD_BYTES;
        let last = ((t.offset + t.size.max(1) - 1) / WORD_BYTES).min(WORDS_PER_LINE as u32 - 1);
        let end = t.offset + t.size.max(1);
        for w in first..=last {
            let (r, wr) = (if t.read { t.n } else { 0 }, if t.write { t.n } else { 0 });
            let base = w * WORD_BYTES;
            let bytes = (0..WORD_BYTES)
                .filter(|b| (t.offset..end).contains(&(base + b)))
                .fold(0u8, |m, b| m | 1 << b);
            words.entry(w).or_insert_with(|| WordUse::new(base)).add(
                t.tid,
                (r, wr),
                bytes,
                t.first_ns,
                t.last_ns,
            );
        }
    }
    words.into_values().collect()
}

/// The kernel's word table keeps the first thread and a "many" flag; the
/// other threads are unknown, which [`classify`] still reads correctly
/// (a word touched by many threads) but names only one of them.
pub fn from_kernel(k: &LineWords) -> Vec<WordUse> {
    k.words
        .iter()
        .enumerate()
        .filter(|(_, w)| w.reads + w.writes > 0)
        .map(|(i, w)| {
            let mut word = WordUse::new(i as u32 * WORD_BYTES);
            word.reads = u64::from(w.reads);
            word.writes = u64::from(w.writes);
            if w.writes > 0 {
                word.writers.insert(w.writer);
            }
            if w.reads > 0 || w.tid != w.writer {
                word.readers.insert(w.tid);
            }
            if w.flags & WORD_MANY_THREADS != 0 && word.threads().len() < 2 {
                // Another thread, unnamed.
                word.readers.insert(0);
            }
            word
        })
        .collect()
}

/// Each thread's time span on the line (all its words).
fn spans(words: &[WordUse]) -> BTreeMap<u32, ThreadUse> {
    let mut spans: BTreeMap<u32, ThreadUse> = BTreeMap::new();
    for w in words {
        for (&t, u) in &w.by_thread {
            spans.entry(t).or_default().add(0, 0, u.first_ns, u.last_ns);
        }
    }
    spans
}

/// Whether, while a thread wrote `w`, another thread was on the line
/// without using the same bytes of `w` at the same time (for the kernel's
/// table, without times: whether a thread other than `w`'s users was on
/// the line).
fn neighbour_during(w: &WordUse, all: &BTreeSet<u32>, spans: &BTreeMap<u32, ThreadUse>) -> bool {
    if w.by_thread.is_empty() {
        let users = w.threads();
        return all.iter().any(|u| !users.contains(u));
    }
    w.by_thread
        .iter()
        .filter(|(_, a)| a.writes > 0)
        .any(|(t, a)| {
            spans.iter().any(|(u, span)| {
                u != t && a.overlaps(span) && w.by_thread.get(u).is_none_or(|b| !a.conflicts(b))
            })
        })
}

/// False, true or mixed sharing, from who touched which word when; None
/// when nothing written is shared (read-only sharing costs nothing).
pub fn classify(words: &[WordUse]) -> Option<SharingKind> {
    let total: u64 = words.iter().map(WordUse::accesses).sum();
    if total == 0 {
        return None;
    }
    // True sharing: a written word threads use concurrently; only its
    // cross-thread accesses weigh.
    let true_weight: u64 = words
        .iter()
        .filter(|w| w.shared())
        .map(WordUse::cross_thread)
        .sum();
    // False sharing: a thread writes a word that another thread, on the
    // line at the same time, never touches.
    let all: BTreeSet<u32> = words.iter().flat_map(WordUse::threads).collect();
    let spans = spans(words);
    let false_weight: u64 = words
        .iter()
        .filter(|w| !w.writers.is_empty() && !w.shared() && neighbour_during(w, &all, &spans))
        .map(WordUse::accesses)
        .sum();
    let share = |w: u64| w as f64 / total as f64;
    match (false_weight > 0, true_weight > 0) {
        (false, false) => None,
        (true, false) => Some(SharingKind::False),
        (false, true) => Some(SharingKind::True),
        (true, true) => {
            if share(true_weight) < MIXED_SHARE {
                Some(SharingKind::False)
            } else if share(false_weight) < MIXED_SHARE {
                Some(SharingKind::True)
            } else {
                Some(SharingKind::Mixed)
            }
        }
    }
}

/// Each writing thread's byte range `(tid, first, end)` among the words
/// that are not truly shared: what to separate.
pub fn thread_parts(words: &[WordUse]) -> Vec<(u32, u32, u32)> {
    let mut parts: BTreeMap<u32, (u32, u32)> = BTreeMap::new();
    for w in words.iter().filter(|w| !w.shared()) {
        for &tid in &w.writers {
            let e = parts
                .entry(tid)
                .or_insert((w.offset, w.offset + WORD_BYTES));
            e.0 = e.0.min(w.offset);
            e.1 = e.1.max(w.offset + WORD_BYTES);
        }
    }
    let mut v: Vec<_> = parts.into_iter().map(|(t, (a, b))| (t, a, b)).collect();
    v.sort_by_key(|&(t, a, _)| (a, t));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(tid: u32, offset: u32, write: bool, n: u64, span: (u64, u64)) -> Touch {
        Touch {
            tid,
            offset,
            size: 8,
            read: !write,
            write,
            n,
            first_ns: span.0,
            last_ns: span.1,
        }
    }

    #[test]
    fn successive_generations_of_threads_do_not_share_a_word() {
        // Round 1: threads 1 and 2 write words 0 and 8; round 2: threads
        // 3 and 4 the same words, after 1 and 2 ended.
        let words = from_touches([
            touch(1, 0, true, 100, (10, 20)),
            touch(2, 8, true, 100, (10, 20)),
            touch(3, 0, true, 100, (30, 40)),
            touch(4, 8, true, 100, (30, 40)),
        ]);
        assert!(words.iter().all(|w| !w.shared()), "{words:#?}");
        assert_eq!(classify(&words), Some(SharingKind::False));
        let parts = thread_parts(&words);
        assert_eq!(parts, vec![(1, 0, 8), (3, 0, 8), (2, 8, 16), (4, 8, 16)]);
        // The same threads at the same time: true sharing.
        let words = from_touches([
            touch(1, 0, true, 100, (10, 20)),
            touch(3, 0, true, 100, (10, 20)),
        ]);
        assert_eq!(classify(&words), Some(SharingKind::True));
    }

    #[test]
    fn one_stray_read_by_another_thread_is_not_true_sharing() {
        let words = from_touches([
            touch(1, 0, true, 200, (10, 90)),
            touch(2, 0, false, 1, (50, 50)),
            touch(2, 8, true, 200, (10, 90)),
        ]);
        assert!(!words[0].shared());
        assert_eq!(classify(&words), Some(SharingKind::False));
    }

    #[test]
    fn a_thread_alone_on_the_line_at_the_time_is_not_false_sharing() {
        // Thread 2 writes its word only after thread 1 stopped.
        let words = from_touches([
            touch(1, 0, true, 100, (10, 20)),
            touch(2, 8, true, 100, (30, 40)),
        ]);
        assert_eq!(classify(&words), None);
    }

    #[test]
    fn neighbouring_bytes_of_one_word_are_false_sharing() {
        // Two processes' threads each increment their own byte of word 0.
        let byte = |tid, offset| Touch {
            size: 1,
            ..touch(tid, offset, true, 100, (10, 90))
        };
        let words = from_touches([byte(1, 0), byte(2, 1)]);
        assert_eq!(words.len(), 1);
        assert!(!words[0].shared());
        assert_eq!(classify(&words), Some(SharingKind::False));
        // The same byte: true sharing.
        let words = from_touches([byte(1, 0), byte(2, 0)]);
        assert_eq!(classify(&words), Some(SharingKind::True));
    }

    #[test]
    fn cross_thread_accesses_are_the_non_busiest_ones() {
        let words = from_touches([
            touch(1, 0, true, 90, (10, 90)),
            touch(2, 0, true, 30, (10, 90)),
            touch(3, 0, false, 20, (10, 90)),
        ]);
        assert_eq!(words[0].cross_thread(), 50);
        assert!(words[0].shared());
    }
}

//! False and true sharing of cache lines, from sampled accesses.
//!
//! Two sources meet here. The kernel's per-line table
//! ([`memprof_common::sharing::LineState`]) counts invalidations with
//! Cheetah's two-entry rule and the inter-thread dependences; it sees every
//! sample, even those the ring buffer later drops. The samples themselves
//! (each with its address, size, read/write, thread and instruction) say
//! exactly which words each thread touched and from which code, which is
//! what classifies a line and tells the user what to change.

use std::collections::{BTreeMap, BTreeSet};

use memprof_common::sharing::{HistoryEntry, LineState, LineWords, LINE_BYTES};

use super::words::{self, Touch};
pub use super::words::{classify, SharingKind, WordUse};
use crate::features::FastMap;

/// A line needs this many invalidations to be a finding...
pub const MIN_INVALIDATIONS: u64 = 5;
/// ...and this many of its sampled accesses must invalidate: a read-mostly
/// line whose rare writes invalidate is not worth reporting.
pub const MIN_INVALIDATION_RATE: f64 = 0.02;
/// ...and at least this share of all the target's samples must hit it.
pub const MIN_COST_SHARE: f64 = 0.005;
/// One sampled access, as the analysis needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    pub tid: u32,
    /// The accessing instruction (after skid compensation).
    pub insn: u64,
    pub addr: u64,
    pub size: u32,
    /// Reads the word (a read-modify-write does both).
    pub read: bool,
    pub write: bool,
    pub time_ns: u64,
    /// Taken while the thread was the only one running: outside the
    /// parallel phases (a main thread's set-up or final read), where no
    /// sharing can happen.
    pub serial: bool,
}

/// Key of the per-line aggregate: who touched which bytes from where.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct AccessKey {
    insn: u64,
    tid: u32,
    offset: u8,
    size: u8,
    read: bool,
    write: bool,
    serial: bool,
}

/// How many accesses of one key, and when.
#[derive(Debug, Clone, Copy)]
struct KeyStats {
    n: u64,
    first_ns: u64,
    last_ns: u64,
}

/// The samples that hit one line.
#[derive(Debug, Default, Clone)]
struct LineSamples {
    accesses: FastMap<AccessKey, KeyStats>,
    samples: u64,
    writes: u64,
    /// Up to 2 distinct threads (enough to know the line is shared).
    threads: [u32; 2],
    /// The kernel's rule replayed on the samples from the moment a second
    /// thread touched the line (before, no access can invalidate): what
    /// stands in for the kernel's entry when the kernel's table evicted
    /// it, or re-created it with a shorter history.
    replay: Option<Box<LineState>>,
}

impl LineSamples {
    fn shared(&self) -> bool {
        self.threads[1] != 0 && self.writes > 0
    }
}

/// The accesses of one instruction to a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeUse {
    pub insn: u64,
    pub reads: u64,
    pub writes: u64,
    /// Placed accesses (a read-modify-write counts once).
    pub samples: u64,
    pub threads: BTreeSet<u32>,
    /// Lowest byte offset in the line it touched.
    pub offset: u32,
}

/// A shared line worth reporting.
#[derive(Debug, Clone, PartialEq)]
pub struct LineFinding {
    pub line: u64,
    pub kind: SharingKind,
    pub invalidations: u64,
    /// Sampled accesses to the line (the kernel's count: all samples).
    pub samples: u64,
    /// The line's share of all the target's samples.
    pub cost_share: f64,
    /// Invalidations per sampled access.
    pub invalidation_rate: f64,
    pub threads: Vec<u32>,
    /// Words touched (offset order).
    pub words: Vec<WordUse>,
    /// Instructions touching the line, most accesses first.
    pub code: Vec<CodeUse>,
    /// Inter-thread dependences (read-after-write, write-after-write,
    /// write-after-read) between consecutive sampled accesses.
    pub raw: u64,
    pub waw: u64,
    pub war: u64,
    /// Lowest sampled address on the line (names the object).
    pub first_addr: u64,
    /// For false sharing: each writing thread's byte range in the line.
    pub parts: Vec<(u32, u32, u32)>,
}

/// Why a sampled line is not a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dismissal {
    /// Only one thread was sampled on it.
    OneThread,
    /// No sampled access wrote it (sharing read-only data costs nothing).
    NoWrites,
    /// The kernel's line table did not hold it at the end.
    NotInTable,
    /// Fewer than [`MIN_INVALIDATIONS`] sampled invalidations.
    FewInvalidations,
    /// Its writes invalidate less than [`MIN_INVALIDATION_RATE`] of its
    /// accesses.
    ReadMostly,
    /// Less than [`MIN_COST_SHARE`] of the program's samples.
    LowCost,
    /// No written word is used by another thread, and no thread writes
    /// next to another's words.
    NothingWrittenShared,
}

impl Dismissal {
    pub fn reason(self) -> &'static str {
        match self {
            Dismissal::OneThread => "one thread",
            Dismissal::NoWrites => "no sampled write",
            Dismissal::NotInTable => "not in the kernel's line table",
            Dismissal::FewInvalidations => "few invalidations",
            Dismissal::ReadMostly => "read-mostly",
            Dismissal::LowCost => "little of the program's time",
            Dismissal::NothingWrittenShared => "nothing written is shared",
        }
    }
}

/// A sampled line, summed up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampledLine {
    pub line: u64,
    pub samples: u64,
    pub writes: u64,
    /// Sampled from two threads or more.
    pub shared: bool,
    /// Lowest sampled address on it (names the object).
    pub first_addr: u64,
}

/// Accesses of the target, aggregated per cache line.
#[derive(Debug, Default)]
pub struct SharingProfile {
    lines: FastMap<u64, LineSamples>,
}

impl SharingProfile {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn on_access(&mut self, a: Access) {
        let line = a.addr & !(LINE_BYTES - 1);
        let entry = self.lines.entry(line).or_default();
        entry.samples += 1;
        if a.write {
            entry.writes += 1;
        }
        if entry.threads[0] == 0 {
            entry.threads[0] = a.tid;
        } else if entry.threads[0] != a.tid && entry.threads[1] == 0 {
            entry.threads[1] = a.tid;
            // Seeded with the first thread's entry, as the kernel's table
            // holds it, without counting its accesses again.
            let first = HistoryEntry {
                tid: entry.threads[0],
                write: u32::from(entry.writes > u64::from(a.write)),
            };
            entry.replay = Some(Box::new(LineState {
                history: [first, HistoryEntry::default()],
                last_tid: first.tid,
                last_write: first.write,
                last_writer: if first.write != 0 { first.tid } else { 0 },
                ..LineState::default()
            }));
        }
        if let Some(state) = entry.replay.as_mut() {
            state.record(a.tid, a.write, a.time_ns);
        }
        let key = AccessKey {
            insn: a.insn,
            tid: a.tid,
            offset: (a.addr - line) as u8,
            size: a.size.min(64) as u8,
            read: a.read,
            write: a.write,
            serial: a.serial,
        };
        let stats = entry.accesses.entry(key).or_insert(KeyStats {
            n: 0,
            first_ns: a.time_ns,
            last_ns: a.time_ns,
        });
        stats.n += 1;
        stats.first_ns = stats.first_ns.min(a.time_ns);
        stats.last_ns = stats.last_ns.max(a.time_ns);
    }

    /// Lines touched by two threads or more, at least one writing: the
    /// ones whose kernel state is worth reading.
    pub fn candidates(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .lines
            .iter()
            .filter(|(_, l)| l.shared())
            .map(|(&line, _)| line)
            .collect();
        v.sort_unstable();
        v
    }

    /// The kernel's state of `line` or the samples' replay of it, whichever
    /// saw more accesses: the kernel sees every sample (also those the ring
    /// buffer dropped), but its LRU table may have evicted the line and
    /// started it afresh.
    fn longest_history<'a>(
        &'a self,
        line: u64,
        kernel: Option<&'a LineState>,
    ) -> Option<&'a LineState> {
        let replay = self.lines.get(&line).and_then(|l| l.replay.as_deref());
        let seen = |s: &LineState| s.reads + s.writes;
        match (kernel, replay) {
            (Some(k), Some(r)) if seen(r) > seen(k) => Some(r),
            (Some(k), _) => Some(k),
            (None, r) => r,
        }
    }

    /// Lowest byte offset sampled on `line` (0 if none).
    pub fn first_offset(&self, line: u64) -> u8 {
        self.lines
            .get(&line)
            .and_then(|l| l.accesses.keys().map(|k| k.offset).min())
            .unwrap_or(0)
    }

    /// Distinct lines sampled.
    pub fn lines(&self) -> usize {
        self.lines.len()
    }

    /// The `n` most-sampled lines, busiest first: the lines a reader would
    /// suspect, so that each one not reported can be shown with the
    /// reason.
    pub fn busiest(&self, n: usize) -> Vec<SampledLine> {
        let mut v: Vec<(u64, &LineSamples)> = self.lines.iter().map(|(&k, l)| (k, l)).collect();
        v.sort_by(|a, b| b.1.samples.cmp(&a.1.samples).then(a.0.cmp(&b.0)));
        v.truncate(n);
        // The lowest offset is looked up for the kept lines only.
        v.into_iter()
            .map(|(line, l)| SampledLine {
                line,
                samples: l.samples,
                writes: l.writes,
                shared: l.threads[1] != 0,
                first_addr: line + u64::from(self.first_offset(line)),
            })
            .collect()
    }

    /// Decides whether `line` is a finding, given the kernel's state of it
    /// (`state`; None if evicted) and the kernel's word table (used when
    /// the samples were lost on the way), and `total_samples` of the
    /// target.
    pub fn analyse(
        &self,
        line: u64,
        state: Option<&LineState>,
        kernel_words: Option<&LineWords>,
        total_samples: u64,
    ) -> Option<LineFinding> {
        self.judge(line, state, kernel_words, total_samples).ok()
    }

    /// As [`analyse`](Self::analyse), saying why a line is not a finding.
    pub fn judge(
        &self,
        line: u64,
        state: Option<&LineState>,
        kernel_words: Option<&LineWords>,
        total_samples: u64,
    ) -> Result<LineFinding, Dismissal> {
        let state = self
            .longest_history(line, state)
            .ok_or(Dismissal::NotInTable)?;
        let samples = (state.reads + state.writes).max(1);
        let invalidation_rate = state.invalidations as f64 / samples as f64;
        let cost_share = samples as f64 / total_samples.max(samples) as f64;
        if state.invalidations < MIN_INVALIDATIONS {
            return Err(Dismissal::FewInvalidations);
        }
        if invalidation_rate < MIN_INVALIDATION_RATE {
            return Err(Dismissal::ReadMostly);
        }
        if cost_share < MIN_COST_SHARE {
            return Err(Dismissal::LowCost);
        }
        let ours = self.lines.get(&line);
        let words = match ours {
            Some(l) if !l.accesses.is_empty() => parallel_words(l),
            _ => words::from_kernel(kernel_words.ok_or(Dismissal::NotInTable)?),
        };
        let kind = classify(&words).ok_or(Dismissal::NothingWrittenShared)?;
        let code = ours.map(code_uses).unwrap_or_default();
        let threads: BTreeSet<u32> = words.iter().flat_map(WordUse::threads).collect();
        let first_addr = line + words.first().map_or(0, |w| u64::from(w.offset));
        let parts = if kind == SharingKind::True {
            Vec::new()
        } else {
            words::thread_parts(&words)
        };
        Ok(LineFinding {
            line,
            kind,
            invalidations: state.invalidations,
            samples,
            cost_share,
            invalidation_rate,
            threads: threads.into_iter().collect(),
            words,
            code,
            raw: state.raw,
            waw: state.waw,
            war: state.war,
            first_addr,
            parts,
        })
    }
}

/// The words of a line from its accesses in parallel phases.
fn parallel_words(l: &LineSamples) -> Vec<WordUse> {
    words::from_touches(
        l.accesses
            .iter()
            .filter(|(k, _)| !k.serial)
            .map(|(k, s)| Touch {
                tid: k.tid,
                offset: u32::from(k.offset),
                size: u32::from(k.size),
                read: k.read,
                write: k.write,
                n: s.n,
                first_ns: s.first_ns,
                last_ns: s.last_ns,
            }),
    )
}

fn code_uses(l: &LineSamples) -> Vec<CodeUse> {
    let mut by_insn: BTreeMap<u64, CodeUse> = BTreeMap::new();
    for (k, s) in &l.accesses {
        let n = s.n;
        let e = by_insn.entry(k.insn).or_insert_with(|| CodeUse {
            insn: k.insn,
            reads: 0,
            writes: 0,
            samples: 0,
            threads: BTreeSet::new(),
            offset: u32::from(k.offset),
        });
        e.samples += n;
        if k.write {
            e.writes += n;
        }
        if k.read {
            e.reads += n;
        }
        e.threads.insert(k.tid);
        e.offset = e.offset.min(u32::from(k.offset));
    }
    let mut v: Vec<CodeUse> = by_insn.into_values().collect();
    v.sort_by(|a, b| {
        (b.reads + b.writes)
            .cmp(&(a.reads + a.writes))
            .then(a.insn.cmp(&b.insn))
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_common::sharing::{WordState, WORD_MANY_THREADS};

    use crate::features::sharing::words::from_kernel as words_from_kernel;

    const LINE: u64 = 0x7000_0040;

    fn access(tid: u32, offset: u64, write: bool) -> Access {
        Access {
            tid,
            insn: 0x1000 + u64::from(tid),
            addr: LINE + offset,
            size: 8,
            read: !write,
            write,
            time_ns: 0,
            serial: false,
        }
    }

    /// Replays the accesses through the kernel's rule too.
    fn profile(accesses: &[Access]) -> (SharingProfile, LineState) {
        let mut p = SharingProfile::new();
        let mut state = LineState::default();
        for (i, &a) in accesses.iter().enumerate() {
            p.on_access(a);
            state.record(a.tid, a.write, i as u64 + 1);
        }
        (p, state)
    }

    fn ping_pong(n: usize, a: (u32, u64), b: (u32, u64)) -> Vec<Access> {
        (0..n)
            .map(|i| {
                let (tid, off) = if i % 2 == 0 { a } else { b };
                access(tid, off, true)
            })
            .collect()
    }

    #[test]
    fn a_main_threads_serial_set_up_and_final_read_are_left_out() {
        // Thread 9 (main) writes every word alone, then threads 1 and 2
        // write their own words together, then 9 reads them all alone.
        let mut seq: Vec<Access> = (0..8)
            .map(|i| Access {
                serial: true,
                ..access(9, i * 8, true)
            })
            .collect();
        seq.extend(ping_pong(100, (1, 0), (2, 8)));
        seq.extend((0..8).map(|i| Access {
            serial: true,
            ..access(9, i * 8, false)
        }));
        let (p, state) = profile(&seq);
        let f = p.analyse(LINE, Some(&state), None, 116).expect("a finding");
        assert_eq!(
            f.kind,
            SharingKind::False,
            "main's accesses are not sharing"
        );
        assert_eq!(f.threads, vec![1, 2]);
    }

    #[test]
    fn a_dismissed_line_says_why() {
        // Ping-pong writes, but the line is a sliver of the program.
        let (p, state) = profile(&ping_pong(100, (1, 0), (2, 8)));
        assert_eq!(
            p.judge(LINE, Some(&state), None, 1_000_000).err(),
            Some(Dismissal::LowCost)
        );
        assert_eq!(
            SharingProfile::new().judge(LINE, None, None, 100).err(),
            Some(Dismissal::NotInTable)
        );
        // One rare write among many reads of two threads: read-mostly.
        let mut reads: Vec<Access> = (0..400).map(|i| access(1 + i % 2, 0, false)).collect();
        reads.extend(ping_pong(6, (1, 0), (2, 0)));
        let (p, state) = profile(&reads);
        assert!(state.invalidations >= MIN_INVALIDATIONS, "{state:?}");
        assert_eq!(
            p.judge(LINE, Some(&state), None, 406).err(),
            Some(Dismissal::ReadMostly)
        );
    }

    #[test]
    fn busiest_lines_come_first_and_say_if_shared() {
        let mut p = SharingProfile::new();
        for i in 0..10 {
            p.on_access(access(1, 0, i % 2 == 0));
        }
        for _ in 0..3 {
            p.on_access(Access {
                addr: LINE + 64,
                ..access(1, 0, true)
            });
            p.on_access(Access {
                addr: LINE + 64,
                ..access(2, 8, true)
            });
        }
        for _ in 0..50 {
            p.on_access(Access {
                addr: LINE + 128,
                ..access(1, 8, false)
            });
        }
        let busiest = p.busiest(8);
        let got: Vec<(u64, u64, u64, bool)> = busiest
            .iter()
            .map(|l| (l.line, l.samples, l.writes, l.shared))
            .collect();
        assert_eq!(
            got,
            vec![
                (LINE + 128, 50, 0, false),
                (LINE, 10, 5, false),
                (LINE + 64, 6, 6, true)
            ]
        );
        assert_eq!(busiest[0].first_addr, LINE + 128);
        assert_eq!(p.busiest(1).len(), 1);
    }

    #[test]
    fn threads_writing_different_words_are_false_sharing() {
        let (p, state) = profile(&ping_pong(100, (1, 0), (2, 8)));
        assert_eq!(p.candidates(), vec![LINE]);
        let f = p.analyse(LINE, Some(&state), None, 200).expect("a finding");
        assert_eq!(f.kind, SharingKind::False);
        assert_eq!(f.threads, vec![1, 2]);
        assert_eq!(f.invalidations, 99);
        assert!((f.cost_share - 0.5).abs() < 1e-9);
        assert_eq!(f.parts, vec![(1, 0, 8), (2, 8, 16)]);
        assert_eq!(f.words.len(), 4, "two 8-byte fields = four words");
        assert_eq!(f.code.len(), 2);
        assert_eq!(f.first_addr, LINE);
    }

    #[test]
    fn threads_writing_the_same_word_are_true_sharing() {
        let (p, state) = profile(&ping_pong(100, (1, 16), (2, 16)));
        let f = p.analyse(LINE, Some(&state), None, 100).expect("a finding");
        assert_eq!(f.kind, SharingKind::True);
        assert!(f.parts.is_empty());
        assert_eq!(f.first_addr, LINE + 16);
    }

    #[test]
    fn a_writer_and_a_reader_of_different_words_are_false_sharing() {
        let mut seq = Vec::new();
        for _ in 0..50 {
            seq.push(access(1, 0, true));
            seq.push(access(2, 32, false));
        }
        let (p, state) = profile(&seq);
        let f = p.analyse(LINE, Some(&state), None, 100).expect("a finding");
        assert_eq!(f.kind, SharingKind::False);
        assert_eq!(f.parts, vec![(1, 0, 8)], "only the writer's part is named");
    }

    #[test]
    fn both_kinds_on_one_line_are_mixed() {
        let mut seq = ping_pong(60, (1, 0), (2, 8));
        seq.extend(ping_pong(60, (1, 32), (2, 32)));
        let (p, state) = profile(&seq);
        let f = p.analyse(LINE, Some(&state), None, 120).expect("a finding");
        assert_eq!(f.kind, SharingKind::Mixed);
    }

    #[test]
    fn one_thread_initialising_then_others_reading_is_no_finding() {
        let mut seq: Vec<Access> = (0..100).map(|i| access(1, (i % 8) * 8, true)).collect();
        seq.extend((0..200).map(|i| access(2 + (i % 2) as u32, (i % 8) * 8, false)));
        let (p, state) = profile(&seq);
        assert!(state.invalidations <= 1);
        assert_eq!(p.analyse(LINE, Some(&state), None, 300), None);
    }

    #[test]
    fn read_mostly_lines_with_rare_writes_are_no_finding() {
        let mut seq = Vec::new();
        for i in 0..1000u64 {
            seq.push(access(2 + (i % 3) as u32, (i % 8) * 8, false));
            if i % 100 == 0 {
                seq.push(access(1, 0, true));
            }
        }
        let (p, state) = profile(&seq);
        assert!(state.invalidations >= MIN_INVALIDATIONS, "{state:?}");
        assert_eq!(
            p.analyse(LINE, Some(&state), None, 1010),
            None,
            "rate {}",
            state.invalidations as f64 / 1010.0
        );
    }

    #[test]
    fn a_line_that_costs_little_is_no_finding() {
        let (p, state) = profile(&ping_pong(20, (1, 0), (2, 8)));
        assert!(p.analyse(LINE, Some(&state), None, 20).is_some());
        assert_eq!(p.analyse(LINE, Some(&state), None, 1_000_000), None);
    }

    #[test]
    fn a_line_the_kernel_evicted_is_judged_on_its_samples() {
        let (p, state) = profile(&ping_pong(100, (1, 0), (2, 8)));
        let f = p
            .analyse(LINE, None, None, 200)
            .expect("found from the samples");
        assert_eq!(f.kind, SharingKind::False);
        assert_eq!(f.invalidations, state.invalidations);
        // Re-created by the kernel with a short history: the samples'
        // longer one counts.
        let mut fresh = LineState::default();
        fresh.record(1, true, 1);
        fresh.record(2, true, 2);
        let f = p.analyse(LINE, Some(&fresh), None, 200).expect("a finding");
        assert_eq!(f.invalidations, state.invalidations);
    }

    #[test]
    fn private_and_read_only_lines_are_not_candidates() {
        let mut seq: Vec<Access> = (0..10).map(|_| access(1, 0, true)).collect();
        seq.extend((0..10).map(|i| Access {
            addr: LINE + 0x40 + (i % 2) * 8,
            ..access(1 + (i % 2) as u32, 0, false)
        }));
        let (p, _) = profile(&seq);
        assert!(p.candidates().is_empty());
        assert_eq!(p.lines(), 2);
        assert_eq!(classify(&[]), None);
    }

    #[test]
    fn the_kernel_word_table_stands_in_for_lost_samples() {
        let mut words = LineWords::default();
        let mut state = LineState::default();
        for i in 0..40 {
            let (tid, off) = if i % 2 == 0 { (1, 0) } else { (2, 8) };
            words.record(off, 8, tid, true);
            state.record(tid, true, i);
        }
        let p = SharingProfile::new();
        let f = p
            .analyse(LINE, Some(&state), Some(&words), 40)
            .expect("a finding");
        assert_eq!(f.kind, SharingKind::False);
        assert_eq!(f.threads, vec![1, 2]);
        assert!(f.code.is_empty(), "no samples, no code");

        let mut shared = LineWords::default();
        shared.words[0] = WordState {
            reads: 3,
            writes: 5,
            tid: 1,
            writer: 1,
            flags: WORD_MANY_THREADS,
        };
        assert_eq!(
            classify(&words_from_kernel(&shared)),
            Some(SharingKind::True)
        );
    }
}

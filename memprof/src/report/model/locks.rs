//! The locks part: what threads waited for, and what the lock uprobes
//! saw of the same locks.

use serde::{Deserialize, Serialize};

use super::TraceMode;

schema_enum! {
    /// What threads waited for.
    #[derive(Default)]
    pub enum LockKind {
        Mutex = "mutex",
        Rwlock = "rwlock",
        /// A futex word whose lock functions were not recognized.
        #[default]
        Futex = "futex",
        /// A kernel lock (all of one kind are one entry).
        Kernel = "kernel",
        Condvar = "condvar",
        Barrier = "barrier",
        /// A thread waiting for another to exit.
        Join = "join",
        Semaphore = "semaphore",
    }
}

impl LockKind {
    /// Whether waiting on this kind of object is lock contention (a
    /// condvar, barrier, join or semaphore wait is waiting for an event).
    pub fn is_contention(self) -> bool {
        matches!(
            self,
            LockKind::Mutex | LockKind::Rwlock | LockKind::Futex | LockKind::Kernel
        )
    }
}

/// Where a lock entry's lock is. JSON: the address in hex, `"kernel"` or
/// `"other"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum LockAddress {
    /// The (first) futex word's address.
    At(u64),
    /// Kernel locks (one entry per kind).
    Kernel,
    /// The locks aggregated by call site (a table's overflow).
    #[default]
    Other,
}

impl std::fmt::Display for LockAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockAddress::At(a) => f.pad(&format!("{a:#x}")),
            LockAddress::Kernel => f.pad("kernel"),
            LockAddress::Other => f.pad("other"),
        }
    }
}

impl std::str::FromStr for LockAddress {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "kernel" => Ok(LockAddress::Kernel),
            "other" => Ok(LockAddress::Other),
            _ => s
                .strip_prefix("0x")
                .and_then(|hex| u64::from_str_radix(hex, 16).ok())
                .map(LockAddress::At)
                .ok_or_else(|| format!("not a lock address: {s:?}")),
        }
    }
}

impl Serialize for LockAddress {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for LockAddress {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// One lock (or futex word, or kind of kernel lock) threads waited for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LockEntry {
    /// Address of the (first) futex word, hex; for kernel locks, "kernel";
    /// for the locks aggregated by call site, "other".
    pub address: LockAddress,
    /// Global symbol, heap block ("heap block from file:line"), kernel
    /// lock kind, or null.
    pub name: Option<String>,
    /// "mutex", "rwlock", "futex" or "kernel" (lock contention), or
    /// "condvar", "barrier", "join" or "semaphore" (waits for an event).
    pub kind: LockKind,
    /// Acquisitions (needs the lock uprobes: null when not traced, or when
    /// fewer than the contentions; in sampled mode an estimate scaled by
    /// the calls the kernel counted, see `lock_tracing`).
    pub acquisitions: Option<u64>,
    /// Contentions per acquisition, at most 1 (null without acquisitions).
    pub contention_rate: Option<f64>,
    /// Try and timed lock calls that did not get the lock (scaled).
    pub failed_attempts: Option<u64>,
    /// Time the lock calls took to return with the lock (uprobes).
    pub acquire_p99_ns: Option<u64>,
    pub acquire_max_ns: Option<u64>,
    /// Waits: futex waits (sleeps on the default path; every futex wait
    /// call on the syscall path) or kernel lock waits.
    pub contentions: u64,
    /// Claimed relative error (two standard deviations) of `contentions`
    /// and the wait times when the governor traced only some of the
    /// waits (see `lock_contention`); null when every wait was traced.
    pub contention_error: Option<f64>,
    pub wait_total_ns: u64,
    pub wait_mean_ns: u64,
    pub wait_p99_ns: u64,
    pub wait_max_ns: u64,
    /// Hold time, lock return to unlock (needs the lock uprobes: null
    /// when not traced). Total is of the sections traced.
    pub hold_p99_ns: Option<u64>,
    pub hold_mean_ns: Option<u64>,
    pub hold_max_ns: Option<u64>,
    pub hold_total_ns: Option<u64>,
    /// Log2 histograms: (upper bound in ns, count) of the waits and of
    /// the hold times traced.
    pub wait_histogram: Vec<(u64, u64)>,
    pub hold_histogram: Vec<(u64, u64)>,
    /// Threads that waited.
    pub threads: usize,
    /// Whether the owner thread was read from the lock at wait time (glibc
    /// mutexes keep it next to the futex word).
    pub owner_seen: bool,
    /// Owner threads seen at wait time, most often first.
    pub owners: Vec<OwnerEntry>,
    /// Where threads waited (the code that took the lock), most time first.
    pub waiters: Vec<WaiterSite>,
    /// Where waiters were woken from: the releasing code (usually the
    /// holder's unlock), most often first.
    pub holders: Vec<HolderSite>,
    /// The critical sections (uprobes): where the lock was taken and
    /// released, most hold time first.
    pub sections: Vec<SectionEntry>,
    /// Whether the waits were needed: the critical sections that
    /// serialized, classified by what they were sampled touching (null
    /// when no traced section waited behind another with sampled
    /// accesses).
    pub unnecessary: Option<Unnecessary>,
}

impl LockEntry {
    /// The lock's name, or its address when it has none.
    pub fn label(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| self.address.to_string())
    }
}

schema_enum! {
    /// PerfPlay's classes of two critical sections of one lock.
    #[derive(Default)]
    pub enum ContentionClass {
        /// One of the two touched no shared memory.
        #[default]
        Null = "null",
        /// Both only read shared memory.
        ReadRead = "read-read",
        /// They write shared memory, never the bytes the other touches.
        DisjointWrite = "disjoint-write",
        /// Same data without conflict (redundant writes of one value).
        Benign = "benign",
        /// One writes what the other reads or writes: needed.
        True = "true",
    }
}

/// Unnecessary lock contention on one lock.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Unnecessary {
    /// The class of the hand-offs holding most of the wait.
    pub class: ContentionClass,
    /// Hand-offs of that class seen: a section whose lock call waited
    /// while another thread's section held the lock (traced sections
    /// only: in sampled lock mode, those inside the windows).
    pub pairs: u64,
    /// The lock's wait time (`wait_total_ns`) times the share of the
    /// classified traced waits spent behind unnecessary hand-offs.
    pub wasted_wait_ns: u64,
    pub wasted_share: f64,
    /// Share of the traced waits left out: one of the two sections had
    /// no sampled access at all, so nothing is known of it.
    pub unsampled_share: f64,
    /// For an unnecessary class: the probability that a conflicting
    /// access, were it 5% of the sections' accesses, would have been
    /// sampled (see `confidence_basis`); 1 for true contention.
    pub confidence: f64,
    pub confidence_basis: String,
    /// Every class seen, most wait first.
    pub classes: Vec<ClassShare>,
    /// The critical sections' sampled accesses, most sampled first.
    pub evidence: Vec<SectionEvidence>,
    pub advice: String,
}

/// The hand-offs of one class.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassShare {
    pub class: ContentionClass,
    pub pairs: u64,
    /// Share of the traced waits.
    pub wait_share: f64,
}

/// What one critical-section site was sampled touching.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SectionEvidence {
    /// The lock call, "function (file:line)".
    pub section: String,
    pub threads: usize,
    /// Traced sections, and those with a sampled access.
    pub sections: u64,
    pub sampled_sections: u64,
    /// Sampled accesses to shared memory (pages more than one thread was
    /// sampled touching), reads and writes; and to private memory (pages
    /// of one thread, read-only memory, code pointers).
    pub reads: u64,
    pub writes: u64,
    pub private: u64,
    /// Of these, accesses sampled outside every traced section at an
    /// instruction seen only inside this lock's sections (counted in
    /// reads, writes and private; no part of the confidence).
    pub inferred: u64,
    /// The shared words touched (most accessed first, at most 8), as
    /// "symbol+offset", "heap block from file:line +offset" or an
    /// address; and how many shared words and lines in all.
    pub shared_words: Vec<String>,
    pub shared_word_count: usize,
    pub shared_lines: usize,
}

/// One critical-section site: the lock call and the release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SectionEntry {
    /// The lock call.
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: String,
    /// The unlock (or condvar wait) that ended the sections, as
    /// "file:line" (or module+offset).
    pub released_at: Option<String>,
    /// Sections traced here, their total and longest hold.
    pub count: u64,
    pub hold_ns: u64,
    pub hold_max_ns: u64,
    /// The waits of other threads that releases here ended (each
    /// waiter's whole wait, from the futex wakes): the delay these
    /// sections caused. A section seen only through its wakes (no lock
    /// uprobe traced it) has `count` 0, and `function`, `file` and `line`
    /// are those of its release.
    pub delay_caused_ns: u64,
}

/// How the lock uprobes ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LockTracing {
    /// "full" or "sampled".
    pub mode: TraceMode,
    /// The object whose lock functions were probed.
    pub library: String,
    /// Fraction of the session the hot lock probes were all attached
    /// (1: every call traced).
    pub traced_fraction: f64,
    /// Claimed relative error of the estimated acquisitions (0.15: ±15%),
    /// null when every call was counted.
    pub acquisitions_error: Option<f64>,
    pub windows: u64,
    /// Functions probed, and those attached all the time (cold ones).
    pub functions: Vec<String>,
    pub always_traced: Vec<String>,
    /// Critical sections lost (ring full); unlocks of locks not seen
    /// taken; locks taken beyond the per-thread table.
    pub sections_lost: u64,
    pub unmatched_unlocks: u64,
    pub held_overflow: u64,
}

impl LockTracing {
    /// Whether acquisitions are scaled estimates.
    pub fn estimates(&self) -> bool {
        self.mode.estimates(self.traced_fraction)
    }

    /// Whether the estimated acquisitions were too rough to show (see
    /// [`crate::kernel::calls::MAX_ACQUISITIONS_ERROR`]).
    pub fn too_rough(&self) -> bool {
        self.acquisitions_error
            .is_some_and(|e| e > crate::kernel::calls::MAX_ACQUISITIONS_ERROR)
    }
}

/// How futex waits were traced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LockContention {
    /// `sched` (each wait seen as the sleep it is, from the scheduler's
    /// raw tracepoints) or `syscalls` (the futex syscall tracepoints).
    pub hooks: String,
    /// The largest stride the governor used: each wait traced with
    /// probability 1/stride and counted stride times (1: every wait was
    /// traced and the counts are exact).
    pub stride_max: u64,
    /// The stride at the end.
    pub stride: u64,
    /// Waits traced, and left out by the stride (sched hooks only).
    pub waits_traced: u64,
    pub waits_skipped: u64,
    /// Waits lost because another thread's wait held their slot.
    pub slot_collisions: u64,
    /// Traced waits given to the unnecessary-contention analysis as their
    /// holder's section (the owner woke the waiter and released the lock
    /// only then, while every wait was traced), and those the ring lost.
    pub waits_as_sections: u64,
    pub waits_as_sections_lost: u64,
    /// Gaps the hooks were detached for (their base cost, the runs on
    /// every context switch, above their share of the budget): the waits
    /// were seen in windows and scaled to the session (0: attached
    /// throughout).
    pub windows: u64,
    /// The share of the session the hooks were attached (1: throughout).
    pub attached_share: f64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerEntry {
    pub tid: u32,
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaiterSite {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: String,
    pub count: u64,
    pub wait_ns: u64,
    /// The call chain of a sampled wait here, innermost first, from this
    /// site outwards: "function (file:line)".
    pub chain: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderSite {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: String,
    /// Wakes from here: on the sched path, the wakes of a traced waiter
    /// (one per thread woken); on the syscall path, the wake calls.
    pub count: u64,
    /// Threads they woke.
    pub woken: u64,
    /// The waits these wakes ended (each waiter's whole wait): the delay
    /// the critical sections released here caused.
    pub delay_caused_ns: u64,
}

//! The false-sharing part: contended cache lines, what lies on them, the
//! code touching them, and the busy lines that were cleared.

use serde::{Deserialize, Serialize};

use super::CallerRef;

schema_enum! {
    /// How threads share a cache line.
    pub enum SharingKind {
        /// Threads write different words: the fix is layout.
        False = "false",
        /// A written word is used by several threads: the data is shared.
        True = "true",
        /// Both.
        Mixed = "mixed",
    }
}

schema_enum! {
    /// What kind of memory lies on a cache line.
    pub enum ObjectKind {
        /// A global variable (an ELF data symbol) or a mapped file's data.
        Global = "global",
        /// A heap block, or heap memory whose block is unknown.
        Heap = "heap",
        /// A thread's stack.
        Stack = "stack",
        /// Another mapping: a file, a named region, anonymous memory.
        Mapped = "mapped",
        /// A `MAP_SHARED` mapping several processes may map (a file,
        /// `/dev/shm/NAME`, `[anon shared]`): the line is keyed by the
        /// object and offset, not by one process's address.
        Shared = "shared",
        /// Not mapped when the report was made.
        Unknown = "unknown",
    }
}

schema_enum! {
    /// Why a busy cache line is not a false-sharing finding.
    pub enum DismissReason {
        /// Only one thread was sampled on it.
        OneThread = "one thread",
        /// No sampled access wrote it.
        NoWrites = "no sampled write",
        /// The kernel's line table did not hold it at the end.
        NotInTable = "not in the kernel's line table",
        /// Too few sampled invalidations.
        FewInvalidations = "few invalidations",
        /// Its writes invalidate too few of its accesses.
        ReadMostly = "read-mostly",
        /// Too small a share of the program's samples.
        LowCost = "little of the program's time",
        /// No written word is used by another thread, and no thread writes
        /// next to another's words.
        NothingWrittenShared = "nothing written is shared",
    }
}

/// A cache line several threads contend for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharingEntry {
    /// Address of the line, hex.
    pub line: String,
    /// "false" (threads write different words), "true" (a written word is
    /// used by several threads) or "mixed".
    pub kind: SharingKind,
    /// Sampled writes that invalidated another thread's copy (two-entry
    /// rule), and their share of the line's sampled accesses.
    pub invalidations: u64,
    pub invalidation_rate: f64,
    /// Sampled accesses to the line.
    pub samples: u64,
    /// The line's share of all the target's samples: about this much of
    /// the program's sampled time is spent on it. Counts every sample of
    /// the instructions that access the line (in the share of their placed
    /// samples that hit it), also those whose address could not be
    /// computed.
    pub cost_share: f64,
    /// The samples behind `cost_share`.
    pub cost_samples: u64,
    /// The speedup of the threads' work predicted if the line were fixed;
    /// null when there are too few samples around its accesses to tell.
    pub predicted_gain: Option<PredictedGain>,
    pub threads: Vec<u32>,
    /// The threads by process, when some are not the main process's
    /// (several processes traced); absent otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<ProcessThreads>,
    pub object: SharedObject,
    /// Words (4 bytes) touched, by offset in the line.
    pub words: Vec<WordEntry>,
    /// Code touching the line, most accesses first.
    pub code: Vec<SharingCode>,
    /// Inter-thread dependences between consecutive sampled accesses.
    pub dependences: Dependences,
    pub advice: String,
}

/// Cheetah's assessment, by sampling: the accesses' samples in excess of
/// the neighbouring instructions' rate are the contention's time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredictedGain {
    /// Speedup range of the accessing threads' work (1.0: none).
    pub low: f64,
    pub high: f64,
    /// How it was estimated.
    pub basis: String,
}

/// The threads of one process on a line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessThreads {
    pub pid: u32,
    pub threads: Vec<u32>,
}

/// A busy line that is not a finding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DismissedLine {
    /// Address of the line, hex.
    pub line: String,
    /// What lies on it (as [`SharedObject::label`]) and its kind.
    pub object: String,
    pub object_kind: ObjectKind,
    /// Sampled accesses, and how many of them wrote.
    pub samples: u64,
    pub writes: u64,
    /// Sampled from two threads or more.
    pub shared: bool,
    /// "one thread", "no sampled write", "read-mostly", "few
    /// invalidations", "little of the program's time", "nothing written is
    /// shared" or "not in the kernel's line table".
    pub reason: DismissReason,
}

/// What lies on a shared line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharedObject {
    /// "global", "heap", "stack", "mapped", "shared" or "unknown".
    pub kind: ObjectKind,
    pub name: String,
    /// Offset of the line in the object (negative: the object starts
    /// inside the line).
    pub offset: i64,
    /// Size of the object, when known.
    pub size: Option<u64>,
    /// Where a heap object was allocated; null when not seen (allocated
    /// before tracing, or while the allocator was not traced).
    pub alloc_site: Option<CodeRef>,
    /// The C/C++/Rust type of the memory (`struct args`, `struct
    /// args[4]` for a block of four), from the debug info of a global or
    /// of the pointers the sampled code accessed it through; null when
    /// the debug info does not say.
    #[serde(rename = "type")]
    pub type_name: Option<String>,
}

impl SharedObject {
    /// The name, with `+N` when the line starts N bytes into the object
    /// (`g_counters+64`). An object that starts inside the line keeps its
    /// bare name: "demo.c:149-32" would read as a range of source lines, so
    /// renderers say that with [`SharedObject::starts_in_line`].
    pub fn label(&self) -> String {
        if self.offset > 0 {
            format!("{}+{}", self.name, self.offset)
        } else {
            self.name.clone()
        }
    }

    /// The byte of the line at which the object starts, when it starts
    /// inside the line.
    pub fn starts_in_line(&self) -> Option<u64> {
        (self.offset < 0).then_some(self.offset.unsigned_abs())
    }
}

/// A place in the source, at its innermost inlined function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeRef {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// The functions this code was inlined into, each at the line of the
    /// inlined call, the compiled function last; empty when not inlined.
    pub inlined_into: Vec<CallerRef>,
    /// The allocation wrapper this site called (passed over to name the
    /// site by its caller), if any.
    pub via: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WordEntry {
    pub offset: u32,
    pub reads: u64,
    pub writes: u64,
    pub threads: Vec<u32>,
    /// The variable's field at this word (`g_args[1].sum`), from the
    /// debug info of a global; null when unknown.
    pub field: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharingCode {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// The functions this line was inlined into (see
    /// [`CodeRef::inlined_into`]).
    pub inlined_into: Vec<CallerRef>,
    pub module: String,
    pub reads: u64,
    pub writes: u64,
    pub threads: Vec<u32>,
    /// Lowest byte offset in the line it touched.
    pub offset: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dependences {
    pub read_after_write: u64,
    pub write_after_write: u64,
    pub write_after_read: u64,
}

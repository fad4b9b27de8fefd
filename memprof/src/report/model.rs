//! The report: one model that the summary, the JSON file and the dashboard
//! all render. Field names are the versioned JSON schema
//! ([`SCHEMA`]); later analyses fill `false_sharing`, `allocator`, `locks`.

use serde::Serialize;

use crate::features::cpu::profile::HotFunction;

/// Version tag of the JSON form. Bump on incompatible changes.
pub const SCHEMA: &str = "memprof-ebpf/1";

/// How a family of uprobes (the allocator's, the locks') ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceMode {
    /// Not traced.
    #[default]
    Off,
    /// Every call traced.
    Full,
    /// Traced in windows within the overhead budget: counts are scaled.
    Sampled,
    /// Benchmarks only: probes that do nothing, at the places of `full`.
    Floor,
}

impl TraceMode {
    pub fn name(self) -> &'static str {
        match self {
            TraceMode::Off => "off",
            TraceMode::Full => "full",
            TraceMode::Sampled => "sampled",
            TraceMode::Floor => "floor",
        }
    }

    /// Whether counts traced in this mode over `fraction` of the session
    /// are estimates (scaled up from the traced windows).
    pub fn estimates(self, fraction: f64) -> bool {
        self == TraceMode::Sampled && fraction < FULLY_TRACED
    }
}

impl std::fmt::Display for TraceMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A traced fraction at least this high is the whole session (a window
/// controller's own timing leaves a sliver untraced).
pub const FULLY_TRACED: f64 = 0.999;

/// Where the data addresses of samples came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AddressMode {
    /// Computed from the sampled registers and the decoded instruction
    /// (timer sampling, no PMU).
    #[default]
    Decoded,
    /// Given by the CPU (PEBS, IBS).
    Precise,
}

impl std::fmt::Display for AddressMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AddressMode::Decoded => "decoded",
            AddressMode::Precise => "precise",
        })
    }
}

/// An enum whose JSON form is one fixed string per variant: `name()` is
/// that string (also the `Display` form, which honours width and
/// alignment), `from_name` reads it back, `ALL` lists the variants.
macro_rules! schema_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $text:tt,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant,)+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The schema's name for the value.
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }

            /// The value the schema calls `name`, if there is one.
            pub fn from_name(name: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|v| v.name() == name)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.name())
            }
        }
    };
}

schema_enum! {
    /// The event that drove sampling, and so gave the data addresses.
    pub enum SampleSource {
        /// Software timer (works everywhere, including VMs without a PMU).
        CpuClock = "cpu-clock",
        /// Hardware cycle counter.
        Cycles = "cycles",
        /// Intel's precise memory events.
        Pebs = "pebs",
        /// AMD's instruction-based sampling.
        Ibs = "ibs",
    }
}

impl SampleSource {
    /// The source of a session's data addresses: the precise memory events
    /// named `precise` ("pebs", "ibs") when they were used, else the
    /// sampling event.
    pub fn of(sampling: crate::kernel::loader::SamplingSource, precise: Option<&str>) -> Self {
        precise
            .and_then(Self::from_name)
            .unwrap_or_else(|| sampling.into())
    }
}

impl From<crate::kernel::loader::SamplingSource> for SampleSource {
    fn from(source: crate::kernel::loader::SamplingSource) -> Self {
        use crate::kernel::loader::SamplingSource;
        match source {
            SamplingSource::Cycles => SampleSource::Cycles,
            SamplingSource::CpuClock => SampleSource::CpuClock,
        }
    }
}

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

schema_enum! {
    /// An allocator entry point.
    pub enum AllocOp {
        Malloc = "malloc",
        Calloc = "calloc",
        Realloc = "realloc",
        Reallocarray = "reallocarray",
        Free = "free",
        PosixMemalign = "posix_memalign",
        AlignedAlloc = "aligned_alloc",
        Memalign = "memalign",
        Valloc = "valloc",
        Pvalloc = "pvalloc",
        /// C++ `operator new(size_t)`.
        New = "operator new",
        NewArray = "operator new[]",
        Delete = "operator delete",
        DeleteArray = "operator delete[]",
        /// A code the profiler does not know.
        Unknown = "unknown",
    }
}

impl AllocOp {
    /// The operation of an `alloc_op` code.
    pub fn from_code(op: u32) -> Self {
        use memprof_common::alloc_op;
        match op {
            alloc_op::MALLOC => AllocOp::Malloc,
            alloc_op::CALLOC => AllocOp::Calloc,
            alloc_op::REALLOC => AllocOp::Realloc,
            alloc_op::REALLOCARRAY => AllocOp::Reallocarray,
            alloc_op::FREE => AllocOp::Free,
            alloc_op::POSIX_MEMALIGN => AllocOp::PosixMemalign,
            alloc_op::ALIGNED_ALLOC => AllocOp::AlignedAlloc,
            alloc_op::MEMALIGN => AllocOp::Memalign,
            alloc_op::VALLOC => AllocOp::Valloc,
            alloc_op::PVALLOC => AllocOp::Pvalloc,
            alloc_op::NEW => AllocOp::New,
            alloc_op::NEW_ARRAY => AllocOp::NewArray,
            alloc_op::DELETE => AllocOp::Delete,
            alloc_op::DELETE_ARRAY => AllocOp::DeleteArray,
            _ => AllocOp::Unknown,
        }
    }
}

schema_enum! {
    /// Size class of an allocator call.
    pub enum SizeClass {
        Small = "small",
        Large = "large",
        /// A free of a block allocated before tracing, by an allocator
        /// without a readable block header.
        Unknown = "unknown",
    }
}

schema_enum! {
    /// Whether the address an allocation handed out was handed out before.
    pub enum BlockOrigin {
        /// Never handed out before.
        New = "new",
        Reused = "reused",
    }
}

schema_enum! {
    /// How many threads of the target were alive during a call.
    pub enum ThreadPhase {
        /// One.
        Serial = "serial",
        /// Several.
        Parallel = "parallel",
    }
}

schema_enum! {
    /// A syscall the allocator makes to get or give back memory.
    pub enum Syscall {
        Mmap = "mmap",
        Munmap = "munmap",
        Mremap = "mremap",
        Madvise = "madvise",
        Brk = "brk",
        Mprotect = "mprotect",
        /// A code the profiler does not know.
        Unknown = "?",
    }
}

impl Syscall {
    /// The syscall of a `memprof_common::syscall` code.
    pub fn from_code(nr: u32) -> Self {
        use memprof_common::syscall;
        match nr {
            syscall::MMAP => Syscall::Mmap,
            syscall::MUNMAP => Syscall::Munmap,
            syscall::MREMAP => Syscall::Mremap,
            syscall::MADVISE => Syscall::Madvise,
            syscall::BRK => Syscall::Brk,
            syscall::MPROTECT => Syscall::Mprotect,
            _ => Syscall::Unknown,
        }
    }
}

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

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub schema: &'static str,
    pub target: Target,
    /// Seconds traced.
    pub duration_s: f64,
    pub sampling: Sampling,
    pub hot_functions: Vec<HotFunctionEntry>,
    pub threads: Vec<ThreadEntry>,
    /// Cache lines threads contend for, most costly first.
    pub false_sharing: Vec<SharingEntry>,
    /// The most-sampled lines that are not in `false_sharing`, and why:
    /// what the detector looked at and cleared.
    pub false_sharing_dismissed: Vec<DismissedLine>,
    /// The allocator profile (`mode: "off"` when not traced).
    pub allocator: AllocatorReport,
    /// Contended locks, most wait time first, then locks the uprobes saw
    /// taken without contention.
    pub locks: Vec<LockEntry>,
    /// How lock calls were traced (null when the lock uprobes are off or
    /// no pthread library was found).
    pub lock_tracing: Option<LockTracing>,
    /// The profiler's own cost.
    pub loader: Loader,
    /// Things the reader should know (target exited, events lost, ...).
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub pid: u32,
    pub command: String,
    /// Threads seen during the session (present at attach or created later).
    pub threads_seen: usize,
    /// Whether the target exited before the session ended.
    pub exited: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Sampling {
    /// The sampling event ("cpu-clock", "cycles"), or the precise memory
    /// events ("pebs", "ibs") when they gave the data addresses.
    pub source: SampleSource,
    pub frequency_hz: u64,
    /// Samples of the target's threads received.
    pub samples: u64,
    /// Samples lost (ring buffer full or busy, or dropped in userspace).
    pub lost: u64,
    /// Thread creation/exit/exec events lost the same way.
    pub lost_thread_events: u64,
    /// Samples whose user stack was lost to a full stack map; they count
    /// for their own function but not for its callers' total time.
    pub stack_errors: u64,
    /// Samples taken while the thread was in the kernel.
    pub kernel_samples: u64,
    /// Where the data addresses of samples came from, and how many did.
    pub addresses: AddressSampling,
}

/// Data addresses of samples (the false-sharing input).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AddressSampling {
    /// "decoded" or "precise" (see [`AddressMode`]).
    pub mode: AddressMode,
    /// Samples of the target's threads in user mode.
    pub user_samples: u64,
    /// Of those: an address was computed.
    pub with_address: u64,
    /// The instruction had no usable memory operand (arithmetic, branch,
    /// TLS, ...).
    pub no_operand: u64,
    /// The instruction was not decoded yet (its first samples).
    pub not_decoded: u64,
    /// `with_address / user_samples`.
    pub address_share: f64,
    /// Distinct instructions decoded, and how many access memory.
    pub instructions_decoded: usize,
    pub instructions_with_operand: usize,
    /// Cache lines in the kernel's table at the end, and lines the table
    /// dropped (least recently sampled) to make room.
    pub lines_tracked: u64,
    pub lines_evicted: u64,
}

/// A cache line several threads contend for.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
    /// the program's sampled time is spent on it.
    pub cost_share: f64,
    pub threads: Vec<u32>,
    pub object: SharedObject,
    /// Words (4 bytes) touched, by offset in the line.
    pub words: Vec<WordEntry>,
    /// Code touching the line, most accesses first.
    pub code: Vec<SharingCode>,
    /// Inter-thread dependences between consecutive sampled accesses.
    pub dependences: Dependences,
    pub advice: String,
}

/// A busy line that is not a finding.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SharedObject {
    /// "global", "heap", "stack", "mapped" or "unknown".
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CodeRef {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WordEntry {
    pub offset: u32,
    pub reads: u64,
    pub writes: u64,
    pub threads: Vec<u32>,
    /// The variable's field at this word (`g_args[1].sum`), from the
    /// debug info of a global; null when unknown.
    pub field: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SharingCode {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: String,
    pub reads: u64,
    pub writes: u64,
    pub threads: Vec<u32>,
    /// Lowest byte offset in the line it touched.
    pub offset: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Dependences {
    pub read_after_write: u64,
    pub write_after_write: u64,
    pub write_after_read: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HotFunctionEntry {
    pub function: String,
    /// Source file of the hottest line in the function, when known.
    pub file: Option<String>,
    /// The source line in the function that collected the most samples.
    pub line: Option<u32>,
    pub module: String,
    pub samples: u64,
    /// Fraction of all samples (0..1).
    pub share: f64,
    /// Samples with the function anywhere on the stack (needs frame
    /// pointers in the target for callers to be seen).
    pub total_samples: u64,
    /// `total_samples` as a fraction of all samples.
    pub total_share: f64,
}

impl HotFunctionEntry {
    /// `file.c:12`, or `(module)` without debug info, for display.
    pub fn source_label(&self) -> String {
        source_label(self.file.as_deref(), self.line, &self.module)
    }
}

/// `file.c:12`, `file.c`, or `(module)`.
pub fn source_label(file: Option<&str>, line: Option<u32>, module: &str) -> String {
    use crate::process::maps::short_name;
    match (file, line) {
        (Some(file), Some(line)) => format!("{}:{line}", short_name(file)),
        (Some(file), None) => short_name(file).to_string(),
        _ => format!("({module})"),
    }
}

impl From<HotFunction> for HotFunctionEntry {
    fn from(h: HotFunction) -> Self {
        Self {
            function: h.frame.function,
            file: h.frame.file,
            line: h.frame.line,
            module: h.frame.module,
            samples: h.samples,
            share: h.share,
            total_samples: h.total,
            total_share: h.total_share,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ThreadEntry {
    pub tid: u32,
    pub name: String,
    pub samples: u64,
    /// The thread that created it, if that happened while we traced.
    pub created_by: Option<u32>,
    pub exited: bool,
}

/// What the allocator profiler found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AllocatorReport {
    /// "glibc 2.36", "jemalloc 5.3.0", ...; null when none was found or
    /// allocator tracing was off.
    pub library: Option<String>,
    /// The object file whose `malloc` was probed.
    pub path: Option<String>,
    /// "full", "sampled" or "off".
    pub mode: TraceMode,
    /// Fraction of the session the allocator probes were attached (1 in
    /// full mode). Counts are scaled by its inverse when `sampled`.
    pub traced_fraction: f64,
    /// Counts in `ops`, `syscalls` (inside the allocator) and `sites` are
    /// estimates scaled from the traced windows.
    pub sampled: bool,
    /// How "large" was decided: "glibc mmapped chunk" or "> N bytes".
    pub large_rule: String,
    /// Allocator calls traced (unscaled).
    pub calls_traced: u64,
    /// Sampled mode: operations called so rarely that their probes stay
    /// attached all the time (their counts are exact, not scaled).
    pub always_traced: Vec<AllocOp>,
    /// Allocator events lost (ring buffer full), unscaled.
    pub lost: u64,
    /// Latency per split, busiest first.
    pub ops: Vec<OpStats>,
    pub syscalls: Vec<SyscallStats>,
    /// Memory composition at peak (full mode only: it needs every call).
    pub memory: Option<MemoryReport>,
    /// Top allocation sites: by bytes, by count and by live bytes (each
    /// site once).
    pub sites: Vec<SiteEntry>,
    /// Kernel-side cost per thread: page faults and `mmap_lock` waits.
    pub kernel: Vec<KernelThreadEntry>,
}

/// Latency of one split of one operation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpStats {
    /// "malloc", "free", "calloc", "realloc", "operator new", ...
    pub op: AllocOp,
    /// "small", "large", or "unknown" (a free of a block allocated before
    /// tracing, by an allocator without a readable block header).
    pub class: SizeClass,
    /// "new" (address never handed out before) or "reused"; for frees, the
    /// origin of the block freed; null when unknown.
    pub origin: Option<BlockOrigin>,
    /// "serial" (one live thread) or "parallel".
    pub phase: ThreadPhase,
    /// Calls (scaled when sampled).
    pub count: u64,
    /// Calls traced (unscaled).
    pub traced: u64,
    pub mean_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    /// Latency histogram: (upper bound in ns, calls traced), log2 buckets.
    pub histogram: Vec<(u64, u64)>,
}

/// One syscall, split by the allocator operation it ran inside.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SyscallStats {
    /// "mmap", "munmap", "mremap", "madvise", "brk", "mprotect".
    pub name: Syscall,
    /// The allocator operation in progress on that thread, or null
    /// (outside the allocator, or while the probes were detached: see
    /// `traced`).
    pub inside: Option<AllocOp>,
    /// false for calls made while the allocator probes were detached
    /// (sampled mode): where they came from is unknown.
    pub traced: bool,
    pub count: u64,
    pub total_ns: u64,
    /// Bytes mapped, unmapped or advised (length argument).
    pub bytes: u64,
}

/// Where the allocator's memory went, at the moment of peak mapped memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MemoryReport {
    /// Highest live requested bytes at any moment.
    pub requested_peak: u64,
    /// Live requested bytes at the peak.
    pub requested_at_peak: u64,
    /// Live usable bytes (block sizes) at the peak.
    pub usable_peak: u64,
    pub internal_fragmentation: u64,
    pub blowup: u64,
    pub external_fragmentation: u64,
    /// Memory the allocator had from the kernel (mmap, brk, mremap) at the
    /// peak, counting only what was mapped while traced.
    pub mapped_peak: u64,
    /// Live requested bytes when tracing ended.
    pub requested_end: u64,
    /// Whether usable sizes are real (glibc block headers) or equal to the
    /// requested sizes (allocators that hide them).
    pub usable_known: bool,
}

/// One allocation site (the caller of the allocation function).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SiteEntry {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: String,
    /// Allocations (scaled when sampled).
    pub count: u64,
    /// Bytes requested (scaled when sampled).
    pub bytes: u64,
    /// Bytes allocated here and not freed when tracing ended (leak
    /// candidates; unscaled).
    pub live_bytes: u64,
    pub live_blocks: u64,
}

impl SiteEntry {
    /// `file.c:12`, or `(module)` without debug info, for display.
    pub fn source_label(&self) -> String {
        source_label(self.file.as_deref(), self.line, &self.module)
    }
}

/// One lock (or futex word, or kind of kernel lock) threads waited for.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LockEntry {
    /// Address of the (first) futex word, hex; for kernel locks, "kernel".
    pub address: String,
    /// Global symbol, heap block ("heap block from file:line"), kernel
    /// lock kind, or null.
    pub name: Option<String>,
    /// "mutex", "rwlock", "futex" or "kernel" (lock contention), or
    /// "condvar", "barrier", "join" or "semaphore" (waits for an event).
    pub kind: LockKind,
    /// Acquisitions (needs the lock uprobes: null when not traced; an
    /// estimate scaled by the traced time in sampled mode).
    pub acquisitions: Option<u64>,
    /// Contentions per acquisition (null without acquisitions).
    pub contention_rate: Option<f64>,
    /// Try and timed lock calls that did not get the lock (scaled).
    pub failed_attempts: Option<u64>,
    /// Time the lock calls took to return with the lock (uprobes).
    pub acquire_p99_ns: Option<u64>,
    pub acquire_max_ns: Option<u64>,
    /// Waits: futex waits (blocking or not) or kernel lock waits.
    pub contentions: u64,
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
}

/// One critical-section site: the lock call and the release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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
}

/// How the lock uprobes ran.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LockTracing {
    /// "full" or "sampled".
    pub mode: TraceMode,
    /// The object whose lock functions were probed.
    pub library: String,
    /// Fraction of the session the hot lock probes were attached.
    pub traced_fraction: f64,
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
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwnerEntry {
    pub tid: u32,
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WaiterSite {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: String,
    pub count: u64,
    pub wait_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HolderSite {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: String,
    /// Wake calls from here.
    pub count: u64,
    /// Threads they woke.
    pub woken: u64,
}

/// What one thread suffered in the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KernelThreadEntry {
    pub tid: u32,
    pub page_faults: u64,
    /// Page faults taken inside an allocator call (traced windows only).
    pub page_faults_in_allocator: u64,
    /// `mmap_lock` acquisitions that had to wait (were not immediate).
    pub mmap_lock_waits: u64,
    pub mmap_lock_wait_ns: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Loader {
    /// CPU seconds the profiler itself used (user + system).
    pub cpu_s: f64,
    /// `cpu_s / duration_s`: the share of one core the profiler used.
    pub cpu_share: f64,
    /// Peak resident memory of the profiler, in bytes.
    pub peak_rss_bytes: u64,
}

impl Loader {
    /// Reads the profiler's own resource usage so far.
    pub fn measure(duration_s: f64) -> Self {
        // SAFETY: an all-zero rusage is a valid value for getrusage to fill.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `usage` is a valid, writable rusage.
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
            return Self::default();
        }
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        let cpu_s = secs(usage.ru_utime) + secs(usage.ru_stime);
        Self {
            cpu_s,
            cpu_share: if duration_s > 0.0 {
                cpu_s / duration_s
            } else {
                0.0
            },
            peak_rss_bytes: usage.ru_maxrss.max(0) as u64 * 1024,
        }
    }
}

impl Report {
    /// Serializes to pretty JSON.
    pub fn to_json(&self) -> String {
        // Serializing plain structs of strings and numbers cannot fail; a
        // non-finite float becomes null.
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    /// The fixtures the dashboard's tests take from here.
    pub(crate) use crate::report::fixtures::{
        false_sharing_entry, fixture_code, fixture_word, sample_report,
    };

    #[test]
    fn modes_serialize_as_the_schema_names_them() {
        fn json<T: Serialize>(v: &T) -> String {
            serde_json::to_string(v).unwrap()
        }
        assert_eq!(json(&TraceMode::Off), "\"off\"");
        assert_eq!(json(&TraceMode::Full), "\"full\"");
        assert_eq!(json(&TraceMode::Sampled), "\"sampled\"");
        assert_eq!(json(&TraceMode::Floor), "\"floor\"");
        assert_eq!(json(&AddressMode::Decoded), "\"decoded\"");
        assert_eq!(json(&AddressMode::Precise), "\"precise\"");
        for m in [
            TraceMode::Off,
            TraceMode::Full,
            TraceMode::Sampled,
            TraceMode::Floor,
        ] {
            assert_eq!(json(&m), format!("\"{m}\""), "Display matches the JSON");
        }
    }

    /// Each value serializes as its name, reads back from it, and shows
    /// as it (with the width and alignment asked for).
    fn assert_named<T>(all: &[T], from_name: fn(&str) -> Option<T>)
    where
        T: Serialize + std::fmt::Display + std::fmt::Debug + Copy + PartialEq,
    {
        for &v in all {
            let name = v.to_string();
            assert_eq!(serde_json::to_string(&v).unwrap(), format!("\"{name}\""));
            assert_eq!(from_name(&name), Some(v));
            assert_eq!(format!("{v:>20}"), format!("{name:>20}"));
        }
        assert_eq!(from_name("no such name"), None);
    }

    #[test]
    fn schema_enums_serialize_as_their_names() {
        assert_named(SampleSource::ALL, SampleSource::from_name);
        assert_named(SharingKind::ALL, SharingKind::from_name);
        assert_named(ObjectKind::ALL, ObjectKind::from_name);
        assert_named(DismissReason::ALL, DismissReason::from_name);
        assert_named(AllocOp::ALL, AllocOp::from_name);
        assert_named(SizeClass::ALL, SizeClass::from_name);
        assert_named(BlockOrigin::ALL, BlockOrigin::from_name);
        assert_named(ThreadPhase::ALL, ThreadPhase::from_name);
        assert_named(Syscall::ALL, Syscall::from_name);
        assert_named(LockKind::ALL, LockKind::from_name);
        assert_eq!(
            serde_json::to_string(&Some(BlockOrigin::Reused)).unwrap(),
            "\"reused\""
        );
        assert_eq!(serde_json::to_string(&None::<BlockOrigin>).unwrap(), "null");
    }

    #[test]
    fn the_sample_source_is_the_precise_events_when_they_gave_addresses() {
        use crate::kernel::loader::SamplingSource;
        for s in [SamplingSource::CpuClock, SamplingSource::Cycles] {
            assert_eq!(SampleSource::of(s, None).name(), s.name());
            assert_eq!(SampleSource::of(s, Some("pebs")), SampleSource::Pebs);
            assert_eq!(SampleSource::of(s, Some("ibs")), SampleSource::Ibs);
        }
    }

    #[test]
    fn only_lock_kinds_are_contention() {
        let contention: Vec<&str> = LockKind::ALL
            .iter()
            .filter(|k| k.is_contention())
            .map(|k| k.name())
            .collect();
        assert_eq!(contention, ["mutex", "rwlock", "futex", "kernel"]);
        assert_eq!(LockKind::default(), LockKind::Futex);
    }

    #[test]
    fn only_a_sampled_session_traced_in_part_gives_estimates() {
        assert!(TraceMode::Sampled.estimates(0.5));
        assert!(!TraceMode::Sampled.estimates(FULLY_TRACED));
        assert!(!TraceMode::Full.estimates(0.5));
        assert!(!TraceMode::Off.estimates(0.0));
    }

    #[test]
    fn json_has_the_promised_top_level_keys() {
        let v: serde_json::Value = serde_json::from_str(&sample_report().to_json()).unwrap();
        assert_eq!(v["schema"], "memprof-ebpf/1");
        for key in [
            "target",
            "duration_s",
            "sampling",
            "hot_functions",
            "false_sharing",
            "allocator",
            "locks",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert_eq!(v["target"]["pid"], 42);
        assert_eq!(v["target"]["command"], "./work 2");
        for key in ["source", "frequency_hz", "samples", "lost"] {
            assert!(v["sampling"].get(key).is_some(), "missing sampling.{key}");
        }
        let hot = &v["hot_functions"][0];
        for key in ["function", "file", "line", "module", "samples"] {
            assert!(hot.get(key).is_some(), "missing hot_functions[].{key}");
        }
        assert!(v["allocator"].is_object());
        assert!(v["false_sharing"].is_array() && v["locks"].is_array());
    }

    #[test]
    fn source_labels() {
        let mut h = sample_report().hot_functions[0].clone();
        h.file = None;
        h.line = None;
        assert_eq!(h.source_label(), "(work)");
        h.file = Some("/src/app/main.c".into());
        assert_eq!(h.source_label(), "main.c");
        h.line = Some(42);
        assert_eq!(h.source_label(), "main.c:42");
    }

    #[test]
    fn loader_measures_itself() {
        let l = Loader::measure(1.0);
        assert!(l.peak_rss_bytes > 0);
        assert!(l.cpu_s >= 0.0);
        assert_eq!(Loader::measure(0.0).cpu_share, 0.0);
    }

    /// The JSON form of the fully filled fixture report, byte for byte as
    /// the schema has it.
    #[test]
    fn json_of_the_full_report_is_unchanged() {
        let json = crate::report::fixtures::full_report().to_json();
        assert_eq!(json, include_str!("testdata/report.json"));
    }
}

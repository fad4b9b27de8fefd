//! Types shared by the kernel programs (`memprof-ebpf`) and the userspace
//! loader (`memprof`).
//!
//! Everything here is `#[repr(C)]` with fixed-size integer fields only, so
//! both sides agree on the layout byte for byte; sizes are checked at compile
//! time. Map names, program names and capacities live here too, so the two
//! sides never spell them differently.
#![no_std]

pub mod locks;
pub mod sharing;

/// Every program we load has a name starting with this prefix, so leftover
/// programs are easy to spot with `bpftool prog show`.
pub const PROGRAM_PREFIX: &str = "mp_";

/// Program names (the eBPF function names; the kernel keeps 15 bytes).
pub mod programs {
    /// `perf_event` program on `cpu-clock` (or hardware cycles), one per CPU.
    pub const CPU_SAMPLE: &str = "mp_cpu_sample";
    /// `perf_event` program on precise memory events (PEBS, IBS).
    pub const MEM_SAMPLE: &str = "mp_mem_sample";
    /// `task:task_newtask`: a thread of the target was created.
    pub const TASK_NEW: &str = "mp_task_new";
    /// `sched:sched_process_exit`: a thread of the target exited.
    pub const TASK_EXIT: &str = "mp_task_exit";
    /// `sched:sched_process_exec`: the target called `execve`.
    pub const TASK_EXEC: &str = "mp_task_exec";

    /// uprobe at an allocator entry point; the operation is the attach
    /// cookie ([`crate::alloc_op`]).
    pub const ALLOC_ENTER: &str = "mp_alloc_enter";
    /// uretprobe at the same entry points.
    pub const ALLOC_EXIT: &str = "mp_alloc_exit";
    /// Programs that do nothing, attached like the two above to measure
    /// the cost of the traps alone (`--alloc-mode floor`, for benchmarks).
    pub const ALLOC_FLOOR_ENTER: &str = "mp_alloc_floor";
    pub const ALLOC_FLOOR_EXIT: &str = "mp_alloc_flret";
    /// Syscall tracepoints (`syscalls:sys_{enter,exit}_NAME`), in
    /// [`crate::syscall`] order.
    pub const SYSCALL_ENTER: [&str; 6] = [
        "mp_sc_mmap_in",
        "mp_sc_unmap_in",
        "mp_sc_remap_in",
        "mp_sc_madv_in",
        "mp_sc_brk_in",
        "mp_sc_mprot_in",
    ];
    pub const SYSCALL_EXIT: [&str; 6] = [
        "mp_sc_mmap_out",
        "mp_sc_unmap_out",
        "mp_sc_remap_out",
        "mp_sc_madv_out",
        "mp_sc_brk_out",
        "mp_sc_mprot_out",
    ];
    /// `exceptions:page_fault_user`.
    pub const PAGE_FAULT: &str = "mp_page_fault";
    /// `mmap_lock:mmap_lock_start_locking` / `mmap_lock_acquire_returned`.
    pub const MMAP_LOCK_START: &str = "mp_mmlock_start";
    pub const MMAP_LOCK_DONE: &str = "mp_mmlock_done";

    /// `syscalls:sys_{enter,exit}_futex`, `_futex_wait`, `_futex_wake`.
    pub const FUTEX_ENTER: &str = "mp_futex_in";
    pub const FUTEX_EXIT: &str = "mp_futex_out";
    pub const FUTEX_WAIT_ENTER: &str = "mp_futexw_in";
    pub const FUTEX_WAKE_ENTER: &str = "mp_futexk_in";
    pub const FUTEX2_EXIT: &str = "mp_futex2_out";
    /// `lock:contention_begin` / `contention_end` (kernel locks).
    pub const KLOCK_BEGIN: &str = "mp_klock_begin";
    pub const KLOCK_END: &str = "mp_klock_end";

    /// uprobe at a lock call's entry and uretprobe at its return
    /// (lock and condvar-wait functions; [`crate::locks::lock_op`] cookie).
    pub const LOCK_ENTER: &str = "mp_lock_enter";
    pub const LOCK_EXIT: &str = "mp_lock_exit";
    /// uprobe at an unlock's entry.
    pub const UNLOCK: &str = "mp_unlock";

    /// All of them, for checks that nothing is left loaded.
    pub const ALL: [&str; 34] = [
        CPU_SAMPLE,
        MEM_SAMPLE,
        TASK_NEW,
        TASK_EXIT,
        TASK_EXEC,
        ALLOC_ENTER,
        ALLOC_EXIT,
        ALLOC_FLOOR_ENTER,
        ALLOC_FLOOR_EXIT,
        SYSCALL_ENTER[0],
        SYSCALL_ENTER[1],
        SYSCALL_ENTER[2],
        SYSCALL_ENTER[3],
        SYSCALL_ENTER[4],
        SYSCALL_ENTER[5],
        SYSCALL_EXIT[0],
        SYSCALL_EXIT[1],
        SYSCALL_EXIT[2],
        SYSCALL_EXIT[3],
        SYSCALL_EXIT[4],
        SYSCALL_EXIT[5],
        PAGE_FAULT,
        MMAP_LOCK_START,
        MMAP_LOCK_DONE,
        FUTEX_ENTER,
        FUTEX_EXIT,
        FUTEX_WAIT_ENTER,
        FUTEX_WAKE_ENTER,
        FUTEX2_EXIT,
        KLOCK_BEGIN,
        KLOCK_END,
        LOCK_ENTER,
        LOCK_EXIT,
        UNLOCK,
    ];
}

/// Map names.
pub mod maps {
    /// Ring buffer of [`crate::SampleEvent`].
    pub const SAMPLES: &str = "SAMPLES";
    /// Ring buffer of [`crate::TaskEvent`].
    pub const TASK_EVENTS: &str = "TASK_EVENTS";
    /// `BPF_MAP_TYPE_STACK_TRACE` of user stacks.
    pub const STACKS: &str = "STACKS";
    /// Per-CPU `u64` counters indexed by [`crate::counter`].
    pub const COUNTERS: &str = "COUNTERS";
    /// Ring buffer of [`crate::AllocEvent`] and [`crate::SyscallEvent`]
    /// (one ring, so a block's allocation is always read before its free).
    pub const ALLOC_EVENTS: &str = "ALLOC_EVENTS";
    /// `u64` array: [`crate::ALLOC_CTL_GENERATION`] (bumped by the loader
    /// per window).
    pub const ALLOC_CTL: &str = "ALLOC_CTL";
    /// Per-thread kernel-side statistics ([`crate::KernelStats`]).
    pub const KERNEL_STATS: &str = "KERNEL_STATS";
    /// Ring buffer of [`crate::LockEvent`].
    pub const LOCK_EVENTS: &str = "LOCK_EVENTS";
    /// LRU hash: cache-line address → [`crate::sharing::LineState`].
    pub const LINES: &str = "LINES";
    /// LRU hash: cache-line address → [`crate::sharing::LineWords`].
    pub const WORDS: &str = "WORDS";
    /// `u32` array: `[0]` = 1 when precise memory events are attached.
    pub const SAMPLER_CTL: &str = "SAMPLER_CTL";
    /// Hash: instruction address → [`crate::sharing::AccessRecipe`],
    /// written by the loader as it decodes newly sampled instructions.
    pub const RECIPES: &str = "RECIPES";
    /// Ring buffer of [`crate::locks::HoldEvent`].
    pub const HOLD_EVENTS: &str = "HOLD_EVENTS";
    /// LRU hash: thread id → [`crate::locks::HeldLocks`], the locks each
    /// thread holds now.
    pub const HELD_LOCKS: &str = "HELD_LOCKS";
    /// `u64` array: [`crate::locks::LOCK_CTL_GENERATION`].
    pub const LOCK_CTL: &str = "LOCK_CTL";
}

/// Names of the load-time globals (`EbpfLoader::set_global`).
pub mod globals {
    /// `u32`: the thread-group id (process id) being traced.
    pub const TARGET_TGID: &str = "TARGET_TGID";
    /// `u32`: offset of `pid` in the `task:task_newtask` record.
    pub const NEWTASK_PID_OFFSET: &str = "NEWTASK_PID_OFFSET";
    /// `u32`: offset of `clone_flags` in the `task:task_newtask` record.
    pub const NEWTASK_FLAGS_OFFSET: &str = "NEWTASK_FLAGS_OFFSET";
    /// `u32`: 1 when the allocator keeps glibc's chunk header at `ptr - 8`
    /// (then the programs read it for the usable size and class).
    pub const ALLOC_GLIBC_HEADER: &str = "ALLOC_GLIBC_HEADER";
    /// `u32`: offset of the first argument in `syscalls:sys_enter_*`
    /// records (arguments follow, 8 bytes each).
    pub const SYSCALL_ARGS_OFFSET: &str = "SYSCALL_ARGS_OFFSET";
    /// `u32`: offset of `ret` in `syscalls:sys_exit_*` records.
    pub const SYSCALL_RET_OFFSET: &str = "SYSCALL_RET_OFFSET";
    /// `u32`: offsets of `lock_addr` and `flags` in `lock:contention_begin`.
    pub const KLOCK_ADDR_OFFSET: &str = "KLOCK_ADDR_OFFSET";
    pub const KLOCK_FLAGS_OFFSET: &str = "KLOCK_FLAGS_OFFSET";
}

/// Byte size of the sample ring buffer (a power of two, page multiple).
/// 4 MiB holds about 75k samples (48 bytes + 8 of header each): over 30 s
/// of the default rate on two CPUs if userspace stalls, and the loader
/// drains it ten times a second.
pub const SAMPLES_RING_BYTES: u32 = 4 << 20;
/// Samples are submitted without waking the loader (which drains on a timer,
/// see `DRAIN_INTERVAL_MS`) until this much data is waiting; then every
/// submit wakes it. This turns thousands of wake-ups a second, each
/// preempting a thread of the target, into about ten.
pub const SAMPLES_WAKEUP_BYTES: u64 = (SAMPLES_RING_BYTES / 4) as u64;
/// How often the loader drains the sample ring buffer without a wake-up.
pub const DRAIN_INTERVAL_MS: u64 = 100;

/// Byte size of the task-event ring buffer.
pub const TASK_RING_BYTES: u32 = 256 << 10;
/// Distinct user stacks kept in the stack-trace map (each takes about 1 KiB
/// of kernel memory). For samples in user code the sampled instruction is
/// left out of the stack (it is in the sample), so a stack is a call path,
/// not a call path per instruction, and few are needed.
pub const STACKS_CAPACITY: u32 = 8 * 1024;
/// Frames kept per stack (the kernel's `perf_event_max_stack` default).
pub const MAX_STACK_DEPTH: usize = 127;

/// Indices into the per-CPU [`maps::COUNTERS`] array.
pub mod counter {
    /// Samples of the target's threads seen by the sampler.
    pub const SAMPLES_SEEN: u32 = 0;
    /// Samples dropped because the sample ring buffer was full.
    pub const SAMPLES_LOST: u32 = 1;
    /// Task events dropped because their ring buffer was full.
    pub const TASK_EVENTS_LOST: u32 = 2;
    /// Samples whose user stack was lost to a full or colliding stack map
    /// (not those with no caller frames to walk).
    pub const STACK_ERRORS: u32 = 3;
    /// Allocator and syscall events dropped (ring buffer full).
    pub const ALLOC_EVENTS_LOST: u32 = 4;
    /// Allocator calls whose per-thread state could not be stored.
    pub const ALLOC_STATE_ERRORS: u32 = 5;
    /// Allocator calls seen at entry (whether or not their event made it),
    /// per operation: `ALLOC_OP_CALLS + op`.
    pub const ALLOC_OP_CALLS: u32 = 6;
    /// Lock events dropped (ring buffer full).
    pub const LOCK_EVENTS_LOST: u32 = ALLOC_OP_CALLS + crate::alloc_op::COUNT;
    /// User-mode samples of the target (those that could yield an address).
    pub const USER_SAMPLES: u32 = LOCK_EVENTS_LOST + 1;
    /// User samples whose instruction had no recipe yet (sent to the
    /// loader to decode).
    pub const NO_RECIPE: u32 = USER_SAMPLES + 1;
    /// User samples whose instruction has no usable memory operand.
    pub const NO_OPERAND: u32 = USER_SAMPLES + 2;
    /// User samples that yielded a data address.
    pub const ADDRESSES: u32 = USER_SAMPLES + 3;
    /// Lines and word tables created (minus those still in the maps at
    /// the end: evicted by the LRU).
    pub const LINES_NEW: u32 = USER_SAMPLES + 4;
    pub const WORDS_NEW: u32 = USER_SAMPLES + 5;
    /// Lines whose entry could not be created or found.
    pub const LINE_ERRORS: u32 = USER_SAMPLES + 6;
    /// Lock-function calls seen at entry, per operation:
    /// `LOCK_OP_CALLS + op` ([`crate::locks::lock_op`]).
    pub const LOCK_OP_CALLS: u32 = LINE_ERRORS + 1;
    /// Critical-section records dropped (ring buffer full).
    pub const HOLD_EVENTS_LOST: u32 = LOCK_OP_CALLS + crate::locks::lock_op::COUNT;
    /// Unlocks of a lock the thread was not seen taking (taken before the
    /// probes were attached, or by an untraced path).
    pub const UNMATCHED_UNLOCKS: u32 = HOLD_EVENTS_LOST + 1;
    /// Locks taken while the thread already held [`crate::locks::HELD_MAX`].
    pub const HELD_OVERFLOW: u32 = HOLD_EVENTS_LOST + 2;
    /// Lock calls whose per-thread state could not be stored.
    pub const LOCK_STATE_ERRORS: u32 = HOLD_EVENTS_LOST + 3;
    /// Number of counters.
    pub const COUNT: u32 = LOCK_STATE_ERRORS + 1;
}

/// Allocator operations, passed as the uprobe attach cookie.
pub mod alloc_op {
    pub const MALLOC: u32 = 0;
    pub const CALLOC: u32 = 1;
    pub const REALLOC: u32 = 2;
    pub const REALLOCARRAY: u32 = 3;
    pub const FREE: u32 = 4;
    pub const POSIX_MEMALIGN: u32 = 5;
    pub const ALIGNED_ALLOC: u32 = 6;
    pub const MEMALIGN: u32 = 7;
    pub const VALLOC: u32 = 8;
    pub const PVALLOC: u32 = 9;
    /// C++ `operator new(size_t)` / `new[]`, probed when the allocator
    /// defines them itself (they do not call `malloc` then).
    pub const NEW: u32 = 10;
    pub const NEW_ARRAY: u32 = 11;
    pub const DELETE: u32 = 12;
    pub const DELETE_ARRAY: u32 = 13;
    /// Number of operations.
    pub const COUNT: u32 = 14;

    /// The C symbol of each operation, indexed by its code.
    pub const SYMBOLS: [&str; COUNT as usize] = [
        "malloc",
        "calloc",
        "realloc",
        "reallocarray",
        "free",
        "posix_memalign",
        "aligned_alloc",
        "memalign",
        "valloc",
        "pvalloc",
        "_Znwm",
        "_Znam",
        "_ZdlPv",
        "_ZdaPv",
    ];

    /// Whether the operation gives a block back (its pointer is arg 0).
    pub const fn is_free(op: u32) -> bool {
        matches!(op, FREE | DELETE | DELETE_ARRAY)
    }
}

/// Syscalls the allocator makes, by our code (index into
/// [`programs::SYSCALL_ENTER`]).
pub mod syscall {
    pub const MMAP: u32 = 0;
    pub const MUNMAP: u32 = 1;
    pub const MREMAP: u32 = 2;
    pub const MADVISE: u32 = 3;
    pub const BRK: u32 = 4;
    pub const MPROTECT: u32 = 5;
    pub const COUNT: u32 = 6;
    /// Tracepoint names (`syscalls:sys_enter_NAME`).
    pub const NAMES: [&str; COUNT as usize] =
        ["mmap", "munmap", "mremap", "madvise", "brk", "mprotect"];
}

/// Index in [`maps::ALLOC_CTL`] of the window generation: per-thread call
/// state from an earlier window (whose return probe was detached) is stale.
pub const ALLOC_CTL_GENERATION: u32 = 0;

/// Byte size of the allocator event ring buffer. At 72 bytes an event,
/// 16 MiB holds about 230k calls: more than a second of the fastest traced
/// allocator (each call traps twice, ~3 µs) on every CPU of a small machine.
pub const ALLOC_RING_BYTES: u32 = 16 << 20;
/// As [`SAMPLES_WAKEUP_BYTES`], for the allocator ring.
pub const ALLOC_WAKEUP_BYTES: u64 = (ALLOC_RING_BYTES / 4) as u64;
/// Threads whose in-progress allocator call or syscall can be remembered.
pub const ALLOC_THREADS_CAPACITY: u32 = 16 * 1024;

/// Byte size of the lock event ring buffer (only contended locks and
/// kernel lock contention produce events).
pub const LOCK_RING_BYTES: u32 = 4 << 20;
/// User stack words copied with a futex call, from the stack pointer: the
/// loader finds the return addresses among them (the lock implementation
/// in libc has no frame pointers to walk).
pub const LOCK_STACK_WORDS: usize = 48;

/// [`LockEvent::kind`].
pub mod lock_event {
    /// A thread enters a futex wait (`LockEvent::stack` is filled).
    pub const WAIT_BEGIN: u32 = 1;
    /// A thread enters a futex wake.
    pub const WAKE_BEGIN: u32 = 2;
    /// The futex call of `tid` returned (`ret`, `duration_ns`).
    pub const END: u32 = 3;
    /// A kernel lock the thread waited for (`lock:contention_*`); `op` is
    /// the lock's flags, `uaddr` the lock's kernel address.
    pub const KERNEL: u32 = 4;
}

/// A futex call or kernel lock wait of one of the target's threads.
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
    pub uaddr: u64,
    pub time_ns: u64,
    /// For `END` and `KERNEL`: how long the call or wait took.
    pub duration_ns: u64,
    /// For `END`: the return value (woken threads for a wake).
    pub ret: i64,
    /// User instruction, stack and frame pointers at the call.
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// For `WAIT_BEGIN` and `WAKE_BEGIN`: the return address of a traced
    /// lock call or
    /// condvar wait in progress on the thread (0 if none). Its return
    /// probe replaced that address on the stack with the kernel's
    /// trampoline, which the loader swaps back.
    pub lock_site: u64,
    /// For `WAIT_BEGIN` and `WAKE_BEGIN`: the top of the user stack.
    pub stack: [u64; LOCK_STACK_WORDS],
}

/// [`AllocEvent::kind`] / [`SyscallEvent::kind`].
pub const EVENT_ALLOC: u32 = 1;
pub const EVENT_SYSCALL: u32 = 2;

/// One allocator call, from entry to return.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocEvent {
    /// [`EVENT_ALLOC`].
    pub kind: u32,
    /// [`alloc_op`] code.
    pub op: u32,
    pub tid: u32,
    pub _pad: u32,
    /// `bpf_ktime_get_ns()` at entry.
    pub start_ns: u64,
    /// Entry to return.
    pub duration_ns: u64,
    /// The block returned (allocations; 0 on failure) or given back (frees).
    pub ptr: u64,
    /// `realloc`'s old block.
    pub old_ptr: u64,
    /// Bytes requested (0 for frees).
    pub size: u64,
    /// glibc only: the chunk header at `ptr - 8` (size | flag bits) of a
    /// block handed out; 0 when unknown, and for frees (not read: it costs
    /// as much as the rest of the program, and the loader knows the block).
    pub chunk: u64,
    /// Return address: the instruction after the call in the caller (0
    /// for frees).
    pub caller: u64,
}

/// One syscall of the allocator's kind, from entry to exit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallEvent {
    /// [`EVENT_SYSCALL`].
    pub kind: u32,
    /// [`syscall`] code.
    pub nr: u32,
    pub tid: u32,
    /// `alloc_op + 1` of the allocator call in progress on the thread, or 0.
    pub inside: u32,
    pub start_ns: u64,
    pub duration_ns: u64,
    /// The first four arguments.
    pub args: [u64; 4],
    /// Return value.
    pub ret: i64,
}

/// Per-thread kernel-side statistics (values of [`maps::KERNEL_STATS`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStats {
    pub page_faults: u64,
    /// Page faults while an allocator call was in progress on the thread.
    pub page_faults_in_alloc: u64,
    /// `mmap_lock` acquisitions that did not succeed at once.
    pub mmap_lock_waits: u64,
    pub mmap_lock_wait_ns: u64,
    /// Start of the acquisition in progress (0: none).
    pub mmap_lock_start_ns: u64,
}

/// The CPU was executing kernel code when the sample was taken; `ip` is then
/// the user-mode instruction the thread will return to (or 0 if unknown).
pub const SAMPLE_FLAG_KERNEL: u32 = 1;

/// The sampled instruction has no recipe yet: the loader should decode it.
pub const SAMPLE_FLAG_NO_RECIPE: u32 = 2;
/// `addr`, `access` and `size` describe the memory access sampled.
pub const SAMPLE_FLAG_ADDR: u32 = 4;
/// A precise memory event (PEBS, IBS), not a CPU sample.
pub const SAMPLE_FLAG_MEMORY: u32 = 8;

/// One CPU sample of one of the target's threads.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleEvent {
    /// `bpf_ktime_get_ns()` at the sample (CLOCK_MONOTONIC).
    pub time_ns: u64,
    /// User-mode instruction pointer (see [`SAMPLE_FLAG_KERNEL`]).
    pub ip: u64,
    /// Thread id (kernel `pid`).
    pub tid: u32,
    /// CPU the sample was taken on.
    pub cpu: u32,
    /// Id in [`maps::STACKS`] of the user stack, or a negative errno.
    pub stack_id: i32,
    /// `SAMPLE_FLAG_*` bits.
    pub flags: u32,
    /// With [`SAMPLE_FLAG_ADDR`]: the data address accessed.
    pub addr: u64,
    /// With [`SAMPLE_FLAG_ADDR`]: the recipe's [`sharing::recipe`] bits
    /// (read/write, previous instruction).
    pub access: u32,
    /// With [`SAMPLE_FLAG_ADDR`]: bytes accessed.
    pub size: u32,
}

/// A new thread was created in the target.
pub const TASK_NEW_THREAD: u32 = 1;
/// A thread of the target exited (the process ends when all have).
pub const TASK_EXIT: u32 = 2;
/// The target replaced its program image with `execve`.
pub const TASK_EXEC: u32 = 3;

/// A change in the target's set of threads or program image.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskEvent {
    /// `bpf_ktime_get_ns()` at the event.
    pub time_ns: u64,
    /// `TASK_*` kind.
    pub kind: u32,
    /// The thread concerned (the new thread for [`TASK_NEW_THREAD`]).
    pub tid: u32,
    /// Its thread group (process id).
    pub tgid: u32,
    /// For [`TASK_NEW_THREAD`], the creating thread; otherwise 0.
    pub parent_tid: u32,
    /// For [`TASK_EXIT`], the thread's final name (NUL-padded), so threads
    /// that live too briefly to be looked up in /proc are still named.
    pub comm: [u8; 16],
}

// The kernel writes these structs and userspace reads them; any change in
// size is a layout change both sides must see.
const _: () = assert!(core::mem::size_of::<SampleEvent>() == 48);
const _: () = assert!(core::mem::size_of::<TaskEvent>() == 40);
const _: () = assert!(core::mem::size_of::<AllocEvent>() == 72);
const _: () = assert!(core::mem::size_of::<SyscallEvent>() == 72);
const _: () = assert!(core::mem::size_of::<KernelStats>() == 40);
const _: () = assert!(core::mem::size_of::<LockEvent>() == 80 + 8 * LOCK_STACK_WORDS);

#[cfg(feature = "user")]
pub use user::record_kind;

#[cfg(feature = "user")]
mod user {
    use super::{AllocEvent, KernelStats, SampleEvent, SyscallEvent, TaskEvent};

    // SAFETY: `SampleEvent` is `#[repr(C)]`, `Copy`, made only of integers,
    // and has no padding (8+8+4+4+4+4+8+4+4 = 48, asserted above); every
    // bit pattern is a valid value.
    unsafe impl aya::Pod for SampleEvent {}
    // SAFETY: as above: `#[repr(C)]`, integers and a byte array only,
    // 8+4*4+16 = 40 bytes, no padding, any bit pattern is valid.
    unsafe impl aya::Pod for TaskEvent {}
    // SAFETY: `#[repr(C)]`, 4 u32 then 7 u64 = 72 bytes (asserted above),
    // naturally aligned so no padding; any bit pattern is valid.
    unsafe impl aya::Pod for AllocEvent {}
    // SAFETY: `#[repr(C)]`, 4 u32, 2 u64, [u64; 4], i64 = 72 bytes, no
    // padding; any bit pattern is valid.
    unsafe impl aya::Pod for SyscallEvent {}
    // SAFETY: `#[repr(C)]`, five u64, no padding; any bit pattern is valid.
    unsafe impl aya::Pod for KernelStats {}
    // SAFETY: `#[repr(C)]`, 4 u32 then u64s and a u64 array (size asserted
    // above), no padding; any bit pattern is valid.
    unsafe impl aya::Pod for super::LockEvent {}
    // SAFETY: `#[repr(C)]`: i64, four u8, u32 = 16 bytes (asserted in
    // `sharing`), no padding; any bit pattern is valid.
    unsafe impl aya::Pod for crate::sharing::AccessRecipe {}
    // SAFETY: `#[repr(C)]`: two (u32, u32) entries, u64s and four u32 =
    // 96 bytes (asserted), no padding; any bit pattern is valid.
    unsafe impl aya::Pod for crate::sharing::LineState {}
    // SAFETY: `#[repr(C)]`: an array of five-u32 structs (asserted size),
    // no padding; any bit pattern is valid.
    unsafe impl aya::Pod for crate::sharing::LineWords {}

    impl super::LockEvent {
        /// Decodes a ring-buffer record; `None` if it is too short.
        pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
            read_pod(bytes)
        }
    }

    impl AllocEvent {
        /// Decodes a ring-buffer record; `None` if it is too short.
        pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
            read_pod(bytes)
        }
    }

    impl SyscallEvent {
        /// Decodes a ring-buffer record; `None` if it is too short.
        pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
            read_pod(bytes)
        }
    }

    /// The `kind` field every allocator-ring record starts with.
    pub fn record_kind(bytes: &[u8]) -> Option<u32> {
        Some(u32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?))
    }

    impl SampleEvent {
        /// Decodes a ring-buffer record; `None` if it is too short.
        pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
            read_pod(bytes)
        }
    }

    impl TaskEvent {
        /// Decodes a ring-buffer record; `None` if it is too short.
        pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
            read_pod(bytes)
        }

        /// The `comm` field as text (empty when not set).
        pub fn comm_str(&self) -> &str {
            let len = self
                .comm
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(self.comm.len());
            core::str::from_utf8(&self.comm[..len]).unwrap_or("")
        }
    }

    pub(crate) fn read_pod<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
        if bytes.len() < core::mem::size_of::<T>() {
            return None;
        }
        // SAFETY: the length was checked above, `T: Pod` accepts any bit
        // pattern, and `read_unaligned` does not require the ring-buffer
        // record to be aligned for `T`.
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
    }
}

#[cfg(all(test, feature = "user"))]
mod tests {
    use super::*;

    #[test]
    fn sample_round_trips_through_bytes() {
        let s = SampleEvent {
            time_ns: 1,
            ip: 0x4000_1234,
            tid: 7,
            cpu: 1,
            stack_id: -14,
            flags: SAMPLE_FLAG_KERNEL,
            addr: 0x7f00_0040,
            access: sharing::recipe::WRITE,
            size: 8,
        };
        // SAFETY: SampleEvent is Pod (see above); viewing it as bytes is sound.
        let bytes = unsafe {
            core::slice::from_raw_parts(
                (&s as *const SampleEvent).cast::<u8>(),
                core::mem::size_of::<SampleEvent>(),
            )
        };
        assert_eq!(SampleEvent::from_bytes(bytes), Some(s));
        assert_eq!(SampleEvent::from_bytes(&bytes[..47]), None);
    }

    #[test]
    fn program_names_fit_the_kernel_limit_and_share_the_prefix() {
        for name in programs::ALL {
            assert!(name.len() <= 15, "{name} is longer than BPF_OBJ_NAME_LEN-1");
            assert!(name.starts_with(PROGRAM_PREFIX));
        }
    }
}

//! Program names (the eBPF function names; the kernel keeps 15 bytes of
//! each). Every one starts with [`PROGRAM_PREFIX`](crate::PROGRAM_PREFIX).

/// `perf_event` program on `cpu-clock` (or hardware cycles), one per CPU.
pub const CPU_SAMPLE: &str = "mp_cpu_sample";
/// `timer:hrtimer_expire_entry`: CPU samples on the scheduler tick.
pub const TICK_SAMPLE: &str = "mp_tick_sample";
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
/// Raw tracepoints `sys_enter` / `sys_exit`: the allocator's syscalls
/// (attached in windows of their own).
pub const SYSCALL_ENTER: &str = "mp_sc_enter";
pub const SYSCALL_EXIT: &str = "mp_sc_exit";
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
/// Raw tracepoints `sched:sched_switch` and `sched:sched_waking`: futex
/// waits seen as the sleeps they are (the default; the syscall
/// tracepoints above are the fallback).
pub const FUTEX_SWITCH: &str = "mp_futex_sw";
pub const FUTEX_WAKING: &str = "mp_futex_wk";
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
pub const ALL: [&str; 27] = [
    CPU_SAMPLE,
    TICK_SAMPLE,
    MEM_SAMPLE,
    TASK_NEW,
    TASK_EXIT,
    TASK_EXEC,
    ALLOC_ENTER,
    ALLOC_EXIT,
    ALLOC_FLOOR_ENTER,
    ALLOC_FLOOR_EXIT,
    SYSCALL_ENTER,
    SYSCALL_EXIT,
    PAGE_FAULT,
    MMAP_LOCK_START,
    MMAP_LOCK_DONE,
    FUTEX_ENTER,
    FUTEX_EXIT,
    FUTEX_WAIT_ENTER,
    FUTEX_WAKE_ENTER,
    FUTEX2_EXIT,
    FUTEX_SWITCH,
    FUTEX_WAKING,
    KLOCK_BEGIN,
    KLOCK_END,
    LOCK_ENTER,
    LOCK_EXIT,
    UNLOCK,
];

//! What every program uses: the target filter, the per-CPU counters, the
//! clock, and the layout of the syscall tracepoint records.

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::map,
    maps::{HashMap, PerCpuArray},
    Global,
};
use memprof_common::{
    counter,
    procs::{LAYOUT_UNKNOWN, TRACED_CAPACITY, TRACED_CGROUPS_CAPACITY},
};

/// Process being traced; written by the loader (`override_global`).
// SAFETY (no_mangle, all three): the loader finds each global by this
// exact name; no other symbol in the object has it.
#[unsafe(no_mangle)]
static TARGET_TGID: Global<u32> = Global::new(0);
/// 1: children forked by a traced process are traced too.
#[unsafe(no_mangle)]
static FOLLOW_CHILDREN: Global<u32> = Global::new(0);
/// Offsets of the first argument in `syscalls:sys_enter_*` records and of
/// `ret` in `syscalls:sys_exit_*` records, read from tracefs by the loader
/// because tracepoint layouts differ between kernel versions.
#[unsafe(no_mangle)]
static SYSCALL_ARGS_OFFSET: Global<u32> = Global::new(16);
#[unsafe(no_mangle)]
static SYSCALL_RET_OFFSET: Global<u32> = Global::new(16);

/// Every traced process (tgid → code layout): the main one, the other
/// `-p` pids, and forked children, which [`follow_child`] adds before
/// they first run.
#[map(name = "TRACED")]
static TRACED: HashMap<u32, u32> = HashMap::with_max_entries(TRACED_CAPACITY, 0);

/// The `--cgroup` cgroup and those below it (id → 1), written by the
/// loader; empty without `--cgroup`.
#[map(name = "TRACED_CGROUPS")]
static TRACED_CGROUPS: HashMap<u64, u8> = HashMap::with_max_entries(TRACED_CGROUPS_CAPACITY, 0);

#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

// `Global::load` reads volatile, so the compiler cannot fold in the initial
// value the loader rewrites.
#[inline(always)]
pub fn target_tgid() -> u32 {
    TARGET_TGID.load()
}

/// The code layout of process `tgid` if it is traced (the sampler's
/// filter; the allocator and lock programs follow the main process only).
#[inline(always)]
pub fn traced_layout(tgid: u32) -> Option<u32> {
    // SAFETY: a map lookup; the value is a plain u32, copied out.
    unsafe { TRACED.get(tgid) }.copied()
}

/// Traces the child `child` of traced process `parent` with the parent's
/// layout (a fork copies the address space), when children are followed.
/// Returns whether it did.
#[inline(always)]
pub fn follow_child(parent: u32, child: u32) -> bool {
    if FOLLOW_CHILDREN.load() == 0 {
        return false;
    }
    let Some(layout) = traced_layout(parent) else {
        return false;
    };
    TRACED.insert(child, layout, 0).is_ok()
}

/// Whether the current task is in the traced cgroup or one below it. The
/// ids are the kernel's (kernfs) ids, the same in every cgroup namespace.
#[inline(always)]
pub fn in_traced_cgroup() -> bool {
    // SAFETY: helper without preconditions (cgroup v2's id of the task).
    let id = unsafe { bpf_get_current_cgroup_id() };
    // SAFETY: a map lookup; the value is not used.
    unsafe { TRACED_CGROUPS.get(id) }.is_some()
}

/// Traces process `tgid` (a newcomer to the traced cgroup), with no code
/// layout until the loader gives it one. Returns whether it did.
#[inline(always)]
pub fn adopt(tgid: u32) -> bool {
    TRACED.insert(tgid, LAYOUT_UNKNOWN, 0).is_ok()
}

/// Gives traced process `tgid` a new layout (after its `exec`).
#[inline(always)]
pub fn set_layout(tgid: u32, layout: u32) {
    if traced_layout(tgid).is_some() {
        let _ = TRACED.insert(tgid, layout, 0);
    }
}

/// Stops tracing process `tgid` (it exited).
#[inline(always)]
pub fn forget(tgid: u32) {
    let _ = TRACED.remove(tgid);
}

/// Offset of the first argument in `syscalls:sys_enter_*` records
/// (arguments follow, 8 bytes each).
#[inline(always)]
pub fn syscall_args_offset() -> usize {
    SYSCALL_ARGS_OFFSET.load() as usize
}

/// Offset of `ret` in `syscalls:sys_exit_*` records.
#[inline(always)]
pub fn syscall_ret_offset() -> usize {
    SYSCALL_RET_OFFSET.load() as usize
}

/// Adds one to a per-CPU counter.
#[inline(always)]
pub fn count(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: the pointer comes from the map lookup and stays valid for
        // the program's run; per-CPU slots are written only on this CPU.
        // A sampler running in NMI context (hardware PMU events) can
        // interrupt a tracepoint program between the load and the store,
        // and one increment is then lost: `core` has no atomic add for the
        // BPF target to prevent it.
        unsafe { *slot += 1 };
    }
}

/// Adds `n` to a per-CPU counter (as [`count`]).
#[inline(always)]
pub fn count_by(index: u32, n: u64) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: as in `count`.
        unsafe { *slot += n };
    }
}

/// The calling thread's (tgid, tid).
#[inline(always)]
pub fn current_ids() -> (u32, u32) {
    let id = bpf_get_current_pid_tgid();
    ((id >> 32) as u32, id as u32)
}

/// The kernel's `CLOCK_MONOTONIC` in nanoseconds (`bpf_ktime_get_ns`): the
/// time base of every record.
#[inline(always)]
pub fn bpf_now() -> u64 {
    // SAFETY: helper without preconditions.
    unsafe { bpf_ktime_get_ns() }
}

//! Following the traced processes: thread creation, forked children (when
//! followed), thread exit, exec.

use aya_ebpf::{
    helpers::bpf_get_current_comm,
    macros::{map, raw_tracepoint, tracepoint},
    maps::RingBuf,
    programs::{RawTracePointContext, TracePointContext},
    Global,
};
use aya_log_ebpf::warn;
use memprof_common::{
    counter, procs::LAYOUT_UNKNOWN, TaskEvent, TASK_EXEC, TASK_EXIT, TASK_NEW_PROCESS,
    TASK_NEW_THREAD, TASK_RING_BYTES,
};

use crate::maps::{
    adopt, bpf_now, count, current_ids, follow_child, forget, in_traced_cgroup, set_layout,
    target_tgid, traced_layout,
};

/// Field offsets in `task:task_newtask`, read from tracefs by the loader
/// because tracepoint layouts differ between kernel versions.
// SAFETY (no_mangle, both): the loader finds each global by this exact
// name; no other symbol in the object has it.
#[unsafe(no_mangle)]
static NEWTASK_PID_OFFSET: Global<u32> = Global::new(8);
#[unsafe(no_mangle)]
static NEWTASK_FLAGS_OFFSET: Global<u32> = Global::new(32);
/// Offset of `group_dead` in `sched:sched_process_exit`.
#[unsafe(no_mangle)]
static EXIT_GROUP_DEAD_OFFSET: Global<u32> = Global::new(32);

#[map(name = "TASK_EVENTS")]
static TASK_EVENTS: RingBuf = RingBuf::with_byte_size(TASK_RING_BYTES, 0);

/// `CLONE_THREAD` from `<linux/sched.h>`.
const CLONE_THREAD: u64 = 0x0001_0000;

/// `task:task_newtask` runs in the creating thread, so the current tgid is
/// the parent's; a `CLONE_THREAD` child joins that thread group, any other
/// child is a new process, followed from here (before it first runs, so
/// none of its samples is missed) when children are followed.
#[tracepoint]
pub fn mp_task_new(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    if traced_layout(tgid).is_none() {
        return 0;
    }
    // SAFETY: the offsets come from this kernel's tracefs format file and
    // `read_at` uses bpf_probe_read on the tracepoint record.
    let fields = unsafe {
        (
            ctx.read_at::<u64>(NEWTASK_FLAGS_OFFSET.load() as usize),
            ctx.read_at::<i32>(NEWTASK_PID_OFFSET.load() as usize),
        )
    };
    let (Ok(flags), Ok(child)) = fields else {
        // Never expected: the offsets were read from this kernel's format
        // file. Say so rather than silently miss threads.
        warn!(
            &ctx,
            "task_newtask: cannot read pid/clone_flags of a new task"
        );
        return 0;
    };
    if flags & CLONE_THREAD != 0 {
        emit(TASK_NEW_THREAD, child as u32, tgid, tid, [0; 16]);
    } else if follow_child(tgid, child as u32) {
        emit(TASK_NEW_PROCESS, child as u32, child as u32, tid, [0; 16]);
    }
    0
}

/// `sched:sched_process_exit` runs in the exiting thread. The last thread
/// of a followed process takes it out of the traced set (its pid may be
/// reused); the main process stays, for its late records.
#[tracepoint]
pub fn mp_task_exit(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    if traced_layout(tgid).is_some() {
        // SAFETY: the offset comes from this kernel's format file and
        // `read_at` uses bpf_probe_read on the tracepoint record.
        let group_dead = unsafe { ctx.read_at::<u8>(EXIT_GROUP_DEAD_OFFSET.load() as usize) };
        if group_dead.is_ok_and(|d| d != 0) && tgid != target_tgid() {
            forget(tgid);
        }
        // The name the thread ends with; it may be gone from /proc before
        // the loader gets to read it there.
        let comm = bpf_get_current_comm().unwrap_or([0; 16]);
        emit(TASK_EXIT, tid, tgid, 0, comm);
    }
    0
}

/// `sched:sched_process_exec` runs in the task after the new image is in.
/// A followed child's new image is not the layout its recipes were
/// decoded for: it has none until the loader gives it one. A process
/// that is not traced but runs a new program in the traced cgroup (how
/// services and containers start theirs: fork, join the cgroup, exec) is
/// traced from here on, announced as a new process.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn mp_task_exec(_ctx: RawTracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    if traced_layout(tgid).is_none() && in_traced_cgroup() && adopt(tgid) {
        emit(TASK_NEW_PROCESS, tid, tgid, 0, [0; 16]);
    }
    if traced_layout(tgid).is_some() {
        if tgid != target_tgid() {
            set_layout(tgid, LAYOUT_UNKNOWN);
        }
        emit(TASK_EXEC, tid, tgid, 0, [0; 16]);
    }
    0
}

#[inline(always)]
fn emit(kind: u32, tid: u32, tgid: u32, parent_tid: u32, comm: [u8; 16]) {
    let Some(mut entry) = TASK_EVENTS.reserve::<TaskEvent>(0) else {
        count(counter::TASK_EVENTS_LOST);
        return;
    };
    entry.write(TaskEvent {
        time_ns: bpf_now(),
        kind,
        tid,
        tgid,
        parent_tid,
        comm,
    });
    entry.submit(0);
}

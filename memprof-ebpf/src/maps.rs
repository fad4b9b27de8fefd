//! Maps and load-time globals shared by the programs.

use aya_ebpf::{
    macros::map,
    maps::{PerCpuArray, RingBuf, StackTrace},
    Global,
};
use memprof_common::{counter, SAMPLES_RING_BYTES, STACKS_CAPACITY, TASK_RING_BYTES};

/// Process being traced; written by the loader (`override_global`).
// SAFETY (no_mangle): the loader finds the global by this exact name; no
// other symbol in the object has it.
#[unsafe(no_mangle)]
static TARGET_TGID: Global<u32> = Global::new(0);

/// Field offsets in `task:task_newtask`, read from tracefs by the loader
/// because tracepoint layouts differ between kernel versions.
// SAFETY (no_mangle, both): named for the loader, as above.
#[unsafe(no_mangle)]
static NEWTASK_PID_OFFSET: Global<u32> = Global::new(8);
#[unsafe(no_mangle)]
static NEWTASK_FLAGS_OFFSET: Global<u32> = Global::new(32);

#[map(name = "SAMPLES")]
pub static SAMPLES: RingBuf = RingBuf::with_byte_size(SAMPLES_RING_BYTES, 0);

#[map(name = "TASK_EVENTS")]
pub static TASK_EVENTS: RingBuf = RingBuf::with_byte_size(TASK_RING_BYTES, 0);

#[map(name = "STACKS")]
pub static STACKS: StackTrace = StackTrace::with_max_entries(STACKS_CAPACITY, 0);

#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

// `Global::load` reads volatile, so the compiler cannot fold in the initial
// value the loader rewrites.
#[inline(always)]
pub fn target_tgid() -> u32 {
    TARGET_TGID.load()
}

#[inline(always)]
pub fn newtask_pid_offset() -> usize {
    NEWTASK_PID_OFFSET.load() as usize
}

#[inline(always)]
pub fn newtask_flags_offset() -> usize {
    NEWTASK_FLAGS_OFFSET.load() as usize
}

/// Adds one to a per-CPU counter.
#[inline(always)]
pub fn count(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: the pointer comes from the map lookup and stays valid for
        // the program's run; per-CPU slots are written only on this CPU.
        // (On machines with a PMU a sampler in NMI context could interrupt
        // a tracepoint program between load and store and one increment be
        // lost; `core` has no atomic add for the BPF target to prevent it.)
        unsafe { *slot += 1 };
    }
}

/// The calling thread's (tgid, tid).
#[inline(always)]
pub fn current_ids() -> (u32, u32) {
    let id = aya_ebpf::helpers::bpf_get_current_pid_tgid();
    ((id >> 32) as u32, id as u32)
}

//! Types shared by the kernel programs (`memprof-ebpf`) and the userspace
//! loader (`memprof`).
//!
//! Everything here is `#[repr(C)]` with fixed-size integer fields only, so
//! both sides agree on the layout byte for byte; sizes are checked at compile
//! time. Map names, program names and capacities live here too, so the two
//! sides never spell them differently.
#![no_std]

/// Every program we load has a name starting with this prefix, so leftover
/// programs are easy to spot with `bpftool prog show`.
pub const PROGRAM_PREFIX: &str = "mp_";

/// Program names (the eBPF function names; the kernel keeps 15 bytes).
pub mod programs {
    /// `perf_event` program on `cpu-clock` (or hardware cycles), one per CPU.
    pub const CPU_SAMPLE: &str = "mp_cpu_sample";
    /// `task:task_newtask`: a thread of the target was created.
    pub const TASK_NEW: &str = "mp_task_new";
    /// `sched:sched_process_exit`: a thread of the target exited.
    pub const TASK_EXIT: &str = "mp_task_exit";
    /// `sched:sched_process_exec`: the target called `execve`.
    pub const TASK_EXEC: &str = "mp_task_exec";

    /// All of them, for checks that nothing is left loaded.
    pub const ALL: [&str; 4] = [CPU_SAMPLE, TASK_NEW, TASK_EXIT, TASK_EXEC];
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
}

/// Names of the load-time globals (`EbpfLoader::set_global`).
pub mod globals {
    /// `u32`: the thread-group id (process id) being traced.
    pub const TARGET_TGID: &str = "TARGET_TGID";
    /// `u32`: offset of `pid` in the `task:task_newtask` record.
    pub const NEWTASK_PID_OFFSET: &str = "NEWTASK_PID_OFFSET";
    /// `u32`: offset of `clone_flags` in the `task:task_newtask` record.
    pub const NEWTASK_FLAGS_OFFSET: &str = "NEWTASK_FLAGS_OFFSET";
}

/// Byte size of the sample ring buffer (a power of two, page multiple).
/// 4 MiB holds about 130k samples: several seconds at the highest rate
/// even if userspace stalls.
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
    /// Number of counters.
    pub const COUNT: u32 = 4;
}

/// The CPU was executing kernel code when the sample was taken; `ip` is then
/// the user-mode instruction the thread will return to (or 0 if unknown).
pub const SAMPLE_FLAG_KERNEL: u32 = 1;

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
const _: () = assert!(core::mem::size_of::<SampleEvent>() == 32);
const _: () = assert!(core::mem::size_of::<TaskEvent>() == 40);

#[cfg(feature = "user")]
mod user {
    use super::{SampleEvent, TaskEvent};

    // SAFETY: `SampleEvent` is `#[repr(C)]`, `Copy`, made only of integers,
    // and has no padding (8+8+4+4+4+4 = 32, asserted above); every bit
    // pattern is a valid value.
    unsafe impl aya::Pod for SampleEvent {}
    // SAFETY: as above: `#[repr(C)]`, integers and a byte array only,
    // 8+4*4+16 = 40 bytes, no padding, any bit pattern is valid.
    unsafe impl aya::Pod for TaskEvent {}

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

    fn read_pod<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
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
        };
        // SAFETY: SampleEvent is Pod (see above); viewing it as bytes is sound.
        let bytes = unsafe {
            core::slice::from_raw_parts(
                (&s as *const SampleEvent).cast::<u8>(),
                core::mem::size_of::<SampleEvent>(),
            )
        };
        assert_eq!(SampleEvent::from_bytes(bytes), Some(s));
        assert_eq!(SampleEvent::from_bytes(&bytes[..31]), None);
    }

    #[test]
    fn program_names_fit_the_kernel_limit_and_share_the_prefix() {
        for name in programs::ALL {
            assert!(name.len() <= 15, "{name} is longer than BPF_OBJ_NAME_LEN-1");
            assert!(name.starts_with(PROGRAM_PREFIX));
        }
    }
}

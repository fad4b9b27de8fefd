//! CPU sampling and precise memory events: the sample record, its flags,
//! and the sizes of the sample ring and the stack map.

use crate::record::records;

/// Byte size of the sample ring buffer (a power of two, page multiple).
/// 4 MiB holds about 65k samples (56 bytes + 8 of header each): over 30 s
/// of the default rate on two CPUs if userspace stalls, while the loader
/// drains it every [`DRAIN_INTERVAL_MS`](crate::DRAIN_INTERVAL_MS).
pub const SAMPLES_RING_BYTES: u32 = 4 << 20;
/// Samples are submitted without waking the loader (which drains on a
/// timer, see [`DRAIN_INTERVAL_MS`](crate::DRAIN_INTERVAL_MS)) until this
/// much data is waiting; then every submit wakes it. This turns thousands
/// of wake-ups a second, each preempting a thread of the target, into
/// about ten.
pub const SAMPLES_WAKEUP_BYTES: u64 = (SAMPLES_RING_BYTES / 4) as u64;

/// Distinct user stacks kept in the stack-trace map (each takes about 1 KiB
/// of kernel memory). For samples in user code the sampled instruction is
/// left out of the stack (it is in the sample), so a stack is a call path,
/// not a call path per instruction, and few are needed.
pub const STACKS_CAPACITY: u32 = 8 * 1024;
/// Frames kept per stack (the kernel's `perf_event_max_stack` default).
pub const MAX_STACK_DEPTH: usize = 127;

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
    /// Id in [`maps::STACKS`](crate::maps::STACKS) of the user stack, or a
    /// negative errno.
    pub stack_id: i32,
    /// `SAMPLE_FLAG_*` bits.
    pub flags: u32,
    /// With [`SAMPLE_FLAG_ADDR`]: the data address accessed.
    pub addr: u64,
    /// With [`SAMPLE_FLAG_ADDR`]: the recipe's
    /// [`sharing::recipe`](crate::sharing::recipe) bits (read/write,
    /// previous instruction).
    pub access: u32,
    /// With [`SAMPLE_FLAG_ADDR`]: bytes accessed.
    pub size: u32,
    /// Process of the thread (several may be traced).
    pub tgid: u32,
    pub _pad: u32,
}

// The kernel writes this record and userspace reads it; a change in size is
// a layout change both sides must see.
const _: () = assert!(core::mem::size_of::<SampleEvent>() == 56);

// SAFETY: `#[repr(C)]`, integers only, 8+8+4+4+4+4+8+4+4+4+4 = 56 bytes
// (asserted above) with every field naturally aligned, so no padding; any
// bit pattern is a valid value.
records!(SampleEvent);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_round_trips_through_bytes() {
        let s = SampleEvent {
            time_ns: 1,
            ip: 0x4000_1234,
            tid: 7,
            cpu: 1,
            stack_id: -14,
            flags: SAMPLE_FLAG_KERNEL,
            addr: 0x7f00_0040,
            access: crate::sharing::recipe::WRITE,
            size: 8,
            tgid: 7,
            _pad: 0,
        };
        // SAFETY: `SampleEvent` is plain data with no padding (see above):
        // all 56 bytes of `s` are initialised.
        let bytes = unsafe {
            core::slice::from_raw_parts(
                (&s as *const SampleEvent).cast::<u8>(),
                core::mem::size_of::<SampleEvent>(),
            )
        };
        assert_eq!(SampleEvent::from_bytes(bytes), Some(s));
        assert_eq!(SampleEvent::from_bytes(&bytes[..55]), None);
    }
}

//! CPU sampling: a `perf_event` program on every online CPU.

use aya_ebpf::{
    bindings::{BPF_F_USER_STACK, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::bpf_get_smp_processor_id,
    macros::{map, perf_event},
    maps::{RingBuf, StackTrace},
    programs::{tracing::StackIdContext, PerfEventContext},
};
use memprof_common::{
    counter, procs::recipe_key, SampleEvent, SAMPLES_RING_BYTES, SAMPLES_WAKEUP_BYTES,
    SAMPLE_FLAG_KERNEL, SAMPLE_FLAG_MEMORY, STACKS_CAPACITY,
};

use crate::{
    alloc::sample_in_allocator,
    maps::{bpf_now, count, current_ids, traced_layout},
    sharing::{precise_mode, sample_access, Access},
};

#[map(name = "SAMPLES")]
static SAMPLES: RingBuf = RingBuf::with_byte_size(SAMPLES_RING_BYTES, 0);

#[map(name = "STACKS")]
static STACKS: StackTrace = StackTrace::with_max_entries(STACKS_CAPACITY, 0);

/// `EFAULT` from `<errno.h>`.
const EFAULT: i32 = 14;

#[perf_event]
pub fn mp_cpu_sample(ctx: PerfEventContext) -> u32 {
    try_cpu_sample(&ctx);
    0
}

#[inline(always)]
fn try_cpu_sample(ctx: &PerfEventContext) {
    let (tgid, tid) = current_ids();
    let Some(layout) = traced_layout(tgid) else {
        return;
    };
    count(counter::SAMPLES_SEEN);

    // SAFETY: the kernel passes a valid `bpf_perf_event_data` whose `regs`
    // are the interrupted context's registers; reading them is allowed.
    let (ip, cs, sp, bp) = unsafe {
        let regs = &(*ctx.ctx).regs;
        (regs.rip, regs.cs, regs.rsp, regs.rbp)
    };
    let in_kernel = cs & 3 != 3;

    // The user stack is walked by the kernel from the thread's saved user
    // registers, so it is valid even when the sample hit kernel code. In
    // user code its first frame is the sampled IP, which the event carries:
    // skip it, so samples anywhere in a function share their caller stack.
    let skip = if in_kernel { 0 } else { 1 };
    let stack_id = match ctx.get_stackid(&STACKS, BPF_F_USER_STACK as u64 | skip) {
        Ok(id) => id as i32,
        Err(e) => {
            // -EFAULT: no frames left after the skip (no caller, or no
            // frame pointers to walk); the sample still has its own IP.
            // Anything else (-EEXIST, -ENOMEM) is a stack lost to a full
            // or colliding map, which makes total times low.
            if e != -EFAULT {
                count(counter::STACK_ERRORS);
            }
            e
        }
    };

    let time_ns = bpf_now();
    let access = if in_kernel || precise_mode() {
        Access::default()
    } else {
        // Recipes are looked up by instruction and code layout: processes
        // whose code differs at the same address have their own.
        sample_access(ctx, recipe_key(layout, ip), tid, time_ns, false)
    };

    let Some(mut entry) = SAMPLES.reserve::<SampleEvent>(0) else {
        count(counter::SAMPLES_LOST);
        return;
    };
    entry.write(SampleEvent {
        time_ns,
        ip: if in_kernel { 0 } else { ip },
        tid,
        // SAFETY: helper without preconditions.
        cpu: unsafe { bpf_get_smp_processor_id() },
        stack_id,
        flags: access.flags | if in_kernel { SAMPLE_FLAG_KERNEL } else { 0 },
        addr: access.addr,
        access: access.bits,
        size: access.size,
        tgid,
        _pad: 0,
    });
    // Wake the loader only when a good part of the buffer is waiting; it
    // drains on a timer otherwise.
    let waiting = SAMPLES.query(BPF_RB_AVAIL_DATA as u64);
    entry.submit(if waiting >= SAMPLES_WAKEUP_BYTES {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    });
    if !in_kernel {
        sample_in_allocator(tgid, tid, time_ns, ip, sp, bp);
    }
}

/// A precise memory event (PEBS, IBS) of any thread: records the access of
/// the target's threads. Not a CPU sample: no stack, and flagged so the
/// loader does not count it as CPU time.
#[perf_event]
pub fn mp_mem_sample(ctx: PerfEventContext) -> u32 {
    let (tgid, tid) = current_ids();
    let Some(layout) = traced_layout(tgid) else {
        return 0;
    };
    // SAFETY: the kernel passes a valid `bpf_perf_event_data`; reading its
    // registers is allowed.
    let (ip, cs) = unsafe { ((*ctx.ctx).regs.rip, (*ctx.ctx).regs.cs) };
    if cs & 3 != 3 {
        return 0; // a kernel access (the events exclude them; be sure)
    }
    let time_ns = bpf_now();
    let access = sample_access(&ctx, recipe_key(layout, ip), tid, time_ns, true);
    let Some(mut entry) = SAMPLES.reserve::<SampleEvent>(0) else {
        count(counter::SAMPLES_LOST);
        return 0;
    };
    entry.write(SampleEvent {
        time_ns,
        ip,
        tid,
        // SAFETY: helper without preconditions.
        cpu: unsafe { bpf_get_smp_processor_id() },
        stack_id: -1,
        flags: access.flags | SAMPLE_FLAG_MEMORY,
        addr: access.addr,
        access: access.bits,
        size: access.size,
        tgid,
        _pad: 0,
    });
    entry.submit(BPF_RB_NO_WAKEUP as u64);
    0
}

//! CPU sampling: a `perf_event` program on the sampler's timer events, or
//! a tracepoint program on the scheduler tick.

use aya_ebpf::{
    bindings::{
        pt_regs, BPF_F_USER_STACK, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP,
    },
    helpers::{
        bpf_get_current_task_btf, bpf_get_smp_processor_id, bpf_probe_read_kernel, bpf_task_pt_regs,
    },
    macros::{map, perf_event, tracepoint},
    maps::{RingBuf, StackTrace},
    programs::{tracing::StackIdContext, PerfEventContext, TracePointContext},
    Global,
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
    let (tgid, tid) = current_ids();
    let Some(layout) = traced_layout(tgid) else {
        return 0;
    };
    // SAFETY: the kernel passes a valid `bpf_perf_event_data` whose `regs`
    // are the interrupted context's registers; reading them is allowed.
    let regs = unsafe { &(*ctx.ctx).regs };
    let in_kernel = regs.cs & 3 != 3;
    record_sample(&ctx, regs, in_kernel, (tgid, tid), layout);
    0
}

/// The kernel's tick handler (`tick_nohz_handler`), whose expiries
/// [`mp_tick_sample`] samples on; written by the loader.
// SAFETY (no_mangle, both): the loader finds each global by this exact
// name; no other symbol in the object has it.
#[unsafe(no_mangle)]
static TICK_FUNCTION: Global<u64> = Global::new(0);
/// Offset of `function` in the `timer:hrtimer_expire_entry` record.
#[unsafe(no_mangle)]
static TICK_FUNCTION_OFFSET: Global<u32> = Global::new(24);

/// `orig_ax` of registers saved on entry from user mode by a system
/// interrupt (the local timer's among them): no syscall to restart.
const ORIG_AX_INTERRUPT: u64 = u64::MAX;

/// The scheduler tick as the sampling timer: it interrupts every busy
/// CPU `HZ` times a second whether or not anything samples, so sampling
/// on it adds no interrupt. The thread it lands on is `current`; its user
/// registers are the ones saved at its entry to the kernel, which are the
/// interrupted ones when the tick came from user mode (`orig_ax` says
/// so: a syscall's or fault's number otherwise, then it is a kernel
/// sample).
#[tracepoint]
pub fn mp_tick_sample(ctx: TracePointContext) -> u32 {
    // SAFETY: reading a field of the record the tracepoint passes, at an
    // offset the loader read from its format.
    let function: u64 = match unsafe { ctx.read_at(TICK_FUNCTION_OFFSET.load() as usize) } {
        Ok(f) => f,
        Err(_) => return 0,
    };
    if function != TICK_FUNCTION.load() {
        return 0;
    }
    let (tgid, tid) = current_ids();
    let Some(layout) = traced_layout(tgid) else {
        return 0;
    };
    // SAFETY: helpers that take the current task's BTF pointer and give
    // the address of its saved user registers; the copy is a checked
    // kernel read that fails cleanly.
    let regs = unsafe {
        let at = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const pt_regs;
        match bpf_probe_read_kernel(at) {
            Ok(regs) => regs,
            Err(_) => return 0,
        }
    };
    let in_kernel = regs.orig_rax != ORIG_AX_INTERRUPT;
    record_sample(&ctx, &regs, in_kernel, (tgid, tid), layout);
    0
}

/// Sends one CPU sample of thread `ids` (tgid, tid) of a traced process
/// of code `layout`, interrupted with user registers `regs` (kernel
/// ones when `in_kernel`).
#[inline(always)]
fn record_sample<C: StackIdContext>(
    ctx: &C,
    regs: &pt_regs,
    in_kernel: bool,
    (tgid, tid): (u32, u32),
    layout: u32,
) {
    count(counter::SAMPLES_SEEN);
    let (ip, sp, bp) = (regs.rip, regs.rsp, regs.rbp);

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
        sample_access(regs, None, recipe_key(layout, ip), tid, time_ns)
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
    // registers and address is allowed.
    let (regs, addr) = unsafe { (&(*ctx.ctx).regs, (*ctx.ctx).addr) };
    let ip = regs.rip;
    if regs.cs & 3 != 3 {
        return 0; // a kernel access (the events exclude them; be sure)
    }
    let time_ns = bpf_now();
    let access = sample_access(regs, Some(addr), recipe_key(layout, ip), tid, time_ns);
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

//! The allocator: the operations probed, the syscalls traced, the records
//! of both, and the per-thread kernel statistics (page faults, `mmap_lock`
//! waits).

use crate::record::records;

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
    /// jemalloc's own API (also defined by other allocators for
    /// compatibility), which programs built for jemalloc call directly:
    /// `mallocx(size, flags)`, `rallocx(ptr, size, flags)` (a realloc),
    /// `xallocx(ptr, size, extra, flags)` (resizes in place, returns the
    /// usable size), `sdallocx(ptr, size, flags)` and `dallocx(ptr,
    /// flags)` (frees). They reach the allocator's internals without
    /// passing through `malloc` or `free`.
    pub const MALLOCX: u32 = 14;
    pub const RALLOCX: u32 = 15;
    pub const XALLOCX: u32 = 16;
    pub const SDALLOCX: u32 = 17;
    pub const DALLOCX: u32 = 18;
    /// Number of operations.
    pub const COUNT: u32 = 19;

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
        "mallocx",
        "rallocx",
        "xallocx",
        "sdallocx",
        "dallocx",
    ];

    /// Other entry points of an operation, with its arguments where it
    /// expects them (a size first for `new`, a pointer first for
    /// `delete`): the C++ operators' sized (C++14, what g++ calls for
    /// `delete p` of a complete type), aligned (C++17) and `nothrow`
    /// forms. An allocator that defines them implements each without
    /// calling `malloc` or `free`, so each is probed.
    pub const VARIANTS: [(&str, u32); 16] = [
        ("_ZnwmRKSt9nothrow_t", NEW),
        ("_ZnwmSt11align_val_t", NEW),
        ("_ZnwmSt11align_val_tRKSt9nothrow_t", NEW),
        ("_ZnamRKSt9nothrow_t", NEW_ARRAY),
        ("_ZnamSt11align_val_t", NEW_ARRAY),
        ("_ZnamSt11align_val_tRKSt9nothrow_t", NEW_ARRAY),
        ("_ZdlPvm", DELETE),
        ("_ZdlPvRKSt9nothrow_t", DELETE),
        ("_ZdlPvSt11align_val_t", DELETE),
        ("_ZdlPvmSt11align_val_t", DELETE),
        ("_ZdaPvm", DELETE_ARRAY),
        ("_ZdaPvRKSt9nothrow_t", DELETE_ARRAY),
        ("_ZdaPvSt11align_val_t", DELETE_ARRAY),
        ("_ZdaPvmSt11align_val_t", DELETE_ARRAY),
        ("_ZdlPvSt11align_val_tRKSt9nothrow_t", DELETE),
        ("_ZdaPvSt11align_val_tRKSt9nothrow_t", DELETE_ARRAY),
    ];

    /// The operation a symbol implements: its own, or the one it is a
    /// variant of.
    pub fn of_symbol(name: &str) -> Option<u32> {
        SYMBOLS
            .iter()
            .position(|s| *s == name)
            .map(|op| op as u32)
            .or_else(|| VARIANTS.iter().find(|(s, _)| *s == name).map(|&(_, op)| op))
    }

    /// Whether the operation gives a block back (its pointer is arg 0).
    pub const fn is_free(op: u32) -> bool {
        matches!(op, FREE | DELETE | DELETE_ARRAY | SDALLOCX | DALLOCX)
    }

    /// Whether the operation resizes a block (its pointer is arg 0, the
    /// new size arg 1).
    pub const fn is_resize(op: u32) -> bool {
        matches!(op, REALLOC | RALLOCX | XALLOCX)
    }
}

/// Syscalls the allocator makes, by our code (index into
/// [`programs::SYSCALL_ENTER`](crate::programs::SYSCALL_ENTER)).
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

/// Index in [`maps::ALLOC_CTL`](crate::maps::ALLOC_CTL) of the window
/// generation: per-thread call state from an earlier window (whose return
/// probe was detached) is stale.
pub const ALLOC_CTL_GENERATION: u32 = 0;

/// Byte size of the allocator event ring buffer. At 72 bytes an event,
/// 16 MiB holds about 230k calls: more than a second of the fastest traced
/// allocator (each call traps twice, ~3 µs) on every CPU of a small machine.
pub const ALLOC_RING_BYTES: u32 = 16 << 20;
/// As [`SAMPLES_WAKEUP_BYTES`](crate::SAMPLES_WAKEUP_BYTES), for the
/// allocator ring.
pub const ALLOC_WAKEUP_BYTES: u64 = (ALLOC_RING_BYTES / 4) as u64;
/// Threads whose in-progress allocator call or syscall can be remembered;
/// the futex and kernel-lock waits in progress are kept per thread in
/// maps of the same size.
pub const ALLOC_THREADS_CAPACITY: u32 = 16 * 1024;

/// [`AllocEvent::kind`] / [`SyscallEvent::kind`]: the two records share
/// the allocator ring and are told apart by this first field
/// ([`record_kind`]).
pub const EVENT_ALLOC: u32 = 1;
pub const EVENT_SYSCALL: u32 = 2;
/// [`AllocStackEvent`]: an allocation whose call chain was sampled.
pub const EVENT_ALLOC_STACK: u32 = 3;
/// [`AllocCpuEvent`]: a CPU sample that landed in the allocator's code.
pub const EVENT_ALLOC_CPU: u32 = 4;

/// Mean bytes allocated between two allocations whose call chain is
/// copied (jemalloc's and tcmalloc's byte sampling): each thread counts
/// down a gap drawn from an exponential distribution with this mean, and
/// the allocation that crosses zero is sampled. An allocation of `s`
/// bytes is then sampled with probability `1 - exp(-s / mean)`, whatever
/// came before it, which makes the weighted samples an unbiased heap
/// profile.
pub const ALLOC_SAMPLE_MEAN_BYTES: u64 = 512 << 10;
/// Quantiles of that distribution, written by the loader into
/// [`maps::ALLOC_SAMPLE_GAPS`](crate::maps::ALLOC_SAMPLE_GAPS) (the
/// programs have no logarithm); a gap is one of them, drawn at random.
pub const ALLOC_SAMPLE_GAPS: u32 = 256;
/// Most call chains copied per second (over all CPUs); samples beyond are
/// counted ([`counter::ALLOC_STACKS_CAPPED`](crate::counter)), and each
/// chain sent carries those held back since the one before it
/// ([`AllocStackEvent::held_back`]): the loader weights it by them, so a
/// phase that allocates faster than the cap is not under-counted against
/// a slower one.
pub const ALLOC_STACKS_PER_S: u64 = 1000;
/// Most chains copied per second (over all CPUs, in a bucket of as many)
/// for calls from return addresses the loader has not classified yet
/// ([`alloc_flag::UNCLASSIFIED`]): a return address is classified within
/// a few milliseconds of its first call (which wakes the loader), so
/// this holds a burst of new sites; calls beyond keep the wrapper's
/// line as their site, counted
/// ([`counter::ALLOC_SITE_CHAINS_CAPPED`](crate::counter)).
pub const ALLOC_SITE_CHAINS_PER_S: u64 = 20_000;
/// User stack words copied with a sampled allocation, from the caller's
/// stack pointer: enough for the frames of several wrappers.
pub const ALLOC_STACK_WORDS: usize = 64;

/// An allocation whose call chain was sampled: the call's record, the
/// caller's registers right after the call returned, and the top of its
/// stack (unwound by the loader).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocStackEvent {
    /// `kind` is [`EVENT_ALLOC_STACK`].
    pub call: AllocEvent,
    /// The return address (the caller's next instruction), stack and
    /// frame pointers after the return.
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Sampled chains the per-second cap held back since the last one
    /// sent (over all CPUs): this one stands for them too. 0 for chains
    /// sent for an unclassified return address only.
    pub held_back: u64,
    pub stack: [u64; ALLOC_STACK_WORDS],
}

/// A CPU sample whose instruction was in the allocator's code (a range
/// of [`maps::ALLOC_TEXT`](crate::maps::ALLOC_TEXT)), with the thread's
/// registers and the top of its stack: the loader unwinds it to the
/// allocation call that is spending the time (the site's share of the
/// allocator's CPU), which the frame-pointer walk of the sample cannot
/// (glibc's and the allocators' code keeps no frame pointer).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocCpuEvent {
    /// [`EVENT_ALLOC_CPU`].
    pub kind: u32,
    pub tid: u32,
    pub tgid: u32,
    pub _pad: u32,
    pub time_ns: u64,
    /// The sampled instruction, stack and frame pointers.
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Stack words from `sp` up (zero when they could not be read).
    pub stack: [u64; ALLOC_STACK_WORDS],
}

/// An executable range of the allocator's object in one process (values
/// of [`maps::ALLOC_TEXT`](crate::maps::ALLOC_TEXT)).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TextRange {
    pub start: u64,
    pub end: u64,
}

/// Processes whose allocator's code range the sampler checks.
pub const ALLOC_TEXT_CAPACITY: u32 = 1024;

/// One allocator call, from entry to return.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocEvent {
    /// [`EVENT_ALLOC`].
    pub kind: u32,
    /// [`alloc_op`] code.
    pub op: u32,
    pub tid: u32,
    /// Page faults the thread took during the call.
    pub page_faults: u32,
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
    /// The entry program's own run time, up to `start_ns`: how fast this
    /// CPU ran the probe at this call. The probes' added latency moves
    /// with it (a VM's vCPU runs slower at times), so the loader scales
    /// the calibrated cost by it.
    pub pace_ns: u32,
    /// [`alloc_flag`] bits.
    pub flags: u32,
    /// The return address past the allocation wrappers: where the first
    /// caller that is not a wrapper ([`ALLOC_SITES`](crate::maps::ALLOC_SITES))
    /// resumes; `caller` itself when the caller is no wrapper, 0 for frees
    /// and when not known.
    pub outer: u64,
}

/// Bits of [`AllocEvent::flags`].
pub mod alloc_flag {
    /// The call's chain was sampled by bytes (the heap profile's).
    pub const SAMPLED: u32 = 1;
    /// A return address on the way out of the wrappers was not yet
    /// classified by the loader: `outer` is the last one reached, and
    /// the chain is sent (as the per-second cap allows) so the loader can
    /// find the site itself.
    pub const UNCLASSIFIED: u32 = 2;
    /// The first call from a return address the kernel had not met: the
    /// record wakes the loader, so the address is classified at once.
    pub const NEW_SITE: u32 = 4;
}

/// Return addresses the kernel follows out of allocation wrappers.
pub const ALLOC_SITES_CAPACITY: u32 = 16384;
/// Wrappers passed over per call (a wrapper of a wrapper of a wrapper).
pub const ALLOC_WRAPPER_DEPTH: usize = 4;

/// What the kernel does at a return address of an allocation call
/// (value of [`ALLOC_SITES`](crate::maps::ALLOC_SITES), keyed by the
/// return address): nothing for a plain call site, or, for a call inside
/// an allocation wrapper (a function that returns what the call
/// returned), how to find the wrapper's own return address from the
/// call-frame information at the call: `CFA = base + cfa_offset`, the
/// return address at `CFA + ra_offset`, the caller's frame pointer saved
/// at `CFA + bp_offset` (0: not saved, unchanged).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiteRule {
    /// [`site_base`].
    pub base: u32,
    pub cfa_offset: i32,
    pub ra_offset: i32,
    pub bp_offset: i32,
}

/// Values of [`SiteRule::base`].
pub mod site_base {
    /// A call site that names the allocation: no wrapper.
    pub const PLAIN: u32 = 0;
    /// The wrapper's CFA is its stack pointer plus the offset (the stack
    /// pointer after the call returns: the callee's CFA).
    pub const SP: u32 = 1;
    /// The wrapper's CFA is its frame pointer plus the offset.
    pub const BP: u32 = 2;
    /// Met by the kernel, not classified by the loader yet.
    pub const PENDING: u32 = 3;
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

/// Per-thread kernel-side statistics (values of
/// [`maps::KERNEL_STATS`](crate::maps::KERNEL_STATS)).
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

/// The `kind` field every allocator-ring record starts with.
pub fn record_kind(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?))
}

// The kernel writes these structs and userspace reads them; a change in
// size is a layout change both sides must see.
const _: () = assert!(core::mem::size_of::<AllocEvent>() == 88);
const _: () = assert!(core::mem::size_of::<SiteRule>() == 16);
const _: () = assert!(core::mem::size_of::<SyscallEvent>() == 72);
const _: () = assert!(core::mem::size_of::<KernelStats>() == 40);
const _: () = assert!(core::mem::size_of::<AllocStackEvent>() == 120 + 8 * ALLOC_STACK_WORDS);
const _: () = assert!(core::mem::size_of::<AllocCpuEvent>() == 48 + 8 * ALLOC_STACK_WORDS);
const _: () = assert!(core::mem::size_of::<TextRange>() == 16);

// SAFETY: all seven are `#[repr(C)]` and made of integers only, naturally
// aligned so without padding (sizes asserted above): `AllocEvent` is four
// u32, seven u64, two u32 and a u64, `SyscallEvent` four u32, two u64,
// `[u64; 4]` and an i64, `KernelStats` five u64, `AllocStackEvent` an
// `AllocEvent` and u64s, `AllocCpuEvent` four u32 and u64s, `TextRange`
// two u64, `SiteRule` a u32 and three i32. Any bit pattern is a valid
// value.
records!(
    AllocEvent,
    SyscallEvent,
    KernelStats,
    AllocStackEvent,
    AllocCpuEvent,
    TextRange,
    SiteRule
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_kind_tells_the_allocator_ring_records_apart() {
        let call = AllocEvent {
            kind: EVENT_ALLOC,
            op: alloc_op::REALLOC,
            ptr: 0x10,
            ..AllocEvent::default()
        };
        let mut bytes = [0u8; 88];
        bytes[..4].copy_from_slice(&call.kind.to_ne_bytes());
        bytes[4..8].copy_from_slice(&call.op.to_ne_bytes());
        bytes[32..40].copy_from_slice(&call.ptr.to_ne_bytes());
        assert_eq!(record_kind(&bytes), Some(EVENT_ALLOC));
        assert_eq!(AllocEvent::from_bytes(&bytes), Some(call));
        assert_eq!(AllocEvent::from_bytes(&bytes[..87]), None);
        assert_eq!(record_kind(&bytes[..3]), None);

        bytes[..4].copy_from_slice(&EVENT_SYSCALL.to_ne_bytes());
        let sys = SyscallEvent::from_bytes(&bytes).map(|s| (s.kind, s.nr));
        assert_eq!(sys, Some((EVENT_SYSCALL, alloc_op::REALLOC)));
    }

    #[test]
    fn every_entry_point_names_one_operation() {
        use alloc_op::*;
        assert_eq!(of_symbol("malloc"), Some(MALLOC));
        assert_eq!(of_symbol("sdallocx"), Some(SDALLOCX));
        assert_eq!(of_symbol("_ZdlPvm"), Some(DELETE));
        assert_eq!(of_symbol("_ZnamSt11align_val_t"), Some(NEW_ARRAY));
        assert_eq!(of_symbol("mi_free"), None);
        // A variant keeps its operation's arguments: frees take the
        // pointer first, news the size.
        for (name, op) in VARIANTS {
            assert!(!SYMBOLS.contains(&name), "{name}");
            let delete = name.starts_with("_Zd");
            assert_eq!(is_free(op), delete, "{name}");
            assert!(
                matches!(op, NEW | NEW_ARRAY | DELETE | DELETE_ARRAY),
                "{name}"
            );
        }
        assert!(is_free(DALLOCX) && is_resize(XALLOCX) && !is_free(MALLOCX));
    }
}

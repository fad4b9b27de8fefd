//! Types shared by the kernel programs (`memprof-ebpf`) and the userspace
//! loader (`memprof`).
//!
//! Everything here is `#[repr(C)]` with fixed-size integer fields only, so
//! both sides agree on the layout byte for byte; sizes are checked at compile
//! time. Map names, program names and capacities live here too, so the two
//! sides never spell them differently.
//!
//! One file per family of programs, named as the `memprof-ebpf` file that
//! produces its records: [`sampler`] (CPU samples), [`threads`] (thread
//! creation and exit), [`alloc`] (allocator calls and its syscalls),
//! [`futex`] (futex calls and kernel lock waits), [`locks`] (pthread lock
//! uprobes) and [`sharing`] (the per-cache-line table); [`procs`] says which processes
//! are traced and how shared memory is keyed across them. Names shared by
//! every family are in [`programs`], [`maps`], [`globals`] and [`counter`];
//! [`Record`] decodes the records.
#![no_std]

pub mod alloc;
pub mod counter;
pub mod futex;
pub mod globals;
pub mod locks;
pub mod maps;
pub mod procs;
pub mod programs;
mod record;
pub mod sampler;
pub mod sharing;
pub mod threads;

// The sampler, thread, allocator and futex items are also reachable from
// the crate root, where the loader imports them.
pub use self::alloc::*;
pub use futex::*;
pub use record::Record;
pub use sampler::*;
pub use threads::*;

/// Every program we load has a name starting with this prefix, so leftover
/// programs are easy to spot with `bpftool prog show`.
pub const PROGRAM_PREFIX: &str = "mp_";

/// How often the loader drains the ring buffers without a wake-up (the
/// programs wake it only once a good part of a ring is waiting).
pub const DRAIN_INTERVAL_MS: u64 = 100;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_names_fit_the_kernel_limit_and_share_the_prefix() {
        for name in programs::ALL {
            assert!(name.len() <= 15, "{name} is longer than BPF_OBJ_NAME_LEN-1");
            assert!(name.starts_with(PROGRAM_PREFIX));
        }
    }
}

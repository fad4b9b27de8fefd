//! memprof-ebpf's kernel programs.
//!
//! Thin by design: each program filters to the target process, copies what
//! it saw into a map or ring buffer, and returns. All interpretation happens
//! in userspace (`memprof`).
#![no_std]
#![no_main]
// `atomic_xadd`: `core` offers no atomic add on the BPF target, whose
// instruction set has one (the contention counters need it).
#![feature(core_intrinsics)]
#![allow(internal_features)]

mod alloc;
mod futex;
mod locks;
mod maps;
mod sampler;
mod sharing;
mod threads;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any program that could reach this; it is here
    // only because `no_std` binaries must name a panic handler.
    loop {}
}

// SAFETY (link_section, no_mangle): the loader reads the license from this
// section under this name; nothing else is placed there.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

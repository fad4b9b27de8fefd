//! Pure analyses over plain event structs: no BPF, no I/O, unit-tested.

pub mod alloc;
pub mod memory;
pub mod profile;

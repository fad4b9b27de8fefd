//! Pure analyses over plain event structs: no BPF, no I/O, unit-tested.

pub mod memory;
pub mod profile;

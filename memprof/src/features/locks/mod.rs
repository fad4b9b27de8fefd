//! Locks: contention seen from the kernel and critical sections from the
//! lock functions.

pub mod analysis;
pub mod report;
pub mod tracer;

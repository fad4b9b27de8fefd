//! The allocator: calls, latencies, sites and memory overhead.

pub mod allocator;
pub mod analysis;
pub mod memory;
pub mod report;
pub mod tracer;

//! False sharing: sampled data accesses per cache line.

pub mod analysis;
pub mod report;

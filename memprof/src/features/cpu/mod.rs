//! CPU time: where the target's threads spend their samples.

pub mod profile;

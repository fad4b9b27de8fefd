//! The kernel side: system checks, the BPF loader, uprobe windows and
//! their budget.

pub mod budget;
pub mod loader;
pub mod precise;
pub mod preflight;
pub mod rings;
pub mod tracefs;
pub mod windows;

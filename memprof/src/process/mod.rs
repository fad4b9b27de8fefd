//! The traced process as the rest of the program sees it: its handle
//! (attached or launched), where its addresses lie ([`maps`], with
//! [`maps::Place`]), what `/proc` says of it ([`procfs`]), and the state
//! every feature shares while it runs ([`state::Process`]).
//!
//! The pure analyses, the report and the symbolizer name places in the
//! target through this module.

pub mod cgroup;
pub mod chunks;
pub mod command;
#[cfg(test)]
pub mod fake_memory;
pub mod files;
pub mod group;
pub mod handle;
pub mod holders;
pub mod launch;
pub mod maps;
pub mod objects;
pub mod procfs;
pub mod state;
pub mod threads;

//! The target's object files: code, call-frame information, symbols.

pub mod debugfile;
pub mod debuginfod;
pub mod files;
pub mod symbolize;
pub mod symbols;
pub mod unwind;
pub mod walk;
pub mod x86;

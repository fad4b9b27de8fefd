//! The target's object files: code, call-frame information, symbols.

pub mod code;
pub mod symbolize;
pub mod unwind;
pub mod x86;

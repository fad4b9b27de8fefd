//! x86-64 instruction decoding.

pub mod access;
pub mod calls;
pub mod pointer;
pub mod prologue;
pub mod slice;
pub mod wrapper;

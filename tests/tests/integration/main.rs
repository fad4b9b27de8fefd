//! The root-only integration tests, one module per suite, in one binary:
//! memprof is linked once, not once per suite.
//!
//! `cargo xtask test` runs each module on its own (its tests by exact
//! name), one after another, as separate binaries ran before; each
//! module's comment says what it checks. One suite by hand:
//! `cargo test -p memprof-tests --test integration locks:: -- --test-threads=1`.

mod allocator;
mod allocator_discovery;
mod cache;
mod containers;
mod demo;
mod export;
mod foundation;
mod heap;
mod links;
mod locks;
mod naming;
mod safety;
mod sharing;
mod tui;
mod ulcp;

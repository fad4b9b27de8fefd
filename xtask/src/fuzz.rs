//! `cargo xtask fuzz`: the parser fuzz targets of `memprof/tests/fuzz.rs`
//! (which `cargo xtask test` runs for 2 s each), for longer and optimised.
//!
//! The build is the release profile with overflow checks kept on (a
//! `fuzz` profile defined on the command line, built in `target/fuzz/`):
//! an overflow on a length read from a file is a bug the fuzzer must see,
//! not a value that silently wraps. `memprof` keeps its debug info, which
//! the DWARF targets take their seed from.

use std::process::Command;

use anyhow::{bail, Context, Result};

/// Runs every fuzz target (or those whose name contains `only`) for
/// `seconds` each.
pub fn run(seconds: u64, seed: Option<&str>, only: Option<&str>) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.args([
        "test",
        "--config",
        "profile.fuzz.inherits=\"release\"",
        "--config",
        "profile.fuzz.overflow-checks=true",
        // The DWARF and symbol targets' seed is the test's own debug info.
        "--config",
        "profile.fuzz.package.memprof.debug=2",
        "--profile",
        "fuzz",
        "--package",
        "memprof",
        "--test",
        "fuzz",
        "--",
        "--nocapture",
        "--test-threads=1",
    ]);
    if let Some(only) = only {
        cmd.arg(only);
    }
    cmd.current_dir(super::root())
        .env("MEMPROF_FUZZ_SECS", seconds.to_string());
    if let Some(seed) = seed {
        cmd.env("MEMPROF_FUZZ_SEED", seed);
    }
    println!(
        "fuzz: {seconds} s per target; crashing inputs go to target/fuzz-crashes/ \
         (replay one with MEMPROF_FUZZ_REPLAY=<file> cargo test -p memprof --test fuzz)"
    );
    let status = cmd.status().context("running cargo test")?;
    if !status.success() {
        bail!("fuzzing found a problem ({status})");
    }
    Ok(())
}

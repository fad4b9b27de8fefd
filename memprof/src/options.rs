//! How a session is run, as the command line asked: what every part of
//! the program reads and none of them owns.

use std::time::Duration;

use crate::{
    cli::{AllocMode, LockMode},
    process::{handle::TargetSpec, launch},
};

/// How a session is run.
#[derive(Debug)]
pub struct Options {
    pub target: TargetSpec,
    /// The other `-p` pids (or the cgroup's other processes).
    pub extra_pids: Vec<u32>,
    /// `--cgroup`: the cgroup traced, whose processes are the pids.
    pub cgroup: Option<crate::process::cgroup::Cgroup>,
    /// Trace the children the traced processes fork.
    pub follow_children: bool,
    /// Turn on BPF run-time statistics for the session.
    pub bpf_stats: bool,
    pub duration: Option<Duration>,
    pub frequency_hz: u64,
    /// Where a launched command's output goes.
    pub command_output: launch::Output,
    /// Whom a launched command runs as (`-u`).
    pub run_as: Option<launch::RunAs>,
    /// Allocator tracing.
    pub alloc: AllocSettings,
    /// `--lock-mode`.
    pub lock_mode: LockMode,
    /// `--push`, `--push-every`, `--app`.
    pub push: Option<crate::report::push::PushSettings>,
    /// The report needs the CPU call chains (`--pprof`, `--flamegraph`,
    /// `--push`).
    pub export_stacks: bool,
}

/// Allocator tracing, from the command line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AllocSettings {
    pub mode: AllocMode,
    /// `--alloc-large-threshold`.
    pub large_threshold: Option<u64>,
    /// Allowed slowdown as a fraction (0.05 = 5%).
    pub budget: f64,
}

impl Default for AllocSettings {
    fn default() -> Self {
        Self {
            mode: AllocMode::Sampled,
            large_threshold: None,
            budget: 0.05,
        }
    }
}

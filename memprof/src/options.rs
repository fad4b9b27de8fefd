//! How a session is run, as the command line asked: what every part of
//! the program reads and none of them owns.

use std::time::Duration;

use memprof_common::alloc_op;

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
    /// `--sample-freq`, if given (else [`crate::kernel::sampler::frequency`]
    /// picks it).
    pub frequency_hz: Option<u64>,
    /// `--sampler`.
    pub sampler: crate::cli::SamplerChoice,
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
    /// The `MEMPROF_*` switches for experiments and benchmarks.
    pub experimental: Experimental,
}

/// Allocator tracing, from the command line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AllocSettings {
    pub mode: AllocMode,
    /// `--alloc-large-threshold`.
    pub large_threshold: Option<u64>,
    /// Allowed slowdown as a fraction (0.05 = 5%).
    pub budget: f64,
    /// Allocations' call chains are sampled (not with
    /// `MEMPROF_ALLOC_CHAINS=off`).
    pub chains: bool,
    /// The probes' cost is measured at start and taken off the latencies
    /// (not with `MEMPROF_ALLOC_CALIBRATION=off`).
    pub calibrate: bool,
    /// `MEMPROF_ALLOC_OPS`: only these operations are probed (bit `op`).
    pub only_ops: Option<u32>,
}

impl Default for AllocSettings {
    fn default() -> Self {
        Self {
            mode: AllocMode::Sampled,
            large_threshold: None,
            budget: 0.05,
            chains: true,
            calibrate: true,
            only_ops: None,
        }
    }
}

/// Switches for experiments and benchmarks, kept off the command line:
/// each turns a part off to measure what it costs, or forces a fallback a
/// newer kernel would not take. Read once, from `MEMPROF_*` variables,
/// when the options are made; nothing else reads the environment for them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Experimental {
    /// `MEMPROF_CACHE_USE=off`: no cache-use analysis.
    pub cache_use_off: bool,
    /// `MEMPROF_ULCP=off`: no unnecessary-contention analysis.
    pub ulcp_off: bool,
    /// `MEMPROF_ALLOC_CHAINS=off`: no sampled allocation call chains.
    pub alloc_chains_off: bool,
    /// `MEMPROF_ALLOC_CALIBRATION=off`: the allocator probes' cost is not
    /// measured, and latencies keep it.
    pub alloc_calibration_off: bool,
    /// `MEMPROF_ALLOC_OPS=malloc,free`: probe only these operations (bit
    /// `op` of [`alloc_op::SYMBOLS`]).
    pub alloc_ops: Option<u32>,
    /// `MEMPROF_UPROBE_LINKS=single`: one link per probe point, as on
    /// kernels before 6.6.
    pub single_uprobe_links: bool,
    /// `MEMPROF_FUTEX_HOOKS=syscalls`: futex waits at the futex syscalls,
    /// as on kernels before 5.18.
    pub syscall_futex_hooks: bool,
}

/// Each switch: its variable and the one value it takes.
const SWITCHES: [(&str, &str); 6] = [
    ("MEMPROF_CACHE_USE", "off"),
    ("MEMPROF_ULCP", "off"),
    ("MEMPROF_ALLOC_CHAINS", "off"),
    ("MEMPROF_ALLOC_CALIBRATION", "off"),
    ("MEMPROF_UPROBE_LINKS", "single"),
    ("MEMPROF_FUTEX_HOOKS", "syscalls"),
];

impl Experimental {
    /// The switches set in this process's environment.
    pub fn from_env() -> Result<Self, String> {
        Self::parse(|name| std::env::var(name).ok())
    }

    /// The switches `var` names; a value a switch does not take is an
    /// error (a misspelt `of` would otherwise measure the wrong thing).
    pub fn parse(var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let mut on = [false; SWITCHES.len()];
        for ((name, value), on) in SWITCHES.iter().zip(&mut on) {
            match var(name) {
                None => {}
                Some(v) if v == *value => *on = true,
                Some(v) => return Err(format!("{name}={v}: the only value it takes is {value}")),
            }
        }
        let alloc_ops = var("MEMPROF_ALLOC_OPS").map(|v| ops_mask(&v)).transpose()?;
        let [cache_use_off, ulcp_off, alloc_chains_off, alloc_calibration_off, single_uprobe_links, syscall_futex_hooks] =
            on;
        Ok(Self {
            cache_use_off,
            ulcp_off,
            alloc_chains_off,
            alloc_calibration_off,
            alloc_ops,
            single_uprobe_links,
            syscall_futex_hooks,
        })
    }

    /// A note for each switch set (a report made with a part left out, or
    /// a fallback forced, says so).
    pub fn notes(&self) -> Vec<String> {
        let on = [
            self.cache_use_off,
            self.ulcp_off,
            self.alloc_chains_off,
            self.alloc_calibration_off,
            self.single_uprobe_links,
            self.syscall_futex_hooks,
        ];
        let mut set: Vec<String> = SWITCHES
            .iter()
            .zip(on)
            .filter(|(_, on)| *on)
            .map(|((name, value), _)| format!("experimental switch {name}={value} is set"))
            .collect();
        if let Some(mask) = self.alloc_ops {
            let ops: Vec<&str> = (0..alloc_op::COUNT)
                .filter(|op| mask & (1 << op) != 0)
                .map(|op| alloc_op::SYMBOLS[op as usize])
                .collect();
            let ops = ops.join(",");
            set.push(format!(
                "experimental switch MEMPROF_ALLOC_OPS={ops} is set"
            ));
        }
        set
    }

    /// The allocator settings the command line asked for, with these
    /// switches.
    pub fn alloc(&self, from_cli: AllocSettings) -> AllocSettings {
        AllocSettings {
            chains: !self.alloc_chains_off,
            calibrate: !self.alloc_calibration_off,
            only_ops: self.alloc_ops,
            ..from_cli
        }
    }
}

/// `malloc,free` as a set of operations.
fn ops_mask(names: &str) -> Result<u32, String> {
    let mut mask = 0;
    for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let Some(op) = alloc_op::SYMBOLS.iter().position(|s| *s == name) else {
            let known = alloc_op::SYMBOLS.join(", ");
            return Err(format!(
                "MEMPROF_ALLOC_OPS: no operation {name} (known: {known})"
            ));
        };
        mask |= 1 << op;
    }
    Ok(mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<Experimental, String> {
        Experimental::parse(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn nothing_set_is_the_default() {
        assert_eq!(parse(&[]), Ok(Experimental::default()));
        assert!(Experimental::default().notes().is_empty());
    }

    #[test]
    fn each_switch_sets_its_field() {
        let e = parse(&[
            ("MEMPROF_ULCP", "off"),
            ("MEMPROF_UPROBE_LINKS", "single"),
            ("MEMPROF_ALLOC_OPS", "free, malloc,"),
        ])
        .unwrap();
        assert!(e.ulcp_off && e.single_uprobe_links);
        assert!(!e.cache_use_off && !e.syscall_futex_hooks && !e.alloc_chains_off);
        let mask = (1 << alloc_op::MALLOC) | (1 << alloc_op::FREE);
        assert_eq!(e.alloc_ops, Some(mask));
        let alloc = e.alloc(AllocSettings::default());
        assert_eq!(
            (alloc.only_ops, alloc.chains, alloc.calibrate),
            (Some(mask), true, true)
        );
        let notes = e.notes().join("; ");
        assert_eq!(
            notes,
            "experimental switch MEMPROF_ULCP=off is set; \
             experimental switch MEMPROF_UPROBE_LINKS=single is set; \
             experimental switch MEMPROF_ALLOC_OPS=malloc,free is set"
        );
    }

    #[test]
    fn a_value_a_switch_does_not_take_is_an_error() {
        let e = parse(&[("MEMPROF_CACHE_USE", "of")]).unwrap_err();
        assert!(
            e.contains("MEMPROF_CACHE_USE=of") && e.contains("off"),
            "{e}"
        );
        let e = parse(&[("MEMPROF_ALLOC_OPS", "malloc,mallocz")]).unwrap_err();
        assert!(e.contains("mallocz"), "{e}");
    }
}

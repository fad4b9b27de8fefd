//! What the profiler's own programs cost the system: the records read from
//! their rings (counted in [`super::rings`]) and, while the kernel keeps
//! BPF run-time statistics, how long and how often each program ran.

use std::{os::fd::OwnedFd, path::Path};

use aya::sys::{enable_stats, Stats};

use super::loader::Probes;

/// The switch the kernel keeps run-time statistics under (1: on).
const SYSCTL: &str = "proc/sys/kernel/bpf_stats_enabled";

/// Whether the kernel counts our programs' run time, and who turned that
/// on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatsState {
    /// We turned it on for the session (`BPF_ENABLE_STATS`).
    EnabledByUs,
    /// It was on system-wide before we started.
    AlreadyOn,
    /// Not counted; why.
    Unavailable(String),
}

impl StatsState {
    /// The report's `bpf_stats` value.
    pub fn label(&self) -> String {
        match self {
            StatsState::EnabledByUs => "enabled by memprof".into(),
            StatsState::AlreadyOn => "already on".into(),
            StatsState::Unavailable(why) => format!("unavailable: {why}"),
        }
    }

    /// Whether the programs' run times are being counted.
    pub fn counting(&self) -> bool {
        !matches!(self, StatsState::Unavailable(_))
    }
}

/// Run-time statistics for the session: the kernel counts while the
/// descriptor `BPF_ENABLE_STATS` returned is open, and stops (unless
/// someone else asked too) when it is closed ([`BpfStats::close`], or
/// the drop).
pub struct BpfStats {
    fd: Option<OwnedFd>,
    pub state: StatsState,
}

impl BpfStats {
    /// Turns the statistics on when `ask`ed (before the programs load, so
    /// their counts cover them from the start). Also taken when they are
    /// already on, so that no one turning them off mid-session stops our
    /// counts.
    pub fn enable(root: &Path, ask: bool) -> Self {
        let already_on = std::fs::read_to_string(root.join(SYSCTL))
            .is_ok_and(|v| v.trim() != "0" && !v.trim().is_empty());
        if !ask {
            return Self {
                fd: None,
                state: if already_on {
                    StatsState::AlreadyOn
                } else {
                    StatsState::Unavailable("not turned on (--no-bpf-stats)".into())
                },
            };
        }
        match enable_stats(Stats::RunTime) {
            Ok(fd) => Self {
                fd: Some(fd),
                state: if already_on {
                    StatsState::AlreadyOn
                } else {
                    StatsState::EnabledByUs
                },
            },
            Err(_) if already_on => Self {
                fd: None,
                state: StatsState::AlreadyOn,
            },
            Err(e) => Self {
                fd: None,
                state: StatsState::Unavailable(format!(
                    "the kernel refused BPF_ENABLE_STATS ({})",
                    e.io_error
                )),
            },
        }
    }

    /// Lets the kernel stop counting (the state still says how the
    /// session's figures were taken).
    pub fn close(&mut self) {
        self.fd = None;
    }
}

/// How often and how long one of our programs ran so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramRun {
    pub name: String,
    pub runs: u64,
    pub run_ns: u64,
}

impl Probes {
    /// The summed runs and run time of the programs named `names` so
    /// far (zero while the kernel keeps no statistics).
    pub fn runs_of(&self, names: &[&str]) -> (u64, u64) {
        names
            .iter()
            .filter_map(|name| self.ebpf.program(name)?.info().ok())
            .map(|info| {
                let ns = u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX);
                (info.run_count(), ns)
            })
            .fold((0, 0), |(r, n), (runs, ns)| (r + runs, n + ns))
    }

    /// Each loaded program's run count and time so far (zero while the
    /// kernel keeps no statistics).
    pub fn program_runs(&self) -> Vec<ProgramRun> {
        let mut runs: Vec<ProgramRun> = self
            .ebpf
            .programs()
            .filter_map(|(name, prog)| {
                // Programs never loaded (features left off) have no info.
                let info = prog.info().ok()?;
                Some(ProgramRun {
                    name: name.to_string(),
                    runs: info.run_count(),
                    run_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
                })
            })
            .collect();
        // The same programs loaded for uprobe_multi links run instead.
        for (name, count, ns) in self.multi.iter().flat_map(|m| m.runs()) {
            if let Some(run) = runs.iter_mut().find(|r| r.name == name) {
                run.runs += count;
                run.run_ns += ns;
            }
        }
        runs.sort_by(|a, b| a.name.cmp(&b.name));
        runs
    }
}

/// What the programs cost so far, as the report reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelCost {
    /// Records read from each ring.
    pub rings: Vec<(String, u64)>,
    /// The report's `bpf_stats` value.
    pub bpf_stats: String,
    /// Each program's runs, when the kernel counted them.
    pub programs: Option<Vec<ProgramRun>>,
    /// How the hot uprobes were linked.
    pub links: Option<super::uprobes::LinkMode>,
    /// How futex waits were hooked.
    pub futex_hooks: Option<super::hooks::FutexHooks>,
}

#[cfg(test)]
impl KernelCost {
    /// Two rings, two programs, the statistics turned on by the tool (for
    /// the report's fixtures).
    pub fn sample() -> Self {
        let run = |name: &str, runs, run_ns| ProgramRun {
            name: name.into(),
            runs,
            run_ns,
        };
        Self {
            rings: vec![("samples".into(), 2_500), ("lock_events".into(), 50_000)],
            bpf_stats: "enabled by memprof".into(),
            programs: Some(vec![
                run("cpu_sample", 5_000, 4_000_000),
                run("futex_exit", 60_000, 21_000_000),
            ]),
            links: Some(super::uprobes::LinkMode {
                kind: "uprobe_multi",
                why: None,
            }),
            futex_hooks: Some(super::hooks::FutexHooks {
                kind: "sched",
                why: None,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_label_as_the_schema_says() {
        assert_eq!(StatsState::EnabledByUs.label(), "enabled by memprof");
        assert_eq!(StatsState::AlreadyOn.label(), "already on");
        let off = StatsState::Unavailable("no".into());
        assert_eq!(off.label(), "unavailable: no");
        assert!(!off.counting() && StatsState::AlreadyOn.counting());
    }

    #[test]
    fn left_off_they_count_only_when_already_on() {
        let root = tempfile::tempdir().unwrap();
        let sysctl = root.path().join(SYSCTL);
        std::fs::create_dir_all(sysctl.parent().unwrap()).unwrap();
        std::fs::write(&sysctl, "1\n").unwrap();
        assert_eq!(
            BpfStats::enable(root.path(), false).state,
            StatsState::AlreadyOn
        );
        std::fs::write(&sysctl, "0\n").unwrap();
        let off = BpfStats::enable(root.path(), false);
        assert_eq!(
            off.state.label(),
            "unavailable: not turned on (--no-bpf-stats)"
        );
        assert!(off.fd.is_none());
    }
}

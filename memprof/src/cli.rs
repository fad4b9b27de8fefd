//! Command-line interface.

use std::{path::PathBuf, time::Duration};

use clap::{ArgGroup, Parser};

use crate::error::exit_code;

/// Default CPU sampling frequency. Odd so it does not beat against
/// timer-driven work in the target (perf uses 4000; we aim at ≤2% overhead).
pub const DEFAULT_SAMPLE_FREQ: u64 = 999;
/// Upper bound for `--sample-freq`; the kernel's own limit
/// (`kernel.perf_event_max_sample_rate`) may be lower and is checked too.
pub const MAX_SAMPLE_FREQ: u64 = 50_000;

const AFTER_HELP: &str = concat!(
    "Examples:\n",
    "  sudo memprof-ebpf -p 1234                 live dashboard (q or Ctrl-C quits)\n",
    "  sudo memprof-ebpf -p 1234 --duration 30s  trace 30 s, print a ranked summary\n",
    "  sudo memprof-ebpf --json out.json -- ./prog arg   launch ./prog and trace it\n",
    "\n",
    "Without a terminal on stdout, or with --duration, no dashboard is shown: the\n",
    "tool traces until the duration ends, the target exits or Ctrl-C, then prints\n",
    "the summary. A launched command that outlives the session gets SIGTERM.\n",
    "\n",
    "Environment:\n",
    "  DEBUGINFOD_URLS     debuginfod servers to fetch missing debug files from\n",
    "                      (keep it under sudo: sudo DEBUGINFOD_URLS=... memprof-ebpf)\n",
    "  DEBUGINFOD_TIMEOUT  seconds per request and for the wait at the end (30)\n",
    "\n",
    "Exit status:\n",
    "  0  success\n",
    "  1  internal failure (a bug or an unexpected system error; see the message)\n",
    "  2  usage error (bad or conflicting arguments)\n",
    "  3  no such process (a -p PID does not exist or exited before attach)\n",
    "  4  insufficient privilege (run as root, or with CAP_BPF and CAP_PERFMON)\n",
    "  5  the kernel lacks a needed feature (BTF, tracefs, perf events, ...)\n",
    "  6  the command to launch could not be found or run\n",
);

/// Find false sharing, allocator and lock problems in a running process.
///
/// Attaches eBPF programs to a process (or launches a command), samples its
/// threads, and shows what it finds live or as a summary. Needs root.
#[derive(Debug, Parser)]
#[command(name = "memprof-ebpf", version, after_help = AFTER_HELP)]
#[command(group(ArgGroup::new("target").required(true).args(["pid", "cgroup", "command"])))]
pub struct Cli {
    /// Attach to the running process PID (all its threads, also those it
    /// creates later), or to several processes: `-p 1,2,3` (the first is
    /// the main one: the session ends when it exits). CPU sampling and
    /// false sharing cover every traced process (lines of MAP_SHARED
    /// memory are matched across them); the allocator and lock probes
    /// trace the main process only.
    #[arg(short, long, value_name = "PID[,PID...]", value_parser = parse_pid_list)]
    pub pid: Option<PidList>,

    /// Trace every process of a cgroup (v2) and the cgroups below it,
    /// including those started in it later (from their `exec`, checked
    /// in the kernel by cgroup id): a systemd unit name (`redis.service`),
    /// a path relative to the cgroup v2 mount, or its directory. The
    /// lowest pid is the main one (the allocator and lock probes trace
    /// it); the session ends when the cgroup has no process left.
    #[arg(long, value_name = "PATH|UNIT")]
    pub cgroup: Option<String>,

    /// Do not trace the processes the traced ones fork (by default their
    /// children are followed from their first instruction, as `perf
    /// record` does, for CPU sampling and false sharing).
    #[arg(long)]
    pub no_children: bool,

    /// Do not turn on the kernel's BPF run-time statistics. By default
    /// they are on while tracing, to report how long the profiler's
    /// programs ran; while on they time every BPF program on the machine.
    #[arg(long)]
    pub no_bpf_stats: bool,

    /// Trace for this long, then print the summary and exit (e.g. 30s, 2m,
    /// 1m30s). Without it, trace until Ctrl-C or the target exits.
    #[arg(short, long, value_name = "TIME", value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// Also write the findings as a versioned JSON report to FILE
    /// ("-" for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Also write the findings as pprof profiles (gzip-compressed
    /// profile.proto, for `go tool pprof`, Pyroscope, Parca, speedscope):
    /// one per concern, FILE with `{kind}` replaced by cpu, alloc, lock and
    /// sharing, or FILE.cpu.pb.gz and so on.
    #[arg(long, value_name = "FILE")]
    pub pprof: Option<PathBuf>,

    /// Also draw interactive SVG flame graphs of CPU samples, allocated
    /// bytes and lock delay: FILE with `{kind}` replaced by cpu, alloc and
    /// lock, or FILE.cpu.svg and so on.
    #[arg(long, value_name = "FILE")]
    pub flamegraph: Option<PathBuf>,

    /// Experimental: send the pprof profiles to a Pyroscope-compatible
    /// server (its ingest API, `URL/ingest`) at the end of the session.
    #[arg(long, value_name = "URL")]
    pub push: Option<String>,

    /// With --push: also push every TIME while tracing (e.g. 10s); each
    /// push carries the previous one so the server keeps intervals apart.
    #[arg(long, value_name = "TIME", value_parser = parse_duration, requires = "push")]
    pub push_every: Option<Duration>,

    /// With --push: the application name (default: the target's program).
    #[arg(long, value_name = "NAME", requires = "push")]
    pub app: Option<String>,

    /// CPU samples per second per CPU [default: 999; 99 when attached to
    /// a process whose threads switch more than 50 k times a second on a
    /// machine where a timer interrupt costs 5 µs or more, as in a VM:
    /// there each interrupt stalls the threads' hand-offs]
    #[arg(
        long,
        value_name = "HZ",
        value_parser = clap::value_parser!(u64).range(1..=MAX_SAMPLE_FREQ),
    )]
    pub sample_freq: Option<u64>,

    /// What interrupts the target to take CPU samples: `timer`, a perf
    /// timer of the tool's own (at --sample-freq); `tick`, the kernel's
    /// scheduler tick (CONFIG_HZ, 250 on Debian), which interrupts busy
    /// CPUs anyway, so sampling adds no interrupt; `auto`, the tick where
    /// the timer would stall the target's hand-offs (an attached process
    /// that switches more than 50 k times a second, on a machine where an
    /// interrupt costs 5 µs or more, as in a VM) and --sample-freq is not
    /// given, the timer otherwise
    #[arg(long, value_name = "SOURCE", value_enum, default_value_t = SamplerChoice::Auto)]
    pub sampler: SamplerChoice,

    /// How to trace the allocator's calls: `sampled` attaches its probes in
    /// windows sized to keep the target's slowdown within --budget (counts
    /// are then scaled estimates); `full` traces every call (exact, but each
    /// call costs a few microseconds); `off` leaves the allocator alone.
    /// Its syscalls (mmap, munmap, brk, madvise...) are traced in windows
    /// of their own in `sampled` mode (a syscall hook slows every syscall
    /// of the machine), always in `full`; page faults always unless `off`.
    #[arg(long, value_name = "MODE", value_enum, default_value_t = AllocMode::Sampled)]
    pub alloc_mode: AllocMode,

    /// Blocks larger than BYTES are "large" (default: the allocator's own
    /// rule: glibc's mmap threshold, read per block; jemalloc 14 KiB;
    /// tcmalloc 256 KiB; mimalloc and others 128 KiB).
    #[arg(long, value_name = "BYTES")]
    pub alloc_large_threshold: Option<u64>,

    /// How to trace pthread lock calls (acquisitions, time to take a
    /// lock, hold times): `sampled` attaches the lock and unlock probes in
    /// windows within a share of --budget (counts are scaled estimates);
    /// `full` traces every call (a few microseconds each); `off` leaves
    /// them alone. Contention (futex waits, their wakers, kernel lock
    /// waits) is always traced, from the scheduler's hooks: it costs
    /// nothing on uncontended locks, and on very contended ones a governor
    /// traces one wait in N (counts are then estimates with a claimed
    /// error).
    #[arg(long, value_name = "MODE", value_enum, default_value_t = LockMode::Sampled)]
    pub lock_mode: LockMode,

    /// Overhead budget, in percent of the target's time, for everything
    /// the tool attaches that it can thin out: the allocator's probes
    /// (aiming at 40% of it) and syscall hooks (10%), the lock probes
    /// (24%), and the always-on contention hooks (25%, sampled by the
    /// governor).
    #[arg(
        long,
        value_name = "PERCENT",
        default_value_t = 5.0,
        value_parser = parse_budget,
    )]
    pub budget: f64,

    /// Never show the live dashboard, even on a terminal.
    #[arg(long)]
    pub no_tui: bool,

    /// More log output (-v info, -vv debug, -vvv trace). Logs go to stderr;
    /// while the dashboard is on screen they are kept in memory, the newest
    /// shown at its bottom, and printed to stderr when it closes.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Write logs to FILE instead (created with mode 0600; never through a
    /// symbolic link). No log file is written unless asked for.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,

    /// Write the launched command's output (stdout and stderr; stdin is
    /// /dev/null) to FILE. Without it the command uses the terminal, except
    /// under the dashboard, where its output is captured (the last 64 KiB)
    /// and printed after the dashboard closes.
    #[arg(long, value_name = "FILE")]
    pub command_output: Option<PathBuf>,

    /// Run the launched command as USER (name or uid), with that user's
    /// uid, primary and supplementary groups, and HOME, USER and LOGNAME
    /// (the rest of the environment is kept). Needs root. Default: the
    /// credentials the profiler runs with.
    #[arg(short, long, value_name = "USER")]
    pub user: Option<String>,

    /// The command to launch and trace from its first instruction.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `--sampler`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SamplerChoice {
    Auto,
    Timer,
    Tick,
}

/// `--alloc-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AllocMode {
    Full,
    Sampled,
    Off,
    /// Benchmarks only: probes that do nothing, at the same places as
    /// `full`, to measure the cost of the traps alone.
    #[value(hide = true)]
    Floor,
}

impl AllocMode {
    pub fn name(self) -> &'static str {
        match self {
            AllocMode::Full => "full",
            AllocMode::Sampled => "sampled",
            AllocMode::Off => "off",
            AllocMode::Floor => "floor",
        }
    }
}

/// `--lock-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LockMode {
    Full,
    Sampled,
    Off,
}

impl LockMode {
    pub fn name(self) -> &'static str {
        match self {
            LockMode::Full => "full",
            LockMode::Sampled => "sampled",
            LockMode::Off => "off",
        }
    }
}

/// The pids of `-p`: the main one first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PidList(pub Vec<u32>);

fn parse_pid_list(s: &str) -> Result<PidList, String> {
    let mut pids = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(format!(
                "empty pid in list `{s}` (expected PID or PID,PID,...)"
            ));
        }
        let pid: u32 = part
            .parse()
            .map_err(|_| format!("`{part}` is not a process id (in `{s}`)"))?;
        if pid == 0 {
            return Err("pid 0 is not a process".into());
        }
        if pids.contains(&pid) {
            return Err(format!("pid {pid} is given twice"));
        }
        pids.push(pid);
    }
    Ok(PidList(pids))
}

fn parse_budget(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("not a number: {s}"))?;
    if (0.1..=100.0).contains(&v) {
        Ok(v)
    } else {
        Err("the budget must be between 0.1 and 100 (percent)".into())
    }
}

impl Cli {
    /// The exit code clap uses for usage errors; kept equal to ours.
    pub const USAGE_EXIT: i32 = exit_code::USAGE;
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (try 10s, 2m, 1h)"))?;
    if d.is_zero() {
        return Err("the duration must be longer than zero".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn pid_and_duration_parse() {
        let cli = Cli::try_parse_from(["memprof-ebpf", "-p", "42", "--duration", "1m30s"]).unwrap();
        assert_eq!(cli.pid, Some(PidList(vec![42])));
        assert_eq!(cli.duration, Some(Duration::from_secs(90)));
        assert_eq!(cli.sample_freq, None, "the sampler picks its rate");
    }

    #[test]
    fn command_after_double_dash() {
        let cli = Cli::try_parse_from(["memprof-ebpf", "--", "./prog", "-x", "1"]).unwrap();
        assert_eq!(cli.command, ["./prog", "-x", "1"]);
        assert_eq!(cli.pid, None);
    }

    #[test]
    fn a_target_is_required_and_only_one() {
        assert!(Cli::try_parse_from(["memprof-ebpf"]).is_err());
        assert!(Cli::try_parse_from(["memprof-ebpf", "-p", "1", "--", "ls"]).is_err());
    }

    #[test]
    fn pid_lists_parse_with_the_main_pid_first() {
        let cli = Cli::try_parse_from(["memprof-ebpf", "-p", "7,3, 9"]).unwrap();
        let pids = cli.pid.unwrap();
        assert_eq!(pids.0, [7, 3, 9], "in the order given, the main one first");
        assert!(!cli.no_children);
        let cli = Cli::try_parse_from(["memprof-ebpf", "--no-children", "--", "ls"]).unwrap();
        assert!(cli.no_children);
    }

    #[test]
    fn bad_pid_lists_are_usage_errors_that_say_why() {
        for (list, says) in [
            ("1,,2", "empty pid"),
            ("1,", "empty pid"),
            ("1,x", "`x` is not a process id"),
            ("1,-2", "`-2` is not a process id"),
            ("4,4", "given twice"),
            ("0", "pid 0"),
        ] {
            let err = Cli::try_parse_from(["memprof-ebpf", "-p", list]).unwrap_err();
            assert_eq!(err.exit_code(), Cli::USAGE_EXIT, "{list}");
            assert!(err.to_string().contains(says), "{list}: {err}");
        }
    }

    #[test]
    fn bad_values_are_rejected() {
        assert!(Cli::try_parse_from(["memprof-ebpf", "-p", "1", "--duration", "0s"]).is_err());
        assert!(Cli::try_parse_from(["memprof-ebpf", "-p", "1", "--duration", "soon"]).is_err());
        assert!(Cli::try_parse_from(["memprof-ebpf", "-p", "1", "--sample-freq", "0"]).is_err());
        assert!(
            Cli::try_parse_from(["memprof-ebpf", "-p", "1", "--sample-freq", "1000000"]).is_err()
        );
    }
}

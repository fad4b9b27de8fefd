//! The CPU sampler's perf events: one per traced thread, or one per CPU.
//!
//! Per thread the timer runs only while a traced thread runs, and threads
//! the traced ones start later inherit the event and its program. Per CPU
//! it runs all the time, idle CPUs included, and the program drops what
//! is not ours. Which one costs the target less depends on how its events
//! came to be, measured on this project's VMs (2 vCPUs, `haltpoll` idle,
//! no PMU, 999 Hz):
//!
//! - **A launched command** inherits one event from its first thread, so
//!   its threads' perf contexts are clones, and the kernel swaps them at a
//!   context switch between two of them instead of stopping one timer and
//!   starting the other. Per thread costs a futex hand-off loop (`locks
//!   contended_bench 2`) 1.24x and a lock/yield loop 1.03x; per CPU 1.70x
//!   and 1.59x (idle CPUs woken by the timer), bpftrace's `profile:hz:999`
//!   alike. Launched commands are sampled per thread.
//! - **Attached with `-p`**, each running thread gets an event of its own:
//!   no clones, so every context switch of a traced thread stops its timer
//!   and starts the next one (on a VM, reprogramming the timer traps to
//!   the hypervisor: the likely reason it costs this much, inferred, not
//!   measured apart). Debian `sysbench threads --threads=2 --thread-locks=2` pinned to
//!   one CPU (two threads taking turns with `sched_yield`) kept **0.11** of
//!   its throughput per thread (`perf record -p` alike: 0.10 at 1 ms, 0.29
//!   at 10 ms) and 0.93 per CPU; `sysbench threads --threads=4
//!   --thread-locks=1` 0.67-0.75 per thread and 0.79-0.88 per CPU; a
//!   contended 2-thread mutex and a spinning thread nothing either way.
//!   But per CPU every process takes the interrupts, idle CPUs are woken,
//!   and `redis-server` under a `redis-benchmark` on the same machine
//!   (14 k switches a second) kept 0.95 per thread and 0.85 per CPU
//!   (medians of 4 rounds). So an attached process is sampled per CPU
//!   only when its threads switch more than [`SWITCHY_PER_S`] times a
//!   second, counted over the start-up's interrupt measure (`sysbench`:
//!   190-540 k, pinned: 890 k). The threshold sits between the three
//!   programs measured, not on a model.
//!
//! Per CPU too for `--cgroup`, whose processes come and go, and beyond
//! [`MAX_THREAD_EVENTS`].
//!
//! Per CPU or per thread, such a switchy attached target still pays for
//! the rate: `sysbench threads --threads=4 --thread-locks=1` attached
//! (per CPU, 186 k switches a second, 13.6 µs an interrupt) kept 0.69-0.71
//! of its throughput at 999 Hz, 0.74-0.83 at 300 Hz, 0.90-0.97 at 100 Hz
//! and 0.89-1.01 at 1 Hz (control 0.91-1.08; medians of seconds 7-12 of
//! a `--report-interval 1` run, 3-4 runs each), with the lock and
//! allocator probes off as well as on: ~150 µs of its progress lost per
//! interrupt, ten times the interrupt's own cost. Its threads hold the
//! lock across `sched_yield`; an interrupt that lands on the holder, or
//! on a CPU a waiter is being woken to, stretches a hand-off all wait
//! for. So when the threshold above makes the sampler per CPU and an
//! interrupt costs [`SLOW_INTERRUPT_NS`] or more (a VM: bare metal takes
//! one or two µs), the rate is [`SWITCHY_FREQUENCY_HZ`] unless
//! `--sample-freq` says otherwise, and the report says so: ten times
//! fewer samples, over the same seconds.
//!
//! **Or no timer at all** ([`Tick`], `--sampler tick`): the scheduler
//! tick interrupts every busy CPU `CONFIG_HZ` times a second (250 on
//! Debian) whatever runs, and a program on `timer:hrtimer_expire_entry`
//! for the tick's handler samples the thread it lands on from the user
//! registers saved at its entry to the kernel. Measured here (2026-12-06,
//! `locks contended_bench 2 1600000`, 1,600 ns a section untraced): a
//! `perf record -e cpu-clock` timer per thread costs it 6% even at 1 Hz
//! (the switch cost above, with cloned contexts too when a thread sleeps
//! and another CPU wakes), 10% at 99 Hz, 23% at 999 Hz; per CPU nothing
//! at 1-10 Hz, 5% at 49 Hz, 10% at 99 Hz; bpftrace counting the tick's
//! expiries of the same target nothing (1,602-1,613 ns) and saw 95% of
//! the ticks its threads' CPU time predicts. The tool's default mode went
//! from 0.79 to 0.90 of untraced with the tick (5 alternating rounds).
//! It is the `auto` choice where the timer's rate is lowered above, not
//! everywhere: 250 Hz is a quarter of 999, and a run of the integration
//! tests with the tick on every VM lost the allocator's CPU-time counts
//! (claimed error over ±30%), a read-mostly table's lines and two of the
//! five unnecessary-contention classes to too few samples.

use aya::programs::{
    perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy},
    PerfEvent, ProgramError,
};

use super::detach::OwnedLinks;
use crate::cli::{SamplerChoice, DEFAULT_SAMPLE_FREQ};
use crate::process::procfs::{context_switches, list_threads};

/// Context switches a second of an attached target's threads from which
/// it is sampled per CPU (see the module's measurements).
pub const SWITCHY_PER_S: f64 = 50_000.0;

/// The sampling rate for an attached target sampled per CPU for its
/// switches, on a machine of slow interrupts (see the module's
/// measurements).
pub const SWITCHY_FREQUENCY_HZ: u64 = 99;

/// An interrupt this costly is a hypervisor's (this project's VMs: 12-16
/// µs; bare metal: 1-2).
pub const SLOW_INTERRUPT_NS: f64 = 5_000.0;

/// Most per-thread events opened (a file descriptor each); beyond, the
/// sampler is per CPU.
pub const MAX_THREAD_EVENTS: usize = 4096;

/// How the CPU sampler is attached.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    pub frequency_hz: u64,
    /// [`frequency`] lowered the default rate (never an asked one).
    pub lowered: bool,
    /// Hardware cycles when the machine has a PMU.
    pub try_hardware: bool,
    pub scope: SamplerScope,
    pub measured: StartMeasures,
    /// Sampling on the scheduler tick instead of a timer of our own
    /// (`frequency_hz` is then its rate).
    pub tick: Option<Tick>,
}

/// What the sampler measured at start-up, before the programs load.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StartMeasures {
    /// What one `cpu-clock` interrupt costs the thread it lands on, ns
    /// ([`super::interrupts`]).
    pub interrupt_ns: Option<f64>,
    /// An attached target's context switches a second (what chose the
    /// scope), None when launched or for `--cgroup`.
    pub switches_per_s: Option<f64>,
}

impl Sampling {
    /// For the main process `pid` and `others`, `launched` or attached to,
    /// in `opts`' cgroup or not: the scope from [`per_cpu`] and
    /// [`SamplerScope::choose`], the rate `--sample-freq`'s or else
    /// [`frequency`]'s.
    pub fn new(
        opts: &crate::options::Options,
        try_hardware: bool,
        pid: u32,
        others: &[u32],
        launched: bool,
    ) -> crate::error::Result<Self> {
        let (asked_hz, cgroup) = (opts.frequency_hz, opts.cgroup.is_some());
        let tgids: Vec<u32> = std::iter::once(pid).chain(others.iter().copied()).collect();
        let counted = |tgids: &[u32]| {
            let at = std::time::Instant::now();
            (at, tgids.iter().map(|&t| context_switches(t)).sum::<u64>())
        };
        let before = (!launched && !cgroup).then(|| counted(&tgids));
        // First: threads the target starts after they are listed (below)
        // would get no event of their own.
        let (interrupt_ns, measured) = super::interrupts::cost();
        if before.is_some() && !measured {
            // The switches are counted over as long as a measure takes.
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let switches_per_s = before.and_then(|(t0, n0)| {
            let (t1, n1) = counted(&tgids);
            let secs = t1.duration_since(t0).as_secs_f64();
            (secs > 0.0).then(|| n1.saturating_sub(n0) as f64 / secs)
        });
        tracing::info!("target context switches at start-up: {switches_per_s:?} a second");
        let cpus =
            aya::util::online_cpus().map_err(|(what, e)| anyhow::anyhow!("reading {what}: {e}"))?;
        let per_cpu = per_cpu(launched, cgroup, switches_per_s);
        let switchy = per_cpu && !cgroup;
        let frequency_hz = frequency(asked_hz, switchy, interrupt_ns);
        let lowered = asked_hz.is_none() && frequency_hz != DEFAULT_SAMPLE_FREQ;
        let tick = choose_tick(opts.sampler, asked_hz, lowered, try_hardware, Tick::find)?;
        let scope = match tick {
            // No event to open; samples land on the running threads.
            Some(_) => SamplerScope::Threads(Vec::new()),
            None => SamplerScope::choose(&tgids, per_cpu, cpus, list_threads),
        };
        Ok(Self {
            frequency_hz: tick.map_or(frequency_hz, |t| t.hz),
            lowered: lowered && tick.is_none(),
            try_hardware,
            scope,
            measured: StartMeasures {
                interrupt_ns,
                switches_per_s,
            },
            tick,
        })
    }

    /// What the report says of sampling on the tick.
    fn tick_note(&self) -> Option<String> {
        let tick = self.tick?;
        let why = match self.measured.switches_per_s {
            Some(s) if s > SWITCHY_PER_S => format!(
                ", where a timer of its own would stall the target's hand-offs (its threads \
                 switch {:.0} k times a second)",
                s / 1e3
            ),
            _ => String::new(),
        };
        Some(format!(
            "CPU samples taken on the kernel's {} Hz scheduler tick, which interrupts busy CPUs \
             anyway: the sampler adds no interrupt of its own{why}; --sampler timer and \
             --sample-freq set another rate",
            tick.hz
        ))
    }

    /// What the report says of a rate other than the default: a lowered
    /// one, or the tick's.
    pub fn lowered_note(&self) -> Option<String> {
        if !self.lowered {
            return self.tick_note();
        }
        let switches = self.measured.switches_per_s.unwrap_or(0.0);
        let ns = self.measured.interrupt_ns.unwrap_or(0.0);
        Some(format!(
            "CPU sampling at {} Hz, not {DEFAULT_SAMPLE_FREQ}: the target's threads switch {:.0} k times \
             a second and a timer interrupt costs {:.1} µs here, so each one stalls their \
             hand-offs (measured: an attached `sysbench threads` kept 0.70 of its \
             throughput at 999 Hz, 0.90-0.97 at 100 Hz); --sample-freq sets the rate",
            self.frequency_hz,
            switches / 1e3,
            ns / 1e3
        ))
    }
}

/// The sampling rate: `asked` (`--sample-freq`) if given; else
/// [`SWITCHY_FREQUENCY_HZ`] for an attached target sampled per CPU for
/// its switches (`switchy`) where an interrupt costs [`SLOW_INTERRUPT_NS`]
/// or more, [`DEFAULT_SAMPLE_FREQ`] otherwise (and when the interrupt's
/// cost is unknown: nothing says the rate costs more than its share).
pub fn frequency(asked: Option<u64>, switchy: bool, interrupt_ns: Option<f64>) -> u64 {
    match asked {
        Some(hz) => hz,
        None if switchy && interrupt_ns.is_some_and(|ns| ns >= SLOW_INTERRUPT_NS) => {
            SWITCHY_FREQUENCY_HZ
        }
        None => DEFAULT_SAMPLE_FREQ,
    }
}

/// Whether the sampler is per CPU whatever the thread count: for a
/// `cgroup`, and for an attached target whose threads switch more than
/// [`SWITCHY_PER_S`] times a second (their events would be no clones: see
/// the module's measurements).
pub fn per_cpu(launched: bool, cgroup: bool, switches_per_s: Option<f64>) -> bool {
    cgroup || (!launched && switches_per_s.is_some_and(|r| r > SWITCHY_PER_S))
}

/// The scheduler tick, as a sampling timer ([`SamplerChoice::Tick`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tick {
    /// The kernel's tick handler (the `function` of its hrtimer).
    pub function: u64,
    /// Ticks a second on a busy CPU (`CONFIG_HZ`).
    pub hz: u64,
}

/// The tick's hrtimer handler: `tick_nohz_handler` since Linux 6.9,
/// `tick_sched_timer` before.
const TICK_HANDLERS: [&str; 2] = ["tick_nohz_handler", "tick_sched_timer"];

impl Tick {
    /// The running kernel's tick: its handler's address (`/proc/kallsyms`,
    /// readable by root) and rate (the kernel's configuration); why not,
    /// when either is unknown or some CPUs run without a tick
    /// (`nohz_full`).
    pub fn find() -> Result<Tick, String> {
        let full = std::fs::read_to_string("/sys/devices/system/cpu/nohz_full").unwrap_or_default();
        if !matches!(full.trim(), "" | "(null)") {
            return Err(format!(
                "CPUs {} run without a tick (nohz_full)",
                full.trim()
            ));
        }
        let syms = std::fs::read_to_string("/proc/kallsyms")
            .map_err(|e| format!("cannot read /proc/kallsyms: {e}"))?;
        let function = kernel_symbol(&syms, &TICK_HANDLERS)
            .ok_or("the tick handler's address is not in /proc/kallsyms")?;
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let config = std::fs::read_to_string(format!("/boot/config-{}", release.trim()))
            .ok()
            .or_else(|| {
                let gz = std::fs::File::open("/proc/config.gz").ok()?;
                let mut text = String::new();
                std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(gz), &mut text)
                    .ok()?;
                Some(text)
            })
            .ok_or("the kernel's configuration (/boot/config-*, /proc/config.gz) is missing")?;
        let hz = config_hz(&config).ok_or("the kernel's configuration has no CONFIG_HZ")?;
        Ok(Tick { function, hz })
    }
}

/// The address of the first of `names` in `kallsyms` text (zero, as
/// unprivileged readers see it, is no address).
pub fn kernel_symbol(kallsyms: &str, names: &[&str]) -> Option<u64> {
    names.iter().find_map(|name| {
        kallsyms.lines().find_map(|line| {
            let mut f = line.split_whitespace();
            let (addr, _kind, sym) = (f.next()?, f.next()?, f.next()?);
            let addr = u64::from_str_radix(addr, 16).ok()?;
            (sym == *name && addr != 0).then_some(addr)
        })
    })
}

/// `CONFIG_HZ` of a kernel configuration.
pub fn config_hz(config: &str) -> Option<u64> {
    config
        .lines()
        .find_map(|l| l.strip_prefix("CONFIG_HZ="))
        .and_then(|v| v.trim().parse().ok())
        .filter(|&hz| hz > 0)
}

/// Whether to sample on the tick (`find` finds it): when asked
/// (`--sampler tick`; an error when `find` cannot, or with an `asked`
/// rate), or, `auto`, where [`frequency`] `lowered` the timer's rate for
/// a switchy target on slow interrupts and no hardware counter is tried:
/// there the tick gives more samples (`CONFIG_HZ`, 250 on Debian, against
/// [`SWITCHY_FREQUENCY_HZ`]) for no interrupt. Not everywhere: at 250 Hz
/// rather than 999, the analyses that need many samples (the allocator's
/// share of CPU time, a read-mostly table's lines, critical sections'
/// accesses) fell below what their tests ask.
pub fn choose_tick(
    choice: SamplerChoice,
    asked: Option<u64>,
    lowered: bool,
    try_hardware: bool,
    find: impl Fn() -> Result<Tick, String>,
) -> crate::error::Result<Option<Tick>> {
    use crate::error::Error;
    match choice {
        SamplerChoice::Timer => Ok(None),
        SamplerChoice::Tick if asked.is_some() => Err(Error::Usage(
            "--sampler tick samples at the kernel's tick rate: drop --sample-freq".into(),
        )),
        SamplerChoice::Tick => find().map(Some).map_err(|why| Error::KernelFeature {
            feature: "sampling on the scheduler tick",
            hint: format!("{why}; use --sampler timer"),
        }),
        SamplerChoice::Auto if lowered && asked.is_none() && !try_hardware => match find() {
            Ok(tick) => Ok(Some(tick)),
            Err(why) => {
                tracing::info!("sampling on the tick unavailable ({why}); using the timer");
                Ok(None)
            }
        },
        SamplerChoice::Auto => Ok(None),
    }
}

/// Attaches the tick sampler ([`Tick`]): one tracepoint, every CPU.
pub fn attach_tick(
    ebpf: &mut aya::Ebpf,
    owned: &mut OwnedLinks,
) -> crate::error::Result<super::loader::SamplingSource> {
    let (name, event) = (
        memprof_common::programs::TICK_SAMPLE,
        "hrtimer_expire_entry",
    );
    super::loader::attach_tracepoint_to(ebpf, owned, name, "timer", &[event])?;
    Ok(super::loader::SamplingSource::Tick)
}

/// Where the sampler's events are opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SamplerScope {
    /// One per online CPU, every process (the program filters).
    Cpus(Vec<u32>),
    /// One per thread, inherited by the threads and processes they start.
    Threads(Vec<u32>),
}

impl SamplerScope {
    /// Per thread for the threads of `tgids` now, unless there are more
    /// than [`MAX_THREAD_EVENTS`] or `per_cpu` is asked; per CPU then.
    /// `threads` lists a process's threads.
    pub fn choose(
        tgids: &[u32],
        per_cpu: bool,
        cpus: Vec<u32>,
        threads: impl Fn(u32) -> Vec<u32>,
    ) -> Self {
        if per_cpu {
            return Self::Cpus(cpus);
        }
        let tids: Vec<u32> = tgids.iter().flat_map(|&t| threads(t)).collect();
        if tids.is_empty() || tids.len() > MAX_THREAD_EVENTS {
            tracing::info!(
                "{} threads: CPU sampling per CPU rather than per thread",
                tids.len()
            );
            Self::Cpus(cpus)
        } else {
            Self::Threads(tids)
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::Cpus(_) => "per CPU",
            Self::Threads(_) => "per thread",
        }
    }

    /// Attaches `prog` to a `config` event in each place of the scope,
    /// all or none; the links go to `owned` as one (closed together).
    pub fn attach(
        &self,
        prog: &mut PerfEvent,
        config: PerfEventConfig,
        frequency_hz: u64,
        owned: &mut OwnedLinks,
    ) -> Result<(), ProgramError> {
        let (places, inherit) = match self {
            Self::Cpus(cpus) => (cpus, false),
            Self::Threads(tids) => (tids, true),
        };
        // A `cpu-clock` period is in nanoseconds: the rate is exact from
        // the first sample, where frequency mode starts each thread's
        // event from a guess and adjusts it as the thread runs.
        let policy = match config {
            PerfEventConfig::Software(_) => {
                SamplePolicy::Period(1_000_000_000 / frequency_hz.max(1))
            }
            _ => SamplePolicy::Frequency(frequency_hz),
        };
        let mut links = Vec::with_capacity(places.len());
        for &place in places {
            let scope = match self {
                Self::Cpus(_) => PerfEventScope::AllProcessesOneCpu { cpu: place },
                Self::Threads(_) => PerfEventScope::OneProcess {
                    pid: place,
                    cpu: None,
                },
            };
            match prog.attach(config, scope, policy, inherit) {
                Ok(link) => links.push(link),
                // A thread that exited since it was listed.
                Err(ProgramError::SyscallError(e))
                    if matches!(self, Self::Threads(_))
                        && e.io_error.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => {
                    for link in links {
                        let _ = prog.detach(link);
                    }
                    return Err(e);
                }
            }
        }
        let mut taken = Vec::with_capacity(links.len());
        for id in links {
            taken.push(prog.take_link(id)?);
        }
        owned.push(taken);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switchy_target_on_slow_interrupts_is_sampled_at_a_lower_rate() {
        let vm = Some(13_600.0);
        assert_eq!(frequency(None, true, vm), SWITCHY_FREQUENCY_HZ);
        assert_eq!(frequency(Some(999), true, vm), 999, "asked for");
        assert_eq!(frequency(Some(4999), false, vm), 4999);
        assert_eq!(frequency(None, false, vm), DEFAULT_SAMPLE_FREQ, "redis");
        assert_eq!(
            frequency(None, true, Some(1_500.0)),
            DEFAULT_SAMPLE_FREQ,
            "bare metal"
        );
        assert_eq!(frequency(None, true, None), DEFAULT_SAMPLE_FREQ, "unknown");
    }

    #[test]
    fn the_tick_is_found_in_kallsyms_and_the_kernel_config() {
        let syms = "0000000000000000 t tick_nohz_handler\n\
                    ffffffff81441150 T tick_handle_periodic\n\
                    ffffffff814437d0 t tick_sched_timer\n";
        assert_eq!(
            kernel_symbol(syms, &TICK_HANDLERS),
            Some(0xffffffff814437d0),
            "a zero address (unprivileged) is none; the older name then"
        );
        assert_eq!(
            kernel_symbol("ffffffff81000000 T _stext\n", &TICK_HANDLERS),
            None
        );
        assert_eq!(
            config_hz("# CONFIG_HZ_100 is not set\nCONFIG_HZ_250=y\nCONFIG_HZ=250\n"),
            Some(250)
        );
        assert_eq!(config_hz("CONFIG_HZ_PERIODIC=y\n"), None);
    }

    #[test]
    fn the_tick_samples_where_asked_or_where_the_timer_was_lowered() {
        let tick = Tick {
            function: 0xffffffff814437d0,
            hz: 250,
        };
        let found = || Ok(tick);
        let missing = || Err("no kallsyms".to_string());
        let auto = SamplerChoice::Auto;
        assert_eq!(
            choose_tick(auto, None, true, false, found).unwrap(),
            Some(tick)
        );
        assert_eq!(
            choose_tick(auto, None, false, false, found).unwrap(),
            None,
            "not switchy"
        );
        assert_eq!(
            choose_tick(auto, None, true, true, found).unwrap(),
            None,
            "a PMU"
        );
        assert_eq!(
            choose_tick(auto, None, true, false, missing).unwrap(),
            None,
            "fallback"
        );
        assert_eq!(
            choose_tick(auto, Some(99), true, false, found).unwrap(),
            None,
            "a rate"
        );
        let asked = SamplerChoice::Tick;
        assert_eq!(
            choose_tick(asked, None, false, true, found).unwrap(),
            Some(tick)
        );
        let err = choose_tick(asked, None, false, false, missing).unwrap_err();
        assert!(err.to_string().contains("no kallsyms"), "{err}");
        assert!(matches!(
            choose_tick(asked, Some(99), false, false, found),
            Err(crate::error::Error::Usage(_))
        ));
        assert_eq!(
            choose_tick(SamplerChoice::Timer, None, true, false, found).unwrap(),
            None
        );
    }

    #[test]
    fn per_cpu_for_a_cgroup_or_an_attached_target_that_switches_often() {
        let launched = "launched: inherited, cloned contexts";
        assert!(!per_cpu(true, false, None), "{launched}");
        assert!(!per_cpu(false, false, Some(14_000.0)), "redis under load");
        assert!(per_cpu(false, false, Some(194_000.0)), "sysbench threads");
        assert!(!per_cpu(false, false, None), "not counted");
        assert!(
            per_cpu(true, true, None) && per_cpu(false, true, None),
            "--cgroup"
        );
    }

    #[test]
    fn threads_of_the_traced_processes_unless_per_cpu_or_too_many() {
        let threads = |tgid| match tgid {
            10 => vec![10, 11, 12],
            20 => vec![20],
            1000 => (1000..1000 + MAX_THREAD_EVENTS as u32 + 1).collect(),
            _ => vec![],
        };
        let cpus = vec![0, 1];
        let choose =
            |tgids: &[u32], per_cpu| SamplerScope::choose(tgids, per_cpu, cpus.clone(), threads);
        assert_eq!(
            choose(&[10, 20], false),
            SamplerScope::Threads(vec![10, 11, 12, 20])
        );
        assert_eq!(
            choose(&[10], true),
            SamplerScope::Cpus(cpus.clone()),
            "asked (--cgroup)"
        );
        assert_eq!(
            choose(&[99], false),
            SamplerScope::Cpus(cpus.clone()),
            "gone: no thread to open an event on"
        );
        assert_eq!(
            choose(&[1000], false),
            SamplerScope::Cpus(cpus.clone()),
            "too many"
        );
    }
}

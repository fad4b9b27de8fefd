//! A profiling session: checks, target, probes, the event loop, the report.
//!
//! Data flows one way: probes → [`crate::collect`] → [`crate::analysis`] →
//! [`crate::report`] → (dashboard | summary | JSON).

use std::{
    io::IsTerminal,
    os::fd::{FromRawFd, OwnedFd},
    path::Path,
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use memprof_common::{locks::HoldEvent, maps, KernelStats, SampleEvent, TaskEvent};
use tokio::io::unix::AsyncFd;

use crate::features::{
    alloc::{
        allocator::{self, Allocator, AllocatorKind},
        report as alloc_report,
        tracer::{self as alloc, AllocTracer},
    },
    locks::{report as locks, tracer as lock_tracer},
    sharing::report as sharing,
};
use crate::kernel::{
    loader::{AllocLoad, Counters, Probes, SamplingSource},
    preflight, tracefs,
    windows::{self, Windowed},
};
use crate::process::launch::{self, Launched};
use crate::{
    cli::{AllocMode, LockMode},
    collect::{command_line, Collector},
    error::{Error, Result},
    features::alloc::analysis::AllocProfile,
    object::symbolize::Symbolizer,
    report::{
        model::{
            AddressMode, AddressSampling, Loader, SampleSource, Sampling, Target, ThreadEntry,
            FULLY_TRACED, SCHEMA,
        },
        Report,
    },
    tui::{Action, Dashboard},
};

/// Hot functions kept in a report.
const HOT_FUNCTIONS: usize = 50;
/// How often the dashboard refreshes.
const TICK: Duration = Duration::from_secs(1);
/// How long a launched command gets to exit after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(2);

/// What to trace.
#[derive(Debug, Clone)]
pub enum TargetSpec {
    Pid(u32),
    Command(Vec<String>),
}

/// How a session is run.
#[derive(Debug)]
pub struct Options {
    pub target: TargetSpec,
    pub duration: Option<Duration>,
    pub frequency_hz: u64,
    /// Where a launched command's output goes.
    pub command_output: launch::Output,
    /// Whom a launched command runs as (`-u`).
    pub run_as: Option<launch::RunAs>,
    /// Allocator tracing.
    pub alloc: alloc::AllocSettings,
    /// `--lock-mode`.
    pub lock_mode: LockMode,
}

/// Why tracing stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    DurationElapsed,
    Interrupted,
    TargetExited,
    UserQuit,
}

/// The traced process, and how we learn that it exited.
enum TargetHandle {
    Attached {
        pid: u32,
        exit: Option<AsyncFd<OwnedFd>>,
    },
    Launched(Launched),
}

impl TargetHandle {
    fn pid(&self) -> u32 {
        match self {
            TargetHandle::Attached { pid, .. } => *pid,
            TargetHandle::Launched(l) => l.pid,
        }
    }

    /// Resolves when the process has exited.
    async fn exited(&mut self) {
        match self {
            TargetHandle::Attached { exit: Some(fd), .. } => {
                // A pidfd becomes readable when the process exits.
                let _ = fd.readable().await;
            }
            TargetHandle::Attached { pid, exit: None } => loop {
                // No pidfd support: poll. Check first: the event loop
                // re-creates this future more often than it sleeps.
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            },
            TargetHandle::Launched(l) => l.wait().await,
        }
    }
}

/// Opens a pidfd for `pid`, registered with tokio.
fn pidfd(pid: u32) -> Result<Option<AsyncFd<OwnedFd>>> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ESRCH) {
            return Err(Error::NoSuchProcess { pid });
        }
        tracing::info!("pidfd_open unavailable ({err}); polling /proc for the target's exit");
        return Ok(None);
    }
    // SAFETY: the syscall returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    Ok(Some(readable(fd, "the pidfd")?))
}

/// Registers a file descriptor owner with tokio for readability.
fn readable<T: std::os::fd::AsRawFd>(inner: T, what: &str) -> Result<AsyncFd<T>> {
    // SAFETY: `inner` owns its descriptor (an OwnedFd or an aya map) and
    // keeps it open, unchanged, for as long as the AsyncFd holds it.
    unsafe { AsyncFd::register_with_interest(inner, tokio::io::Interest::READABLE) }.map_err(|e| {
        anyhow::anyhow!("registering {what} with the runtime: {}", e.into_parts().1).into()
    })
}

/// SIGINT (Ctrl-C) and SIGTERM, both of which end the session cleanly.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        let install =
            |kind| signal(kind).map_err(|e| anyhow::anyhow!("installing a signal handler: {e}"));
        Ok(Self {
            interrupt: install(SignalKind::interrupt())?,
            terminate: install(SignalKind::terminate())?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// Everything the live loop owns.
struct Live {
    signals: Signals,
    /// Notes from start-up, for the report.
    notes: Vec<String>,
    /// The attached programs; `None` once detached.
    probes: Option<Probes>,
    source: SamplingSource,
    /// "pebs" or "ibs" when precise memory events give the addresses.
    address_source: Option<&'static str>,
    collector: Collector,
    symbolizer: Symbolizer,
    samples: AsyncFd<RingBuf<MapData>>,
    tasks: AsyncFd<RingBuf<MapData>>,
    alloc_events: AsyncFd<RingBuf<MapData>>,
    lock_events: AsyncFd<RingBuf<MapData>>,
    /// Critical sections from the lock uprobes (None when they are off).
    holds: Option<AsyncFd<RingBuf<MapData>>>,
    /// The lock uprobes (None when off or no pthread library was found).
    lock_tracer: Option<Windowed>,
    /// The allocator probes (None when off or no allocator was found).
    tracer: Option<AllocTracer>,
    alloc_mode: AllocMode,
    /// Kernel-side statistics as read when the probes were detached.
    final_kernel: Vec<(u32, KernelStats)>,
    /// The kernel's shared-line state as read then, and the lines in its
    /// table.
    final_lines: sharing::KernelLines,
    final_lines_tracked: u64,
    /// Decoded recipes the kernel's map had no room for.
    recipes_dropped: usize,
    target: TargetHandle,
    command: String,
    frequency_hz: u64,
    started: Instant,
    /// How long we traced, once tracing has stopped.
    traced: Option<Duration>,
    target_exited: bool,
    /// The kernel counters as read when the probes were detached.
    final_counters: Counters,
    /// Whether to print progress on stderr (not while the dashboard is up).
    announce: bool,
}

/// Runs a whole session and returns its report. With a dashboard, it is
/// refreshed every second and its quit key ends the session.
/// The probes the kernel is still removing are returned with it: the
/// caller shows the report first, then waits for them before exiting.
pub async fn run(
    opts: Options,
    dashboard: Option<&mut Dashboard>,
) -> Result<(Report, StopReason, windows::Detaching)> {
    // Registered first, so a Ctrl-C or SIGTERM during start-up still ends
    // the session through the normal path (detach, summary).
    let signals = Signals::new()?;
    let mut notes = Vec::new();
    let root = Path::new("/");
    preflight::check_privilege(root)?;
    preflight::check_perf_events(root)?;
    preflight::check_btf(root)?;
    if let Some(max) = preflight::max_sample_rate(root) {
        if opts.frequency_hz > max {
            return Err(Error::Usage(format!(
                "--sample-freq {} is above the kernel's limit of {max} Hz \
                 (kernel.perf_event_max_sample_rate)",
                opts.frequency_hz
            )));
        }
    }
    let tracefs_dir = tracefs::ensure_mounted(root)?;
    preflight::raise_memlock_limit();

    let (target, command) = match &opts.target {
        TargetSpec::Pid(pid) => {
            let tgid = preflight::check_pid(root, *pid)?;
            if tgid != *pid {
                notes.push(format!(
                    "{pid} is a thread of process {tgid}: all of its threads are traced"
                ));
            }
            let exit = pidfd(tgid)?;
            let command = command_line(tgid).ok_or(Error::NoSuchProcess { pid: *pid })?;
            (TargetHandle::Attached { pid: tgid, exit }, command)
        }
        TargetSpec::Command(cmd) => (
            TargetHandle::Launched(Launched::spawn(
                cmd,
                &opts.command_output,
                opts.run_as.as_ref(),
            )?),
            cmd.join(" "),
        ),
    };
    let pid = target.pid();
    let launched = matches!(target, TargetHandle::Launched(_));
    let allocator = find_allocator(&opts, pid, &mut notes);
    let lock_library = find_lock_library(&opts, pid, &mut notes);

    // On any error from here on, dropping `target` kills a launched command
    // (kill_on_drop), so it never runs on untraced.
    let mut probes = Probes::attach(
        pid,
        &tracefs_dir,
        opts.frequency_hz,
        preflight::has_hardware_pmu(root),
        allocator.as_ref().map(|a| AllocLoad {
            glibc_header: a.kind == AllocatorKind::Glibc,
        }),
        lock_library.is_some(),
    )?;
    let samples = readable(probes.take_ring(maps::SAMPLES)?, "the sample ring buffer")?;
    let tasks = readable(probes.take_ring(maps::TASK_EVENTS)?, "the task ring buffer")?;
    let alloc_events = readable(
        probes.take_ring(maps::ALLOC_EVENTS)?,
        "the allocator ring buffer",
    )?;
    let lock_events = readable(probes.take_ring(maps::LOCK_EVENTS)?, "the lock ring buffer")?;
    let holds = match lock_library {
        Some(_) => Some(readable(
            probes.take_ring(maps::HOLD_EVENTS)?,
            "the critical-section ring buffer",
        )?),
        None => None,
    };
    let mut collector = Collector::new(pid);
    collector.precise_addresses = probes.precise.is_some();
    if let Some(why) = &probes.precise_error {
        notes.push(format!(
            "{why}: data addresses were computed by decoding timer samples instead"
        ));
    }
    if launched {
        collector.start_at_exec();
    }
    let tracer = match allocator {
        Some(allocator) => {
            let rule = alloc::large_rule(allocator.kind, opts.alloc.large_threshold);
            let glibc = allocator.kind == AllocatorKind::Glibc;
            collector.enable_alloc(AllocProfile::new(rule, launched, glibc));
            let mut tracer = AllocTracer::new(allocator, opts.alloc, pid);
            let started = tracer.open(&mut probes)?;
            collector.alloc_window(true, started);
            Some(tracer)
        }
        None => None,
    };
    let lock_tracer = match lock_library {
        Some(library) => {
            let mut tracer = lock_tracer::tracer(library, opts.lock_mode, opts.alloc.budget, pid);
            tracer.open(&mut probes)?;
            Some(tracer)
        }
        None => None,
    };

    let mut live = Live {
        signals,
        notes,
        source: probes.source,
        address_source: probes.precise,
        probes: Some(probes),
        collector,
        symbolizer: Symbolizer::new(),
        samples,
        tasks,
        alloc_events,
        lock_events,
        holds,
        lock_tracer,
        tracer,
        alloc_mode: opts.alloc.mode,
        final_kernel: Vec::new(),
        final_lines: Default::default(),
        final_lines_tracked: 0,
        recipes_dropped: 0,
        target,
        command,
        frequency_hz: opts.frequency_hz,
        started: Instant::now(),
        traced: None,
        target_exited: false,
        final_counters: Counters::default(),
        announce: dashboard.is_none() && std::io::stderr().is_terminal(),
    };
    if let TargetHandle::Launched(l) = &mut live.target {
        l.release()?;
    }
    // Everything that needs more than reading the target and re-attaching
    // probes is done: give up the rest (see `privilege`).
    let uprobe_windows = (live.tracer.is_some() && opts.alloc.mode == AllocMode::Sampled)
        || (live.lock_tracer.is_some() && opts.lock_mode == LockMode::Sampled);
    match crate::privilege::drop_after_attach(uprobe_windows) {
        Ok(kept) => tracing::info!("capabilities kept after attach: {}", kept.join(" ")),
        Err(e) => live
            .notes
            .push(format!("could not drop capabilities after attaching: {e}")),
    }
    tracing::info!("tracing pid {pid} with {} sampling", live.source.name());

    let reason = live.event_loop(opts.duration, dashboard).await?;
    live.finish(reason).await;
    if let TargetHandle::Launched(l) = &live.target {
        if live.collector.awaiting_exec() {
            if let Some(tracer) = &mut live.tracer {
                tracer.wait_detached();
            }
            if let Some(tracer) = &mut live.lock_tracer {
                tracer.wait_detached();
            }
            let status = l.status.map_or("unknown status".into(), |s| s.to_string());
            return Err(Error::LaunchFailed {
                command: live.command.clone(),
                reason: format!(
                    "it ended before the command started ({status}); see its message above"
                ),
            });
        }
    }
    let report = live.report();
    let mut detaching = live
        .tracer
        .as_mut()
        .map(|t| t.take_detaching())
        .unwrap_or_default();
    if let Some(t) = &mut live.lock_tracer {
        detaching.extend(t.take_detaching());
    }
    Ok((report, reason, detaching))
}

impl Live {
    async fn event_loop(
        &mut self,
        duration: Option<Duration>,
        mut dashboard: Option<&mut Dashboard>,
    ) -> Result<StopReason> {
        let deadline = duration.map(|d| tokio::time::Instant::now() + d);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Samples arrive without wake-ups (see SAMPLES_WAKEUP_BYTES).
        let mut drain =
            tokio::time::interval(Duration::from_millis(memprof_common::DRAIN_INTERVAL_MS));
        drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                guard = self.samples.readable_mut() => {
                    let mut guard = guard.map_err(|e| anyhow::anyhow!("polling samples: {e}"))?;
                    drain_samples(guard.get_inner_mut(), &mut self.collector);
                    guard.clear_ready();
                    self.install_recipes();
                }
                guard = self.tasks.readable_mut() => {
                    let mut guard = guard.map_err(|e| anyhow::anyhow!("polling task events: {e}"))?;
                    drain_tasks(guard.get_inner_mut(), &mut self.collector);
                    guard.clear_ready();
                }
                guard = self.lock_events.readable_mut() => {
                    let mut guard = guard.map_err(|e| anyhow::anyhow!("polling lock events: {e}"))?;
                    drain_tasks(self.tasks.get_mut(), &mut self.collector);
                    drain_locks(guard.get_inner_mut(), &mut self.collector);
                    guard.clear_ready();
                }
                guard = self.alloc_events.readable_mut() => {
                    let mut guard = guard.map_err(|e| anyhow::anyhow!("polling allocator events: {e}"))?;
                    drain_tasks(self.tasks.get_mut(), &mut self.collector);
                    drain_alloc(guard.get_inner_mut(), &mut self.collector);
                    guard.clear_ready();
                }
                guard = readable_opt(&mut self.holds) => {
                    let mut guard = guard.map_err(|e| anyhow::anyhow!("polling critical sections: {e}"))?;
                    drain_holds(guard.get_inner_mut(), &mut self.collector);
                    guard.clear_ready();
                }
                _ = sleep_until_instant(self.tracer.as_ref().and_then(|t| t.deadline())) => {
                    self.alloc_switch()?;
                }
                _ = sleep_until_instant(self.lock_tracer.as_ref().and_then(|t| t.deadline())) => {
                    self.lock_switch();
                }
                _ = drain.tick() => {
                    self.drain_all();
                    self.install_recipes();
                    // Soon after sampling, so the stack is read against the
                    // memory map it was taken in.
                    if let Some(probes) = &self.probes {
                        self.collector.read_stacks(|id| probes.stack(id));
                    }
                }
                _ = self.target.exited() => {
                    self.target_exited = true;
                    return Ok(StopReason::TargetExited);
                }
                _ = sleep_until(deadline) => return Ok(StopReason::DurationElapsed),
                _ = self.signals.recv() => return Ok(StopReason::Interrupted),
                action = next_action(dashboard.as_deref_mut()) => {
                    if action == Action::Quit {
                        return Ok(StopReason::UserQuit);
                    }
                }
                _ = tick.tick() => {
                    if let Some(probes) = &mut self.probes {
                        probes.flush_logs();
                    }
                    self.collector.settle();
                    if let Some(d) = dashboard.as_deref_mut() {
                        let report = self.report();
                        d.update(report);
                    }
                }
            }
        }
    }

    /// How many samples yielded a data address, and what the line table
    /// holds.
    fn address_sampling(&self, counters: &Counters) -> AddressSampling {
        let (decoded, usable) = self.collector.decoded_counts();
        // Walking the table is for the end; live, the lines created are
        // shown (evictions are known only then).
        let lines_tracked = match &self.probes {
            Some(_) => None,
            None => Some(self.final_lines_tracked),
        };
        AddressSampling {
            mode: if self.collector.precise_addresses {
                AddressMode::Precise
            } else {
                AddressMode::Decoded
            },
            user_samples: counters.user_samples,
            with_address: counters.addresses,
            no_operand: counters.no_operand,
            not_decoded: counters.no_recipe,
            address_share: counters.addresses as f64 / counters.user_samples.max(1) as f64,
            instructions_decoded: decoded,
            instructions_with_operand: usable,
            lines_tracked: lines_tracked.unwrap_or(counters.lines_new),
            lines_evicted: lines_tracked.map_or(0, |t| counters.lines_new.saturating_sub(t)),
        }
    }

    /// Gives the sampler the recipes of newly decoded instructions.
    fn install_recipes(&mut self) {
        if self.collector.take_recipes_reset() {
            if let Some(probes) = &mut self.probes {
                probes.clear_recipes();
            }
        }
        let new = self.collector.take_new_recipes();
        if let (false, Some(probes)) = (new.is_empty(), &mut self.probes) {
            self.recipes_dropped += probes.install_recipes(&new);
        }
    }

    /// The kernel's state of the lines the samples show shared.
    fn kernel_lines(&self) -> sharing::KernelLines {
        let Some(probes) = &self.probes else {
            return self.final_lines.clone();
        };
        sharing::KernelLines {
            lines: self
                .collector
                .sharing
                .candidates()
                .into_iter()
                .map(|line| (line, probes.line_state(line), probes.line_words(line)))
                .collect(),
        }
    }

    /// Ends or starts an allocator window when the controller says so.
    fn alloc_switch(&mut self) -> Result<()> {
        let (Some(tracer), Some(probes)) = (&mut self.tracer, &mut self.probes) else {
            return Ok(());
        };
        match tracer.on_deadline(probes) {
            Ok(Some(opened)) => self.collector.alloc_window(opened, alloc::ktime_ns()),
            Ok(None) => {}
            Err(e) => {
                // The allocator's file may be gone (e.g. upgraded): keep
                // tracing the rest rather than fail the session.
                tracing::warn!("cannot re-attach the allocator probes: {e}");
                self.notes
                    .push(format!("allocator probes could not be re-attached: {e}"));
                self.collector.alloc_window(false, alloc::ktime_ns());
                if let Some(probes) = &self.probes {
                    tracer.finish(probes);
                    tracer.wait_detached();
                }
            }
        }
        Ok(())
    }

    /// Ends or starts a lock window when the controller says so.
    fn lock_switch(&mut self) {
        let (Some(tracer), Some(probes)) = (&mut self.lock_tracer, &mut self.probes) else {
            return;
        };
        if let Err(e) = tracer.on_deadline(probes) {
            tracing::warn!("cannot re-attach the lock probes: {e}");
            self.notes
                .push(format!("lock probes could not be re-attached: {e}"));
            tracer.finish(probes);
        }
    }

    /// Hands every record waiting in the rings to the collector. Thread
    /// and exec events first: they decide how the records taken after them
    /// are read.
    fn drain_all(&mut self) {
        let collector = &mut self.collector;
        drain_tasks(self.tasks.get_mut(), collector);
        drain_alloc(self.alloc_events.get_mut(), collector);
        drain_locks(self.lock_events.get_mut(), collector);
        if let Some(holds) = &mut self.holds {
            drain_holds(holds.get_mut(), collector);
        }
        drain_samples(self.samples.get_mut(), collector);
    }

    /// Stops tracing: drains what the kernel still holds, detaches, and
    /// ends a launched command that is still running.
    async fn finish(&mut self, reason: StopReason) {
        self.traced = Some(self.started.elapsed());
        self.drain_all();
        if let (Some(tracer), Some(probes)) = (&mut self.lock_tracer, &self.probes) {
            tracer.finish(probes);
        }
        if let (Some(tracer), Some(probes)) = (&mut self.tracer, &self.probes) {
            if tracer.attached() {
                self.collector.alloc_window(false, alloc::ktime_ns());
            }
            // Starts detaching; the report is built and shown meanwhile
            // (the kernel takes a while), and the caller waits for the
            // detach before the process ends.
            tracer.finish(probes);
        }
        self.collector.settle();
        self.final_lines = self.kernel_lines();
        if let Some(mut probes) = self.probes.take() {
            self.final_lines_tracked = probes.lines_tracked();
            self.final_kernel = probes.kernel_stats();
            self.collector.read_stacks(|id| probes.stack(id));
            self.final_counters = probes.counters();
            probes.flush_logs();
            tracing::info!("stopping ({reason:?}); detaching");
            drop(probes); // detaches every program, before symbolization
        }
        if self.announce {
            eprintln!(
                "memprof-ebpf: detached; symbolizing {} addresses…",
                self.collector.profile.user_places().count()
            );
        }
        if let TargetHandle::Launched(l) = &mut self.target {
            if !self.target_exited {
                if let Some(pid) = l.child.id() {
                    // SAFETY: kill with a pid we spawned and have not reaped.
                    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
                }
                if tokio::time::timeout(TERM_GRACE, l.wait()).await.is_err() {
                    let _ = l.child.start_kill();
                    l.wait().await;
                    self.notes.push(
                        "the command ignored SIGTERM at the end of the session and was killed"
                            .into(),
                    );
                } else {
                    self.notes.push(
                        "the command was stopped with SIGTERM at the end of the session".into(),
                    );
                }
            }
        }
    }

    fn counters(&self) -> Counters {
        self.probes
            .as_ref()
            .map_or(self.final_counters, Probes::counters)
    }

    /// The report as of now.
    fn report(&mut self) -> Report {
        let duration_s = self
            .traced
            .unwrap_or_else(|| self.started.elapsed())
            .as_secs_f64();
        let counters = self.counters();
        let symbolizer = &mut self.symbolizer;
        let hot_functions = self
            .collector
            .profile
            .hot_functions(HOT_FUNCTIONS, |place| symbolizer.code(place))
            .into_iter()
            .map(Into::into)
            .collect();
        let names = self.collector.thread_names().clone();
        let profile = &self.collector.profile;
        let mut threads: Vec<ThreadEntry> = profile
            .threads()
            .iter()
            .map(|(&tid, t)| ThreadEntry {
                tid,
                name: names.get(&tid).cloned().unwrap_or_default(),
                samples: t.samples,
                created_by: t.created_by,
                exited: t.exited,
            })
            .collect();
        threads.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.tid.cmp(&b.tid)));

        let mut notes = self.notes.clone();
        if self.target_exited {
            notes.push(format!("the target exited after {duration_s:.1} s"));
        }
        let lost_samples = counters.samples_lost + self.collector.dropped;
        if counters.lost() + self.collector.dropped > 0 {
            notes.push(format!(
                "{lost_samples} samples and {} thread events were lost (ring buffer full or busy)",
                counters.task_events_lost
            ));
        }
        if counters.lock_events_lost > 0 {
            notes.push(format!(
                "{} lock events were lost (ring buffer full): lock counts are low",
                counters.lock_events_lost
            ));
        }
        if counters.alloc_events_lost > 0 {
            notes.push(format!(
                "{} allocator events were lost (ring buffer full): allocator counts are low",
                counters.alloc_events_lost
            ));
        }
        if let Some(tracer) = &self.tracer {
            if self.alloc_mode == AllocMode::Sampled && tracer.traced_fraction() < FULLY_TRACED {
                notes.push(format!(
                    "allocator calls were traced {:.1}% of the time ({} windows) to stay within \
                     the {:.0}% overhead budget; allocator counts are scaled estimates",
                    tracer.traced_fraction() * 100.0,
                    tracer.windows,
                    tracer.settings.budget * 100.0
                ));
            }
        }
        if counters.stack_errors * 100 > profile.samples() {
            notes.push(format!(
                "{} samples lost their user stack (stack map full): total times are low",
                counters.stack_errors
            ));
        }
        // A launched command's first exec is the gate becoming the command.
        let launch_execs = u32::from(matches!(self.target, TargetHandle::Launched(_)));
        let execs = profile.execs().saturating_sub(launch_execs);
        if execs > 0 {
            notes.push(format!(
                "the target called exec {execs} time(s) while traced"
            ));
        }
        let kernel = match &self.probes {
            Some(p) => p.kernel_stats(),
            None => self.final_kernel.clone(),
        };
        let symbolizer = &mut self.symbolizer;
        let allocator = alloc_report::report(
            self.tracer.as_ref(),
            self.collector.alloc.as_ref(),
            self.alloc_mode,
            counters.alloc_events_lost,
            &kernel,
            |place| symbolizer.code(place),
        );
        if counters.hold_events_lost > 0 {
            notes.push(format!(
                "{} critical sections were lost (ring buffer full): acquisitions are low",
                counters.hold_events_lost
            ));
        }
        let lock_tracing = locks::tracing(self.lock_tracer.as_ref(), &counters);
        if let Some(t) = &lock_tracing {
            if t.estimates() {
                notes.push(format!(
                    "lock calls were traced {:.1}% of the time ({} windows) to stay within the \
                     budget; acquisitions are scaled estimates",
                    t.traced_fraction * 100.0,
                    t.windows
                ));
            }
        }
        let locks = locks::report(
            &self.collector.locks,
            self.collector.maps(),
            self.collector.alloc.as_ref(),
            self.lock_tracer.as_ref(),
            &mut self.symbolizer,
        );
        let lines = self.kernel_lines();
        // A line's cost is its share of the samples the line table saw:
        // all CPU samples with timer sampling; with precise memory events
        // (which are not CPU samples), all memory events.
        let sampled = if self.address_source.is_some() {
            counters.user_samples
        } else {
            self.collector.profile.samples()
        };
        let false_sharing = sharing::report(&self.collector, &lines, sampled, &mut self.symbolizer);
        let false_sharing_dismissed =
            sharing::dismissed(&self.collector, &lines, sampled, &mut self.symbolizer);
        let addresses = self.address_sampling(&counters);
        if self.recipes_dropped > 0 {
            notes.push(format!(
                "{} sampled instructions were not decoded (recipe map full)",
                self.recipes_dropped
            ));
        }
        let profile = &self.collector.profile;
        Report {
            schema: SCHEMA,
            target: Target {
                pid: self.target.pid(),
                command: self.command.clone(),
                threads_seen: profile.threads().len(),
                exited: self.target_exited,
            },
            duration_s,
            sampling: Sampling {
                source: SampleSource::of(self.source, self.address_source),
                frequency_hz: self.frequency_hz,
                samples: profile.samples(),
                lost: lost_samples,
                lost_thread_events: counters.task_events_lost,
                stack_errors: counters.stack_errors,
                kernel_samples: profile.kernel_samples(),
                addresses,
            },
            hot_functions,
            threads,
            false_sharing,
            false_sharing_dismissed,
            allocator,
            locks,
            lock_tracing,
            loader: Loader::measure(duration_s),
            notes,
        }
    }
}

/// Hands every record waiting in `ring` to `handle`.
fn drain(ring: &mut RingBuf<MapData>, mut handle: impl FnMut(&[u8])) {
    while let Some(item) = ring.next() {
        handle(&item);
    }
}

/// A fixed-size record decoded, or a warning that it was short.
fn decoded<T>(bytes: &[u8], what: &str, decode: fn(&[u8]) -> Option<T>) -> Option<T> {
    let ev = decode(bytes);
    if ev.is_none() {
        tracing::warn!("short {what} record ({} bytes)", bytes.len());
    }
    ev
}

fn drain_samples(ring: &mut RingBuf<MapData>, collector: &mut Collector) {
    drain(ring, |b| {
        if let Some(ev) = decoded(b, "sample", SampleEvent::from_bytes) {
            collector.on_sample(&ev);
        }
    });
}

fn drain_locks(ring: &mut RingBuf<MapData>, collector: &mut Collector) {
    drain(ring, |b| collector.on_lock_record(b));
}

fn drain_holds(ring: &mut RingBuf<MapData>, collector: &mut Collector) {
    drain(ring, |b| {
        if let Some(ev) = decoded(b, "critical-section", HoldEvent::from_bytes) {
            collector.on_hold(&ev);
        }
    });
}

fn drain_alloc(ring: &mut RingBuf<MapData>, collector: &mut Collector) {
    drain(ring, |b| collector.on_alloc_record(b));
}

/// Where the target's pthread lock functions are, unless their probes are
/// off. Not finding them (a program with no pthread locks, e.g. Rust's
/// futex-based std) is not an error: contention is still seen from the
/// kernel.
fn find_lock_library(
    opts: &Options,
    pid: u32,
    notes: &mut Vec<String>,
) -> Option<lock_tracer::LockLibrary> {
    if opts.lock_mode == LockMode::Off {
        return None;
    }
    let exe = match &opts.target {
        TargetSpec::Pid(_) => None,
        TargetSpec::Command(cmd) => Some(
            cmd.first()
                .and_then(|p| launch::resolve(p, std::env::var_os("PATH")))?,
        ),
    };
    match lock_tracer::find(pid, exe.as_deref()) {
        Ok(Some(library)) => Some(library),
        Ok(None) => {
            notes.push(
                "no object in the target defines pthread_mutex_lock: lock calls are not traced \
                 (contention still is, from the kernel)"
                    .into(),
            );
            None
        }
        Err(e) => {
            notes.push(format!("cannot find the target's lock functions: {e:#}"));
            None
        }
    }
}

/// The target's allocator, unless allocator tracing is off. Not finding
/// one is not an error: the rest of the profile still works.
fn find_allocator(opts: &Options, pid: u32, notes: &mut Vec<String>) -> Option<Allocator> {
    if opts.alloc.mode == AllocMode::Off {
        return None;
    }
    let found = match &opts.target {
        TargetSpec::Pid(_) => allocator::find(pid),
        TargetSpec::Command(cmd) => {
            match cmd
                .first()
                .and_then(|p| launch::resolve(p, std::env::var_os("PATH")))
            {
                Some(exe) => allocator::find_for_command(&exe),
                None => Ok(None),
            }
        }
    };
    match found {
        Ok(Some(a)) => Some(a),
        Ok(None) => {
            notes
                .push("no object in the target defines malloc: the allocator is not traced".into());
            None
        }
        Err(e) => {
            notes.push(format!("cannot find the target's allocator: {e:#}"));
            None
        }
    }
}

fn drain_tasks(ring: &mut RingBuf<MapData>, collector: &mut Collector) {
    drain(ring, |b| {
        if let Some(ev) = decoded(b, "task", TaskEvent::from_bytes) {
            collector.on_task(&ev);
        }
    });
}

/// Waits until the ring is readable; never, without a ring.
async fn readable_opt(
    ring: &mut Option<AsyncFd<RingBuf<MapData>>>,
) -> std::io::Result<tokio::io::unix::AsyncFdReadyMutGuard<'_, RingBuf<MapData>>> {
    match ring {
        Some(r) => r.readable_mut().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_instant(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

async fn next_action(dashboard: Option<&mut Dashboard>) -> Action {
    match dashboard {
        Some(d) => d.next_action().await,
        None => std::future::pending().await,
    }
}

//! A profiling session: the generic runner.
//!
//! preflight → target → features ([`crate::features::plans`]) → the event
//! loop → finish → the report. The runner knows no analysis: it drains the
//! thread and sample rings into the [`pipeline::Pipeline`], which hands
//! every record to every feature, and asks each feature for its part of
//! the report. Data flows one way: probes → features (collect → analysis)
//! → [`crate::report`] → (dashboard | summary | JSON).

pub mod pipeline;
mod signals;

use std::{
    io::IsTerminal,
    path::Path,
    time::{Duration, Instant},
};

use memprof_common::{maps, SampleEvent, TaskEvent};

use crate::{
    error::{Error, Result},
    features::{self, Target as FeatureTarget},
    kernel::{
        cost::BpfStats,
        loader::{Probes, SamplingSource},
        preflight,
        rings::{decoded, drain, readable, Ring},
        sampler::{self, Sampling},
        windows::Detaching,
        Kernel,
    },
    object::{debuginfod, symbolize::Symbolizer},
    options::Options,
    process::{
        cgroup::Cgroup,
        group::children_left_out,
        handle::{TargetHandle, TargetSpec},
        state::Process,
        threads::ThreadEvent,
    },
    report::{
        model::{Loader, SamplingScope, Target},
        names,
        push::Pusher,
        Report,
    },
    tui::{Action, Dashboard},
};
use pipeline::Pipeline;
use signals::{next_action, sleep_until, sleep_until_instant, Signals};

/// How often the dashboard refreshes.
const TICK: Duration = Duration::from_secs(1);

/// Longest time spent draining the rings before the session's other work
/// (window deadlines, signals, the dashboard) gets a turn.
const DRAIN_TURN: Duration = Duration::from_millis(20);

/// Longest time spent draining when the session ends, before detaching: a
/// ring the target fills as fast as it is read is never empty while the
/// probes are in (what is left is counted as lost).
const LAST_DRAIN: Duration = Duration::from_millis(300);

/// Why tracing stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    DurationElapsed,
    Interrupted,
    TargetExited,
    UserQuit,
}

/// Everything the live loop owns.
struct Live {
    signals: Signals,
    /// Notes from start-up and from the loop, for the report.
    notes: Vec<String>,
    kernel: Kernel,
    source: SamplingSource,
    samples: Ring,
    tasks: Ring,
    pipeline: Pipeline,
    symbolizer: Symbolizer,
    target: TargetHandle,
    command: String,
    frequency_hz: u64,
    scope: SamplingScope,
    measured: sampler::StartMeasures,
    started: Instant,
    /// How long we traced, once tracing has stopped.
    traced: Option<Duration>,
    target_exited: bool,
    /// Whether to print progress on stderr (not while the dashboard is up).
    announce: bool,
    /// The tracepoint and perf-event links being removed.
    detaching: Detaching,
    /// A drain turn ended with records left. The kernel wakes a ring's
    /// reader only when it had emptied the ring, so the loop comes back at
    /// once instead of waiting (waiting, a ring written at 290 k records/s
    /// lost a third of them between drain ticks).
    more_to_drain: bool,
    exports: Exports,
    /// `--cgroup`: the session goes on after the main process exits while
    /// the cgroup has processes (`main_gone` then).
    cgroup: Option<Cgroup>,
    main_gone: bool,
}

/// What the profile exporters need from the session.
struct Exports {
    /// `--push`: the profiles sent to a profile server.
    pusher: Option<Pusher>,
    /// Reports carry the CPU call chains.
    stacks: bool,
}

impl Exports {
    fn new(opts: &Options, command: &str, pid: u32) -> Self {
        Self {
            pusher: Pusher::for_session(opts.push.as_ref(), command, pid),
            stacks: opts.export_stacks,
        }
    }
}

/// Runs a whole session and returns its report. With a dashboard, it is
/// refreshed every second and its quit key ends the session.
/// The probes the kernel is still removing are returned with it: the
/// caller shows the report first, then waits for them before exiting.
pub async fn run(
    opts: Options,
    dashboard: Option<&mut Dashboard>,
) -> Result<(Report, StopReason, Detaching)> {
    // Registered first, so a Ctrl-C or SIGTERM during start-up still ends
    // the session through the normal path (detach, summary).
    let signals = Signals::new()?;
    let mut live = start(&opts, signals, dashboard.is_none()).await?;
    let pid = live.target.pid();
    tracing::info!("tracing pid {pid} with {} sampling", live.source.name());

    let reason = live.event_loop(opts.duration, dashboard).await?;
    live.finish(reason).await;
    if live.target.launched() && live.pipeline.process.awaiting_exec() {
        live.take_detaching().wait();
        let TargetHandle::Launched(l) = &live.target else {
            unreachable!("checked above")
        };
        let status = l.status.map_or("unknown status".into(), |s| s.to_string());
        return Err(Error::LaunchFailed {
            command: live.command.clone(),
            reason: format!(
                "it ended before the command started ({status}); see its message above"
            ),
        });
    }
    let report = live.report();
    if let Some(pusher) = &mut live.exports.pusher {
        pusher.finish(&report);
        eprintln!("memprof-ebpf: {}", pusher.summary());
    }
    Ok((report, reason, live.take_detaching()))
}

/// Checks the system, finds or launches the target, loads the programs
/// and starts every feature.
async fn start(opts: &Options, signals: Signals, quiet: bool) -> Result<Live> {
    // A report made with a part left out, or a fallback forced, says so.
    let mut notes = opts.experimental.notes();
    let root = Path::new("/");
    let tracefs_dir = preflight::check_system(root, opts.frequency_hz)?;
    let (mut target, command, last) = TargetHandle::open(
        root,
        &opts.target,
        &opts.command_output,
        opts.run_as.as_ref(),
        &mut notes,
    )?;
    let pid = target.pid();
    let others = other_pids(root, pid, opts, &mut notes)?;
    let plans = features::plans(
        opts,
        &FeatureTarget {
            pid,
            launched: last.as_ref(),
        },
        &mut notes,
    );
    let load = features::load(opts, &plans);
    // On any error from here on, dropping `target` kills a launched command
    // (kill_on_drop), so it never runs on untraced.
    let has_pmu = preflight::has_hardware_pmu(root);
    // Before the programs load, so their run-time counts cover them all.
    let bpf_stats = BpfStats::enable(root, opts.bpf_stats);
    let sampling = Sampling::new(opts, has_pmu, pid, &others, target.launched())?;
    notes.extend(sampling.lowered_note());
    let mut probes = Probes::attach(pid, &tracefs_dir, &sampling, &load)?;
    if let Some(c) = &opts.cgroup {
        probes.set_traced_cgroups(&c.ids())?;
    }
    let samples = readable(probes.take_ring(maps::SAMPLES)?, "the sample ring buffer")?;
    let tasks = readable(probes.take_ring(maps::TASK_EVENTS)?, "the task ring buffer")?;
    let decoded =
        |why| format!("{why}: data addresses were computed by decoding timer samples instead");
    notes.extend(probes.precise_error.as_ref().map(decoded));
    let (mut process, existing) = follow(pid, target.launched(), &others);
    pipeline::apply_kernel_updates(&mut probes, &mut process)?;
    let mut started = Vec::with_capacity(plans.len());
    for plan in plans {
        started.push(plan.start(&mut probes, &mut process)?);
    }
    let pipeline = Pipeline::new(process, existing, started);
    if let TargetHandle::Launched(l) = &mut target {
        l.release()?;
    }
    // Everything that needs more than reading the target and re-attaching
    // probes is done: give up the rest (see `privilege`).
    match crate::privilege::drop_after_attach(pipeline.windowed()) {
        Ok(kept) => tracing::info!("capabilities kept after attach: {}", kept.join(" ")),
        Err(e) => notes.push(format!("could not drop capabilities after attaching: {e}")),
    }
    Ok(Live {
        signals,
        notes,
        source: probes.source,
        kernel: Kernel::new(probes, bpf_stats),
        samples,
        tasks,
        pipeline,
        symbolizer: Symbolizer::new(),
        target,
        exports: Exports::new(opts, &command, pid),
        command,
        frequency_hz: sampling.frequency_hz,
        scope: SamplingScope::from(&sampling.scope),
        measured: sampling.measured,
        started: Instant::now(),
        traced: None,
        target_exited: false,
        announce: quiet && std::io::stderr().is_terminal(),
        detaching: Detaching::default(),
        more_to_drain: false,
        cgroup: opts.cgroup.clone(),
        main_gone: false,
    })
}

/// The traced processes' state: the main one (`launched`: from its exec)
/// and `others`, with the threads they have.
fn follow(pid: u32, launched: bool, others: &[u32]) -> (Process, Vec<ThreadEvent>) {
    let (mut process, mut existing) = Process::new(pid);
    if launched {
        process.start_at_exec();
    }
    for &other in others {
        existing.extend(process.add_process(other));
    }
    (process, existing)
}

/// The other `-p` pids (or the cgroup's other processes) as processes (a
/// thread id stands for its process), each checked as the main one is (a
/// cgroup's process gone since it was listed is left out); a note says
/// what is traced where.
fn other_pids(root: &Path, main: u32, opts: &Options, notes: &mut Vec<String>) -> Result<Vec<u32>> {
    let mut tgids: Vec<u32> = Vec::new();
    for &pid in &opts.extra_pids {
        let tgid = match preflight::check_pid(root, pid) {
            // A cgroup's process gone since, or not ours to trace (a
            // kernel thread): left out.
            Err(e) if opts.cgroup.is_some() => {
                tracing::info!("cgroup process {pid} left out: {e}");
                continue;
            }
            checked => checked?,
        };
        if tgid != main && !tgids.contains(&tgid) {
            tgids.push(tgid);
        }
    }
    if !tgids.is_empty() {
        let list: Vec<String> = tgids.iter().map(u32::to_string).collect();
        notes.push(format!(
            "also traced: pid {} (CPU sampling and false sharing; allocator and lock \
             probes follow pid {main} only)",
            list.join(", ")
        ));
    }
    match &opts.cgroup {
        Some(c) => notes.push(c.start_note(tgids.len() + 1)),
        None if matches!(opts.target, TargetSpec::Pid(_)) => {
            notes.extend(children_left_out(main, &tgids, opts.follow_children));
        }
        None => {}
    }
    Ok(tgids)
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
            let window = self.pipeline.deadline();
            let features = &mut self.pipeline;
            tokio::select! {
                guard = self.samples.readable_mut() => {
                    let mut guard = guard.map_err(|e| anyhow::anyhow!("polling samples: {e}"))?;
                    guard.clear_ready();
                    self.drain_samples();
                    self.after_drain();
                }
                guard = self.tasks.readable_mut() => {
                    let mut guard = guard.map_err(|e| anyhow::anyhow!("polling task events: {e}"))?;
                    guard.clear_ready();
                    self.drain_tasks();
                }
                ready = std::future::poll_fn(|cx| features.poll_ready(cx)) => {
                    ready.map_err(|e| anyhow::anyhow!("polling a feature's records: {e}"))?;
                    self.drain_features();
                }
                _ = tokio::task::yield_now(), if self.more_to_drain => {
                    self.drain_features();
                    self.after_drain();
                    // A busy ring must not hold a window open past its end.
                    if window.is_some_and(|w| w <= Instant::now()) {
                        self.on_deadlines();
                    }
                }
                _ = sleep_until_instant(window) => self.on_deadlines(),
                _ = drain.tick() => {
                    self.drain_all(Some(DRAIN_TURN));
                    self.after_drain();
                }
                _ = self.target.exited(), if !self.main_gone => {
                    if self.main_exited() {
                        return Ok(StopReason::TargetExited);
                    }
                }
                _ = sleep_until(deadline) => return Ok(StopReason::DurationElapsed),
                _ = self.signals.recv() => return Ok(StopReason::Interrupted),
                action = next_action(dashboard.as_deref_mut()) => {
                    if action == Action::Quit {
                        return Ok(StopReason::UserQuit);
                    }
                }
                _ = tick.tick() => {
                    if self.main_gone && self.main_exited() {
                        return Ok(StopReason::TargetExited);
                    }
                    self.follow_cgroup();
                    if let Some(probes) = &mut self.kernel.probes {
                        probes.flush_logs();
                    }
                    self.pipeline.settle();
                    if let Some(d) = dashboard.as_deref_mut() {
                        let report = self.report();
                        d.update(report);
                    }
                    if self.exports.pusher.as_ref().is_some_and(Pusher::due) {
                        let report = self.report();
                        if let Some(p) = &mut self.exports.pusher {
                            p.push_in_background(&report);
                        }
                    }
                }
            }
        }
    }

    /// Gives the kernel the cgroups below the traced one made since (their
    /// newcomers are traced too), and traces the processes in them that
    /// the kernel did not see start (moved in, or forked there by a
    /// process we do not trace, without an exec).
    fn follow_cgroup(&mut self) {
        let Some(c) = &self.cgroup else { return };
        if let Some(probes) = &mut self.kernel.probes {
            if let Err(e) = probes.set_traced_cgroups(&c.ids()) {
                tracing::warn!("updating the traced cgroups: {e}");
            }
        }
        // The kernel's own adoptions first, so they are not added twice.
        self.drain_tasks();
        let known = self.pipeline.process.pids();
        let pids = self
            .cgroup
            .as_ref()
            .map(Cgroup::processes)
            .unwrap_or_default();
        for pid in pids.into_iter().filter(|p| !known.contains(p)) {
            tracing::info!("process {pid} joined the cgroup: traced from now on");
            self.pipeline.join_process(pid);
        }
        // Their layouts to the kernel, as after any drain.
        self.after_drain();
    }

    /// The main process has exited: whether the session ends (it goes on
    /// while the traced cgroup, with `--cgroup`, has processes).
    fn main_exited(&mut self) -> bool {
        if self
            .cgroup
            .as_ref()
            .is_some_and(|c| !c.processes().is_empty())
        {
            if !self.main_gone {
                tracing::info!("the main process exited; the cgroup's others go on");
            }
            self.main_gone = true;
            return false;
        }
        self.target_exited = true;
        true
    }

    fn drain_samples(&mut self) {
        let pipeline = &mut self.pipeline;
        drain(&mut self.samples, |b| {
            if let Some(ev) = decoded(b, "sample", SampleEvent::from_bytes) {
                pipeline.on_sample(&ev);
            }
        });
    }

    fn drain_tasks(&mut self) {
        let pipeline = &mut self.pipeline;
        drain(&mut self.tasks, |b| {
            if let Some(ev) = decoded(b, "task", TaskEvent::from_bytes) {
                pipeline.on_task(&ev);
            }
        });
    }

    /// Hands the records waiting in the rings to the features, for at
    /// most `turn` (None: until they are empty). Thread and exec events
    /// first: they decide how the records taken after them are read.
    fn drain_all(&mut self, turn: Option<Duration>) {
        self.drain_features_within(turn);
        self.drain_samples();
    }

    /// Calls back the features whose window deadline has come.
    fn on_deadlines(&mut self) {
        if let Some(probes) = &mut self.kernel.probes {
            self.pipeline.on_deadlines(probes, &mut self.notes);
        }
    }

    /// Drains the features' rings a batch at a time, reading the thread
    /// records again before each batch, so that a thread created while a
    /// busy ring is drained is known before its records are read. At most
    /// [`DRAIN_TURN`] per call: a ring written as fast as it is read would
    /// otherwise keep the loop here, and the windows' deadlines (the
    /// budget's detach) would never come — a hot allocator was then traced
    /// all session long, losing events, at full cost to the target.
    fn drain_features(&mut self) {
        self.drain_features_within(Some(DRAIN_TURN));
    }

    /// As [`Self::drain_features`], for at most `turn` (None: until the
    /// rings are empty).
    fn drain_features_within(&mut self, turn: Option<Duration>) {
        let since = Instant::now();
        loop {
            self.drain_tasks();
            self.more_to_drain = self.pipeline.drain();
            if !self.more_to_drain || turn.is_some_and(|t| since.elapsed() >= t) {
                break;
            }
        }
    }

    /// Gives the programs what the drained records asked for.
    fn after_drain(&mut self) {
        if let Some(probes) = &mut self.kernel.probes {
            self.pipeline.after_drain(probes);
        }
    }

    /// Stops tracing: drains what the kernel still holds, detaches, and
    /// ends a launched command that is still running.
    async fn finish(&mut self, reason: StopReason) {
        self.traced = Some(self.started.elapsed());
        if let Some(probes) = &mut self.kernel.probes {
            crate::kernel::detach::remember_programs(probes.program_ids());
            self.detaching.extend(probes.start_detaching());
        }
        // A target that exited writes nothing more: all it wrote is read,
        // however long that takes (a slow reader behind a burst of calls
        // once lost 4% of them here). A live one may keep the rings full
        // while its probes are attached: a turn at most.
        self.drain_all((!self.target_exited).then_some(LAST_DRAIN));
        if let Some(probes) = &mut self.kernel.probes {
            self.pipeline.finish(probes);
        }
        self.pipeline.settle();
        tracing::info!("stopping ({reason:?}); detaching");
        self.kernel.detach(); // before symbolization
        self.wait_for_debug_files();
        if self.announce {
            eprintln!("memprof-ebpf: detached; symbolizing…");
        }
        if !self.target_exited {
            if let Some(note) = self.target.stop_launched().await {
                self.notes.push(note);
            }
        }
    }

    /// Lets the debug files still coming from debuginfod servers land
    /// before the report is named (bounded by `DEBUGINFOD_TIMEOUT`), and
    /// says what came.
    fn wait_for_debug_files(&mut self) {
        if !debuginfod::enabled() {
            return;
        }
        let announce = self.announce;
        let w = debuginfod::wait(|n| {
            if announce {
                eprintln!("memprof-ebpf: detached; waiting for {n} debug file(s) from debuginfod…");
            }
        });
        let mut said = vec![format!("{} fetched", w.fetched)];
        if w.failed > 0 {
            said.push(format!("{} not found on any server", w.failed));
        }
        if w.unreachable > 0 {
            said.push(format!("{} server(s) not reached", w.unreachable));
        }
        if w.pending > 0 {
            said.push(format!(
                "{} still coming when DEBUGINFOD_TIMEOUT ran out (named without)",
                w.pending
            ));
        }
        self.notes
            .push(format!("debuginfod: debug files {}", said.join(", ")));
    }

    /// The probes the kernel is still removing.
    fn take_detaching(&mut self) -> Detaching {
        let mut detaching = std::mem::take(&mut self.detaching);
        for f in &mut self.pipeline.features {
            detaching.extend(f.take_detaching());
        }
        detaching
    }

    /// The report as of now: the session's part, then each feature's.
    fn report(&mut self) -> Report {
        let duration_s = self
            .traced
            .unwrap_or_else(|| self.started.elapsed())
            .as_secs_f64();
        let mut notes = self.notes.clone();
        if self.target_exited {
            notes.push(format!("the target exited after {duration_s:.1} s"));
        }
        if let Some(note) = self.pipeline.process.children_note() {
            notes.push(note);
        }
        let launched = self.target.launched();
        let target = Target {
            pid: self.target.pid(),
            command: self.command.clone(),
            threads_seen: 0,
            exited: self.target_exited,
            processes: Vec::new(),
        };
        let sampling = (self.source.into(), self.frequency_hz, self.scope);
        let mut report = pipeline::empty_report(target, duration_s, sampling);
        report.sampling.set_measured(self.measured);
        if self.exports.stacks {
            report.cpu_stacks = Some(Vec::new());
            report.alloc_chains = Some(Vec::new());
        }
        self.pipeline.report(
            &mut report,
            &self.kernel,
            &mut self.symbolizer,
            &mut notes,
            launched,
        );
        let stripped = self.symbolizer.stripped_files();
        notes.extend(names::stripped_note(&stripped, debuginfod::enabled()));
        report.loader = Loader::measure(duration_s, &self.kernel.cost());
        notes.extend(report.cost_notes());
        report.notes = notes;
        report
    }
}

//! Records to features: the launch gate, thread events and samples handed
//! to every feature, the target's shared state beside them. No BPF here:
//! the runner drains the rings into it, and tests drive it directly.

use std::{
    task::{Context, Poll},
    time::Instant,
};

use memprof_common::{SampleEvent, TaskEvent};

use crate::{
    features::{each_with_heap, Feature, ReportContext},
    kernel::{loader::Probes, Kernel},
    object::symbolize::Symbolizer,
    process::{
        state::{Process, TaskChange},
        threads::ThreadEvent,
    },
    report::{
        model::{AllocatorReport, Loader, SampleSource, Sampling, SamplingScope, Schema, Target},
        Report,
    },
};

/// The session's part of a report (the target, the sampling source,
/// frequency and scope); the features fill in the rest.
pub fn empty_report(
    target: Target,
    duration_s: f64,
    (source, frequency_hz, scope): (SampleSource, u64, SamplingScope),
) -> Report {
    Report {
        schema: Schema,
        target,
        duration_s,
        sampling: Sampling::new(source, frequency_hz, scope),
        hot_functions: Vec::new(),
        threads: Vec::new(),
        false_sharing: Vec::new(),
        false_sharing_dismissed: Vec::new(),
        allocator: AllocatorReport::default(),
        locks: Vec::new(),
        lock_tracing: None,
        lock_contention: None,
        loader: Loader::default(),
        notes: Vec::new(),
        cpu_stacks: None,
        alloc_chains: None,
        sections: Default::default(),
    }
}

/// Tells the kernel the traced processes' new code layouts and shared
/// mappings.
pub fn apply_kernel_updates(
    probes: &mut Probes,
    process: &mut Process,
) -> crate::error::Result<()> {
    let updates = process.take_kernel_updates();
    for (tgid, layout) in updates.layouts {
        probes.trace(tgid, layout)?;
    }
    for (tgid, ranges) in updates.shared {
        probes.set_shared_ranges(tgid, &ranges);
    }
    Ok(())
}

/// The target's state and the features of a session.
pub struct Pipeline {
    pub process: Process,
    pub features: Vec<Box<dyn Feature>>,
    /// Each feature's deadline as last asked.
    due: Vec<Option<Instant>>,
}

impl Pipeline {
    /// Starts with the threads `process` found; they are handed to the
    /// features as existing.
    pub fn new(
        process: Process,
        existing: Vec<ThreadEvent>,
        features: Vec<Box<dyn Feature>>,
    ) -> Self {
        let mut pipeline = Self {
            process,
            features,
            due: Vec::new(),
        };
        for ev in existing {
            pipeline.thread(ev);
        }
        pipeline
    }

    /// Also traces process `pid`, running already, which joined the traced
    /// cgroup without an `exec` the kernel would have seen (moved into it,
    /// or forked there by a process we do not trace): its threads are
    /// handed to the features as existing.
    pub fn join_process(&mut self, pid: u32) {
        for ev in self.process.add_process(pid) {
            self.thread(ev);
        }
        self.process.mark_joined(pid);
    }

    fn thread(&mut self, ev: ThreadEvent) {
        for f in &mut self.features {
            f.on_thread(&ev, &mut self.process);
        }
    }

    /// One sample: held while a launched command's exec is awaited,
    /// dropped if it is of our launch gate, else handed to every feature
    /// with its process's view current.
    pub fn on_sample(&mut self, ev: &SampleEvent) {
        if self.process.hold(ev) || self.process.before_launch(ev.time_ns) {
            return;
        }
        self.process.saw_thread(ev.tid, ev.tgid);
        self.process.enter(ev.tgid);
        for f in &mut self.features {
            f.on_sample(ev, &mut self.process);
        }
        self.process.leave();
    }

    /// One thread record. After an exec, the samples held until then are
    /// handed on.
    pub fn on_task(&mut self, ev: &TaskEvent) {
        match self.process.on_task(ev) {
            Some(TaskChange::Thread(ev)) => self.thread(ev),
            Some(TaskChange::Exec(ev, held)) => {
                self.thread(ev);
                for sample in &held {
                    self.on_sample(sample);
                }
            }
            None => {}
        }
    }

    /// Ready when a feature's ring has records.
    pub fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        for f in &mut self.features {
            if let Poll::Ready(r) = f.poll_ready(cx) {
                return Poll::Ready(r);
            }
        }
        Poll::Pending
    }

    /// Hands a batch of every feature's waiting records to it; true when
    /// more may wait.
    pub fn drain(&mut self) -> bool {
        let mut more = false;
        for f in &mut self.features {
            more |= f.drain(&mut self.process);
        }
        more
    }

    pub fn after_drain(&mut self, probes: &mut Probes) {
        if let Err(e) = apply_kernel_updates(probes, &mut self.process) {
            tracing::warn!("{e}");
        }
        for f in &mut self.features {
            f.after_drain(probes, &mut self.process);
        }
    }

    /// The earliest deadline of a feature. Each feature's deadline is
    /// kept: a feature may compute it afresh from the clock, so it is
    /// called back when the deadline it gave has come.
    pub fn deadline(&mut self) -> Option<Instant> {
        self.due = self.features.iter().map(|f| f.deadline()).collect();
        self.due.iter().flatten().min().copied()
    }

    /// Calls back the features whose deadline has come.
    pub fn on_deadlines(&mut self, probes: &mut Probes, notes: &mut Vec<String>) {
        let now = Instant::now();
        for (f, due) in self.features.iter_mut().zip(&self.due) {
            if due.is_some_and(|d| d <= now) {
                f.on_deadline(probes, notes);
            }
        }
    }

    pub fn settle(&mut self) {
        let process = &mut self.process;
        each_with_heap(&mut self.features, |f, heap| f.settle(process, heap));
    }

    pub fn finish(&mut self, probes: &mut Probes) {
        for f in &mut self.features {
            f.finish(probes, &mut self.process);
        }
    }

    /// Asks every feature for its part of `report`, in order.
    pub fn report(
        &mut self,
        report: &mut Report,
        kernel: &Kernel,
        symbolizer: &mut Symbolizer,
        notes: &mut Vec<String>,
        launched: bool,
    ) {
        let counters = kernel.counters();
        let stats = kernel.stats();
        let duration_s = report.duration_s;
        let process = &mut self.process;
        each_with_heap(&mut self.features, |f, heap| {
            let mut ctx = ReportContext {
                probes: kernel.probes.as_ref(),
                counters: &counters,
                kernel_stats: &stats,
                process,
                symbolizer,
                heap,
                notes,
                launched,
                duration_s,
            };
            f.report(&mut ctx, report);
        });
    }

    /// Whether a feature re-attaches probes while tracing.
    pub fn windowed(&self) -> bool {
        self.features.iter().any(|f| f.windowed())
    }
}

/// The empty report of a test session over process `pid` running
/// `command`: one second of 99 Hz cpu-clock samples per thread.
#[cfg(test)]
pub fn test_report(pid: u32, command: &str, threads_seen: usize) -> Report {
    let target = Target {
        pid,
        command: command.into(),
        threads_seen,
        exited: false,
        processes: Vec::new(),
    };
    empty_report(
        target,
        1.0,
        (SampleSource::CpuClock, 99, SamplingScope::Threads),
    )
}
#[cfg(test)]
mod tests {
    use memprof_common::{
        SAMPLE_FLAG_KERNEL, SAMPLE_FLAG_NO_RECIPE, TASK_EXEC, TASK_EXIT, TASK_NEW_THREAD,
    };

    use super::*;
    use crate::{
        features::{cpu::Cpu, sharing::Sharing},
        process::maps::{Place, ProcMaps},
    };

    /// A pipeline over this process with the CPU and sharing features.
    fn pipeline(pid: u32) -> Pipeline {
        let (process, existing) = Process::new(pid);
        let features: Vec<Box<dyn Feature>> =
            vec![Box::new(Cpu::default()), Box::new(Sharing::new(None))];
        Pipeline::new(process, existing, features)
    }

    fn cpu(p: &Pipeline) -> &crate::features::cpu::profile::Profile {
        p.features[0]
            .as_any()
            .downcast_ref::<Cpu>()
            .map(|c| &c.profile)
            .expect("cpu first")
    }

    fn sharing(p: &mut Pipeline) -> &mut Sharing {
        p.features[1]
            .as_any_mut()
            .downcast_mut::<Sharing>()
            .expect("sharing second")
    }

    fn sample(time_ns: u64, ip: u64, tid: u32, flags: u32) -> SampleEvent {
        SampleEvent {
            time_ns,
            ip,
            tid,
            stack_id: -1,
            flags,
            ..Default::default()
        }
    }

    fn task(time_ns: u64, kind: u32, tid: u32, parent_tid: u32) -> TaskEvent {
        TaskEvent {
            time_ns,
            kind,
            tid,
            tgid: std::process::id(),
            parent_tid,
            ..Default::default()
        }
    }

    /// An analysis added the way every analysis is: it implements
    /// `Feature`, and a session lists it (one line in `features::plans`).
    /// Nothing in the runner or the pipeline changes for it.
    #[derive(Default)]
    struct KernelShare {
        samples: u64,
        kernel: u64,
    }

    impl Feature for KernelShare {
        fn on_sample(&mut self, ev: &SampleEvent, _process: &mut Process) {
            self.samples += 1;
            self.kernel += u64::from(ev.flags & SAMPLE_FLAG_KERNEL != 0);
        }

        fn report(&mut self, ctx: &mut ReportContext<'_>, _report: &mut Report) {
            ctx.notes.push(format!(
                "{} of {} samples in the kernel",
                self.kernel, self.samples
            ));
        }
    }

    #[test]
    fn a_new_feature_needs_no_change_in_the_runner() {
        let me = std::process::id();
        let (process, existing) = Process::new(me);
        let features: Vec<Box<dyn Feature>> =
            vec![Box::new(Cpu::default()), Box::new(KernelShare::default())];
        let mut p = Pipeline::new(process, existing, features);
        let ip = a_new_feature_needs_no_change_in_the_runner as *const () as u64;
        p.on_sample(&sample(1, ip, me, 0));
        p.on_sample(&sample(2, 0, me, SAMPLE_FLAG_KERNEL));
        p.on_sample(&sample(3, 0, me, SAMPLE_FLAG_KERNEL));
        let mut report = test_report(me, "test", 0);
        let mut notes = Vec::new();
        p.report(
            &mut report,
            &Kernel::default(),
            &mut Symbolizer::new(),
            &mut notes,
            false,
        );
        assert_eq!(report.sampling.samples, 3, "the CPU feature's part");
        assert_eq!(report.sampling.kernel_samples, 2);
        assert_eq!(
            notes,
            ["2 of 3 samples in the kernel"],
            "the new feature's part"
        );
    }

    #[test]
    fn collects_from_this_process() {
        let me = std::process::id();
        let mut p = pipeline(me);
        assert!(cpu(&p).threads().contains_key(&me));
        let ip = collects_from_this_process as *const () as u64;
        p.on_sample(&SampleEvent {
            stack_id: 3,
            ..sample(1, ip, me, 0)
        });
        p.on_sample(&SampleEvent {
            stack_id: -14,
            ..sample(2, 0, me, SAMPLE_FLAG_KERNEL)
        });
        let profile = cpu(&p);
        assert_eq!(profile.samples(), 2);
        assert_eq!(profile.kernel_samples(), 1);
        assert_eq!(profile.stack_samples(3), 1);
        let places: Vec<_> = profile.user_places().cloned().collect();
        assert!(
            matches!(places.as_slice(), [Place::File { .. }]),
            "{places:?}"
        );
        assert!(p.process.name(me).is_some());
    }

    #[test]
    fn task_events_become_thread_events() {
        let me = std::process::id();
        let mut p = pipeline(me);
        p.on_task(&task(1, TASK_NEW_THREAD, 999_999, me));
        assert_eq!(cpu(&p).threads()[&999_999].created_by, Some(me));
        p.on_task(&task(2, TASK_EXIT, 999_999, 0));
        assert!(cpu(&p).threads()[&999_999].exited);
        p.on_task(&task(3, 77, 1, 0));
        assert!(!cpu(&p).threads().contains_key(&1));
    }

    #[test]
    fn samples_before_a_launch_exec_are_dropped() {
        let me = std::process::id();
        let mut p = pipeline(me);
        p.process.start_at_exec();
        let ip = samples_before_a_launch_exec_are_dropped as *const () as u64;
        p.on_sample(&sample(5, ip, me, 0)); // the gate, before exec
        p.on_sample(&sample(20, ip, me, 0)); // the command, drained before the exec event
        assert_eq!(cpu(&p).samples(), 0, "held until the exec is seen");
        p.on_task(&task(10, TASK_EXEC, me, 0));
        assert_eq!(
            cpu(&p).samples(),
            1,
            "only the sample after the exec counts"
        );
        p.on_sample(&sample(30, ip, me, 0));
        assert_eq!(cpu(&p).samples(), 2);
        assert_eq!(cpu(&p).execs(), 1);
        // A gate sample drained after the exec event is still dropped.
        p.on_sample(&sample(7, ip, me, 0));
        assert_eq!(cpu(&p).samples(), 2);
    }

    #[test]
    fn sampled_instructions_are_decoded_once_and_again_after_exec() {
        let me = std::process::id();
        let mut p = pipeline(me);
        let ip = sampled_instructions_are_decoded_once_and_again_after_exec as *const () as u64;
        let at = |time_ns| sample(time_ns, ip, me, SAMPLE_FLAG_NO_RECIPE);
        p.on_sample(&at(10));
        p.on_sample(&at(20));
        assert_eq!(sharing(&mut p).take_new_recipes().len(), 1, "decoded once");
        assert_eq!(sharing(&mut p).decoded_counts().0, 1);
        assert!(!sharing(&mut p).take_recipes_reset());
        // This very process exec'ing itself: same image, new instructions.
        p.on_task(&task(100, TASK_EXEC, me, 0));
        assert!(
            sharing(&mut p).take_recipes_reset(),
            "the kernel's recipes are stale"
        );
        assert_eq!(sharing(&mut p).decoded_counts().0, 0);
        p.on_sample(&at(50));
        assert!(
            sharing(&mut p).take_new_recipes().is_empty(),
            "a late sample of the old image is not decoded against the new one"
        );
        p.on_sample(&at(150));
        assert_eq!(sharing(&mut p).take_new_recipes().len(), 1, "decoded again");
    }

    #[test]
    fn another_process_s_samples_are_decoded_only_under_a_known_layout() {
        let me = std::process::id();
        let mut p = pipeline(me);
        let ip =
            another_process_s_samples_are_decoded_only_under_a_known_layout as *const () as u64;
        // A process whose fork record is not read yet: layout unknown.
        let stranger = u32::MAX - 11;
        p.on_sample(&SampleEvent {
            tgid: stranger,
            ..sample(1, ip, stranger, SAMPLE_FLAG_NO_RECIPE)
        });
        assert!(sharing(&mut p).take_new_recipes().is_empty());
        assert_eq!(p.process.pid(), me, "back on the main process's view");
        assert_eq!(p.process.tgid(stranger), stranger);
        // The main process's: decoded under its own address (layout 0).
        p.on_sample(&SampleEvent {
            tgid: me,
            ..sample(2, ip, me, SAMPLE_FLAG_NO_RECIPE)
        });
        let new = sharing(&mut p).take_new_recipes();
        assert_eq!(new.iter().map(|r| r.0).collect::<Vec<_>>(), [ip]);
    }

    #[test]
    fn late_samples_of_the_old_image_use_the_old_map() {
        let me = std::process::id();
        let mut p = pipeline(me);
        // Pretend the current image was exec'd at t=100, and before it a
        // different program was mapped where our code is now.
        let ip = late_samples_of_the_old_image_use_the_old_map as *const () as u64;
        let old = ProcMaps::parse(&format!(
            "{:x}-{:x} r-xp 00000000 00:00 0 /old/program\n",
            ip & !0xfff,
            (ip & !0xfff) + 0x1000
        ));
        p.process.set_before_exec(100, old);
        p.on_sample(&sample(50, ip, me, 0));
        p.on_sample(&sample(150, ip, me, 0));
        let paths: Vec<String> = cpu(&p)
            .user_places()
            .filter_map(|p| match p {
                Place::File { path, .. } => Some(path.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(paths.len(), 2, "{paths:?}");
        assert!(
            paths.contains(&"/old/program".to_string()),
            "sample before the exec: old image"
        );
        assert!(
            paths.iter().any(|p| p != "/old/program"),
            "sample after the exec: current image"
        );
    }

    #[test]
    fn a_thread_gone_before_its_samples_is_looked_up_once() {
        let me = std::process::id();
        let mut p = pipeline(me);
        let gone = u32::MAX - 7;
        let ip = a_thread_gone_before_its_samples_is_looked_up_once as *const () as u64;
        p.on_sample(&sample(1, ip, gone, 0));
        assert_eq!(p.process.name(gone), Some(""), "remembered as unknown");
        // Its exit event brings the real name from the kernel.
        let mut comm = [0u8; 16];
        comm[..4].copy_from_slice(b"late");
        p.on_task(&TaskEvent {
            comm,
            ..task(2, TASK_EXIT, gone, 0)
        });
        assert_eq!(p.process.name(gone), Some("late"));
    }
}

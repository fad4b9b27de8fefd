//! CPU time: where the target's threads spend their samples, per function
//! and per thread, and the sampling section of the report.

pub mod profile;

use std::collections::BTreeMap;

use memprof_common::{SampleEvent, SAMPLE_FLAG_KERNEL, SAMPLE_FLAG_MEMORY};

use super::{Feature, Plan, ReportContext, Target};
use crate::process::threads::ThreadEvent;
use crate::{
    error::Result,
    heap::Heap,
    kernel::loader::Probes,
    options::Options,
    process::state::Process,
    report::{
        model::{HotFunctionEntry, ProcessEntry, ThreadEntry},
        Report,
    },
};
use profile::{HotFunction, Profile, Sample, SampleAt};

/// Hot functions kept in a report.
const HOT_FUNCTIONS: usize = 50;

pub fn plan(_opts: &Options, _target: &Target<'_>, _notes: &mut Vec<String>) -> Box<dyn Plan> {
    Box::new(CpuPlan)
}

struct CpuPlan;

impl Plan for CpuPlan {
    fn start(
        self: Box<Self>,
        _probes: &mut Probes,
        _process: &mut Process,
    ) -> Result<Box<dyn Feature>> {
        Ok(Box::new(Cpu::default()))
    }
}

/// The CPU profile of a session.
#[derive(Default)]
pub struct Cpu {
    pub profile: Profile,
}

impl Cpu {
    /// Reads the frames of newly seen user stacks with `read` (a stack-map
    /// lookup) and resolves them to places now, while the map is current.
    /// Every frame is a return address (the sampled instruction is not in
    /// the stack): it is resolved at its call.
    pub fn read_stacks(&mut self, process: &mut Process, read: impl Fn(u32) -> Option<Vec<u64>>) {
        for id in self.profile.unread_stacks() {
            let Some(ips) = read(id) else { continue };
            let places = ips.iter().map(|&ip| process.call_site(ip)).collect();
            self.profile.set_stack(id, places);
        }
    }

    fn threads(&self, process: &mut Process) -> Vec<ThreadEntry> {
        let alive: Vec<u32> = self
            .profile
            .threads()
            .iter()
            .filter(|(_, t)| !t.exited)
            .map(|(tid, _)| *tid)
            .collect();
        let names = process.thread_names(alive).clone();
        let mut threads: Vec<ThreadEntry> = self
            .profile
            .threads()
            .iter()
            .map(|(&tid, t)| ThreadEntry {
                tid,
                pid: process.tgid(tid),
                ns_tid: process.ns_tid(tid),
                name: names.get(&tid).cloned().unwrap_or_default(),
                samples: t.samples,
                created_by: t.created_by,
                exited: t.exited,
            })
            .collect();
        threads.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.tid.cmp(&b.tid)));
        threads
    }

    fn notes(&self, ctx: &mut ReportContext<'_>) {
        let counters = ctx.counters;
        let dropped = ctx.process.dropped;
        if counters.lost() + dropped > 0 {
            ctx.notes.push(format!(
                "{} samples and {} thread events were lost (ring buffer full or busy)",
                counters.samples_lost + dropped,
                counters.task_events_lost
            ));
        }
        if counters.stack_errors * 100 > self.profile.samples() {
            ctx.notes.push(format!(
                "{} samples lost their user stack (stack map full): total times are low",
                counters.stack_errors
            ));
        }
        // A launched command's first exec is the gate becoming the command.
        let execs = self.profile.execs().saturating_sub(u32::from(ctx.launched));
        if execs > 0 {
            ctx.notes.push(format!(
                "the target called exec {execs} time(s) while traced"
            ));
        }
    }
}

/// The traced processes of `threads` (by their `pid`), with their
/// threads and samples: the main process first, then by samples.
fn processes(threads: &[ThreadEntry], process: &Process) -> Vec<ProcessEntry> {
    let mut by_pid: BTreeMap<u32, ProcessEntry> = BTreeMap::new();
    for t in threads {
        let entry = by_pid.entry(t.pid).or_insert_with(|| ProcessEntry {
            pid: t.pid,
            ns_pid: None,
            command: process.command_of(t.pid).unwrap_or_default().to_string(),
            threads: 0,
            samples: 0,
        });
        entry.threads += 1;
        entry.samples += t.samples;
        if t.tid == t.pid {
            entry.ns_pid = t.ns_tid;
        }
    }
    let main = process.main_pid();
    let mut list: Vec<ProcessEntry> = by_pid.into_values().collect();
    list.sort_by_key(|p| (p.pid != main, std::cmp::Reverse(p.samples), p.pid));
    list
}

impl Feature for Cpu {
    fn on_thread(&mut self, ev: &ThreadEvent, _process: &mut Process) {
        self.profile.add_thread_event(*ev);
    }

    fn on_sample(&mut self, ev: &SampleEvent, process: &mut Process) {
        if ev.flags & SAMPLE_FLAG_MEMORY != 0 {
            return; // a precise memory event: an access, not CPU time
        }
        let at = if ev.flags & SAMPLE_FLAG_KERNEL != 0 || ev.ip == 0 {
            SampleAt::Kernel
        } else {
            SampleAt::User(process.place_at(ev.time_ns, ev.ip))
        };
        process.know_thread(ev.tid);
        self.profile.add_sample(Sample {
            time_ns: ev.time_ns,
            tid: ev.tid,
            at,
            stack_id: u32::try_from(ev.stack_id).ok(),
        });
    }

    fn after_drain(&mut self, probes: &mut Probes, process: &mut Process) {
        // Soon after sampling, so the stack is read against the memory map
        // it was taken in.
        self.read_stacks(process, |id| probes.stack(id));
    }

    fn settle(&mut self, process: &mut Process, _heap: Option<&dyn Heap>) {
        if self.profile.has_unmapped() {
            process.refresh_maps();
            let maps = process.maps();
            self.profile.remap_unmapped(|addr| maps.place(addr));
        }
    }

    fn finish(&mut self, probes: &mut Probes, process: &mut Process) {
        self.read_stacks(process, |id| probes.stack(id));
    }

    fn report(&mut self, ctx: &mut ReportContext<'_>, report: &mut Report) {
        let symbolizer = &mut *ctx.symbolizer;
        report.hot_functions = self
            .profile
            .hot_functions(HOT_FUNCTIONS, |place| symbolizer.code(place))
            .into_iter()
            .map(Into::into)
            .collect();
        let symbolizer = &mut *ctx.symbolizer;
        if let Some(stacks) = &mut report.cpu_stacks {
            *stacks = self.profile.stacks(|place| symbolizer.code(place));
        }
        report.threads = self.threads(ctx.process);
        report.target.threads_seen = self.profile.threads().len();
        report.target.processes = processes(&report.threads, ctx.process);
        let sampling = &mut report.sampling;
        sampling.samples = self.profile.samples();
        sampling.lost = ctx.counters.samples_lost + ctx.process.dropped;
        sampling.lost_thread_events = ctx.counters.task_events_lost;
        sampling.stack_errors = ctx.counters.stack_errors;
        sampling.kernel_samples = self.profile.kernel_samples();
        self.notes(ctx);
    }
}

impl From<HotFunction> for HotFunctionEntry {
    fn from(h: HotFunction) -> Self {
        Self {
            function: h.frame.function,
            file: h.frame.file,
            line: h.frame.line,
            module: h.frame.module,
            samples: h.samples,
            share: h.share,
            total_samples: h.total,
            total_share: h.total_share,
        }
    }
}

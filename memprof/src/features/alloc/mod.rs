//! The allocator: calls, latencies, sites and memory overhead.
//!
//! [`allocator`] finds the target's allocator, [`tracer`] attaches its
//! entry points in windows, [`collect`] turns the records into the pure
//! [`analysis`] (with [`memory`], the overhead account).

pub mod allocator;
pub mod analysis;
mod calibrate;
pub mod classes;
pub mod collect;
pub mod cpu_calls;
pub mod cpu_share;
pub mod cpu_sites;
pub mod fast_path;
mod follow;
pub mod heap;
pub mod heap_report;
pub mod memory;
pub mod report;
pub mod syscalls;
pub mod timed_loop;
pub mod tracer;
pub mod untraced;

use std::{
    task::{Context, Poll},
    time::Instant,
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use memprof_common::{maps, SiteRule, ALLOC_SAMPLE_GAPS, ALLOC_SAMPLE_MEAN_BYTES};

use super::{Feature, Plan, ReportContext, Target};
use crate::options::AllocSettings;
use crate::{
    cli::AllocMode,
    error::Result,
    heap::Heap,
    kernel::calls::CallEstimate,
    kernel::{
        loader::{AllocLoad, Load, Probes},
        rings::{drain_batch, poll_ring, readable, Ring},
        windows::{ktime_ns, Detaching},
    },
    object::symbolize::Symbolizer,
    options::Options,
    process::{state::Process, threads::ThreadEvent},
    report::{
        model::{AllocatorCpu, CountBasis},
        Report,
    },
};
use allocator::{Allocator, AllocatorKind};
use analysis::{AllocProfile, ProbeCost};
use classes::SizeClasses;
use collect::AllocCollector;
use heap_report::HeapScale;
use syscalls::SyscallHooks;
use tracer::AllocTracer;
use untraced::UntracedCost;

/// Finds the target's allocator, unless allocator tracing is off. Not
/// finding one is not an error: the rest of the profile still works.
pub fn plan(opts: &Options, target: &Target<'_>, notes: &mut Vec<String>) -> Box<dyn Plan> {
    let allocator = (opts.alloc.mode != AllocMode::Off)
        .then(|| find(target, notes))
        .flatten();
    Box::new(AllocPlan {
        settings: opts.alloc,
        allocator,
        pid: target.pid,
        launched: target.launched.is_some(),
        // A launched command is still our gate (root) when the timing
        // helper starts: it runs as the command will.
        run_as: target
            .launched
            .and(opts.run_as.as_ref())
            .map(|r| (r.uid, r.gid)),
    })
}

fn find(target: &Target<'_>, notes: &mut Vec<String>) -> Option<Allocator> {
    let found = match target.launched {
        None => allocator::find(target.pid),
        Some(command) => allocator::find_for_command(command),
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

struct AllocPlan {
    settings: AllocSettings,
    allocator: Option<Allocator>,
    pid: u32,
    launched: bool,
    run_as: Option<(u32, u32)>,
}

impl Plan for AllocPlan {
    fn load(&self, load: &mut Load) {
        load.alloc = self.allocator.as_ref().map(|a| AllocLoad {
            glibc_header: a.kind == AllocatorKind::Glibc,
        });
        load.alloc_windowed = self.settings.mode == AllocMode::Sampled;
    }

    fn start(
        self: Box<Self>,
        probes: &mut Probes,
        _process: &mut Process,
    ) -> Result<Box<dyn Feature>> {
        let Some(allocator) = self.allocator else {
            return Ok(Box::new(Alloc {
                settings: self.settings,
                traced: None,
            }));
        };
        let ring = readable(
            probes.take_ring(maps::ALLOC_EVENTS)?,
            "the allocator ring buffer",
        )?;
        let sites = AllocSites::take(probes)?;
        let text = tracer::AllocText::take(probes)?;
        let mut ring = ring;
        let mut held = Vec::new();
        // Before the calibration, whose cost per call must include them.
        let mut syscalls = SyscallHooks::new(self.pid);
        syscalls.follow(probes, true)?;
        let (cost, calibration_links) = calibration(&self.settings, probes, &mut ring, &mut held);
        let rule = tracer::large_rule(allocator.kind, self.settings.large_threshold);
        let mut profile = AllocProfile::new(rule, self.launched, SizeClasses::of(allocator.kind));
        let (_, emulated) = tracer::probe_points(&allocator);
        let trap_cost_s = tracer::calibrated_trap_cost(&cost, &emulated);
        profile.set_probe_cost(cost, &emulated);
        let mut collector = AllocCollector::new(profile);
        if sample_chains(&self.settings) {
            let gaps = heap::gaps(ALLOC_SAMPLE_MEAN_BYTES, ALLOC_SAMPLE_GAPS);
            probes.set_alloc_sample_gaps(&gaps);
        }
        let untraced = untraced_cost(self.settings.mode, &allocator, self.pid, self.run_as);
        let mut tracer = AllocTracer::new(allocator, self.settings, self.pid, trap_cost_s);
        tracer.detach_later(calibration_links);
        let started = tracer.open(probes)?;
        collector.window(true, started);
        Ok(Box::new(Alloc {
            settings: self.settings,
            traced: Some(Traced {
                ring,
                tracer,
                syscalls,
                collector,
                held,
                sites,
                text,
                untraced,
            }),
        }))
    }
}

/// The allocator's untraced cost per call ([`untraced`]), timed from now
/// on; None in the benchmark's floor mode, an error saying why it cannot
/// be timed.
fn untraced_cost(
    mode: AllocMode,
    allocator: &Allocator,
    pid: u32,
    run_as: Option<(u32, u32)>,
) -> Option<std::result::Result<untraced::Sampler, String>> {
    if mode == AllocMode::Floor {
        return None;
    }
    let mut sampler = untraced::Timer::for_target(allocator, pid, run_as)
        .and_then(|timer| untraced::Sampler::start(&timer))
        .map_err(|e| format!("{e:#}"));
    match &mut sampler {
        // Its first run before the probes are attached.
        Ok(s) => s.first_run(),
        Err(e) => tracing::info!("untraced allocator cost not measured: {e}"),
    }
    Some(sampler)
}

impl Alloc {
    /// The counts' estimate in sampled mode (the windows', or the one
    /// from the CPU time in the allocator when it claims less), its
    /// basis, and the allocator's untraced cost per call.
    fn estimate(
        &self,
        ctx: &mut ReportContext<'_>,
        out: &Report,
        cpu: Option<&AllocatorCpu>,
    ) -> (Option<CallEstimate>, CountBasis, Option<UntracedCost>) {
        let Some(t) = &self.traced else {
            return (None, CountBasis::Windows, None);
        };
        let timed = t.untraced.as_ref().map(|u| match u {
            Ok(sampler) => sampler.cost(),
            Err(why) => Err(why.clone()),
        });
        let untraced = match timed {
            Some(Ok(cost)) => cost,
            Some(Err(why)) => {
                ctx.notes.push(format!(
                    "the allocator's untraced cost per call was not measured: {why}"
                ));
                None
            }
            None => None,
        };
        if self.settings.mode != AllocMode::Sampled {
            return (None, CountBasis::Windows, untraced);
        }
        let windows = t.tracer.call_estimate(ctx.probes);
        let from_cpu = match (cpu, &untraced) {
            (Some(c), Some(u)) if windows.error.is_some() => {
                let time = cpu_calls::AllocatorTime {
                    samples: c.samples - cpu_calls::outside_calls(c),
                    received: out.sampling.samples,
                    lost: out.sampling.lost,
                    frequency_hz: out.sampling.frequency_hz,
                };
                // The mix of operations: of the calls made while every
                // probe was attached, if any.
                let interior = &t.collector.interior_calls;
                let mix = match interior.iter().sum::<u64>() {
                    0 => report::seen_per_op(&t.collector.profile),
                    _ => interior.clone(),
                };
                cpu_calls::estimate(&windows, &mix, time, u)
            }
            _ => None,
        };
        let (estimate, basis) = pick_estimate(Some(windows), from_cpu);
        (estimate, basis, untraced)
    }
}

impl Alloc {
    /// The allocator's untraced cost, and the small calls' medians that
    /// come from it ([`fast_path`]).
    fn report_untraced(
        &self,
        notes: &mut Vec<String>,
        out: &mut Report,
        untraced: Option<UntracedCost>,
    ) {
        if let Some(u) = &untraced {
            let correction = self.correction();
            let settled = fast_path::settle_medians(&mut out.allocator.ops, u, correction);
            notes.extend(report::fast_path_note(settled, correction));
        }
        out.allocator.untraced_ns = untraced.map(|u| u.report());
    }

    /// What the probes' correction took off the traced calls, if the
    /// probes were calibrated.
    /// The allocator's CPU share, by function and by call site. The CPU
    /// feature reports first: its hottest functions are known.
    fn cpu(&self, out: &Report, symbolizer: &mut Symbolizer) -> Option<AllocatorCpu> {
        let t = self.traced.as_ref()?;
        let allocator = &t.tracer.allocator;
        let mut cpu = cpu_share::cpu_share(
            &out.hot_functions,
            allocator.kind,
            &module_name(&allocator.path),
            out.sampling.samples,
        )?;
        cpu_sites::fill(&mut cpu, &t.collector.cpu_sites, allocator.kind, symbolizer);
        cpu_sites::count_all(&mut cpu, out.sampling.samples);
        Some(cpu)
    }

    fn correction(&self) -> Option<fast_path::Correction> {
        let profile = &self.traced.as_ref()?.collector.profile;
        let (cost, used) = (profile.probe_cost(), profile.probe_kinds());
        cost.is_calibrated().then(|| fast_path::Correction {
            resolution_ns: cost.resolution_ns(&used),
            added_ns: cost.largest_added_ns(&used),
        })
    }
}

/// The allocator's module as the samples name it: a mapping's name as
/// it is (a program started by a link is named by the link), else the
/// file a given path leads to (`LD_PRELOAD=.../libtcmalloc_minimal.so.4`
/// maps `libtcmalloc_minimal.so.4.5.9`).
fn module_name(path: &str) -> String {
    let known = crate::process::objects::open_path(path) != std::path::Path::new(path);
    let real = (!known).then(|| std::fs::canonicalize(path).ok()).flatten();
    let path = real.as_deref().and_then(|p| p.to_str()).unwrap_or(path);
    path.rsplit('/').next().unwrap_or_default().to_string()
}

/// The estimate with the smaller claimed error: the windows' or the one
/// from the CPU time.
fn pick_estimate(
    windows: Option<CallEstimate>,
    from_cpu: Option<CallEstimate>,
) -> (Option<CallEstimate>, CountBasis) {
    match (windows, from_cpu) {
        (Some(w), Some(c)) if matches!((c.error, w.error), (Some(ce), Some(we)) if ce < we) => {
            (Some(c), CountBasis::CpuTime)
        }
        (w, _) => (w, CountBasis::Windows),
    }
}

/// Whether allocations' call chains are sampled: not in the benchmark's
/// floor mode, nor when the settings leave them out (to measure their
/// cost).
fn sample_chains(settings: &AllocSettings) -> bool {
    settings.mode != AllocMode::Floor && settings.chains
}

/// The probes' own cost on this machine, and the calibration's links
/// (nothing to subtract in the benchmark's floor mode, or when the
/// settings leave it out; a failed calibration is a warning, and latencies
/// are then raw).
fn calibration(
    settings: &AllocSettings,
    probes: &mut Probes,
    ring: &mut Ring,
    held: &mut Vec<Vec<u8>>,
) -> (ProbeCost, calibrate::Links) {
    if !settings.calibrate || settings.mode == AllocMode::Floor {
        return (ProbeCost::default(), Vec::new());
    }
    calibrate::run(probes, ring, held).unwrap_or_else(|e| {
        tracing::warn!(
            "cannot calibrate the allocator probes: {e:#}; latencies include their cost"
        );
        (ProbeCost::default(), Vec::new())
    })
}

/// The allocator feature: off, not found, or traced.
pub struct Alloc {
    settings: AllocSettings,
    traced: Option<Traced>,
}

struct Traced {
    ring: Ring,
    tracer: AllocTracer,
    /// The allocator's syscall hooks, attached with the windows.
    syscalls: SyscallHooks,
    collector: AllocCollector,
    /// Records held until the thread records are read again.
    held: Vec<Vec<u8>>,
    /// The kernel's table of classified allocation call sites.
    sites: AllocSites,
    text: tracer::AllocText,
    /// The allocator's cost per call without probes, if measured.
    /// (Timed every 100 ms by a helper process; a thread reads it.)
    untraced: Option<std::result::Result<untraced::Sampler, String>>,
}

/// The kernel's table of allocation call sites, written as the collector
/// classifies them ([`AllocCollector::new_sites`]).
struct AllocSites(BpfHashMap<MapData, u64, SiteRule>);

impl AllocSites {
    fn take(probes: &mut Probes) -> Result<Self> {
        let map = probes.take_map(maps::ALLOC_SITES)?;
        Ok(Self(BpfHashMap::try_from(map).map_err(anyhow::Error::new)?))
    }

    fn write(&mut self, sites: &mut Vec<(u64, SiteRule)>) {
        for (ra, rule) in sites.drain(..) {
            if let Err(e) = self.0.insert(ra, rule, 0) {
                tracing::debug!("allocation site {ra:#x} not written: {e}");
            }
        }
    }
}

impl Feature for Alloc {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.traced {
            Some(t) => poll_ring(&mut t.ring, cx),
            None => Poll::Pending,
        }
    }

    /// A record of a thread whose creation record is not read yet is
    /// held, with every record after it, until the thread records have
    /// been read again: the live-thread count at its calls needs it.
    fn drain(&mut self, process: &mut Process) -> bool {
        let Some(t) = &mut self.traced else {
            return false;
        };
        let (collector, held) = (&mut t.collector, &mut t.held);
        // Held records are read once, after the thread records were read
        // again: if their thread is still unknown, it is not coming.
        for b in std::mem::take(held) {
            collector.on_record(&b, process);
        }
        let mut waiting = false;
        let more = drain_batch(&mut t.ring, |b| {
            // A launched command's process runs our gate until its exec.
            if process.awaiting_exec() {
                return;
            }
            let unknown =
                AllocCollector::thread_of(b).is_some_and(|tid| !process.knows_thread(tid));
            if waiting || unknown {
                waiting = true;
                held.push(b.to_vec());
            } else {
                collector.on_record(b, process);
            }
        });
        t.sites.write(&mut collector.new_sites);
        t.text.update(process, &t.tracer.allocator.path);
        more || waiting
    }

    fn after_drain(&mut self, _probes: &mut Probes, _process: &mut Process) {
        if let Some(t) = &mut self.traced {
            t.tracer.poll_cpu();
        }
    }

    fn on_thread(&mut self, ev: &ThreadEvent, _process: &mut Process) {
        // A new program image maps the allocator elsewhere: the range
        // written for the old one (a launching shell's or `env`'s libc)
        // would keep every sample of the new one out of the sites.
        if let (ThreadEvent::Exec { tid, .. }, Some(t)) = (ev, &mut self.traced) {
            t.text.forget(*tid);
        }
    }

    fn deadline(&self) -> Option<Instant> {
        self.traced.as_ref().and_then(|t| t.tracer.deadline())
    }

    /// Ends or starts a window when the controller says so; the syscall
    /// hooks follow the windows, and what they cost is charged to them.
    fn on_deadline(&mut self, probes: &mut Probes, notes: &mut Vec<String>) {
        let Some(t) = &mut self.traced else { return };
        if let Some(cost) = t.syscalls.cost(probes) {
            t.tracer.set_extra_cost(cost);
        }
        let before = ktime_ns();
        let result = t.tracer.on_deadline(probes);
        if t.tracer.detaching() {
            t.collector.window_closing(before);
        }
        match t.syscalls.follow(probes, t.tracer.attached()) {
            Ok(true) => t.collector.syscalls_resumed(),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!("cannot re-attach the allocator's syscall hooks: {e}");
                notes.push(format!(
                    "allocator syscall hooks could not be re-attached: {e}"
                ));
                t.syscalls.finish();
            }
        }
        match result {
            Ok(Some(opened)) => t.collector.window(opened, ktime_ns()),
            Ok(None) => {}
            Err(e) => {
                // The allocator's file may be gone (e.g. upgraded): keep
                // tracing the rest rather than fail the session.
                tracing::warn!("cannot re-attach the allocator probes: {e}");
                notes.push(format!("allocator probes could not be re-attached: {e}"));
                t.collector.window(false, ktime_ns());
                t.tracer.finish(probes);
                t.tracer.wait_detached();
            }
        }
    }

    fn windowed(&self) -> bool {
        self.traced.is_some() && self.settings.mode == AllocMode::Sampled
    }

    fn settle(&mut self, process: &mut Process, _heap: Option<&dyn Heap>) {
        if let Some(t) = &mut self.traced {
            t.collector.settle(process);
        }
    }

    fn finish(&mut self, probes: &mut Probes, _process: &mut Process) {
        if let Some(t) = &mut self.traced {
            if t.tracer.attached() {
                t.collector.window(false, ktime_ns());
            }
            // The syscall hooks first: their links' release waits for an
            // RCU tasks-trace grace period, as the uprobe links' does,
            // and one started behind the other made the allocator's
            // programs outlive the tool.
            t.syscalls.finish();
            // Starts detaching; the report is built and shown meanwhile
            // (the kernel takes a while), and the session waits for the
            // detach before the process ends.
            t.tracer.finish(probes);
            if let Some(Ok(sampler)) = &mut t.untraced {
                sampler.stop();
            }
        }
    }

    fn heap(&self) -> Option<&dyn Heap> {
        self.traced
            .as_ref()
            .map(|t| &t.collector.profile as &dyn Heap)
    }

    fn report(&mut self, ctx: &mut ReportContext<'_>, out: &mut Report) {
        let lost = ctx.counters.alloc_events_lost;
        if lost > 0 {
            ctx.notes.push(format!(
                "{lost} allocator events were lost (ring buffer full): allocator counts are low"
            ));
        }
        let (tracer, profile) = match &self.traced {
            Some(t) => (Some(&t.tracer), Some(&t.collector.profile)),
            None => (None, None),
        };
        if let Some(n) = profile.map(|p| p.untracked_blocks()).filter(|&n| n > 0) {
            ctx.notes.push(format!(
                "{n} blocks were allocated while {} were live, the tracker's cap: live bytes, \
                 leaks and memory composition leave them out",
                analysis::MAX_LIVE_BLOCKS
            ));
        }
        let cpu = self.cpu(out, ctx.symbolizer);
        let (estimate, basis, untraced) = self.estimate(ctx, out, cpu.as_ref());
        if let (Some(tracer), Some(e)) = (tracer, &estimate) {
            tracing::debug!("allocator calls estimated ({basis:?}): {e:?}");
            if let Some(note) = report::estimate_note(tracer, e, basis, self.settings.budget) {
                ctx.notes.push(note);
            }
        }
        let symbolizer = &mut *ctx.symbolizer;
        out.allocator = report::report(
            tracer,
            estimate.as_ref(),
            profile,
            self.settings.mode,
            lost,
            ctx.kernel_stats,
            |place| symbolizer.code_inlined(place).clone(),
        );
        out.allocator.cpu = cpu;
        out.allocator.count_basis = out.allocator.sampled.then_some(basis);
        self.report_untraced(ctx.notes, out, untraced);
        if let Some(t) = &self.traced {
            out.allocator.named_at_wrapper = t.collector.named_at_wrapper;
            ctx.notes.extend(report::wrapper_note(
                t.collector.named_at_wrapper,
                out.allocator.calls_traced,
            ));
        }
        let cost = out.allocator.probe_cost_ns.as_ref();
        ctx.notes.extend(cost.and_then(report::pace_note));
        if let (Some(t), true) = (&self.traced, sample_chains(&self.settings)) {
            let scale = HeapScale {
                sent: ctx.counters.alloc_stacks,
                capped: ctx.counters.alloc_stacks_capped,
                windows: report::alloc_factor(
                    self.settings.mode,
                    estimate.as_ref(),
                    &t.collector.profile,
                ),
                all_frees: self.settings.mode == AllocMode::Full,
            };
            let mut symbolize = |place: &_| symbolizer.code_inlined(place).clone();
            out.allocator.heap_profile = Some(heap_report::report(
                &t.collector.heap,
                scale,
                &mut symbolize,
            ));
            if let Some(chains) = &mut out.alloc_chains {
                *chains = heap_report::export_chains(&t.collector.heap, scale, &mut symbolize);
            }
        }
    }

    fn take_detaching(&mut self) -> Detaching {
        self.traced
            .as_mut()
            .map(|t| t.tracer.take_detaching())
            .unwrap_or_default()
    }
}

//! Locks: contention seen from the kernel (futex waits and wakes, kernel
//! locks) and critical sections from the pthread lock functions.
//!
//! [`tracer`] finds and probes the lock functions in windows, [`collect`]
//! turns the records into the pure [`analysis`], and [`report`] assembles
//! the report's lock entries.

pub mod analysis;
pub mod collect;
pub mod durations;
mod governed;
pub mod governor;
pub mod holds;
pub mod hook_windows;
pub mod report;
pub mod sites;
pub mod traced;
pub mod tracer;
pub mod ulcp;

use std::{
    cell::Cell,
    task::{Context, Poll},
    time::Instant,
};

use memprof_common::{locks::HoldEvent, maps, SampleEvent, WaitSpan, CONTENTION_KEYS};

use super::{Feature, Plan, ReportContext, Target};
use crate::{
    cli::LockMode,
    error::Result,
    heap::{Heap, Remembered, Unseen},
    kernel::{
        contention::ContentionMaps,
        loader::{Load, Probes},
        rings::{decoded, drain_batch, poll_ring, readable, Ring},
        windows::{Detaching, Windowed},
    },
    options::Options,
    process::{
        chunks::{Memory, ProcMemory},
        state::Process,
    },
    report::{
        model::{LockContention, LockEntry},
        Report,
    },
};
use collect::LockCollector;
use governed::Governed;
use governor::Sampling;
use traced::Scale;
use tracer::LockLibrary;

/// Finds the target's pthread lock functions unless their probes are off.
/// Not finding them (a program with no pthread locks, e.g. Rust's
/// futex-based std) is not an error: contention is still seen from the
/// kernel.
pub fn plan(opts: &Options, target: &Target<'_>, notes: &mut Vec<String>) -> Box<dyn Plan> {
    let library = (opts.lock_mode != LockMode::Off)
        .then(|| find(target, notes))
        .flatten();
    Box::new(LockPlan {
        library,
        mode: opts.lock_mode,
        budget: opts.alloc.budget,
        pid: target.pid,
        ulcp: !opts.experimental.ulcp_off,
    })
}

fn find(target: &Target<'_>, notes: &mut Vec<String>) -> Option<LockLibrary> {
    match tracer::find(target.pid, target.launched) {
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

struct LockPlan {
    library: Option<LockLibrary>,
    mode: LockMode,
    budget: f64,
    pid: u32,
    /// The unnecessary-contention analysis runs (not with `MEMPROF_ULCP=off`,
    /// the benchmark's comparison: it adds no kernel work, only the
    /// loader's).
    ulcp: bool,
}

impl Plan for LockPlan {
    fn load(&self, load: &mut Load) {
        load.lock_uprobes = self.library.is_some();
        load.lock_windowed = self.mode == LockMode::Sampled;
    }

    fn start(
        self: Box<Self>,
        probes: &mut Probes,
        _process: &mut Process,
    ) -> Result<Box<dyn Feature>> {
        let futex = readable(probes.take_ring(maps::LOCK_EVENTS)?, "the lock ring buffer")?;
        let contention = ContentionMaps::take(probes)?;
        let calls = match self.library {
            Some(library) => {
                let holds = readable(
                    probes.take_ring(maps::HOLD_EVENTS)?,
                    "the critical-section ring buffer",
                )?;
                let mut tracer = tracer::tracer(library, self.mode, self.budget, self.pid);
                // The default mode waits for a futex wait (see `Armed`).
                if self.mode != LockMode::Sampled {
                    tracer.open(probes)?;
                }
                Some((holds, tracer))
            }
            None => None,
        };
        let armed = (calls.is_some() && self.mode == LockMode::Sampled).then(|| Armed {
            since: Instant::now(),
            opened_after: None,
        });
        // The sched hooks' waits show the holders' sections between lock
        // windows, and with no lock call traced at all (the syscall path
        // has no waker's thread).
        let sched = probes.futex_hooks.kind == "sched";
        let ulcp = ((calls.is_some() || sched) && self.ulcp).then(ulcp::Ulcp::default);
        // In full mode every section is traced: the waits would only
        // repeat them.
        let spans = if ulcp.is_some() && sched && self.mode != LockMode::Full {
            let ring = readable(probes.take_ring(maps::WAIT_SPANS)?, "the wait-span ring")?;
            probes.send_wait_spans(true);
            Some(ring)
        } else {
            None
        };
        let governed =
            (probes.futex_hooks.kind == "sched").then(|| Governed::new(self.budget, self.pid));
        Ok(Box::new(Locks {
            futex,
            contention,
            calls,
            calls_due: Cell::new(None),
            governed,
            hooks: probes.futex_hooks.kind,
            mode: self.mode,
            collector: LockCollector::default(),
            ulcp,
            spans,
            armed,
            blocks: Remembered::default(),
            unseen: Unseen::default(),
        }))
    }
}

/// The locks feature.
pub struct Locks {
    /// Stack samples of futex calls and kernel lock waits.
    futex: Ring,
    /// The kernel's contention aggregates.
    contention: ContentionMaps,
    /// Critical sections and the lock uprobes (None when they are off or
    /// no pthread library was found).
    calls: Option<(Ring, Windowed)>,
    /// The lock probes' deadline when last asked.
    calls_due: Cell<Option<Instant>>,
    /// The futex hooks' governor (None on the syscall path, which has no
    /// stride).
    governed: Option<Governed>,
    mode: LockMode,
    /// How futex waits are hooked (kept for the report after detach).
    hooks: &'static str,
    collector: LockCollector,
    /// Whether the waits were needed (with the lock uprobes).
    ulcp: Option<ulcp::Ulcp>,
    /// Traced futex waits with their holders, for `ulcp`.
    spans: Option<Ring>,
    /// The default mode's lock probes, before and after their first
    /// window.
    armed: Option<Armed>,
    /// The heap blocks that held the waited-on words: a lock in a block
    /// the program freed before the report is still named by its
    /// allocation site.
    blocks: Remembered,
    /// The blocks allocated before tracing that held waited-on words,
    /// found from glibc's headers, with the globals that keep them.
    unseen: Unseen,
}

/// In the default mode the lock probes' first window opens at the first
/// futex wait of the target, not at the start: a lock nobody waits for is
/// no contention to report, and its probes would only cost. An
/// uncontended 8 ns lock/unlock loop traps about 400x slower while they
/// are attached, so the 20 ms first window and its detach took about 4%
/// of a 2.5 s run (0.94 of untraced in 6 alternating rounds; 0.97 with
/// `--lock-mode off`).
struct Armed {
    /// The session's start.
    since: Instant,
    /// How long after it the first window opened (None: not yet).
    opened_after: Option<std::time::Duration>,
}

impl Armed {
    /// Whether the first window is due: a futex wait was seen.
    fn due(&self, collector: &LockCollector) -> bool {
        self.opened_after.is_none() && collector.futex_waited
    }

    /// What the report says of it: the lock calls never traced, or traced
    /// from a point the estimates start at.
    fn note(&self) -> Option<String> {
        match self.opened_after {
            None => Some(
                "no thread of the target waited on a futex: its pthread lock calls were not \
                 traced (the default mode traces them, in windows, from the first wait on; \
                 --lock-mode full traces every call)"
                    .into(),
            ),
            Some(after) if after >= LATE_OPEN => Some(format!(
                "the lock calls were traced from the target's first futex wait on, {:.1} s into \
                 the session: acquisitions count from then",
                after.as_secs_f64()
            )),
            Some(_) => None,
        }
    }
}

/// A first window opened this late is worth a note (the estimates leave
/// out the time before it).
const LATE_OPEN: std::time::Duration = std::time::Duration::from_millis(500);

impl Feature for Locks {
    fn on_sample(&mut self, ev: &SampleEvent, process: &mut Process) {
        if let Some(u) = &mut self.ulcp {
            u.on_sample(ev, process);
        }
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if let Poll::Ready(r) = poll_ring(&mut self.futex, cx) {
            return Poll::Ready(r);
        }
        if let Some(spans) = &mut self.spans {
            if let Poll::Ready(r) = poll_ring(spans, cx) {
                return Poll::Ready(r);
            }
        }
        match &mut self.calls {
            Some((holds, _)) => poll_ring(holds, cx),
            None => Poll::Pending,
        }
    }

    fn drain(&mut self, process: &mut Process) -> bool {
        let collector = &mut self.collector;
        let mut more = drain_batch(&mut self.futex, |b| collector.on_record(b, process));
        for (ip, hint) in collector.new_hints.drain(..) {
            self.contention.install_hint(ip, hint);
        }
        let ulcp = &mut self.ulcp;
        if let (Some(spans), Some(u)) = (&mut self.spans, ulcp.as_mut()) {
            more |= drain_batch(spans, |b| {
                if let Some(ev) = decoded(b, "wait-span", WaitSpan::from_bytes) {
                    u.on_wait(&ev);
                }
            });
        }
        if let Some((holds, _)) = &mut self.calls {
            more |= drain_batch(holds, |b| {
                if let Some(ev) = decoded(b, "critical-section", HoldEvent::from_bytes) {
                    if collector.on_hold(&ev, process) {
                        if let Some(u) = ulcp.as_mut() {
                            u.on_hold(&ev);
                        }
                    }
                }
            });
        }
        more
    }

    fn after_drain(&mut self, _probes: &mut Probes, _process: &mut Process) {
        if let Some((_, tracer)) = &mut self.calls {
            tracer.poll_cpu();
        }
    }

    fn deadline(&self) -> Option<Instant> {
        // Kept: the tracer computes some deadlines afresh from the clock.
        let opening = self
            .armed
            .as_ref()
            .is_some_and(|a| a.due(&self.collector))
            .then(Instant::now);
        self.calls_due
            .set(opening.or_else(|| self.calls.as_ref().and_then(|(_, t)| t.deadline())));
        let governor = self.governed.as_ref().map(Governed::deadline);
        match (self.calls_due.get(), governor) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Ends or starts a window when the controller says so, and lets the
    /// governor look at the futex hooks' cost.
    fn on_deadline(&mut self, probes: &mut Probes, notes: &mut Vec<String>) {
        let now = Instant::now();
        if let Some(g) = self.governed.as_mut() {
            g.on_deadline(probes, notes);
        }
        if self.calls_due.get().is_none_or(|d| d > now) {
            return;
        }
        let Some((_, tracer)) = &mut self.calls else {
            return;
        };
        if let Some(armed) = self.armed.as_mut().filter(|a| a.due(&self.collector)) {
            armed.opened_after = Some(armed.since.elapsed());
            if let Err(e) = tracer.open(probes) {
                tracing::warn!("cannot attach the lock probes: {e}");
                notes.push(format!("lock probes could not be attached: {e}"));
            }
            return;
        }
        if let Err(e) = tracer.on_deadline(probes) {
            tracing::warn!("cannot re-attach the lock probes: {e}");
            notes.push(format!("lock probes could not be re-attached: {e}"));
            tracer.finish(probes);
        }
    }

    fn windowed(&self) -> bool {
        self.calls.is_some() && self.mode == LockMode::Sampled
    }

    /// Looks up the blocks under newly waited-on words while the target
    /// runs: traced ones before they are freed, and the others (allocated
    /// before tracing) with the global that keeps each, searched for here
    /// rather than at each of the dashboard's reports, and kept for after
    /// the target exits.
    fn settle(&mut self, process: &mut Process, heap: Option<&dyn Heap>) {
        if let Some(u) = &mut self.ulcp {
            u.profile.settle();
        }
        if let Some(heap) = heap {
            self.blocks.settle(heap, self.collector.waited_words());
        }
        let untraced: Vec<u64> = self
            .collector
            .waited_words()
            .filter(|&w| !self.unseen.settled(w) && !self.blocks.holds(w))
            .collect();
        if untraced.is_empty() {
            return;
        }
        if let Some(mem) = ProcMemory::open(process.pid()) {
            self.unseen.settle(process.maps(), &mem, untraced);
        }
    }

    fn finish(&mut self, probes: &mut Probes, _process: &mut Process) {
        if let Some(g) = &mut self.governed {
            g.windows.end(Instant::now());
        }
        if let Some((_, tracer)) = &mut self.calls {
            tracer.finish(probes);
        }
        if let Some(u) = &mut self.ulcp {
            u.profile.finish();
        }
    }

    fn report(&mut self, ctx: &mut ReportContext<'_>, out: &mut Report) {
        let counters = ctx.counters;
        let sampling = self.sampling(counters);
        let mut snapshot = self.contention.snapshot();
        for (_, c) in &mut snapshot {
            hook_windows::scale(c, sampling.factor);
        }
        self.collector
            .rebuild(&snapshot, &self.contention.threads());
        contention_notes(counters, ctx.notes);
        if counters.hold_events_lost > 0 {
            ctx.notes.push(format!(
                "{} critical sections were lost (ring buffer full): acquisitions are low",
                counters.hold_events_lost
            ));
        }
        let tracer = self.calls.as_ref().map(|(_, t)| t);
        let estimate = tracer.map(|t| t.call_estimate(ctx.probes));
        out.lock_tracing = traced::tracing(tracer, estimate.as_ref(), counters);
        if let (Some(t), Some(e)) = (&out.lock_tracing, &estimate) {
            ctx.notes.extend(traced::estimate_note(t, e));
        }
        ctx.notes.extend(self.armed.as_ref().and_then(Armed::note));
        self.collector.profile.prune_holds();
        let scale = estimate.map(|e| match self.mode {
            LockMode::Sampled => Scale::new(&e, &self.collector.profile),
            LockMode::Full | LockMode::Off => Scale::exact(),
        });
        let heap: Option<&dyn Heap> = ctx.heap;
        // Read while the target runs (attached): glibc's arena locks.
        let memory = ProcMemory::open(ctx.process.pid());
        out.locks = report::report(
            &self.collector.profile,
            ctx.process.maps(),
            heap.map(|h| (h, self.blocks.over(h.index()))),
            memory.as_ref().map(|m| m as &dyn Memory),
            &mut self.unseen,
            scale.as_ref(),
            ctx.symbolizer,
        );
        ctx.notes.extend(report::arena_note(&out.locks));
        if let Some(u) = &self.ulcp {
            let inputs = ulcp::report::Inputs {
                profile: &u.profile,
                sites: &self.collector.profile,
                maps: ctx.process.maps(),
                heap,
            };
            ulcp::report::annotate(&mut out.locks, &inputs, ctx.symbolizer);
            ctx.notes
                .extend(ulcp::report::notes(&out.locks, &u.profile, self.mode));
        }
        out.lock_contention = Some(self.contention_report(ctx.probes, counters, &sampling));
        if let Some(c) = &out.lock_contention {
            estimate_contention(&mut out.locks, &sampling);
            ctx.notes.extend(stride_note(c, &out.locks));
        }
        if let Some(g) = &self.governed {
            ctx.notes.extend(g.windows_note());
        }
        let acquisitions_error = out.lock_tracing.as_ref().and_then(|t| t.acquisitions_error);
        let changed = traced::make_consistent(&mut out.locks, acquisitions_error);
        ctx.notes.extend(traced::consistency_note(changed));
        let unplaced = self.collector.profile.hold_table().sites_unplaced;
        if unplaced > 0 {
            ctx.notes.push(format!(
                "{unplaced} critical sections' call sites were not resolved (more than {} \
                 sites): they count in the totals only",
                holds::SITE_PLACES_MAX
            ));
        }
    }

    fn take_detaching(&mut self) -> Detaching {
        self.calls
            .as_mut()
            .map(|(_, t)| t.take_detaching())
            .unwrap_or_default()
    }
}

impl Locks {
    /// How the waits were sampled: the stride, and the hooks' windows.
    fn sampling(&self, counters: &crate::kernel::maps::Counters) -> Sampling {
        let Some(g) = &self.governed else {
            return Sampling::EXACT;
        };
        let now = Instant::now();
        let waits = counters.futex_waits_traced + counters.futex_waits_skipped;
        Sampling {
            stride_max: g.governor.stride_max(),
            factor: g.windows.factor(now),
            rate_error: g.windows.rate_error(now, waits),
        }
    }

    /// How futex waits were traced.
    fn contention_report(
        &self,
        probes: Option<&Probes>,
        counters: &crate::kernel::maps::Counters,
        sampling: &Sampling,
    ) -> LockContention {
        let (stride, stride_max) = self
            .governed
            .as_ref()
            .map_or((1, 1), |g| (g.governor.stride(), g.governor.stride_max()));
        let windows = self.governed.as_ref().map_or(0, |g| g.windows.gaps());
        LockContention {
            hooks: probes
                .map_or(self.hooks, |p| p.futex_hooks.kind)
                .to_string(),
            stride_max,
            stride,
            waits_traced: counters.futex_waits_traced,
            waits_skipped: counters.futex_waits_skipped,
            slot_collisions: counters.futex_slot_collisions,
            waits_as_sections: counters.wait_spans,
            waits_as_sections_lost: counters.wait_spans_lost,
            windows,
            attached_share: 1.0 / sampling.factor,
        }
    }
}

/// Gives each entry its claimed error when the governor traced only some
/// waits (futex and kernel lock waits alike).
fn estimate_contention(locks: &mut [LockEntry], sampling: &Sampling) {
    for l in locks.iter_mut() {
        let cv = governor::histogram_cv(&l.wait_histogram);
        l.contention_error = governor::claimed_error(sampling, l.contentions, cv);
    }
}

/// Says that futex waits were sampled, and how roughly.
fn stride_note(c: &LockContention, locks: &[LockEntry]) -> Option<String> {
    if c.stride_max <= 1 && c.windows == 0 {
        return None;
    }
    let top = locks
        .iter()
        .find_map(|l| Some((l.label(), l.contention_error?)));
    let top = top.map_or(String::new(), |(name, e)| {
        format!(" (±{:.0}% for {name})", e * 100.0)
    });
    let windows = format!(
        "the hooks attached {:.0}% of the time (in {} windows)",
        c.attached_share * 100.0,
        c.windows + 1
    );
    let how = match (c.stride_max > 1, c.windows > 0) {
        (true, true) => format!(
            "traced with probability down to 1/{}, {windows},",
            c.stride_max
        ),
        (true, false) => format!("traced with probability down to 1/{}", c.stride_max),
        (false, _) => format!("traced only while {windows},"),
    };
    Some(format!(
        "futex waits were {how} to keep the always-on futex hooks within {:.0}% of the budget: \
         contentions, wait times and holder blame are estimates, each lock's claimed error in \
         the JSON (contention_error){top}",
        governor::BUDGET_SHARE * 100.0,
    ))
}

/// What the kernel could not aggregate or sample, said in the notes.
fn contention_notes(counters: &crate::kernel::maps::Counters, notes: &mut Vec<String>) {
    if counters.contention_overflow > 0 {
        notes.push(format!(
            "{} futex calls or kernel lock waits were aggregated by call site only: more \
             than {CONTENTION_KEYS} (lock, site) pairs (see \"other locks\")",
            counters.contention_overflow
        ));
    }
    if counters.contention_dropped > 0 {
        notes.push(format!(
            "{} futex calls or kernel lock waits were not counted (both contention tables \
             full): lock counts are low",
            counters.contention_dropped
        ));
    }
    if counters.lock_events_lost > 0 {
        notes.push(format!(
            "{} lock stack samples were lost (ring buffer full): some call sites may be \
             unnamed; counts are not affected",
            counters.lock_events_lost
        ));
    }
    if counters.wait_spans_lost > 0 {
        notes.push(format!(
            "{} of {} futex waits sent to the unnecessary-contention analysis were lost (ring \
             buffer full): fewer holders' sections were classified; counts are not affected",
            counters.wait_spans_lost,
            counters.wait_spans + counters.wait_spans_lost
        ));
    }
}

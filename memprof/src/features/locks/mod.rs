//! Locks: contention seen from the kernel (futex waits and wakes, kernel
//! locks) and critical sections from the pthread lock functions.
//!
//! [`tracer`] finds and probes the lock functions in windows, [`collect`]
//! turns the records into the pure [`analysis`], and [`report`] assembles
//! the report's lock entries.

pub mod analysis;
pub mod collect;
pub mod durations;
pub mod holds;
pub mod report;
pub mod sites;
pub mod traced;
pub mod tracer;

use std::{
    task::{Context, Poll},
    time::Instant,
};

use memprof_common::{locks::HoldEvent, maps, SampleEvent, CONTENTION_KEYS};

use super::{alloc::analysis::AllocProfile, ulcp, Feature, Plan, ReportContext, Target};
use crate::{
    cli::LockMode,
    error::Result,
    kernel::{
        contention::ContentionMaps,
        loader::{Load, Probes},
        rings::{decoded, drain_batch, poll_ring, readable, Ring},
        windows::{Detaching, Windowed},
    },
    options::Options,
    process::state::Process,
    report::Report,
};
use collect::LockCollector;
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
}

impl Plan for LockPlan {
    fn load(&self, load: &mut Load) {
        load.lock_uprobes = self.library.is_some();
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
                tracer.open(probes)?;
                Some((holds, tracer))
            }
            None => None,
        };
        // `MEMPROF_ULCP=off` leaves the analysis out (the benchmark's
        // comparison: it adds no kernel work, only the loader's).
        let off = std::env::var("MEMPROF_ULCP").is_ok_and(|v| v == "off");
        let ulcp = (calls.is_some() && !off).then(ulcp::Ulcp::default);
        Ok(Box::new(Locks {
            futex,
            contention,
            calls,
            mode: self.mode,
            collector: LockCollector::default(),
            ulcp,
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
    mode: LockMode,
    collector: LockCollector,
    /// Whether the waits were needed (with the lock uprobes).
    ulcp: Option<ulcp::Ulcp>,
}

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

    fn deadline(&self) -> Option<Instant> {
        self.calls.as_ref().and_then(|(_, t)| t.deadline())
    }

    /// Ends or starts a window when the controller says so.
    fn on_deadline(&mut self, probes: &mut Probes, notes: &mut Vec<String>) {
        let Some((_, tracer)) = &mut self.calls else {
            return;
        };
        if let Err(e) = tracer.on_deadline(probes) {
            tracing::warn!("cannot re-attach the lock probes: {e}");
            notes.push(format!("lock probes could not be re-attached: {e}"));
            tracer.finish(probes);
        }
    }

    fn windowed(&self) -> bool {
        self.calls.is_some() && self.mode == LockMode::Sampled
    }

    fn settle(&mut self, _process: &mut Process, _heap: Option<&AllocProfile>) {
        if let Some(u) = &mut self.ulcp {
            u.profile.settle();
        }
    }

    fn finish(&mut self, probes: &mut Probes, _process: &mut Process) {
        if let Some((_, tracer)) = &mut self.calls {
            tracer.finish(probes);
        }
        if let Some(u) = &mut self.ulcp {
            u.profile.finish();
        }
    }

    fn report(&mut self, ctx: &mut ReportContext<'_>, out: &mut Report) {
        let counters = ctx.counters;
        self.collector
            .rebuild(&self.contention.snapshot(), &self.contention.threads());
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
        self.collector.profile.prune_holds();
        let scale = estimate.map(|e| match self.mode {
            LockMode::Sampled => Scale::new(&e, &self.collector.profile),
            LockMode::Full | LockMode::Off => Scale::exact(),
        });
        let heap: Option<&AllocProfile> = ctx.heap;
        out.locks = report::report(
            &self.collector.profile,
            ctx.process.maps(),
            heap,
            scale.as_ref(),
            ctx.symbolizer,
        );
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
        let changed = traced::make_consistent(&mut out.locks);
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
}

//! Cache use (hot and cold fields): how much of each cache line the
//! target's data accesses bring in is used, per object, from the same
//! sampled data addresses the false-sharing analysis reads.
//!
//! Samples are kept per address ([`analysis::CacheProfile`]); the heap
//! block under each new address is looked up while it is live (at each
//! settle, as the false-sharing lines are); the report groups addresses
//! into objects and folds each onto its element ([`report`]).

pub mod analysis;
#[cfg(test)]
pub(crate) mod fixture;
pub mod report;
pub mod section;
mod tab;
mod text;

use std::time::{Duration, Instant};

use memprof_common::{sharing::recipe, SampleEvent, SAMPLE_FLAG_ADDR, SAMPLE_FLAG_KERNEL};

use super::{FastMap, Feature, Plan, ReportContext, Target};
use crate::{
    error::Result,
    heap::{Heap, HeapBlock},
    kernel::loader::Probes,
    options::Options,
    process::state::Process,
    report::Report,
};
use analysis::CacheProfile;

/// `MEMPROF_CACHE_USE=off` leaves the analysis out (the benchmark's
/// comparison: it adds no kernel work, only the loader's).
pub fn plan(opts: &Options, _target: &Target<'_>, _notes: &mut Vec<String>) -> Box<dyn Plan> {
    Box::new(CachePlan {
        off: opts.experimental.cache_use_off,
    })
}

struct CachePlan {
    off: bool,
}

impl Plan for CachePlan {
    fn start(
        self: Box<Self>,
        _probes: &mut Probes,
        _process: &mut Process,
    ) -> Result<Box<dyn Feature>> {
        Ok(Box::new(Cache {
            off: self.off,
            ..Cache::default()
        }))
    }
}

/// The cache-use feature's state.
#[derive(Default)]
pub struct Cache {
    /// Turned off: samples are ignored and nothing is reported.
    off: bool,
    pub profile: CacheProfile,
    /// The heap block under each sampled address, looked up while live.
    blocks: FastMap<u64, Option<HeapBlock>>,
    /// Addresses sampled since the last lookup.
    new_addrs: Vec<u64>,
    /// When the heap blocks were last looked up.
    last_lookup: Option<Instant>,
    /// Addresses placed in objects, kept between reports.
    placements: report::Placements,
}

/// Looking blocks up sorts every live block: with more than this many,
/// it is done at most every [`LOOKUP_INTERVAL`] (addresses whose block
/// is freed meanwhile stay unnamed).
const CHEAP_LOOKUP_BLOCKS: usize = 100_000;
const LOOKUP_INTERVAL: Duration = Duration::from_secs(2);
/// Addresses waiting for a lookup, at most.
const MAX_PENDING: usize = 1 << 16;

impl Feature for Cache {
    fn on_sample(&mut self, ev: &SampleEvent, process: &mut Process) {
        if self.off || ev.flags & SAMPLE_FLAG_ADDR == 0 || ev.flags & SAMPLE_FLAG_KERNEL != 0 {
            return;
        }
        // The main process's objects (children have their own layout).
        if ev.tgid != 0 && ev.tgid != process.pid() {
            return;
        }
        if !self.blocks.contains_key(&ev.addr) && self.new_addrs.len() < MAX_PENDING {
            self.new_addrs.push(ev.addr);
        }
        let write = ev.access & recipe::WRITE != 0;
        self.profile
            .on_access(ev.tid, ev.addr, ev.size, write, ev.time_ns);
    }

    fn settle(&mut self, _process: &mut Process, heap: Option<&dyn Heap>) {
        let Some(heap) = heap.filter(|_| !self.new_addrs.is_empty()) else {
            return;
        };
        let due = self
            .last_lookup
            .is_none_or(|at| at.elapsed() >= LOOKUP_INTERVAL);
        if heap.live_count() > CHEAP_LOOKUP_BLOCKS && !due {
            return;
        }
        self.last_lookup = Some(Instant::now());
        let index = heap.index();
        for addr in std::mem::take(&mut self.new_addrs) {
            let block = index.containing(addr);
            self.blocks.entry(addr).or_insert(block);
        }
    }

    fn report(&mut self, ctx: &mut ReportContext<'_>, out: &mut Report) {
        let blocks = &self.blocks;
        let inputs = report::Inputs {
            profile: &self.profile,
            maps: ctx.process.maps(),
            heap: ctx.heap,
            block: &|addr| blocks.get(&addr).copied(),
        };
        let findings = report::findings(&inputs, &mut self.placements, ctx.symbolizer);
        out.sections.put(Box::new(section::CacheUse(findings)));
    }
}

//! False sharing: sampled data accesses per cache line, the kernel's
//! per-line history, and the report's false-sharing section.
//!
//! Each user-mode sample gives a data address — from a precise memory
//! event, or computed in the kernel from a recipe decoded here for the
//! sampled instruction ([`crate::object::x86::access`]) — which the pure
//! analysis ([`analysis`]) aggregates per line.

pub mod analysis;
pub mod cost;
pub mod report;
pub mod typing;
pub mod words;

use memprof_common::{
    procs::{recipe_key, LAYOUT_UNKNOWN},
    sharing::{recipe, AccessRecipe},
    SampleEvent, SAMPLE_FLAG_ADDR, SAMPLE_FLAG_KERNEL, SAMPLE_FLAG_MEMORY, SAMPLE_FLAG_NO_RECIPE,
};

use super::{FastMap, Feature, Plan, ReportContext, Target};
use crate::process::threads::ThreadEvent;
use crate::{
    error::Result,
    heap::{Heap, HeapBlock, Unseen},
    kernel::{loader::Probes, maps::Counters},
    object::x86::access,
    options::Options,
    process::{chunks::ProcMemory, holders, state::Process},
    report::{
        model::{AddressMode, AddressSampling, SampleSource},
        Report,
    },
};
use analysis::{Access, SharingProfile};
use cost::CodeSamples;
use report::{Inputs, KernelLines};

pub fn plan(_opts: &Options, _target: &Target<'_>, _notes: &mut Vec<String>) -> Box<dyn Plan> {
    Box::new(SharingPlan)
}

struct SharingPlan;

impl Plan for SharingPlan {
    fn start(
        self: Box<Self>,
        probes: &mut Probes,
        _process: &mut Process,
    ) -> Result<Box<dyn Feature>> {
        Ok(Box::new(Sharing::new(probes.precise)))
    }
}

/// The false-sharing feature's state.
pub struct Sharing {
    /// Sampled data accesses, per cache line.
    pub profile: SharingProfile,
    /// "pebs" or "ibs" when precise memory events give the addresses.
    precise: Option<&'static str>,
    /// Decoded instructions: the recipe for each sampled IP and which
    /// instruction it describes.
    decoded: FastMap<u64, access::Decoded>,
    /// Recipes decoded since they were last installed.
    new_recipes: Vec<(u64, AccessRecipe)>,
    /// The target called exec: the kernel's recipes are stale.
    recipes_reset: bool,
    /// Decoded recipes the kernel's map had no room for.
    recipes_dropped: usize,
    /// The heap block under each shared line, looked up while it is live.
    line_blocks: FastMap<u64, Option<HeapBlock>>,
    /// Blocks allocated before tracing, from glibc's headers, with the
    /// global that points into each, read while the target runs.
    unseen: Unseen,
    /// Samples per instruction and per thread (each line's cost; the CPU
    /// samples the share of each line is taken of).
    code: CodeSamples,
    /// The kernel's lines and their count, as read when detaching.
    final_lines: Option<(KernelLines, u64)>,
}

impl Sharing {
    pub fn new(precise: Option<&'static str>) -> Self {
        Self {
            profile: SharingProfile::new(),
            precise,
            decoded: FastMap::default(),
            new_recipes: Vec::new(),
            recipes_reset: false,
            recipes_dropped: 0,
            line_blocks: FastMap::default(),
            unseen: Unseen::default(),
            code: CodeSamples::default(),
            final_lines: None,
        }
    }

    /// The memory side of a user-mode sample: its address, or a request
    /// to decode its instruction. Instructions are known by their recipe
    /// key (address and code layout of the sample's process); addresses
    /// in shared mappings by their key in the shared object.
    fn on_user_access(&mut self, ev: &SampleEvent, process: &mut Process) {
        let layout = process.layout();
        let key = recipe_key(layout, ev.ip);
        self.code.on_user_sample(key);
        if ev.flags & SAMPLE_FLAG_NO_RECIPE != 0 {
            if !process.of_old_image(ev.time_ns) && layout != LAYOUT_UNKNOWN {
                self.decode(key, ev.ip, process);
            }
            return;
        }
        if ev.flags & SAMPLE_FLAG_ADDR == 0 {
            return; // no memory operand (counted in the kernel)
        }
        let insn = self
            .decoded
            .get(&key)
            .map_or(key, |d| recipe_key(layout, d.insn));
        self.code.on_placed(insn);
        if process.find(ev.addr).is_none() {
            // Memory mapped since the map was read: perhaps a shared
            // mapping the kernel should key by object.
            process.refresh_maps_within(crate::process::state::MAPS_REFRESH_MIN_INTERVAL);
        }
        self.profile.on_access(Access {
            tid: ev.tid,
            insn,
            addr: process.shared_key(ev.addr),
            size: ev.size,
            read: ev.access & recipe::READ != 0,
            write: ev.access & recipe::WRITE != 0,
            time_ns: ev.time_ns,
            serial: process.threads_at(ev.time_ns) < 2,
        });
    }

    /// Decodes the instruction at `ip` once, for the kernel to use under
    /// recipe key `key`.
    fn decode(&mut self, key: u64, ip: u64, process: &mut Process) {
        if self.decoded.contains_key(&key) {
            return; // decoded, not yet installed when this was sampled
        }
        let decoded = match process.code_around(ip) {
            Some((code, code_ip)) => access::decode(&code, code_ip, ip, self.precise.is_some()),
            None => access::Decoded {
                recipe: AccessRecipe::none(),
                insn: ip,
            },
        };
        if decoded.recipe.flags & recipe::NO_OPERAND == 0 {
            let insn = recipe_key(process.layout(), decoded.insn);
            self.code.insn_of_ip.insert(key, insn);
        }
        self.decoded.insert(key, decoded);
        self.new_recipes.push((key, decoded.recipe));
    }

    /// Recipes decoded since the last call, to install in the kernel.
    pub fn take_new_recipes(&mut self) -> Vec<(u64, AccessRecipe)> {
        std::mem::take(&mut self.new_recipes)
    }

    /// Whether the kernel's recipes must be dropped first (the target
    /// called exec since the last call).
    pub fn take_recipes_reset(&mut self) -> bool {
        std::mem::take(&mut self.recipes_reset)
    }

    /// Instructions decoded, and how many of them access memory we can
    /// place.
    pub fn decoded_counts(&self) -> (usize, usize) {
        let usable = self
            .decoded
            .values()
            .filter(|d| d.recipe.flags & recipe::NO_OPERAND == 0)
            .count();
        (self.decoded.len(), usable)
    }

    /// The kernel's state of the lines the samples show shared.
    fn kernel_lines(&self, probes: Option<&Probes>) -> KernelLines {
        match (probes, &self.final_lines) {
            (_, Some((lines, _))) => lines.clone(),
            (Some(probes), None) => KernelLines {
                lines: self
                    .profile
                    .candidates()
                    .into_iter()
                    .map(|line| (line, probes.line_state(line), probes.line_words(line)))
                    .collect(),
            },
            (None, None) => KernelLines::default(),
        }
    }

    /// How many samples yielded a data address, and what the line table
    /// holds.
    fn address_sampling(&self, counters: &Counters) -> AddressSampling {
        let (decoded, usable) = self.decoded_counts();
        // Walking the table is for the end; live, the lines created are
        // shown (evictions are known only then).
        let lines_tracked = self.final_lines.as_ref().map(|(_, n)| *n);
        AddressSampling {
            mode: if self.precise.is_some() {
                AddressMode::Precise
            } else {
                AddressMode::Decoded
            },
            user_samples: counters.user_samples,
            with_address: counters.addresses,
            no_operand: counters.no_operand,
            not_decoded: counters.no_recipe,
            through_slice: counters.addresses_loaded,
            slice_faults: counters.slice_faults,
            address_share: counters.addresses as f64 / counters.user_samples.max(1) as f64,
            instructions_decoded: decoded,
            instructions_with_operand: usable,
            lines_tracked: lines_tracked.unwrap_or(counters.lines_new),
            lines_evicted: lines_tracked.map_or(0, |t| counters.lines_new.saturating_sub(t)),
        }
    }
}

impl Feature for Sharing {
    fn on_thread(&mut self, ev: &ThreadEvent, _process: &mut Process) {
        if let ThreadEvent::Exec { .. } = ev {
            // Instructions of the old image are not those of the new one
            // at the same addresses: decode afresh.
            self.decoded.clear();
            self.code.insn_of_ip.clear();
            self.new_recipes.clear();
            self.recipes_reset = true;
        }
    }

    fn on_sample(&mut self, ev: &SampleEvent, process: &mut Process) {
        let user = ev.flags & SAMPLE_FLAG_KERNEL == 0 && ev.ip != 0;
        if ev.flags & SAMPLE_FLAG_MEMORY == 0 {
            self.code.on_thread_sample(ev.tid);
        }
        if user {
            self.on_user_access(ev, process);
        }
    }

    fn after_drain(&mut self, probes: &mut Probes, _process: &mut Process) {
        if self.take_recipes_reset() {
            probes.clear_recipes();
        }
        let new = self.take_new_recipes();
        if !new.is_empty() {
            self.recipes_dropped += probes.install_recipes(&new);
        }
    }

    /// Looks up the heap blocks under newly shared lines now, while they
    /// are live: the report may come after the target freed them.
    fn settle(&mut self, process: &mut Process, heap: Option<&dyn Heap>) {
        let new: Vec<u64> = self
            .profile
            .candidates()
            .into_iter()
            .filter(|l| !self.line_blocks.contains_key(l))
            .collect();
        if new.is_empty() {
            return;
        }
        let index = heap.map(Heap::index);
        let mut mem = None;
        let mut scan_left = holders::SCAN_MAX;
        for line in new {
            // Any byte of the line: a block may start inside it.
            let first = line + u64::from(self.profile.first_offset(line));
            let block = index
                .as_deref()
                .and_then(|index| index.containing(first))
                .or_else(|| {
                    // Not seen allocated: glibc's header says where it is.
                    let mem = mem.get_or_insert_with(|| ProcMemory::open(process.pid()));
                    let mem = mem.as_ref()?;
                    self.unseen.find(process.maps(), mem, first, &mut scan_left)
                });
            self.line_blocks.insert(line, block);
        }
    }

    fn finish(&mut self, probes: &mut Probes, _process: &mut Process) {
        let lines = self.kernel_lines(Some(probes));
        self.final_lines = Some((lines, probes.lines_tracked()));
    }

    fn report(&mut self, ctx: &mut ReportContext<'_>, out: &mut Report) {
        let lines = self.kernel_lines(ctx.probes);
        // A line's cost is its share of the samples the line table saw:
        // all CPU samples with timer sampling; with precise memory events
        // (which are not CPU samples), all memory events.
        let sampled = if self.precise.is_some() {
            ctx.counters.user_samples
        } else {
            self.code.cpu_samples()
        };
        let (blocks, unseen) = (&self.line_blocks, &self.unseen);
        let process: &Process = ctx.process;
        let inputs = Inputs {
            code: &self.code,
            sharing: &self.profile,
            maps: process.maps(),
            heap: ctx.heap,
            line_block: Box::new(|line| blocks.get(&line).copied().flatten()),
            block_holder: Box::new(|start| unseen.holder(start)),
            procs: Some(report::Procs {
                main: process.main_pid(),
                pid_of: Box::new(|tid| process.tgid(tid)),
                shared_name: Box::new(|key| process.shared_name(key).map(str::to_string)),
            }),
        };
        out.false_sharing = report::findings(&inputs, &lines, sampled, ctx.symbolizer);
        out.false_sharing_dismissed = report::dismissals(&inputs, &lines, sampled, ctx.symbolizer);
        out.sampling.addresses = self.address_sampling(ctx.counters);
        if let Some(source) = self.precise.and_then(SampleSource::from_name) {
            out.sampling.source = source;
        }
        if self.recipes_dropped > 0 {
            ctx.notes.push(format!(
                "{} sampled instructions were not decoded (recipe map full)",
                self.recipes_dropped
            ));
        }
    }
}

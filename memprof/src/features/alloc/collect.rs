//! Allocator records → the allocator profile: calls with their sites and
//! the live-thread count, and the allocator's system calls with whether
//! its probes were attached then.

use memprof_common::{
    alloc_flag, alloc_op, record_kind, site_base, AllocCpuEvent, AllocEvent, AllocStackEvent,
    SiteRule, SyscallEvent, ALLOC_SAMPLE_MEAN_BYTES, ALLOC_SITES_CAPACITY, EVENT_ALLOC,
    EVENT_ALLOC_CPU, EVENT_ALLOC_STACK, EVENT_SYSCALL,
};

use super::analysis::{AllocCall, AllocProfile, SyscallCall};
use super::cpu_sites::{CallSite, CpuSites};
use super::heap::{HeapFrame, HeapProfile};
use crate::{
    features::FastMap,
    object::{
        files::CodeCache,
        unwind::{Base, FrameRule, Unwinder},
        walk::{walk, StackCopy, Walk},
    },
    process::{
        maps::{call_of, Place},
        state::Process,
    },
};

/// Frames kept per sampled allocation's call chain.
const CHAIN_FRAMES: usize = 16;
/// How often a sampled chain whose code is not in our memory map may
/// trigger a re-read of the map.
const MAPS_REFRESH_MIN_INTERVAL: std::time::Duration = std::time::Duration::from_millis(5);

/// The allocator profile and the windows its probes were attached in.
pub struct AllocCollector {
    pub profile: AllocProfile,
    /// The byte-sampled allocations with their call chains.
    pub heap: HeapProfile,
    /// Probe windows, as ktime ranges (the last may be open).
    windows: Vec<(u64, Option<u64>)>,
    /// The same, up to when their links began to be dropped.
    interior: Vec<(u64, Option<u64>)>,
    unwinder: Unwinder,
    /// Whether the function at each return address returns what the
    /// call returned.
    code: CodeCache,
    /// Return addresses of allocation calls classified: true inside an
    /// allocation wrapper whose frame the kernel can leave.
    sites: FastMap<u64, bool>,
    /// Their rules, not yet written to the kernel's map.
    pub new_sites: Vec<(u64, SiteRule)>,
    /// Calls from inside a wrapper sent without their chain before its
    /// return address was classified (the cap was spent): named at the
    /// wrapper's line.
    pub named_at_wrapper: u64,
    /// Calls per operation code that began while every probe was
    /// attached (not while the window's links were still being attached
    /// or already being dropped, when one operation's probes may be there
    /// without another's): the mix of operations, for estimates.
    pub interior_calls: Vec<u64>,
    /// The allocator's CPU samples by the call they were spent for.
    pub cpu_sites: CpuSites,
}

/// Whether `ktime` falls in one of `ranges` (the last may be open).
/// The ranges are in time order and apart (windows follow each other):
/// only the last one starting at or before `ktime` can hold it. Called
/// for every traced call, so a search, not a scan of all the windows.
fn in_ranges(ranges: &[(u64, Option<u64>)], ktime: u64) -> bool {
    let before = ranges.partition_point(|&(start, _)| start <= ktime);
    before > 0 && ranges[before - 1].1.is_none_or(|end| ktime < end)
}

/// The kernel's form of the call-frame rule at a call inside a wrapper.
fn site_rule(rule: FrameRule) -> Option<SiteRule> {
    Some(SiteRule {
        base: match rule.base {
            Base::Sp => site_base::SP,
            Base::Bp => site_base::BP,
        },
        cfa_offset: i32::try_from(rule.cfa_offset).ok()?,
        ra_offset: i32::try_from(rule.ra_offset).ok()?,
        bp_offset: i32::try_from(rule.bp_offset.unwrap_or(0)).ok()?,
    })
}

impl AllocCollector {
    pub fn new(profile: AllocProfile) -> Self {
        Self {
            profile,
            heap: HeapProfile::new(ALLOC_SAMPLE_MEAN_BYTES),
            windows: Vec::new(),
            interior: Vec::new(),
            unwinder: Unwinder::default(),
            code: CodeCache::default(),
            sites: FastMap::default(),
            new_sites: Vec::new(),
            named_at_wrapper: 0,
            interior_calls: vec![0; alloc_op::COUNT as usize],
            cpu_sites: CpuSites::default(),
        }
    }

    /// The probes were attached (`open`) or detached at `ktime`.
    pub fn window(&mut self, open: bool, ktime: u64) {
        if open {
            self.windows.push((ktime, None));
        } else if let Some(last) = self.windows.last_mut() {
            last.1.get_or_insert(ktime);
        }
        if open {
            self.interior.push((ktime, None));
        } else {
            self.window_closing(ktime);
        }
    }

    /// The window's links begin to be dropped at `ktime`: calls made from
    /// now on no longer count in [`Self::interior_calls`].
    pub fn window_closing(&mut self, ktime: u64) {
        if let Some(last) = self.interior.last_mut() {
            last.1.get_or_insert(ktime);
        }
    }

    /// Whether the probes were attached at `ktime`.
    fn traced_at(&self, ktime: u64) -> bool {
        in_ranges(&self.windows, ktime)
    }

    /// The thread of an allocator record.
    pub fn thread_of(bytes: &[u8]) -> Option<u32> {
        match record_kind(bytes) {
            Some(EVENT_ALLOC | EVENT_ALLOC_STACK) => AllocEvent::from_bytes(bytes).map(|ev| ev.tid),
            Some(EVENT_SYSCALL) => SyscallEvent::from_bytes(bytes).map(|ev| ev.tid),
            Some(EVENT_ALLOC_CPU) => AllocCpuEvent::from_bytes(bytes).map(|ev| ev.tid),
            _ => None,
        }
    }

    /// One record of the allocator ring buffer.
    pub fn on_record(&mut self, bytes: &[u8], process: &mut Process) {
        match record_kind(bytes) {
            Some(EVENT_ALLOC) => {
                if let Some(ev) = AllocEvent::from_bytes(bytes) {
                    self.on_alloc(&ev, None, process);
                }
            }
            Some(EVENT_ALLOC_STACK) => {
                if let Some(ev) = AllocStackEvent::from_bytes(bytes) {
                    if process.before_launch(ev.call.start_ns) {
                        return;
                    }
                    let chain = self.chain(&ev, process);
                    // Sent because the kernel met a return address not
                    // classified yet: the site is found here, from the chain.
                    let time = ev.call.start_ns;
                    let site = (ev.call.flags & alloc_flag::UNCLASSIFIED != 0)
                        .then(|| {
                            self.site_of_chain(&chain.returns, process, |c, ra, p| {
                                c.classify(ra, time, p)
                            })
                        })
                        .flatten();
                    self.on_alloc(&ev.call, site, process);
                    if ev.call.flags & alloc_flag::SAMPLED != 0 {
                        self.on_sample(&ev, chain, process);
                    }
                }
            }
            Some(EVENT_SYSCALL) => {
                if let Some(ev) = SyscallEvent::from_bytes(bytes) {
                    self.on_syscall(&ev, process);
                }
            }
            Some(EVENT_ALLOC_CPU) => {
                if let Some(ev) = AllocCpuEvent::from_bytes(bytes) {
                    self.on_cpu_sample(&ev, process);
                }
            }
            other => tracing::warn!("unknown allocator record kind {other:?}"),
        }
    }

    /// An allocator call; `site` is the return address past the wrappers
    /// when the chain found it (else the kernel's `outer`).
    fn on_alloc(&mut self, ev: &AllocEvent, site: Option<u64>, process: &mut Process) {
        if process.before_launch(ev.start_ns) {
            return;
        }
        // What the heap profile's sampled blocks become.
        if alloc_op::is_free(ev.op) {
            self.heap.on_free(ev.ptr);
        } else if ev.old_ptr != 0 {
            self.heap.on_free(ev.old_ptr);
        }
        // The kernel follows the return addresses it knows out of the
        // wrappers; those it stopped at are classified for its next calls.
        if ev.caller != 0 {
            let mut in_wrapper = self.classify(ev.caller, ev.start_ns, process);
            let unclassified = ev.flags & alloc_flag::UNCLASSIFIED != 0;
            if unclassified && ev.outer != 0 && ev.outer != ev.caller {
                in_wrapper = self.classify(ev.outer, ev.start_ns, process);
            }
            // The kernel stopped at a wrapper and no chain found the site.
            if unclassified && in_wrapper && site.is_none() {
                self.named_at_wrapper += 1;
            }
        }
        let outer = site.unwrap_or(if ev.outer != 0 { ev.outer } else { ev.caller });
        // Sites are keyed by the call (frees carry no caller: their site
        // is their block's), resolved once per site.
        let site = call_of(outer);
        let via = if outer != ev.caller {
            call_of(ev.caller)
        } else {
            0
        };
        for at in [site, via] {
            if at != 0 && !self.profile.knows_site(at) {
                let place = process.code_place(at, ev.start_ns);
                // Not mapped in our snapshot yet (a library loaded a
                // moment ago): tried again at the next call, or when
                // settling.
                if !matches!(place, Place::Unmapped { .. }) {
                    self.profile.set_site_place(at, place);
                }
            }
        }
        if in_ranges(&self.interior, ev.start_ns) {
            if let Some(n) = self.interior_calls.get_mut(ev.op as usize) {
                *n += 1;
            }
        }
        self.profile.add_call(AllocCall {
            op: ev.op,
            tid: ev.tid,
            start_ns: ev.start_ns,
            duration_ns: ev.duration_ns,
            ptr: ev.ptr,
            old_ptr: ev.old_ptr,
            size: ev.size,
            chunk: ev.chunk,
            site,
            via,
            live_threads: process.live.at(ev.start_ns),
            page_faults: ev.page_faults,
            pace_ns: ev.pace_ns,
        });
    }

    /// Whether the allocation call returning to `ra` (at `time_ns`) is
    /// inside a wrapper the kernel can see past: the function returns
    /// what the call returned, and its frame has a call-frame rule there.
    /// Once per return address; each answer is queued for the kernel.
    fn classify(&mut self, ra: u64, time_ns: u64, process: &mut Process) -> bool {
        if let Some(&wrapper) = self.sites.get(&ra) {
            return wrapper;
        }
        // Not mapped in our snapshot: asked again at its next call.
        let Some(rule) = self.wrapper_rule(ra, time_ns, process) else {
            return false;
        };
        if self.sites.len() >= ALLOC_SITES_CAPACITY as usize {
            return false;
        }
        self.sites.insert(ra, rule.is_some());
        self.new_sites.push((ra, rule.unwrap_or_default()));
        rule.is_some()
    }

    /// The way out of the wrapper's frame if the call returning to `ra`
    /// is inside a wrapper (Some(None): it is not; None: not mapped).
    fn wrapper_rule(
        &mut self,
        ra: u64,
        time_ns: u64,
        process: &mut Process,
    ) -> Option<Option<SiteRule>> {
        let rule = match process.code_place(call_of(ra), time_ns) {
            Place::Unmapped { .. } => return None,
            Place::File { path, file_offset }
                if self
                    .code
                    .returns_result(&mut process.files, &path, file_offset + 1) =>
            {
                self.unwinder
                    .rule(&mut process.files, &path, file_offset)
                    .and_then(site_rule)
            }
            _ => None,
        };
        Some(rule)
    }

    /// The first of a chain's return addresses that `wrapper` says is not
    /// inside a wrapper (the outermost reached if all are).
    fn site_of_chain(
        &mut self,
        returns: &[u64],
        process: &mut Process,
        mut wrapper: impl FnMut(&mut Self, u64, &mut Process) -> bool,
    ) -> Option<u64> {
        for &ra in returns {
            if !wrapper(self, ra, process) {
                return Some(ra);
            }
        }
        returns.last().copied()
    }

    /// A CPU sample in the allocator's code: counted for the allocation
    /// call its stack unwinds to, past the allocator's own frames (those
    /// in the sampled instruction's object) and the wrappers.
    fn on_cpu_sample(&mut self, ev: &AllocCpuEvent, process: &mut Process) {
        if process.before_launch(ev.time_ns) {
            return;
        }
        let ip = process.code_place(ev.ip, ev.time_ns);
        let Place::File { path: object, .. } = &ip else {
            return; // the allocator's code is a file's
        };
        let object = object.clone();
        let copy = StackCopy::sampled(ev.ip, ev.sp, ev.bp, &ev.stack);
        let chain = walk(&mut self.unwinder, &copy, process, CHAIN_FRAMES);
        let own = chain
            .frames
            .iter()
            .take_while(|f| matches!(f, Place::File { path, .. } if *path == object))
            .count();
        let returns = &chain.returns[own..];
        // Classified as the calls' own chains are, but not sent to the
        // kernel's table: the call may be of libc code other than the
        // allocator's (its range holds both), told apart at the report.
        let wrapper = |c: &mut Self, ra: u64, process: &mut Process| match c.sites.get(&ra) {
            Some(&w) => w,
            None => matches!(c.wrapper_rule(ra, ev.time_ns, process), Some(Some(_))),
        };
        let site = self.site_of_chain(returns, process, wrapper).map(|ra| {
            let first = returns[0];
            CallSite {
                site: process.code_place(call_of(ra), ev.time_ns),
                via: (ra != first).then(|| process.code_place(call_of(first), ev.time_ns)),
            }
        });
        self.cpu_sites.add(ip, site);
    }

    /// The call chain of an allocation sent with its stack, walked from
    /// the caller's registers after the return.
    fn chain(&mut self, ev: &AllocStackEvent, process: &mut Process) -> Walk {
        // A library loaded since our snapshot of the map.
        if process.find(ev.ip).is_none() {
            process.refresh_maps_within(MAPS_REFRESH_MIN_INTERVAL);
        }
        let copy = StackCopy::returned(ev.ip, ev.sp, ev.bp, &ev.stack);
        walk(&mut self.unwinder, &copy, process, CHAIN_FRAMES)
    }

    /// A byte-sampled allocation with its call chain (the heap profile).
    fn on_sample(&mut self, ev: &AllocStackEvent, chain: Walk, process: &mut Process) {
        let chain = chain
            .frames
            .into_iter()
            .map(|place| {
                let returns_result = self.returns_result(&place, process);
                HeapFrame {
                    place,
                    returns_result,
                }
            })
            .collect();
        self.heap
            .add_sample(chain, ev.call.ptr, ev.call.size, ev.held_back);
    }

    /// Whether the function of a frame returns what its call returned.
    fn returns_result(&mut self, place: &Place, process: &mut Process) -> bool {
        let Place::File { path, file_offset } = place else {
            return false;
        };
        // The place is the call; the code after it starts a byte on.
        self.code
            .returns_result(&mut process.files, path, file_offset + 1)
    }

    /// The syscall hooks were attached again after a gap: the heap end
    /// `brk` calls in it moved is unknown.
    pub fn syscalls_resumed(&mut self) {
        self.profile.forget_brk_end();
    }

    fn on_syscall(&mut self, ev: &SyscallEvent, process: &mut Process) {
        if process.before_launch(ev.start_ns) {
            return;
        }
        let traced = self.traced_at(ev.start_ns);
        self.profile.add_syscall(SyscallCall {
            nr: ev.nr,
            tid: ev.tid,
            inside: ev.inside.checked_sub(1),
            traced,
            duration_ns: ev.duration_ns,
            args: ev.args,
            ret: ev.ret,
        });
    }

    /// Places the sites that were not mapped when their calls came.
    pub fn settle(&mut self, process: &mut Process) {
        let unplaced = self.profile.unplaced_sites();
        if unplaced.is_empty() {
            return;
        }
        process.refresh_maps();
        for addr in unplaced {
            let place = process.maps().place(addr);
            self.profile.set_site_place(addr, place);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::alloc::analysis::LargeRule;

    #[test]
    fn syscalls_know_whether_the_probes_were_attached() {
        let mut c = AllocCollector::new(AllocProfile::new(
            LargeRule::Above(1 << 20),
            false,
            crate::features::alloc::classes::SizeClasses::Glibc,
        ));
        c.window(true, 100);
        c.window(false, 200);
        c.window(true, 300);
        assert!(!c.traced_at(50));
        assert!(c.traced_at(150));
        assert!(!c.traced_at(250));
        assert!(c.traced_at(1_000), "the last window is still open");
        // Its links begin to be dropped at 400, and are gone at 500: the
        // probes were there until 500, all of them only until 400.
        c.window_closing(400);
        c.window(false, 500);
        assert!(c.traced_at(450));
        assert!(in_ranges(&c.interior, 350) && !in_ranges(&c.interior, 450));
        assert!(in_ranges(&c.interior, 150) && !in_ranges(&c.interior, 250));
    }
}

//! Allocator records → the allocator profile: calls with their sites and
//! the live-thread count, and the allocator's system calls with whether
//! its probes were attached then.

use memprof_common::{
    alloc_op, record_kind, AllocEvent, AllocStackEvent, SyscallEvent, ALLOC_SAMPLE_MEAN_BYTES,
    EVENT_ALLOC, EVENT_ALLOC_STACK, EVENT_SYSCALL,
};

use super::analysis::{AllocCall, AllocProfile, SyscallCall};
use super::heap::{HeapFrame, HeapProfile};
use crate::{
    object::{
        files::CodeCache,
        unwind::Unwinder,
        walk::{walk, StackCopy},
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
    unwinder: Unwinder,
    /// Whether the function at each return address returns what the
    /// call returned.
    code: CodeCache,
}

impl AllocCollector {
    pub fn new(profile: AllocProfile) -> Self {
        Self {
            profile,
            heap: HeapProfile::new(ALLOC_SAMPLE_MEAN_BYTES),
            windows: Vec::new(),
            unwinder: Unwinder::default(),
            code: CodeCache::default(),
        }
    }

    /// The probes were attached (`open`) or detached at `ktime`.
    pub fn window(&mut self, open: bool, ktime: u64) {
        if open {
            self.windows.push((ktime, None));
        } else if let Some(last) = self.windows.last_mut() {
            last.1.get_or_insert(ktime);
        }
    }

    /// Whether the probes were attached at `ktime`.
    fn traced_at(&self, ktime: u64) -> bool {
        self.windows
            .iter()
            .rev()
            .any(|&(start, end)| start <= ktime && end.is_none_or(|e| ktime < e))
    }

    /// The thread of an allocator record.
    pub fn thread_of(bytes: &[u8]) -> Option<u32> {
        match record_kind(bytes) {
            Some(EVENT_ALLOC | EVENT_ALLOC_STACK) => AllocEvent::from_bytes(bytes).map(|ev| ev.tid),
            Some(EVENT_SYSCALL) => SyscallEvent::from_bytes(bytes).map(|ev| ev.tid),
            _ => None,
        }
    }

    /// One record of the allocator ring buffer.
    pub fn on_record(&mut self, bytes: &[u8], process: &mut Process) {
        match record_kind(bytes) {
            Some(EVENT_ALLOC) => {
                if let Some(ev) = AllocEvent::from_bytes(bytes) {
                    self.on_alloc(&ev, process);
                }
            }
            Some(EVENT_ALLOC_STACK) => {
                if let Some(ev) = AllocStackEvent::from_bytes(bytes) {
                    self.on_alloc(&ev.call, process);
                    self.on_sample(&ev, process);
                }
            }
            Some(EVENT_SYSCALL) => {
                if let Some(ev) = SyscallEvent::from_bytes(bytes) {
                    self.on_syscall(&ev, process);
                }
            }
            other => tracing::warn!("unknown allocator record kind {other:?}"),
        }
    }

    fn on_alloc(&mut self, ev: &AllocEvent, process: &mut Process) {
        if process.before_launch(ev.start_ns) {
            return;
        }
        // What the heap profile's sampled blocks become.
        if alloc_op::is_free(ev.op) {
            self.heap.on_free(ev.ptr);
        } else if ev.old_ptr != 0 {
            self.heap.on_free(ev.old_ptr);
        }
        // Sites are keyed by the call (frees carry no caller: their site
        // is their block's), resolved once per site.
        let site = call_of(ev.caller);
        if ev.caller != 0 && !self.profile.knows_site(site) {
            let place = process.code_place(site, ev.start_ns);
            // Not mapped in our snapshot yet (a library loaded a moment
            // ago): tried again at the next call, or when settling.
            if !matches!(place, Place::Unmapped { .. }) {
                self.profile.set_site_place(site, place);
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
            live_threads: process.live.at(ev.start_ns),
            page_faults: ev.page_faults,
            pace_ns: ev.pace_ns,
        });
    }

    /// A sampled allocation: its call chain, walked from the caller's
    /// registers after the return.
    fn on_sample(&mut self, ev: &AllocStackEvent, process: &mut Process) {
        if process.before_launch(ev.call.start_ns) {
            return;
        }
        // A library loaded since our snapshot of the map.
        if process.find(ev.ip).is_none() {
            process.refresh_maps_within(MAPS_REFRESH_MIN_INTERVAL);
        }
        let copy = StackCopy {
            ip: ev.ip,
            sp: ev.sp,
            bp: ev.bp,
            words: &ev.stack,
            ip_returned: true,
        };
        let frames = walk(&mut self.unwinder, &copy, process, CHAIN_FRAMES).frames;
        let chain = frames
            .into_iter()
            .map(|place| {
                let returns_result = self.returns_result(&place, process);
                HeapFrame {
                    place,
                    returns_result,
                }
            })
            .collect();
        self.heap.add_sample(chain, ev.call.ptr, ev.call.size);
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
    }
}

//! Unnecessary lock contention: which waits on a lock were needed, from
//! the critical sections the lock uprobes see and the data addresses the
//! CPU sampler recovers (PerfPlay's classes without its replay).
//!
//! The locks feature owns the lock uprobes and hands this part their
//! sections and the samples ([`Ulcp`]); the analysis is pure
//! ([`analysis`]); [`report`] fills each lock's `unnecessary` entry.

pub mod analysis;
pub mod report;

use memprof_common::{
    locks::{hold_flag, HoldEvent},
    sharing::recipe,
    SampleEvent, SAMPLE_FLAG_ADDR, SAMPLE_FLAG_KERNEL,
};

use crate::process::state::Process;
use analysis::{Access, Span, UlcpProfile};

/// The analysis and its inputs' filters.
#[derive(Debug, Default)]
pub struct Ulcp {
    pub profile: UlcpProfile,
}

impl Ulcp {
    /// A sample with a data address of the traced process.
    pub fn on_sample(&mut self, ev: &SampleEvent, process: &Process) {
        if ev.flags & SAMPLE_FLAG_ADDR == 0 || ev.flags & SAMPLE_FLAG_KERNEL != 0 {
            return;
        }
        // The main process's locks (children have their own sections,
        // but their addresses are another space).
        if ev.tgid != 0 && ev.tgid != process.pid() {
            return;
        }
        // A code pointer read by a jump (a PLT stub's GOT slot, a
        // vtable) is not data the lock protects.
        let branch = ev.access & recipe::BRANCH != 0;
        let private = branch
            || match process.find(ev.addr) {
                Some(m) => {
                    !m.writable || &*m.name == "[stack]" || process.maps().in_thread_stack(ev.addr)
                }
                None => false,
            };
        self.profile.on_access(Access {
            time_ns: ev.time_ns,
            tid: ev.tid,
            addr: ev.addr,
            size: ev.size,
            write: ev.access & recipe::WRITE != 0,
            private,
        });
    }

    /// A critical section (failed try calls took nothing).
    pub fn on_hold(&mut self, ev: &HoldEvent) {
        if ev.flags & hold_flag::FAILED != 0 {
            return;
        }
        self.profile.on_span(Span {
            lock: ev.lock,
            tid: ev.tid,
            site: ev.lock_site,
            start_ns: ev.acquired_ns,
            end_ns: ev.acquired_ns.saturating_add(ev.hold_ns),
            wait_ns: ev.acquire_ns,
        });
    }
}

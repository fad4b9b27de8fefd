//! Unnecessary lock contention: which waits on a lock were needed, from
//! the critical sections the lock uprobes see and the data addresses the
//! CPU sampler recovers (PerfPlay's classes without its replay).
//!
//! The locks feature owns the lock uprobes and hands this part their
//! sections and the samples ([`Ulcp`]); the analysis is pure
//! ([`analysis`]); [`report`] fills each lock's `unnecessary` entry.

pub mod analysis;
pub mod classes;
pub mod report;
pub mod sets;

use memprof_common::{
    locks::{hold_flag, lock_op, HoldEvent},
    procs::recipe_key,
    sharing::recipe,
    SampleEvent, WaitSpan, SAMPLE_FLAG_ADDR, SAMPLE_FLAG_KERNEL, SAMPLE_FLAG_MEMORY,
};

use super::analysis::is_lock_implementation;
use crate::features::FastMap;
use crate::{object::x86::access, process::state::Process};
use analysis::{Access, Span, UlcpProfile, Wait};

/// Instructions whose stored constant is remembered (beyond, each
/// sampled write is decoded again).
const CONSTANTS_MAX: usize = 1 << 16;

/// The analysis and its inputs' filters.
#[derive(Debug, Default)]
pub struct Ulcp {
    pub profile: UlcpProfile,
    /// Per sampled write instruction (recipe key): the constant it
    /// stores, if any.
    constants: FastMap<u64, Option<u64>>,
}

/// Whether the sampled access cannot conflict whoever else touches it: a
/// code pointer read by a jump (a PLT stub's GOT slot, a vtable), or
/// read-only memory. Stacks are left to the page test: a thread may hand
/// another a pointer to its stack.
fn private(ev: &SampleEvent, process: &Process) -> bool {
    ev.access & recipe::BRANCH != 0 || process.find(ev.addr).is_some_and(|m| !m.writable)
}

/// Whether the instruction at `ip` may be taken as a section's own code:
/// not the lock implementation or the C library, whose code (the lock
/// and unlock calls, `memcpy`) runs in and out of every section.
fn own_code(ip: u64, process: &Process) -> bool {
    process.find(ip).is_some_and(|m| {
        let name = crate::process::maps::short_name(&m.name);
        m.executable && !is_lock_implementation(name, "")
    })
}

impl Ulcp {
    /// A sample with a data address of the traced process.
    pub fn on_sample(&mut self, ev: &SampleEvent, process: &mut Process) {
        // The main process's locks (children have their own sections,
        // but their addresses are another space).
        if ev.tgid != 0 && ev.tgid != process.pid() {
            return;
        }
        // Every sample says the samples have arrived up to its time
        // (threads blocked in the kernel give samples without address).
        self.profile.saw(ev.time_ns);
        if ev.flags & SAMPLE_FLAG_ADDR == 0 || ev.flags & SAMPLE_FLAG_KERNEL != 0 {
            return;
        }
        let write = ev.access & recipe::WRITE != 0;
        let precise = ev.flags & SAMPLE_FLAG_MEMORY != 0;
        let value = if write {
            self.constant(ev.ip, precise, process)
        } else {
            None
        };
        self.profile.on_access(Access {
            time_ns: ev.time_ns,
            tid: ev.tid,
            ip: if own_code(ev.ip, process) { ev.ip } else { 0 },
            addr: ev.addr,
            size: ev.size,
            write,
            private: private(ev, process),
            value,
        });
    }

    /// The constant the write sampled at `ip` stores, if its instruction
    /// stores an immediate (decoded once per instruction).
    fn constant(&mut self, ip: u64, precise: bool, process: &mut Process) -> Option<u64> {
        let key = recipe_key(process.layout(), ip);
        if let Some(v) = self.constants.get(&key) {
            return *v;
        }
        let v = process
            .code_around(ip)
            .and_then(|(code, at)| access::stored_constant(&code, at, ip, precise));
        if self.constants.len() < CONSTANTS_MAX {
            self.constants.insert(key, v);
        }
        v
    }

    /// A futex wait traced by the sched hooks (its holder's section).
    pub fn on_wait(&mut self, ev: &WaitSpan) {
        self.profile.on_wait(Wait {
            lock: ev.addr,
            waiter: ev.waiter,
            holder: ev.holder,
            start_ns: ev.start_ns,
            woken_ns: ev.woken_ns,
            end_ns: ev.end_ns,
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
            read: lock_op::is_read(ev.op),
        });
    }
}

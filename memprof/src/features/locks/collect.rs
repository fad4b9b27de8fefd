//! Lock records → the lock profile: critical sections from the lock
//! uprobes, and futex waits and wakes from the kernel with their call
//! chains (walked with the objects' call-frame information, then by
//! scanning the copied stack for return addresses).

use memprof_common::{lock_event, locks::HoldEvent, LockEvent};

use super::analysis::{Chain, FutexWait, FutexWake, KernelWait, LockProfile, Section};
use crate::{
    features::FastMap,
    object::{files::CodeCache, unwind},
    process::{
        maps::{call_of, Place, ProcMaps},
        state::Process,
    },
};

/// How often a lock event whose code is not in our memory map may
/// trigger a re-read of the map.
const LOCK_MAPS_REFRESH_MIN_INTERVAL: std::time::Duration = std::time::Duration::from_millis(5);

/// Return addresses kept per futex call chain.
const CHAIN_FRAMES: usize = 8;

/// A futex call whose end has not come yet.
#[derive(Debug)]
struct PendingFutex {
    wait: bool,
    uaddr: u64,
    owner: u32,
    chain: Chain,
}

/// The lock profile and what building it needs.
#[derive(Default)]
pub struct LockCollector {
    pub profile: LockProfile,
    /// Futex calls begun and not yet ended, per thread.
    futex_calls: FastMap<u32, PendingFutex>,
    code: CodeCache,
    unwinder: unwind::Unwinder,
}

impl LockCollector {
    /// A critical section from the lock uprobes.
    pub fn on_hold(&mut self, ev: &HoldEvent, process: &mut Process) {
        if process.before_launch(ev.acquired_ns) {
            return;
        }
        for site in [ev.lock_site, ev.unlock_site] {
            if site != 0 && !self.profile.knows_site(site) {
                // Sites are keyed by the return address, placed at the call.
                let place = process.call_site(site);
                if !matches!(place, Place::Unmapped { .. }) {
                    self.profile.set_site_place(site, place);
                }
            }
        }
        self.profile.add_section(Section {
            lock: ev.lock,
            tid: ev.tid,
            op: ev.op,
            flags: ev.flags,
            acquire_ns: ev.acquire_ns,
            hold_ns: ev.hold_ns,
            lock_site: ev.lock_site,
            unlock_site: ev.unlock_site,
        });
    }

    /// One record of the lock ring buffer.
    pub fn on_record(&mut self, bytes: &[u8], process: &mut Process) {
        let Some(ev) = LockEvent::from_bytes(bytes) else {
            return;
        };
        // Our launch gate's, before the command's exec.
        if process.before_launch(ev.time_ns) {
            return;
        }
        match ev.kind {
            lock_event::WAIT_BEGIN | lock_event::WAKE_BEGIN => {
                let chain = self.chain(&ev, process);
                self.futex_calls.insert(
                    ev.tid,
                    PendingFutex {
                        wait: ev.kind == lock_event::WAIT_BEGIN,
                        uaddr: ev.uaddr,
                        owner: ev.owner,
                        chain,
                    },
                );
            }
            lock_event::END => {
                let Some(call) = self.futex_calls.remove(&ev.tid) else {
                    return;
                };
                if call.wait {
                    self.profile.add_wait(FutexWait {
                        uaddr: call.uaddr,
                        tid: ev.tid,
                        owner: call.owner,
                        duration_ns: ev.duration_ns,
                        chain: call.chain,
                    });
                } else {
                    self.profile.add_wake(FutexWake {
                        uaddr: call.uaddr,
                        tid: ev.tid,
                        woken: u64::try_from(ev.ret).unwrap_or(0),
                        chain: call.chain,
                    });
                }
            }
            lock_event::KERNEL => {
                let ip = process.call_site(ev.ip);
                self.profile.add_kernel_wait(KernelWait {
                    flags: ev.op,
                    duration_ns: ev.duration_ns,
                    ip,
                });
            }
            other => tracing::warn!("unknown lock record kind {other}"),
        }
    }

    /// A return probe on a lock call replaces the call's return address on
    /// the stack with the kernel's trampoline (in the `[uprobes]` page);
    /// the event carries the real one, put back here so the chain goes
    /// through the code that called the lock.
    fn unhide_return_address(ev: &LockEvent, process: &mut Process) -> LockEvent {
        let is_trampoline =
            |maps: &ProcMaps, w: u64| maps.find(w).is_some_and(|m| &*m.name == "[uprobes]");
        if !process
            .maps()
            .mappings()
            .iter()
            .any(|m| &*m.name == "[uprobes]")
        {
            // Created when the first return probe fired: maybe after our
            // snapshot.
            process.refresh_maps_within(LOCK_MAPS_REFRESH_MIN_INTERVAL);
        }
        let mut ev = *ev;
        for w in ev.stack.iter_mut() {
            if is_trampoline(process.maps(), *w) {
                *w = ev.lock_site;
            }
        }
        ev
    }

    /// The call chain of a futex call: the syscall's place and the return
    /// addresses found among the stack words (each resolved at its call).
    fn chain(&mut self, ev: &LockEvent, process: &mut Process) -> Chain {
        // The futex call is in code that must be mapped: if our snapshot
        // does not have it (e.g. libc, just loaded after an exec), the
        // stack words would not be found either. Lock events are few, so
        // re-read the map at a shorter interval than for samples.
        if process.find(ev.ip).is_none() {
            process.refresh_maps_within(LOCK_MAPS_REFRESH_MIN_INTERVAL);
        }
        let unhidden;
        let ev = if ev.lock_site != 0 {
            unhidden = Self::unhide_return_address(ev, process);
            &unhidden
        } else {
            ev
        };
        let ip = process.place(ev.ip);
        let (mut frames, scan_from) = self.unwind(ev, process);
        for &word in ev.stack.iter().skip(scan_from) {
            if frames.len() >= CHAIN_FRAMES {
                break;
            }
            let Some(m) = process.find(word) else {
                continue;
            };
            if !m.executable || !m.is_file() {
                continue;
            }
            let offset = word - m.start + m.offset;
            let path = m.name.clone();
            if self.code.follows_call(&mut process.files, &path, offset) {
                frames.push(Place::File {
                    path,
                    file_offset: call_of(offset),
                });
            }
        }
        Chain { ip, frames }
    }

    /// Walks the futex call's stack with the objects' call-frame
    /// information, as far as the copied stack words go. Returns the return
    /// addresses' places and the index of the first stack word above the
    /// last frame found (where scanning may continue).
    fn unwind(&mut self, ev: &LockEvent, process: &mut Process) -> (Vec<Place>, usize) {
        let word = |addr: u64| -> Option<u64> {
            let i = usize::try_from(addr.checked_sub(ev.sp)? / 8).ok()?;
            (addr % 8 == ev.sp % 8).then_some(())?;
            ev.stack.get(i).copied()
        };
        let (mut ip, mut sp, mut bp) = (ev.ip, ev.sp, ev.bp);
        let mut frames = Vec::new();
        for depth in 0..CHAIN_FRAMES {
            // A return address is resolved at its call instruction.
            let at = if depth == 0 { ip } else { call_of(ip) };
            let Some(m) = process.find(at) else { break };
            if !m.executable || !m.is_file() {
                break;
            }
            let path = m.name.clone();
            let offset = at - m.start + m.offset;
            if depth > 0 {
                frames.push(Place::File {
                    path: path.clone(),
                    file_offset: offset,
                });
            }
            let Some(rule) = self.unwinder.rule(&mut process.files, &path, offset) else {
                break;
            };
            let base = match rule.base {
                unwind::Base::Sp => sp,
                unwind::Base::Bp => bp,
            };
            let cfa = base.wrapping_add_signed(rule.cfa_offset);
            let Some(ra) = word(cfa.wrapping_add_signed(rule.ra_offset)).filter(|&a| a != 0) else {
                break;
            };
            if let Some(o) = rule.bp_offset {
                match word(cfa.wrapping_add_signed(o)) {
                    Some(saved) => bp = saved,
                    None => break,
                }
            }
            (ip, sp) = (ra, cfa);
        }
        let scan_from = usize::try_from(sp.saturating_sub(ev.sp) / 8).unwrap_or(usize::MAX);
        (frames, scan_from)
    }
}

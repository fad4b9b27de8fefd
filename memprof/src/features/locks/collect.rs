//! Lock records → the lock profile: critical sections from the lock
//! uprobes; futex waits and wakes and kernel lock waits from the kernel's
//! aggregates, named by the call chains of their stack samples (walked
//! with the objects' call-frame information, then by scanning the copied
//! stack for return addresses).
//!
//! Every table here has a bound: chains per site ([`SITES_MAX`]), owners
//! per lock ([`OWNERS_MAX`]) and locks with owners ([`LOCKS_WITH_OWNERS`]).

use memprof_common::{
    hint_key, lock_event, locks::HoldEvent, Contention, ContentionKey, LockEvent, SiteHint,
    SITE_HINT_FRAMES,
};

use super::analysis::{Chain, Durations, LockProfile, Section, WakeSite};
use crate::{
    features::{FastMap, FastSet},
    object::{
        files::CodeCache,
        unwind,
        walk::{walk, StackCopy, Walk},
    },
    process::{
        maps::{call_of, Place, ProcMaps},
        state::Process,
    },
};

/// Return addresses kept per futex call chain.
const CHAIN_FRAMES: usize = 8;
/// Call sites whose chain is kept (the kernel's site hashes; a program
/// has tens to hundreds).
const SITES_MAX: usize = 16384;
/// Owner threads counted per lock, and locks whose owners are counted.
const OWNERS_MAX: usize = 64;
const LOCKS_WITH_OWNERS: usize = 16384;

/// The lock profile and what building it needs.
#[derive(Default)]
pub struct LockCollector {
    pub profile: LockProfile,
    /// The chain of each (lock, call site) sampled, from its first
    /// sample; and of each call site, for keys whose first call found the
    /// sample budget spent. A site hashed before its hint was installed is
    /// the bare syscall instruction, shared by every caller of that libc
    /// helper (a mutex, a barrier): only its own samples name it right.
    chains: FastMap<(u64, u64), Chain>,
    site_chains: FastMap<u64, Chain>,
    /// Owner threads read in sampled waits, per futex word.
    owners: FastMap<u64, FastMap<u32, u64>>,
    /// Instructions, per event kind (`hint_key`), whose site hint was
    /// computed (installed or not).
    hinted: FastSet<u64>,
    /// Hints for the kernel, not yet written to its map.
    pub new_hints: Vec<(u64, SiteHint)>,
    code: CodeCache,
    unwinder: unwind::Unwinder,
    /// A thread of the target waited on a futex (the default mode's lock
    /// probes wait for it).
    pub futex_waited: bool,
    /// The futex words waits were sampled on (at most
    /// [`LOCKS_WITH_OWNERS`]), for naming them while their memory is live.
    waited: FastSet<u64>,
}

impl LockCollector {
    /// A critical section from the lock uprobes; false when it is our
    /// launch gate's (before the command's exec), and left out.
    pub fn on_hold(&mut self, ev: &HoldEvent, process: &mut Process) -> bool {
        if process.before_launch(ev.acquired_ns) {
            return false;
        }
        for site in [ev.lock_site, ev.unlock_site] {
            if site != 0 && !self.profile.knows_site(site) && self.profile.can_place_site() {
                // Sites are keyed by the return address, placed at the call.
                let place = process.code_place(call_of(site), ev.acquired_ns);
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
        true
    }

    /// One stack sample of the lock ring: names its site, counts its
    /// owner, and gives its instruction a site hint.
    pub fn on_record(&mut self, bytes: &[u8], process: &mut Process) {
        let Some(ev) = LockEvent::from_bytes(bytes) else {
            return;
        };
        // Our launch gate's, before the command's exec.
        if process.before_launch(ev.time_ns) {
            return;
        }
        if !matches!(
            ev.kind,
            lock_event::WAIT | lock_event::WAKE | lock_event::KERNEL
        ) {
            tracing::warn!("unknown lock record kind {}", ev.kind);
            return;
        }
        self.futex_waited |= ev.kind == lock_event::WAIT;
        if ev.kind == lock_event::WAIT && self.waited.len() < LOCKS_WITH_OWNERS {
            self.waited.insert(ev.addr);
        }
        if ev.kind == lock_event::WAIT && ev.owner != 0 && ev.owner != ev.tid {
            let full = self.owners.len() >= LOCKS_WITH_OWNERS;
            if let Some(owners) = match self.owners.get_mut(&ev.addr) {
                Some(o) => Some(o),
                None if !full => Some(self.owners.entry(ev.addr).or_default()),
                None => None,
            } {
                if owners.len() < OWNERS_MAX || owners.contains_key(&ev.owner) {
                    *owners.entry(ev.owner).or_default() += 1;
                }
            }
        }
        let hint_at = hint_key(ev.ip, ev.kind);
        let hint_needed = !self.hinted.contains(&hint_at);
        if self.chains.contains_key(&(ev.addr, ev.site)) && !hint_needed {
            return;
        }
        let (chain, slots) = self.chain(&ev, process);
        if hint_needed && !chain.frames.is_empty() && self.hinted.len() < SITES_MAX {
            self.hinted.insert(hint_at);
            let code_of = |word| {
                process
                    .find(word)
                    .filter(|m| m.executable)
                    .map(|m| [m.start, m.end])
            };
            if let Some(hint) = site_hint(&slots, &ev.stack, code_of) {
                self.new_hints.push((hint_at, hint));
            }
        }
        self.keep_chain(ev.addr, ev.site, chain);
    }

    /// The futex words waits were sampled on.
    pub fn waited_words(&self) -> impl Iterator<Item = u64> + '_ {
        self.waited.iter().copied()
    }

    /// Keeps the first chain of a (lock, site) and of a site, unless its
    /// instruction could not be placed (a map read that failed or raced an
    /// exec): kept, it named the site "[unmapped]" for the whole session
    /// (1,757 wakes of a CI run's test); left out, the key's next sample,
    /// an interval later, names it.
    fn keep_chain(&mut self, addr: u64, site: u64, chain: Chain) {
        if matches!(chain.ip, Place::Unmapped { .. }) || self.chains.len() >= SITES_MAX {
            return;
        }
        if self.site_chains.len() < SITES_MAX {
            self.site_chains
                .entry(site)
                .or_insert_with(|| chain.clone());
        }
        self.chains.entry((addr, site)).or_insert(chain);
    }

    /// Replaces the profile's contention with a snapshot of the kernel's
    /// aggregates, `threads` the count of threads that waited per futex
    /// word.
    pub fn rebuild(
        &mut self,
        snapshot: &[(ContentionKey, Contention)],
        threads: &FastMap<u64, usize>,
    ) {
        self.profile.clear_contention();
        for (key, c) in snapshot {
            if c.count == 0 && c.caused_waits == 0 {
                continue;
            }
            let chain = self
                .chains
                .get(&(key.addr, key.site))
                .or_else(|| self.site_chains.get(&key.site))
                .cloned()
                .unwrap_or_else(unknown_chain);
            let durations = Durations::from_log2(c.buckets, c.count, c.total_ns, c.max_ns);
            match key.kind {
                lock_event::WAIT => self.profile.add_waits(key.addr, chain, &durations),
                lock_event::WAKE => self.profile.add_wakes(
                    key.addr,
                    chain,
                    WakeSite {
                        calls: c.count,
                        woken: c.woken,
                        caused_ns: c.caused_ns,
                        caused_waits: c.caused_waits,
                    },
                ),
                lock_event::KERNEL => {
                    self.profile
                        .add_kernel_waits(key.addr as u32, chain, &durations)
                }
                _ => {}
            }
        }
        let empty = FastMap::default();
        for (&addr, &n) in threads {
            let owners = self.owners.get(&addr).unwrap_or(&empty);
            self.profile.set_waiters_seen(addr, n, owners);
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
            // snapshot, even one taken a moment before this event was
            // drained, so a throttled re-read can miss it, and the chain
            // (kept for the site) would stop at the trampoline.
            process.refresh_maps_older_than(ev.time_ns);
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
    fn chain(&mut self, ev: &LockEvent, process: &mut Process) -> (Chain, Vec<u16>) {
        // The futex call is in code that must be mapped: if our snapshot
        // does not have it (e.g. libc, just loaded after an exec), the
        // stack words would not be found either. Re-read the map if our
        // snapshot is older than the event (lock events are few).
        if process.find(ev.ip).is_none() {
            process.refresh_maps_older_than(ev.time_ns);
        }
        let unhidden;
        let ev = if ev.lock_site != 0 {
            unhidden = Self::unhide_return_address(ev, process);
            &unhidden
        } else {
            ev
        };
        let ip = process.place(ev.ip);
        // The stack offsets of the return addresses the call-frame
        // information found are the site hint.
        let Walk {
            mut frames,
            scan_from,
            slots,
            ..
        } = self.unwind(ev, process);
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
        (Chain { ip, frames }, slots)
    }

    /// Walks the futex call's stack with the objects' call-frame
    /// information, as far as the copied stack words go.
    fn unwind(&mut self, ev: &LockEvent, process: &mut Process) -> Walk {
        let copy = StackCopy::sampled(ev.ip, ev.sp, ev.bp, &ev.stack);
        walk(&mut self.unwinder, &copy, process, CHAIN_FRAMES)
    }
}

/// The site hint of a sample's return-address `slots` (byte offsets into
/// `stack`, copied from the stack pointer up): each slot with the code
/// mapping its word is in (`code_of`), up to the first word in none (a
/// slot past the copy, or a return address the map does not hold yet).
/// None when not even the first slot can be named.
fn site_hint(
    slots: &[u16],
    stack: &[u64],
    code_of: impl Fn(u64) -> Option<[u64; 2]>,
) -> Option<SiteHint> {
    let mut hint = SiteHint::default();
    for (i, &slot) in slots.iter().take(SITE_HINT_FRAMES).enumerate() {
        let Some(code) = stack.get(usize::from(slot) / 8).and_then(|&w| code_of(w)) else {
            break;
        };
        hint.slots[i] = slot;
        hint.code[i] = code;
        hint.count = i as u32 + 1;
    }
    (hint.count > 0).then_some(hint)
}

/// The chain of a site no sample named (the sample budget ran out before
/// its first call was sampled).
fn unknown_chain() -> Chain {
    Chain {
        ip: Place::Unmapped { address: 0 },
        frames: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn chain(offset: u64) -> Chain {
        let at = Place::File {
            path: Arc::from("/bin/prog"),
            file_offset: offset,
        };
        Chain {
            ip: at.clone(),
            frames: vec![at],
        }
    }

    fn key(addr: u64, site: u64, kind: u32) -> ContentionKey {
        ContentionKey {
            addr,
            site,
            kind,
            _pad: 0,
        }
    }

    fn calls(count: u64, ns: u64) -> Contention {
        let mut c = Contention {
            count,
            total_ns: count * ns,
            max_ns: ns,
            ..Contention::default()
        };
        c.buckets[memprof_common::log2_bucket(ns)] = count;
        c
    }

    #[test]
    fn an_unplaced_chain_waits_for_the_next_sample() {
        let mut c = LockCollector::default();
        c.keep_chain(0x1000, 0xa1, unknown_chain());
        assert!(c.chains.is_empty() && c.site_chains.is_empty());
        c.keep_chain(0x1000, 0xa1, chain(0x10));
        c.keep_chain(0x1000, 0xa1, chain(0x20));
        assert_eq!(c.chains.get(&(0x1000, 0xa1)), Some(&chain(0x10)));
        assert_eq!(c.site_chains.get(&0xa1), Some(&chain(0x10)));
    }

    #[test]
    fn snapshots_merge_per_lock_and_replace_the_last_one() {
        let mut c = LockCollector::default();
        c.site_chains.insert(0xa1, chain(0x10));
        c.site_chains.insert(0xa2, chain(0x20));
        c.site_chains.insert(0xb1, chain(0x30));
        // The bare instruction's site, sampled on another lock first.
        c.chains.insert((0x3000, 0xa2), chain(0x90));
        c.owners.insert(0x1000, [(7, 2)].into_iter().collect());
        let wake = Contention {
            woken: 5,
            caused_ns: 9000,
            caused_waits: 3,
            ..calls(5, 100)
        };
        let snapshot = vec![
            (key(0x1000, 0xa1, lock_event::WAIT), calls(3, 1000)),
            (key(0x1000, 0xa2, lock_event::WAIT), calls(1, 6000)),
            (key(0x1000, 0xb1, lock_event::WAKE), wake),
            // The per-site aggregate of locks past the kernel's table, and
            // a site no sample named.
            (key(0, 0xa1, lock_event::WAIT), calls(2, 50)),
            (key(0x2000, 0xff, lock_event::WAIT), calls(1, 10)),
            (key(2, 0xa2, lock_event::KERNEL), calls(4, 300)),
            (key(0x3000, 0xa2, lock_event::WAIT), calls(1, 10)),
        ];
        let threads = [(0x1000, 3)].into_iter().collect();
        for _ in 0..2 {
            // Twice: the kernel's totals are cumulative, not deltas.
            c.rebuild(&snapshot, &threads);
            let futexes = c.profile.futexes();
            let (addr, f) = futexes[0];
            assert_eq!(addr, 0x1000);
            assert_eq!((f.contentions(), f.waits.total_ns), (4, 9000));
            assert_eq!(f.waits.max_ns, 6000);
            assert_eq!(f.waiters.get(&chain(0x10)), Some(&(3, 3000)));
            let w = f.wakers.get(&chain(0x30)).expect("the wake site");
            assert_eq!(
                (w.calls, w.woken, w.caused_ns, w.caused_waits),
                (5, 5, 9000, 3)
            );
            assert_eq!((f.threads, f.owners.get(&7)), (3, Some(&2)));
            let other = futexes.iter().find(|(a, _)| *a == 0).expect("other locks");
            assert_eq!(other.1.waiters.get(&chain(0x10)), Some(&(2, 100)));
            let unnamed = futexes.iter().find(|(a, _)| *a == 0x2000).unwrap();
            assert_eq!(unnamed.1.waiters.get(&unknown_chain()), Some(&(1, 10)));
            let own = futexes.iter().find(|(a, _)| *a == 0x3000).unwrap();
            assert_eq!(own.1.waiters.get(&chain(0x90)), Some(&(1, 10)));
            let kernel = c.profile.kernel();
            assert_eq!((kernel[0].0, kernel[0].1.waits.count()), (2, 4));
        }
    }

    /// The kernel's hashing of a site, as `site_of` does it: the slots'
    /// words while they fit the hint's mappings.
    fn hashed(hint: &SiteHint, stack: &[u64]) -> Vec<u64> {
        let mut words = Vec::new();
        for i in 0..hint.count as usize {
            let w = stack[usize::from(hint.slots[i]) / 8];
            if !memprof_common::hint_word_fits(w, hint.code[i]) {
                break;
            }
            words.push(w);
        }
        words
    }

    #[test]
    fn a_hint_names_each_slot_by_its_code_mapping_and_other_callers_stop_at_data() {
        const LIBC: [u64; 2] = [0x7f00_0000, 0x7f10_0000];
        const PROG: [u64; 2] = [0x5500_0000, 0x5501_0000];
        let code_of = |w: u64| [LIBC, PROG].into_iter().find(|c| w >= c[0] && w < c[1]);
        // The sample that made the hint: libc's return into the lock
        // function, the user's call site, its caller, and a slot past the
        // copy (not named: the hint ends before it).
        let first = [0x7f00_0100, 9, 0x5500_0200, 9, 0x5500_0300];
        let hint = site_hint(&[0, 16, 32, 400], &first, code_of).expect("a hint");
        assert_eq!(hint.count, 3);
        assert_eq!(&hint.slots[..3], &[0, 16, 32]);
        assert_eq!(&hint.code[..3], &[LIBC, PROG, PROG]);
        assert_eq!(
            hashed(&hint, &first),
            [0x7f00_0100, 0x5500_0200, 0x5500_0300]
        );
        // Another caller of the lock function has a larger frame: its
        // return address is in the second slot, and the third holds a
        // loop counter that changes on every call. The site stops before
        // it, so every call of that caller is one site.
        for counter in [1, 2, 3] {
            let other = [0x7f00_0100, 9, 0x5500_0400, 9, counter];
            assert_eq!(hashed(&hint, &other), [0x7f00_0100, 0x5500_0400]);
        }
        // No slot in a code mapping: no hint.
        assert_eq!(site_hint(&[8], &first, code_of), None);
    }
}

//! Collection: turns raw kernel records into plain analysis events.
//!
//! The ring buffers are drained by [`crate::session`]; each record is handed
//! to a [`Collector`], which resolves sampled addresses against the target's
//! memory map at once (while the process is alive) and feeds the pure
//! analyses.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use memprof_common::{
    lock_event, record_kind,
    sharing::{recipe, AccessRecipe},
    AllocEvent, LockEvent, SampleEvent, SyscallEvent, TaskEvent, EVENT_ALLOC, EVENT_SYSCALL,
    SAMPLE_FLAG_ADDR, SAMPLE_FLAG_KERNEL, SAMPLE_FLAG_MEMORY, SAMPLE_FLAG_NO_RECIPE, TASK_EXEC,
    TASK_EXIT, TASK_NEW_THREAD,
};

use crate::features::{
    alloc::analysis::{AllocCall, AllocProfile, SyscallCall},
    cpu::profile::{Profile, Sample, SampleAt, ThreadEvent},
    locks::analysis::{Chain, FutexWait, FutexWake, KernelWait, LockProfile, Section},
    sharing::analysis::{Access, SharingProfile},
    FastMap,
};
use crate::object::{
    code::{CodeCache, FileCache},
    unwind,
    x86::access,
};
use crate::process::maps::{self, Place, ProcMaps};
use crate::process::threads::LiveThreads;

/// How often an unknown address may trigger a re-read of the memory map.
const MAPS_REFRESH_MIN_INTERVAL: Duration = Duration::from_millis(100);
/// Samples held while waiting for a launched command's `exec`.
const MAX_HELD_SAMPLES: usize = 100_000;

/// Per-session collection state.
pub struct Collector {
    pid: u32,
    maps: ProcMaps,
    maps_read_at: Option<Instant>,
    /// The memory map before the last `exec`, with the exec's time: samples
    /// taken before it but drained after it belong to the old image.
    before_exec: Option<(u64, ProcMaps)>,
    names: HashMap<u32, String>,
    /// For a launched command: samples held until its `exec`, because
    /// those taken before it are of our launch gate, not of the command.
    held: Option<Vec<SampleEvent>>,
    /// Time of that `exec`: samples older than it, drained later, are the
    /// gate's too.
    launch_exec_ns: Option<u64>,
    /// Samples dropped here because the hold buffer was full.
    pub dropped: u64,
    pub profile: Profile,
    /// The allocator profile, when the allocator is traced.
    pub alloc: Option<AllocProfile>,
    live: LiveThreads,
    /// Allocator probe windows, as ktime ranges (the last may be open).
    alloc_windows: Vec<(u64, Option<u64>)>,
    /// Lock contention seen from the kernel.
    pub locks: LockProfile,
    /// Futex calls begun and not yet ended, per thread.
    futex_calls: FastMap<u32, PendingFutex>,
    code: CodeCache,
    unwinder: unwind::Unwinder,
    /// Object files' bytes, for both of the above.
    files: FileCache,
    /// Sampled data accesses, per cache line.
    pub sharing: SharingProfile,
    /// Decoded instructions: the recipe for each sampled IP and which
    /// instruction it describes.
    decoded: FastMap<u64, access::Decoded>,
    /// Recipes decoded since the session last installed them.
    new_recipes: Vec<(u64, AccessRecipe)>,
    /// The sampling event gives the data address itself (no skid).
    pub precise_addresses: bool,
    /// The target called exec: the kernel's recipes are stale.
    recipes_reset: bool,
    /// The heap block under each shared line, looked up while it is live.
    line_blocks: FastMap<u64, Option<LineBlock>>,
}

/// The heap block a shared line lies in, as it was when first seen shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineBlock {
    pub start: u64,
    pub size: u64,
    /// The allocating call ([`AllocProfile::site_place`]).
    pub site: u64,
}

/// A futex call whose end has not come yet.
#[derive(Debug)]
struct PendingFutex {
    wait: bool,
    uaddr: u64,
    owner: u32,
    chain: Chain,
}

/// How often a lock event whose code is not in our memory map may
/// trigger a re-read of the map.
const LOCK_MAPS_REFRESH_MIN_INTERVAL: Duration = Duration::from_millis(5);

/// Return addresses kept per futex call chain.
const CHAIN_FRAMES: usize = 8;

impl Collector {
    /// Starts collecting for `pid`: reads its memory map and its threads.
    pub fn new(pid: u32) -> Self {
        let mut collector = Self {
            pid,
            maps: ProcMaps::default(),
            maps_read_at: None,
            before_exec: None,
            names: HashMap::new(),
            held: None,
            launch_exec_ns: None,
            dropped: 0,
            profile: Profile::new(),
            alloc: None,
            live: LiveThreads::default(),
            alloc_windows: Vec::new(),
            locks: LockProfile::new(),
            futex_calls: FastMap::default(),
            code: CodeCache::default(),
            unwinder: unwind::Unwinder::default(),
            files: FileCache::default(),
            sharing: SharingProfile::new(),
            decoded: FastMap::default(),
            new_recipes: Vec::new(),
            precise_addresses: false,
            recipes_reset: false,
            line_blocks: FastMap::default(),
        };
        collector.refresh_maps();
        let tids = list_threads(pid);
        collector.live = LiveThreads::new(tids.len());
        for tid in tids {
            collector
                .profile
                .add_thread_event(ThreadEvent::Existing { tid });
            collector.learn_name(tid);
        }
        collector
    }

    /// Re-reads `/proc/PID/maps`; keeps the old snapshot if the process is
    /// gone, so late samples still resolve.
    fn refresh_maps(&mut self) {
        match ProcMaps::read(self.pid) {
            Ok(maps) if !maps.is_empty() => self.maps = maps,
            Ok(_) => {}
            Err(e) => tracing::debug!("re-reading maps of {}: {e}", self.pid),
        }
        self.maps_read_at = Some(Instant::now());
    }

    /// Where `addr` is, re-reading the map once if it is not in our snapshot
    /// (a library loaded since, or the first samples after `exec`).
    pub fn place(&mut self, addr: u64) -> Place {
        let place = self.maps.place(addr);
        if !matches!(place, Place::Unmapped { .. }) {
            return place;
        }
        let stale = self
            .maps_read_at
            .is_none_or(|t| t.elapsed() >= MAPS_REFRESH_MIN_INTERVAL);
        if stale {
            self.refresh_maps();
            return self.maps.place(addr);
        }
        place
    }

    /// Counts only samples from the next `exec` on (a launched command,
    /// whose process runs our gate until then).
    pub fn start_at_exec(&mut self) {
        self.held = Some(Vec::new());
    }

    /// Resolves samples that fell outside the memory map when they came
    /// (e.g. a library mapped less than a refresh interval earlier).
    pub fn settle(&mut self) {
        self.name_shared_lines();
        let unplaced = self
            .alloc
            .as_ref()
            .map(AllocProfile::unplaced_sites)
            .unwrap_or_default();
        if !unplaced.is_empty() {
            self.refresh_maps();
            for addr in unplaced {
                let place = self.maps.place(addr);
                if let Some(alloc) = &mut self.alloc {
                    alloc.set_site_place(addr, place);
                }
            }
        }
        if self.profile.has_unmapped() {
            self.refresh_maps();
            let maps = &self.maps;
            self.profile.remap_unmapped(|addr| maps.place(addr));
        }
    }

    /// Reads the frames of newly seen user stacks with `read` (a stack-map
    /// lookup) and resolves them to places now, while the map is current.
    /// Frames are return addresses, resolved at `ip - 1`, the call.
    pub fn read_stacks(&mut self, mut read: impl FnMut(u32) -> Option<Vec<u64>>) {
        for id in self.profile.unread_stacks() {
            let Some(ips) = read(id) else { continue };
            // Every frame is a return address (the sampled instruction is
            // not in the stack): resolve the call instruction before it.
            let places = ips
                .iter()
                .map(|&ip| self.place(ip.saturating_sub(1)))
                .collect();
            self.profile.set_stack(id, places);
        }
    }

    /// Still waiting for the launched command's `exec` (it never ran).
    pub fn awaiting_exec(&self) -> bool {
        self.held.is_some()
    }

    pub fn on_sample(&mut self, ev: &SampleEvent) {
        if let Some(held) = &mut self.held {
            if held.len() < MAX_HELD_SAMPLES {
                held.push(*ev);
            } else {
                self.dropped += 1;
            }
            return;
        }
        if self.launch_exec_ns.is_some_and(|t| ev.time_ns < t) {
            return;
        }
        if ev.flags & SAMPLE_FLAG_MEMORY != 0 {
            // A precise memory event: an access, not CPU time.
            if ev.flags & SAMPLE_FLAG_KERNEL == 0 && ev.ip != 0 {
                self.on_user_access(ev);
            }
            return;
        }
        let at = if ev.flags & SAMPLE_FLAG_KERNEL != 0 || ev.ip == 0 {
            SampleAt::Kernel
        } else {
            match &self.before_exec {
                Some((exec_ns, old)) if ev.time_ns < *exec_ns => SampleAt::User(old.place(ev.ip)),
                _ => SampleAt::User(self.place(ev.ip)),
            }
        };
        if !self.names.contains_key(&ev.tid) {
            self.learn_name(ev.tid);
        }
        if matches!(at, SampleAt::User(_)) {
            self.on_user_access(ev);
        }
        self.profile.add_sample(Sample {
            time_ns: ev.time_ns,
            tid: ev.tid,
            at,
            stack_id: u32::try_from(ev.stack_id).ok(),
        });
    }

    /// The memory side of a user-mode sample: its address, or a request
    /// to decode its instruction.
    fn on_user_access(&mut self, ev: &SampleEvent) {
        let old_image = self
            .before_exec
            .as_ref()
            .is_some_and(|(exec_ns, _)| ev.time_ns < *exec_ns);
        if ev.flags & SAMPLE_FLAG_NO_RECIPE != 0 {
            if !old_image {
                self.decode(ev.ip);
            }
            return;
        }
        if ev.flags & SAMPLE_FLAG_ADDR == 0 {
            return; // no memory operand (counted in the kernel)
        }
        let insn = self.decoded.get(&ev.ip).map_or(ev.ip, |d| d.insn);
        self.sharing.on_access(Access {
            tid: ev.tid,
            insn,
            addr: ev.addr,
            size: ev.size,
            read: ev.access & recipe::READ != 0,
            write: ev.access & recipe::WRITE != 0,
        });
    }

    /// Decodes the instruction at `ip` once, for the session to install.
    fn decode(&mut self, ip: u64) {
        if self.decoded.contains_key(&ip) {
            return; // decoded, not yet installed when this was sampled
        }
        let decoded = match self.code_around(ip) {
            Some((code, code_ip)) => access::decode(&code, code_ip, ip, self.precise_addresses),
            None => access::Decoded {
                recipe: AccessRecipe::none(),
                insn: ip,
            },
        };
        self.decoded.insert(ip, decoded);
        self.new_recipes.push((ip, decoded.recipe));
    }

    /// The code bytes around `ip` (see [`access::decode`]) and the address
    /// of the first, from the object file or, for anonymous code, from the
    /// process's memory.
    fn code_around(&mut self, ip: u64) -> Option<(Vec<u8>, u64)> {
        if self.maps.find(ip).is_none() {
            self.place(ip); // re-reads the map
        }
        let m = self.maps.find(ip)?.clone();
        let lo = ip.saturating_sub(access::LOOK_BEHIND).max(m.start);
        let hi = (ip + access::LOOK_AHEAD).min(m.end);
        if m.is_file() {
            let bytes = self.files.get(&m.name)?;
            let off = |a: u64| (a - m.start + m.offset) as usize;
            let code = bytes.get(off(lo)..off(hi).min(bytes.len()))?;
            return Some((code.to_vec(), lo));
        }
        let mut code = vec![0u8; (hi - lo) as usize];
        let mem = std::fs::File::open(format!("/proc/{}/mem", self.pid)).ok()?;
        std::os::unix::fs::FileExt::read_exact_at(&mem, &mut code, lo).ok()?;
        Some((code, lo))
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

    /// The heap block under `line` (recorded by [`Collector::settle`] while
    /// it was live).
    pub fn line_block(&self, line: u64) -> Option<LineBlock> {
        self.line_blocks.get(&line).copied().flatten()
    }

    /// Looks up the heap blocks under newly shared lines now, while they
    /// are live: the report may come after the target freed them.
    fn name_shared_lines(&mut self) {
        let new: Vec<u64> = self
            .sharing
            .candidates()
            .into_iter()
            .filter(|l| !self.line_blocks.contains_key(l))
            .collect();
        if new.is_empty() {
            return;
        }
        let index = self.alloc.as_ref().map(AllocProfile::block_index);
        for line in new {
            let block = index.as_ref().and_then(|index| {
                // Any byte of the line: a block may start inside it.
                let first = line + u64::from(self.sharing.first_offset(line));
                let (start, b) = index.containing(first)?;
                Some(LineBlock {
                    start,
                    size: b.size,
                    site: b.site,
                })
            });
            self.line_blocks.insert(line, block);
        }
    }

    pub fn on_task(&mut self, ev: &TaskEvent) {
        let event = match ev.kind {
            TASK_NEW_THREAD => {
                self.live.change(ev.time_ns, 1);
                ThreadEvent::Created {
                    tid: ev.tid,
                    parent: ev.parent_tid,
                    time_ns: ev.time_ns,
                }
            }
            TASK_EXIT => {
                self.live.change(ev.time_ns, -1);
                // The kernel sends the final name: short-lived threads may
                // already be gone from /proc.
                let comm = ev.comm_str();
                if !comm.is_empty() {
                    self.names.insert(ev.tid, comm.to_string());
                }
                ThreadEvent::Exited {
                    tid: ev.tid,
                    time_ns: ev.time_ns,
                }
            }
            TASK_EXEC => {
                // A new program image: keep the old map for late samples of
                // the old image; the thread has the new program's name.
                self.before_exec = Some((ev.time_ns, self.maps.clone()));
                self.refresh_maps();
                // Instructions of the old image are not those of the new
                // one at the same addresses: decode afresh.
                self.decoded.clear();
                self.new_recipes.clear();
                self.recipes_reset = true;
                // Other threads are gone; their names stay for the report.
                self.learn_name(ev.tid);
                self.profile.add_thread_event(ThreadEvent::Exec {
                    tid: ev.tid,
                    time_ns: ev.time_ns,
                });
                if let Some(held) = self.held.take() {
                    self.launch_exec_ns = Some(ev.time_ns);
                    for sample in &held {
                        self.on_sample(sample);
                    }
                }
                return;
            }
            other => {
                tracing::warn!("unknown task event kind {other}");
                return;
            }
        };
        self.profile.add_thread_event(event);
    }

    /// Starts the allocator profile.
    pub fn enable_alloc(&mut self, profile: AllocProfile) {
        self.alloc = Some(profile);
    }

    /// The allocator probes were attached (`open`) or detached at `ktime`.
    pub fn alloc_window(&mut self, open: bool, ktime: u64) {
        if open {
            self.alloc_windows.push((ktime, None));
        } else if let Some(last) = self.alloc_windows.last_mut() {
            last.1.get_or_insert(ktime);
        }
    }

    /// Whether the allocator probes were attached at `ktime`.
    fn alloc_traced_at(&self, ktime: u64) -> bool {
        self.alloc_windows
            .iter()
            .rev()
            .any(|&(start, end)| start <= ktime && end.is_none_or(|e| ktime < e))
    }

    /// One record of the allocator ring buffer.
    pub fn on_alloc_record(&mut self, bytes: &[u8]) {
        // A launched command's process runs our gate until its exec.
        if self.held.is_some() || self.alloc.is_none() {
            return;
        }
        match record_kind(bytes) {
            Some(EVENT_ALLOC) => {
                if let Some(ev) = AllocEvent::from_bytes(bytes) {
                    self.on_alloc(&ev);
                }
            }
            Some(EVENT_SYSCALL) => {
                if let Some(ev) = SyscallEvent::from_bytes(bytes) {
                    self.on_syscall(&ev);
                }
            }
            other => tracing::warn!("unknown allocator record kind {other:?}"),
        }
    }

    fn on_alloc(&mut self, ev: &AllocEvent) {
        if self.launch_exec_ns.is_some_and(|t| ev.start_ns < t) {
            return;
        }
        // The return address follows the call: resolve the call itself,
        // once per site.
        // (Frees carry no caller: their site is their block's.)
        let site = ev.caller.saturating_sub(1);
        if ev.caller != 0 && self.alloc.as_ref().is_some_and(|a| !a.knows_site(site)) {
            let place = self.place(site);
            // Not mapped in our snapshot yet (a library loaded a moment
            // ago): tried again at the next call, or when settling.
            if !matches!(place, Place::Unmapped { .. }) {
                if let Some(alloc) = &mut self.alloc {
                    alloc.set_site_place(site, place);
                }
            }
        }
        let live_threads = self.live.at(ev.start_ns);
        if let Some(alloc) = &mut self.alloc {
            alloc.add_call(AllocCall {
                op: ev.op,
                tid: ev.tid,
                start_ns: ev.start_ns,
                duration_ns: ev.duration_ns,
                ptr: ev.ptr,
                old_ptr: ev.old_ptr,
                size: ev.size,
                chunk: ev.chunk,
                site,
                live_threads,
            });
        }
    }

    fn on_syscall(&mut self, ev: &SyscallEvent) {
        if self.launch_exec_ns.is_some_and(|t| ev.start_ns < t) {
            return;
        }
        let traced = self.alloc_traced_at(ev.start_ns);
        if let Some(alloc) = &mut self.alloc {
            alloc.add_syscall(SyscallCall {
                nr: ev.nr,
                inside: ev.inside.checked_sub(1),
                traced,
                duration_ns: ev.duration_ns,
                args: ev.args,
                ret: ev.ret,
            });
        }
    }

    /// A critical section from the lock uprobes.
    pub fn on_hold(&mut self, ev: &memprof_common::locks::HoldEvent) {
        if self.held.is_some() || self.launch_exec_ns.is_some_and(|t| ev.acquired_ns < t) {
            return;
        }
        for site in [ev.lock_site, ev.unlock_site] {
            if site != 0 && !self.locks.knows_site(site) {
                // The return address follows the call: resolve the call.
                let place = self.place(site - 1);
                if !matches!(place, Place::Unmapped { .. }) {
                    self.locks.set_site_place(site, place);
                }
            }
        }
        self.locks.add_section(Section {
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
    pub fn on_lock_record(&mut self, bytes: &[u8]) {
        if self.held.is_some() {
            return; // our launch gate, before the command's exec
        }
        let Some(ev) = LockEvent::from_bytes(bytes) else {
            return;
        };
        if self.launch_exec_ns.is_some_and(|t| ev.time_ns < t) {
            return;
        }
        match ev.kind {
            lock_event::WAIT_BEGIN | lock_event::WAKE_BEGIN => {
                let chain = self.chain(&ev);
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
                    self.locks.add_wait(FutexWait {
                        uaddr: call.uaddr,
                        tid: ev.tid,
                        owner: call.owner,
                        duration_ns: ev.duration_ns,
                        chain: call.chain,
                    });
                } else {
                    self.locks.add_wake(FutexWake {
                        uaddr: call.uaddr,
                        tid: ev.tid,
                        woken: u64::try_from(ev.ret).unwrap_or(0),
                        chain: call.chain,
                    });
                }
            }
            lock_event::KERNEL => {
                let ip = self.place(ev.ip.saturating_sub(1));
                self.locks.add_kernel_wait(KernelWait {
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
    fn unhide_return_address(&mut self, ev: &LockEvent) -> LockEvent {
        let is_trampoline =
            |maps: &ProcMaps, w: u64| maps.find(w).is_some_and(|m| &*m.name == "[uprobes]");
        if !self.maps.mappings().iter().any(|m| &*m.name == "[uprobes]") {
            // Created when the first return probe fired: maybe after our
            // snapshot.
            if self
                .maps_read_at
                .is_none_or(|t| t.elapsed() >= LOCK_MAPS_REFRESH_MIN_INTERVAL)
            {
                self.refresh_maps();
            }
        }
        let mut ev = *ev;
        for w in ev.stack.iter_mut() {
            if is_trampoline(&self.maps, *w) {
                *w = ev.lock_site;
            }
        }
        ev
    }

    /// The call chain of a futex call: the syscall's place and the return
    /// addresses found among the stack words (each resolved at its call).
    fn chain(&mut self, ev: &LockEvent) -> Chain {
        // The futex call is in code that must be mapped: if our snapshot
        // does not have it (e.g. libc, just loaded after an exec), the
        // stack words would not be found either. Lock events are few, so
        // re-read the map at a shorter interval than for samples.
        if self.maps.find(ev.ip).is_none()
            && self
                .maps_read_at
                .is_none_or(|t| t.elapsed() >= LOCK_MAPS_REFRESH_MIN_INTERVAL)
        {
            self.refresh_maps();
        }
        let unhidden;
        let ev = if ev.lock_site != 0 {
            unhidden = self.unhide_return_address(ev);
            &unhidden
        } else {
            ev
        };
        let ip = self.place(ev.ip);
        let (mut frames, scan_from) = self.unwind(ev);
        for &word in ev.stack.iter().skip(scan_from) {
            if frames.len() >= CHAIN_FRAMES {
                break;
            }
            let Some(m) = self.maps.find(word) else {
                continue;
            };
            if !m.executable || !m.is_file() {
                continue;
            }
            let offset = word - m.start + m.offset;
            let path = m.name.clone();
            if self.code.follows_call(&mut self.files, &path, offset) {
                frames.push(Place::File {
                    path,
                    file_offset: offset - 1,
                });
            }
        }
        Chain { ip, frames }
    }

    /// Walks the futex call's stack with the objects' call-frame
    /// information, as far as the copied stack words go. Returns the return
    /// addresses' places and the index of the first stack word above the
    /// last frame found (where scanning may continue).
    fn unwind(&mut self, ev: &LockEvent) -> (Vec<Place>, usize) {
        let word = |addr: u64| -> Option<u64> {
            let i = usize::try_from(addr.checked_sub(ev.sp)? / 8).ok()?;
            (addr % 8 == ev.sp % 8).then_some(())?;
            ev.stack.get(i).copied()
        };
        let (mut ip, mut sp, mut bp) = (ev.ip, ev.sp, ev.bp);
        let mut frames = Vec::new();
        for depth in 0..CHAIN_FRAMES {
            // A return address is resolved at its call instruction.
            let at = if depth == 0 { ip } else { ip - 1 };
            let Some(m) = self.maps.find(at) else { break };
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
            let Some(rule) = self.unwinder.rule(&mut self.files, &path, offset) else {
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

    /// The memory map as last read (for naming data addresses).
    pub fn maps(&self) -> &ProcMaps {
        &self.maps
    }

    /// Reads a thread's name. A thread already gone keeps an empty name
    /// (or the one it had), so its later samples do not retry the read:
    /// on_sample only reads names it has no entry for.
    fn learn_name(&mut self, tid: u32) {
        match thread_name(self.pid, tid) {
            Some(name) => {
                self.names.insert(tid, name);
            }
            None => {
                self.names.entry(tid).or_default();
            }
        }
    }

    /// Thread names, re-read for threads still alive (names are often set
    /// after creation, e.g. with `pthread_setname_np`).
    pub fn thread_names(&mut self) -> &HashMap<u32, String> {
        let live: Vec<u32> = self
            .profile
            .threads()
            .iter()
            .filter(|(_, t)| !t.exited)
            .map(|(tid, _)| *tid)
            .collect();
        for tid in live {
            self.learn_name(tid);
        }
        &self.names
    }
}

/// Thread ids of a process, from `/proc/PID/task`.
pub fn list_threads(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut tids: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    tids
}

fn thread_name(pid: u32, tid: u32) -> Option<String> {
    let name = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
    Some(name.trim_end().to_string())
}

/// The command line of a process, space-separated.
pub fn command_line(pid: u32) -> Option<String> {
    let raw = maps::read_proc(pid, "cmdline").ok()?;
    let parts: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    (!parts.is_empty()).then(|| parts.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collects_from_this_process() {
        let me = std::process::id();
        let mut c = Collector::new(me);
        assert!(c.profile.threads().contains_key(&me));
        let ip = collects_from_this_process as *const () as u64;
        c.on_sample(&SampleEvent {
            time_ns: 1,
            ip,
            tid: me,
            cpu: 0,
            stack_id: 3,
            flags: 0,
            ..Default::default()
        });
        c.on_sample(&SampleEvent {
            time_ns: 2,
            ip: 0,
            tid: me,
            cpu: 0,
            stack_id: -14,
            flags: SAMPLE_FLAG_KERNEL,
            ..Default::default()
        });
        assert_eq!(c.profile.samples(), 2);
        assert_eq!(c.profile.kernel_samples(), 1);
        assert_eq!(c.profile.stack_samples(3), 1);
        let places: Vec<_> = c.profile.user_places().cloned().collect();
        assert!(
            matches!(places.as_slice(), [Place::File { .. }]),
            "{places:?}"
        );
        assert!(c.thread_names().contains_key(&me));
        assert!(command_line(me).is_some());
    }

    #[test]
    fn task_events_become_thread_events() {
        let me = std::process::id();
        let mut c = Collector::new(me);
        c.on_task(&TaskEvent {
            time_ns: 1,
            kind: TASK_NEW_THREAD,
            tid: 999_999,
            tgid: me,
            parent_tid: me,
            comm: [0; 16],
        });
        assert_eq!(c.profile.threads()[&999_999].created_by, Some(me));
        c.on_task(&TaskEvent {
            time_ns: 2,
            kind: TASK_EXIT,
            tid: 999_999,
            tgid: me,
            parent_tid: 0,
            comm: [0; 16],
        });
        assert!(c.profile.threads()[&999_999].exited);
        c.on_task(&TaskEvent {
            time_ns: 3,
            kind: 77,
            tid: 1,
            tgid: me,
            parent_tid: 0,
            comm: [0; 16],
        });
        assert!(!c.profile.threads().contains_key(&1));
    }

    #[test]
    fn samples_before_a_launch_exec_are_dropped() {
        let me = std::process::id();
        let mut c = Collector::new(me);
        c.start_at_exec();
        let ip = samples_before_a_launch_exec_are_dropped as *const () as u64;
        let at = |time_ns| SampleEvent {
            time_ns,
            ip,
            tid: me,
            cpu: 0,
            stack_id: -1,
            flags: 0,
            ..Default::default()
        };
        c.on_sample(&at(5)); // the gate, before exec
        c.on_sample(&at(20)); // the command, drained before the exec event
        assert_eq!(c.profile.samples(), 0, "held until the exec is seen");
        c.on_task(&TaskEvent {
            time_ns: 10,
            kind: TASK_EXEC,
            tid: me,
            tgid: me,
            parent_tid: 0,
            comm: [0; 16],
        });
        assert_eq!(
            c.profile.samples(),
            1,
            "only the sample after the exec counts"
        );
        c.on_sample(&at(30));
        assert_eq!(c.profile.samples(), 2);
        assert_eq!(c.profile.execs(), 1);
        // A gate sample drained after the exec event is still dropped.
        c.on_sample(&at(7));
        assert_eq!(c.profile.samples(), 2);
    }

    #[test]
    fn sampled_instructions_are_decoded_once_and_again_after_exec() {
        let me = std::process::id();
        let mut c = Collector::new(me);
        let ip = sampled_instructions_are_decoded_once_and_again_after_exec as *const () as u64;
        let sample = |time_ns| SampleEvent {
            time_ns,
            ip,
            tid: me,
            flags: SAMPLE_FLAG_NO_RECIPE,
            ..Default::default()
        };
        c.on_sample(&sample(10));
        c.on_sample(&sample(20));
        assert_eq!(c.take_new_recipes().len(), 1, "decoded once");
        assert_eq!(c.decoded_counts().0, 1);
        assert!(!c.take_recipes_reset());
        // This very process exec'ing itself: same image, new instructions.
        c.on_task(&TaskEvent {
            time_ns: 100,
            kind: TASK_EXEC,
            tid: me,
            tgid: me,
            ..Default::default()
        });
        assert!(c.take_recipes_reset(), "the kernel's recipes are stale");
        assert_eq!(c.decoded_counts().0, 0);
        c.on_sample(&sample(50));
        assert!(
            c.take_new_recipes().is_empty(),
            "a late sample of the old image is not decoded against the new one"
        );
        c.on_sample(&sample(150));
        assert_eq!(c.take_new_recipes().len(), 1, "decoded again");
    }

    #[test]
    fn late_samples_of_the_old_image_use_the_old_map() {
        let me = std::process::id();
        let mut c = Collector::new(me);
        // Pretend the current image was exec'd at t=100, and before it a
        // different program was mapped where our code is now.
        let ip = late_samples_of_the_old_image_use_the_old_map as *const () as u64;
        let old = ProcMaps::parse(&format!(
            "{:x}-{:x} r-xp 00000000 00:00 0 /old/program\n",
            ip & !0xfff,
            (ip & !0xfff) + 0x1000
        ));
        c.before_exec = Some((100, old));
        c.on_sample(&SampleEvent {
            time_ns: 50,
            ip,
            tid: me,
            cpu: 0,
            stack_id: -1,
            flags: 0,
            ..Default::default()
        });
        c.on_sample(&SampleEvent {
            time_ns: 150,
            ip,
            tid: me,
            cpu: 0,
            stack_id: -1,
            flags: 0,
            ..Default::default()
        });
        let paths: Vec<String> = c
            .profile
            .user_places()
            .filter_map(|p| match p {
                Place::File { path, .. } => Some(path.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(paths.len(), 2, "{paths:?}");
        assert!(
            paths.contains(&"/old/program".to_string()),
            "sample before the exec: old image"
        );
        assert!(
            paths.iter().any(|p| p != "/old/program"),
            "sample after the exec: current image"
        );
    }

    #[test]
    fn a_thread_gone_before_its_samples_is_looked_up_once() {
        let me = std::process::id();
        let mut c = Collector::new(me);
        let gone = u32::MAX - 7;
        let ip = a_thread_gone_before_its_samples_is_looked_up_once as *const () as u64;
        c.on_sample(&SampleEvent {
            time_ns: 1,
            ip,
            tid: gone,
            cpu: 0,
            stack_id: -1,
            flags: 0,
            ..Default::default()
        });
        assert_eq!(
            c.names.get(&gone).map(String::as_str),
            Some(""),
            "remembered as unknown"
        );
        // Its exit event brings the real name from the kernel.
        let mut comm = [0u8; 16];
        comm[..4].copy_from_slice(b"late");
        c.on_task(&TaskEvent {
            time_ns: 2,
            kind: TASK_EXIT,
            tid: gone,
            tgid: me,
            parent_tid: 0,
            comm,
        });
        assert_eq!(c.names.get(&gone).map(String::as_str), Some("late"));
    }

    #[test]
    fn a_gone_process_keeps_an_empty_but_usable_state() {
        let mut c = Collector::new(u32::MAX - 1);
        assert!(c.profile.threads().is_empty());
        assert!(matches!(c.place(0x1000), Place::Unmapped { .. }));
        assert_eq!(command_line(u32::MAX - 1), None);
    }
}

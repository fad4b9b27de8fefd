//! The report's lock section: kinds, names and call sites of the futex
//! words and kernel locks threads waited for, joined with what the lock
//! uprobes saw of the same locks (acquisitions, hold times, critical
//! sections).

use std::collections::HashMap;

use super::sites::{
    add_wait_site, blame_sections, holder_sites, kind_of, owner_entries, user_site, waiter_sites,
    SiteKey, WaitTotals,
};
use super::traced::{other_locks_entry, Scale, Traced};
use crate::{
    features::locks::analysis::{
        is_lock_implementation, kernel_lock_kind, Chain, Durations, FutexStats, HoldStats,
        LockProfile, WakeSite,
    },
    heap::{BlockLookup, Heap, Unseen},
    process::{
        chunks::{self, Memory},
        holders,
        maps::{is_libc, ProcMaps},
    },
    report::{
        model::{LockAddress, LockEntry, LockKind},
        names::{global_name, Names},
    },
};

/// Locks listed that the uprobes saw taken but nobody waited for (the
/// most held first): many programs have thousands.
const UNCONTENDED: usize = 20;

/// The name of the futex words aggregated by call site only.
pub const OTHER_LOCKS: &str = "other locks (aggregated by call site)";

/// One lock being put together from its futex words and uprobe records.
struct Merged {
    address: u64,
    name: Option<String>,
    kind: LockKind,
    waits: Durations,
    threads: usize,
    owners: HashMap<u32, u64>,
    waiters: HashMap<SiteKey, WaitTotals>,
    holders: HashMap<SiteKey, WakeSite>,
    traced: Option<Traced>,
}

/// The lock entries of a report: contended locks first, most wait time
/// first, then other waits, then (with the uprobes) locks taken without
/// contention, most hold time first. `blocks` is the heap with its blocks
/// by address.
pub fn report(
    profile: &LockProfile,
    maps: &ProcMaps,
    blocks: Option<Blocks<'_>>,
    memory: Option<&dyn Memory>,
    unseen: &mut Unseen,
    scale: Option<&Scale>,
    names: &mut dyn Names,
) -> Vec<LockEntry> {
    let mut naming = Naming {
        maps,
        blocks: blocks.as_ref(),
        memory: TargetMemory {
            mem: memory,
            scan_left: holders::SCAN_MAX,
            unseen,
        },
        names,
    };
    let mut table = Table::default();
    add_futexes(&mut table, profile, &mut naming);
    let unlisted = match scale {
        Some(scale) => add_holds(&mut table, profile, scale, &mut naming),
        None => Vec::new(),
    };
    let mut entries: Vec<LockEntry> = table.merged.into_iter().map(Merged::entry).collect();
    if let Some(scale) = scale {
        entries.extend(other_locks_entry(profile, &unlisted, scale, naming.names));
    }
    entries.extend(kernel_entries(profile, naming.names));
    rank(&mut entries);
    entries
}

/// Lock contention first, then other waits (condvars, joins...), each by
/// wait time; locks nobody waited for last, by hold time.
fn rank(entries: &mut [LockEntry]) {
    entries.sort_by(|a, b| {
        (b.kind.is_contention())
            .cmp(&a.kind.is_contention())
            .then((b.contentions > 0).cmp(&(a.contentions > 0)))
            .then(b.wait_total_ns.cmp(&a.wait_total_ns))
            .then(b.hold_total_ns.cmp(&a.hold_total_ns))
    });
}

/// The heap blocks by address, with the heap that knows their sites.
pub type Blocks<'a> = (&'a dyn Heap, Box<dyn BlockLookup + 'a>);

/// What names a lock and its code: the memory map (globals), the heap
/// blocks, and the symbols.
struct Naming<'a> {
    maps: &'a ProcMaps,
    blocks: Option<&'a Blocks<'a>>,
    /// What glibc's metadata says, read or remembered.
    memory: TargetMemory<'a>,
    names: &'a mut dyn Names,
}

/// The target's memory while it runs, how much of its globals may still
/// be read, and the blocks allocated before tracing found in it before
/// (also after it exited).
pub(crate) struct TargetMemory<'a> {
    pub mem: Option<&'a dyn Memory>,
    pub scan_left: u64,
    pub unseen: &'a mut Unseen,
}

/// Adds the futex words threads waited on, merged into their locks.
fn add_futexes(table: &mut Table, profile: &LockProfile, naming: &mut Naming<'_>) {
    for (uaddr, f) in profile.futexes() {
        if f.contentions() == 0 {
            continue; // wakes with no wait seen: nothing waited here
        }
        let top = f
            .waiters
            .iter()
            .max_by_key(|(_, (count, _))| *count)
            .map(|(chain, _)| chain);
        let traced_lock = profile.lock_of_futex(uaddr);
        let address = traced_lock.unwrap_or(uaddr);
        let kind = match top.map_or(LockKind::Futex, |c| kind_of(c, naming.names)) {
            // The uprobes know an rwlock's inner words for sure.
            LockKind::Futex | LockKind::Mutex if traced_lock.is_some_and(|a| a != uaddr) => {
                LockKind::Rwlock
            }
            // The uprobes saw mutex calls take this word: a mutex, even
            // when its top waiter site went unnamed (no sample of it).
            LockKind::Futex if profile.is_traced_mutex(uaddr) => LockKind::Mutex,
            kind => kind,
        };
        // Only a glibc mutex keeps its owner 8 bytes after the futex word.
        let glibc = top.is_some_and(|c| is_libc(&naming.names.code(&c.ip).module));
        let name = if uaddr == 0 {
            // The kernel's per-site aggregate of the locks that did not
            // fit its table.
            Some(OTHER_LOCKS.to_string())
        } else {
            naming.name_of(address, top)
        };
        // An arena's lock is a plain glibc lock: what follows it is the
        // arena's state, not an owner.
        let owners = kind == LockKind::Mutex && glibc && !name.as_deref().is_some_and(is_arena);
        let m = table.slot(address, name, kind);
        m.add_futex(f, owners, naming.names);
    }
}

/// Adds what the lock uprobes saw: to the contended locks, and to the
/// [`UNCONTENDED`] most held others. Returns the locks not listed (for
/// the "other locks" entry).
fn add_holds<'p>(
    table: &mut Table,
    profile: &'p LockProfile,
    scale: &Scale,
    naming: &mut Naming<'_>,
) -> Vec<&'p HoldStats> {
    let mut uncontended = 0;
    let mut unlisted = Vec::new();
    for (lock, h) in profile.holds() {
        let contended = table.by_address.contains_key(&lock);
        if !contended {
            if uncontended >= UNCONTENDED {
                unlisted.push(h);
                continue;
            }
            uncontended += 1;
        }
        let kind = if h.is_rwlock() {
            LockKind::Rwlock
        } else {
            LockKind::Mutex
        };
        let name = naming.name_of(lock, None);
        let m = table.slot(lock, name, kind);
        m.threads = m.threads.max(h.thread_count());
        let t = m.traced.get_or_insert_with(Traced::new);
        t.add(profile, h, scale, naming.names);
    }
    unlisted
}

/// One entry per kind of kernel lock, with the user code that led there.
fn kernel_entries(profile: &LockProfile, names: &mut dyn Names) -> Vec<LockEntry> {
    let mut entries = Vec::new();
    for (flags, k) in profile.kernel() {
        let mut sites: HashMap<SiteKey, WaitTotals> = HashMap::new();
        for (chain, (count, ns)) in &k.sites {
            add_wait_site(&mut sites, chain, *count, *ns, names);
        }
        let waiters = waiter_sites(sites);
        entries.push(LockEntry {
            address: LockAddress::Kernel,
            name: Some(kernel_lock_kind(flags).into()),
            kind: LockKind::Kernel,
            contentions: k.waits.count(),
            wait_total_ns: k.waits.total_ns,
            wait_mean_ns: k.waits.mean_ns(),
            wait_p99_ns: k.waits.p99_ns(),
            wait_max_ns: k.waits.max_ns,
            wait_histogram: k.waits.log2_buckets(),
            waiters,
            ..LockEntry::default()
        });
    }
    entries
}

/// Locks being merged: one per address, and futex words or locks that
/// share a name (e.g. the same heap allocation site) are one lock.
#[derive(Default)]
struct Table {
    merged: Vec<Merged>,
    by_name: HashMap<(String, LockKind), usize>,
    by_address: HashMap<u64, usize>,
}

impl Table {
    fn slot(&mut self, address: u64, name: Option<String>, kind: LockKind) -> &mut Merged {
        if let Some(&i) = self.by_address.get(&address) {
            return &mut self.merged[i];
        }
        let existing = name
            .as_ref()
            .and_then(|n| self.by_name.get(&(n.clone(), kind)).copied());
        let i = match existing {
            Some(i) => i,
            None => {
                if let Some(n) = &name {
                    self.by_name.insert((n.clone(), kind), self.merged.len());
                }
                self.merged.push(Merged::new(address, name, kind));
                self.merged.len() - 1
            }
        };
        self.by_address.insert(address, i);
        &mut self.merged[i]
    }
}

impl Merged {
    fn new(address: u64, name: Option<String>, kind: LockKind) -> Self {
        Self {
            address,
            name,
            kind,
            waits: Durations::default(),
            threads: 0,
            owners: HashMap::new(),
            waiters: HashMap::new(),
            holders: HashMap::new(),
            traced: None,
        }
    }

    /// Adds the waits and wakes of one of its futex words, and with
    /// `owners` the owner threads read from the lock (glibc mutexes only).
    fn add_futex(&mut self, f: &FutexStats, owners: bool, names: &mut dyn Names) {
        self.waits.add(&f.waits);
        self.threads = self.threads.max(f.threads);
        if owners {
            for (tid, n) in &f.owners {
                *self.owners.entry(*tid).or_default() += n;
            }
        }
        for (chain, (count, ns)) in &f.waiters {
            add_wait_site(&mut self.waiters, chain, *count, *ns, names);
        }
        for (chain, wakes) in &f.wakers {
            let site = self.holders.entry(user_site(chain, names)).or_default();
            site.calls += wakes.calls;
            site.woken += wakes.woken;
            site.caused_ns += wakes.caused_ns;
            site.caused_waits += wakes.caused_waits;
        }
    }

    fn entry(self) -> LockEntry {
        let owners = owner_entries(self.owners);
        let mut entry = LockEntry {
            address: LockAddress::At(self.address),
            name: self.name,
            kind: self.kind,
            contentions: self.waits.count(),
            wait_total_ns: self.waits.total_ns,
            wait_mean_ns: self.waits.mean_ns(),
            wait_p99_ns: self.waits.p99_ns(),
            wait_max_ns: self.waits.max_ns,
            wait_histogram: self.waits.log2_buckets(),
            threads: self.threads,
            owner_seen: !owners.is_empty(),
            owners,
            waiters: waiter_sites(self.waiters),
            holders: holder_sites(&self.holders),
            ..LockEntry::default()
        };
        if let Some(t) = self.traced {
            t.fill(&mut entry);
        }
        // A condvar's or barrier's waiters wait for an event, not for a
        // critical section: nothing to blame.
        if self.kind.is_contention() {
            blame_sections(&mut entry, &self.holders);
        }
        entry
    }
}

impl Naming<'_> {
    /// A global's symbol, a heap block's allocation site, or nothing;
    /// memory that is not a global's is typed from the lock call of
    /// `waiter` (`struct table.lock (heap block from x.c:40)`).
    fn name_of(&mut self, uaddr: u64, waiter: Option<&Chain>) -> Option<String> {
        let blocks = self.blocks.map(|(h, i)| (*h, &**i));
        let data = data_name(self.maps, blocks, Some(&mut self.memory), self.names, uaddr);
        if data
            .as_ref()
            .is_some_and(|d| matches!(d.kind, DataKind::Symbol | DataKind::ArenaLock))
        {
            return data.map(|d| d.name);
        }
        let typed = waiter.and_then(|c| lock_argument(c, self.names));
        match (data, typed) {
            (Some(d), Some(t)) => Some(format!("{t} ({})", d.name)),
            (d, t) => t.or(d.map(|d| d.name)),
        }
    }
}

/// `type.field` of the lock a waiter's call passed, from the debug info
/// of the pointer it was made from, at the first frame of the chain
/// outside the lock implementation (the call of `pthread_mutex_lock`).
fn lock_argument(chain: &Chain, names: &mut dyn Names) -> Option<String> {
    let call = chain.frames.iter().find(|p| {
        let f = names.code(p);
        !is_lock_implementation(&f.module, &f.function)
    })?;
    let t = names.argument_type(call)?;
    Some(format!("{}.{}", t.layout.type_name.as_ref()?, t.field()?))
}

/// Share of the waits for locks (not for events: condvars, barriers)
/// from which waits for glibc's arena locks get a note: a few waits at a
/// thread's start are no finding.
const ARENA_NOTE_SHARE: f64 = 0.1;

/// What to do when threads waited for glibc malloc arenas' locks for a
/// good part ([`ARENA_NOTE_SHARE`]) of their lock waits. A condvar's
/// waits are left out: `pbzip2`'s idle consumers waited seconds on theirs
/// while its main arena's lock took 71 ms of its 90 ms of lock waits.
pub fn arena_note(locks: &[LockEntry]) -> Option<String> {
    let arena: u64 = locks
        .iter()
        .filter(|l| l.name.as_deref().is_some_and(is_arena))
        .map(|l| l.wait_total_ns)
        .sum();
    let all: u64 = locks
        .iter()
        .filter(|l| l.kind.is_contention())
        .map(|l| l.wait_total_ns)
        .sum();
    let waited = arena > 0 && arena as f64 >= ARENA_NOTE_SHARE * all as f64;
    waited.then(|| {
        "threads waited for a glibc malloc arena's lock: blocks are freed by threads \
         other than the ones that allocated them (free locks the block's arena), or more \
         threads share an arena than MALLOC_ARENA_MAX allows"
            .to_string()
    })
}

/// Whether a lock's name is a glibc malloc arena's (`main_arena` where
/// libc's symbols name the main one).
fn is_arena(name: &str) -> bool {
    name.starts_with(ARENA_LOCK) || name == MAIN_ARENA_LOCK || name == "main_arena"
}

/// What holds an address: its name, the offset in it, and what kind of
/// thing it is.
pub(crate) struct DataName {
    pub name: String,
    pub offset: u64,
    pub kind: DataKind,
}

/// Where a [`DataName`] came from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum DataKind {
    /// A global's or static's symbol.
    Symbol,
    /// A heap block, named by its allocation site.
    HeapBlock,
    /// A place in an object file's data that no symbol covers (a
    /// stripped program's global: `stress-ng+0x83e140`).
    FileAddress,
    /// The lock of one of glibc malloc's arenas.
    ArenaLock,
}

/// What glibc's metadata in the target's memory says of a heap address
/// no traced block holds: an arena's lock, or a block glibc handed out
/// before tracing (its usable size from its chunk header; the
/// allocation site is not known), with the global that points into it
/// when one does. Blocks are found once ([`Unseen`]): after the target
/// exited, those found while it ran still name their locks.
fn in_glibc_heap(
    maps: &ProcMaps,
    memory: &mut TargetMemory<'_>,
    names: &mut dyn Names,
    addr: u64,
) -> Option<DataName> {
    let region = chunks::Region::of(maps, addr)?;
    // A block found before is no arena's lock (Unseen skips those): its
    // memory is not read again.
    let block = match (memory.unseen.containing(addr), memory.mem) {
        (Some(block), _) => block,
        (None, Some(mem)) => {
            let arena = chunks::arena_of_lock(mem, region.start, addr).filter(|_| !region.brk_heap);
            if let Some(heap) = arena {
                return Some(DataName {
                    name: format!("{ARENA_LOCK} {heap:#x}"),
                    offset: 0,
                    kind: DataKind::ArenaLock,
                });
            }
            memory.unseen.find(maps, mem, addr, &mut memory.scan_left)?
        }
        (None, None) => return None,
    };
    let holder = memory
        .unseen
        .holder(block.start)
        .and_then(|word| global_name(maps, names, word));
    let name = format!("{}-byte {UNSEEN_BLOCK}", block.size);
    Some(DataName {
        name: holders::pointed_to_by(name, holder),
        offset: addr - block.start,
        kind: DataKind::HeapBlock,
    })
}

/// How a heap block glibc handed out before tracing is named (after its
/// usable size).
const UNSEEN_BLOCK: &str = "heap block allocated before tracing";

/// How the lock of a glibc malloc arena is named (with its heap's start).
pub const ARENA_LOCK: &str = "glibc malloc arena at";
/// How the lock of glibc malloc's main arena is named (it is in libc's
/// data, without a symbol in a stripped libc; `main_arena` with one).
pub const MAIN_ARENA_LOCK: &str = "glibc malloc main arena";

/// The data at `addr`: a global's symbol; "heap block from file:line"
/// (the allocation call's own line, also inside an inlined helper) when
/// `blocks` knows its block; or, in an object file's data without a
/// symbol for it (a stripped program or libc), glibc's main arena when its
/// state says so, else the file and the address in it (as false sharing
/// names such a line), which `nm` or `gdb` place once its debug symbols
/// are at hand.
pub(crate) fn data_name(
    maps: &ProcMaps,
    blocks: Option<(&dyn Heap, &dyn BlockLookup)>,
    mut memory: Option<&mut TargetMemory<'_>>,
    names: &mut dyn Names,
    addr: u64,
) -> Option<DataName> {
    let owner = maps.data_owner(addr);
    if let Some((path, base)) = &owner {
        if let Some(sym) = names.data(path, *base, addr) {
            return Some(DataName {
                name: sym.name,
                offset: sym.offset,
                kind: DataKind::Symbol,
            });
        }
    }
    let block = blocks.and_then(|(heap, index)| Some((heap, index.containing(addr)?)));
    if let Some((heap, block)) = block {
        let site = heap.site_name(block.site, names);
        return Some(DataName {
            name: format!("heap block from {}", site.label()),
            offset: addr - block.start,
            kind: DataKind::HeapBlock,
        });
    }
    if let Some(named) = memory
        .as_mut()
        .and_then(|mem| in_glibc_heap(maps, mem, names, addr))
    {
        return Some(named);
    }
    let (path, base) = owner?;
    let mem = memory.and_then(|m| m.mem);
    if mem.is_some_and(|mem| chunks::is_main_arena(mem, maps, addr)) {
        return Some(DataName {
            name: MAIN_ARENA_LOCK.into(),
            offset: 0,
            kind: DataKind::ArenaLock,
        });
    }
    Some(DataName {
        name: names.file_address(&path, base, addr)?,
        offset: 0,
        kind: DataKind::FileAddress,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use memprof_common::locks::{hold_flag, lock_op};

    use super::*;
    use crate::{
        features::locks::analysis::{classify, is_contention, Chain, Section},
        heap::fixture::FakeHeap,
        process::{fake_memory::FakeMemory, maps::Place},
        report::{
            fixtures::{code_at, program_maps, TableNames},
            model::{OwnerEntry, SectionEntry},
        },
    };

    /// `g_lock`, a global of the sample program.
    const G_LOCK: u64 = 0x5555_5555_8040;
    /// A word of a heap block (see [`heap`]).
    const HEAP_WORD: u64 = 0x5555_5555_a110;
    /// A word of anonymous memory.
    const ANON: u64 = 0x7f00_0000_0100;

    /// The place of code at `offset` in libc.
    fn libc(offset: u64) -> Place {
        Place::File {
            path: Arc::from("/usr/lib/x86_64-linux-gnu/libc.so.6"),
            file_offset: offset,
        }
    }

    /// libc's lock functions, and the program's code: `worker` waits at
    /// lines 10 and 20, `release` unlocks at line 12, `consumer` waits on
    /// a condvar at line 40, `spin_wait` calls futex itself at line 50,
    /// `fault_in` faults at line 60; heap blocks come from line 30.
    fn names() -> TableNames {
        TableNames::new()
            .code(libc(0x100), "futex_wait", "libc.so.6", None)
            .code(libc(0x200), "__lll_lock_wait", "libc.so.6", None)
            .code(libc(0x300), "pthread_mutex_unlock", "libc.so.6", None)
            .code(libc(0x400), "pthread_cond_wait", "libc.so.6", None)
            .function(0x10, "worker", 10)
            .function(0x12, "release", 12)
            .function(0x20, "worker", 20)
            .function(0x30, "make_queue", 30)
            .function(0x40, "consumer", 40)
            .function(0x50, "spin_wait", 50)
            .function(0x60, "fault_in", 60)
            .global(G_LOCK, 40, "g_lock")
    }

    /// The futex call of libc's lock function `through`, called from the
    /// program at `caller`.
    fn chain(through: u64, caller: u64) -> Chain {
        Chain {
            ip: libc(0x100),
            frames: vec![libc(through), code_at(caller)],
        }
    }

    /// One futex wait: (word, thread, owner read, ns, chain).
    type Wait = (u64, u32, u32, u64, Chain);

    fn wait(uaddr: u64, tid: u32, owner: u32, duration_ns: u64, chain: Chain) -> Wait {
        (uaddr, tid, owner, duration_ns, chain)
    }

    /// Adds waits as the kernel aggregates them, with the threads and
    /// owners seen per word.
    fn add_waits(p: &mut LockProfile, waits: Vec<Wait>) {
        let mut seen: HashMap<
            u64,
            (
                crate::features::FastSet<u32>,
                crate::features::FastMap<u32, u64>,
            ),
        > = HashMap::new();
        for (uaddr, tid, owner, ns, chain) in waits {
            let mut d = Durations::default();
            d.record(ns);
            p.add_waits(uaddr, chain, &d);
            let (threads, owners) = seen.entry(uaddr).or_default();
            threads.insert(tid);
            if owner != 0 && owner != tid {
                *owners.entry(owner).or_default() += 1;
            }
        }
        for (uaddr, (threads, owners)) in seen {
            p.set_waiters_seen(uaddr, threads.len(), &owners);
        }
    }

    fn wake(p: &mut LockProfile, uaddr: u64, woken: u64, caused_ns: u64, chain: Chain) {
        let w = WakeSite {
            calls: 1,
            woken,
            caused_ns,
            caused_waits: u64::from(caused_ns > 0),
        };
        p.add_wakes(uaddr, chain, w);
    }

    /// `heap` with its index, as [`report`] takes it.
    fn blocks_of(heap: &FakeHeap) -> Option<Blocks<'_>> {
        Some((heap, heap.index()))
    }

    /// A heap holding two 64-byte blocks from `make_queue`, 0x100 and
    /// 0x200 bytes into the program's heap ([`HEAP_WORD`] is in the first).
    fn heap() -> FakeHeap {
        FakeHeap::default()
            .block(0x5555_5555_a100, 64, 0x30)
            .block(0x5555_5555_a200, 64, 0x30)
            .site(0x30, code_at(0x30))
    }

    /// A critical section of `lock` taken by `op` at site 1 (the program's
    /// line 10) and released at site 2 (line 12).
    fn section(lock: u64, op: u32, hold_ns: u64) -> Section {
        Section {
            lock,
            tid: 2,
            op,
            flags: 0,
            acquire_ns: 100,
            hold_ns,
            lock_site: 1,
            unlock_site: 2,
        }
    }

    fn sites_of(profile: &mut LockProfile) {
        profile.set_site_place(1, code_at(0x10));
        profile.set_site_place(2, code_at(0x12));
    }

    /// The report of `p` without the uprobes or a heap, with `memory`.
    fn report_untraced(
        p: &LockProfile,
        memory: Option<&dyn Memory>,
        names: &mut dyn Names,
    ) -> Vec<LockEntry> {
        report(
            p,
            &program_maps(),
            None,
            memory,
            &mut Unseen::default(),
            None,
            names,
        )
    }

    /// The report of `p` with every lock call traced.
    fn report_traced(p: &LockProfile) -> Vec<LockEntry> {
        report(
            p,
            &program_maps(),
            None,
            None,
            &mut Unseen::default(),
            Some(&Scale::exact()),
            &mut names(),
        )
    }

    #[test]
    fn waits_are_merged_per_lock_named_and_ranked() {
        let mut p = LockProfile::new();
        let mut waits = Vec::new();
        // g_lock, a glibc mutex held by thread 1.
        for _ in 0..3 {
            waits.push(wait(G_LOCK, 2, 1, 1000, chain(0x200, 0x10)));
        }
        waits.push(wait(G_LOCK, 3, 1, 5000, chain(0x200, 0x20)));
        wake(&mut p, G_LOCK, 1, 0, chain(0x300, 0x12));
        // A condvar in a heap block: a long wait, but not contention.
        waits.push(wait(HEAP_WORD, 4, 0, 1_000_000, chain(0x400, 0x40)));
        // A futex the program waits on itself; the owner word means nothing.
        let own = Chain {
            ip: code_at(0x50),
            frames: vec![code_at(0x50)],
        };
        waits.push(wait(ANON, 5, 9, 2000, own.clone()));
        waits.push(wait(ANON, 6, 9, 2000, own.clone()));
        // Wakes nobody waited for.
        wake(&mut p, ANON + 64, 0, 0, own);
        let mut k = Durations::default();
        k.record(500);
        let fault = Chain {
            ip: code_at(0x60),
            frames: vec![code_at(0x60)],
        };
        p.add_kernel_waits(2, fault, &k);
        let heap = heap();
        add_waits(&mut p, waits);
        let entries = report(
            &p,
            &program_maps(),
            blocks_of(&heap),
            None,
            &mut Unseen::default(),
            None,
            &mut names(),
        );
        use LockAddress::{At, Kernel};
        let summary: Vec<_> = entries
            .iter()
            .map(|e| (e.address, e.name.as_deref(), e.kind, e.contentions))
            .collect();
        assert_eq!(
            summary,
            [
                (At(0x5555_5555_8040), Some("g_lock"), LockKind::Mutex, 4),
                (At(0x7f00_0000_0100), None, LockKind::Futex, 2),
                (Kernel, Some("kernel rwsem (read)"), LockKind::Kernel, 1),
                (
                    At(0x5555_5555_a110),
                    Some("heap block from prog.c:30"),
                    LockKind::Condvar,
                    1
                ),
            ]
        );
        let g = &entries[0];
        assert_eq!((g.wait_total_ns, g.wait_max_ns, g.threads), (8000, 5000, 2));
        assert!(g.owner_seen);
        assert_eq!(g.owners, [OwnerEntry { tid: 1, count: 4 }]);
        let waiters: Vec<_> = g
            .waiters
            .iter()
            .map(|w| (w.function.as_str(), w.line, w.count, w.wait_ns))
            .collect();
        assert_eq!(
            waiters,
            [("worker", Some(20), 1, 5000), ("worker", Some(10), 3, 3000)]
        );
        let holders: Vec<_> = g
            .holders
            .iter()
            .map(|h| (h.function.as_str(), h.line, h.count, h.woken))
            .collect();
        assert_eq!(holders, [("release", Some(12), 1, 1)]);
        assert_eq!(g.acquisitions, None, "no uprobes");
        assert!(!entries[1].owner_seen, "only a glibc mutex has an owner");
        let kernel = &entries[2].waiters[0];
        assert_eq!(
            (kernel.function.as_str(), kernel.wait_ns),
            ("fault_in", 500)
        );
    }

    /// A lock in a stripped program's data (no symbol covers it: Debian's
    /// `stress-ng`, whose mutex was shown as a bare address) is named by
    /// the file and its address there, as false sharing names a line; a
    /// heap word no block covers stays unnamed.
    #[test]
    fn a_lock_without_a_symbol_is_named_by_its_file_and_address() {
        let mut p = LockProfile::new();
        let stripped = G_LOCK + 0x100;
        add_waits(
            &mut p,
            vec![
                wait(stripped, 2, 1, 3000, chain(0x200, 0x10)),
                wait(HEAP_WORD, 3, 1, 1000, chain(0x200, 0x20)),
            ],
        );
        let entries = report_untraced(&p, None, &mut names());
        let named: Vec<_> = entries
            .iter()
            .map(|e| (e.address, e.name.as_deref()))
            .collect();
        assert_eq!(
            named,
            [
                (LockAddress::At(stripped), Some("prog+0x4140")),
                (LockAddress::At(HEAP_WORD), None),
            ]
        );
        // Past the file's last segment: no file's address to give.
        let mut past_end = names().file_ends_at(0x4140);
        let entries = report_untraced(&p, None, &mut past_end);
        assert!(entries.iter().all(|e| e.name.is_none()), "{entries:?}");
    }

    /// A lock where a glibc arena's is (its heap's first word points at
    /// it) is named as that arena's, with a note on what makes threads
    /// wait for it; the same address without glibc's pointer is not, and
    /// nor is it without the target's memory (the target has exited).
    #[test]
    fn a_glibc_arenas_lock_is_named_with_what_to_do() {
        let heap = 0x7f00_0000_0000;
        let lock = heap + 0x30;
        let mut p = LockProfile::new();
        add_waits(&mut p, vec![wait(lock, 2, 1, 3000, chain(0x200, 0x10))]);
        let info = |ar_ptr: u64| {
            FakeMemory::words(&[
                (heap, ar_ptr),
                (heap + 8, 0),
                (heap + 16, 0x21000),
                (heap + 24, 0x21000),
            ])
        };
        let (arena, other) = (info(lock), info(heap + 0x900));
        let name = |memory: Option<&dyn Memory>| {
            let entries = report_untraced(&p, memory, &mut names());
            (entries[0].name.clone(), arena_note(&entries).is_some())
        };
        assert_eq!(
            name(Some(&arena)),
            (Some("glibc malloc arena at 0x7f0000000000".into()), true)
        );
        assert_eq!(name(Some(&other)), (None, false));
        assert_eq!(name(None), (None, false));
        // A few waits beside a lock waited for 13 times longer: named,
        // no note.
        add_waits(&mut p, vec![wait(G_LOCK, 3, 1, 40_000, chain(0x200, 0x20))]);
        let entries = report_untraced(&p, Some(&arena), &mut names());
        let arena_entry = entries.iter().find(|e| e.address == LockAddress::At(lock));
        assert!(arena_entry.is_some_and(|e| e.name.is_some()), "{entries:?}");
        assert_eq!(arena_note(&entries), None);
    }

    /// glibc's main arena is in libc's data, where a stripped libc has no
    /// symbol for it: its lock is named as the main arena's when the
    /// memory there is an arena's state (here in the program's data, as
    /// in a static program), with the arenas' note; other words there
    /// keep their file address.
    #[test]
    fn the_main_arenas_lock_is_named_from_its_state() {
        let main = G_LOCK + 0x100;
        let top = 0x5555_5555_a290;
        let mut p = LockProfile::new();
        add_waits(&mut p, vec![wait(main, 2, 1, 3000, chain(0x200, 0x10))]);
        let state = |top_size: u64| {
            FakeMemory::words(&[
                (main + 0x60, top),
                (top + 8, top_size),
                (main + 0x70, main + 0x60),
                (main + 0x78, main + 0x60),
                (main + 0x870, main),
                (main + 0x888, 0x5555_5557_b000 - 0x5555_5555_a000),
            ])
        };
        let name = |memory: &dyn Memory| {
            let entries = report_untraced(&p, Some(memory), &mut names());
            (entries[0].name.clone(), arena_note(&entries).is_some())
        };
        let arena = state((0x5555_5557_b000 - top) | 1);
        assert_eq!(name(&arena), (Some(MAIN_ARENA_LOCK.into()), true));
        // The word after its lock is the arena's state, not an owner.
        let entries = report_untraced(&p, Some(&arena), &mut names());
        assert!(entries[0].owners.is_empty(), "{:?}", entries[0].owners);
        let short = state(0x1000 | 1);
        assert_eq!(name(&short), (Some("prog+0x4140".into()), false));
        let entries = report_untraced(&p, Some(&short), &mut names());
        assert_eq!(
            entries[0].owners,
            [OwnerEntry { tid: 1, count: 1 }],
            "a mutex's"
        );
    }

    /// The arenas' note weighs their waits against the other locks', not
    /// against waits for events.
    #[test]
    fn the_arena_note_leaves_condvars_out() {
        let entry = |name: &str, kind: LockKind, wait_total_ns: u64| LockEntry {
            name: Some(name.into()),
            kind,
            wait_total_ns,
            ..LockEntry::default()
        };
        let mut locks = vec![
            entry(MAIN_ARENA_LOCK, LockKind::Mutex, 71_000_000),
            entry("queue.notEmpty", LockKind::Condvar, 2_000_000_000),
            entry("kernel spinlock", LockKind::Kernel, 19_000_000),
        ];
        assert!(arena_note(&locks).is_some());
        locks.push(entry("g_lock", LockKind::Mutex, 1_000_000_000));
        assert_eq!(
            arena_note(&locks),
            None,
            "a lock waited for 10 times longer"
        );
    }

    /// A lock in a block glibc handed out before tracing (Debian's
    /// `pbzip2` makes its mutexes with `new` at start-up) is named by the
    /// block's usable size from its chunk header, not a bare address, and
    /// by the global that points into it; found once, the block still
    /// names the lock after the target exited (no memory to read).
    #[test]
    fn a_lock_in_a_block_made_before_tracing_is_named_by_its_chunk() {
        // [heap] of program_maps(): chunks of 0x290 and 0x40 bytes, then
        // the top chunk to the end.
        let start = 0x5555_5555_a000;
        let sizes = [0x290, 0x40, 0x2_1000 - 0x2d0];
        let mut memory = FakeMemory::default().region(0x5555_5555_8000, 0x2000);
        let mut c = start;
        for size in sizes {
            memory = memory.word(c + 8, size | 1);
            c += size;
        }
        let lock = start + 0x290 + 0x10;
        let mut p = LockProfile::new();
        add_waits(&mut p, vec![wait(lock, 2, 1, 3000, chain(0x200, 0x10))]);
        let name = |memory: Option<&dyn Memory>, unseen: &mut Unseen| {
            let mut names = names().global(0x5555_5555_8100, 8, "g_table");
            let entries = report(&p, &program_maps(), None, memory, unseen, None, &mut names);
            entries[0].name.clone()
        };
        let unkept = name(Some(&memory), &mut Unseen::default());
        assert_eq!(
            unkept.as_deref(),
            Some("56-byte heap block allocated before tracing")
        );
        let kept = memory.word(0x5555_5555_8100, lock + 8);
        let mut unseen = Unseen::default();
        let want = "56-byte heap block allocated before tracing, pointed to by g_table";
        assert_eq!(name(Some(&kept), &mut unseen).as_deref(), Some(want));
        assert_eq!(name(None, &mut unseen).as_deref(), Some(want), "exited");
        let never = name(None, &mut Unseen::default());
        assert_eq!(never, None, "without the target's memory");
    }

    #[test]
    fn a_traced_mutex_stays_a_mutex_when_its_waiters_went_unnamed() {
        // The waits' site was never sampled (the sample budget ran out):
        // its chain names no code, so only the uprobes know the kind.
        let unnamed = Chain {
            ip: Place::Unmapped { address: 0 },
            frames: Vec::new(),
        };
        for traced in [false, true] {
            let mut p = LockProfile::new();
            if traced {
                p.add_section(section(G_LOCK, lock_op::MUTEX_LOCK, 100));
            }
            add_waits(&mut p, vec![wait(G_LOCK, 3, 2, 5000, unnamed.clone())]);
            let entries = report_untraced(&p, None, &mut names());
            let g = entries
                .iter()
                .find(|e| e.address == LockAddress::At(G_LOCK));
            let kind = g.expect("the lock").kind;
            let want = if traced {
                LockKind::Mutex
            } else {
                LockKind::Futex
            };
            assert_eq!(kind, want, "traced by the uprobes: {traced}");
        }
    }

    #[test]
    fn the_delay_a_release_caused_goes_to_the_sections_ending_there() {
        let mut p = LockProfile::new();
        sites_of(&mut p);
        // A second section (line 20 → line 12), half as frequent.
        p.set_site_place(3, code_at(0x20));
        add_waits(&mut p, vec![wait(G_LOCK, 3, 2, 5000, chain(0x200, 0x10))]);
        for lock_site in [1, 1, 3] {
            p.add_section(Section {
                lock_site,
                ..section(G_LOCK, lock_op::MUTEX_LOCK, 100)
            });
        }
        // Releases at line 12 ended 3,000 ns of waits; the program's line 40
        // (no traced section ends there) ended 600 ns.
        wake(&mut p, G_LOCK, 1, 3000, chain(0x300, 0x12));
        wake(&mut p, G_LOCK, 1, 600, chain(0x300, 0x40));
        let entries = report_traced(&p);
        let sections: Vec<_> = entries[0]
            .sections
            .iter()
            .map(|s| (s.line, s.released_at.as_deref(), s.count, s.delay_caused_ns))
            .collect();
        assert_eq!(
            sections,
            [
                (Some(10), Some("prog.c:12"), 2, 2000),
                (Some(20), Some("prog.c:12"), 1, 1000),
                (Some(40), Some("prog.c:40"), 0, 600),
            ]
        );
        let holders: Vec<_> = entries[0]
            .holders
            .iter()
            .map(|h| (h.line, h.delay_caused_ns))
            .collect();
        assert_eq!(holders, [(Some(12), 3000), (Some(40), 600)]);
    }

    #[test]
    fn futex_words_with_one_name_are_one_lock() {
        let mut p = LockProfile::new();
        let waits = vec![
            wait(HEAP_WORD, 2, 0, 1000, chain(0x200, 0x10)),
            wait(HEAP_WORD + 0x100, 3, 0, 3000, chain(0x200, 0x10)),
        ];
        let heap = heap();
        add_waits(&mut p, waits);
        let entries = report(
            &p,
            &program_maps(),
            blocks_of(&heap),
            None,
            &mut Unseen::default(),
            None,
            &mut names(),
        );
        assert_eq!(entries.len(), 1, "{entries:?}");
        let lock = &entries[0];
        assert_eq!(lock.name.as_deref(), Some("heap block from prog.c:30"));
        // The busiest word names it.
        assert_eq!(lock.address, LockAddress::At(0x55555555a210));
        assert_eq!(
            (lock.contentions, lock.wait_total_ns, lock.threads),
            (2, 4000, 1)
        );
    }

    /// A heap mutex whose waiters' lock call passed `&tb->lock` is named
    /// by type and field, with its block's site; a global keeps its
    /// symbol even then.
    #[test]
    fn a_heap_lock_is_named_by_the_type_of_its_lock_call_s_argument() {
        use crate::object::symbolize::{
            dwarf::{Layout, Member},
            typed::AccessType,
        };
        let table = AccessType {
            layout: Layout {
                element: None,
                type_name: Some("struct table".into()),
                struct_size: Some(96),
                members: vec![
                    Member {
                        name: "entries".into(),
                        offset: 0,
                    },
                    Member {
                        name: "lock".into(),
                        offset: 48,
                    },
                ],
            },
            disp: 48,
            indexed: false,
            variable: "tb".into(),
        };
        let mut p = LockProfile::new();
        let waits = vec![
            wait(HEAP_WORD, 2, 0, 1000, chain(0x200, 0x10)),
            wait(G_LOCK, 3, 0, 3000, chain(0x200, 0x10)),
        ];
        let heap = heap();
        add_waits(&mut p, waits);
        let mut names = names().access_type(0x10, table);
        let entries = report(
            &p,
            &program_maps(),
            blocks_of(&heap),
            None,
            &mut Unseen::default(),
            None,
            &mut names,
        );
        let named: Vec<_> = entries.iter().map(|e| e.name.as_deref()).collect();
        assert_eq!(
            named,
            [
                Some("g_lock"),
                Some("struct table.lock (heap block from prog.c:30)")
            ]
        );
    }

    #[test]
    fn uprobes_add_acquisitions_holds_and_sections() {
        let mut p = LockProfile::new();
        let mut waits = Vec::new();
        sites_of(&mut p);
        waits.push(wait(G_LOCK, 3, 2, 5000, chain(0x200, 0x10)));
        p.add_section(section(G_LOCK, lock_op::MUTEX_LOCK, 2000));
        p.add_section(section(G_LOCK, lock_op::MUTEX_LOCK, 1000));
        p.add_section(Section {
            flags: hold_flag::FAILED,
            ..section(G_LOCK, lock_op::MUTEX_TRYLOCK, 0)
        });
        // An rwlock whose writers wait on its word 8 bytes in.
        let rwlock = ANON + 0x100;
        p.add_section(section(rwlock, lock_op::RW_WRLOCK, 500));
        waits.push(wait(rwlock + 8, 4, 0, 700, chain(0x200, 0x20)));
        add_waits(&mut p, waits);
        let entries = report_traced(&p);
        assert_eq!(entries.len(), 2, "{entries:?}");
        let g = &entries[0];
        assert_eq!(g.name.as_deref(), Some("g_lock"));
        assert_eq!(g.acquisitions, Some(2));
        assert_eq!(g.contention_rate, Some(0.5));
        assert_eq!(g.failed_attempts, Some(1));
        assert_eq!((g.hold_total_ns, g.hold_max_ns), (Some(3000), Some(2000)));
        assert_eq!(g.acquire_max_ns, Some(100));
        assert_eq!(
            g.sections,
            [SectionEntry {
                function: "worker".into(),
                file: Some("/src/prog.c".into()),
                line: Some(10),
                module: "prog".into(),
                released_at: Some("prog.c:12".into()),
                count: 2,
                hold_ns: 3000,
                hold_max_ns: 2000,
                delay_caused_ns: 0,
            }]
        );
        let rw = &entries[1];
        assert_eq!(
            (rw.address, rw.kind),
            (LockAddress::At(0x7f00_0000_0200), LockKind::Rwlock)
        );
        assert_eq!((rw.contentions, rw.acquisitions), (1, Some(1)));
    }

    #[test]
    fn uncontended_locks_come_last_most_held_first_and_capped() {
        let mut p = LockProfile::new();
        let mut waits = Vec::new();
        sites_of(&mut p);
        waits.push(wait(G_LOCK, 3, 2, 5000, chain(0x200, 0x10)));
        let held = UNCONTENDED as u64 + 1;
        for i in 0..held {
            p.add_section(section(
                ANON + 0x40 * i,
                lock_op::MUTEX_LOCK,
                1000 * (i + 1),
            ));
        }
        add_waits(&mut p, waits);
        let entries = report_traced(&p);
        assert_eq!(entries.len(), 2 + UNCONTENDED);
        assert_eq!(entries[0].name.as_deref(), Some("g_lock"));
        let listed = &entries[1..=UNCONTENDED];
        let holds: Vec<u64> = listed
            .iter()
            .map(|e| e.hold_total_ns.unwrap_or_default())
            .collect();
        let expected: Vec<u64> = (2..=held).rev().map(|i| 1000 * i).collect();
        assert_eq!(holds, expected, "the least held is not listed alone");
        // It counts in the "other locks" entry, with its sections.
        let other = entries.last().unwrap();
        assert_eq!(other.address, LockAddress::Other);
        assert_eq!(
            other.name.as_deref(),
            Some("other locks (1 taken, aggregated by lock call site)")
        );
        assert_eq!(
            (other.acquisitions, other.hold_total_ns),
            (Some(1), Some(1000))
        );
        assert_eq!(other.sections[0].line, Some(10));
        assert!(entries[1..].iter().all(|e| e.contention_rate == Some(0.0)));
    }

    /// Every kind the analysis names is one of the report's, with the same
    /// idea of what is lock contention.
    #[test]
    fn report_kinds_are_the_analysis_kinds() {
        let names = [
            "pthread_cond_wait",
            "pthread_rwlock_rdlock",
            "pthread_barrier_wait",
            "pthread_join",
            "sem_wait",
            "pthread_mutex_lock",
            "syscall",
        ];
        for name in names {
            let kind = classify(&[name]);
            assert_eq!(LockKind::from_name(kind).map(LockKind::name), Some(kind));
        }
        for kind in LockKind::ALL {
            assert_eq!(kind.is_contention(), is_contention(kind.name()), "{kind}");
        }
    }
}

//! The report's lock section: kinds, names and call sites of the futex
//! words and kernel locks threads waited for, joined with what the lock
//! uprobes saw of the same locks (acquisitions, hold times, critical
//! sections).

use std::collections::HashMap;

use hdrhistogram::Histogram;

use crate::{
    features::{
        alloc::analysis::{AllocProfile, BlockIndex},
        locks::analysis::{
            classify, is_lock_implementation, kernel_lock_kind, Chain, Durations, FutexStats,
            HoldStats, LockProfile,
        },
    },
    object::symbolize::Frame,
    process::maps::ProcMaps,
    report::{
        model::{
            source_label, HolderSite, LockEntry, LockKind, LockTracing, OwnerEntry, SectionEntry,
            TraceMode, WaiterSite, FULLY_TRACED,
        },
        names::Names,
    },
};
use memprof_common::locks::lock_op;

use crate::kernel::{
    loader::Counters,
    windows::{Mode, Windowed},
};

/// Sites kept per lock.
const SITES: usize = 5;
/// Owner threads kept per lock.
const OWNERS: usize = 5;
/// Locks listed that the uprobes saw taken but nobody waited for (the
/// most held first): many programs have thousands.
const UNCONTENDED: usize = 20;

/// A code site: (function, file, line, module).
type SiteKey = (String, Option<String>, Option<u32>, String);

/// What the lock uprobes add to a lock.
struct Traced {
    acquisitions: u64,
    failed: u64,
    acquire: Durations,
    hold: Durations,
    /// (lock call site, release label) → (count, hold ns, longest hold).
    sections: HashMap<(SiteKey, Option<String>), (u64, u64, u64)>,
}

/// One lock being put together from its futex words and uprobe records.
struct Merged {
    address: u64,
    name: Option<String>,
    kind: LockKind,
    waits: Durations,
    threads: usize,
    owners: HashMap<u32, u64>,
    waiters: HashMap<SiteKey, (u64, u64)>,
    holders: HashMap<SiteKey, (u64, u64)>,
    traced: Option<Traced>,
}

/// How the lock uprobes ran, for the report.
pub fn tracing(tracer: Option<&Windowed>, counters: &Counters) -> Option<LockTracing> {
    let tracer = tracer?;
    let name = |op: &u32| lock_op::symbol(*op).to_string();
    let mut functions: Vec<String> = tracer.ops().iter().map(name).collect();
    functions.sort();
    functions.dedup();
    let mut always: Vec<String> = tracer.resident_ops().iter().map(name).collect();
    always.sort();
    always.dedup();
    Some(LockTracing {
        mode: match tracer.settings.mode {
            Mode::Sampled => TraceMode::Sampled,
            Mode::Full | Mode::Floor => TraceMode::Full,
        },
        library: tracer.path.to_string(),
        traced_fraction: tracer.traced_fraction(),
        windows: tracer.windows,
        functions,
        always_traced: always,
        sections_lost: counters.hold_events_lost,
        unmatched_unlocks: counters.unmatched_unlocks,
        held_overflow: counters.held_overflow,
    })
}

/// The lock entries of a report: contended locks first, most wait time
/// first, then other waits, then (with the uprobes) locks taken without
/// contention, most hold time first.
pub fn report(
    profile: &LockProfile,
    maps: &ProcMaps,
    alloc: Option<&AllocProfile>,
    tracer: Option<&Windowed>,
    names: &mut dyn Names,
) -> Vec<LockEntry> {
    let blocks = alloc.map(|a| (a, a.block_index()));
    let mut naming = Naming {
        maps,
        blocks: blocks.as_ref(),
        names,
    };
    let mut table = Table::default();
    add_futexes(&mut table, profile, &mut naming);
    if let Some(tracer) = tracer {
        add_holds(&mut table, profile, tracer, &mut naming);
    }
    let mut entries: Vec<LockEntry> = table.merged.into_iter().map(Merged::entry).collect();
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

/// The heap blocks by address, with the profile that knows their sites.
type Blocks<'a> = (&'a AllocProfile, BlockIndex<'a>);

/// What names a lock and its code: the memory map (globals), the heap
/// blocks, and the symbols.
struct Naming<'a> {
    maps: &'a ProcMaps,
    blocks: Option<&'a Blocks<'a>>,
    names: &'a mut dyn Names,
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
            kind => kind,
        };
        // Only a glibc mutex keeps its owner 8 bytes after the futex word.
        let glibc = top.is_some_and(|c| {
            let module = naming.names.code(&c.ip).module;
            module.starts_with("libc.so") || module.starts_with("libc-")
        });
        let name = naming.name_of(address);
        let m = table.slot(address, name, kind);
        m.add_futex(f, kind == LockKind::Mutex && glibc, naming.names);
    }
}

/// Adds what the lock uprobes saw: to the contended locks, and to the
/// [`UNCONTENDED`] most held others.
fn add_holds(table: &mut Table, profile: &LockProfile, tracer: &Windowed, naming: &mut Naming<'_>) {
    let mut uncontended = 0;
    for (lock, h) in profile.holds() {
        let contended = table.by_address.contains_key(&lock);
        if !contended {
            if uncontended >= UNCONTENDED {
                continue;
            }
            uncontended += 1;
        }
        let kind = if h.is_rwlock() {
            LockKind::Rwlock
        } else {
            LockKind::Mutex
        };
        let name = naming.name_of(lock);
        let m = table.slot(lock, name, kind);
        m.threads = m.threads.max(h.threads.len());
        let t = m.traced.get_or_insert_with(Traced::new);
        t.add(profile, h, tracer, naming.names);
    }
}

/// One entry per kind of kernel lock, with the user code that led there.
fn kernel_entries(profile: &LockProfile, names: &mut dyn Names) -> Vec<LockEntry> {
    let mut entries = Vec::new();
    for (flags, k) in profile.kernel() {
        let mut waiters: Vec<WaiterSite> = k
            .sites
            .iter()
            .map(|(place, (count, ns))| {
                let f = names.code(place);
                WaiterSite {
                    function: f.function,
                    file: f.file,
                    line: f.line,
                    module: f.module,
                    count: *count,
                    wait_ns: *ns,
                }
            })
            .collect();
        waiters.sort_by_key(|w| std::cmp::Reverse(w.wait_ns));
        waiters.truncate(SITES);
        entries.push(LockEntry {
            address: "kernel".into(),
            name: Some(kernel_lock_kind(flags).into()),
            kind: LockKind::Kernel,
            contentions: k.waits.count(),
            wait_total_ns: k.waits.total_ns,
            wait_mean_ns: k.waits.mean_ns(),
            wait_p99_ns: k.waits.p99_ns(),
            wait_max_ns: k.waits.max_ns,
            wait_histogram: log2_buckets(&k.waits.histogram),
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

/// Log2 buckets of a histogram: (upper bound in ns, count).
pub fn log2_buckets(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    let mut buckets: Vec<(u64, u64)> = Vec::new();
    for v in h.iter_recorded() {
        let bound = v.value_iterated_to().max(1).next_power_of_two();
        match buckets.last_mut() {
            Some((b, n)) if *b == bound => *n += v.count_since_last_iteration(),
            _ => buckets.push((bound, v.count_since_last_iteration())),
        }
    }
    buckets
}

impl Traced {
    fn new() -> Self {
        Self {
            acquisitions: 0,
            failed: 0,
            acquire: Durations::default(),
            hold: Durations::default(),
            sections: HashMap::new(),
        }
    }

    /// Adds one lock's uprobe statistics; counts are scaled by the time
    /// each operation was traced.
    fn add(
        &mut self,
        profile: &LockProfile,
        h: &HoldStats,
        tracer: &Windowed,
        names: &mut dyn Names,
    ) {
        let scale = |n: u64, op: u32| {
            let f = tracer.op_fraction(op);
            if f > 0.0 && f < FULLY_TRACED {
                (n as f64 / f).round() as u64
            } else {
                n
            }
        };
        self.acquisitions += h
            .acquired_by_op
            .iter()
            .enumerate()
            .map(|(op, n)| scale(*n, op as u32))
            .sum::<u64>();
        self.failed += scale(h.failed, lock_op::MUTEX_TRYLOCK);
        self.acquire.add(&h.acquire);
        self.hold.add(&h.hold);
        for (&(lock_site, unlock_site), s) in &h.sections {
            let frame =
                |site: u64, names: &mut dyn Names| profile.site_place(site).map(|p| names.code(p));
            let Some(taken) = frame(lock_site, names) else {
                continue; // not mapped when seen
            };
            let released = frame(unlock_site, names)
                .map(|f| source_label(f.file.as_deref(), f.line, &f.module));
            let e = self.sections.entry((key(taken), released)).or_default();
            e.0 += s.count;
            e.1 += s.hold_ns;
            e.2 = e.2.max(s.hold_max_ns);
        }
    }

    /// Fills in what the uprobes add to a lock's entry, whose
    /// contentions are set.
    fn fill(self, entry: &mut LockEntry) {
        let mut sections: Vec<SectionEntry> = self
            .sections
            .into_iter()
            .map(
                |(((function, file, line, module), released_at), (count, hold_ns, max))| {
                    SectionEntry {
                        function,
                        file,
                        line,
                        module,
                        released_at,
                        count,
                        hold_ns,
                        hold_max_ns: max,
                    }
                },
            )
            .collect();
        sections.sort_by(|a, b| b.hold_ns.cmp(&a.hold_ns).then(b.count.cmp(&a.count)));
        sections.truncate(SITES);
        entry.acquisitions = Some(self.acquisitions);
        entry.contention_rate =
            (self.acquisitions > 0).then(|| entry.contentions as f64 / self.acquisitions as f64);
        entry.failed_attempts = Some(self.failed);
        if !self.acquire.is_empty() {
            entry.acquire_p99_ns = Some(self.acquire.p99_ns());
            entry.acquire_max_ns = Some(self.acquire.max_ns);
        }
        if !self.hold.is_empty() {
            entry.hold_p99_ns = Some(self.hold.p99_ns());
            entry.hold_mean_ns = Some(self.hold.mean_ns());
            entry.hold_max_ns = Some(self.hold.max_ns);
            entry.hold_total_ns = Some(self.hold.total_ns);
            entry.hold_histogram = log2_buckets(&self.hold.histogram);
        }
        entry.sections = sections;
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
        self.threads = self.threads.max(f.threads.len());
        if owners {
            for (tid, n) in &f.owners {
                *self.owners.entry(*tid).or_default() += n;
            }
        }
        for (chain, (count, ns)) in &f.waiters {
            let site = self.waiters.entry(user_site(chain, names)).or_default();
            site.0 += count;
            site.1 += ns;
        }
        for (chain, (count, woken)) in &f.wakers {
            let site = self.holders.entry(user_site(chain, names)).or_default();
            site.0 += count;
            site.1 += woken;
        }
    }

    fn entry(self) -> LockEntry {
        let owners = owner_entries(self.owners);
        let mut entry = LockEntry {
            address: format!("{:#x}", self.address),
            name: self.name,
            kind: self.kind,
            contentions: self.waits.count(),
            wait_total_ns: self.waits.total_ns,
            wait_mean_ns: self.waits.mean_ns(),
            wait_p99_ns: self.waits.p99_ns(),
            wait_max_ns: self.waits.max_ns,
            wait_histogram: log2_buckets(&self.waits.histogram),
            threads: self.threads,
            owner_seen: !owners.is_empty(),
            owners,
            waiters: waiter_sites(self.waiters),
            holders: holder_sites(self.holders),
            ..LockEntry::default()
        };
        if let Some(t) = self.traced {
            t.fill(&mut entry);
        }
        entry
    }
}

/// The owner threads, most often seen first.
fn owner_entries(owners: HashMap<u32, u64>) -> Vec<OwnerEntry> {
    let mut owners: Vec<OwnerEntry> = owners
        .into_iter()
        .map(|(tid, count)| OwnerEntry { tid, count })
        .collect();
    owners.sort_by(|a, b| b.count.cmp(&a.count).then(a.tid.cmp(&b.tid)));
    owners.truncate(OWNERS);
    owners
}

/// The waiting sites, most wait time first.
fn waiter_sites(waiters: HashMap<SiteKey, (u64, u64)>) -> Vec<WaiterSite> {
    let mut waiters: Vec<WaiterSite> = waiters
        .into_iter()
        .map(
            |((function, file, line, module), (count, wait_ns))| WaiterSite {
                function,
                file,
                line,
                module,
                count,
                wait_ns,
            },
        )
        .collect();
    waiters.sort_by(|a, b| b.wait_ns.cmp(&a.wait_ns).then(b.count.cmp(&a.count)));
    waiters.truncate(SITES);
    waiters
}

/// The releasing sites, most wakes first.
fn holder_sites(holders: HashMap<SiteKey, (u64, u64)>) -> Vec<HolderSite> {
    let mut holders: Vec<HolderSite> = holders
        .into_iter()
        .map(
            |((function, file, line, module), (count, woken))| HolderSite {
                function,
                file,
                line,
                module,
                count,
                woken,
            },
        )
        .collect();
    holders.sort_by_key(|h| std::cmp::Reverse(h.count));
    holders.truncate(SITES);
    holders
}

/// The kind of lock, from the functions around the futex call.
fn kind_of(chain: &Chain, names: &mut dyn Names) -> LockKind {
    let mut functions = vec![names.code(&chain.ip).function];
    for place in &chain.frames {
        let f = names.code(place);
        let implementation = is_lock_implementation(&f.module, &f.function);
        functions.push(f.function);
        if !implementation {
            break;
        }
    }
    let refs: Vec<&str> = functions.iter().map(String::as_str).collect();
    LockKind::from_name(classify(&refs)).unwrap_or_default()
}

/// The first frame of the chain outside the lock implementation: the
/// code that took (or released) the lock.
fn user_site(chain: &Chain, names: &mut dyn Names) -> SiteKey {
    let mut last = None;
    for place in &chain.frames {
        let f = names.code(place);
        if !is_lock_implementation(&f.module, &f.function) {
            return key(f);
        }
        last = Some(f);
    }
    // No frame outside the implementation was found on the stack top:
    // name the outermost one seen, or the syscall's place.
    key(last.unwrap_or_else(|| names.code(&chain.ip)))
}

fn key(f: Frame) -> SiteKey {
    (f.function, f.file, f.line, f.module)
}

impl Naming<'_> {
    /// A global's symbol, a heap block's allocation site, or nothing.
    fn name_of(&mut self, uaddr: u64) -> Option<String> {
        if let Some((path, base)) = self.maps.data_owner(uaddr) {
            if let Some(sym) = self.names.data(&path, base, uaddr) {
                return Some(sym.name);
            }
        }
        let (alloc, index) = self.blocks?;
        let (_, block) = index.containing(uaddr)?;
        let site = self.names.code(&alloc.site_place(block.site));
        Some(format!(
            "heap block from {}",
            source_label(site.file.as_deref(), site.line, &site.module)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::locks::analysis::is_contention;

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

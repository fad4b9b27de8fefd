//! The report's lock section: kinds, names and call sites of the futex
//! words and kernel locks threads waited for.

use std::collections::HashMap;

use hdrhistogram::Histogram;

use crate::{
    analysis::{
        alloc::AllocProfile,
        locks::{
            classify, is_contention, is_lock_implementation, kernel_lock_kind, Chain, LockProfile,
        },
    },
    collect::procmaps::ProcMaps,
    report::model::{HolderSite, LockEntry, OwnerEntry, WaiterSite},
    symbolize::{Frame, Symbolizer},
};

/// Sites kept per lock.
const SITES: usize = 5;
/// Owner threads kept per lock.
const OWNERS: usize = 5;

/// A code site: (function, file, line, module).
type SiteKey = (String, Option<String>, Option<u32>, String);

/// One lock being put together from its futex words.
struct Merged {
    address: u64,
    name: Option<String>,
    kind: &'static str,
    waits: Histogram<u64>,
    total_ns: u64,
    max_ns: u64,
    threads: usize,
    owners: HashMap<u32, u64>,
    waiters: HashMap<SiteKey, (u64, u64)>,
    holders: HashMap<SiteKey, (u64, u64)>,
}

/// The lock entries of a report, most wait time first.
pub fn report(
    profile: &LockProfile,
    maps: &ProcMaps,
    alloc: Option<&AllocProfile>,
    symbolizer: &mut Symbolizer,
) -> Vec<LockEntry> {
    let blocks = alloc.map(|a| (a, a.block_index()));
    let mut merged: Vec<Merged> = Vec::new();
    let mut by_name: HashMap<(String, &'static str), usize> = HashMap::new();
    for (uaddr, f) in profile.futexes() {
        if f.contentions() == 0 {
            continue; // wakes with no wait seen: nothing waited here
        }
        let top = f
            .waiters
            .iter()
            .max_by_key(|(_, (count, _))| *count)
            .map(|(chain, _)| chain);
        let kind = top.map_or("futex", |c| kind_of(c, symbolizer));
        // Only a glibc mutex keeps its owner 8 bytes after the futex word.
        let glibc = top.is_some_and(|c| {
            let module = symbolizer.code(&c.ip).module;
            module.starts_with("libc.so") || module.starts_with("libc-")
        });
        let name = name_of(uaddr, maps, blocks.as_ref(), symbolizer);
        let slot = match &name {
            Some(n) => *by_name.entry((n.clone(), kind)).or_insert_with(|| {
                merged.push(Merged::new(uaddr, name.clone(), kind));
                merged.len() - 1
            }),
            None => {
                merged.push(Merged::new(uaddr, None, kind));
                merged.len() - 1
            }
        };
        let m = &mut merged[slot];
        let _ = m.waits.add(&f.waits);
        m.total_ns += f.total_ns;
        m.max_ns = m.max_ns.max(f.max_ns);
        m.threads = m.threads.max(f.threads.len());
        if kind == "mutex" && glibc {
            for (tid, n) in &f.owners {
                *m.owners.entry(*tid).or_default() += n;
            }
        }
        for (chain, (count, ns)) in &f.waiters {
            let site = m.waiters.entry(user_site(chain, symbolizer)).or_default();
            site.0 += count;
            site.1 += ns;
        }
        for (chain, (count, woken)) in &f.wakers {
            let site = m.holders.entry(user_site(chain, symbolizer)).or_default();
            site.0 += count;
            site.1 += woken;
        }
    }
    let mut entries: Vec<LockEntry> = merged.into_iter().map(Merged::entry).collect();
    for (flags, k) in profile.kernel() {
        let mut waiters: Vec<WaiterSite> = k
            .sites
            .iter()
            .map(|(place, (count, ns))| {
                let f = symbolizer.code(place);
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
            kind: "kernel".into(),
            acquisitions: None,
            contentions: k.waits.len(),
            wait_total_ns: k.total_ns,
            wait_mean_ns: k.waits.mean().round() as u64,
            // The histogram rounds to 3 digits: never above the exact max.
            wait_p99_ns: k.waits.value_at_quantile(0.99).min(k.max_ns),
            wait_max_ns: k.max_ns,
            hold_p99_ns: None,
            threads: 0,
            owner_seen: false,
            owners: Vec::new(),
            waiters,
            holders: Vec::new(),
        });
    }
    // Lock contention first, then other waits (condvars, joins...), each
    // by wait time.
    entries.sort_by(|a, b| {
        is_contention(&b.kind)
            .cmp(&is_contention(&a.kind))
            .then(b.wait_total_ns.cmp(&a.wait_total_ns))
    });
    entries
}

impl Merged {
    fn new(address: u64, name: Option<String>, kind: &'static str) -> Self {
        Self {
            address,
            name,
            kind,
            waits: Histogram::new_with_bounds(1, 1 << 40, 3).expect("static bounds are valid"),
            total_ns: 0,
            max_ns: 0,
            threads: 0,
            owners: HashMap::new(),
            waiters: HashMap::new(),
            holders: HashMap::new(),
        }
    }

    fn entry(self) -> LockEntry {
        let mut owners: Vec<OwnerEntry> = self
            .owners
            .into_iter()
            .map(|(tid, count)| OwnerEntry { tid, count })
            .collect();
        owners.sort_by(|a, b| b.count.cmp(&a.count).then(a.tid.cmp(&b.tid)));
        owners.truncate(OWNERS);
        let mut waiters: Vec<WaiterSite> = self
            .waiters
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
        let mut holders: Vec<HolderSite> = self
            .holders
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
        LockEntry {
            address: format!("{:#x}", self.address),
            name: self.name,
            kind: self.kind.into(),
            acquisitions: None,
            contentions: self.waits.len(),
            wait_total_ns: self.total_ns,
            wait_mean_ns: self.waits.mean().round() as u64,
            wait_p99_ns: self.waits.value_at_quantile(0.99).min(self.max_ns),
            wait_max_ns: self.max_ns,
            hold_p99_ns: None,
            threads: self.threads,
            owner_seen: !owners.is_empty(),
            owners,
            waiters,
            holders,
        }
    }
}

/// The kind of lock, from the functions around the futex call.
fn kind_of(chain: &Chain, symbolizer: &mut Symbolizer) -> &'static str {
    let mut names = vec![symbolizer.code(&chain.ip).function];
    for place in &chain.frames {
        let f = symbolizer.code(place);
        let implementation = is_lock_implementation(&f.module, &f.function);
        names.push(f.function);
        if !implementation {
            break;
        }
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    classify(&refs)
}

/// The first frame of the chain outside the lock implementation: the
/// code that took (or released) the lock.
fn user_site(chain: &Chain, symbolizer: &mut Symbolizer) -> SiteKey {
    let mut last = None;
    for place in &chain.frames {
        let f = symbolizer.code(place);
        if !is_lock_implementation(&f.module, &f.function) {
            return key(f);
        }
        last = Some(f);
    }
    // No frame outside the implementation was found on the stack top:
    // name the outermost one seen, or the syscall's place.
    key(last.unwrap_or_else(|| symbolizer.code(&chain.ip)))
}

fn key(f: Frame) -> SiteKey {
    (f.function, f.file, f.line, f.module)
}

/// A global's symbol, a heap block's allocation site, or nothing.
fn name_of(
    uaddr: u64,
    maps: &ProcMaps,
    blocks: Option<&(&AllocProfile, crate::analysis::alloc::BlockIndex<'_>)>,
    symbolizer: &mut Symbolizer,
) -> Option<String> {
    if let Some((path, base)) = maps.data_owner(uaddr) {
        if let Some(sym) = symbolizer.data(&path, base, uaddr) {
            return Some(sym.name);
        }
    }
    let (alloc, index) = blocks?;
    let (_, block) = index.containing(uaddr)?;
    let site = symbolizer.code(&alloc.site_place(block.site));
    Some(format!(
        "heap block from {}",
        crate::report::model::source_label(site.file.as_deref(), site.line, &site.module)
    ))
}

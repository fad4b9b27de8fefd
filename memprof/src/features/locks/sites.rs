//! The code sites of the lock report: where threads waited (with the
//! call chain from there), which releases woke them and the delay they
//! caused, charged to the critical sections that end there.

use std::collections::HashMap;

use crate::{
    features::locks::analysis::{classify, is_lock_implementation, Chain, WakeSite},
    object::symbolize::Frame,
    report::{
        model::{
            source_label, HolderSite, LockEntry, LockKind, OwnerEntry, SectionEntry, WaiterSite,
        },
        names::Names,
    },
};

/// Owner threads kept per lock.
pub const OWNERS: usize = 5;

/// Sites kept per lock.
pub const SITES: usize = 5;

/// A code site: (function, file, line, module).
pub type SiteKey = (String, Option<String>, Option<u32>, String);

/// Waits at one site: count, ns, and a call chain from there outwards.
pub type WaitTotals = (u64, u64, Vec<String>);

/// The owner threads, most often seen first.
pub fn owner_entries(owners: HashMap<u32, u64>) -> Vec<OwnerEntry> {
    let mut owners: Vec<OwnerEntry> = owners
        .into_iter()
        .map(|(tid, count)| OwnerEntry { tid, count })
        .collect();
    owners.sort_by(|a, b| b.count.cmp(&a.count).then(a.tid.cmp(&b.tid)));
    owners.truncate(OWNERS);
    owners
}

/// Adds waits at `chain` to the site of the code that waited.
pub fn add_wait_site(
    sites: &mut HashMap<SiteKey, WaitTotals>,
    chain: &Chain,
    count: u64,
    ns: u64,
    names: &mut dyn Names,
) {
    let (key, labels) = user_chain(chain, names);
    let site = sites.entry(key).or_insert_with(|| (0, 0, labels));
    site.0 += count;
    site.1 += ns;
}

/// The waiting sites, most wait time first.
pub fn waiter_sites(waiters: HashMap<SiteKey, WaitTotals>) -> Vec<WaiterSite> {
    let mut waiters: Vec<WaiterSite> = waiters
        .into_iter()
        .map(
            |((function, file, line, module), (count, wait_ns, chain))| WaiterSite {
                function,
                file,
                line,
                module,
                count,
                wait_ns,
                chain,
            },
        )
        .collect();
    waiters.sort_by(|a, b| b.wait_ns.cmp(&a.wait_ns).then(b.count.cmp(&a.count)));
    waiters.truncate(SITES);
    waiters
}

/// The releasing sites, most delay caused first, then most wakes.
pub fn holder_sites(holders: &HashMap<SiteKey, WakeSite>) -> Vec<HolderSite> {
    let mut holders: Vec<HolderSite> = holders
        .iter()
        .map(|((function, file, line, module), w)| HolderSite {
            function: function.clone(),
            file: file.clone(),
            line: *line,
            module: module.clone(),
            count: w.calls,
            woken: w.woken,
            delay_caused_ns: w.caused_ns,
        })
        .collect();
    holders.sort_by(|a, b| {
        b.delay_caused_ns
            .cmp(&a.delay_caused_ns)
            .then(b.count.cmp(&a.count))
    });
    holders.truncate(SITES);
    holders
}

/// Charges the delay each release site caused (the waits its wakes
/// ended) to the critical sections that end there, shared by their
/// counts; a release site no traced section ends at becomes a section of
/// its own (known from its wakes only). Sections then rank by the delay
/// they caused.
pub fn blame_sections(entry: &mut LockEntry, holders: &HashMap<SiteKey, WakeSite>) {
    for ((function, file, line, module), w) in holders {
        if w.caused_ns == 0 {
            continue;
        }
        let label = source_label(file.as_deref(), *line, module);
        let ending: u64 = entry
            .sections
            .iter()
            .filter(|s| s.released_at.as_deref() == Some(label.as_str()))
            .map(|s| s.count)
            .sum();
        if ending == 0 {
            entry.sections.push(SectionEntry {
                function: function.clone(),
                file: file.clone(),
                line: *line,
                module: module.clone(),
                released_at: Some(label),
                count: 0,
                hold_ns: 0,
                hold_max_ns: 0,
                delay_caused_ns: w.caused_ns,
            });
            continue;
        }
        for s in &mut entry.sections {
            if s.released_at.as_deref() == Some(label.as_str()) {
                s.delay_caused_ns +=
                    (w.caused_ns as u128 * s.count as u128 / ending as u128) as u64;
            }
        }
    }
    entry.sections.sort_by(|a, b| {
        b.delay_caused_ns
            .cmp(&a.delay_caused_ns)
            .then(b.hold_ns.cmp(&a.hold_ns))
            .then(b.count.cmp(&a.count))
    });
    entry.sections.truncate(SITES);
}

/// The kind of lock, from the functions around the futex call.
pub fn kind_of(chain: &Chain, names: &mut dyn Names) -> LockKind {
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
pub fn user_site(chain: &Chain, names: &mut dyn Names) -> SiteKey {
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

/// The site of [`user_site`] and the chain from it outwards, as
/// "function (file:line)" labels (the syscall's place when every frame
/// is in the lock implementation).
pub fn user_chain(chain: &Chain, names: &mut dyn Names) -> (SiteKey, Vec<String>) {
    let label = |f: &Frame| {
        format!(
            "{} ({})",
            f.function,
            source_label(f.file.as_deref(), f.line, &f.module)
        )
    };
    let mut labels = Vec::new();
    let mut outside = false;
    for place in &chain.frames {
        let f = names.code(place);
        outside |= !is_lock_implementation(&f.module, &f.function);
        if outside {
            labels.push(label(&f));
        }
    }
    if labels.is_empty() {
        labels.push(label(&names.code(&chain.ip)));
    }
    (user_site(chain, names), labels)
}

pub fn key(f: Frame) -> SiteKey {
    (f.function, f.file, f.line, f.module)
}

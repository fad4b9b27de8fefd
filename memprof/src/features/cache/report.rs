//! The report's cache-use section: sampled addresses grouped into objects
//! (a global by its symbol, heap blocks by allocation site and size),
//! each folded onto its element, and those that use little of the lines
//! they bring in, with what to change.

use std::sync::Arc;

use super::analysis::{analyze, CacheProfile, ElementUse, FieldDef, ObjectAccesses, WINDOW_NS};
use super::section::{CacheUseEntry, FieldUse, WindowUse};
use crate::{
    features::FastMap,
    heap::{site_name::SiteName, Heap, HeapBlock},
    object::symbolize::dwarf::Layout,
    process::maps::{Place, ProcMaps},
    report::{model::ObjectKind, names::Names},
};

/// What the section is made from.
pub struct Inputs<'a> {
    pub profile: &'a CacheProfile,
    pub maps: &'a ProcMaps,
    /// The session's heap, naming blocks by their allocation site.
    pub heap: Option<&'a dyn Heap>,
    /// The heap block under a sampled address, when it was live (None:
    /// not looked up yet).
    pub block: &'a dyn Fn(u64) -> Option<Option<HeapBlock>>,
}

/// Where each sampled address was placed, and what is known of each
/// object, kept from report to report: the dashboard makes one a second,
/// and symbolizing every address each time would not keep up.
#[derive(Default)]
pub struct Placements {
    places: FastMap<u64, Option<(Key, u64)>>,
    objects: FastMap<Key, ObjectAccesses>,
}

/// Objects with fewer sampled accesses, or a smaller share of all, are
/// not judged.
const MIN_ACCESSES: u64 = 20;
const MIN_SHARE: f64 = 0.02;
/// Below this share of each line used, an object is a finding.
const POOR_LINE_USE: f64 = 0.5;
/// Objects analysed (the most accessed).
const MAX_OBJECTS: usize = 32;

/// An object accesses are grouped into.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    Global { path: Arc<str>, name: String },
    Heap { site: u64, size: u64 },
}

/// An object's accesses and what is known of it.
#[derive(Default)]
struct Group {
    obj: ObjectAccesses,
    accesses: u64,
}

/// The objects that use little of each line they bring in, most lines
/// wasted first.
pub fn findings(
    inputs: &Inputs<'_>,
    placements: &mut Placements,
    names: &mut dyn Names,
) -> Vec<CacheUseEntry> {
    let (total, _) = inputs.profile.totals();
    let mut groups: FastMap<Key, Group> = FastMap::default();
    let mut placed: FastMap<u64, (Key, u64)> = FastMap::default();
    for (addr, s) in inputs.profile.addresses() {
        let place = match placements.places.get(&addr) {
            Some(known) => known.clone(),
            None => {
                let Some(place) = resolve(inputs, addr, names, &mut placements.objects) else {
                    continue; // its heap block is not looked up yet
                };
                placements.places.insert(addr, place.clone());
                place
            }
        };
        let Some((key, offset)) = place else {
            continue;
        };
        let g = groups.entry(key.clone()).or_insert_with(|| Group {
            obj: ObjectAccesses {
                accesses: Vec::new(),
                pairs: Vec::new(),
                ..placements.objects.get(&key).cloned().unwrap_or_default()
            },
            accesses: 0,
        });
        let n = s.reads + s.writes;
        g.accesses += n;
        g.obj.accesses.push((offset, s.size, n));
        placed.insert(addr, (key, offset));
    }
    for ((a, b), n) in inputs.profile.pairs() {
        if let (Some((ka, oa)), Some((kb, ob))) = (placed.get(&a), placed.get(&b)) {
            if ka == kb {
                if let Some(g) = groups.get_mut(ka) {
                    g.obj.pairs.push((*oa, *ob, n));
                }
            }
        }
    }
    let mut ranked: Vec<(Key, Group)> = groups
        .into_iter()
        .filter(|(_, g)| {
            g.accesses >= MIN_ACCESSES && g.accesses as f64 >= MIN_SHARE * total as f64
        })
        .collect();
    ranked.sort_by_key(|g| std::cmp::Reverse(g.1.accesses));
    ranked.truncate(MAX_OBJECTS);
    let poor: Vec<(Key, Group, ElementUse)> = ranked
        .into_iter()
        .filter_map(|(key, g)| {
            let u = analyze(&g.obj)?;
            (u.line_use < POOR_LINE_USE).then_some((key, g, u))
        })
        .collect();
    let mut per_window = window_accesses(inputs.profile, &placed, &poor);
    let mut out: Vec<(f64, CacheUseEntry)> = poor
        .into_iter()
        .map(|(key, g, u)| {
            let wasted = g.accesses as f64 * (1.0 - u.line_use);
            let mut e = entry(inputs, &key, &g, &u, total, names);
            let seen = per_window.remove(&key).unwrap_or_default();
            e.windows = windows(seen, &g.obj, u.element_size);
            (wasted, e)
        })
        .collect();
    out.sort_by(|a, b| b.0.total_cmp(&a.0));
    out.into_iter().map(|(_, e)| e).collect()
}

/// One window's accesses to an object: (offset, bytes, accesses).
type WindowAccesses = (u64, Vec<(u64, u32, u64)>);

/// The accesses of each window to each of `objects`, in one pass over
/// the windows.
fn window_accesses(
    profile: &CacheProfile,
    placed: &FastMap<u64, (Key, u64)>,
    objects: &[(Key, Group, ElementUse)],
) -> FastMap<Key, Vec<WindowAccesses>> {
    let mut out: FastMap<Key, Vec<WindowAccesses>> = objects
        .iter()
        .map(|(k, _, _)| (k.clone(), Vec::new()))
        .collect();
    for w in profile.windows() {
        for (addr, &(size, n)) in &w.addrs {
            let Some((key, offset)) = placed.get(addr) else {
                continue;
            };
            let Some(list) = out.get_mut(key) else {
                continue;
            };
            if list.last().is_none_or(|(start, _)| *start != w.start_ns) {
                list.push((w.start_ns, Vec::new()));
            }
            if let Some((_, accesses)) = list.last_mut() {
                accesses.push((*offset, size, n));
            }
        }
    }
    out
}

/// An object's line use per window, folded on the element found for
/// the whole session (windows with fewer than [`MIN_ACCESSES`] of its
/// samples are left out).
fn windows(seen: Vec<WindowAccesses>, obj: &ObjectAccesses, element: u64) -> Vec<WindowUse> {
    seen.into_iter()
        .filter_map(|(start_ns, accesses)| {
            let n: u64 = accesses.iter().map(|a| a.2).sum();
            if n < MIN_ACCESSES {
                return None;
            }
            let one = ObjectAccesses {
                accesses,
                size: obj.size,
                element: Some(element),
                fields: Vec::new(),
                pairs: Vec::new(),
            };
            let u = analyze(&one)?;
            Some(WindowUse {
                start_s: start_ns as f64 / WINDOW_NS as f64,
                accesses: n,
                line_use: u.line_use,
            })
        })
        .collect()
}

/// The object holding `addr` and the offset in it (Some(None): none we
/// name), recording what is known of a new object (a global's size and
/// layout, a heap block's size); None while its heap block is not looked
/// up yet.
fn resolve(
    inputs: &Inputs<'_>,
    addr: u64,
    names: &mut dyn Names,
    objects: &mut FastMap<Key, ObjectAccesses>,
) -> Option<Option<(Key, u64)>> {
    if let Some((path, base)) = inputs.maps.data_owner(addr) {
        let Some(sym) = names.data(&path, base, addr) else {
            return Some(None);
        };
        let key = Key::Global {
            path: path.clone(),
            name: sym.name.clone(),
        };
        if !objects.contains_key(&key) {
            let mut obj = ObjectAccesses {
                size: sym.size,
                ..Default::default()
            };
            if let Some(l) = names.data_layout(&path, &sym.name) {
                obj.element = l.element.or(l.struct_size).or(sym.size);
                obj.fields = fields_of(&l);
            }
            objects.insert(key.clone(), obj);
        }
        return Some(Some((key, sym.offset)));
    }
    let Some(block) = (inputs.block)(addr)? else {
        return Some(None);
    };
    let key = Key::Heap {
        site: block.site,
        size: block.size,
    };
    if !objects.contains_key(&key) {
        let mut obj = ObjectAccesses {
            size: Some(block.size),
            ..Default::default()
        };
        if let Some(l) = inputs
            .heap
            .and_then(|h| allocated_type(h, block.site, names))
        {
            // The pointer's struct, when the block holds whole ones.
            if let Some(size) = l.struct_size.filter(|&s| s > 0 && block.size % s == 0) {
                obj.element = Some(size);
                obj.fields = fields_of(&l);
            }
        }
        objects.insert(key.clone(), obj);
    }
    Some(Some((key, addr - block.start)))
}

/// The struct a pointer declared on the allocation's line points to
/// (`struct record *r = malloc(...)`), from the debug info.
fn allocated_type(heap: &dyn Heap, site: u64, names: &mut dyn Names) -> Option<Layout> {
    let place = heap.site_place(site);
    let Place::File { path, .. } = &place else {
        return None;
    };
    // The line past the allocation helpers, where the pointer is.
    let frame = heap.site_name(site, names).chain.frame;
    names.pointee_layout(path, frame.file.as_deref()?, frame.line?)
}

/// A struct's members as fields, each up to the next (the last to the
/// struct's end).
fn fields_of(layout: &Layout) -> Vec<FieldDef> {
    let Some(end) = layout.struct_size else {
        return Vec::new();
    };
    let m = &layout.members;
    m.iter()
        .enumerate()
        .map(|(i, f)| FieldDef {
            name: f.name.clone(),
            offset: f.offset,
            size: m
                .get(i + 1)
                .map_or(end, |n| n.offset)
                .saturating_sub(f.offset),
        })
        .filter(|f| f.size > 0)
        .collect()
}

fn entry(
    inputs: &Inputs<'_>,
    key: &Key,
    g: &Group,
    u: &ElementUse,
    total: u64,
    names: &mut dyn Names,
) -> CacheUseEntry {
    let (object, object_kind, alloc_site) = match key {
        Key::Global { name, .. } => (name.clone(), ObjectKind::Global, None),
        Key::Heap { site, size } => {
            let name = inputs.heap.map(|h| h.site_name(*site, names));
            let label = name
                .as_ref()
                .map_or("an unknown site".to_string(), SiteName::label);
            (
                format!("{size}-byte heap blocks from {label}"),
                ObjectKind::Heap,
                name.as_ref().map(SiteName::code_ref),
            )
        }
    };
    CacheUseEntry {
        object,
        object_kind,
        alloc_site,
        accesses: g.accesses,
        share: g.accesses as f64 / total.max(1) as f64,
        element_size: u.element_size,
        line_use: u.line_use,
        lines_per_element: u.lines,
        packed_lines: u.packed_lines,
        fields: u
            .fields
            .iter()
            .map(|(f, n)| FieldUse {
                name: f.name.clone(),
                offset: f.offset,
                size: f.size,
                accesses: *n,
            })
            .collect(),
        affinity: u.affinity.clone(),
        windows: Vec::new(),
        advice: advice(u),
    }
}

/// What to change: keep the hot fields together, the cold ones apart.
fn advice(u: &ElementUse) -> String {
    let mut hot: Vec<&(FieldDef, u64)> = u.fields.iter().filter(|f| f.1 > 0).collect();
    hot.sort_by_key(|f| std::cmp::Reverse(f.1));
    let hot: Vec<&str> = hot.iter().map(|f| f.0.name.as_str()).collect();
    let cold: Vec<&str> = u
        .fields
        .iter()
        .filter(|f| f.1 == 0)
        .map(|f| f.0.name.as_str())
        .collect();
    let pct = u.line_use * 100.0;
    let mut text = format!(
        "only {pct:.1}% of each cache line brought in is used: {} of every {}-byte element",
        plural_bytes(u.used_bytes),
        u.element_size
    );
    text += &format!(" ({} sampled)", hot.join(", "));
    if u.lines > u.packed_lines {
        text += &format!(
            "; put the hot fields together at the start of the struct: an element's accesses \
             then touch {} line(s) instead of {}",
            u.packed_lines, u.lines
        );
    }
    let per_line = (64 / u.used_bytes.max(1)).max(1);
    text += &format!(
        "; move the cold part{} to a separate array (or struct), so that a line holds the hot \
         part of {per_line} elements instead of {}",
        if cold.is_empty() {
            String::new()
        } else {
            format!(" ({})", cold.join(", "))
        },
        (64 / u.element_size.max(1)).max(1),
    );
    text
}

fn plural_bytes(n: u64) -> String {
    if n == 1 {
        "1 byte".into()
    } else {
        format!("{n} bytes")
    }
}

//! Cache use: how much of each cache line an object's accesses bring in
//! is used (EfficiencySanitizer's cache-fragmentation measure, from
//! sampled data addresses).
//!
//! Pure. The sampled accesses are kept per address ([`CacheProfile`]);
//! at report time the caller groups them into objects (a global, the heap
//! blocks of one allocation site) and [`analyze`] folds each object's
//! accesses onto one element of it (a struct of the array): the bytes of
//! the element that were accessed at all, over the bytes of the lines
//! they lie in, is the share of every line brought in that is used. A
//! record scan that reads one 8-byte key of each 64-byte record uses
//! 8/64 = 12.5%, however few samples each record gets, because every
//! record has the same layout.

use std::collections::VecDeque;

use crate::features::FastMap;

/// Sampled accesses to one address.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddrStats {
    pub reads: u64,
    pub writes: u64,
    /// Widest access seen (bytes).
    pub size: u32,
}

/// Most distinct addresses kept; accesses to new ones beyond are counted.
const MAX_ADDRESSES: usize = 1 << 20;
/// Two consecutive samples of a thread this close are "accessed together".
pub const AFFINITY_WINDOW_NS: u64 = 2_000_000;
/// Most address pairs kept for affinity.
const MAX_PAIRS: usize = 1 << 16;
/// Line use is also measured per window of this length...
pub const WINDOW_NS: u64 = 1_000_000_000;
/// ...for the latest windows that had samples (a minute of a busy
/// target).
pub const WINDOWS_KEPT: usize = 60;
/// Distinct addresses kept per window (a second of samples at the
/// default rate has about 2,000; at the highest, 100,000).
const WINDOW_ADDRESSES: usize = 1 << 13;

/// The sampled accesses of one window: per address, widest size and
/// accesses.
#[derive(Debug, Default)]
pub struct Window {
    /// Start, from the first sampled access of the session.
    pub start_ns: u64,
    pub addrs: FastMap<u64, (u32, u64)>,
}

/// The sampled data accesses of a session, per address, and which
/// addresses one thread accessed close together.
#[derive(Debug, Default)]
pub struct CacheProfile {
    addrs: FastMap<u64, AddrStats>,
    /// (earlier address, later address) → times seen together.
    pairs: FastMap<(u64, u64), u64>,
    /// Each thread's last sampled access: (address, time).
    last: FastMap<u32, (u64, u64)>,
    total: u64,
    dropped: u64,
    /// The latest windows, oldest first, and the session's first access.
    windows: VecDeque<Window>,
    first_ns: Option<u64>,
}

impl CacheProfile {
    /// One sampled access of `size` bytes at `addr` by thread `tid`.
    pub fn on_access(&mut self, tid: u32, addr: u64, size: u32, write: bool, time_ns: u64) {
        self.total += 1;
        let full = self.addrs.len() >= MAX_ADDRESSES;
        let Some(s) = (match self.addrs.get_mut(&addr) {
            Some(s) => Some(s),
            None if !full => Some(self.addrs.entry(addr).or_default()),
            None => None,
        }) else {
            self.dropped += 1;
            return;
        };
        if write {
            s.writes += 1;
        } else {
            s.reads += 1;
        }
        s.size = s.size.max(size.max(1));
        self.add_to_window(addr, size.max(1), time_ns);
        if let Some((prev, at)) = self.last.insert(tid, (addr, time_ns)) {
            let close = time_ns.saturating_sub(at) <= AFFINITY_WINDOW_NS;
            if close && prev != addr && (self.pairs.len() < MAX_PAIRS) {
                *self.pairs.entry((prev, addr)).or_default() += 1;
            }
        }
    }

    fn add_to_window(&mut self, addr: u64, size: u32, time_ns: u64) {
        let first = *self.first_ns.get_or_insert(time_ns);
        let start = time_ns.saturating_sub(first) / WINDOW_NS * WINDOW_NS;
        if self.windows.back().is_none_or(|w| w.start_ns < start) {
            if self.windows.len() >= WINDOWS_KEPT {
                self.windows.pop_front();
            }
            self.windows.push_back(Window {
                start_ns: start,
                addrs: FastMap::default(),
            });
        }
        // Samples of the rings' last drain may be a little out of order:
        // a late one goes to the window it belongs to, if still kept.
        let Some(w) = self.windows.iter_mut().rev().find(|w| w.start_ns <= start) else {
            return;
        };
        let full = w.addrs.len() >= WINDOW_ADDRESSES;
        if let Some(e) = match w.addrs.get_mut(&addr) {
            Some(e) => Some(e),
            None if !full => Some(w.addrs.entry(addr).or_default()),
            None => None,
        } {
            e.0 = e.0.max(size);
            e.1 += 1;
        }
    }

    /// The latest windows, oldest first.
    pub fn windows(&self) -> impl Iterator<Item = &Window> {
        self.windows.iter()
    }

    /// Sampled accesses, and those to addresses beyond the table's cap.
    pub fn totals(&self) -> (u64, u64) {
        (self.total, self.dropped)
    }

    pub fn addresses(&self) -> impl Iterator<Item = (u64, &AddrStats)> {
        self.addrs.iter().map(|(&a, s)| (a, s))
    }

    pub fn pairs(&self) -> impl Iterator<Item = ((u64, u64), u64)> + '_ {
        self.pairs.iter().map(|(&k, &n)| (k, n))
    }
}

/// A named field of an object's element (from debug info).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldDef {
    pub name: String,
    pub offset: u64,
    pub size: u64,
}

/// One object's sampled accesses, as offsets in it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ObjectAccesses {
    /// (offset in the object, bytes, accesses).
    pub accesses: Vec<(u64, u32, u64)>,
    /// The object's size (a block's, a global's), when known.
    pub size: Option<u64>,
    /// The element size the debug info gives (an array's element, a
    /// struct's size).
    pub element: Option<u64>,
    /// The element's fields, from the debug info.
    pub fields: Vec<FieldDef>,
    /// Pairs of offsets accessed together, with counts.
    pub pairs: Vec<(u64, u64, u64)>,
}

/// How one element of the object is used.
#[derive(Debug, Clone, PartialEq)]
pub struct ElementUse {
    pub element_size: u64,
    /// Bytes of the element accessed at all.
    pub used_bytes: u64,
    /// Lines of an element that hold accessed bytes.
    pub lines: u64,
    /// Used bytes over the bytes of those lines: the share of each line
    /// brought in that is used.
    pub line_use: f64,
    /// Fields with their accesses (named, or runs of accessed bytes),
    /// by offset; cold named fields have 0.
    pub fields: Vec<(FieldDef, u64)>,
    /// Pairs of fields accessed together: (field, field, count).
    pub affinity: Vec<(String, String, u64)>,
    /// Lines per element its used bytes need when packed together.
    pub packed_lines: u64,
}

/// Candidate element sizes within this share of the best (sparsest) one
/// count as equal, and the smallest is taken: a pattern that repeats
/// every 64 bytes looks as sparse folded on 128.
const ELEMENT_TOLERANCE: f64 = 0.1;
/// Largest element size inferred from the accesses alone.
const MAX_INFERRED_ELEMENT: u64 = 4096;
/// A candidate element must gather at least this many samples per
/// distinct folded offset: folded on a size larger than the samples
/// cover, any pattern looks sparse (each sample alone in its place).
const MIN_SAMPLES_PER_OFFSET: f64 = 4.0;

/// Folds an object's accesses onto one element and measures its use.
pub fn analyze(obj: &ObjectAccesses) -> Option<ElementUse> {
    if obj.accesses.is_empty() {
        return None;
    }
    let element = obj
        .element
        .filter(|&e| e > 0)
        .unwrap_or_else(|| infer_element(obj));
    let used = folded(&obj.accesses, element);
    let used_bytes = used.iter().filter(|&&u| u).count() as u64;
    // Elements of a line or less share lines: the share is the element's.
    let (lines, span) = if element <= 64 {
        (1, element)
    } else {
        let lines = (0..element.div_ceil(64))
            .filter(|&l| {
                used[(l * 64) as usize..((l + 1) * 64).min(element) as usize].contains(&true)
            })
            .count() as u64;
        (lines, lines * 64)
    };
    let fields = fields(obj, element, &used);
    let name_of = |off: u64| {
        fields
            .iter()
            .find(|(f, _)| f.offset <= off && off < f.offset + f.size)
            .map(|(f, _)| f.name.clone())
    };
    let mut affinity: FastMap<(String, String), u64> = FastMap::default();
    // Sampled a millisecond apart, two accesses are rarely to the same
    // element: fields a thread accesses within the window, in any
    // elements, are accessed together.
    for &(a, b, n) in &obj.pairs {
        if let (Some(x), Some(y)) = (name_of(a % element), name_of(b % element)) {
            if x != y {
                let key = if x < y { (x, y) } else { (y, x) };
                *affinity.entry(key).or_default() += n;
            }
        }
    }
    let mut affinity: Vec<_> = affinity.into_iter().map(|((x, y), n)| (x, y, n)).collect();
    affinity.sort_by(|a, b| b.2.cmp(&a.2).then(a.cmp(b)));
    Some(ElementUse {
        element_size: element,
        used_bytes,
        lines,
        line_use: used_bytes as f64 / span.max(1) as f64,
        fields,
        affinity,
        packed_lines: used_bytes.div_ceil(64).max(1),
    })
}

/// Marks the bytes of an `element`-byte element that accesses touched.
fn folded(accesses: &[(u64, u32, u64)], element: u64) -> Vec<bool> {
    let mut used = vec![false; element as usize];
    for &(off, size, _) in accesses {
        let start = off % element;
        for b in start..(start + u64::from(size.max(1))).min(element) {
            used[b as usize] = true;
        }
    }
    used
}

/// Addresses (the busiest) an element size is inferred from.
const INFERENCE_ADDRESSES: usize = 2048;

/// Blocks at least this large may hold elements that do not divide them
/// (a slab allocator's page of 96-byte items): every multiple of 8 is a
/// candidate element there.
const SLAB_BLOCK: u64 = 64 << 10;

/// The element size that makes the accesses sparsest when folded: among
/// multiples of 8 that divide the object's size (all multiples of 8 up to
/// [`MAX_INFERRED_ELEMENT`] when it is unknown or at least a
/// [`SLAB_BLOCK`]) and that the samples cover
/// ([`MIN_SAMPLES_PER_OFFSET`]), the smallest whose used share is within
/// [`ELEMENT_TOLERANCE`] of the lowest.
fn infer_element(obj: &ObjectAccesses) -> u64 {
    let limit = obj
        .size
        .unwrap_or(MAX_INFERRED_ELEMENT)
        .min(MAX_INFERRED_ELEMENT);
    // The busiest addresses are enough to see the period, and keep this
    // bounded (it runs at every dashboard refresh).
    let mut busiest = obj.accesses.clone();
    busiest.sort_by_key(|a| std::cmp::Reverse(a.2));
    busiest.truncate(INFERENCE_ADDRESSES);
    let samples: u64 = busiest.iter().map(|a| a.2).sum();
    let covered = |e: u64| {
        let mut offsets: Vec<u64> = busiest.iter().map(|a| a.0 % e).collect();
        offsets.sort_unstable();
        offsets.dedup();
        samples as f64 / offsets.len().max(1) as f64 >= MIN_SAMPLES_PER_OFFSET
    };
    let candidates: Vec<u64> = (1..=limit / 8)
        .map(|k| k * 8)
        .filter(|&e| obj.size.is_none_or(|s| s % e == 0 || s >= SLAB_BLOCK))
        .filter(|&e| e == 8 || covered(e))
        .collect();
    let share = |e: u64| {
        let used = folded(&busiest, e).iter().filter(|&&u| u).count();
        used as f64 / e as f64
    };
    let shares: Vec<(u64, f64)> = candidates.iter().map(|&e| (e, share(e))).collect();
    let best = shares.iter().map(|s| s.1).fold(f64::INFINITY, f64::min);
    shares
        .iter()
        .find(|s| s.1 <= best * (1.0 + ELEMENT_TOLERANCE))
        .map_or(obj.size.unwrap_or(8).max(1), |s| s.0)
}

/// The element's fields and their accesses: the debug info's (cold ones
/// too), else each run of used bytes as `+OFFSET`.
fn fields(obj: &ObjectAccesses, element: u64, used: &[bool]) -> Vec<(FieldDef, u64)> {
    let mut defs: Vec<FieldDef> = if obj.fields.is_empty() {
        runs(used)
    } else {
        obj.fields.clone()
    };
    defs.sort_by_key(|f| f.offset);
    let mut counts = vec![0u64; defs.len()];
    for &(off, _, n) in &obj.accesses {
        let at = off % element;
        if let Some(i) = defs
            .iter()
            .position(|f| f.offset <= at && at < f.offset + f.size)
        {
            counts[i] += n;
        }
    }
    defs.into_iter().zip(counts).collect()
}

/// Runs of used bytes, as unnamed fields.
fn runs(used: &[bool]) -> Vec<FieldDef> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < used.len() {
        if !used[i] {
            i += 1;
            continue;
        }
        let start = i;
        while i < used.len() && used[i] {
            i += 1;
        }
        out.push(FieldDef {
            name: format!("+{start}"),
            offset: start as u64,
            size: (i - start) as u64,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` reads of 8 bytes at `offset` of element `i` of 64-byte records.
    fn scan(offsets: &[u64], element: u64, n: u64) -> Vec<(u64, u32, u64)> {
        (0..n)
            .flat_map(|i| {
                offsets
                    .iter()
                    .map(move |&o| (i * 7 % 500 * element + o, 8, 1))
            })
            .collect()
    }

    #[test]
    fn a_key_scan_uses_an_eighth_of_each_line() {
        let obj = ObjectAccesses {
            accesses: scan(&[0], 64, 300),
            size: Some(500 * 64),
            ..Default::default()
        };
        let u = analyze(&obj).unwrap();
        assert_eq!(u.element_size, 64, "inferred from the stride");
        assert_eq!(u.used_bytes, 8);
        assert!((u.line_use - 0.125).abs() < 1e-9);
        assert_eq!(u.fields.len(), 1);
        assert_eq!(u.fields[0].0.name, "+0");
    }

    /// A slab page of 96-byte items (which do not divide the page), whose
    /// lookups read each item's 8-byte key pointer and 4-byte length.
    #[test]
    fn items_in_a_slab_page_are_found_by_their_size() {
        let obj = ObjectAccesses {
            accesses: (0..400)
                .flat_map(|i: u64| {
                    // Items in no arithmetic pattern (an LCG's).
                    let item = (i
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407)
                        >> 33)
                        % 10_000
                        * 96;
                    [(item + 16, 8, 1), (item + 40, 4, 1)]
                })
                .collect(),
            size: Some(1 << 20),
            ..Default::default()
        };
        let u = analyze(&obj).unwrap();
        assert_eq!(u.element_size, 96);
        assert_eq!(u.used_bytes, 12);
        assert!((u.line_use - 12.0 / 64.0).abs() < 1e-9, "{}", u.line_use);
    }

    #[test]
    fn an_array_of_keys_uses_whole_lines() {
        let obj = ObjectAccesses {
            accesses: (0..300).map(|i| (i * 8 % 4000, 8, 1)).collect(),
            size: Some(4000),
            ..Default::default()
        };
        let u = analyze(&obj).unwrap();
        assert_eq!(u.element_size, 8);
        assert!((u.line_use - 1.0).abs() < 1e-9);
    }

    #[test]
    fn named_fields_far_apart_in_a_large_struct_span_two_lines() {
        // struct { char c0[32]; long a; char c1[48]; long b; char c2[32]; }
        let fields = [
            ("c0", 0, 32),
            ("a", 32, 8),
            ("c1", 40, 48),
            ("b", 88, 8),
            ("c2", 96, 32),
        ]
        .iter()
        .map(|&(n, o, s)| FieldDef {
            name: n.into(),
            offset: o,
            size: s,
        })
        .collect();
        let obj = ObjectAccesses {
            accesses: scan(&[32, 88], 128, 200),
            size: Some(500 * 128),
            element: Some(128),
            fields,
            pairs: vec![(128 + 32, 128 + 88, 40), (32, 128 + 88, 5)],
        };
        let u = analyze(&obj).unwrap();
        assert_eq!((u.used_bytes, u.lines, u.packed_lines), (16, 2, 1));
        assert!((u.line_use - 16.0 / 128.0).abs() < 1e-9);
        let hot: Vec<_> = u
            .fields
            .iter()
            .filter(|f| f.1 > 0)
            .map(|f| f.0.name.as_str())
            .collect();
        assert_eq!(hot, ["a", "b"]);
        assert_eq!(u.fields.len(), 5, "cold fields are listed too");
        assert_eq!(u.affinity, [("a".to_string(), "b".to_string(), 45)]);
    }

    #[test]
    fn the_profile_keeps_addresses_and_close_pairs() {
        let mut p = CacheProfile::default();
        p.on_access(1, 0x100, 8, false, 0);
        p.on_access(1, 0x138, 8, true, 1_000);
        p.on_access(1, 0x100, 8, false, AFFINITY_WINDOW_NS * 10);
        p.on_access(2, 0x100, 4, false, 20);
        assert_eq!(p.totals(), (4, 0));
        let s = p.addresses().find(|(a, _)| *a == 0x100).unwrap().1;
        assert_eq!((s.reads, s.writes, s.size), (3, 0, 8));
        let pairs: Vec<_> = p.pairs().collect();
        assert_eq!(pairs, [((0x100, 0x138), 1)], "the late one is not close");
    }

    #[test]
    fn windows_hold_the_latest_seconds_each_with_its_own_accesses() {
        let mut p = CacheProfile::default();
        let t0 = 5 * WINDOW_NS; // the clock's origin is the first access
        p.on_access(1, 0x100, 8, false, t0);
        p.on_access(1, 0x100, 8, false, t0 + WINDOW_NS / 2);
        p.on_access(1, 0x140, 4, true, t0 + WINDOW_NS + 1);
        // A late sample of the first window goes there.
        p.on_access(2, 0x180, 8, false, t0 + 10);
        type Seen = Vec<(u64, (u32, u64))>;
        let w: Vec<(u64, Seen)> = p
            .windows()
            .map(|w| {
                let mut a: Vec<_> = w.addrs.iter().map(|(k, v)| (*k, *v)).collect();
                a.sort();
                (w.start_ns, a)
            })
            .collect();
        assert_eq!(
            w,
            [
                (0, vec![(0x100, (8, 2)), (0x180, (8, 1))]),
                (WINDOW_NS, vec![(0x140, (4, 1))]),
            ]
        );
        for i in 0..WINDOWS_KEPT as u64 + 5 {
            p.on_access(1, 0x100, 8, false, t0 + i * WINDOW_NS);
        }
        assert_eq!(p.windows().count(), WINDOWS_KEPT);
        let first = p.windows().next().unwrap().start_ns;
        assert_eq!(first, 5 * WINDOW_NS, "the oldest are dropped");
    }
}

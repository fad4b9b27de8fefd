//! Which functions return a value, from the debug info: a `void` function
//! that allocated last may still hold the block in `rax` when it returns,
//! and the code alone would take it for an allocation wrapper
//! (`setup() { g = malloc(n); memset(g, 0, n); }` at -O2). Its type says
//! it returns nothing, so its caller is not the allocation's site.

use gimli::{AttributeValue, EndianSlice, UnitOffset};

use super::dwarf::{sections, R};

/// The code ranges of an object file's functions and whether each returns
/// a value, sorted by start.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Returns {
    ranges: Vec<(u64, u64, bool)>,
}

impl Returns {
    /// Reads the functions of an object file's (or debug file's) bytes;
    /// empty without DWARF.
    pub fn of(data: &[u8]) -> Self {
        let mut ranges = Vec::new();
        if let Some((sections, endian)) = sections(data) {
            let dwarf = sections.borrow(|s| EndianSlice::new(s, endian));
            let mut units = dwarf.units();
            while let Ok(Some(header)) = units.next() {
                if let Ok(unit) = dwarf.unit(header) {
                    add_unit(&dwarf, &unit, &mut ranges);
                }
            }
        }
        ranges.sort_unstable();
        Self { ranges }
    }

    /// Whether the function holding the virtual address `pc` returns a
    /// value: None when the debug info has no function there.
    pub fn at(&self, pc: u64) -> Option<bool> {
        let i = self.ranges.partition_point(|&(begin, _, _)| begin <= pc);
        // Functions do not nest; the last one starting at or before `pc`.
        let &(_, end, value) = self.ranges.get(i.checked_sub(1)?)?;
        (pc < end).then_some(value)
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

fn add_unit(
    dwarf: &gimli::Dwarf<R<'_>>,
    unit: &gimli::Unit<R<'_>>,
    ranges: &mut Vec<(u64, u64, bool)>,
) {
    let mut entries = unit.entries();
    while let Ok(Some(entry)) = entries.next_dfs() {
        // Concrete functions only: an inlined call is part of its caller.
        if entry.tag() != gimli::DW_TAG_subprogram {
            continue;
        }
        let Ok(mut r) = dwarf.die_ranges(unit, entry) else {
            continue;
        };
        let mut pieces = Vec::new();
        while let Ok(Some(range)) = r.next() {
            if range.begin < range.end {
                pieces.push((range.begin, range.end));
            }
        }
        if pieces.is_empty() {
            continue;
        }
        let value = returns_value(unit, entry);
        ranges.extend(pieces.into_iter().map(|(b, e)| (b, e, value)));
    }
}

/// Whether a function's entry, or the declaration or abstract instance it
/// completes, has a return type. A reference the unit cannot follow counts
/// as a value: the code analysis then decides alone.
fn returns_value<'a>(
    unit: &gimli::Unit<R<'a>>,
    entry: &gimli::DebuggingInformationEntry<R<'a>>,
) -> bool {
    let mut at = None;
    for _ in 0..4 {
        let e = match at {
            None => entry.clone(),
            Some(o) => match unit.entry(o) {
                Ok(e) => e,
                Err(_) => return true,
            },
        };
        if e.attr_value(gimli::DW_AT_type).is_some() {
            return true;
        }
        match origin(&e) {
            Origin::None => return false,
            Origin::Elsewhere => return true,
            Origin::Unit(o) => at = Some(o),
        }
    }
    true
}

enum Origin {
    None,
    Unit(UnitOffset),
    /// In another unit or file: not followed.
    Elsewhere,
}

/// The declaration or abstract instance an entry completes.
fn origin(entry: &gimli::DebuggingInformationEntry<R<'_>>) -> Origin {
    for a in [gimli::DW_AT_abstract_origin, gimli::DW_AT_specification] {
        match entry.attr_value(a) {
            Some(AttributeValue::UnitRef(o)) => return Origin::Unit(o),
            Some(_) => return Origin::Elsewhere,
            None => {}
        }
    }
    Origin::None
}

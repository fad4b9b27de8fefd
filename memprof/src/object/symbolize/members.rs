//! What a typed access goes through beyond its pointer variable: the
//! member a pointer was read from (`w->st`), and an element of a global
//! array that no variable holds (`&g_chase[id]` at -O2, whose DWARF
//! location is an expression, not a place).

use gimli::{AttributeValue, Operation, UnitOffset};

use super::{
    dwarf::{byte_size, layout_of_type, strip, R},
    typed::{single_op, typedef_name, AccessType},
};
use crate::object::x86::pointer::PointerUse;

/// The pointee type of the pointer member `offset` bytes into the struct
/// `ty`, and the member's name (`st`, or `a.st` inside a nested struct).
pub(super) fn member_pointee<'a>(
    dwarf: &gimli::Dwarf<R<'a>>,
    unit: &gimli::Unit<R<'a>>,
    ty: UnitOffset,
    offset: i64,
) -> Option<(UnitOffset, String)> {
    let mut offset = u64::try_from(offset).ok()?;
    let mut ty = strip(unit, ty)?;
    let mut path = Vec::new();
    // Down through nested structs to the member at `offset`.
    for _ in 0..8 {
        let entry = unit.entry(ty).ok()?;
        if entry.tag() != gimli::DW_TAG_structure_type {
            return None;
        }
        let mut tree = unit.entries_tree(Some(ty)).ok()?;
        let root = tree.root().ok()?;
        let mut children = root.children();
        let mut inside = None;
        while let Ok(Some(child)) = children.next() {
            let m = child.entry();
            if m.tag() != gimli::DW_TAG_member {
                continue;
            }
            let (Some(at), Some(AttributeValue::UnitRef(mty))) = (
                m.attr_value(gimli::DW_AT_data_member_location)
                    .and_then(|v| v.udata_value()),
                m.attr_value(gimli::DW_AT_type),
            ) else {
                continue;
            };
            let Some(mty) = strip(unit, mty) else {
                continue;
            };
            let size = type_size(unit, mty).unwrap_or(0);
            if at <= offset && offset < at + size.max(1) {
                let name = m
                    .attr_value(gimli::DW_AT_name)
                    .and_then(|v| dwarf.attr_string(unit, v).ok())
                    .map(|s| String::from_utf8_lossy(s.slice()).into_owned())
                    .unwrap_or_default();
                inside = Some((at, mty, name));
                break;
            }
        }
        let (at, mty, name) = inside?;
        path.push(name);
        let member = unit.entry(mty).ok()?;
        if member.tag() == gimli::DW_TAG_pointer_type {
            if at != offset {
                return None;
            }
            return match member.attr_value(gimli::DW_AT_type) {
                Some(AttributeValue::UnitRef(p)) => Some((p, path.join("."))),
                _ => None,
            };
        }
        offset -= at;
        ty = mty;
    }
    None
}

/// The type an access through an element of a global array goes to:
/// `&g_chase[id]` plus the access's displacement (`p.member` None), or the
/// pointer read from a member of that element (`g_chase[id].st`).
pub(super) fn element_access<'a>(
    dwarf: &gimli::Dwarf<R<'a>>,
    unit: &gimli::Unit<R<'a>>,
    at: u64,
    p: &PointerUse,
    rust: bool,
) -> Option<AccessType> {
    let (ty, name, start) = global_containing(dwarf, unit, at)?;
    let ty = strip(unit, ty)?;
    let entry = unit.entry(ty).ok()?;
    let element = if entry.tag() == gimli::DW_TAG_array_type {
        match entry.attr_value(gimli::DW_AT_type) {
            Some(AttributeValue::UnitRef(e)) => e,
            _ => return None,
        }
    } else {
        ty
    };
    let size = i64::try_from(byte_size(&unit.entry(strip(unit, element)?).ok()?)?).ok()?;
    if size <= 0 {
        return None;
    }
    let off = i64::try_from(at - start).ok()?;
    let (pointee, disp, variable) = match p.member {
        None => (
            element,
            (off + p.disp).rem_euclid(size),
            format!("{name}[]"),
        ),
        Some(m) => {
            let inner = (off + m).rem_euclid(size);
            let pointer = unit.entry(strip(unit, element)?).ok()?;
            let (pointee, member) = if pointer.tag() == gimli::DW_TAG_pointer_type && inner == 0 {
                match pointer.attr_value(gimli::DW_AT_type) {
                    Some(AttributeValue::UnitRef(t)) => (t, String::new()),
                    _ => return None,
                }
            } else {
                member_pointee(dwarf, unit, element, inner)?
            };
            let variable = if member.is_empty() {
                format!("{name}[]")
            } else {
                format!("{name}[].{member}")
            };
            (pointee, p.disp, variable)
        }
    };
    let mut layout = layout_of_type(dwarf, unit, pointee, rust);
    if layout.type_name.is_none() {
        layout.type_name = typedef_name(dwarf, unit, pointee);
    }
    layout.struct_size.is_some().then_some(AccessType {
        layout,
        disp,
        indexed: true,
        variable,
    })
}

/// The global variable of the unit whose bytes hold `at`: its type, name
/// and address.
fn global_containing<'a>(
    dwarf: &gimli::Dwarf<R<'a>>,
    unit: &gimli::Unit<R<'a>>,
    at: u64,
) -> Option<(UnitOffset, String, u64)> {
    let mut entries = unit.entries();
    while let Ok(Some(entry)) = entries.next_dfs() {
        if entry.tag() != gimli::DW_TAG_variable {
            continue;
        }
        let Some(AttributeValue::Exprloc(e)) = entry.attr_value(gimli::DW_AT_location) else {
            continue;
        };
        let Some(Operation::Address { address }) = single_op(e, unit) else {
            continue;
        };
        if address > at {
            continue;
        }
        // A definition may complete a declaration that has the name and type.
        let declared = match entry.attr_value(gimli::DW_AT_specification) {
            Some(AttributeValue::UnitRef(d)) => unit.entry(d).ok(),
            _ => None,
        };
        let described = declared.as_ref().unwrap_or(entry);
        let Some(AttributeValue::UnitRef(ty)) = described.attr_value(gimli::DW_AT_type) else {
            continue;
        };
        let size = type_size(unit, ty).unwrap_or(0);
        if at - address >= size {
            continue;
        }
        let name = described
            .attr_value(gimli::DW_AT_name)
            .and_then(|v| dwarf.attr_string(unit, v).ok())
            .map(|s| String::from_utf8_lossy(s.slice()).into_owned())
            .unwrap_or_default();
        return Some((ty, name, address));
    }
    None
}

/// The bytes of a type: its own size, or an array's elements times its
/// counts (C arrays carry no size of their own).
fn type_size(unit: &gimli::Unit<R<'_>>, ty: UnitOffset) -> Option<u64> {
    let ty = strip(unit, ty)?;
    let entry = unit.entry(ty).ok()?;
    if let Some(size) = byte_size(&entry) {
        return Some(size);
    }
    if entry.tag() != gimli::DW_TAG_array_type {
        return None;
    }
    let Some(AttributeValue::UnitRef(element)) = entry.attr_value(gimli::DW_AT_type) else {
        return None;
    };
    let mut size = type_size(unit, element)?;
    let mut tree = unit.entries_tree(Some(ty)).ok()?;
    let root = tree.root().ok()?;
    let mut children = root.children();
    while let Ok(Some(child)) = children.next() {
        let d = child.entry();
        if d.tag() != gimli::DW_TAG_subrange_type {
            continue;
        }
        let count = d
            .attr_value(gimli::DW_AT_count)
            .and_then(|v| v.udata_value())
            .or_else(|| {
                d.attr_value(gimli::DW_AT_upper_bound)
                    .and_then(|v| v.udata_value())
                    .map(|u| u + 1)
            })?;
        size = size.checked_mul(count)?;
    }
    Some(size)
}

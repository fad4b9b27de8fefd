//! The type and fields of a finding's memory, from the code that touched
//! it: each accessing instruction's pointer type in the debug info
//! ([`crate::object::symbolize::typed`]). A heap block or other memory
//! without a symbol of its own is then "struct args", its words `sum`,
//! `count` (or `[2].sum` in an array block) rather than byte offsets.

use std::collections::BTreeMap;

use crate::{
    object::symbolize::{dwarf::Layout, typed::AccessType},
    process::maps::ProcMaps,
    report::names::Names,
};

use super::analysis::LineFinding;

/// The type the accesses to a line go through.
#[derive(Debug, Clone, PartialEq)]
pub struct LineType {
    pub type_name: String,
    layout: Layout,
    size: u64,
    /// An address where an element of the type starts (the others are
    /// this plus multiples of `size`).
    anchor: u64,
}

/// The type most of the line's sampled accesses go through (by samples),
/// or None when the debug info names none.
pub fn line_type(f: &LineFinding, maps: &ProcMaps, names: &mut dyn Names) -> Option<LineType> {
    let mut by_type: BTreeMap<String, (u64, AccessType, u32)> = BTreeMap::new();
    for c in &f.code {
        let Some(t) = names.access_type(&maps.place(c.insn)) else {
            continue;
        };
        let Some(name) = t.layout.type_name.clone() else {
            continue;
        };
        let e = by_type.entry(name).or_insert((0, t, c.offset));
        e.0 += c.samples.max(1);
    }
    let (type_name, (_, t, offset)) = by_type.into_iter().max_by_key(|(_, (n, _, _))| *n)?;
    let size = t.layout.struct_size.filter(|&s| s > 0)?;
    // The accessed address less the access's displacement is where the
    // pointer points: an element's start.
    let anchor = (f.line + u64::from(offset)).wrapping_add_signed(-t.disp);
    Some(LineType {
        type_name,
        layout: t.layout,
        size,
        anchor,
    })
}

impl LineType {
    /// The member at byte `offset` of line `line` (`sum`). Not indexed:
    /// where the elements start in a block is not known (a wrapper may
    /// put a header first).
    pub fn field(&self, line: u64, offset: u32) -> Option<String> {
        let at = line + u64::from(offset);
        let inner = (i128::from(at) - i128::from(self.anchor)).rem_euclid(i128::from(self.size));
        let member = self.layout.field_at("", u64::try_from(inner).ok()?)?;
        Some(member.trim_start_matches('.').to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::symbolize::dwarf::Member;

    /// Elements of 24 bytes from 0x1008: the line at 0x1040 holds the
    /// end of element 2 and the start of element 3.
    #[test]
    fn words_are_named_by_their_element_s_member() {
        let member = |name: &str, offset| Member {
            name: name.into(),
            offset,
        };
        let t = LineType {
            type_name: "struct args".into(),
            layout: Layout {
                element: None,
                type_name: Some("struct args".into()),
                struct_size: Some(24),
                members: vec![member("id", 0), member("sum", 8), member("count", 16)],
            },
            size: 24,
            anchor: 0x1008 + 24 * 5,
        };
        // 0x1040 - 0x1008 = 56 = 2 * 24 + 8: sum.
        assert_eq!(t.field(0x1040, 0).as_deref(), Some("sum"));
        assert_eq!(t.field(0x1040, 8).as_deref(), Some("count"));
        assert_eq!(t.field(0x1040, 16).as_deref(), Some("id"));
        assert_eq!(t.field(0x1040, 20).as_deref(), Some("id"));
    }
}

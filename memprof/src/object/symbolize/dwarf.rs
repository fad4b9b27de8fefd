//! The layout of a global variable from DWARF: its type, whether it is an
//! array (and of what element size), and the members of its struct, so a
//! byte offset in it can be named (`g_args[1].sum`).

use std::{borrow::Cow, path::Path};

use gimli::{AttributeValue, EndianSlice, RunTimeEndian, UnitOffset};
use object::{Object, ObjectSection};

pub(super) type R<'a> = EndianSlice<'a, RunTimeEndian>;

/// A struct member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub offset: u64,
}

/// What a global variable is made of.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Layout {
    /// Element size when the variable is an array.
    pub element: Option<u64>,
    /// Name of the (element) type, e.g. `struct thread_arg`.
    pub type_name: Option<String>,
    /// Size of the (element) struct.
    pub struct_size: Option<u64>,
    /// Members of the (element) struct, by offset.
    pub members: Vec<Member>,
}

impl Layout {
    /// Names the byte at `offset` of the variable `var`: `var[2].count`,
    /// `var.next`, `var[5]`, or None when the layout says nothing.
    pub fn field_at(&self, var: &str, offset: u64) -> Option<String> {
        let (index, inner) = match self.element {
            Some(size) if size > 0 => (Some(offset / size), offset % size),
            _ => (None, offset),
        };
        let member = self
            .members
            .iter()
            .take_while(|m| m.offset <= inner)
            .last()
            .map(|m| format!(".{}", m.name));
        if index.is_none() && member.is_none() {
            return None;
        }
        let index = index.map(|i| format!("[{i}]")).unwrap_or_default();
        Some(format!("{var}{index}{}", member.unwrap_or_default()))
    }
}

/// Reads the layout of the global named `name` (a demangled symbol;
/// for `a::b::VAR` the DWARF name is `VAR`) from the object file `path`.
pub fn layout(path: &Path, name: &str) -> Option<Layout> {
    layout_in(&std::fs::read(path).ok()?, name)
}

/// The DWARF sections of an object file's bytes.
pub(super) fn sections(
    data: &[u8],
) -> Option<(gimli::DwarfSections<Cow<'_, [u8]>>, RunTimeEndian)> {
    let obj = object::File::parse(data).ok()?;
    let endian = if obj.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    let sections = gimli::DwarfSections::load(|id| -> Result<Cow<[u8]>, gimli::Error> {
        Ok(obj
            .section_by_name(id.name())
            .and_then(|s| s.uncompressed_data().ok())
            .unwrap_or(Cow::Borrowed(&[])))
    })
    .ok()?;
    Some((sections, endian))
}

/// The layout of what a pointer variable declared at `file:line` points
/// to (`struct record *r = malloc(n * sizeof *r);`): the element of the
/// heap block allocated on that line. A pointer declared elsewhere and
/// assigned there is not found. `file` (a full path, as the symbolizer
/// gives) must end with the debug info's name of the declaring file.
pub fn pointee_layout(path: &Path, file: &str, line: u32) -> Option<Layout> {
    pointee_layout_in(&std::fs::read(path).ok()?, file, line)
}

/// [`pointee_layout`] for an object file's bytes already in memory.
pub fn pointee_layout_in(data: &[u8], file: &str, line: u32) -> Option<Layout> {
    let file = Path::new(file);
    find_variable(data, |dwarf, unit, entry, rust| {
        let declared_here = entry
            .attr_value(gimli::DW_AT_decl_line)
            .and_then(|v| v.udata_value())
            == Some(u64::from(line));
        if !declared_here || !declared_in(dwarf, unit, entry, file) {
            return None;
        }
        let Some(AttributeValue::UnitRef(ty)) = entry.attr_value(gimli::DW_AT_type) else {
            return None;
        };
        let pointer = strip(unit, ty).and_then(|t| unit.entry(t).ok())?;
        if pointer.tag() != gimli::DW_TAG_pointer_type {
            return None;
        }
        let Some(AttributeValue::UnitRef(pointee)) = pointer.attr_value(gimli::DW_AT_type) else {
            return None;
        };
        let layout = layout_of_type(dwarf, unit, pointee, rust);
        layout.struct_size.is_some().then_some(layout)
    })
}

/// The first layout `f` makes of a variable of the object file's debug
/// info (`rust`: its compile unit is Rust's).
fn find_variable(
    data: &[u8],
    mut f: impl FnMut(
        &gimli::Dwarf<R<'_>>,
        &gimli::Unit<R<'_>>,
        &gimli::DebuggingInformationEntry<R<'_>>,
        bool,
    ) -> Option<Layout>,
) -> Option<Layout> {
    let (sections, endian) = sections(data)?;
    let dwarf = sections.borrow(|s| EndianSlice::new(s, endian));
    let mut units = dwarf.units();
    while let Ok(Some(header)) = units.next() {
        let Ok(unit) = dwarf.unit(header) else {
            continue;
        };
        let mut entries = unit.entries();
        let mut rust = false;
        while let Ok(Some(entry)) = entries.next_dfs() {
            if entry.tag() == gimli::DW_TAG_compile_unit {
                rust = matches!(
                    entry.attr_value(gimli::DW_AT_language),
                    Some(AttributeValue::Language(gimli::DW_LANG_Rust))
                );
            }
            if entry.tag() == gimli::DW_TAG_variable {
                if let Some(layout) = f(&dwarf, &unit, entry, rust) {
                    return Some(layout);
                }
            }
        }
    }
    None
}

/// Whether `entry` was declared in `file` (which ends with the name the
/// debug info gives its file).
fn declared_in(
    dwarf: &gimli::Dwarf<R<'_>>,
    unit: &gimli::Unit<R<'_>>,
    entry: &gimli::DebuggingInformationEntry<R<'_>>,
    file: &Path,
) -> bool {
    let index = match entry.attr_value(gimli::DW_AT_decl_file) {
        Some(AttributeValue::FileIndex(i)) => i,
        Some(v) => match v.udata_value() {
            Some(i) => i,
            None => return false,
        },
        None => return false,
    };
    let Some(program) = unit.line_program.as_ref() else {
        return false;
    };
    let Some(f) = program.header().file(index) else {
        return false;
    };
    dwarf
        .attr_string(unit, f.path_name())
        .is_ok_and(|name| file.ends_with(&*String::from_utf8_lossy(name.slice())))
}

/// [`layout`] for an object file's bytes already in memory.
pub fn layout_in(data: &[u8], name: &str) -> Option<Layout> {
    let short = name.rsplit("::").next().unwrap_or(name);
    find_variable(data, |dwarf, unit, entry, rust| {
        let named = entry
            .attr_value(gimli::DW_AT_name)
            .and_then(|v| dwarf.attr_string(unit, v).ok())
            .is_some_and(|s| s.slice() == short.as_bytes());
        match entry.attr_value(gimli::DW_AT_type) {
            Some(AttributeValue::UnitRef(ty)) if named => {
                Some(layout_of_type(dwarf, unit, ty, rust))
            }
            _ => None,
        }
    })
}

pub(super) fn layout_of_type(
    dwarf: &gimli::Dwarf<R<'_>>,
    unit: &gimli::Unit<R<'_>>,
    ty: UnitOffset,
    rust: bool,
) -> Layout {
    let mut layout = Layout::default();
    let Some(ty) = strip(unit, ty) else {
        return layout;
    };
    let Ok(entry) = unit.entry(ty) else {
        return layout;
    };
    let element = if entry.tag() == gimli::DW_TAG_array_type {
        match entry.attr_value(gimli::DW_AT_type) {
            Some(AttributeValue::UnitRef(e)) => strip(unit, e),
            _ => None,
        }
    } else {
        None
    };
    let target = match element {
        Some(e) => {
            layout.element = unit.entry(e).ok().and_then(|d| byte_size(&d));
            e
        }
        None => ty,
    };
    let Ok(entry) = unit.entry(target) else {
        return layout;
    };
    layout.type_name = entry
        .attr_value(gimli::DW_AT_name)
        .and_then(|v| dwarf.attr_string(unit, v).ok())
        .map(|s| {
            let n = String::from_utf8_lossy(s.slice()).into_owned();
            // C spells a struct type `struct x`; Rust as it is.
            if entry.tag() == gimli::DW_TAG_structure_type && !rust {
                format!("struct {n}")
            } else {
                n
            }
        });
    if entry.tag() != gimli::DW_TAG_structure_type {
        return layout;
    }
    layout.struct_size = byte_size(&entry);
    let Ok(mut tree) = unit.entries_tree(Some(target)) else {
        return layout;
    };
    let Ok(root) = tree.root() else {
        return layout;
    };
    let mut children = root.children();
    while let Ok(Some(child)) = children.next() {
        let m = child.entry();
        if m.tag() != gimli::DW_TAG_member {
            continue;
        }
        let name = m
            .attr_value(gimli::DW_AT_name)
            .and_then(|v| dwarf.attr_string(unit, v).ok())
            .map(|s| String::from_utf8_lossy(s.slice()).into_owned());
        let offset = m
            .attr_value(gimli::DW_AT_data_member_location)
            .and_then(|v| v.udata_value());
        if let (Some(name), Some(offset)) = (name, offset) {
            layout.members.push(Member { name, offset });
        }
    }
    layout.members.sort_by_key(|m| m.offset);
    layout
}

/// Follows typedefs and qualifiers to the underlying type.
pub(super) fn strip(unit: &gimli::Unit<R<'_>>, mut ty: UnitOffset) -> Option<UnitOffset> {
    for _ in 0..16 {
        let entry = unit.entry(ty).ok()?;
        match entry.tag() {
            gimli::DW_TAG_typedef
            | gimli::DW_TAG_const_type
            | gimli::DW_TAG_volatile_type
            | gimli::DW_TAG_atomic_type
            | gimli::DW_TAG_restrict_type => match entry.attr_value(gimli::DW_AT_type) {
                Some(AttributeValue::UnitRef(next)) => ty = next,
                _ => return None,
            },
            _ => return Some(ty),
        }
    }
    None
}

pub(super) fn byte_size(entry: &gimli::DebuggingInformationEntry<R<'_>>) -> Option<u64> {
    entry
        .attr_value(gimli::DW_AT_byte_size)
        .and_then(|v| v.udata_value())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_named_by_index_and_member() {
        let l = Layout {
            element: Some(40),
            type_name: Some("struct thread_arg".into()),
            struct_size: Some(40),
            members: vec![
                Member {
                    name: "id".into(),
                    offset: 0,
                },
                Member {
                    name: "flags".into(),
                    offset: 4,
                },
                Member {
                    name: "sum".into(),
                    offset: 8,
                },
                Member {
                    name: "count".into(),
                    offset: 16,
                },
                Member {
                    name: "tag".into(),
                    offset: 24,
                },
            ],
        };
        assert_eq!(l.field_at("g_args", 8).as_deref(), Some("g_args[0].sum"));
        assert_eq!(l.field_at("g_args", 12).as_deref(), Some("g_args[0].sum"));
        assert_eq!(l.field_at("g_args", 56).as_deref(), Some("g_args[1].count"));
        let scalars = Layout {
            element: Some(8),
            ..Layout::default()
        };
        assert_eq!(
            scalars.field_at("g_counters", 8).as_deref(),
            Some("g_counters[1]")
        );
        assert_eq!(Layout::default().field_at("x", 0), None);
    }

    /// This test binary's own DWARF has `TEST_LAYOUT` below.
    #[test]
    fn a_global_s_layout_is_read_from_this_binary() {
        let exe = std::env::current_exe().expect("test binary");
        let l = layout(
            &exe,
            "memprof::object::symbolize::dwarf::tests::TEST_LAYOUT",
        )
        .expect("found");
        assert_eq!(l.element, Some(24), "{l:?}");
        let names: Vec<&str> = l.members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"], "{l:?}");
        assert_eq!(
            l.field_at("TEST_LAYOUT", 24 + 8).as_deref(),
            Some("TEST_LAYOUT[1].b")
        );
        assert!(std::hint::black_box(&TEST_LAYOUT).len() == 2);
    }

    /// A pointer declared on a known line of this file points to `Probe`.
    #[test]
    fn a_pointer_declared_on_a_line_gives_its_pointee_s_layout() {
        let exe = std::env::current_exe().expect("test binary");
        let line = line!() + 1;
        let p: *const Probe = std::hint::black_box(std::ptr::null());
        // `file!()` is relative to the workspace, where rustc runs.
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let path = root.join(file!());
        let file = path.to_str().unwrap();
        let l = pointee_layout(&exe, file, line).expect("found");
        assert_eq!(l.struct_size, Some(24), "{l:?}");
        let names: Vec<&str> = l.members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"], "{l:?}");
        assert!(pointee_layout(&exe, file, line + 1).is_none());
        assert!(pointee_layout(&exe, "/elsewhere/other.rs", line).is_none());
        assert!(p.is_null());
    }

    #[repr(C)]
    struct Probe {
        a: u64,
        b: u64,
        c: u64,
    }

    static TEST_LAYOUT: [Probe; 2] = [Probe { a: 1, b: 2, c: 3 }, Probe { a: 4, b: 5, c: 6 }];
}

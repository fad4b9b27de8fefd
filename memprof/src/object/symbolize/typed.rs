//! The type of the memory an instruction accesses, from the debug info of
//! the pointer it goes through: `a->sum += x` stores 8 bytes into a
//! `struct args`, at its member `sum`. What perf's data-type profiling
//! does with a precise sample's DWARF location; here the pointer is found
//! by evaluating the code before the instruction ([`crate::object::x86::pointer`]), so a
//! timer sample serves, and a pointer reloaded from its stack slot at -O0
//! is found as well as one kept in a register at -O2.

use std::sync::Arc;

use gimli::{AttributeValue, EndianSlice, Operation, UnitOffset};

use super::{
    dwarf::{layout_of_type, sections, strip, Layout, R},
    members, Symbolizer,
};
use crate::object::{
    unwind::{rule_in, vaddr_in, Base, FrameRule},
    x86::{
        access::LOOK_BEHIND,
        pointer::{self, dwarf_register, Home, PointerUse},
    },
};
use crate::process::{maps::Place, objects::open_path};
use memprof_common::sharing::reg;

/// The type of the memory an access touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessType {
    /// What the pointer points to (a struct: its name, size, members).
    pub layout: Layout,
    /// Bytes from where the pointer points to the access.
    pub disp: i64,
    /// An index register was added (`p[i].x`).
    pub indexed: bool,
    /// The pointer variable's name.
    pub variable: String,
}

impl AccessType {
    /// The member at the access (`sum`, `[2].sum` for a constant index
    /// past the first element), None outside the struct's members.
    pub fn field(&self) -> Option<String> {
        let disp = u64::try_from(self.disp).ok()?;
        let l = Layout {
            element: self.layout.struct_size,
            ..self.layout.clone()
        };
        let named = l.field_at("", disp)?;
        // `[0].sum` for the pointer's own element reads as `sum`.
        Some(named.strip_prefix("[0].").unwrap_or(&named).to_string())
    }
}

/// An object file's bytes, and its separate debug file's when it has one.
pub struct TypedFile {
    code: Arc<[u8]>,
    debug: Option<Arc<[u8]>>,
}

impl Symbolizer {
    /// The type of the memory the instruction at `place` accesses, from
    /// the debug info of the pointer it goes through (None when unknown:
    /// never guessed).
    pub fn access_type(&mut self, place: &Place) -> Option<AccessType> {
        self.refresh();
        if let Some(t) = self.access_types.get(place) {
            return t.clone();
        }
        let found = match place {
            Place::File { path, file_offset } => self.access_type_at(path, *file_offset),
            _ => None,
        };
        self.access_types.insert(place.clone(), found.clone());
        found
    }

    /// The type of what the first argument of the call at `site` points
    /// to (`pthread_mutex_lock(&t->lock)`: `struct table`, 40 bytes in),
    /// from the debug info of the pointer it was made from. `site` is a
    /// call chain's frame: the byte before the return address
    /// ([`crate::process::maps::call_of`]).
    pub fn argument_type(&mut self, site: &Place) -> Option<AccessType> {
        self.refresh();
        let Place::File { path, file_offset } = site else {
            return None;
        };
        if let Some(t) = self.argument_types.get(site) {
            return t.clone();
        }
        let ret = file_offset + 1;
        let found = self.typed_file(path).and_then(|file| {
            let vaddr = vaddr_in(&file.code, ret)?;
            let from = ret.saturating_sub(LOOK_BEHIND);
            let bytes = file.code.get(usize::try_from(from).ok()?..)?;
            let bytes = bytes.get(..usize::try_from(ret - from).ok()?)?;
            let code_ip = vaddr - (ret - from);
            let (pointers, call) = pointer::of_call_argument(bytes, code_ip, vaddr, reg::RDI);
            let rule = rule_in(&file.code, ret - (vaddr - call));
            file.typed(call, &pointers, rule)
        });
        self.argument_types.insert(site.clone(), found.clone());
        found
    }

    /// The bytes of `path` and of its debug file, read once.
    fn typed_file(&mut self, path: &Arc<str>) -> Option<&TypedFile> {
        if !self.typed_files.contains_key(path) {
            let code = std::fs::read(open_path(path)).ok().map(Arc::from);
            let debug = self
                .debug_file(path)
                .and_then(|d| std::fs::read(d).ok())
                .map(Arc::from);
            let file = code.map(|code| TypedFile { code, debug });
            self.typed_files.insert(path.clone(), file);
        }
        self.typed_files.get(path)?.as_ref()
    }

    fn access_type_at(&mut self, path: &Arc<str>, offset: u64) -> Option<AccessType> {
        let file = self.typed_file(path)?;
        let (pointers, pc, rule) = pointer_use_in(&file.code, offset)?;
        file.typed(pc, &pointers, rule)
    }
}

impl TypedFile {
    /// [`access_type_in`] from the file's own debug info, else from its
    /// debug file's.
    fn typed(
        &self,
        pc: u64,
        pointers: &[PointerUse],
        rule: Option<FrameRule>,
    ) -> Option<AccessType> {
        access_type_in(&self.code, pc, pointers, rule).or_else(|| {
            let debug = self.debug.as_ref()?;
            access_type_in(debug, pc, pointers, rule)
        })
    }
}

/// Where the access at file offset `offset` of the object file `code`
/// (its bytes) goes through a pointer: the pointer, the instruction's
/// virtual address and the frame rule there (for frame-relative homes).
pub fn pointer_use_in(
    code: &[u8],
    offset: u64,
) -> Option<(Vec<PointerUse>, u64, Option<FrameRule>)> {
    let vaddr = vaddr_in(code, offset)?;
    let from = offset.saturating_sub(LOOK_BEHIND);
    let end = offset.checked_add(16)?.min(code.len() as u64);
    let bytes = code.get(usize::try_from(from).ok()?..usize::try_from(end).ok()?)?;
    let code_ip = vaddr - (offset - from);
    let p = pointer::of_access(bytes, code_ip, vaddr);
    (!p.is_empty()).then(|| (p, vaddr, rule_in(code, offset)))
}

/// The type the first of `pointers` the debug info knows points to, from
/// `debug` (the object file's bytes, or its separate debug file's): the
/// variable or parameter in scope at `pc` whose location is the
/// pointer's home.
pub fn access_type_in(
    debug: &[u8],
    pc: u64,
    pointers: &[PointerUse],
    rule: Option<FrameRule>,
) -> Option<AccessType> {
    let (sections, endian) = sections(debug)?;
    let dwarf = sections.borrow(|s| EndianSlice::new(s, endian));
    let mut units = dwarf.units();
    while let Ok(Some(header)) = units.next() {
        let Ok(unit) = dwarf.unit(header) else {
            continue;
        };
        let covers = |at: u64| -> bool {
            dwarf.unit_ranges(&unit).is_ok_and(|mut r| {
                std::iter::from_fn(|| r.next().ok().flatten()).any(|r| r.begin <= at && at < r.end)
            })
        };
        if !covers(pc) {
            continue;
        }
        let rust = is_rust(&unit);
        // The pointer's home at the run's start, else at the access.
        for p in pointers {
            if let Home::Element(at) = p.home {
                if let Some(t) = members::element_access(&dwarf, &unit, at, p, rust) {
                    return Some(t);
                }
                continue;
            }
            for at in [p.run_start, pc] {
                let Some((ty, variable)) = variable_at(&dwarf, &unit, at, p.home, rule) else {
                    continue;
                };
                // `w->st->hits`: the type `w`'s member `st` points to.
                let (ty, variable) = match p.member {
                    None => (ty, variable),
                    Some(offset) => {
                        let Some((ty, member)) = members::member_pointee(&dwarf, &unit, ty, offset)
                        else {
                            continue;
                        };
                        (ty, format!("{variable}->{member}"))
                    }
                };
                let mut layout = layout_of_type(&dwarf, &unit, ty, rust);
                // `typedef struct { ... } lreg_args;`: the struct has no
                // name of its own.
                if layout.type_name.is_none() {
                    layout.type_name = typedef_name(&dwarf, &unit, ty);
                }
                return layout.struct_size.is_some().then_some(AccessType {
                    layout,
                    disp: p.disp,
                    indexed: p.indexed,
                    variable,
                });
            }
        }
        return None;
    }
    None
}

fn is_rust(unit: &gimli::Unit<R<'_>>) -> bool {
    let mut entries = unit.entries();
    matches!(entries.next_dfs(), Ok(Some(e)) if matches!(
        e.attr_value(gimli::DW_AT_language),
        Some(AttributeValue::Language(gimli::DW_LANG_Rust))
    ))
}

/// A scope of the walk: its depth, whether it holds `pc`, and the frame
/// base of the function it is in.
#[derive(Clone, Copy)]
struct Scope {
    depth: isize,
    live: bool,
    frame_base: Option<FrameBase>,
}

/// `DW_AT_frame_base`: the canonical frame address, or a register.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FrameBase {
    Cfa,
    Reg(u16),
}

/// The pointee type and name of the pointer variable in scope at `pc`
/// whose location is `home`.
fn variable_at<'a>(
    dwarf: &gimli::Dwarf<R<'a>>,
    unit: &gimli::Unit<R<'a>>,
    pc: u64,
    home: Home,
    rule: Option<FrameRule>,
) -> Option<(UnitOffset, String)> {
    let mut scopes: Vec<Scope> = Vec::new();
    let mut entries = unit.entries();
    while let Ok(Some(_)) = entries.next_dfs() {
        let depth = entries.depth();
        let Some(entry) = entries.current() else {
            continue;
        };
        while scopes.last().is_some_and(|s| s.depth >= depth) {
            scopes.pop();
        }
        let parent = scopes.last().copied().unwrap_or(Scope {
            depth: -1,
            live: true,
            frame_base: None,
        });
        match entry.tag() {
            gimli::DW_TAG_subprogram
            | gimli::DW_TAG_inlined_subroutine
            | gimli::DW_TAG_lexical_block => {
                let has_ranges = entry.attr_value(gimli::DW_AT_low_pc).is_some()
                    || entry.attr_value(gimli::DW_AT_ranges).is_some();
                let holds = |e| {
                    dwarf.die_ranges(unit, e).is_ok_and(|mut r| {
                        std::iter::from_fn(|| r.next().ok().flatten())
                            .any(|r| r.begin <= pc && pc < r.end)
                    })
                };
                let live = parent.live
                    && if has_ranges {
                        holds(entry)
                    } else {
                        entry.tag() == gimli::DW_TAG_lexical_block
                    };
                let frame_base = frame_base(unit, entry).or(parent.frame_base);
                scopes.push(Scope {
                    depth,
                    live,
                    frame_base,
                });
            }
            gimli::DW_TAG_variable | gimli::DW_TAG_formal_parameter if parent.live => {
                let fb = parent.frame_base;
                if located_at(dwarf, unit, entry, pc, home, fb, rule) {
                    if let Some(found) = pointee(dwarf, unit, entry) {
                        return Some(found);
                    }
                }
            }
            // Units and namespaces hold functions; any other entry's
            // children (members, enumerators) hold no variables in scope.
            tag => scopes.push(Scope {
                depth,
                live: matches!(tag, gimli::DW_TAG_compile_unit | gimli::DW_TAG_namespace)
                    && parent.live,
                frame_base: None,
            }),
        }
    }
    None
}

fn frame_base<'a>(
    unit: &gimli::Unit<R<'a>>,
    entry: &gimli::DebuggingInformationEntry<R<'a>>,
) -> Option<FrameBase> {
    let Some(AttributeValue::Exprloc(e)) = entry.attr_value(gimli::DW_AT_frame_base) else {
        return None;
    };
    match single_op(e, unit)? {
        Operation::CallFrameCFA => Some(FrameBase::Cfa),
        Operation::Register { register } => Some(FrameBase::Reg(register.0)),
        _ => None,
    }
}

/// The expression's one operation (None for longer ones).
pub(super) fn single_op<'a>(
    e: gimli::Expression<R<'a>>,
    unit: &gimli::Unit<R<'a>>,
) -> Option<Operation<R<'a>>> {
    let mut ops = e.operations(unit.encoding());
    let op = ops.next().ok()??;
    ops.next().ok()?.is_none().then_some(op)
}

/// Whether the variable's location at `pc` is `home`.
fn located_at<'a>(
    dwarf: &gimli::Dwarf<R<'a>>,
    unit: &gimli::Unit<R<'a>>,
    entry: &gimli::DebuggingInformationEntry<R<'a>>,
    pc: u64,
    home: Home,
    fb: Option<FrameBase>,
    rule: Option<FrameRule>,
) -> bool {
    let Some(value) = entry.attr_value(gimli::DW_AT_location) else {
        return false;
    };
    let expr = match value {
        AttributeValue::Exprloc(e) => Some(e),
        v => match dwarf.attr_locations(unit, v) {
            Ok(Some(mut list)) => std::iter::from_fn(|| list.next().ok().flatten())
                .find(|l| l.range.begin <= pc && pc < l.range.end)
                .map(|l| l.data),
            _ => None,
        },
    };
    let Some(op) = expr.and_then(|e| single_op(e, unit)) else {
        return false;
    };
    matches_home(&op, home, fb, rule)
}

/// Whether a location operation names `home`.
fn matches_home(
    op: &Operation<R<'_>>,
    home: Home,
    fb: Option<FrameBase>,
    rule: Option<FrameRule>,
) -> bool {
    match (home, op) {
        (Home::Reg(r), Operation::Register { register }) => register.0 == dwarf_register(r),
        (
            Home::Slot(r, off),
            Operation::RegisterOffset {
                register, offset, ..
            },
        ) => register.0 == dwarf_register(r) && *offset == off,
        (Home::Slot(r, off), Operation::FrameOffset { offset }) => match fb {
            Some(FrameBase::Reg(b)) => b == dwarf_register(r) && *offset == off,
            Some(FrameBase::Cfa) => rule.is_some_and(|rule| {
                let base = match rule.base {
                    Base::Sp => reg::RSP,
                    Base::Bp => reg::RBP,
                };
                base == r && rule.cfa_offset.wrapping_add(*offset) == off
            }),
            None => false,
        },
        (Home::Global(addr), Operation::Address { address }) => *address == addr,
        _ => false,
    }
}

/// The name of the first typedef on the way from `ty` to the type it
/// names (through qualifiers).
pub(super) fn typedef_name<'a>(
    dwarf: &gimli::Dwarf<R<'a>>,
    unit: &gimli::Unit<R<'a>>,
    mut ty: UnitOffset,
) -> Option<String> {
    for _ in 0..16 {
        let entry = unit.entry(ty).ok()?;
        if entry.tag() == gimli::DW_TAG_typedef {
            let name = dwarf
                .attr_string(unit, entry.attr_value(gimli::DW_AT_name)?)
                .ok()?;
            return Some(String::from_utf8_lossy(name.slice()).into_owned());
        }
        if !matches!(
            entry.tag(),
            gimli::DW_TAG_const_type | gimli::DW_TAG_volatile_type | gimli::DW_TAG_restrict_type
        ) {
            return None;
        }
        match entry.attr_value(gimli::DW_AT_type) {
            Some(AttributeValue::UnitRef(next)) => ty = next,
            _ => return None,
        }
    }
    None
}

/// A pointer variable's pointee type and its name (through the abstract
/// origin of an inlined or out-of-line instance).
fn pointee<'a>(
    dwarf: &gimli::Dwarf<R<'a>>,
    unit: &gimli::Unit<R<'a>>,
    entry: &gimli::DebuggingInformationEntry<R<'a>>,
) -> Option<(UnitOffset, String)> {
    let origin = match entry.attr_value(gimli::DW_AT_abstract_origin) {
        Some(AttributeValue::UnitRef(o)) => unit.entry(o).ok(),
        _ => None,
    };
    let described = origin.as_ref().unwrap_or(entry);
    let name = described
        .attr_value(gimli::DW_AT_name)
        .and_then(|v| dwarf.attr_string(unit, v).ok())
        .map(|s| String::from_utf8_lossy(s.slice()).into_owned())
        .unwrap_or_default();
    let Some(AttributeValue::UnitRef(ty)) = described.attr_value(gimli::DW_AT_type) else {
        return None;
    };
    let pointer = unit.entry(strip(unit, ty)?).ok()?;
    if pointer.tag() != gimli::DW_TAG_pointer_type {
        return None;
    }
    match pointer.attr_value(gimli::DW_AT_type) {
        Some(AttributeValue::UnitRef(p)) => Some((p, name)),
        _ => None,
    }
}

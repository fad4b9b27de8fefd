//! Seed inputs from real binaries (this test executable and the libc it
//! maps), made small so that each execution is fast and mutations land in
//! the bytes the parsers read:
//!
//! - a mini ELF: the original ELF and program headers and section table,
//!   with a few hundred of the symbols and one DWARF compile unit (the one
//!   holding this test's probe static), re-encoded by gimli so that it
//!   stands alone;
//! - a mini unwind object: a few dozen real `.eh_frame` FDEs and their
//!   CIEs with a new `.eh_frame_hdr`, placed at the original addresses so
//!   the rules they give are the original ones;
//! - windows of real machine code from `.text`.

use std::{collections::BTreeMap, ops::Range};

use gimli::{EndianSlice, LittleEndian, UnwindSection as _};

pub const PT_LOAD: u32 = 1;
const PT_GNU_EH_FRAME: u32 = 0x6474_e550;
const SHF_ALLOC: u64 = 2;
const SHF_COMPRESSED: u64 = 0x800;
const SHT_PROGBITS: u32 = 1;
const SHT_SYMTAB: u32 = 2;
const SHT_STRTAB: u32 = 3;
const SHT_DYNSYM: u32 = 11;
const SHT_NOBITS: u32 = 8;
const STT_OBJECT: u8 = 1;
const STT_FUNC: u8 = 2;

fn u16_at(d: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        d.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}
fn u32_at(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        d.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(d: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        d.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

#[derive(Debug, Clone)]
pub struct Phdr {
    pub ty: u32,
    pub flags: u32,
    pub offset: u64,
    pub vaddr: u64,
    pub paddr: u64,
    pub filesz: u64,
    pub memsz: u64,
    pub align: u64,
}

#[derive(Debug, Clone)]
pub struct Shdr {
    pub name: String,
    pub ty: u32,
    pub flags: u64,
    pub addr: u64,
    pub offset: u64,
    pub size: u64,
    pub link: u32,
    pub info: u32,
    pub align: u64,
    pub entsize: u64,
}

/// A 64-bit little-endian ELF file, read with plain offsets (the seeds'
/// own reader: the point is not to trust the code under test).
pub struct Elf {
    pub data: Vec<u8>,
    pub phdrs: Vec<Phdr>,
    pub shdrs: Vec<Shdr>,
}

impl Elf {
    pub fn read(path: &str) -> Option<Self> {
        Self::parse(std::fs::read(path).ok()?)
    }

    pub fn parse(data: Vec<u8>) -> Option<Self> {
        if data.get(..6)? != b"\x7fELF\x02\x01" {
            return None;
        }
        let phoff = u64_at(&data, 0x20)? as usize;
        let shoff = u64_at(&data, 0x28)? as usize;
        let phentsize = u16_at(&data, 0x36)? as usize;
        let phnum = u16_at(&data, 0x38)? as usize;
        let shentsize = u16_at(&data, 0x3a)? as usize;
        let shnum = u16_at(&data, 0x3c)? as usize;
        let shstrndx = u16_at(&data, 0x3e)? as usize;
        let mut phdrs = Vec::new();
        for i in 0..phnum {
            let p = phoff + i * phentsize;
            phdrs.push(Phdr {
                ty: u32_at(&data, p)?,
                flags: u32_at(&data, p + 4)?,
                offset: u64_at(&data, p + 8)?,
                vaddr: u64_at(&data, p + 0x10)?,
                paddr: u64_at(&data, p + 0x18)?,
                filesz: u64_at(&data, p + 0x20)?,
                memsz: u64_at(&data, p + 0x28)?,
                align: u64_at(&data, p + 0x30)?,
            });
        }
        let mut raw = Vec::new();
        for i in 0..shnum {
            let s = shoff + i * shentsize;
            raw.push((
                u32_at(&data, s)?,
                Shdr {
                    name: String::new(),
                    ty: u32_at(&data, s + 4)?,
                    flags: u64_at(&data, s + 8)?,
                    addr: u64_at(&data, s + 0x10)?,
                    offset: u64_at(&data, s + 0x18)?,
                    size: u64_at(&data, s + 0x20)?,
                    link: u32_at(&data, s + 0x28)?,
                    info: u32_at(&data, s + 0x2c)?,
                    align: u64_at(&data, s + 0x30)?,
                    entsize: u64_at(&data, s + 0x38)?,
                },
            ));
        }
        let strtab = raw.get(shstrndx).map(|(_, s)| s.clone())?;
        let names = data.get(strtab.offset as usize..(strtab.offset + strtab.size) as usize)?;
        let shdrs = raw
            .into_iter()
            .map(|(name, mut s)| {
                let tail = names.get(name as usize..).unwrap_or_default();
                let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
                s.name = String::from_utf8_lossy(&tail[..end]).into_owned();
                s
            })
            .collect();
        Some(Self { data, phdrs, shdrs })
    }

    pub fn section(&self, name: &str) -> Option<&Shdr> {
        self.shdrs.iter().find(|s| s.name == name)
    }

    pub fn bytes(&self, s: &Shdr) -> Option<&[u8]> {
        if s.ty == SHT_NOBITS {
            return Some(&[]); // NOBITS
        }
        self.data
            .get(s.offset as usize..s.offset.checked_add(s.size)? as usize)
    }

    /// The file offset of a virtual address, through the PT_LOAD segments.
    pub fn file_offset(&self, vaddr: u64) -> Option<u64> {
        self.phdrs
            .iter()
            .find(|p| p.ty == PT_LOAD && (p.vaddr..p.vaddr + p.filesz).contains(&vaddr))
            .map(|p| vaddr - p.vaddr + p.offset)
    }

    /// Symbols of a symbol table section (`.symtab` or `.dynsym`).
    pub fn symbols(&self, table: &str) -> Vec<Sym> {
        let Some(sh) = self.section(table) else {
            return Vec::new();
        };
        let (Some(bytes), Some(strs)) = (
            self.bytes(sh),
            self.shdrs.get(sh.link as usize).and_then(|s| self.bytes(s)),
        ) else {
            return Vec::new();
        };
        bytes
            .chunks_exact(24)
            .skip(1)
            .filter_map(|e| {
                let name = u32_at(e, 0)? as usize;
                let tail = strs.get(name..)?;
                let end = tail.iter().position(|&b| b == 0)?;
                Some(Sym {
                    name: tail[..end].to_vec(),
                    info: e[4],
                    other: e[5],
                    shndx: u16_at(e, 6)?,
                    value: u64_at(e, 8)?,
                    size: u64_at(e, 16)?,
                })
            })
            .collect()
    }
}

/// An ELF symbol.
#[derive(Debug, Clone)]
pub struct Sym {
    pub name: Vec<u8>,
    pub info: u8,
    pub other: u8,
    pub shndx: u16,
    pub value: u64,
    pub size: u64,
}

impl Sym {
    pub fn kind(&self) -> u8 {
        self.info & 0xf
    }

    fn is_local(&self) -> bool {
        self.info >> 4 == 0
    }

    pub fn is_defined_code_or_data(&self) -> bool {
        matches!(self.kind(), STT_FUNC | STT_OBJECT) && self.shndx != 0 && self.value != 0
    }
}

/// A symbol table and its string table for `syms` (locals first, as ELF
/// wants), and the index of the first global.
fn symbol_table(syms: &[Sym]) -> (Vec<u8>, Vec<u8>, u32) {
    let mut syms: Vec<&Sym> = syms.iter().collect();
    syms.sort_by_key(|s| !s.is_local());
    let mut table = vec![0u8; 24];
    let mut strs = vec![0u8];
    let mut first_global = syms.len() as u32 + 1;
    for (i, s) in syms.iter().enumerate() {
        if !s.is_local() && first_global as usize > syms.len() {
            first_global = i as u32 + 1;
        }
        let name = strs.len() as u32;
        strs.extend_from_slice(&s.name);
        strs.push(0);
        table.extend_from_slice(&name.to_le_bytes());
        table.push(s.info);
        table.push(s.other);
        table.extend_from_slice(&s.shndx.to_le_bytes());
        table.extend_from_slice(&s.value.to_le_bytes());
        table.extend_from_slice(&s.size.to_le_bytes());
    }
    (table, strs, first_global)
}

/// A section of an ELF file being written.
#[derive(Debug, Clone)]
pub struct OutSection {
    pub name: String,
    pub ty: u32,
    pub flags: u64,
    pub addr: u64,
    pub link: u32,
    pub info: u32,
    pub align: u64,
    pub entsize: u64,
    /// The bytes, or None to keep the original offset and size (a section
    /// only needed for its addresses; its offset lies past the new file's
    /// end).
    pub data: Option<Vec<u8>>,
    pub orig_offset: u64,
    pub orig_size: u64,
}

impl OutSection {
    fn from_shdr(s: &Shdr, data: Option<Vec<u8>>) -> Self {
        Self {
            name: s.name.clone(),
            ty: s.ty,
            flags: s.flags,
            addr: s.addr,
            link: s.link,
            info: s.info,
            align: s.align,
            entsize: s.entsize,
            data,
            orig_offset: s.offset,
            orig_size: s.size,
        }
    }
}

fn align_to(v: &mut Vec<u8>, align: usize) {
    while !v.len().is_multiple_of(align.max(1)) {
        v.push(0);
    }
}

/// Writes an ELF file: `ehdr`'s identification and type fields, the given
/// program headers and sections (a `.shstrtab` among them is generated).
/// Returns the file and, per section name, where its bytes are.
pub fn write_elf(
    ehdr: &[u8],
    phdrs: &[Phdr],
    sections: &[OutSection],
) -> (Vec<u8>, BTreeMap<String, Range<usize>>) {
    let mut out = ehdr[..64].to_vec();
    for p in phdrs {
        out.extend_from_slice(&p.ty.to_le_bytes());
        out.extend_from_slice(&p.flags.to_le_bytes());
        for v in [p.offset, p.vaddr, p.paddr, p.filesz, p.memsz, p.align] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    let mut shstrtab = vec![0u8];
    let mut name_offsets = Vec::new();
    for s in sections {
        name_offsets.push(shstrtab.len() as u32);
        shstrtab.extend_from_slice(s.name.as_bytes());
        shstrtab.push(0);
    }
    let mut placed = BTreeMap::new();
    let mut where_ = Vec::new();
    for s in sections {
        let data = if s.name == ".shstrtab" {
            Some(&shstrtab)
        } else {
            s.data.as_ref()
        };
        match data {
            Some(d) => {
                align_to(&mut out, (s.align as usize).clamp(1, 16));
                let at = out.len();
                out.extend_from_slice(d);
                placed.insert(s.name.clone(), at..out.len());
                where_.push((at as u64, d.len() as u64));
            }
            None => where_.push((s.orig_offset, s.orig_size)),
        }
    }
    align_to(&mut out, 8);
    let shoff = out.len();
    for ((s, name), (offset, size)) in sections.iter().zip(&name_offsets).zip(&where_) {
        out.extend_from_slice(&name.to_le_bytes());
        out.extend_from_slice(&s.ty.to_le_bytes());
        out.extend_from_slice(&s.flags.to_le_bytes());
        out.extend_from_slice(&s.addr.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&s.link.to_le_bytes());
        out.extend_from_slice(&s.info.to_le_bytes());
        out.extend_from_slice(&s.align.to_le_bytes());
        out.extend_from_slice(&s.entsize.to_le_bytes());
    }
    placed.insert("[section headers]".to_string(), shoff..out.len());
    placed.insert(
        "[elf and program headers]".to_string(),
        0..64 + phdrs.len() * 56,
    );
    let shstrndx = sections
        .iter()
        .position(|s| s.name == ".shstrtab")
        .unwrap_or(0) as u16;
    out[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
    out[0x28..0x30]
        .copy_from_slice(&(if sections.is_empty() { 0 } else { shoff as u64 }).to_le_bytes());
    out[0x34..0x36].copy_from_slice(&64u16.to_le_bytes());
    out[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
    out[0x38..0x3a].copy_from_slice(&(phdrs.len() as u16).to_le_bytes());
    out[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
    out[0x3c..0x3e].copy_from_slice(&(sections.len() as u16).to_le_bytes());
    out[0x3e..0x40].copy_from_slice(&shstrndx.to_le_bytes());
    (out, placed)
}

// ---------------------------------------------------------------------------
// DWARF.

/// The DWARF sections of the one compile unit of `elf` that defines the
/// variable `var`, converted by gimli into stand-alone sections (strings,
/// abbreviations and line program of that unit only).
pub fn unit_dwarf(elf: &Elf, var: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let load = |id: gimli::SectionId| -> Result<EndianSlice<'_, LittleEndian>, gimli::Error> {
        let bytes = elf
            .section(id.name())
            .filter(|s| s.flags & SHF_COMPRESSED == 0)
            .and_then(|s| elf.bytes(s))
            .unwrap_or_default();
        Ok(EndianSlice::new(bytes, LittleEndian))
    };
    let mut dwarf = gimli::Dwarf::load(load).map_err(|e| e.to_string())?;
    let mut units = dwarf.units();
    let mut found = None;
    while let Some(header) = units.next().map_err(|e| e.to_string())? {
        let (start, len) = (header.offset().0, header.length_including_self());
        let unit = dwarf.unit(header).map_err(|e| e.to_string())?;
        let mut entries = unit.entries();
        while let Some(entry) = entries.next_dfs().map_err(|e| e.to_string())? {
            if entry.tag() != gimli::DW_TAG_variable {
                continue;
            }
            let named = entry
                .attr_value(gimli::DW_AT_name)
                .and_then(|v| dwarf.attr_string(&unit, v).ok())
                .is_some_and(|s| s.slice() == var.as_bytes());
            if named {
                found = Some(start);
                break;
            }
        }
        if found.is_some() {
            let all = elf
                .section(".debug_info")
                .and_then(|s| elf.bytes(s))
                .unwrap_or_default();
            let one = all.get(start..start + len).ok_or("unit out of bounds")?;
            dwarf.debug_info = gimli::DebugInfo::new(one, LittleEndian);
            break;
        }
    }
    if found.is_none() {
        return Err(format!("no compile unit defines {var}"));
    }
    let convert_address = |a| Some(gimli::write::Address::Constant(a));
    let mut out = match gimli::write::Dwarf::from(&dwarf, &convert_address) {
        Ok(out) => out,
        // An optimised build's unit refers to DIEs in other units (what
        // was inlined from them): keep the DIEs the probes need, wherever
        // they are.
        Err(_) => {
            let all = elf
                .section(".debug_info")
                .and_then(|s| elf.bytes(s))
                .unwrap_or_default();
            dwarf.debug_info = gimli::DebugInfo::new(all, LittleEndian);
            needed_dies(
                &dwarf,
                &[var.as_bytes(), b"fuzz_probe_fn"],
                &convert_address,
            )
            .map_err(|e| e.to_string())?
        }
    };
    let mut sections = gimli::write::Sections::new(gimli::write::EndianVec::new(LittleEndian));
    out.write(&mut sections).map_err(|e| e.to_string())?;
    let mut result = Vec::new();
    sections
        .for_each(|id, data| {
            if !data.slice().is_empty() {
                result.push((id.name().to_string(), data.slice().to_vec()));
            }
            Ok::<(), ()>(())
        })
        .map_err(|()| "writing sections")?;
    Ok(result)
}

/// The DIEs named `names` and those they depend on, from all units.
fn needed_dies(
    dwarf: &gimli::Dwarf<EndianSlice<'_, LittleEndian>>,
    names: &[&[u8]],
    convert_address: &dyn Fn(u64) -> Option<gimli::write::Address>,
) -> Result<gimli::write::Dwarf, gimli::write::ConvertError> {
    let mut filter = gimli::write::FilterUnitSection::new(dwarf)?;
    let mut units = Vec::new();
    while let Some(mut unit) = filter.read_unit()? {
        let mut entry = unit.null_entry();
        while unit.read_entry(&mut entry)? {
            let named = entry
                .attr_value(gimli::DW_AT_name)
                .and_then(|v| entry.read_unit.attr_string(v).ok())
                .is_some_and(|s| names.contains(&s.slice()));
            if named {
                unit.require_entry(entry.offset());
                units.push(unit.read_unit.header.offset());
            }
        }
    }
    let mut out = gimli::write::Dwarf::new();
    let mut convert = out.convert_with_filter(filter)?;
    while let Some((mut unit, root)) = convert.read_unit()? {
        // The other units' DIEs the probes refer to are kept, but not
        // their line programs (megabytes of them).
        if units.contains(&unit.read_unit.header.offset()) {
            unit.convert(root, convert_address)?;
        } else {
            let mut entry = root;
            while let Some(id) = unit.read_entry(&mut entry)? {
                if id.is_none() {
                    continue;
                }
                let id = unit.add_entry(id, &entry);
                for attr in entry.attrs.iter().filter(|a| {
                    !matches!(
                        a.name(),
                        gimli::DW_AT_decl_file | gimli::DW_AT_call_file | gimli::DW_AT_stmt_list
                    )
                }) {
                    let value =
                        unit.convert_attribute_value(entry.read_unit, attr, convert_address)?;
                    unit.unit.get_mut(id).set(attr.name(), value);
                }
            }
        }
    }
    Ok(out)
}

/// A mini ELF of `elf`: its program headers and section table (allocated
/// sections keep their addresses, their bytes are left out), the symbols
/// `keep` selects (as `table`, `.symtab` or `.dynsym`) and the given DWARF
/// sections. Returns the file and where its parts are.
pub fn mini_elf(
    elf: &Elf,
    table: &str,
    keep: &[Sym],
    dwarf: &[(String, Vec<u8>)],
) -> (Vec<u8>, BTreeMap<String, Range<usize>>) {
    let (symtab, strtab, first_global) = symbol_table(keep);
    let strtab_name = if table == ".dynsym" {
        ".dynstr"
    } else {
        ".strtab"
    };
    let mut sections = Vec::new();
    for s in &elf.shdrs {
        if s.name == ".gnu_debuglink" {
            // Else the symbolizer reads the system's separate debug file
            // instead of the input.
            let mut gone = OutSection::from_shdr(s, Some(Vec::new()));
            (gone.name, gone.ty) = (String::new(), 0);
            sections.push(gone);
            continue;
        }
        let data = if s.name == table {
            let mut out = OutSection::from_shdr(s, Some(symtab.clone()));
            out.info = first_global;
            sections.push(out);
            continue;
        } else if s.name == strtab_name {
            Some(strtab.clone())
        } else if s.name.starts_with(".debug_") {
            let new = dwarf.iter().find(|(n, _)| *n == s.name);
            Some(new.map(|(_, d)| d.clone()).unwrap_or_default())
        } else if s.name == ".shstrtab" || s.ty == 0 {
            Some(Vec::new())
        } else if s.flags & SHF_ALLOC != 0 {
            // Small ones (notes: the build ID) are read by symbolizers;
            // the big ones (code, data) only give addresses.
            (s.size <= 4096 && s.ty != SHT_NOBITS)
                .then(|| elf.bytes(s).map(<[u8]>::to_vec))
                .flatten()
        } else {
            // Small others (the debug link, comments) as they are.
            Some(
                elf.bytes(s)
                    .filter(|b| b.len() <= 4096)
                    .map(<[u8]>::to_vec)
                    .unwrap_or_default(),
            )
        };
        let mut out = OutSection::from_shdr(s, data);
        if s.name.starts_with(".debug_") {
            out.flags &= !SHF_COMPRESSED;
        }
        sections.push(out);
    }
    for (name, data) in dwarf {
        if !sections.iter().any(|s| s.name == *name) {
            sections.push(OutSection {
                name: name.clone(),
                ty: SHT_PROGBITS,
                flags: 0,
                addr: 0,
                link: 0,
                info: 0,
                align: 1,
                entsize: 0,
                data: Some(data.clone()),
                orig_offset: 0,
                orig_size: 0,
            });
        }
    }
    // A file with no symbol table of that name gets one.
    if !sections.iter().any(|s| s.name == table) {
        let strndx = sections.len() as u32 + 1;
        sections.push(OutSection {
            name: table.to_string(),
            ty: if table == ".dynsym" {
                SHT_DYNSYM
            } else {
                SHT_SYMTAB
            },
            flags: 0,
            addr: 0,
            link: strndx,
            info: first_global,
            align: 8,
            entsize: 24,
            data: Some(symtab),
            orig_offset: 0,
            orig_size: 0,
        });
        sections.push(OutSection {
            name: strtab_name.to_string(),
            ty: SHT_STRTAB,
            flags: 0,
            addr: 0,
            link: 0,
            info: 0,
            align: 1,
            entsize: 0,
            data: Some(strtab),
            orig_offset: 0,
            orig_size: 0,
        });
    }
    write_elf(&elf.data, &elf.phdrs, &sections)
}

// ---------------------------------------------------------------------------
// .eh_frame.

/// Where the code segments' file offsets are moved in a mini unwind object
/// (past the end of the file, so no query offset falls in the new data).
pub const UNWIND_SHIFT: u64 = 1 << 32;

/// A mini unwind object of `elf` with `count` of its FDEs (spread over the
/// address range, plus those covering `wanted` addresses), and the file
/// offsets (in the shifted code segments) of an address in each function.
pub fn mini_unwind(elf: &Elf, count: usize, wanted: &[u64]) -> Result<(Vec<u8>, Vec<u64>), String> {
    let hdr = elf.section(".eh_frame_hdr").ok_or("no .eh_frame_hdr")?;
    let eh = elf.section(".eh_frame").ok_or("no .eh_frame")?;
    let eh_bytes = elf.bytes(eh).ok_or(".eh_frame out of bounds")?;
    let section = gimli::EhFrame::new(eh_bytes, LittleEndian);
    let bases = gimli::BaseAddresses::default()
        .set_eh_frame(eh.addr)
        .set_eh_frame_hdr(hdr.addr);
    let pcrel_sdata4 = gimli::DW_EH_PE_pcrel.0 | gimli::DW_EH_PE_sdata4.0;

    // (initial address, length, FDE offset, CIE offset, has an LSDA pointer).
    let mut fdes = Vec::new();
    let mut entries = section.entries(&bases);
    while let Some(entry) = entries.next().map_err(|e| e.to_string())? {
        let gimli::CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(gimli::EhFrame::cie_from_offset) else {
            continue;
        };
        let cie = fde.cie();
        if cie.fde_address_encoding().map(|e| e.0) != Some(pcrel_sdata4)
            || fde.entry_len() >= 0xffff_fff0
            || cie.entry_len() >= 0xffff_fff0
        {
            continue;
        }
        // The LSDA pointer follows the FDE's augmentation data length (one
        // byte, 4) at 16.
        let lsda = match cie.lsda_encoding() {
            None => false,
            Some(e) if e.0 == pcrel_sdata4 => true,
            Some(_) => continue,
        };
        let fde_off = fde.offset();
        let cie_off = cie.offset();
        fdes.push((fde.initial_address(), fde.len(), fde_off, cie_off, lsda));
    }
    fdes.sort_by_key(|f| f.0);
    fdes.dedup_by_key(|f| f.0);
    if fdes.is_empty() {
        return Err("no usable FDE".into());
    }
    let mut chosen: Vec<usize> = (0..count.min(fdes.len()))
        .map(|i| i * fdes.len() / count.min(fdes.len()))
        .collect();
    for &w in wanted {
        if let Some(i) = fdes.iter().position(|f| (f.0..f.0 + f.1).contains(&w)) {
            chosen.push(i);
        }
    }
    chosen.sort_unstable();
    chosen.dedup();

    // The new .eh_frame_hdr goes at the old one's address, the new
    // .eh_frame right after it.
    let hdr_vaddr = hdr.addr;
    let hdr_len = 12 + 8 * chosen.len();
    let eh_vaddr = (hdr_vaddr + hdr_len as u64 + 7) & !7;
    let raw = |off: usize| -> Option<&[u8]> {
        let len = u32_at(eh_bytes, off)? as usize;
        eh_bytes.get(off..off + 4 + len)
    };
    let mut frame = Vec::new();
    let mut cies: BTreeMap<usize, usize> = BTreeMap::new();
    let mut table = Vec::new();
    for &i in &chosen {
        let (initial, _, fde_off, cie_off, lsda) = fdes[i];
        let new_cie = match cies.get(&cie_off) {
            Some(&at) => at,
            None => {
                let at = frame.len();
                frame.extend_from_slice(raw(cie_off).ok_or("CIE out of bounds")?);
                cies.insert(cie_off, at);
                at
            }
        };
        let mut bytes = raw(fde_off).ok_or("FDE out of bounds")?.to_vec();
        let new_off = frame.len();
        let old_vaddr = eh.addr + fde_off as u64;
        let new_vaddr = eh_vaddr + new_off as u64;
        // CIE pointer: distance back from the field to the CIE.
        bytes[4..8].copy_from_slice(&((new_off + 4 - new_cie) as u32).to_le_bytes());
        let lsda = lsda && bytes.get(16) == Some(&4);
        // pc-relative pointers move with the FDE.
        let mut fix = |at: usize, keep_zero: bool| {
            let Some(v) = u32_at(&bytes, at) else { return };
            if keep_zero && v == 0 {
                return;
            }
            let v = (v as i32 as i64 + old_vaddr as i64 - new_vaddr as i64) as i32;
            bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
        };
        fix(8, false);
        if lsda {
            fix(17, true);
        }
        frame.extend_from_slice(&bytes);
        table.push((
            (initial as i64 - hdr_vaddr as i64) as i32,
            (new_vaddr as i64 - hdr_vaddr as i64) as i32,
        ));
    }
    frame.extend_from_slice(&[0; 4]); // terminator
    let mut blob = vec![1u8, pcrel_sdata4, gimli::DW_EH_PE_udata4.0, 0x3b];
    blob.extend_from_slice(&((eh_vaddr as i64 - (hdr_vaddr as i64 + 4)) as i32).to_le_bytes());
    blob.extend_from_slice(&(table.len() as u32).to_le_bytes());
    for (a, b) in &table {
        blob.extend_from_slice(&a.to_le_bytes());
        blob.extend_from_slice(&b.to_le_bytes());
    }
    blob.resize((eh_vaddr - hdr_vaddr) as usize, 0);
    blob.extend_from_slice(&frame);

    let loads: Vec<&Phdr> = elf.phdrs.iter().filter(|p| p.ty == PT_LOAD).collect();
    let mut phdrs = Vec::new();
    let blob_at = 64 + 56 * (2 + loads.len() as u64);
    phdrs.push(Phdr {
        ty: PT_LOAD,
        flags: 4,
        offset: blob_at,
        vaddr: hdr_vaddr,
        paddr: hdr_vaddr,
        filesz: blob.len() as u64,
        memsz: blob.len() as u64,
        align: 8,
    });
    phdrs.push(Phdr {
        ty: PT_GNU_EH_FRAME,
        flags: 4,
        offset: blob_at,
        vaddr: hdr_vaddr,
        paddr: hdr_vaddr,
        filesz: hdr_len as u64,
        memsz: hdr_len as u64,
        align: 4,
    });
    for p in &loads {
        let mut p = (*p).clone();
        p.offset += UNWIND_SHIFT;
        phdrs.push(p);
    }
    let (mut out, _) = write_elf(&elf.data, &phdrs, &[]);
    assert_eq!(out.len() as u64, blob_at);
    out.extend_from_slice(&blob);

    // One address in each chosen function: its start, its middle, its end.
    let mut queries = Vec::new();
    for (k, &i) in chosen.iter().enumerate() {
        let (initial, len, ..) = fdes[i];
        let pc = initial + [0, len / 2, len.saturating_sub(1)][k % 3];
        if let Some(off) = elf.file_offset(pc) {
            queries.push(off + UNWIND_SHIFT);
        }
    }
    Ok((out, queries))
}

// ---------------------------------------------------------------------------
// Code.

/// `count` windows of `len` bytes of `.text`, each with the address of its
/// first byte (as if loaded at `base`).
pub fn code_windows(elf: &Elf, count: usize, len: usize, base: u64) -> Vec<(Vec<u8>, u64)> {
    let Some(text) = elf.section(".text") else {
        return Vec::new();
    };
    let Some(bytes) = elf.bytes(text) else {
        return Vec::new();
    };
    if bytes.len() < len {
        return Vec::new();
    }
    (0..count)
        .map(|i| {
            let at = (i * 7919 * 4099) % (bytes.len() - len);
            (bytes[at..at + len].to_vec(), base + text.addr + at as u64)
        })
        .collect()
}

/// The path of the libc this process maps.
pub fn libc_path() -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so") || p.contains("/libc-"))
        .map(str::to_string)
}

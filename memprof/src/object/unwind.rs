//! Unwinding through code without frame pointers (libc, Rust's std), with
//! the `.eh_frame` call-frame information every x86-64 object carries.
//!
//! Given a file and an instruction in it, [`Unwinder::rule`] says where
//! the caller's frame is: the canonical frame address (CFA) as the stack
//! or frame pointer plus an offset, the return address's place relative to
//! it, and where the frame pointer was saved. Lookups use the binary
//! search table of `.eh_frame_hdr` and are cached per instruction.

use std::{collections::HashMap, sync::Arc};

use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, EhFrameOffset, EndianSlice, LittleEndian, Pointer,
    RegisterRule, UnwindContext, UnwindSection, X86_64,
};

/// Which register the CFA is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    Sp,
    Bp,
}

/// How to find the caller of the frame executing one instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRule {
    pub base: Base,
    /// CFA = base register + this.
    pub cfa_offset: i64,
    /// The return address is at CFA + this.
    pub ra_offset: i64,
    /// The caller's frame pointer is saved at CFA + this (else unchanged).
    pub bp_offset: Option<i64>,
}

/// One loaded object's unwind data.
struct Object {
    data: Arc<[u8]>,
    /// (file offset, file size, vaddr) of each PT_LOAD segment.
    segments: Vec<(u64, u64, u64)>,
    /// `.eh_frame_hdr`: (file offset, size, vaddr).
    hdr: (usize, usize, u64),
}

/// Unwind data of the files seen, and rules per (file, offset).
#[derive(Default)]
pub struct Unwinder {
    objects: HashMap<Arc<str>, Option<Object>>,
    rules: HashMap<(Arc<str>, u64), Option<FrameRule>>,
}

impl std::fmt::Debug for Unwinder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unwinder")
            .field("objects", &self.objects.len())
            .field("rules", &self.rules.len())
            .finish()
    }
}

impl Unwinder {
    /// The frame rule at file offset `offset` of `path`, if its CFI says.
    pub fn rule(
        &mut self,
        files: &mut crate::process::files::FileCache,
        path: &Arc<str>,
        offset: u64,
    ) -> Option<FrameRule> {
        if let Some(r) = self.rules.get(&(path.clone(), offset)) {
            return *r;
        }
        let object = self
            .objects
            .entry(path.clone())
            .or_insert_with(|| Object::load(files.get(path)?));
        let rule = object.as_ref().and_then(|o| o.rule(offset));
        self.rules.insert((path.clone(), offset), rule);
        rule
    }
}

/// The frame rule at file offset `offset` of the object file whose bytes
/// are `data` (what [`Unwinder::rule`] computes, without the caches).
pub fn rule_in(data: &[u8], offset: u64) -> Option<FrameRule> {
    Object::load(Arc::from(data))?.rule(offset)
}

/// The virtual address of file offset `offset` of the object file whose
/// bytes are `data`.
pub fn vaddr_in(data: &[u8], offset: u64) -> Option<u64> {
    let (segments, _) = program_headers(data)?;
    let (off, _, vaddr) = segments
        .iter()
        .find(|(off, size, _)| offset >= *off && offset - off < *size)?;
    vaddr.checked_add(offset - off)
}

impl Object {
    fn load(data: Arc<[u8]>) -> Option<Self> {
        let (segments, hdr) = program_headers(&data)?;
        Some(Self {
            data,
            segments,
            hdr: hdr?,
        })
    }

    // The segments' numbers come from the file: the arithmetic on them is
    // checked.
    fn vaddr(&self, offset: u64) -> Option<u64> {
        let (off, _, vaddr) = self
            .segments
            .iter()
            .find(|(off, size, _)| offset >= *off && offset - off < *size)?;
        vaddr.checked_add(offset - off)
    }

    fn file_offset(&self, vaddr: u64) -> Option<(usize, usize)> {
        let (off, size, va) = self
            .segments
            .iter()
            .find(|(_, size, va)| vaddr >= *va && vaddr - va < *size)?;
        let start = usize::try_from(off.checked_add(vaddr - va)?).ok()?;
        let end = usize::try_from(off.checked_add(*size)?).ok()?;
        Some((start, end))
    }

    /// Runs `f` on the `.eh_frame_hdr` search table, with the
    /// `.eh_frame` section it indexes, its bases and its address.
    fn with_table<R>(
        &self,
        f: impl FnOnce(
            &HdrTable<'_>,
            &EhFrame<EndianSlice<'_, LittleEndian>>,
            &BaseAddresses,
            u64,
        ) -> Option<R>,
    ) -> Option<R> {
        let (hdr_off, hdr_size, hdr_vaddr) = self.hdr;
        let hdr_bytes = self.data.get(hdr_off..hdr_off.checked_add(hdr_size)?)?;
        let bases = BaseAddresses::default().set_eh_frame_hdr(hdr_vaddr);
        let parsed = EhFrameHdr::new(hdr_bytes, LittleEndian)
            .parse(&bases, 8)
            .ok()?;
        let Pointer::Direct(eh_vaddr) = parsed.eh_frame_ptr() else {
            return None;
        };
        let (eh_start, eh_end) = self.file_offset(eh_vaddr)?;
        let eh_frame = EhFrame::new(self.data.get(eh_start..eh_end)?, LittleEndian);
        let bases = bases.set_eh_frame(eh_vaddr);
        let table = parsed.table()?;
        // gimli 0.34's lookup multiplies the header's FDE count unchecked:
        // the entries (4 bytes or more each) must fit in the section.
        let fde_count = table.iter(&bases).size_hint().1?;
        if fde_count > hdr_bytes.len() / 4 {
            return None;
        }
        f(&table, &eh_frame, &bases, eh_vaddr)
    }

    /// Runs `f` on the FDE covering file offset `offset`, with the
    /// section and bases it reads with, and the offset's address.
    fn with_fde<R>(
        &self,
        offset: u64,
        f: impl FnOnce(
            &Fde<'_>,
            &EhFrame<EndianSlice<'_, LittleEndian>>,
            &BaseAddresses,
            u64,
        ) -> Option<R>,
    ) -> Option<R> {
        let address = self.vaddr(offset)?;
        self.with_table(|table, eh_frame, bases, eh_vaddr| {
            // Not `table.unwind_info_for_address`: gimli 0.34 subtracts
            // the `.eh_frame` address from the table's FDE address
            // unchecked (a panic with overflow checks when the FDE lies
            // below it).
            let Pointer::Direct(fde_vaddr) = table.lookup(address, bases).ok()? else {
                return None;
            };
            let fde = fde_at(eh_frame, bases, eh_vaddr, fde_vaddr)?;
            if !fde.contains(address) {
                return None;
            }
            f(&fde, eh_frame, bases, address)
        })
    }

    /// Every function's range of file offsets, from its FDE, sorted.
    fn function_ranges(&self) -> Option<Vec<(u64, u64)>> {
        self.with_table(|table, eh_frame, bases, eh_vaddr| {
            let mut ranges = Vec::new();
            let mut entries = table.iter(bases);
            while let Ok(Some((_, Pointer::Direct(fde_vaddr)))) = entries.next() {
                let Some(fde) = fde_at(eh_frame, bases, eh_vaddr, fde_vaddr) else {
                    continue;
                };
                let Some((start, _)) = self.file_offset(fde.initial_address()) else {
                    continue;
                };
                let start = start as u64;
                ranges.push((start, start.saturating_add(fde.len())));
            }
            ranges.sort_unstable();
            Some(ranges)
        })
    }

    fn rule(&self, offset: u64) -> Option<FrameRule> {
        self.with_fde(offset, |fde, eh_frame, bases, address| {
            frame_rule(fde, eh_frame, bases, address)
        })
    }
}

/// An FDE of `.eh_frame`, read from the file's bytes.
type Fde<'a> = gimli::FrameDescriptionEntry<EndianSlice<'a, LittleEndian>, usize>;

/// The search table of `.eh_frame_hdr`.
type HdrTable<'a> = gimli::EhHdrTable<'a, EndianSlice<'a, LittleEndian>>;

/// The FDE at address `fde_vaddr` of `.eh_frame` (at `eh_vaddr`).
fn fde_at<'a>(
    eh_frame: &EhFrame<EndianSlice<'a, LittleEndian>>,
    bases: &BaseAddresses,
    eh_vaddr: u64,
    fde_vaddr: u64,
) -> Option<Fde<'a>> {
    let fde_offset = usize::try_from(fde_vaddr.checked_sub(eh_vaddr)?).ok()?;
    eh_frame
        .fde_from_offset(
            bases,
            EhFrameOffset(fde_offset),
            EhFrame::<EndianSlice<LittleEndian>>::cie_from_offset,
        )
        .ok()
}

/// The frame rule at `address` from its FDE.
fn frame_rule(
    fde: &Fde<'_>,
    eh_frame: &EhFrame<EndianSlice<'_, LittleEndian>>,
    bases: &BaseAddresses,
    address: u64,
) -> Option<FrameRule> {
    let mut ctx: UnwindContext<usize> = UnwindContext::new();
    let row = fde
        .unwind_info_for_address(eh_frame, bases, &mut ctx, address)
        .ok()?;
    let (base, cfa_offset) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } if *register == X86_64::RSP => {
            (Base::Sp, *offset)
        }
        CfaRule::RegisterAndOffset { register, offset } if *register == X86_64::RBP => {
            (Base::Bp, *offset)
        }
        _ => return None,
    };
    let RegisterRule::Offset(ra_offset) = row.register(X86_64::RA)? else {
        return None;
    };
    let bp_offset = match row.register(X86_64::RBP) {
        Some(RegisterRule::Offset(o)) => Some(o),
        _ => None,
    };
    Some(FrameRule {
        base,
        cfa_offset,
        ra_offset,
        bp_offset,
    })
}

/// The functions of one object file as its call-frame information gives
/// them: every function the compiler emitted has an FDE with its range,
/// in a stripped file too, where no symbol names it. Only the ranges are
/// kept, not the file.
pub struct Functions(Vec<(u64, u64)>);

impl Functions {
    /// From the file's bytes; knows no function if they are no ELF file
    /// with `.eh_frame_hdr`.
    pub fn of(data: &[u8]) -> Self {
        let ranges = Object::load(Arc::from(data)).and_then(|o| o.function_ranges());
        Self(ranges.unwrap_or_default())
    }

    /// The file offset where the function holding file offset `offset`
    /// starts, if an FDE covers it.
    pub fn start_of(&self, offset: u64) -> Option<u64> {
        let after = self.0.partition_point(|&(start, _)| start <= offset);
        let (start, end) = *self.0.get(after.checked_sub(1)?)?;
        (offset < end).then_some(start)
    }
}

/// PT_LOAD segments and PT_GNU_EH_FRAME of a 64-bit little-endian ELF.
#[allow(clippy::type_complexity)]
fn program_headers(data: &[u8]) -> Option<(Vec<(u64, u64, u64)>, Option<(usize, usize, u64)>)> {
    if data.get(..4)? != b"\x7fELF" || *data.get(4)? != 2 || *data.get(5)? != 1 {
        return None;
    }
    // Fields at fixed offsets of a slice known to be long enough.
    let u16_at =
        |d: &[u8], at: usize| Some(u16::from_le_bytes(d.get(at..at + 2)?.try_into().ok()?));
    let u32_at =
        |d: &[u8], at: usize| Some(u32::from_le_bytes(d.get(at..at + 4)?.try_into().ok()?));
    let u64_at =
        |d: &[u8], at: usize| Some(u64::from_le_bytes(d.get(at..at + 8)?.try_into().ok()?));
    let phoff = usize::try_from(u64_at(data, 0x20)?).ok()?;
    let phentsize = usize::from(u16_at(data, 0x36)?);
    let phnum = usize::from(u16_at(data, 0x38)?);
    // Entries smaller than an `Elf64_Phdr` would overlap: 65535 of them
    // fit in a few bytes, and each query would search them all.
    if phentsize < 0x38 {
        return None;
    }
    let mut segments = Vec::new();
    let mut hdr = None;
    for i in 0..phnum {
        let at = phoff.checked_add(i * phentsize)?;
        let ph = data.get(at..)?.get(..0x28)?;
        let (ty, offset, vaddr, filesz) = (
            u32_at(ph, 0)?,
            u64_at(ph, 8)?,
            u64_at(ph, 0x10)?,
            u64_at(ph, 0x20)?,
        );
        match ty {
            1 => segments.push((offset, filesz, vaddr)),
            0x6474_e550 => {
                hdr = Some((
                    usize::try_from(offset).ok()?,
                    usize::try_from(filesz).ok()?,
                    vaddr,
                ))
            }
            _ => {}
        }
    }
    Some((segments, hdr))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64-bit little-endian ELF header and program headers, each
    /// (type, file offset, vaddr, file size), followed by `tail`.
    fn elf(phdrs: &[(u32, u64, u64, u64)], phoff: u64, tail: &[u8]) -> Vec<u8> {
        let mut d = vec![0u8; 64];
        d[..6].copy_from_slice(b"\x7fELF\x02\x01");
        d[0x20..0x28].copy_from_slice(&phoff.to_le_bytes());
        d[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        d[0x38..0x3a].copy_from_slice(&(phdrs.len() as u16).to_le_bytes());
        for &(ty, offset, vaddr, filesz) in phdrs {
            let mut p = [0u8; 56];
            p[0..4].copy_from_slice(&ty.to_le_bytes());
            p[8..16].copy_from_slice(&offset.to_le_bytes());
            p[16..24].copy_from_slice(&vaddr.to_le_bytes());
            p[32..40].copy_from_slice(&filesz.to_le_bytes());
            d.extend_from_slice(&p);
        }
        d.extend_from_slice(tail);
        d
    }

    /// Found by fuzzing: offsets and sizes near 2^64 in the program
    /// headers overflowed the arithmetic on them.
    #[test]
    fn huge_program_header_numbers_give_no_rule() {
        // Program headers said to be at the end of the address space.
        assert_eq!(
            rule_in(&elf(&[(1, 0, 0, 0x1000)], u64::MAX - 8, &[]), 0),
            None
        );
        // A segment whose file range wraps.
        let wraps = elf(
            &[(1, u64::MAX - 8, 0, 0x1000), (0x6474_e550, 0, 0, 8)],
            64,
            &[],
        );
        assert_eq!(rule_in(&wraps, u64::MAX - 4), None);
        // `.eh_frame_hdr` said to end past 2^64, in a sane segment.
        let hdr = elf(&[(1, 0, 0, 0x1000), (0x6474_e550, 8, 8, u64::MAX)], 64, &[]);
        assert_eq!(rule_in(&hdr, 0), None);
    }

    /// Found by fuzzing: an FDE count near 2^64 in `.eh_frame_hdr` made
    /// gimli's table lookup overflow.
    #[test]
    fn a_huge_fde_count_gives_no_rule() {
        const H: i32 = 64 + 2 * 56;
        let mut hdr = vec![1u8, 0x1b, 0x04, 0x3b]; // count: udata8
        hdr.extend_from_slice(&(24 - 4i32).to_le_bytes()); // .eh_frame at H + 24
        hdr.extend_from_slice(&u64::MAX.to_le_bytes());
        hdr.extend_from_slice(&(-H).to_le_bytes());
        hdr.extend_from_slice(&24i32.to_le_bytes());
        hdr.extend_from_slice(&[0; 8]);
        let len = (H as usize + hdr.len()) as u64;
        let data = elf(
            &[(1, 0, 0, len), (0x6474_e550, H as u64, H as u64, 24)],
            64,
            &hdr,
        );
        assert_eq!(rule_in(&data, 0), None);
    }

    /// Found by fuzzing (a slow input): with a program header size of 0,
    /// one header read 65535 times made 65535 segments to search.
    #[test]
    fn overlapping_program_headers_are_refused() {
        let mut data = elf(&[(1, 0, 0, 0x1000), (0x6474_e550, 0, 0, 8)], 64, &[]);
        assert!(program_headers(&data).is_some());
        data[0x36..0x38].copy_from_slice(&0u16.to_le_bytes());
        data[0x38..0x3a].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(program_headers(&data).is_none());
    }

    /// Found by fuzzing: an `.eh_frame_hdr` table entry pointing below
    /// `.eh_frame` made gimli's unchecked subtraction overflow.
    #[test]
    fn a_table_entry_below_eh_frame_gives_no_rule() {
        // One segment mapping the whole file at vaddr 0; the header at
        // H = 176, `.eh_frame` at H + 20 and its (unused) table entry for
        // address 0 pointing 16 bytes below it.
        const H: i32 = 64 + 2 * 56;
        let mut hdr = vec![1u8, 0x1b, 0x03, 0x3b];
        hdr.extend_from_slice(&(20 - 4i32).to_le_bytes()); // pcrel: H + 20
        hdr.extend_from_slice(&1u32.to_le_bytes());
        hdr.extend_from_slice(&(-H).to_le_bytes()); // address 0
        hdr.extend_from_slice(&4i32.to_le_bytes()); // H + 4 < H + 20
        hdr.extend_from_slice(&[0; 8]);
        let len = (H as usize + hdr.len()) as u64;
        let data = elf(
            &[(1, 0, 0, len), (0x6474_e550, H as u64, H as u64, 20)],
            64,
            &hdr,
        );
        assert_eq!(data.len() as u64, len);
        assert_eq!(rule_in(&data, 0), None);
    }

    /// This test binary has CFI: somewhere in its text, a rule exists, and
    /// at a function's first instruction the return address is at the
    /// stack pointer (CFA = rsp + 8, RA at CFA - 8).
    #[test]
    fn rules_at_function_entry_point_at_the_return_address() {
        let exe: Arc<str> = Arc::from(std::env::current_exe().unwrap().to_str().unwrap());
        let maps = crate::process::maps::ProcMaps::read(std::process::id()).unwrap();
        let f = rules_at_function_entry_point_at_the_return_address as *const () as u64;
        let m = maps.find(f).unwrap();
        let offset = f - m.start + m.offset;
        let (mut u, mut files) = (
            Unwinder::default(),
            crate::process::files::FileCache::default(),
        );
        let rule = u
            .rule(&mut files, &exe, offset)
            .expect("CFI at this function");
        assert_eq!(
            rule,
            FrameRule {
                base: Base::Sp,
                cfa_offset: 8,
                ra_offset: -8,
                bp_offset: None,
            }
        );
        assert_eq!(u.rule(&mut files, &Arc::from("/nonexistent"), 0), None);
    }
}

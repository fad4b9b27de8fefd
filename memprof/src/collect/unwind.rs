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
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, EndianSlice, LittleEndian, Pointer, RegisterRule,
    UnwindContext, UnwindSection, X86_64,
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
        files: &mut super::code::FileCache,
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

impl Object {
    fn load(data: Arc<[u8]>) -> Option<Self> {
        let (segments, hdr) = program_headers(&data)?;
        Some(Self {
            data,
            segments,
            hdr: hdr?,
        })
    }

    fn vaddr(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|(off, size, _)| (*off..off + size).contains(&offset))
            .map(|(off, _, vaddr)| offset - off + vaddr)
    }

    fn file_offset(&self, vaddr: u64) -> Option<(usize, usize)> {
        self.segments
            .iter()
            .find(|(_, size, va)| (*va..va + size).contains(&vaddr))
            .map(|(off, size, va)| {
                let start = (vaddr - va + off) as usize;
                (start, (off + size) as usize)
            })
    }

    fn rule(&self, offset: u64) -> Option<FrameRule> {
        let address = self.vaddr(offset)?;
        let (hdr_off, hdr_size, hdr_vaddr) = self.hdr;
        let hdr_bytes = self.data.get(hdr_off..hdr_off + hdr_size)?;
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
        let mut ctx: UnwindContext<usize> = UnwindContext::new();
        let row = table
            .unwind_info_for_address(
                &eh_frame,
                &bases,
                &mut ctx,
                address,
                EhFrame::<EndianSlice<LittleEndian>>::cie_from_offset,
            )
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
}

/// PT_LOAD segments and PT_GNU_EH_FRAME of a 64-bit little-endian ELF.
#[allow(clippy::type_complexity)]
fn program_headers(data: &[u8]) -> Option<(Vec<(u64, u64, u64)>, Option<(usize, usize, u64)>)> {
    if data.get(..4)? != b"\x7fELF" || *data.get(4)? != 2 || *data.get(5)? != 1 {
        return None;
    }
    let u16_at = |at: usize| Some(u16::from_le_bytes(data.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?));
    let phoff = u64_at(0x20)? as usize;
    let phentsize = u16_at(0x36)? as usize;
    let phnum = u16_at(0x38)? as usize;
    let mut segments = Vec::new();
    let mut hdr = None;
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        let (ty, offset, vaddr, filesz) = (
            u32_at(ph)?,
            u64_at(ph + 8)?,
            u64_at(ph + 0x10)?,
            u64_at(ph + 0x20)?,
        );
        match ty {
            1 => segments.push((offset, filesz, vaddr)),
            0x6474_e550 => hdr = Some((offset as usize, filesz as usize, vaddr)),
            _ => {}
        }
    }
    Some((segments, hdr))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary has CFI: somewhere in its text, a rule exists, and
    /// at a function's first instruction the return address is at the
    /// stack pointer (CFA = rsp + 8, RA at CFA - 8).
    #[test]
    fn rules_at_function_entry_point_at_the_return_address() {
        let exe: Arc<str> = Arc::from(std::env::current_exe().unwrap().to_str().unwrap());
        let maps = crate::collect::procmaps::ProcMaps::read(std::process::id()).unwrap();
        let f = rules_at_function_entry_point_at_the_return_address as *const () as u64;
        let m = maps.find(f).unwrap();
        let offset = f - m.start + m.offset;
        let (mut u, mut files) = (
            Unwinder::default(),
            crate::collect::code::FileCache::default(),
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

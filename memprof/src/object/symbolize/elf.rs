//! The one ELF fact blazesym does not hand us: how the file's virtual
//! addresses relate to its file offsets, needed to turn a runtime data
//! address (which may lie in `.bss`, past the file's end) into an ELF
//! virtual address.

use std::{fs::File, io::Read, path::Path};

const PT_LOAD: u32 = 1;

/// `p_vaddr - p_offset` (page-aligned) of the first `PT_LOAD` segment of a
/// 64-bit little-endian ELF file: 0 for PIE executables and shared
/// libraries, the link address (e.g. 0x400000) for fixed executables.
/// (The symbolizer reads the whole [`load_layout`]; tests ask this.)
#[cfg(test)]
pub fn first_load_bias(path: &Path) -> std::io::Result<u64> {
    load_layout(path).map(|l| l.bias)
}

/// How a file's loadable segments lie in its own addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadLayout {
    /// See [`first_load_bias`].
    pub bias: u64,
    /// The end of the highest segment in memory (`p_vaddr + p_memsz`,
    /// `.bss` included): an address at or past it is not the file's.
    pub end: u64,
}

/// The [`LoadLayout`] of a 64-bit little-endian ELF file.
pub fn load_layout(path: &Path) -> std::io::Result<LoadLayout> {
    let mut header = [0u8; 64];
    let mut file = File::open(path)?;
    file.read_exact(&mut header)?;
    let (phoff, size) = program_headers_at(&header, file.metadata()?.len())?;
    let mut phdrs = vec![0u8; size];
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(phoff))?;
    file.read_exact(&mut phdrs)?;
    parse(&header, &phdrs)
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// The file offset and size of the program headers, which must lie in
/// the file: the header's counts alone would allow 4 GiB.
fn program_headers_at(header: &[u8; 64], file_len: u64) -> std::io::Result<(u64, usize)> {
    let phoff = u64::from_le_bytes(header[0x20..0x28].try_into().unwrap_or_default());
    let phentsize = u64::from(u16::from_le_bytes([header[0x36], header[0x37]]));
    let phnum = u64::from(u16::from_le_bytes([header[0x38], header[0x39]]));
    let size = phentsize * phnum;
    match phoff.checked_add(size) {
        Some(end) if end <= file_len => {
            Ok((phoff, usize::try_from(size).map_err(|_| bad("too large"))?))
        }
        _ => Err(bad("program headers past the end of the file")),
    }
}

fn parse(header: &[u8; 64], phdrs: &[u8]) -> std::io::Result<LoadLayout> {
    if &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return Err(bad("not a 64-bit little-endian ELF file"));
    }
    let phentsize = u16::from_le_bytes([header[0x36], header[0x37]]) as usize;
    if phentsize < 56 {
        return Err(bad("bad program header size"));
    }
    let field =
        |ph: &[u8], at: usize| u64::from_le_bytes(ph[at..at + 8].try_into().unwrap_or_default());
    let mut layout: Option<LoadLayout> = None;
    for ph in phdrs.chunks_exact(phentsize) {
        let p_type = u32::from_le_bytes(ph[0..4].try_into().unwrap_or_default());
        if p_type != PT_LOAD {
            continue;
        }
        let (p_offset, p_vaddr, p_memsz) = (field(ph, 8), field(ph, 16), field(ph, 40));
        let end = p_vaddr.saturating_add(p_memsz);
        match &mut layout {
            Some(l) => l.end = l.end.max(end),
            None => {
                const PAGE: u64 = 4096;
                let bias = (p_vaddr & !(PAGE - 1)).wrapping_sub(p_offset & !(PAGE - 1));
                layout = Some(LoadLayout { bias, end });
            }
        }
    }
    layout.ok_or_else(|| bad("no loadable segment"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elf(phdrs: &[(u32, u64, u64)]) -> ([u8; 64], Vec<u8>) {
        elf_sized(
            &phdrs
                .iter()
                .map(|&(t, o, v)| (t, o, v, 0))
                .collect::<Vec<_>>(),
        )
    }

    /// Program headers (type, offset, vaddr, memsz).
    fn elf_sized(phdrs: &[(u32, u64, u64, u64)]) -> ([u8; 64], Vec<u8>) {
        let mut h = [0u8; 64];
        h[..6].copy_from_slice(b"\x7fELF\x02\x01");
        h[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        h[0x38..0x3a].copy_from_slice(&(phdrs.len() as u16).to_le_bytes());
        let mut p = Vec::new();
        for &(ty, off, vaddr, memsz) in phdrs {
            let mut e = [0u8; 56];
            e[0..4].copy_from_slice(&ty.to_le_bytes());
            e[8..16].copy_from_slice(&off.to_le_bytes());
            e[16..24].copy_from_slice(&vaddr.to_le_bytes());
            e[40..48].copy_from_slice(&memsz.to_le_bytes());
            p.extend_from_slice(&e);
        }
        (h, p)
    }

    #[test]
    fn pie_and_fixed_executables() {
        let (h, p) = elf(&[(6, 0x40, 0x40), (PT_LOAD, 0, 0)]);
        assert_eq!(parse(&h, &p).unwrap().bias, 0);
        let (h, p) = elf(&[(PT_LOAD, 0, 0x400000)]);
        assert_eq!(parse(&h, &p).unwrap().bias, 0x400000);
        // The end is the highest segment's in memory, its .bss included.
        let (h, p) = elf_sized(&[
            (PT_LOAD, 0, 0x400000, 0x1000),
            (PT_LOAD, 0x2f28, 0x403f28, 0x9000),
        ]);
        assert_eq!(
            parse(&h, &p).unwrap(),
            LoadLayout {
                bias: 0x400000,
                end: 0x40cf28
            }
        );
        let (h, p) = elf(&[]);
        assert!(parse(&h, &p).is_err());
        let (mut h, p) = elf(&[(PT_LOAD, 0, 0)]);
        h[4] = 1;
        assert!(parse(&h, &p).is_err(), "32-bit rejected");
    }

    /// Found by fuzzing: the program header table's size was allocated
    /// as the header said, up to 65535 * 65535 bytes, before reading it.
    #[test]
    fn program_headers_must_lie_in_the_file() {
        let (mut h, _) = elf(&[]);
        h[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        h[0x36..0x38].copy_from_slice(&u16::MAX.to_le_bytes());
        h[0x38..0x3a].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(program_headers_at(&h, 1 << 20).is_err());
        h[0x20..0x28].copy_from_slice(&u64::MAX.to_le_bytes());
        h[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        assert!(
            program_headers_at(&h, u64::MAX).is_err(),
            "offset + size wraps"
        );
        let (mut h, _) = elf(&[(PT_LOAD, 0, 0)]);
        h[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        assert_eq!(program_headers_at(&h, 120).unwrap(), (64, 56));
        assert!(program_headers_at(&h, 119).is_err());
    }

    #[test]
    fn reads_a_real_file() {
        let exe = std::env::current_exe().unwrap();
        assert!(first_load_bias(&exe).is_ok());
        assert!(first_load_bias(Path::new("/nonexistent")).is_err());
    }
}

//! Names for the PLT's stubs (`malloc@plt`), which have no symbol: a
//! sample in one was named after the symbol before it, `_init` (`.init`
//! ends where `.plt` begins), so a program's calls into a library looked
//! like time in its start-up code. Stub `i` jumps through the GOT slot of
//! `.rela.plt`'s entry `i`: in `.plt.sec` at `16 × i` when the file has
//! one (IBT), else in `.plt` at `16 × (i + 1)` (entry 0 is the resolver's).

use std::ops::Range;

use object::{Object, ObjectSection, ObjectSymbol};

/// The size of a PLT stub on x86-64.
const STUB: u64 = 16;
/// Bytes of one `Elf64_Rela`.
const RELA: usize = 24;

/// One stub: its virtual addresses and the function it calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stub {
    pub at: Range<u64>,
    pub name: String,
}

/// The stubs of the ELF file `data` (none when it has no PLT or is not
/// one); `name@plt` for stub `i` calling `names[i]`.
pub fn stubs_of(data: &[u8]) -> Vec<Stub> {
    let Ok(file) = object::File::parse(data) else {
        return Vec::new();
    };
    let range = |name: &str| {
        let s = file.section_by_name(name)?;
        Some(s.address()..s.address().checked_add(s.size())?)
    };
    let Some(rela) = file
        .section_by_name(".rela.plt")
        .and_then(|s| s.data().ok())
    else {
        return Vec::new();
    };
    let symbols: std::collections::HashMap<usize, &str> = file
        .dynamic_symbols()
        .filter_map(|s| Some((s.index().0, s.name().ok()?)))
        .collect();
    let names: Vec<Option<&str>> = rela
        .chunks_exact(RELA)
        .map(|r| {
            let info = u64::from_le_bytes(r[8..16].try_into().unwrap_or_default());
            symbols.get(&((info >> 32) as usize)).copied()
        })
        .collect();
    stubs(range(".plt"), range(".plt.sec"), &names)
}

/// The stubs laid out in `plt` or, when present, `plt_sec`, for the
/// functions `names` (in `.rela.plt` order; None: no name, no stub).
pub fn stubs(
    plt: Option<Range<u64>>,
    plt_sec: Option<Range<u64>>,
    names: &[Option<&str>],
) -> Vec<Stub> {
    let (section, first) = match (plt_sec, plt) {
        (Some(sec), _) => (sec, 0),
        (None, Some(plt)) => (plt, 1),
        (None, None) => return Vec::new(),
    };
    names
        .iter()
        .enumerate()
        .filter_map(|(i, name)| {
            let start = section
                .start
                .checked_add((i as u64 + first).checked_mul(STUB)?)?;
            let end = start.checked_add(STUB)?;
            let name = (*name)?;
            (end <= section.end).then(|| Stub {
                at: start..end,
                name: format!("{name}@plt"),
            })
        })
        .collect()
}

/// The stub of `stubs` at virtual address `vaddr`.
pub fn stub_at(stubs: &[Stub], vaddr: u64) -> Option<&str> {
    stubs
        .iter()
        .find(|s| s.at.contains(&vaddr))
        .map(|s| s.name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stubs_follow_the_resolver_in_plt_or_start_plt_sec() {
        let names = [Some("free"), None, Some("malloc")];
        let lazy = stubs(Some(0x1020..0x1060), None, &names);
        assert_eq!(
            lazy,
            vec![
                Stub {
                    at: 0x1030..0x1040,
                    name: "free@plt".into()
                },
                Stub {
                    at: 0x1050..0x1060,
                    name: "malloc@plt".into()
                },
            ]
        );
        assert_eq!(stub_at(&lazy, 0x1020), None, "the resolver's entry");
        assert_eq!(stub_at(&lazy, 0x103f), Some("free@plt"));
        let ibt = stubs(Some(0x1020..0x1060), Some(0x1060..0x1090), &names);
        assert_eq!(stub_at(&ibt, 0x1060), Some("free@plt"));
        assert_eq!(stub_at(&ibt, 0x1080), Some("malloc@plt"));
        let short = stubs(Some(0x1020..0x1040), None, &names);
        assert_eq!(short.len(), 1, "no stub past the section's end");
        assert!(stubs(None, None, &names).is_empty());
    }

    #[test]
    fn a_file_that_is_not_elf_has_no_stubs() {
        assert!(stubs_of(b"not an ELF file").is_empty());
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        for s in stubs_of(&exe) {
            assert!(s.name.ends_with("@plt") && s.at.end - s.at.start == STUB);
        }
    }
}

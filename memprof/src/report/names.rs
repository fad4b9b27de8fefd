//! How report assembly names code and data. The [`Symbolizer`] reads the
//! target's object files; tests name places from a table instead.

use std::sync::Arc;

use crate::{
    object::symbolize::{dwarf::Layout, typed::AccessType, DataSymbol, Frame, Inlined, Symbolizer},
    process::maps::{short_name, Place, ProcMaps},
    report::model::{CallerRef, CodeRef},
};

/// A global by its symbol (`g_table`, `g_tables+0x10`), else by its file
/// and address (`sysbench+0x5c9e8`).
pub fn global_name(maps: &ProcMaps, names: &mut dyn Names, addr: u64) -> Option<String> {
    let (path, base) = maps.data_owner(addr)?;
    match names.data(&path, base, addr) {
        Some(sym) if sym.offset == 0 => Some(sym.name),
        Some(sym) => Some(format!("{}+{:#x}", sym.name, sym.offset)),
        None => names.file_address(&path, base, addr),
    }
}

/// Files listed by path in [`stripped_note`] before "...".
const STRIPPED_LISTED: usize = 3;

/// What the report says when code or data of `files` (paths) was named by
/// address because they have no symbols and no debug file was found
/// (`debuginfod`: whether servers were asked too), and how to get names.
pub fn stripped_note(files: &[Arc<str>], debuginfod: bool) -> Option<String> {
    let first = files.first()?;
    let mut listed: Vec<&str> = files.iter().take(STRIPPED_LISTED).map(|f| &**f).collect();
    if files.len() > STRIPPED_LISTED {
        listed.push("...");
    }
    let (looked, get) = if debuginfod {
        (
            "in the debug directories or on the debuginfod servers",
            "name a debuginfod server that has them in DEBUGINFOD_URLS",
        )
    } else {
        (
            "in the debug directories; DEBUGINFOD_URLS is not set",
            "set DEBUGINFOD_URLS (sudo DEBUGINFOD_URLS=https://debuginfod.debian.net \
             memprof-ebpf ...)",
        )
    };
    let example = short_name(first);
    Some(format!(
        "{NO_SYMBOLS} {} (looked {looked}): code and data there are named by address in the \
         file ({example}+0x...), as `addr2line -f -e`, `nm` and `gdb` place them; install the \
         debug symbols (Debian: the package's -dbgsym, from the debug archive) or {get} to \
         name them",
        listed.join(", ")
    ))
}

/// How [`stripped_note`] begins.
pub const NO_SYMBOLS: &str = "no symbol table or debug file for";

/// Names of code places and data addresses.
pub trait Names {
    /// The function and source line at a code place.
    fn code(&mut self, place: &Place) -> Frame;

    /// The innermost function at a code place and its own source line:
    /// for code inlined into its caller, the inlined function.
    fn code_innermost(&mut self, place: &Place) -> Frame {
        self.code_inlined(place).frame
    }

    /// The innermost function at a code place, with the callers it was
    /// inlined into: what an allocation site is named by.
    fn code_inlined(&mut self, place: &Place) -> Inlined;

    /// The global or static variable holding `addr`, in the object file
    /// `path` whose file offset 0 is at `file_base`.
    fn data(&mut self, path: &Arc<str>, file_base: u64, addr: u64) -> Option<DataSymbol>;

    /// The layout of global `name` of `path`, from its debug info.
    fn data_layout(&mut self, path: &Arc<str>, name: &str) -> Option<Layout>;

    /// `addr` as an address of the object file `path` (mapped with file
    /// offset 0 at `file_base`): what `nm` and `gdb` call it, for data no
    /// symbol covers. Taken as the offset in the file where the file's
    /// own addresses are not known (tests; a position-independent file's
    /// are the same).
    fn link_address(&mut self, _path: &Arc<str>, file_base: u64, addr: u64) -> Option<u64> {
        addr.checked_sub(file_base)
    }

    /// Data no symbol covers, named as `nm` and `gdb` place it once
    /// debug symbols are at hand: the object file and its own address
    /// (`stress-ng+0x83e140`, a stripped program's global). None past
    /// the file's last segment, where the file holds nothing.
    fn file_address(&mut self, path: &Arc<str>, file_base: u64, addr: u64) -> Option<String> {
        let at = self.link_address(path, file_base, addr)?;
        Some(format!("{}+{at:#x}", short_name(path)))
    }

    /// The layout of what a pointer declared at `file:line` of `path`
    /// points to, from its debug info (the element of a heap block
    /// allocated on that line).
    fn pointee_layout(&mut self, _path: &Arc<str>, _file: &str, _line: u32) -> Option<Layout> {
        None
    }

    /// The type of the memory the instruction at `place` accesses, from
    /// the debug info of the pointer it goes through.
    fn access_type(&mut self, _place: &Place) -> Option<AccessType> {
        None
    }

    /// The type of what the first argument of the call at `site` (a call
    /// chain's frame) points to, from the debug info of the pointer it
    /// was made from (a lock call's `&t->lock`).
    fn argument_type(&mut self, _site: &Place) -> Option<AccessType> {
        None
    }
}

impl Names for Symbolizer {
    fn code(&mut self, place: &Place) -> Frame {
        Symbolizer::code(self, place)
    }

    fn code_innermost(&mut self, place: &Place) -> Frame {
        Symbolizer::code_innermost(self, place)
    }

    fn code_inlined(&mut self, place: &Place) -> Inlined {
        Symbolizer::code_inlined(self, place).clone()
    }

    fn data(&mut self, path: &Arc<str>, file_base: u64, addr: u64) -> Option<DataSymbol> {
        Symbolizer::data(self, path, file_base, addr)
    }

    fn data_layout(&mut self, path: &Arc<str>, name: &str) -> Option<Layout> {
        Symbolizer::data_layout(self, path, name)
    }

    fn link_address(&mut self, path: &Arc<str>, file_base: u64, addr: u64) -> Option<u64> {
        Symbolizer::link_address(self, path, file_base, addr)
    }

    fn file_address(&mut self, path: &Arc<str>, file_base: u64, addr: u64) -> Option<String> {
        Symbolizer::file_address(self, path, file_base, addr)
    }

    fn pointee_layout(&mut self, path: &Arc<str>, file: &str, line: u32) -> Option<Layout> {
        Symbolizer::pointee_layout(self, path, file, line)
    }

    fn access_type(&mut self, place: &Place) -> Option<AccessType> {
        Symbolizer::access_type(self, place)
    }

    fn argument_type(&mut self, site: &Place) -> Option<AccessType> {
        Symbolizer::argument_type(self, site)
    }
}

/// The callers a place was inlined into, for the report.
pub fn callers(chain: &Inlined) -> Vec<CallerRef> {
    chain
        .inlined_into
        .iter()
        .map(|f| CallerRef {
            function: f.function.clone(),
            file: f.file.clone(),
            line: f.line,
        })
        .collect()
}

/// A place at its innermost function, with its inline chain.
pub fn code_ref(chain: &Inlined) -> CodeRef {
    CodeRef {
        function: chain.frame.function.clone(),
        file: chain.frame.file.clone(),
        line: chain.frame.line,
        inlined_into: callers(chain),
        via: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stripped_note_lists_the_files_and_how_to_name_them() {
        assert_eq!(stripped_note(&[], false), None);
        let files: Vec<Arc<str>> = ["/usr/bin/stress-ng", "/a/b", "/c", "/d"]
            .into_iter()
            .map(Arc::from)
            .collect();
        let note = stripped_note(&files[..1], false).expect("a note");
        let want = "no symbol table or debug file for /usr/bin/stress-ng (looked in the debug \
                    directories; DEBUGINFOD_URLS is not set): ";
        assert!(note.starts_with(want), "{note}");
        assert!(note.contains("(stress-ng+0x...)"), "{note}");
        let note = stripped_note(&files, true).expect("a note");
        let want = "/usr/bin/stress-ng, /a/b, /c, ... (looked in the debug directories or on \
                    the debuginfod servers)";
        assert!(note.contains(want), "{note}");
        assert!(note.contains("or name a debuginfod server"), "{note}");
    }
}

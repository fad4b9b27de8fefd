//! Symbolization: code and data addresses of the target to names.
//!
//! Addresses arrive already translated to (file, offset) by
//! [`crate::process::maps`], so this works after the target has exited.
//! A failure to symbolize is data on the frame (`module+0xoffset`), never an
//! error: stripped binaries, deleted files and JIT code all still show up.

#[cfg(test)]
pub(crate) mod c_tests;
mod demangle;
pub mod dwarf;
mod elf;
mod members;
pub mod plt;
pub mod returns;
pub mod typed;
#[cfg(test)]
mod typed_tests;

use std::{collections::HashMap, path::PathBuf, sync::Arc};

use blazesym::symbolize::{
    source::{Elf, Source},
    Input, Symbolized, Symbolizer as Blazesym,
};

use crate::object::{debugfile, debuginfod, unwind::Functions};
use crate::process::{
    files::MAX_FILE,
    maps::{short_name, Place},
    objects::open_path,
};

/// A code location, as shown to the user.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    /// Demangled function name, or `module+0xoffset` when unknown.
    pub function: String,
    /// File name of the object (`libc.so.6`, `prog`), or a `[region]`.
    pub module: String,
    /// Source file (full path as recorded in the debug info).
    pub file: Option<String>,
    pub line: Option<u32>,
}

impl Frame {
    /// The pseudo-frame for samples taken in the kernel.
    pub fn kernel() -> Self {
        Self {
            function: "[kernel]".into(),
            module: "[kernel]".into(),
            file: None,
            line: None,
        }
    }

    /// How an allocation site is named in an object's name: `file:line`
    /// when the debug info says; else the function and its object, or
    /// the place in the object (`memcached+0x19a54`, a file offset, as
    /// call chains show code without symbols), never the object alone.
    pub fn site_label(&self) -> String {
        if self.line.is_some() || self.function.is_empty() {
            return crate::report::model::source_label(
                self.file.as_deref(),
                self.line,
                &self.module,
            );
        }
        if self.function.starts_with(&format!("{}+0x", self.module)) {
            self.function.clone()
        } else {
            format!("{} ({})", self.function, self.module)
        }
    }

    /// What we can say about a place without symbols.
    pub fn unknown(place: &Place) -> Self {
        let (function, module) = match place {
            Place::File { path, file_offset } => {
                let module = short_name(path).to_string();
                (format!("{module}+{file_offset:#x}"), module)
            }
            Place::Region { name, .. } => (name.to_string(), name.to_string()),
            Place::Anonymous { .. } => ("[anonymous]".into(), "[anonymous]".into()),
            Place::Unmapped { .. } => ("[unmapped]".into(), "[unmapped]".into()),
        };
        Self {
            function,
            module,
            file: None,
            line: None,
        }
    }
}

/// A data address inside a global or static variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataSymbol {
    pub name: String,
    /// Offset of the address from the start of the symbol.
    pub offset: u64,
    /// Size of the symbol, when the ELF symbol table records it.
    pub size: Option<u64>,
    pub module: String,
}

/// A code place named at its innermost function, and the functions that
/// code was inlined into.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Inlined {
    /// The innermost function that is the program's own code, at its own
    /// source line.
    pub frame: Frame,
    /// The callers `frame` was inlined into, each at the line of its call:
    /// the innermost caller first, the function that was compiled (the
    /// one a plain symbol lookup names) last. Empty when not inlined.
    pub inlined_into: Vec<Frame>,
}

impl Inlined {
    /// A place with no inlining.
    pub fn alone(frame: Frame) -> Self {
        Self {
            frame,
            inlined_into: Vec::new(),
        }
    }

    /// The compiled function, at the line of the outermost inlined call.
    pub fn outermost(&self) -> &Frame {
        self.inlined_into.last().unwrap_or(&self.frame)
    }
}

/// Symbolizer with a per-place cache. Blazesym keeps parsed ELF and DWARF
/// data per file across calls, so each file is read once.
pub struct Symbolizer {
    blazesym: Blazesym,
    code: HashMap<Place, Inlined>,
    /// Layouts of global variables, per (file, symbol).
    layouts: HashMap<(Arc<str>, String), Option<dwarf::Layout>>,
    /// What the pointer declared at (object, source file, line) points to.
    pointees: HashMap<(Arc<str>, String, u32), Option<dwarf::Layout>>,
    /// Per file: how its loadable segments lie in its own addresses.
    load_layouts: HashMap<Arc<str>, Option<elf::LoadLayout>>,
    /// Per file: its separate debug file, if it is stripped and one is
    /// installed ([`debugfile`]).
    debug_files: HashMap<Arc<str>, Option<PathBuf>>,
    /// Per file: its PLT stubs ([`plt`]).
    plt_stubs: HashMap<Arc<str>, Vec<plt::Stub>>,
    /// Per file: its functions' ranges, for code no symbol names.
    functions: HashMap<Arc<str>, Functions>,
    /// The type each accessing instruction goes through ([`typed`]).
    access_types: HashMap<Place, Option<typed::AccessType>>,
    /// The type of the first argument of each call, by return address.
    argument_types: HashMap<Place, Option<typed::AccessType>>,
    /// Per file: its bytes and its debug file's, while types are read.
    typed_files: HashMap<Arc<str>, Option<typed::TypedFile>>,
    /// Per file something was named by its address in (a function or a
    /// global): whether the file has neither a symbol table nor a debug
    /// file, which the report's note lists.
    stripped: HashMap<Arc<str>, bool>,
    /// The debuginfod generation the answers above were made at.
    generation: u64,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    pub fn new() -> Self {
        // Names are demangled by [`demangle::demangle`]: blazesym's
        // demangling reads short C names as C++ type codes (`w` as
        // `wchar_t`).
        let blazesym = Blazesym::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .enable_demangling(false)
            .build();
        Self {
            blazesym,
            code: HashMap::new(),
            layouts: HashMap::new(),
            pointees: HashMap::new(),
            access_types: HashMap::new(),
            argument_types: HashMap::new(),
            typed_files: HashMap::new(),
            load_layouts: HashMap::new(),
            debug_files: HashMap::new(),
            plt_stubs: HashMap::new(),
            functions: HashMap::new(),
            stripped: HashMap::new(),
            generation: debuginfod::generation(),
        }
    }

    /// Forgets every answer once a debug file has landed from a debuginfod
    /// server since they were made: a name may now be better.
    pub(super) fn refresh(&mut self) {
        let now = debuginfod::generation();
        if now != self.generation {
            self.generation = now;
            self.code.clear();
            self.layouts.clear();
            self.pointees.clear();
            self.debug_files.clear();
            self.access_types.clear();
            self.argument_types.clear();
            self.typed_files.clear();
            self.stripped.clear();
        }
    }

    /// The files without symbols or a debug file whose code or data was
    /// named by address since their debug files last changed, by path.
    pub fn stripped_files(&self) -> Vec<Arc<str>> {
        let mut files: Vec<Arc<str>> = self
            .stripped
            .iter()
            .filter(|(_, &stripped)| stripped)
            .map(|(path, _)| path.clone())
            .collect();
        files.sort();
        files
    }

    /// Records that something of `path` was named by address: for the
    /// report's note when the file has no symbols to give (not when a
    /// file with symbols has none at that address).
    fn named_by_address(&mut self, path: &Arc<str>) {
        if self.stripped.contains_key(path) {
            return;
        }
        let no_symtab = debugfile::links(&open_path(path)).is_some_and(|l| !l.symtab);
        let stripped = no_symtab && self.debug_file(path).is_none();
        self.stripped.insert(path.clone(), stripped);
    }

    /// Data no symbol covers, named by the object file and its own
    /// address ([`crate::report::names::Names::file_address`]).
    pub fn file_address(&mut self, path: &Arc<str>, file_base: u64, addr: u64) -> Option<String> {
        let at = self.link_address(path, file_base, addr)?;
        self.named_by_address(path);
        Some(format!("{}+{at:#x}", short_name(path)))
    }

    /// Places resolved so far (each is resolved once).
    pub fn cached(&self) -> usize {
        self.code.len()
    }

    /// The function and source line at a code place: for code inlined
    /// into its caller, the compiled function at the line of the call.
    pub fn code(&mut self, place: &Place) -> Frame {
        self.code_inlined(place).outermost().clone()
    }

    /// The innermost function at a code place and its own source line:
    /// for code inlined into its caller, the inlined function, not the
    /// caller's line that called it. What a data access is attributed to.
    pub fn code_innermost(&mut self, place: &Place) -> Frame {
        self.code_inlined(place).frame.clone()
    }

    /// The innermost function at a code place, with the chain of callers
    /// it was inlined into. What an allocation site is named by.
    pub fn code_inlined(&mut self, place: &Place) -> &Inlined {
        self.refresh();
        if !self.code.contains_key(place) {
            let chain = self.resolve(place);
            self.code.insert(place.clone(), chain);
        }
        &self.code[place]
    }

    fn resolve(&mut self, place: &Place) -> Inlined {
        let Place::File { path, file_offset } = place else {
            return Inlined::alone(Frame::unknown(place));
        };
        if let Some(name) = self.plt_stub(path, *file_offset) {
            return Inlined::alone(Frame {
                function: name,
                module: short_name(path).to_string(),
                file: None,
                line: None,
            });
        }
        let src = Source::Elf(Elf::new(open_path(path)));
        match self.symbolize_single(&src, Input::FileOffset(*file_offset)) {
            Ok(Symbolized::Sym(sym)) => inline_chain(&sym, short_name(path)),
            Ok(Symbolized::Unknown(reason)) => {
                tracing::debug!("no symbol for {path}+{file_offset:#x}: {reason}");
                self.resolve_in_debug_file(path, *file_offset)
                    .unwrap_or_else(|| Inlined::alone(self.unnamed_function(path, *file_offset)))
            }
            Err(e) => {
                tracing::debug!("symbolizing {path}+{file_offset:#x} failed: {e}");
                Inlined::alone(self.unnamed_function(path, *file_offset))
            }
        }
    }

    /// A stripped file's code place from its debug file, found by build
    /// id (blazesym follows only a debug link): at the same virtual
    /// address, since the debug file keeps the program's layout but not
    /// its file offsets.
    fn resolve_in_debug_file(&mut self, path: &Arc<str>, file_offset: u64) -> Option<Inlined> {
        let debug = self.debug_file(path)?;
        let vaddr = file_offset.checked_add(self.vaddr_bias(path)?)?;
        let src = Source::Elf(Elf::new(debug));
        match self.symbolize_single(&src, Input::VirtOffset(vaddr)) {
            Ok(Symbolized::Sym(sym)) => Some(inline_chain(&sym, short_name(path))),
            Ok(Symbolized::Unknown(_)) | Err(_) => None,
        }
    }

    /// Code no symbol names, named by the start of its function as the
    /// file's call-frame information gives it (`pbzip2+0x6e80`), so that
    /// a stripped function's samples, waits and sites add up as one
    /// (each instruction was its own "function"); by its own offset
    /// where no FDE covers it.
    fn unnamed_function(&mut self, path: &Arc<str>, file_offset: u64) -> Frame {
        let functions = self.functions.entry(path.clone()).or_insert_with(|| {
            let at = open_path(path);
            let small = std::fs::metadata(&at).is_ok_and(|m| m.len() <= MAX_FILE);
            let data = small.then(|| std::fs::read(&at).ok()).flatten();
            Functions::of(&data.unwrap_or_default())
        });
        let start = functions.start_of(file_offset).unwrap_or(file_offset);
        self.named_by_address(path);
        Frame::unknown(&Place::File {
            path: path.clone(),
            file_offset: start,
        })
    }

    /// The PLT stub of `path` at `file_offset` (`malloc@plt`), if any.
    fn plt_stub(&mut self, path: &Arc<str>, file_offset: u64) -> Option<String> {
        let vaddr = file_offset.checked_add(self.vaddr_bias(path)?)?;
        let stubs = self.plt_stubs.entry(path.clone()).or_insert_with(|| {
            std::fs::read(open_path(path)).map_or_else(|_| Vec::new(), |data| plt::stubs_of(&data))
        });
        plt::stub_at(stubs, vaddr).map(str::to_string)
    }

    /// `p_vaddr - p_offset` of the first loadable segment of `path`.
    fn vaddr_bias(&mut self, path: &Arc<str>) -> Option<u64> {
        self.load_layout(path).map(|l| l.bias)
    }

    fn load_layout(&mut self, path: &Arc<str>) -> Option<elf::LoadLayout> {
        *self
            .load_layouts
            .entry(path.clone())
            .or_insert_with(|| elf::load_layout(&open_path(path)).ok())
    }

    /// Blazesym's answer, with a panic of its parsers (0.2.7 has an
    /// `unwrap` that a malformed line table reaches) as an error: the
    /// files come from the traced program.
    fn symbolize_single(
        &self,
        src: &Source<'_>,
        input: Input<u64>,
    ) -> Result<Symbolized<'_>, String> {
        quiet_panics(|| self.blazesym.symbolize_single(src, input))
            .ok_or_else(|| "blazesym panicked".to_string())?
            .map_err(|e| e.to_string())
    }

    /// The layout of global `name` (a symbol of `path`) from its DWARF:
    /// array element size and struct members, to name the bytes of it.
    /// The layout of what a pointer declared at `file:line` of the object
    /// file `path` points to (see [`dwarf::pointee_layout`]).
    pub fn pointee_layout(
        &mut self,
        path: &Arc<str>,
        file: &str,
        line: u32,
    ) -> Option<dwarf::Layout> {
        self.pointees
            .entry((path.clone(), file.to_string(), line))
            .or_insert_with(|| dwarf::pointee_layout(&open_path(path), file, line))
            .clone()
    }

    pub fn data_layout(&mut self, path: &Arc<str>, name: &str) -> Option<dwarf::Layout> {
        self.refresh();
        let key = (path.clone(), name.to_string());
        if let Some(l) = self.layouts.get(&key) {
            return l.clone();
        }
        let layout = dwarf::layout(&open_path(path), name).or_else(|| {
            let debug = self.debug_file(path)?;
            dwarf::layout(&debug, name)
        });
        self.layouts.insert(key, layout.clone());
        layout
    }

    /// The separate debug file of `path`, when it is stripped and one is
    /// installed (looked up once per file).
    fn debug_file(&mut self, path: &Arc<str>) -> Option<PathBuf> {
        self.debug_files
            .entry(path.clone())
            .or_insert_with(|| {
                let found = debugfile::find(&open_path(path));
                if let Some(f) = &found {
                    tracing::debug!("debug file of {path}: {}", f.display());
                }
                found
            })
            .clone()
    }

    /// `addr` as an address of the object file `path` whose file offset
    /// 0 is at `file_base`: the address its symbols, `nm` and `gdb` use.
    /// None past the file's last segment in memory (anonymous memory
    /// right after its `.bss` is not the file's).
    pub fn link_address(&mut self, path: &Arc<str>, file_base: u64, addr: u64) -> Option<u64> {
        let layout = self.load_layout(path)?;
        let at = addr.checked_sub(file_base)?.checked_add(layout.bias)?;
        (at < layout.end).then_some(at)
    }

    /// The global or static variable holding `addr`, in the object file
    /// `path` whose file offset 0 is at `file_base` (see
    /// [`crate::process::maps::ProcMaps::data_owner`]).
    pub fn data(&mut self, path: &Arc<str>, file_base: u64, addr: u64) -> Option<DataSymbol> {
        self.refresh();
        let vaddr = self.link_address(path, file_base, addr)?;
        // The ELF symbol table has both function and object symbols; DWARF
        // would only name functions, so it is not consulted here. A
        // stripped binary's table is in its debug file, at the same
        // addresses.
        let sym = self.data_symbol(open_path(path), vaddr).or_else(|| {
            let debug = self.debug_file(path)?;
            self.data_symbol(debug, vaddr)
        })?;
        Some(DataSymbol {
            module: short_name(path).to_string(),
            ..sym
        })
    }

    /// The symbol at `vaddr` in the symbol table of the ELF file at
    /// `file` (its module left empty).
    fn data_symbol(&self, file: PathBuf, vaddr: u64) -> Option<DataSymbol> {
        let mut elf = Elf::new(file);
        elf.debug_syms = false;
        let src = Source::Elf(elf);
        match self.symbolize_single(&src, Input::VirtOffset(vaddr)) {
            Ok(Symbolized::Sym(sym)) => Some(DataSymbol {
                name: demangle::demangle(&sym.name).into_owned(),
                offset: sym.offset as u64,
                size: sym.size.map(|s| s as u64),
                module: String::new(),
            }),
            Ok(Symbolized::Unknown(_)) | Err(_) => None,
        }
    }
}

/// Blazesym's symbol as an [`Inlined`]. Blazesym gives the compiled
/// function with the line of its first inlined call, then each inlined
/// function, outermost first, with the line of the next call in it (the
/// innermost: the line of the address itself).
fn inline_chain(sym: &blazesym::symbolize::Sym<'_>, module: &str) -> Inlined {
    let frame = |name: &str, ci: Option<&blazesym::symbolize::CodeInfo<'_>>| Frame {
        function: demangle::demangle(name).into_owned(),
        module: module.to_string(),
        file: ci.map(|ci| {
            let file = std::path::Path::new(&ci.file);
            match &ci.dir {
                Some(dir) => dir.join(file).to_string_lossy().into_owned(),
                None => file.to_string_lossy().into_owned(),
            }
        }),
        line: ci.and_then(|ci| ci.line),
    };
    let outer = frame(&sym.name, sym.code_info.as_deref());
    // The innermost inlined function that is the program's own code: an
    // access inlined from the standard library (`AtomicU64::store`)
    // belongs to the line that called it.
    let own = |f: &&blazesym::symbolize::InlinedFn<'_>| {
        !f.code_info.as_ref().is_some_and(|ci| is_library_source(ci))
    };
    let Some(inner) = sym.inlined.iter().rposition(|f| own(&f)) else {
        return Inlined::alone(outer);
    };
    let mut inlined_into: Vec<Frame> = sym.inlined[..inner]
        .iter()
        .rev()
        .map(|f| frame(&f.name, f.code_info.as_ref()))
        .collect();
    inlined_into.push(outer);
    let f = &sym.inlined[inner];
    Inlined {
        frame: frame(&f.name, f.code_info.as_ref()),
        inlined_into,
    }
}

/// Source of a language's standard library (Rust's core/std/alloc, C++
/// headers), as recorded in debug info.
fn is_library_source(ci: &blazesym::symbolize::CodeInfo<'_>) -> bool {
    let dir = ci
        .dir
        .as_deref()
        .map(|d| d.to_string_lossy())
        .unwrap_or_default();
    let file = ci.file.to_string_lossy();
    let full = format!("{dir}/{file}");
    full.starts_with("/rustc/")
        || full.contains("/library/core/")
        || full.contains("/library/std/")
        || full.contains("/library/alloc/")
        || full.starts_with("/usr/include/")
        || full.contains("/rust-src/")
}

thread_local! {
    /// Set while a call that may panic on the target's data runs.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic into `None` without the panic hooks: no
/// message on the terminal, and no terminal restore by the dashboard's hook
/// (it would tear the dashboard down for a frame that is merely unknown).
/// [`install_quiet_panic_hook`] must have been called for the silence.
pub fn quiet_panics<T>(f: impl FnOnce() -> T) -> Option<T> {
    let was = QUIET.with(|q| q.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    result.ok()
}

/// Wraps the current panic hook so that panics inside [`quiet_panics`]
/// skip it. Call it after any other hook is installed (the dashboard's).
pub fn install_quiet_panic_hook() {
    let next = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !QUIET.with(|q| q.get()) {
            next(info);
        }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_site_without_a_line_is_named_by_its_function_or_place() {
        let at = |function: &str, line: Option<u32>| Frame {
            function: function.into(),
            module: "memcached".into(),
            file: line.map(|_| "/src/thread.c".into()),
            line,
        };
        assert_eq!(at("setup_thread", Some(12)).site_label(), "thread.c:12");
        assert_eq!(
            at("setup_thread", None).site_label(),
            "setup_thread (memcached)"
        );
        assert_eq!(
            at("memcached+0x19a54", None).site_label(),
            "memcached+0x19a54"
        );
        assert_eq!(at("", None).site_label(), "(memcached)");
    }

    #[test]
    fn unknown_places_degrade_to_names() {
        let f = Frame::unknown(&Place::File {
            path: "/opt/app/bin/server".into(),
            file_offset: 0x1234,
        });
        assert_eq!(f.function, "server+0x1234");
        assert_eq!(f.module, "server");
        assert_eq!(
            Frame::unknown(&Place::Anonymous { address: 1 }).function,
            "[anonymous]"
        );
        assert_eq!(
            Frame::unknown(&Place::Region {
                name: "[vdso]".into(),
                address: 1
            })
            .module,
            "[vdso]"
        );
        assert_eq!(
            Frame::unknown(&Place::Unmapped { address: 1 }).function,
            "[unmapped]"
        );
    }

    #[test]
    fn each_place_is_resolved_once() {
        let mut s = Symbolizer::new();
        let a = Place::Anonymous { address: 1 };
        let b = Place::File {
            path: "/nonexistent/x".into(),
            file_offset: 2,
        };
        assert_eq!(s.cached(), 0);
        let first = s.code(&a);
        assert_eq!(s.code(&a), first);
        assert_eq!(s.cached(), 1);
        s.code(&b);
        s.code(&b);
        assert_eq!(s.cached(), 2);
    }

    #[test]
    fn quiet_panics_are_none_and_skip_the_hook() {
        let hook_ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = hook_ran.clone();
        let me = std::thread::current().id();
        let previous = std::panic::take_hook();
        // Other tests run on other threads: only this thread's panics count.
        std::panic::set_hook(Box::new(move |_| {
            if std::thread::current().id() == me {
                seen.store(true, std::sync::atomic::Ordering::SeqCst)
            }
        }));
        install_quiet_panic_hook();
        assert_eq!(quiet_panics(|| 7), Some(7));
        assert_eq!(
            quiet_panics(|| -> u8 { panic!("from the target's data") }),
            None
        );
        let ran = hook_ran.load(std::sync::atomic::Ordering::SeqCst);
        std::panic::set_hook(previous);
        assert!(!ran, "the hook must not run for a quiet panic");
    }

    /// Found by fuzzing: a line table row naming a file the table does
    /// not have makes blazesym 0.2.7 panic (`unwrap` in `row_location`).
    /// The fixture is a 2 KiB shared object built by gcc with the first
    /// byte of the line table's one file name zeroed (an empty file table).
    #[test]
    fn a_panic_in_blazesym_is_an_unknown_frame() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.so");
        std::fs::write(
            &path,
            include_bytes!("../../../tests/fuzz/regressions/line-table-without-files.so"),
        )
        .unwrap();
        let path: Arc<str> = Arc::from(path.to_str().unwrap());
        let place = Place::File {
            path: path.clone(),
            file_offset: 0x189,
        };
        let mut s = Symbolizer::new();
        assert_eq!(s.code(&place).module, "bad.so");
        assert_eq!(s.code_innermost(&place).module, "bad.so");
    }

    #[test]
    fn missing_files_are_not_errors() {
        let mut s = Symbolizer::new();
        let place = Place::File {
            path: "/nonexistent/lib.so".into(),
            file_offset: 0x10,
        };
        assert_eq!(s.code(&place).function, "lib.so+0x10");
        assert_eq!(s.data(&"/nonexistent/lib.so".into(), 0x1000, 0x1010), None);
    }

    /// Found by fuzzing: a first segment whose page-aligned `p_vaddr` is
    /// far above its `p_offset` made the address arithmetic overflow.
    #[test]
    fn a_huge_load_bias_names_nothing() {
        let mut elf = vec![0u8; 64 + 56];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        elf[64..68].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD, offset 0
        elf[64 + 16..64 + 24].copy_from_slice(&0xffff_ffff_ffff_f000u64.to_le_bytes());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("high");
        std::fs::write(&path, &elf).unwrap();
        let path: Arc<str> = Arc::from(path.to_str().unwrap());
        assert_eq!(Symbolizer::new().data(&path, 0, 0x2000), None);
    }

    /// Symbolizes code and data in this very test binary: a function's own
    /// address must come back as its name with a source line, and a static's
    /// address (plus an offset) as the static's name and that offset.
    #[test]
    fn symbolizes_this_test_binary() {
        #[inline(never)]
        #[no_mangle]
        extern "C" fn memprof_symbolize_probe() -> u64 {
            std::hint::black_box(7)
        }
        #[no_mangle]
        static mut MEMPROF_SYMBOLIZE_DATA: [u64; 8] = [0; 8];

        let maps = crate::process::maps::ProcMaps::read(std::process::id()).unwrap();
        let mut s = Symbolizer::new();

        let code_addr = memprof_symbolize_probe as *const () as u64;
        let frame = s.code(&maps.place(code_addr));
        assert_eq!(frame.function, "memprof_symbolize_probe");
        assert!(
            frame.file.as_deref().unwrap_or("").ends_with("mod.rs"),
            "{frame:?}"
        );
        assert!(frame.line.is_some());

        let data_addr = (&raw const MEMPROF_SYMBOLIZE_DATA) as u64 + 24;
        let (path, base) = maps
            .data_owner(data_addr)
            .expect("static lies in the test binary");
        let sym = s.data(&path, base, data_addr).expect("data symbol");
        assert_eq!(sym.name, "MEMPROF_SYMBOLIZE_DATA");
        assert_eq!(sym.offset, 24);
        assert_eq!(sym.size, Some(64));
    }
}

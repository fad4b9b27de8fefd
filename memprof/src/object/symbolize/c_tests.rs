//! The symbolizer on a small C program built by gcc at test time: short
//! names, and code inlined into its caller.

use std::{path::Path, sync::Arc};

use object::{Object, ObjectSymbol};

use super::{elf, Symbolizer};
use crate::process::maps::Place;

/// One- and two-letter names for functions, globals and a lock, and a
/// helper that is always inlined into `main` and calls `calloc`.
const PROGRAM: &str = r#"
#include <pthread.h>
#include <stdlib.h>

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static long g;
long ab[4];

struct acc { long v[8]; };

static inline __attribute__((always_inline)) struct acc *mk(int n)
{
	return calloc(n, sizeof(struct acc)); /* MK_CALLOC */
}

__attribute__((noinline)) void *w(void *p)
{
	pthread_mutex_lock(&m);
	g++;
	ab[1]++;
	pthread_mutex_unlock(&m);
	return p;
}

__attribute__((noinline)) int cd(int x)
{
	return x * 3 + (int)g;
}

int main(int argc, char **argv)
{
	(void)argv;
	struct acc *a = mk(argc + 1); /* MAIN_CALL */
	w(a);
	int r = cd(argc) + (int)a->v[0];
	free(a);
	return r;
}
"#;

/// The line of `PROGRAM` holding `marker`.
fn line_of(marker: &str) -> u32 {
    let i = PROGRAM
        .lines()
        .position(|l| l.contains(marker))
        .expect("marker");
    i as u32 + 1
}

/// Builds [`PROGRAM`] in `dir` with `-g -O1`, returns the executable.
fn build(dir: &Path) -> Arc<str> {
    let exe = gcc(dir, "names", PROGRAM, &["-g", "-O1"]);
    Arc::from(exe.to_str().unwrap())
}

/// Builds the C `program` as `dir/name` with gcc and `flags` (and
/// `-pthread`), returns the executable.
pub(crate) fn gcc(dir: &Path, name: &str, program: &str, flags: &[&str]) -> std::path::PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, program).unwrap();
    let exe = dir.join(name);
    let out = std::process::Command::new("gcc")
        .args(flags)
        .args(["-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("running gcc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Address and size of symbol `name` in the ELF symbol table.
fn symbol(path: &str, name: &str) -> (u64, u64) {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("no symbol {name}"));
    (sym.address(), sym.size())
}

/// The code place of virtual address `vaddr` of `path`.
fn code_place(path: &Arc<str>, vaddr: u64) -> Place {
    let bias = elf::first_load_bias(Path::new(&**path)).unwrap();
    Place::File {
        path: path.clone(),
        file_offset: vaddr - bias,
    }
}

/// Functions, globals and the lock with one- and two-letter names come
/// back with those names, not as the C++ type codes they spell (`w` is
/// `wchar_t`, `m` is `unsigned long` to an Itanium demangler).
#[test]
fn short_names_are_named_right() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let mut s = Symbolizer::new();
    for function in ["w", "cd", "main"] {
        let (addr, _) = symbol(&path, function);
        let place = code_place(&path, addr);
        assert_eq!(s.code(&place).function, function);
        assert_eq!(s.code_innermost(&place).function, function);
    }
    // The data symbolizer takes a file base (the address of file offset 0
    // in the process); here addresses are the file's own (base 0 plus the
    // bias the symbolizer adds back).
    let bias = elf::first_load_bias(Path::new(&*path)).unwrap();
    for (global, offset) in [("m", 0), ("m", 8), ("g", 0), ("ab", 8), ("ab", 24)] {
        let (addr, size) = symbol(&path, global);
        let sym = s
            .data(&path, 0, addr - bias + offset)
            .unwrap_or_else(|| panic!("no data symbol for {global}"));
        assert_eq!(sym.name, global);
        assert_eq!(sym.offset, offset);
        assert_eq!(sym.size, Some(size));
    }
}

/// The `calloc` call of a helper inlined into `main` is named at the
/// helper's line, with `main` at the line that calls the helper as the
/// function it was inlined into; the plain name is `main`'s line.
#[test]
fn inlined_calls_are_named_with_their_chain() {
    let dir = tempfile::tempdir().unwrap();
    let path = build(dir.path());
    let (main, size) = symbol(&path, "main");
    let mut s = Symbolizer::new();
    let calloc_line = line_of("MK_CALLOC");
    let call_line = line_of("MAIN_CALL");
    let found = (main..main + size).find_map(|addr| {
        let place = code_place(&path, addr);
        let chain = s.code_inlined(&place).clone();
        (chain.frame.function == "mk").then_some((place, chain))
    });
    let (place, chain) = found.expect("code of mk inlined in main");
    assert_eq!(chain.frame.line, Some(calloc_line), "{chain:?}");
    assert!(
        chain.frame.file.as_deref().unwrap().ends_with("names.c"),
        "{chain:?}"
    );
    assert_eq!(chain.inlined_into.len(), 1, "{chain:?}");
    let outer = &chain.inlined_into[0];
    assert_eq!(outer.function, "main");
    assert_eq!(outer.line, Some(call_line));
    assert_eq!(chain.outermost(), outer);
    assert_eq!(s.code(&place), *outer);
    assert_eq!(s.code_innermost(&place), chain.frame);
}

/// A `void` function that allocated last and a wrapper that returns the
/// block, both leaving it in `rax` at their return at -O2.
const VOID_PROGRAM: &str = r#"
#include <stdlib.h>
#include <string.h>

struct session { long id; long refs[7]; };
struct session *g;

__attribute__((noinline)) void setup(void)
{
	g = malloc(sizeof *g);
	if (!g)
		exit(1);
	memset(g, 0, sizeof *g);
	g->id = 7;
}

__attribute__((noinline)) struct session *make(void)
{
	struct session *s = malloc(sizeof *s);
	if (!s)
		exit(1);
	memset(s, 0, sizeof *s);
	s->id = 9;
	return s;
}

int main(void)
{
	setup();
	struct session *s = make();
	return (int)(s->id + g->id);
}
"#;

/// The file offset the first call in function `name` returns to.
fn first_call_return(path: &Arc<str>, name: &str) -> u64 {
    use iced_x86::{Decoder, DecoderOptions, FlowControl};
    let (addr, size) = symbol(path, name);
    let Place::File { file_offset, .. } = code_place(path, addr) else {
        unreachable!()
    };
    let data = std::fs::read(&**path).unwrap();
    let body = &data[file_offset as usize..(file_offset + size) as usize];
    let mut d = Decoder::with_ip(64, body, file_offset, DecoderOptions::NONE);
    d.iter()
        .find(|i| i.flow_control() == FlowControl::Call)
        .map(|i| i.next_ip())
        .unwrap_or_else(|| panic!("no call in {name}"))
}

/// The code alone takes both functions for wrappers (the block is in
/// `rax` at their `ret`); the debug info says `setup` returns nothing, so
/// only `make` is one. Without debug info the code decides.
#[test]
fn a_void_function_is_not_an_allocation_wrapper() {
    use crate::{
        object::{files::CodeCache, x86::wrapper::returns_result},
        process::files::FileCache,
    };
    let dir = tempfile::tempdir().unwrap();
    for (flags, setup_wraps) in [(&["-O2", "-g"][..], false), (&["-O2"][..], true)] {
        let name = if flags.len() == 2 { "void_g" } else { "void" };
        let exe = gcc(dir.path(), name, VOID_PROGRAM, flags);
        let path: Arc<str> = Arc::from(exe.to_str().unwrap());
        let data = std::fs::read(&exe).unwrap();
        let (mut cache, mut files) = (CodeCache::default(), FileCache::default());
        for (function, wraps) in [("setup", setup_wraps), ("make", true)] {
            let ra = first_call_return(&path, function);
            assert!(
                returns_result(&data, ra as usize),
                "{function} {flags:?}: the code should return the block"
            );
            assert_eq!(
                cache.returns_result(&mut files, &path, ra),
                wraps,
                "{function} {flags:?}"
            );
        }
    }
}

/// In a stripped build, every instruction of a function without a symbol
/// is named by the function's start, from its FDE (`names-s+0x1189`),
/// so its samples and sites add up as one; the start is the one the
/// unstripped build's symbol table gives. The stripped file is listed for
/// the report's note on names it could not give; the unstripped one,
/// whose code all has names, is not.
#[test]
fn stripped_code_is_named_by_its_functions_start() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path());
    let stripped = dir.path().join("names-s");
    let out = std::process::Command::new("strip")
        .arg("-o")
        .arg(&stripped)
        .arg(&*exe)
        .output()
        .expect("running strip");
    assert!(out.status.success(), "{out:?}");
    let stripped: Arc<str> = Arc::from(stripped.to_str().unwrap());
    let mut s = Symbolizer::new();
    for name in ["w", "cd"] {
        let (start, size) = symbol(&exe, name);
        let expected = match code_place(&stripped, start) {
            Place::File { file_offset, .. } => format!("names-s+{file_offset:#x}"),
            other => panic!("{other:?}"),
        };
        for at in [start, start + 1, start + size - 1] {
            let f = s.code(&code_place(&stripped, at));
            assert_eq!(f.function, expected, "{name} at {at:#x}");
            assert_eq!(f.module, "names-s");
        }
        let (start, _) = symbol(&exe, name);
        assert!(!s.code(&code_place(&exe, start)).function.contains("+0x"));
    }
    assert_eq!(s.stripped_files(), [stripped]);
}

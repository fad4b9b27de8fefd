//! Access types on a small C program built by gcc at test time, at -O0
//! (pointers reloaded from their stack slots) and -O2 (kept in
//! registers).

use std::path::Path;

use iced_x86::{Decoder, DecoderOptions, OpKind, Register};
use object::{Object, ObjectSymbol};

use super::typed::{access_type_in, pointer_use_in, AccessType};
use crate::{
    object::symbolize::{elf, Symbolizer},
    process::maps::Place,
};

const PROGRAM: &str = r#"
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

struct table { long entries[6]; pthread_mutex_t lock; unsigned long count; };

__attribute__((noinline)) unsigned long table_loop(struct table *tb, long n)
{
	unsigned long rounds = 0;
	for (long i = 0; i < n; i++) {
		pthread_mutex_lock(&tb->lock);
		tb->count++;
		sched_yield();
		pthread_mutex_unlock(&tb->lock);
		rounds++;
	}
	return rounds;
}

struct args { int id; int flags; long sum; long count; };
/* An anonymous struct, named by its typedef (as phoenix's lreg_args). */
typedef struct { long left; long right; } pair;

__attribute__((noinline)) void work(struct args *a, long n)
{
	for (long i = 0; i < n; i++) {
		a->sum += i;
		a->count++;
	}
}

/* A pointer read from a member: `w->st->hits` (fscorpus's stats24). */
struct stats { long hits; long misses; long bytes; };
struct chase { long key; struct stats *st; };

__attribute__((noinline)) void tally(struct chase *w, long n)
{
	for (long i = 0; i < n; i++) {
		w->st->hits++;
		w->st->bytes += i;
	}
}

/* The same through an element of a global array (fscorpus's g_chase). */
struct chase g_chases[4];

__attribute__((noinline)) void tally_global(int id, long n)
{
	struct chase *w = &g_chases[id];
	for (long i = 0; i < n; i++) {
		w->st->hits++;
		w->st->bytes += i;
	}
}

__attribute__((noinline)) void other(pair *p, long n)
{
	p->right += n;
}

int main(int argc, char **argv)
{
	(void)argv;
	struct args *a;
	pair *p;
	a = calloc(4, sizeof *a);
	p = calloc(1, sizeof *p);
	work(&a[1], argc * 1000);
	other(p, argc);
	struct chase w = { 1, calloc(2, sizeof(struct stats)) };
	tally(&w, argc);
	g_chases[argc].st = w.st;
	tally_global(argc, argc);
	struct table *t = calloc(1, sizeof *t);
	pthread_mutex_init(&t->lock, NULL);
	table_loop(t, argc);
	return (int)(a[1].sum + p->right);
}
"#;

fn build(dir: &Path, opt: &str) -> std::path::PathBuf {
    let flags = ["-g", opt, "-fno-omit-frame-pointer"];
    super::c_tests::gcc(dir, &format!("typed{opt}"), PROGRAM, &flags)
}

/// The access types of the instructions of function `name` that access
/// memory through a register other than the stack's.
fn types_in(exe: &Path, name: &str) -> Vec<AccessType> {
    let data = std::fs::read(exe).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(name))
        .expect("symbol");
    let bias = elf::first_load_bias(exe).unwrap();
    let (start, size) = (sym.address(), sym.size());
    let bytes = &data[(start - bias) as usize..(start - bias + size) as usize];
    let mut found = Vec::new();
    for insn in Decoder::with_ip(64, bytes, start, DecoderOptions::NONE) {
        let memory = (0..insn.op_count()).any(|i| insn.op_kind(i) == OpKind::Memory);
        let base = insn.memory_base();
        if !memory || matches!(base, Register::RSP | Register::RBP | Register::RIP) {
            continue;
        }
        let Some((p, pc, rule)) = pointer_use_in(&data, insn.ip() - bias) else {
            continue;
        };
        found.extend(access_type_in(&data, pc, &p, rule));
    }
    found
}

fn fields(types: &[AccessType]) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = types
        .iter()
        .map(|t| {
            (
                t.layout.type_name.clone().unwrap_or_default(),
                t.field().unwrap_or_default(),
                t.variable.clone(),
            )
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

fn pair(ty: &str, field: &str, var: &str) -> (String, String, String) {
    (ty.to_string(), field.to_string(), var.to_string())
}

#[test]
fn fields_are_named_through_the_pointer_at_o0_and_o2() {
    let dir = tempfile::tempdir().unwrap();
    for opt in ["-O0", "-O2"] {
        let exe = build(dir.path(), opt);
        let work = fields(&types_in(&exe, "work"));
        assert!(
            work.contains(&pair("struct args", "sum", "a")),
            "{opt}: {work:?}"
        );
        assert!(
            work.contains(&pair("struct args", "count", "a")),
            "{opt}: {work:?}"
        );
        assert!(
            work.iter().all(|(t, _, _)| t == "struct args"),
            "{opt}: nothing but the struct is named: {work:?}"
        );
        let other = fields(&types_in(&exe, "other"));
        assert_eq!(other, [pair("pair", "right", "p")], "{opt}");
    }
}

/// The accesses of function `name` at -O0 and -O2: `hits` and `bytes` of
/// `struct stats` through `variable` (any, if None), and nothing else but
/// the read of `st` itself from `struct chase`.
fn assert_stats_typed(name: &str, variable: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    for opt in ["-O0", "-O2"] {
        let exe = build(dir.path(), opt);
        let found = fields(&types_in(&exe, name));
        for field in ["hits", "bytes"] {
            assert!(
                found.iter().any(|(t, f, v)| t == "struct stats"
                    && f == field
                    && variable.is_none_or(|var| v == var)),
                "{name} {opt}: {found:?}"
            );
        }
        assert!(
            found
                .iter()
                .all(|(t, f, _)| t == "struct stats" || (t == "struct chase" && f == "st")),
            "{name} {opt}: {found:?}"
        );
    }
}

/// `w->st->hits`: the pointer is read from `w`'s member `st`, so the
/// access is typed by what `st` points to, whether `w` is reloaded from
/// its stack slot (-O0) or `w->st` kept in a register over the loop (-O2).
#[test]
fn a_pointer_read_from_a_member_is_typed_by_the_member() {
    assert_stats_typed("tally", Some("w->st"));
}

/// `&g_chases[id]` is an element of a global array: at -O2 no variable
/// holds it (its DWARF location is an expression), so the element type
/// comes from the array's, and `st` from its member.
#[test]
fn a_pointer_read_from_a_global_array_s_element_is_typed() {
    assert_stats_typed("tally_global", None);
}

/// A constant index past the pointer's element is named by index.
#[test]
fn a_displacement_past_the_struct_is_an_index() {
    let t = AccessType {
        layout: super::dwarf::Layout {
            element: None,
            type_name: Some("struct pair".into()),
            struct_size: Some(16),
            members: vec![
                super::dwarf::Member {
                    name: "left".into(),
                    offset: 0,
                },
                super::dwarf::Member {
                    name: "right".into(),
                    offset: 8,
                },
            ],
        },
        disp: 24,
        indexed: false,
        variable: "p".into(),
    };
    assert_eq!(t.field().as_deref(), Some("[1].right"));
    let first = AccessType {
        disp: 8,
        ..t.clone()
    };
    assert_eq!(first.field().as_deref(), Some("right"));
    let before = AccessType { disp: -8, ..t };
    assert_eq!(before.field(), None);
}

/// The lock calls of `table_loop` pass `&tb->lock`: `struct table`, at
/// its member `lock` (at -O1 the address is set in a register before
/// the loop, at -O0 reloaded from `tb`'s stack slot each time).
#[test]
fn a_lock_call_s_argument_is_typed_through_its_pointer() {
    let dir = tempfile::tempdir().unwrap();
    for opt in ["-O0", "-O1", "-O2"] {
        let exe = build(dir.path(), opt);
        let data = std::fs::read(&exe).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let sym = file
            .symbols()
            .find(|s| s.name() == Ok("table_loop"))
            .unwrap();
        let bias = elf::first_load_bias(&exe).unwrap();
        let (start, size) = (sym.address(), sym.size());
        let bytes = &data[(start - bias) as usize..(start - bias + size) as usize];
        let path: std::sync::Arc<str> = exe.to_str().unwrap().into();
        let mut s = Symbolizer::new();
        let mut named = Vec::new();
        for insn in Decoder::with_ip(64, bytes, start, DecoderOptions::NONE) {
            if insn.flow_control() != iced_x86::FlowControl::Call {
                continue;
            }
            let ret = Place::File {
                path: path.clone(),
                file_offset: insn.next_ip() - 1 - bias,
            };
            if let Some(t) = s.argument_type(&ret) {
                named.push((t.layout.type_name.clone().unwrap_or_default(), t.field()));
            }
        }
        let lock = ("struct table".to_string(), Some("lock".to_string()));
        assert!(
            named.iter().filter(|n| **n == lock).count() >= 2,
            "{opt}: lock and unlock: {named:?}"
        );
        assert!(named.iter().all(|n| *n == lock), "{opt}: {named:?}");
    }
}

//! Fuzzing of the parsers that read data the traced program controls: its
//! binaries' ELF symbols and DWARF (naming variables and fields), their
//! `.eh_frame` call-frame information (unwinding) and PLT (naming the
//! stubs their library calls go through), its `/proc/PID/maps`
//! and its machine code (decoding the operand of a sampled instruction).
//!
//! Each target mutates real seed inputs (this executable, the libc it
//! maps, this process's memory map) for `MEMPROF_FUZZ_SECS` seconds
//! (default 2; `cargo xtask fuzz` runs longer) and fails on a panic, an
//! input slower than 2 s, or a single allocation above 256 MiB, saving the
//! input to `target/fuzz-crashes/`. `MEMPROF_FUZZ_SEED` changes the
//! mutations; `MEMPROF_FUZZ_REPLAY=<file>` runs one saved input.

#[path = "fuzz/engine.rs"]
mod engine;
#[path = "fuzz/seeds.rs"]
mod seeds;

use std::{collections::BTreeMap, ops::Range, sync::Arc};

use engine::{fuzz, hash, replaying, Seed, Sig};
use memprof::{
    object::{
        symbolize::{dwarf, plt, Symbolizer},
        unwind,
        x86::{access, calls},
    },
    process::{
        files,
        maps::{short_name, Place, ProcMaps},
    },
};
use memprof_common::sharing::recipe;
use seeds::{Elf, Sym};

#[global_allocator]
static ALLOC: engine::CountingAlloc = engine::CountingAlloc;

/// A global with a struct array type and a function next to it, in their
/// own module so that they share one small DWARF compile unit: the seed
/// of the DWARF and symbol targets.
mod fuzz_probe {
    #[repr(C)]
    pub struct FuzzProbeItem {
        pub count: u64,
        pub flags: u32,
        pub next: u64,
    }

    #[no_mangle]
    pub static FUZZ_PROBE_TABLE: [FuzzProbeItem; 3] = [
        FuzzProbeItem {
            count: 1,
            flags: 2,
            next: 3,
        },
        FuzzProbeItem {
            count: 4,
            flags: 5,
            next: 6,
        },
        FuzzProbeItem {
            count: 7,
            flags: 8,
            next: 9,
        },
    ];

    #[inline(never)]
    #[no_mangle]
    pub extern "C" fn fuzz_probe_fn(i: usize) -> u64 {
        let item = &FUZZ_PROBE_TABLE[i % 3];
        item.count + u64::from(item.flags) + item.next
    }
}

const PROBE_VAR: &str = "FUZZ_PROBE_TABLE";

fn probe_fn_addr() -> u64 {
    std::hint::black_box(fuzz_probe::fuzz_probe_fn(1));
    fuzz_probe::fuzz_probe_fn as *const () as u64
}

fn self_exe() -> String {
    std::env::current_exe()
        .expect("test executable")
        .to_str()
        .expect("UTF-8 path")
        .to_string()
}

fn self_elf() -> Elf {
    Elf::read(&self_exe()).expect("this test executable is a 64-bit ELF file")
}

fn libc_elf() -> Option<(String, Elf)> {
    let path = seeds::libc_path()?;
    let elf = Elf::read(&path)?;
    Some((path, elf))
}

/// Hot ranges of a mini ELF: its headers and the named sections.
fn hot(parts: &BTreeMap<String, Range<usize>>, names: &[&str]) -> Vec<Range<usize>> {
    let mut hot = vec![
        parts["[elf and program headers]"].clone(),
        parts["[section headers]"].clone(),
    ];
    hot.extend(
        names
            .iter()
            .filter_map(|n| parts.get(*n))
            .filter(|r| !r.is_empty())
            .cloned(),
    );
    hot
}

// ---------------------------------------------------------------------------
// /proc/PID/maps

#[test]
fn fuzz_procmaps() {
    let _exclusive = engine::exclusive();
    let mut seeds = Vec::new();
    for path in ["/proc/self/maps", "/proc/1/maps"] {
        if let Ok(text) = std::fs::read(path) {
            if !text.is_empty() {
                seeds.push(Seed {
                    data: text,
                    hot: Vec::new(),
                    origin: seeds.len(),
                });
            }
        }
    }
    let dict: &[&[u8]] = &[
        b"-",
        b" ",
        b"\n",
        b"r-xp ",
        b"rw-p ",
        b"---p ",
        b"00000000 ",
        b"fe:01 ",
        b"ffffffffffffffff",
        b"7fffffffffff",
        b"10000000000000000",
        b" (deleted)",
        b"[heap]",
        b"[stack]",
        b"[uprobes]",
        b"/usr/lib/libc.so.6",
        b"\t",
        b"\r\n",
        "\u{e9}\u{2028}".as_bytes(),
        b"\xff\xfe",
    ];
    fuzz("procmaps", seeds, dict, 1 << 16, &mut |input, _| {
        let text = String::from_utf8_lossy(input);
        let maps = ProcMaps::parse(&text);
        let ms = maps.mappings();
        assert!(
            ms.windows(2).all(|w| w[0].start <= w[1].start),
            "mappings are sorted"
        );
        let mut sig = Sig(ms.len() as u64);
        let mut addrs = Vec::new();
        for m in ms.iter().take(64) {
            let span = m.end.wrapping_sub(m.start);
            addrs.extend([
                m.start,
                m.end,
                m.end.wrapping_sub(1),
                m.start.wrapping_add(span / 2),
                m.start.wrapping_sub(1),
            ]);
            sig.add(
                u64::from(m.readable) | u64::from(m.writable) << 1 | u64::from(m.executable) << 2,
            );
            sig.add(m.offset);
            let _ = short_name(&m.name);
            let _ = maps.file_base(&m.name);
        }
        let h = hash(input);
        addrs.extend([0, 1, u64::MAX, 1 << 47, h, h >> 17]);
        for a in addrs {
            if let Some(m) = maps.find(a) {
                assert!(m.start <= a && a < m.end, "find({a:#x}) gave {m:?}");
            }
            match maps.place(a) {
                Place::File { file_offset, .. } => sig.add(1 ^ file_offset),
                Place::Region { .. } => sig.add(2),
                Place::Anonymous { .. } => sig.add(3),
                Place::Unmapped { .. } => sig.add(4),
            }
            if let Some((_, base)) = maps.data_owner(a) {
                sig.add(base);
            }
            sig.add(u64::from(maps.in_thread_stack(a)));
        }
        for f in maps.code_files() {
            sig.add(f.len() as u64);
        }
        sig.0
    });
}

// ---------------------------------------------------------------------------
// Machine code

#[test]
fn fuzz_code() {
    let _exclusive = engine::exclusive();
    // Windows as `access::decode` gets them: LOOK_BEHIND bytes before the
    // sample's IP and LOOK_AHEAD after it, plus a little.
    let len = (access::LOOK_BEHIND + access::LOOK_AHEAD) as usize + 16;
    let mut windows = seeds::code_windows(&self_elf(), 64, len, 0x5555_5555_4000);
    if let Some((_, libc)) = libc_elf() {
        windows.extend(seeds::code_windows(&libc, 64, len, 0x7f12_3456_0000));
    }
    assert!(!windows.is_empty(), "no .text to take code from");
    let code_ips: Vec<u64> = windows.iter().map(|(_, ip)| *ip).collect();
    let seeds = windows
        .into_iter()
        .enumerate()
        .map(|(origin, (data, _))| Seed {
            data,
            hot: Vec::new(),
            origin,
        })
        .collect();
    // Prefixes, opcodes and ModRM/SIB bytes of memory operands and calls.
    let dict: &[&[u8]] = &[
        b"\x48\x8b\x04\xce",
        b"\x48\x89\x04\xce",
        b"\xf0\x48\x0f\xc1\x07",
        b"\xff\x15\x10\x00\x00\x00",
        b"\xe8\x00\x00\x00\x00",
        b"\xff\xd0",
        b"\x64\x48\x8b\x04\x25",
        b"\x7f\xf3",
        b"\xeb\xfe",
        b"\x0f\x85",
        b"\x62\xf1\x7c\x48\x10\x07",
        b"\xc4\xe2\x7d\x18\x07",
        b"\x66\x66\x66\x66\x66\x66\x66\x66\x66\x66\x66\x66\x66\x66\x90",
    ];
    fuzz("code", seeds, dict, len * 2, &mut |input, origin| {
        let h = hash(input);
        let code_ip = match h % 64 {
            // The ends of the address space.
            0 => u64::MAX - (h >> 8) % 512,
            1 => (h >> 8) % 512,
            _ => code_ips[origin],
        };
        let n = input.len() as u64;
        let ips = [
            code_ip.wrapping_add(access::LOOK_BEHIND),
            code_ip.wrapping_add((h >> 20) % (n + 2)),
            code_ip,
            code_ip.wrapping_add(n),
            code_ip.wrapping_add(n.saturating_sub(1)),
            code_ip.wrapping_sub(1),
        ];
        let mut sig = Sig::default();
        for ip in ips {
            for precise in [false, true] {
                let d = access::decode(input, code_ip, ip, precise);
                if d.recipe.flags & recipe::PREVIOUS != 0 {
                    assert!(
                        d.insn < ip && ip - d.insn <= 15,
                        "previous instruction at {:#x} for {ip:#x}",
                        d.insn
                    );
                } else {
                    assert_eq!(d.insn, ip);
                }
                sig.add(u64::from(d.recipe.flags) ^ u64::from(d.recipe.base) << 8);
                sig.add(ip.wrapping_sub(d.insn));
            }
        }
        for end in [access::LOOK_BEHIND, (h >> 30) % (n + 8), n, 0, u64::MAX] {
            sig.add(u64::from(calls::ends_with_call(input, end as usize)));
        }
        sig.0
    });
}

// ---------------------------------------------------------------------------
// .eh_frame

#[test]
fn fuzz_eh_frame() {
    let _exclusive = engine::exclusive();
    let exe = self_exe();
    let mut objects = vec![(exe.clone(), self_elf(), vec![probe_fn_addr_vaddr()])];
    if let Some((path, libc)) = libc_elf() {
        objects.push((path, libc, Vec::new()));
    }
    let mut seeds = Vec::new();
    let mut queries = Vec::new();
    for (origin, (path, elf, wanted)) in objects.into_iter().enumerate() {
        let (data, q) = seeds::mini_unwind(&elf, 48, &wanted)
            .unwrap_or_else(|e| panic!("{path}: no unwind seed: {e}"));
        drop(elf);
        if !replaying() {
            check_unwind_seed(&path, &data, &q);
        }
        seeds.push(Seed {
            hot: Vec::new(),
            data,
            origin,
        });
        queries.push(q);
    }
    fuzz("eh_frame", seeds, &[], 1 << 16, &mut |input, origin| {
        let q = &queries[origin];
        let h = hash(input);
        let mut sig = Sig::default();
        let mut offsets: Vec<u64> = (0..12)
            .map(|i| q[(h as usize).wrapping_add(i * 7) % q.len()])
            .collect();
        offsets.extend([
            seeds::UNWIND_SHIFT + (h >> 16) % (1 << 24),
            0,
            u64::MAX,
            (h >> 3) % input.len().max(1) as u64,
        ]);
        for off in offsets {
            match unwind::rule_in(input, off) {
                Some(r) => {
                    sig.add(r.cfa_offset as u64);
                    sig.add(r.ra_offset as u64 ^ u64::from(r.base == unwind::Base::Bp));
                    sig.add(r.bp_offset.map_or(1, |o| o as u64));
                }
                None => sig.add(0),
            }
        }
        sig.0
    });
}

/// The probe function's ELF virtual address in this executable.
fn probe_fn_addr_vaddr() -> u64 {
    let maps = ProcMaps::read(std::process::id()).expect("own maps");
    let addr = probe_fn_addr();
    let m = maps.find(addr).expect("probe function is mapped");
    let offset = addr - m.start + m.offset;
    let elf = self_elf();
    let p = elf
        .phdrs
        .iter()
        .find(|p| p.ty == seeds::PT_LOAD && (p.offset..p.offset + p.filesz).contains(&offset))
        .expect("segment of the probe function");
    offset - p.offset + p.vaddr
}

/// The mini unwind object must give the very rules the original file
/// gives (else it would not be a faithful seed).
fn check_unwind_seed(path: &str, data: &[u8], queries: &[u64]) {
    let (mut unwinder, mut files) = (unwind::Unwinder::default(), files::FileCache::default());
    let path: Arc<str> = Arc::from(path);
    let mut found = 0;
    for &q in queries {
        let mini = unwind::rule_in(data, q);
        let real = unwinder.rule(&mut files, &path, q - seeds::UNWIND_SHIFT);
        assert_eq!(
            mini,
            real,
            "{path}: rule at offset {:#x}",
            q - seeds::UNWIND_SHIFT
        );
        found += usize::from(mini.is_some());
    }
    assert!(
        found * 2 >= queries.len(),
        "{path}: only {found} of {} queries have a rule",
        queries.len()
    );
}

// ---------------------------------------------------------------------------
// ELF symbols and DWARF

/// Symbols to keep in a mini ELF: `around` on each side of each of the
/// `anchors` (by address), and each anchor.
fn keep_symbols(all: &[Sym], anchors: &[&[u8]], around: usize) -> Vec<Sym> {
    let mut defined: Vec<&Sym> = all.iter().filter(|s| s.is_defined_code_or_data()).collect();
    defined.sort_by_key(|s| s.value);
    let mut keep = std::collections::BTreeSet::new();
    for anchor in anchors {
        if let Some(i) = defined.iter().position(|s| s.name == *anchor) {
            keep.extend(i.saturating_sub(around)..(i + around).min(defined.len()));
        }
    }
    if keep.is_empty() {
        let step = (defined.len() / (2 * around).max(1)).max(1);
        keep.extend((0..defined.len()).step_by(step));
    }
    keep.into_iter().map(|i| defined[i].clone()).collect()
}

/// The mini ELF of this executable: the symbols around the probes and the
/// probes' DWARF unit. Returns it, its parts and the symbols kept.
fn self_mini_elf() -> (Vec<u8>, BTreeMap<String, Range<usize>>, Vec<Sym>) {
    let elf = self_elf();
    let dwarf = seeds::unit_dwarf(&elf, PROBE_VAR).expect("the probe's DWARF unit");
    let keep = keep_symbols(
        &elf.symbols(".symtab"),
        &[b"fuzz_probe_fn", PROBE_VAR.as_bytes()],
        100,
    );
    let (data, parts) = seeds::mini_elf(&elf, ".symtab", &keep, &dwarf);
    (data, parts, keep)
}

#[test]
fn fuzz_dwarf() {
    let _exclusive = engine::exclusive();
    let (data, parts, _) = self_mini_elf();
    if !replaying() {
        let l = dwarf::layout_in(&data, PROBE_VAR).expect("layout of the probe in the seed");
        assert_eq!(l.element, Some(24), "{l:?}");
        let names: Vec<&str> = l.members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["count", "flags", "next"], "{l:?}");
        assert_eq!(
            l.field_at(PROBE_VAR, 24 + 16).as_deref(),
            Some("FUZZ_PROBE_TABLE[1].next")
        );
    }
    let seeds = vec![Seed {
        hot: hot(
            &parts,
            &[
                ".debug_info",
                ".debug_abbrev",
                ".debug_str",
                ".debug_line_str",
            ],
        ),
        data,
        origin: 0,
    }];
    let names = [
        PROBE_VAR,
        "fuzz::fuzz_probe::FUZZ_PROBE_TABLE",
        "count",
        "u64",
        "",
    ];
    fuzz("dwarf", seeds, &[], 1 << 20, &mut |input, _| {
        let h = hash(input);
        let mut sig = Sig::default();
        for name in [PROBE_VAR, names[(h % names.len() as u64) as usize]] {
            let Some(l) = dwarf::layout_in(input, name) else {
                sig.add(0);
                continue;
            };
            sig.add(l.element.unwrap_or(1));
            sig.add(l.struct_size.unwrap_or(1));
            sig.add(l.members.len() as u64);
            for off in [0, 8, 12, 23, 24, 40, 1 << 40, u64::MAX, h] {
                if let Some(f) = l.field_at(name, off) {
                    sig.add(f.len() as u64);
                }
            }
        }
        sig.0
    });
}

/// A symbol to look up: its value (ELF virtual address), file offset and
/// whether it is a function.
struct Query {
    name: Vec<u8>,
    value: u64,
    file_offset: Option<u64>,
    func: bool,
}

fn queries(elf: &Elf, keep: &[Sym], count: usize, first: &[&[u8]]) -> Vec<Query> {
    let step = (keep.len() / count.max(1)).max(1);
    let mut picked: Vec<&Sym> = keep
        .iter()
        .filter(|s| first.contains(&&s.name[..]))
        .collect();
    picked.extend(keep.iter().step_by(step));
    picked
        .into_iter()
        .map(|s| Query {
            name: s.name.clone(),
            value: s.value,
            file_offset: elf.file_offset(s.value),
            func: s.kind() == 2,
        })
        .collect()
}

const DATA_BASE: u64 = 0x5555_0000_0000;

#[test]
fn fuzz_elf_symbols() {
    let _exclusive = engine::exclusive();
    let dir = tempfile::tempdir().expect("temporary directory");
    let path: Arc<str> = Arc::from(dir.path().join("mini.elf").to_str().expect("UTF-8"));
    let mut seeds = Vec::new();
    let mut all_queries = Vec::new();

    let (data, parts, keep) = self_mini_elf();
    let elf = self_elf();
    let q = queries(&elf, &keep, 24, &[b"fuzz_probe_fn", PROBE_VAR.as_bytes()]);
    drop(elf);
    if !replaying() {
        std::fs::write(&*path, &data).expect("writing the seed");
        let mut s = Symbolizer::new();
        let var = q
            .iter()
            .find(|q| q.name == PROBE_VAR.as_bytes())
            .expect("probe var kept");
        let sym = s
            .data(&path, DATA_BASE, DATA_BASE + var.value + 8)
            .expect("the probe var by address");
        assert_eq!((sym.name.as_str(), sym.offset), (PROBE_VAR, 8));
        let f = q
            .iter()
            .find(|q| q.name == b"fuzz_probe_fn")
            .expect("probe fn kept");
        let frame = s.code(&Place::File {
            path: path.clone(),
            file_offset: f.file_offset.expect("probe fn offset"),
        });
        assert_eq!(frame.function, "fuzz_probe_fn", "{frame:?}");
        assert!(frame.line.is_some(), "line from the DWARF unit: {frame:?}");
    }
    seeds.push(Seed {
        hot: hot(
            &parts,
            &[".symtab", ".strtab", ".debug_info", ".debug_line"],
        ),
        data,
        origin: 0,
    });
    all_queries.push(q);

    if let Some((_, libc)) = libc_elf() {
        let keep = keep_symbols(&libc.symbols(".dynsym"), &[b"malloc", b"environ"], 60);
        let q = queries(&libc, &keep, 24, &[b"malloc", b"environ"]);
        let (data, parts) = seeds::mini_elf(&libc, ".dynsym", &keep, &[]);
        if !replaying() {
            std::fs::write(&*path, &data).expect("writing the seed");
            let mut s = Symbolizer::new();
            let named = q
                .iter()
                .filter(|q| q.func)
                .filter_map(|q| q.file_offset)
                .filter(|&file_offset| {
                    let frame = s.code(&Place::File {
                        path: path.clone(),
                        file_offset,
                    });
                    !frame.function.contains("+0x")
                })
                .count();
            assert!(named > 0, "libc's mini ELF names no function");
        }
        seeds.push(Seed {
            hot: hot(&parts, &[".dynsym", ".dynstr"]),
            data,
            origin: 1,
        });
        all_queries.push(q);
    }

    fuzz("elf_symbols", seeds, &[], 1 << 20, &mut |input, origin| {
        // The parsers read the file by path, as they do the target's.
        std::fs::write(&*path, input).expect("writing the input");
        let q = &all_queries[origin];
        let h = hash(input);
        let mut s = Symbolizer::new();
        let mut sig = Sig::default();
        for i in 0..6 {
            let q = &q[(h as usize).wrapping_add(i * 5) % q.len()];
            let extra = (h >> (8 * i)) % 16;
            if let Some(sym) = s.data(&path, DATA_BASE, DATA_BASE + q.value + extra) {
                sig.add(hash(sym.name.as_bytes()) ^ sym.offset);
            }
            if let Some(file_offset) = q.file_offset {
                let place = Place::File {
                    path: path.clone(),
                    file_offset: file_offset + extra,
                };
                let frame = s.code(&place);
                sig.add(hash(frame.function.as_bytes()) ^ u64::from(frame.line.unwrap_or(0)));
                let inner = s.code_innermost(&place);
                sig.add(hash(inner.function.as_bytes()));
            }
        }
        if origin == 0 {
            if let Some(l) = s.data_layout(&path, PROBE_VAR) {
                sig.add(l.members.len() as u64);
            }
        }
        // Addresses in no symbol, and at the ends of the address space.
        for addr in [0, DATA_BASE, u64::MAX, h] {
            let _ = s.data(&path, DATA_BASE, addr);
            let _ = s.code(&Place::File {
                path: path.clone(),
                file_offset: addr,
            });
        }
        sig.0
    });
}

// ---------------------------------------------------------------------------
// PLT stubs

/// The PLT stubs' names (`malloc@plt`) come from the file's `.rela.plt`,
/// `.dynsym` and the PLT sections' headers: a small Debian executable
/// with a lazy PLT is the seed, its relocations and symbols hot.
#[test]
fn fuzz_plt() {
    let _exclusive = engine::exclusive();
    let mut seeds = Vec::new();
    for path in ["/usr/bin/true", "/usr/bin/sleep", "/bin/true"] {
        let Some(elf) = Elf::read(path) else { continue };
        let Some(rela) = elf.section(".rela.plt") else {
            continue;
        };
        // The ELF header (the section table's place) and the names' sources.
        let hot = [Some(rela), elf.section(".dynsym"), elf.section(".dynstr")]
            .into_iter()
            .flatten()
            .map(|s| s.offset as usize..(s.offset + s.size) as usize)
            .chain(std::iter::once(0..64))
            .collect();
        let data = std::fs::read(path).expect("the seed is readable");
        if !replaying() {
            let named = plt::stubs_of(&data);
            assert!(!named.is_empty(), "{path}: a lazy PLT names no stub");
        }
        seeds.push(Seed {
            data,
            hot,
            origin: seeds.len(),
        });
        break;
    }
    if seeds.is_empty() {
        eprintln!("fuzz_plt: SKIPPED (no /usr/bin/true with a .rela.plt to start from)");
        return;
    }
    let dict: &[&[u8]] = &[
        b".plt\0",
        b".plt.sec\0",
        b".rela.plt\0",
        b"\x07\x00\x00\x00",
        b"\xff\xff\xff\xff\xff\xff\xff\xff",
        b"\x00\x00\x00\x00\x00\x00\x00\x80",
    ];
    fuzz("plt", seeds, dict, 1 << 17, &mut |input, _| {
        let stubs = plt::stubs_of(input);
        let mut sig = Sig(stubs.len() as u64);
        for s in stubs.iter().take(64) {
            assert!(
                s.at.end - s.at.start == 16 && s.name.ends_with("@plt"),
                "a stub is 16 bytes and named name@plt: {s:?}"
            );
            assert_eq!(plt::stub_at(&stubs, s.at.start), Some(s.name.as_str()));
            sig.add(hash(s.name.as_bytes()) ^ s.at.start);
        }
        sig.0
    });
}

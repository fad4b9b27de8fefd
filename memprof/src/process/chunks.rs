//! Heap blocks the allocator tracker never saw (allocated before the
//! attach, or outside a traced window), found in glibc malloc's own
//! metadata: every chunk starts with its size (`prev_size`, then `size`
//! with three flag bits), so walking the chunks of the heap that holds an
//! address from its first one finds the block's start and usable size.
//!
//! - The main arena's chunks fill `[heap]` from its start.
//! - Other arenas' heaps are 64 MiB-aligned mappings starting with a
//!   `heap_info` (whose `size` says how much of the heap is in use),
//!   followed for an arena's first heap by the arena itself; the first
//!   chunk is where a walk from it ends exactly at that size.
//! - A large block has a mapping of its own (`IS_MMAPPED`), its chunk at
//!   the mapping's start.
//!
//! A walk that meets a size glibc could not have written gives no answer:
//! another allocator (jemalloc, tcmalloc, mimalloc) is never guessed at.
//! The requested size is not recorded by glibc: the usable size (up to 23
//! bytes more, or a page more for a mapped block) is what is known.

use std::os::unix::fs::FileExt;

/// glibc's `HEAP_MAX_SIZE` on 64-bit systems: arena heaps are aligned to it.
const HEAP_MAX: u64 = 64 << 20;
const PREV_INUSE: u64 = 1;
const IS_MMAPPED: u64 = 2;
const FLAGS: u64 = 7;
/// The smallest chunk, and chunk alignment.
const MIN_CHUNK: u64 = 32;
const ALIGN: u64 = 16;
/// Chunks walked at most per lookup.
const MAX_CHUNKS: usize = 4 << 20;
/// Where an arena's first chunk can start in its heap: after `heap_info`
/// and, in its first heap, the arena (`malloc_state`, about 2 KiB).
const FIRST_CHUNK_MAX: u64 = 0x1000;

/// A block found from its chunk header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Where the program's bytes start (what `malloc` returned).
    pub start: u64,
    /// Bytes the program may use: the request rounded up by glibc.
    pub usable: u64,
    /// A block with a mapping of its own.
    pub mmapped: bool,
}

/// Reads the target's memory.
pub trait Memory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool;

    fn word(&self, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b).then(|| u64::from_le_bytes(b))
    }
}

/// A process's memory through `/proc/PID/mem`, read a window at a time
/// (a walk reads one word per chunk, in address order).
pub struct ProcMemory {
    file: std::fs::File,
    window: std::cell::RefCell<(u64, Vec<u8>)>,
}

const WINDOW: usize = 64 << 10;

impl ProcMemory {
    pub fn open(pid: u32) -> Option<Self> {
        let file = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
        Some(Self {
            file,
            window: std::cell::RefCell::new((0, Vec::new())),
        })
    }
}

impl Memory for ProcMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        let mut w = self.window.borrow_mut();
        let inside =
            |w: &(u64, Vec<u8>)| addr >= w.0 && addr + buf.len() as u64 <= w.0 + w.1.len() as u64;
        if !inside(&w) {
            // A window from `addr`, shorter at the end of a mapping.
            let mut data = vec![0u8; WINDOW];
            let mut len = WINDOW;
            while len >= buf.len().max(1) {
                if self.file.read_exact_at(&mut data[..len], addr).is_ok() {
                    data.truncate(len);
                    *w = (addr, data);
                    break;
                }
                len /= 2;
            }
            if !inside(&w) {
                return false;
            }
        }
        let at = (addr - w.0) as usize;
        buf.copy_from_slice(&w.1[at..at + buf.len()]);
        true
    }
}

/// The mapping a heap address is in: its bounds and whether it is the
/// main arena's `[heap]`.
#[derive(Debug, Clone, Copy)]
pub struct Region {
    pub start: u64,
    pub end: u64,
    pub brk_heap: bool,
}

impl Region {
    /// The mapping of `maps` holding `addr` if glibc's heap memory can be
    /// there: `[heap]`, or private anonymous memory (which glibc names
    /// `[anon: glibc: ...]` when asked to) that is no thread's stack.
    pub fn of(maps: &super::maps::ProcMaps, addr: u64) -> Option<Self> {
        let m = maps.find(addr)?;
        let brk_heap = &*m.name == "[heap]";
        let anonymous = m.name.is_empty() || m.name.starts_with("[anon:");
        let heap = (brk_heap || anonymous) && !m.shared && !maps.in_thread_stack(addr);
        heap.then_some(Self {
            start: m.start,
            end: m.end,
            brk_heap,
        })
    }
}

/// The glibc block holding `addr` in `region`, if the allocator's
/// metadata says so consistently.
pub fn chunk_at(mem: &dyn Memory, region: Region, addr: u64) -> Option<Chunk> {
    if region.brk_heap {
        // The first chunk is at the heap's start (aligned).
        let first = region.start.next_multiple_of(ALIGN);
        return walk(mem, first, region.end, addr, true);
    }
    if let Some(c) = mmapped_chunk(mem, region, addr) {
        return Some(c);
    }
    let base = addr & !(HEAP_MAX - 1);
    if base < region.start {
        return None;
    }
    // heap_info: ar_ptr, prev, size (bytes of the heap in use), ...
    let size = mem.word(base + 16)?;
    let end = base.checked_add(size)?;
    if !(FIRST_CHUNK_MAX..=HEAP_MAX).contains(&size) || end > region.end || addr >= end {
        return None;
    }
    (base + 32..base + FIRST_CHUNK_MAX)
        .step_by(ALIGN as usize)
        .find_map(|first| walk(mem, first, end, addr, true))
}

/// The start of the heap whose arena's lock is at `addr`, in an
/// anonymous mapping from `mapping_start`: glibc's arenas other than the
/// main one live in their first heap, right after its `heap_info`
/// (0x20 or, from glibc 2.35, 0x30 bytes), and the lock is the arena's
/// first field, so the heap's first word (`ar_ptr`) points at it; the
/// rest of `heap_info` must be a first heap's too (no previous heap, a
/// size in use within what is made accessible, within `HEAP_MAX`), so
/// another allocator's region is not taken for one. No program block can
/// be there: chunks start after the arena.
pub fn arena_of_lock(mem: &dyn Memory, mapping_start: u64, addr: u64) -> Option<u64> {
    let base = addr & !(HEAP_MAX - 1);
    let at = addr - base;
    let place = base >= mapping_start && (0x20..=0x40).contains(&at) && at.is_multiple_of(ALIGN);
    if !place || mem.word(base)? != addr || mem.word(base + 8)? != 0 {
        return None;
    }
    let (size, accessible) = (mem.word(base + 16)?, mem.word(base + 24)?);
    let heap_info = (FIRST_CHUNK_MAX..=accessible).contains(&size) && accessible <= HEAP_MAX;
    heap_info.then_some(base)
}

/// Where glibc's `malloc_state` (64-bit, glibc 2.27 and later: an int
/// `have_fastchunks` before `fastbinsY`) keeps `top`, the unsorted bin's
/// two links, `next` (the next arena of the circular list) and
/// `system_mem` (the bytes it took with `brk`).
const TOP: u64 = 0x60;
const UNSORTED: u64 = 0x70;
const NEXT: u64 = 0x870;
const SYSTEM_MEM: u64 = 0x888;
/// How far into `[heap]` the main arena's memory may start: what was
/// taken with `brk` before malloc's first call (a static program's TLS
/// block: 0xd00 bytes here).
const BRK_BEFORE_MALLOC: u64 = 1 << 20;
/// Reads of `top` and its size tried when another thread moves `top`
/// between the two.
const TOP_READS: usize = 3;

/// Whether `addr`, in an object file's data (libc's, or a static
/// program's), is glibc's main arena, whose lock is its first field. Its
/// name is not in a stripped libc's symbols, so its state must say so:
/// `top` is a chunk (after an in-use one) whose end, less `system_mem`,
/// is the start of `[heap]` (or at most [`BRK_BEFORE_MALLOC`] into it):
/// the arena's memory is `[heap]`'s; each unsorted-bin link is the bin's
/// own header (empty: `top`'s field, 0x10 before the links) or a chunk of
/// that memory; and `next` is the arena itself (the only one) or another
/// arena's lock where its heap's first word says so. Only `[heap]`'s
/// start is used from `maps`, which does not move as the heap grows or
/// shrinks. A main arena that had to take memory outside `[heap]` (`brk`
/// refused) is not recognised, nor an older glibc's layout or another
/// allocator: no answer rather than a guess.
pub fn is_main_arena(mem: &dyn Memory, maps: &super::maps::ProcMaps, addr: u64) -> bool {
    let heap = maps.mappings().iter().find(|m| &*m.name == "[heap]");
    let (Some(heap), true) = (heap, addr.is_multiple_of(8)) else {
        return false;
    };
    let word = |at: u64| mem.word(addr.checked_add(at)?);
    let Some(arena) = (0..TOP_READS).find_map(|_| main_arena_memory(mem, addr, heap.start)) else {
        return false;
    };
    let header = addr + TOP;
    let links = [UNSORTED, UNSORTED + 8]
        .iter()
        .all(|&at| word(at).is_some_and(|p| p == header || arena.contains(&p)));
    links
        && word(NEXT)
            .is_some_and(|next| next == addr || mem.word(next & !(HEAP_MAX - 1)) == Some(next))
}

/// The memory of the main arena at `addr` from `top` and `system_mem`,
/// if it starts in `[heap]` (at `heap_start`) and `top` is a chunk after
/// an in-use one that ends it; None also when `top` moved while read.
fn main_arena_memory(mem: &dyn Memory, addr: u64, heap_start: u64) -> Option<std::ops::Range<u64>> {
    let top = mem.word(addr.checked_add(TOP)?)?;
    let size = mem.word(top.checked_add(8)?)?;
    let end = top.checked_add(size & !FLAGS)?;
    let start = end.checked_sub(mem.word(addr.checked_add(SYSTEM_MEM)?)?)?;
    let placed = (heap_start..=heap_start + BRK_BEFORE_MALLOC).contains(&start);
    let chunk = size & PREV_INUSE != 0 && size & !FLAGS >= MIN_CHUNK && top >= start;
    let same = mem.word(addr + TOP)? == top;
    (placed && chunk && same).then_some(start..end)
}

/// A block with a mapping of its own: glibc writes a zero `prev_size` and
/// a page-multiple size with only `IS_MMAPPED` set at the mapping's start.
/// Such mappings next to each other are one in the maps (the kernel
/// merges them), so the chunks are walked from the region's start.
fn mmapped_chunk(mem: &dyn Memory, region: Region, addr: u64) -> Option<Chunk> {
    let mut c = region.start;
    for _ in 0..MAX_CHUNKS {
        let (prev, size) = (mem.word(c)?, mem.word(c + 8)?);
        let bytes = size & !FLAGS;
        let header = prev == 0 && size & FLAGS == IS_MMAPPED && bytes >= 4096;
        if !header || !bytes.is_multiple_of(4096) || c + bytes > region.end {
            return None;
        }
        if addr < c + bytes {
            return (addr >= c + 16).then_some(Chunk {
                start: c + 16,
                usable: bytes.saturating_sub(16),
                mmapped: true,
            });
        }
        c += bytes;
    }
    None
}

/// Walks chunks from `first` to exactly `end`; the in-use chunk holding
/// `addr`. With `strict`, any size glibc could not have written ends the
/// walk with no answer.
fn walk(mem: &dyn Memory, first: u64, end: u64, addr: u64, strict: bool) -> Option<Chunk> {
    let mut c = first;
    let mut found = None;
    for _ in 0..MAX_CHUNKS {
        if c == end {
            return found;
        }
        // The top chunk may end a few bytes short of the mapping's end,
        // never past it.
        if c + MIN_CHUNK > end {
            return found.filter(|_| end - c < MIN_CHUNK);
        }
        let size = mem.word(c + 8)?;
        let bytes = size & !FLAGS;
        if bytes < MIN_CHUNK || !bytes.is_multiple_of(ALIGN) || c + bytes > end {
            return None;
        }
        if strict && size & IS_MMAPPED != 0 {
            return None;
        }
        if (c..c + bytes).contains(&addr) && addr >= c + 16 {
            // In use if the next chunk says its predecessor is; the top
            // chunk (the last) is free space.
            let next = c + bytes;
            let used = next < end && mem.word(next + 8).is_some_and(|s| s & PREV_INUSE != 0);
            if !used {
                return None;
            }
            found = Some(Chunk {
                start: c + 16,
                // The next chunk's prev_size field is the block's too.
                usable: bytes - 8,
                mmapped: false,
            });
        }
        c += bytes;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::fake_memory::FakeMemory;

    /// Chunks of the given sizes from `start`, each marked in use by the
    /// next; the last is the top chunk.
    fn heap(start: u64, sizes: &[u64]) -> FakeMemory {
        let mut words = Vec::new();
        let mut c = start;
        for &s in sizes {
            words.push((c + 8, s | PREV_INUSE));
            c += s;
        }
        FakeMemory::words(&words)
    }

    /// The main arena as glibc 2.36 left it in a program here (in
    /// libc's data, 0xc60 into its writable mapping; `[heap]` of 0x21000
    /// bytes with the top chunk at its end, the unsorted bin empty, one
    /// thread arena at 0x30 into its heap), and what that is not.
    #[test]
    fn the_main_arena_is_known_by_its_state() {
        const HEAP: &str = "55e058952000-55e058973000 rw-p 00000000 00:00 0 [heap]\n";
        let maps = super::super::maps::ProcMaps::parse(HEAP);
        let (main, top, thread_arena) = (0x7fcb_6540_ec60, 0x55e0_5895_33c0, 0x7fcb_6000_0030);
        let state = |top: u64, top_size: u64, unsorted: u64, next: u64| {
            FakeMemory::words(&[
                (main + TOP, top),
                (top.wrapping_add(8), top_size),
                (main + UNSORTED, unsorted),
                (main + UNSORTED + 8, main + TOP),
                (main + NEXT, next),
                (main + SYSTEM_MEM, 0x21000),
                (thread_arena - 0x30, thread_arena),
            ])
        };
        let arena = state(top, 0x1fc41, main + TOP, thread_arena);
        assert!(is_main_arena(&arena, &maps, main));
        let alone = state(top, 0x1fc41, 0x55e0_5895_2290, main);
        assert!(
            is_main_arena(&alone, &maps, main),
            "the only arena, a chunk unsorted"
        );
        // The heap grew past the maps last read: its start is what counts.
        let grown = state(top, 0x1fc41 + 0x10000, main + TOP, main);
        let grown = grown.word(main + SYSTEM_MEM, 0x31000);
        assert!(is_main_arena(&grown, &maps, main), "grown");
        let cases = [
            (
                state(top, 0x1fc41, main + TOP, main),
                main + 8,
                "not its start",
            ),
            (
                state(top, 0x1fc40, main + TOP, main),
                main,
                "top after a free chunk",
            ),
            (
                state(top, 0x1e041, main + TOP, main),
                main,
                "memory before [heap]",
            ),
            (
                state(top, 0x1fc41, main + 0x200, main),
                main,
                "a link outside",
            ),
            (
                state(top, 0x1fc41, main + TOP, main + 0x900),
                main,
                "next no arena",
            ),
            (
                state(u64::MAX - 4, 0x41, main + TOP, main),
                main,
                "no address",
            ),
            (
                state(u64::MAX - 8, 0x41, main + TOP, main),
                main,
                "past the end",
            ),
            (FakeMemory::words(&[]), main, "unread"),
        ];
        for (mem, addr, why) in cases {
            assert!(!is_main_arena(&mem, &maps, addr), "{why}");
        }
        let no_heap = super::super::maps::ProcMaps::parse("");
        assert!(!is_main_arena(&arena, &no_heap, main), "no [heap]");
    }

    /// An arena's lock is where its heap's first word points, right
    /// after `heap_info` (0x20 before glibc 2.35, 0x30 since).
    #[test]
    fn an_arenas_lock_is_where_its_heap_points() {
        let heap = 0x7f00_0400_0000;
        // ar_ptr, prev, size, mprotect_size.
        let info = |ar_ptr: u64, prev: u64, size: u64, accessible: u64| {
            FakeMemory::words(&[
                (heap, ar_ptr),
                (heap + 8, prev),
                (heap + 16, size),
                (heap + 24, accessible),
            ])
        };
        for at in [0x20, 0x30] {
            let mem = info(heap + at, 0, 0x21000, 0x21000);
            assert_eq!(arena_of_lock(&mem, heap, heap + at), Some(heap));
            let elsewhere = arena_of_lock(&mem, heap + 0x1000, heap + at);
            assert_eq!(elsewhere, None, "another mapping");
        }
        let cases = [
            (
                info(heap + 0x30, 0, 0x21000, 0x21000),
                0x40,
                "not the arena",
            ),
            (info(heap + 0x1030, 0, 0x21000, 0x21000), 0x1030, "a block"),
            (FakeMemory::words(&[]), 0x30, "unread"),
            (
                info(heap + 0x30, heap - HEAP_MAX, 0x21000, 0x21000),
                0x30,
                "a previous heap",
            ),
            (
                info(heap + 0x30, 0, 0x21000, 0x1000),
                0x30,
                "in use > accessible",
            ),
            (
                FakeMemory::words(&[(heap, heap + 0x30)]),
                0x30,
                "no heap_info",
            ),
        ];
        for (mem, at, why) in cases {
            assert_eq!(arena_of_lock(&mem, heap, heap + at), None, "{why}");
        }
    }

    #[test]
    fn a_block_is_found_by_walking_the_heap_s_chunks() {
        let start = 0x5555_0000_0000;
        let mem = heap(start, &[0x290, 0x40, 0x20, 0x1000, 0x20d50]);
        let end = start + 0x290 + 0x40 + 0x20 + 0x1000 + 0x20d50;
        let region = Region {
            start,
            end,
            brk_heap: true,
        };
        let c = chunk_at(&mem, region, start + 0x290 + 0x10 + 20).unwrap();
        assert_eq!((c.start, c.usable), (start + 0x2a0, 0x38));
        let c = chunk_at(&mem, region, start + 0x2f0 + 0x100).unwrap();
        assert_eq!((c.start, c.usable), (start + 0x2f0 + 0x10, 0xff8));
        // The top chunk is free space; a chunk header is no block.
        assert_eq!(chunk_at(&mem, region, end - 0x100), None);
        assert_eq!(chunk_at(&mem, region, start + 0x290 + 8), None);
    }

    /// Two mapped blocks whose mappings the kernel merged into one.
    #[test]
    fn mapped_blocks_in_one_merged_mapping_are_told_apart() {
        let start = 0x7f00_0000_0000;
        let mem = FakeMemory::words(&[
            (start, 0),
            (start + 8, 0x21000 | IS_MMAPPED),
            (start + 0x21000, 0),
            (start + 0x21008, 0x101000 | IS_MMAPPED),
        ]);
        let region = Region {
            start,
            end: start + 0x122000,
            brk_heap: false,
        };
        let c = chunk_at(&mem, region, start + 0x21000 + 0x500).unwrap();
        assert_eq!(
            (c.start, c.usable, c.mmapped),
            (start + 0x21010, 0x100ff0, true)
        );
        let c = chunk_at(&mem, region, start + 0x100).unwrap();
        assert_eq!((c.start, c.usable), (start + 0x10, 0x20ff0));
    }

    #[test]
    fn sizes_glibc_could_not_write_give_no_answer() {
        let start = 0x5555_0000_0000;
        let region = |len| Region {
            start,
            end: start + len,
            brk_heap: true,
        };
        // A size that is not a multiple of 16.
        let mem = heap(start, &[0x290, 0x48, 0x1000]);
        assert_eq!(
            chunk_at(&mem, region(0x290 + 0x48 + 0x1000), start + 0x2a0),
            None
        );
        // A walk that does not end at the heap's end.
        let mem = heap(start, &[0x290, 0x40, 0x1000]);
        assert_eq!(chunk_at(&mem, region(0x4000), start + 0x2a0), None);
    }

    /// Runs the C program (with `preload`), reads what it allocated, and
    /// gives each block with what `chunk_at` says of its middle.
    fn blocks_of(preload: Option<&str>) -> Vec<(u64, u64, Option<Chunk>, bool)> {
        use std::io::{BufRead, Write};
        let dir = tempfile::tempdir().unwrap();
        let exe = crate::object::symbolize::c_tests::gcc(dir.path(), "chunks", PROGRAM, &["-O1"]);
        let mut cmd = std::process::Command::new(&exe);
        if let Some(lib) = preload {
            cmd.env("LD_PRELOAD", lib);
        }
        let mut child = cmd
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut blocks = Vec::new();
        let mut line = String::new();
        while out.read_line(&mut line).unwrap() > 0 && line.trim() != "ready" {
            let (n, a) = line.trim().split_once(' ').unwrap();
            blocks.push((
                n.parse::<u64>().unwrap(),
                u64::from_str_radix(a, 16).unwrap(),
            ));
            line.clear();
        }
        let pid = child.id();
        let maps = crate::process::maps::ProcMaps::read(pid).unwrap();
        let mem = ProcMemory::open(pid).unwrap();
        let found = blocks
            .iter()
            .map(|&(n, addr)| {
                let m = maps.find(addr).expect("mapped");
                let region = Region {
                    start: m.start,
                    end: m.end,
                    brk_heap: &*m.name == "[heap]",
                };
                (
                    n,
                    addr,
                    chunk_at(&mem, region, addr + n / 2),
                    region.brk_heap,
                )
            })
            .collect();
        let _ = child.stdin.take().unwrap().write_all(b"x\n");
        let _ = child.wait();
        found
    }

    /// A C program's glibc heap (built by gcc, waiting while read): blocks
    /// of the main arena, of a thread's arena and a mapped one are found
    /// at the addresses `malloc` returned, with at least the bytes asked.
    #[test]
    fn a_program_s_blocks_are_found_where_malloc_put_them() {
        let mut kinds = std::collections::BTreeSet::new();
        for (n, addr, c, brk_heap) in blocks_of(None) {
            let c = c.unwrap_or_else(|| panic!("no chunk for {n} bytes at {addr:#x}"));
            assert_eq!(c.start, addr, "{n} bytes");
            let slack = if c.mmapped { 4096 + 16 } else { 24 };
            assert!(c.usable >= n && c.usable < n + slack, "{n}: {c:?}");
            kinds.insert((brk_heap, c.mmapped));
        }
        // All three kinds were met: main arena, thread arena, mapped.
        assert_eq!(kinds.len(), 3, "{kinds:?}");
    }

    /// Under another allocator glibc's rules find no chunk where there is
    /// none: no answer, never a wrong block.
    #[test]
    fn other_allocators_blocks_are_not_guessed_at() {
        for lib in [
            "libjemalloc.so.2",
            "libtcmalloc_minimal.so.4",
            "libmimalloc.so.2",
        ] {
            let path = format!("/usr/lib/x86_64-linux-gnu/{lib}");
            if !std::path::Path::new(&path).exists() {
                eprintln!("SKIP {lib}: not installed (cargo xtask setup installs it)");
                continue;
            }
            for (n, addr, c, _) in blocks_of(Some(&path)) {
                if let Some(c) = c {
                    assert!(
                        c.start == addr && c.usable >= n,
                        "{lib}: a wrong block for {n} bytes at {addr:#x}: {c:?}"
                    );
                }
            }
        }
    }

    const PROGRAM: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static void *worker(void *arg)
{
	(void)arg;
	for (int n = 24; n <= 600; n += 96)
		printf("%d %lx\n", n, (unsigned long)malloc(n));
	return NULL;
}

int main(void)
{
	for (int n = 24; n <= 5000; n += 248)
		printf("%d %lx\n", n, (unsigned long)malloc(n));
	printf("%d %lx\n", 1 << 20, (unsigned long)malloc(1 << 20));
	pthread_t t;
	pthread_create(&t, NULL, worker, NULL);
	pthread_join(t, NULL);
	printf("ready\n");
	fflush(stdout);
	getchar();
	return 0;
}
"#;
}

//! Each allocator's size classes: the block it really hands out for a
//! request (its usable size) and the class that block belongs to, which
//! is the unit of reuse the blowup of [`super::memory`] is counted in.
//!
//! - glibc: the chunk header gives the usable size; the class is the bin
//!   (small bins every 16 bytes below 1 KiB, then glibc's 64-bit large-bin
//!   spacing), and chunks it mmapped are large objects;
//! - jemalloc 5 (16-byte quantum, 4 KiB pages): 8, then multiples of 16
//!   to 128, then four classes per doubling: `sz_s2u`;
//! - mimalloc: 8-byte words, even word counts to 64 bytes, then four
//!   bins per doubling (`_mi_bin`), the block being the bin's size;
//! - tcmalloc (gperftools 2, its default build: 8 KiB pages, classes up
//!   to 256 KiB): the classes its `SizeMap::Init` computes at start-up,
//!   computed the same way here (alignment by size, enough pages per span
//!   that less than an eighth is left over, neighbours that would use the
//!   same span merged); above, whole pages;
//! - others: not computed: the requested size, with powers of two as
//!   classes, and usable sizes reported as unknown.

use super::allocator::AllocatorKind;

/// The class of large objects (glibc's mmapped chunks; above the largest
/// class elsewhere).
pub const LARGE: u32 = u32::MAX;

/// jemalloc's largest small class with 4 KiB pages (`SC_SMALL_MAXCLASS`):
/// above it blocks are page runs, still in four classes per doubling.
const JEMALLOC_SMALL_MAX: u64 = 14 << 10;
/// glibc's smallest large-bin chunk size (`MIN_LARGE_SIZE`, 64-bit).
const GLIBC_MIN_LARGE: u64 = 1024;

/// How an allocator sizes and classes its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeClasses {
    Glibc,
    Jemalloc,
    Mimalloc,
    Tcmalloc,
    /// Not known: requested sizes, power-of-two classes.
    Unknown,
}

impl SizeClasses {
    pub fn of(kind: AllocatorKind) -> Self {
        match kind {
            AllocatorKind::Glibc => SizeClasses::Glibc,
            AllocatorKind::Jemalloc => SizeClasses::Jemalloc,
            AllocatorKind::Mimalloc => SizeClasses::Mimalloc,
            AllocatorKind::Tcmalloc => SizeClasses::Tcmalloc,
            AllocatorKind::Other => SizeClasses::Unknown,
        }
    }

    /// Whether usable sizes are the allocator's (not the requested ones).
    pub fn usable_known(self) -> bool {
        self != SizeClasses::Unknown
    }

    /// The usable size of a block handed out for `size` bytes, where it
    /// follows from the size alone (not glibc's: its header says).
    pub fn usable(self, size: u64) -> Option<u64> {
        match self {
            SizeClasses::Jemalloc => Some(jemalloc_usable(size)),
            SizeClasses::Mimalloc => Some(mimalloc_usable(size)),
            SizeClasses::Tcmalloc => Some(tcmalloc_usable(size)),
            SizeClasses::Glibc | SizeClasses::Unknown => None,
        }
    }

    /// The class of a block of `usable` bytes (`large`: glibc mmapped it).
    pub fn class(self, usable: u64, large: bool) -> u32 {
        if large {
            return LARGE;
        }
        match self {
            // Chunk size = usable + 8 (the size field), 16-byte aligned.
            SizeClasses::Glibc => glibc_bin((usable + 8).next_multiple_of(16)),
            SizeClasses::Jemalloc | SizeClasses::Mimalloc | SizeClasses::Tcmalloc => {
                u32::try_from(usable).unwrap_or(LARGE - 1)
            }
            SizeClasses::Unknown => {
                u32::try_from(usable.max(1).next_power_of_two()).unwrap_or(LARGE - 1)
            }
        }
    }
}

/// glibc's bin for a chunk of `chunk` bytes: the chunk size itself for
/// small bins, `largebin_index_64` above (offset so both never collide).
fn glibc_bin(chunk: u64) -> u32 {
    if chunk < GLIBC_MIN_LARGE {
        return chunk as u32;
    }
    let index = if chunk >> 6 <= 48 {
        48 + (chunk >> 6)
    } else if chunk >> 9 <= 20 {
        91 + (chunk >> 9)
    } else if chunk >> 12 <= 10 {
        110 + (chunk >> 12)
    } else if chunk >> 15 <= 4 {
        119 + (chunk >> 15)
    } else if chunk >> 18 <= 2 {
        124 + (chunk >> 18)
    } else {
        126
    };
    (1 << 20) + index as u32
}

/// Rounds `size` up to four classes per doubling: the multiple of a
/// quarter of the power of two below it.
fn four_per_doubling(size: u64) -> u64 {
    let lg = 63 - (size - 1).leading_zeros() as u64; // floor(log2(size - 1))
    let delta = 1u64 << lg.saturating_sub(2);
    size.next_multiple_of(delta)
}

/// jemalloc 5's usable size for a request of `size` bytes (`sz_s2u`).
fn jemalloc_usable(size: u64) -> u64 {
    match size {
        0..=8 => 8,
        9..=128 => size.next_multiple_of(16),
        _ if size <= JEMALLOC_SMALL_MAX => four_per_doubling(size),
        // Large: the same spacing, at least a page.
        _ => four_per_doubling(size).max(4096),
    }
}

/// mimalloc's block size for a request of `size` bytes (its bin's size).
fn mimalloc_usable(size: u64) -> u64 {
    let words = size.max(1).div_ceil(8);
    let words = match words {
        1 => 1,
        2..=8 => words.next_multiple_of(2),
        _ => four_per_doubling(words),
    };
    words * 8
}

/// gperftools' page size and largest class (its default build).
const TCMALLOC_PAGE_SHIFT: u32 = 13;
const TCMALLOC_MAX_SIZE: u64 = 256 << 10;

/// gperftools' class sizes, as `SizeMap::Init` computes them: sizes step
/// by an alignment that grows with the size (8, 16, then an eighth of the
/// power of two below); each class gets the fewest pages that leave less
/// than an eighth unused and hold a quarter of the objects moved between
/// caches at once; a size whose span would hold as many objects in as
/// many pages as the class before replaces that class.
fn tcmalloc_classes() -> &'static [u64] {
    static CLASSES: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();
    CLASSES.get_or_init(|| {
        let page = 1u64 << TCMALLOC_PAGE_SHIFT;
        let alignment = |size: u64| -> u64 {
            let a = match size {
                128.. => (1u64 << (63 - size.leading_zeros())) / 8,
                16.. => 16,
                _ => 8,
            };
            a.min(page)
        };
        // Objects moved between a thread cache and the central list at
        // once (64 KiB of them, 2 to 32).
        let move_count = |size: u64| (65536 / size).clamp(2, 32);
        let mut classes: Vec<(u64, u64)> = Vec::new(); // (size, pages)
        let mut size = 8;
        while size <= TCMALLOC_MAX_SIZE {
            let to_move = move_count(size) / 4;
            let mut span = 0;
            loop {
                span += page;
                while span % size > span >> 3 {
                    span += page;
                }
                if span / size >= to_move {
                    break;
                }
            }
            let pages = span >> TCMALLOC_PAGE_SHIFT;
            match classes.last_mut() {
                Some(last)
                    if last.1 == pages
                        && (pages << TCMALLOC_PAGE_SHIFT) / size
                            == (pages << TCMALLOC_PAGE_SHIFT) / last.0 =>
                {
                    last.0 = size;
                }
                _ => classes.push((size, pages)),
            }
            size += alignment(size);
        }
        classes.into_iter().map(|(size, _)| size).collect()
    })
}

/// gperftools' usable size for a request of `size` bytes: its class, or
/// whole pages above the largest.
fn tcmalloc_usable(size: u64) -> u64 {
    let classes = tcmalloc_classes();
    match classes.binary_search(&size.max(1)) {
        Ok(i) => classes[i],
        Err(i) if i < classes.len() => classes[i],
        Err(_) => size.next_multiple_of(1 << TCMALLOC_PAGE_SHIFT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks `usable` against (request, block size) rows of a size table.
    fn check(usable: fn(u64) -> u64, table: &[(u64, u64)]) {
        for &(size, block) in table {
            assert_eq!(usable(size), block, "size {size}");
        }
    }

    #[test]
    fn jemalloc_classes_are_its_size_table() {
        // From jemalloc 5.3's size class table (LG_QUANTUM 4, 4 KiB pages).
        let table = [
            (1, 8),
            (8, 8),
            (9, 16),
            (17, 32),
            (100, 112),
            (128, 128),
            (129, 160),
            (161, 192),
            (257, 320),
            (1000, 1024),
            (1025, 1280),
            (4000, 4096),
            (14336, 14336),
            (14337, 16384),
            (100_000, 114_688),
        ];
        check(jemalloc_usable, &table);
    }

    #[test]
    fn mimalloc_blocks_are_its_bin_sizes() {
        let table = [
            (1, 8),
            (9, 16),
            (17, 32),
            (33, 48),
            (65, 80),
            (100, 112),
            (129, 160),
            (1000, 1024),
        ];
        check(mimalloc_usable, &table);
    }

    /// From `malloc_usable_size` under Debian's libtcmalloc-minimal4
    /// 2.10 (every request from 1 to 300,000: 85 classes, then pages).
    #[test]
    fn tcmalloc_classes_are_its_size_map() {
        let table = [
            (1, 8),
            (9, 16),
            (17, 32),
            (257, 288),
            (769, 896),
            (1537, 1792),
            (3073, 3328),
            (3329, 4096),
            (5121, 6144),
            (6145, 6656),
            (6657, 8192),
            (24577, 26624),
            (32769, 40960),
            (262_144, 262_144),
            (262_145, 270_336),
        ];
        check(tcmalloc_usable, &table);
        assert_eq!(tcmalloc_classes().len(), 85);
    }

    #[test]
    fn glibc_classes_are_its_bins() {
        let c = |usable| SizeClasses::Glibc.class(usable, false);
        // Small bins: every 16 bytes of chunk size.
        assert_eq!(c(24), c(24));
        assert_ne!(c(24), c(40));
        assert_eq!(c(56), 64);
        // Large bins: 64-byte spacing from 1 KiB...
        assert_eq!(c(1024 - 8), c(1072 - 8));
        assert_ne!(c(1024 - 8), c(1088 - 8));
        // ...and wider further up.
        assert_eq!(c(4096), c(4500));
        assert_eq!(SizeClasses::Glibc.class(1 << 20, true), LARGE);
    }

    #[test]
    fn unknown_allocators_keep_power_of_two_classes() {
        assert!(!SizeClasses::Unknown.usable_known());
        assert_eq!(SizeClasses::Unknown.usable(100), None);
        assert_eq!(SizeClasses::Unknown.class(100, false), 128);
        assert!(SizeClasses::of(AllocatorKind::Jemalloc).usable_known());
    }
}

//! Blocks glibc handed out before tracing, each kept with the global that
//! points into it. Found while the target runs (from its chunk header, and
//! by reading the program's globals for a pointer into it) once per
//! address asked about, and named from here by every report after: the
//! dashboard makes one a second, and a global's scan reads up to
//! [`holders::SCAN_MAX`] bytes.

use std::collections::{BTreeMap, HashMap};

use super::HeapBlock;
use crate::process::{
    chunks::{self, Memory, Region},
    holders,
    maps::ProcMaps,
};

impl HeapBlock {
    /// The [`HeapBlock::site`] of a block the heap did not see allocated,
    /// found from its glibc chunk header ([`chunks`]): its `size` is then
    /// its usable size.
    pub const UNSEEN: u64 = 0;
}

/// How many times an address no block was found under, or a block whose
/// holder search ran out of budget, is looked at again (at later settle
/// ticks or reports): a lookup can fail for a moment (the heap grew past
/// the memory map last read, another thread moved a chunk during the
/// walk), but an address that is no block's, or a program whose globals
/// outgrow the budget, should not cost a read each second for the whole
/// session.
const TRIES: u8 = 3;

/// The blocks found under asked addresses, by start.
#[derive(Default)]
pub struct Unseen {
    /// Addresses no block was found under, with the lookups tried.
    misses: HashMap<u64, u8>,
    blocks: BTreeMap<u64, HeapBlock>,
    /// The address of the word in the target's globals pointing into each
    /// block, by the block's start.
    holders: HashMap<u64, u64>,
    /// Blocks whose holder search ran out of budget, with the searches
    /// tried (a block absent here and from `holders` has none).
    searching: HashMap<u64, u8>,
}

impl Unseen {
    /// Looks up the block under each address not settled before, with at
    /// most [`holders::SCAN_MAX`] bytes of globals read in all.
    pub fn settle(
        &mut self,
        maps: &ProcMaps,
        mem: &dyn Memory,
        addrs: impl IntoIterator<Item = u64>,
    ) {
        let mut scan_left = holders::SCAN_MAX;
        for addr in addrs {
            self.find(maps, mem, addr, &mut scan_left);
        }
    }

    /// The block under `addr`: one found before (its holder searched for
    /// again if a search ran out of budget), or the one glibc's chunk
    /// header says is there, whose holder is then searched for (spending
    /// `scan_left`). No block is looked for at a glibc arena's lock, nor
    /// at an address where [`TRIES`] lookups found none.
    pub fn find(
        &mut self,
        maps: &ProcMaps,
        mem: &dyn Memory,
        addr: u64,
        scan_left: &mut u64,
    ) -> Option<HeapBlock> {
        if let Some(block) = self.containing(addr) {
            if self.searching.contains_key(&block.start) {
                self.search_holder(maps, mem, block, scan_left);
            }
            return Some(block);
        }
        if self.misses.get(&addr).is_some_and(|&n| n >= TRIES) {
            return None;
        }
        let Some(block) = Self::chunk_under(maps, mem, addr) else {
            *self.misses.entry(addr).or_default() += 1;
            return None;
        };
        self.misses.remove(&addr);
        // A block found before that this one overlaps was freed since.
        let end = block.start + block.size;
        let stale: Vec<u64> = self
            .blocks
            .range(..end)
            .rev()
            .take_while(|(_, b)| b.start + b.size > block.start)
            .map(|(&start, _)| start)
            .collect();
        for start in stale {
            self.blocks.remove(&start);
            self.holders.remove(&start);
            self.searching.remove(&start);
        }
        self.blocks.insert(block.start, block);
        self.search_holder(maps, mem, block, scan_left);
        Some(block)
    }

    /// The glibc block holding `addr`, from its chunk header; none at an
    /// arena's lock, where chunks do not start.
    fn chunk_under(maps: &ProcMaps, mem: &dyn Memory, addr: u64) -> Option<HeapBlock> {
        let region = Region::of(maps, addr)?;
        if !region.brk_heap && chunks::arena_of_lock(mem, region.start, addr).is_some() {
            return None;
        }
        let chunk = chunks::chunk_at(mem, region, addr)?;
        Some(HeapBlock {
            start: chunk.start,
            size: chunk.usable,
            site: HeapBlock::UNSEEN,
        })
    }

    /// Searches the globals for a word pointing into `block`; a search
    /// the budget cut short is tried again later, [`TRIES`] times in all.
    fn search_holder(
        &mut self,
        maps: &ProcMaps,
        mem: &dyn Memory,
        block: HeapBlock,
        scan_left: &mut u64,
    ) {
        if *scan_left == 0 {
            return;
        }
        let span = (block.start, block.start + block.size);
        if let Some(word) = holders::pointer_into(maps, mem, span, scan_left) {
            self.holders.insert(block.start, word);
            self.searching.remove(&block.start);
            return;
        }
        let tries = self.searching.entry(block.start).or_default();
        *tries += 1;
        if *scan_left > 0 || *tries >= TRIES {
            // Read to the end (no holder), or tried enough.
            self.searching.remove(&block.start);
        }
    }

    /// Whether `addr` needs no more lookups: its block and holder are
    /// known (or have no more tries), or no block was found there in all
    /// the tries.
    pub fn settled(&self, addr: u64) -> bool {
        match self.containing(addr) {
            Some(block) => !self.searching.contains_key(&block.start),
            None => self.misses.get(&addr).is_some_and(|&n| n >= TRIES),
        }
    }

    /// The block found under `addr`, if one was.
    pub fn containing(&self, addr: u64) -> Option<HeapBlock> {
        HeapBlock::in_map(&self.blocks, addr)
    }

    /// The address of the global's word that points into the block found
    /// at `start`.
    pub fn holder(&self, start: u64) -> Option<u64> {
        self.holders.get(&start).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::fake_memory::{FakeMemory, PROGRAM_MAPS as MAPS};

    const HEAP: u64 = 0x5555_5555_9000;
    /// The global in `.bss` that keeps the second block.
    const GLOBAL: u64 = 0x5555_5555_7a08;

    /// `[heap]` of three in-use chunks (0x290, 0x50 and 0x110 bytes, each
    /// marked in use by the next) and the top chunk; the program's data
    /// with a pointer into the second block.
    fn target() -> FakeMemory {
        let mut mem = FakeMemory::default()
            .region(0x5555_5555_6000, 0x3000)
            .word(GLOBAL, HEAP + 0x290 + 0x18);
        let mut chunk = HEAP;
        for size in [0x290, 0x50, 0x110, 0x2_1000 - 0x3f0] {
            mem = mem.word(chunk + 8, size | 1);
            chunk += size;
        }
        mem
    }

    #[test]
    fn a_block_is_found_with_its_global_once_and_kept() {
        let (maps, mem) = (ProcMaps::parse(MAPS), target());
        let mut unseen = Unseen::default();
        let second = HEAP + 0x290 + 0x10;
        unseen.settle(&maps, &mem, [second + 0x20]);
        let block = unseen.containing(second + 0x30).expect("found");
        assert_eq!((block.start, block.size), (second, 0x48));
        assert_eq!(unseen.holder(second), Some(GLOBAL));
        // Another address in the same block is not read again: the memory
        // is gone (the target exited) and the block is still there.
        let mut scan_left = 0;
        let gone = FakeMemory::default();
        let again = unseen.find(&maps, &gone, second + 0x8, &mut scan_left);
        assert_eq!(again.map(|b| b.start), Some(second));
    }

    #[test]
    fn a_block_no_global_points_into_has_no_holder() {
        let (maps, mem) = (ProcMaps::parse(MAPS), target());
        let mut unseen = Unseen::default();
        let first = HEAP + 0x10;
        unseen.settle(&maps, &mem, [first]);
        assert_eq!(unseen.containing(first).map(|b| b.start), Some(first));
        assert_eq!(unseen.holder(first), None);
    }

    #[test]
    fn an_address_in_no_block_is_looked_up_a_few_times_only() {
        let (maps, mem) = (ProcMaps::parse(MAPS), target());
        let mut unseen = Unseen::default();
        // In [heap], past the last in-use chunk: in the top chunk.
        let top = HEAP + 0x3f0 + 0x40;
        for tries in 1..=TRIES {
            assert!(!unseen.settled(top), "after {} lookups", tries - 1);
            unseen.settle(&maps, &mem, [top]);
        }
        assert!(unseen.settled(top));
        assert_eq!(unseen.containing(top), None);
        // Not read again: a block there now is not looked for.
        let second = HEAP + 0x290 + 0x10;
        let mut scan_left = holders::SCAN_MAX;
        let mut reads = Counting(&mem, std::cell::Cell::new(0));
        assert_eq!(unseen.find(&maps, &reads, top, &mut scan_left), None);
        assert_eq!(reads.1.get(), 0);
        // Another address is.
        let found = unseen.find(&maps, &reads, second, &mut scan_left);
        assert_eq!(found.map(|b| b.start), Some(second));
        reads = Counting(&mem, std::cell::Cell::new(0));
        assert!(unseen
            .find(&maps, &reads, second + 8, &mut scan_left)
            .is_some());
        assert_eq!(reads.1.get(), 0, "a known block is not read again");
    }

    /// Memory that counts its reads.
    struct Counting<'a>(&'a FakeMemory, std::cell::Cell<usize>);

    impl Memory for Counting<'_> {
        fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
            self.1.set(self.1.get() + 1);
            self.0.read(addr, buf)
        }
    }

    #[test]
    fn a_block_whose_scan_ran_out_keeps_its_place_and_is_searched_again() {
        let (maps, mem) = (ProcMaps::parse(MAPS), target());
        let mut unseen = Unseen::default();
        let second = HEAP + 0x290 + 0x10;
        let mut scan_left = 0x100;
        let block = unseen.find(&maps, &mem, second, &mut scan_left);
        assert_eq!(block.map(|b| b.start), Some(second), "named without");
        assert_eq!(scan_left, 0);
        assert!(!unseen.settled(second), "its holder is still wanted");
        // Kept: named by its block after the target exited.
        let gone = FakeMemory::default();
        let mut none_left = 0;
        let kept = unseen.find(&maps, &gone, second, &mut none_left);
        assert_eq!(kept.map(|b| b.start), Some(second));
        unseen.settle(&maps, &mem, [second]);
        assert_eq!(unseen.holder(second), Some(GLOBAL));
        assert!(unseen.settled(second));
    }

    #[test]
    fn a_block_found_over_an_older_one_replaces_it_and_its_holder() {
        let (maps, mem) = (ProcMaps::parse(MAPS), target());
        let mut unseen = Unseen::default();
        let second = HEAP + 0x290 + 0x10;
        unseen.settle(&maps, &mem, [second]);
        assert_eq!(unseen.holder(second), Some(GLOBAL));
        // Freed and merged with the next chunk into one block of 0x160
        // bytes, which no global points to (the old pointer's word now
        // holds 0).
        let mut merged = FakeMemory::default().region(0x5555_5555_6000, 0x3000);
        let mut chunk = HEAP;
        for size in [0x290, 0x160, 0x2_1000 - 0x3f0] {
            merged = merged.word(chunk + 8, size | 1);
            chunk += size;
        }
        let later = second + 0x100;
        unseen.settle(&maps, &merged, [later]);
        let block = unseen.containing(second).expect("the new block");
        assert_eq!((block.start, block.size), (second, 0x158));
        assert_eq!(unseen.holder(second), None, "not the freed block's global");
    }
}

//! Blocks glibc handed out before tracing, each kept with the global that
//! points into it. Found while the target runs (from its chunk header, and
//! by reading the program's globals for a pointer into it) once per
//! address asked about, and named from here by every report after: the
//! dashboard makes one a second, and a global's scan reads up to
//! [`holders::SCAN_MAX`] bytes.

use std::collections::{BTreeMap, HashMap, HashSet};

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

/// The blocks found under asked addresses, by start.
#[derive(Default)]
pub struct Unseen {
    asked: HashSet<u64>,
    blocks: BTreeMap<u64, HeapBlock>,
    /// The address of the word in the target's globals pointing into each
    /// block, by the block's start (none found: absent).
    holders: HashMap<u64, u64>,
}

impl Unseen {
    /// Looks up the block under each address not asked about before, with
    /// at most [`holders::SCAN_MAX`] bytes of globals read in all.
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

    /// The block under `addr`: one found before, or the one glibc's chunk
    /// header says is there, whose holder is then looked for (spending
    /// `scan_left`). An address asked about before and found in no block
    /// is not read again; nor is a glibc arena's lock, where no block can
    /// be. A block whose scan ran out of budget is asked again later.
    pub fn find(
        &mut self,
        maps: &ProcMaps,
        mem: &dyn Memory,
        addr: u64,
        scan_left: &mut u64,
    ) -> Option<HeapBlock> {
        if let Some(block) = self.containing(addr) {
            return Some(block);
        }
        if !self.asked.insert(addr) {
            return None;
        }
        let region = Region::of(maps, addr)?;
        if !region.brk_heap && chunks::arena_of_lock(mem, region.start, addr).is_some() {
            return None;
        }
        let chunk = chunks::chunk_at(mem, region, addr)?;
        let block = HeapBlock {
            start: chunk.start,
            size: chunk.usable,
            site: HeapBlock::UNSEEN,
        };
        let span = (block.start, block.start + block.size);
        match holders::pointer_into(maps, mem, span, scan_left) {
            Some(word) => {
                self.holders.insert(block.start, word);
            }
            None if *scan_left == 0 => {
                self.asked.remove(&addr);
                return Some(block);
            }
            None => {}
        }
        self.blocks.insert(block.start, block);
        Some(block)
    }

    /// Whether `addr` was looked up (found in a block or not).
    pub fn asked(&self, addr: u64) -> bool {
        self.asked.contains(&addr)
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
    fn an_address_in_no_block_is_asked_once() {
        let (maps, mem) = (ProcMaps::parse(MAPS), target());
        let mut unseen = Unseen::default();
        let global = 0x5555_5555_6010;
        unseen.settle(&maps, &mem, [global]);
        assert!(unseen.asked(global));
        assert_eq!(unseen.containing(global), None);
    }

    #[test]
    fn a_block_whose_scan_ran_out_is_asked_again() {
        let (maps, mem) = (ProcMaps::parse(MAPS), target());
        let mut unseen = Unseen::default();
        let second = HEAP + 0x290 + 0x10;
        let mut scan_left = 0x100;
        let block = unseen.find(&maps, &mem, second, &mut scan_left);
        assert_eq!(block.map(|b| b.start), Some(second), "named without");
        assert_eq!((scan_left, unseen.asked(second)), (0, false));
        unseen.settle(&maps, &mem, [second]);
        assert_eq!(unseen.holder(second), Some(GLOBAL));
    }
}

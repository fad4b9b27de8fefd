//! Blocks that held the addresses a feature asked about while the target
//! ran, kept after they are freed: a report is made after the program
//! freed its structures (a launched program frees them before it exits,
//! and a traced free takes the block out of the live heap), and names
//! what the heap held there when it mattered.

use std::collections::{BTreeMap, HashSet};

use super::{BlockLookup, Heap, HeapBlock};

/// Blocks found under asked addresses, by start.
#[derive(Default)]
pub struct Remembered {
    asked: HashSet<u64>,
    blocks: BTreeMap<u64, HeapBlock>,
}

impl Remembered {
    /// Looks up in the live heap each address not asked about before, and
    /// keeps the block that holds it. An address no live block holds is
    /// not asked again: a block allocated there later is another object,
    /// which the live heap names at report time.
    pub fn settle(&mut self, heap: &dyn Heap, addrs: impl IntoIterator<Item = u64>) {
        let new: Vec<u64> = addrs
            .into_iter()
            .filter(|a| !self.asked.contains(a))
            .collect();
        if new.is_empty() {
            return;
        }
        let index = heap.index();
        for addr in new {
            self.asked.insert(addr);
            if let Some(block) = index.containing(addr) {
                self.blocks.insert(block.start, block);
            }
        }
    }

    /// The remembered blocks, then `live`: a lookup where a block freed
    /// since it was remembered still holds its addresses.
    pub fn over<'a>(&'a self, live: Box<dyn BlockLookup + 'a>) -> Box<dyn BlockLookup + 'a> {
        Box::new(Over {
            remembered: self,
            live,
        })
    }

    /// Whether a remembered block holds `addr`.
    pub fn holds(&self, addr: u64) -> bool {
        self.containing(addr).is_some()
    }

    fn containing(&self, addr: u64) -> Option<HeapBlock> {
        HeapBlock::in_map(&self.blocks, addr)
    }
}

struct Over<'a> {
    remembered: &'a Remembered,
    live: Box<dyn BlockLookup + 'a>,
}

impl BlockLookup for Over<'_> {
    fn containing(&self, addr: u64) -> Option<HeapBlock> {
        self.remembered
            .containing(addr)
            .or_else(|| self.live.containing(addr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heap::fixture::FakeHeap;

    #[test]
    fn a_block_freed_after_it_was_asked_about_still_holds_its_addresses() {
        let before = FakeHeap::default().block(0x1000, 96, 0x40_1234);
        let mut remembered = Remembered::default();
        remembered.settle(&before, [0x1030]);
        // Freed, and another block allocated elsewhere.
        let after = FakeHeap::default().block(0x2000, 16, 0x40_5678);
        let lookup = remembered.over(after.index());
        let block = lookup.containing(0x1030).expect("remembered");
        assert_eq!(
            (block.start, block.size, block.site),
            (0x1000, 96, 0x40_1234)
        );
        // Other addresses come from the live heap.
        assert_eq!(lookup.containing(0x2008).map(|b| b.site), Some(0x40_5678));
        assert_eq!(lookup.containing(0x1000 + 96), None);
    }

    #[test]
    fn an_address_no_block_held_when_asked_is_not_asked_again() {
        let mut remembered = Remembered::default();
        remembered.settle(&FakeHeap::default(), [0x1030]);
        let later = FakeHeap::default().block(0x1000, 96, 0x40_1234);
        remembered.settle(&later, [0x1030]);
        assert!(remembered.blocks.is_empty());
        // The live heap still names it.
        let lookup = remembered.over(later.index());
        assert_eq!(lookup.containing(0x1030).map(|b| b.start), Some(0x1000));
    }
}

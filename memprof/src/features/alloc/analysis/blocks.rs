//! The live-block tracker: the blocks the program holds, by address, and
//! what holding and giving them back does to the sites and the memory
//! account.

use super::{AllocCall, AllocProfile, Class, Origin};
use crate::{
    features::alloc::memory::MemEvent,
    heap::{BlockLookup, Heap, HeapBlock},
    process::maps::Place,
};

/// A block the program holds: what the tracker knows about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    pub size: u64,
    pub usable: u64,
    pub class: Class,
    pub origin: Origin,
    /// Address of the allocating call ([`AllocProfile::site_place`]).
    pub site: u64,
    pub tid: u32,
    pub time_ns: u64,
}

impl AllocProfile {
    pub(super) fn hold(
        &mut self,
        ptr: u64,
        call: &AllocCall,
        class: Class,
        usable: u64,
        origin: Origin,
    ) {
        let site = self.sites.entry(call.site).or_default();
        site.count += 1;
        site.bytes += call.size;
        if site.via == 0 {
            site.via = call.via;
        }
        if self.live.len() >= self.live_cap && !self.live.contains_key(&ptr) {
            self.untracked_blocks += 1;
            return;
        }
        let site = self.sites.entry(call.site).or_default();
        site.live_bytes += call.size;
        site.live_blocks += 1;
        if let Some(stale) = self.live.remove(&ptr) {
            // Handed out twice without a free we saw (a free in an
            // untraced window): the old block is gone.
            self.forget(ptr, &stale);
        }
        self.memory.apply(MemEvent::Alloc {
            requested: call.size,
            usable,
            class: self.size_class(usable, class),
            addr: ptr,
        });
        let block = Block {
            size: call.size,
            usable,
            class,
            origin,
            site: call.site,
            tid: call.tid,
            time_ns: call.start_ns,
        };
        self.live.insert(ptr, block);
    }

    pub(super) fn release(&mut self, ptr: u64) -> Option<Block> {
        let block = self.live.remove(&ptr)?;
        self.forget(ptr, &block);
        Some(block)
    }

    fn forget(&mut self, ptr: u64, block: &Block) {
        if let Some(site) = self.sites.get_mut(&block.site) {
            site.live_bytes = site.live_bytes.saturating_sub(block.size);
            site.live_blocks = site.live_blocks.saturating_sub(1);
        }
        self.memory.apply(MemEvent::Free {
            requested: block.size,
            usable: block.usable,
            class: self.size_class(block.usable, block.class),
            addr: ptr,
        });
    }

    /// An index of the live blocks by address, for many
    /// [`BlockIndex::containing`] queries (the false-sharing analysis
    /// names heap objects with it). Building it sorts the live blocks.
    pub fn block_index(&self) -> BlockIndex<'_> {
        let mut starts: Vec<u64> = self.live.keys().copied().collect();
        starts.sort_unstable();
        BlockIndex {
            profile: self,
            starts,
        }
    }

    /// The live block containing `addr`, with its start address. For one
    /// query; use [`AllocProfile::block_index`] for many.
    pub fn block_containing(&self, addr: u64) -> Option<(u64, &Block)> {
        self.block_index().containing(addr)
    }

    /// Live blocks by start address, in no particular order.
    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    pub fn live_blocks(&self) -> impl Iterator<Item = (u64, &Block)> {
        self.live.iter().map(|(a, b)| (*a, b))
    }
}

/// Live blocks sorted by address: which block holds an address.
pub struct BlockIndex<'a> {
    profile: &'a AllocProfile,
    starts: Vec<u64>,
}

impl<'a> BlockIndex<'a> {
    /// The live block containing `addr`, with its start address.
    pub fn containing(&self, addr: u64) -> Option<(u64, &'a Block)> {
        let at = self.starts.partition_point(|&s| s <= addr);
        let start = *self.starts.get(at.checked_sub(1)?)?;
        let block = self.profile.live.get(&start)?;
        HeapBlock::holds(start, block.size, addr).then_some((start, block))
    }
}

/// The allocator profile is the session's heap: its live blocks and
/// their sites, for the analyses that name memory.
impl Heap for AllocProfile {
    fn live_count(&self) -> usize {
        AllocProfile::live_count(self)
    }

    fn index(&self) -> Box<dyn BlockLookup + '_> {
        Box::new(self.block_index())
    }

    fn site_place(&self, site: u64) -> Place {
        AllocProfile::site_place(self, site)
    }

    fn site_via(&self, site: u64) -> Option<Place> {
        AllocProfile::site_via(self, site)
    }

    fn maps_address(&self, addr: u64) -> bool {
        AllocProfile::maps_address(self, addr)
    }
}

impl BlockLookup for BlockIndex<'_> {
    fn containing(&self, addr: u64) -> Option<HeapBlock> {
        let (start, b) = BlockIndex::containing(self, addr)?;
        Some(HeapBlock {
            start,
            size: b.size,
            site: b.site,
        })
    }
}

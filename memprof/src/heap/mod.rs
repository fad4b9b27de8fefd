//! The heap as a session service: the live blocks and allocation sites
//! one feature tracks (the allocator's), behind [`Heap`], for the analyses
//! that name memory (false sharing, cache use, locks) without naming the
//! feature that keeps them.
//!
//! Also what naming heap memory needs whatever keeps the heap: sites
//! named past their wrappers ([`site_name`]), and the block under an
//! address the heap did not see allocated, from glibc's chunk headers
//! ([`Unseen`]).

#[cfg(test)]
pub mod fixture;
mod remembered;
pub mod site_name;
mod unseen;

pub use remembered::Remembered;
pub use unseen::Unseen;

use crate::{process::maps::Place, report::names::Names};
use site_name::{name_at, SiteName};

/// The live heap blocks and their allocation sites, as a feature keeps
/// them for the others ([`crate::features::Feature::heap`]).
pub trait Heap {
    /// Live blocks tracked.
    fn live_count(&self) -> usize;
    /// An index of the live blocks by address, for many
    /// [`BlockLookup::containing`] queries. Building it sorts the live
    /// blocks.
    fn index(&self) -> Box<dyn BlockLookup + '_>;
    /// Where allocation site `site` (a block's [`HeapBlock::site`]) is:
    /// the allocating call (unmapped when its place was never given).
    fn site_place(&self, site: u64) -> Place;
    /// The call inside the wrapper site `site` allocates through, placed.
    fn site_via(&self, site: u64) -> Option<Place>;
    /// Whether `addr` is in memory the allocator has from the kernel
    /// (committed or reserved).
    fn maps_address(&self, addr: u64) -> bool;

    /// The name of allocation site `site` (a key of the heap's sites).
    fn site_name(&self, site: u64, names: &mut dyn Names) -> SiteName {
        name_at(&self.site_place(site), self.site_via(site).as_ref(), names)
    }
}

/// Live blocks sorted by address: which block holds an address.
pub trait BlockLookup {
    /// The live block containing `addr`.
    fn containing(&self, addr: u64) -> Option<HeapBlock>;
}

/// A live heap block, as the heap's index finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapBlock {
    /// The block's address.
    pub start: u64,
    /// The size asked for.
    pub size: u64,
    /// Address of the allocating call ([`Heap::site_place`]), or
    /// [`HeapBlock::UNSEEN`].
    pub site: u64,
}

impl HeapBlock {
    /// Whether `addr` lies in the block.
    pub fn contains(&self, addr: u64) -> bool {
        Self::holds(self.start, self.size, addr)
    }

    /// Whether a block of `size` bytes at `start` holds `addr`: a block
    /// of 0 bytes (`malloc(0)`'s unique pointer) holds its first byte.
    pub fn holds(start: u64, size: u64, addr: u64) -> bool {
        start <= addr && addr < start + size.max(1)
    }

    /// The block of `blocks` (by start) that holds `addr`.
    pub fn in_map(blocks: &std::collections::BTreeMap<u64, Self>, addr: u64) -> Option<Self> {
        let (_, b) = blocks.range(..=addr).next_back()?;
        b.contains(addr).then_some(*b)
    }
}

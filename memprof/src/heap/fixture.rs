//! A heap for the tests of the analyses that name memory: its blocks,
//! site places and mapped ranges given as they are, not tracked from
//! allocator calls.

use std::collections::{BTreeMap, HashMap};

use super::{BlockLookup, Heap, HeapBlock};
use crate::process::maps::Place;

/// Live blocks by start, the places of their sites, and the ranges the
/// allocator mapped. No site goes through a wrapper.
#[derive(Debug, Default)]
pub struct FakeHeap {
    blocks: BTreeMap<u64, HeapBlock>,
    places: HashMap<u64, Place>,
    /// (start, end exclusive).
    mapped: Vec<(u64, u64)>,
}

impl FakeHeap {
    /// With a live block of `size` bytes at `start`, from `site`.
    pub fn block(mut self, start: u64, size: u64, site: u64) -> Self {
        self.blocks.insert(start, HeapBlock { start, size, site });
        self
    }

    /// With the place of allocation site `site`.
    pub fn site(mut self, site: u64, place: Place) -> Self {
        self.places.insert(site, place);
        self
    }

    /// With `len` bytes at `start` mapped by the allocator.
    pub fn mapped(mut self, start: u64, len: u64) -> Self {
        self.mapped.push((start, start + len));
        self
    }
}

/// The blocks of a [`FakeHeap`], by start.
struct Index<'a>(&'a BTreeMap<u64, HeapBlock>);

impl BlockLookup for Index<'_> {
    fn containing(&self, addr: u64) -> Option<HeapBlock> {
        HeapBlock::in_map(self.0, addr)
    }
}

impl Heap for FakeHeap {
    fn live_count(&self) -> usize {
        self.blocks.len()
    }

    fn index(&self) -> Box<dyn BlockLookup + '_> {
        Box::new(Index(&self.blocks))
    }

    fn site_place(&self, site: u64) -> Place {
        self.places
            .get(&site)
            .cloned()
            .unwrap_or(Place::Unmapped { address: site })
    }

    fn site_via(&self, _site: u64) -> Option<Place> {
        None
    }

    fn maps_address(&self, addr: u64) -> bool {
        self.mapped.iter().any(|&(s, e)| (s..e).contains(&addr))
    }
}

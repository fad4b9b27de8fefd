//! Allocation sites: calls and live bytes per call site, and where each
//! site is in the program.

use super::AllocProfile;
use crate::process::maps::Place;

/// Allocations made at one site.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SiteStats {
    pub count: u64,
    pub bytes: u64,
    pub live_bytes: u64,
    pub live_blocks: u64,
    /// The call inside the allocation wrapper its first block went
    /// through (0: called the allocator directly).
    pub via: u64,
}

impl AllocProfile {
    /// Whether the place of call site `addr` is known.
    pub fn knows_site(&self, addr: u64) -> bool {
        self.site_places.contains_key(&addr)
    }

    /// Records where call site `addr` is (once per site: resolving an
    /// address per call would cost more than the rest of the analysis).
    pub fn set_site_place(&mut self, addr: u64, place: Place) {
        self.site_places.insert(addr, place);
    }

    /// Sites whose place was never given.
    pub fn unplaced_sites(&self) -> Vec<u64> {
        self.sites
            .iter()
            .flat_map(|(&a, s)| [a, s.via])
            .filter(|a| *a != 0 && !self.site_places.contains_key(a))
            .collect()
    }

    /// The place of call site `addr` (unmapped if never given).
    pub fn site_place(&self, addr: u64) -> Place {
        self.site_places
            .get(&addr)
            .cloned()
            .unwrap_or(Place::Unmapped { address: addr })
    }

    /// The call inside the wrapper site `addr` allocates through, placed.
    pub fn site_via(&self, addr: u64) -> Option<Place> {
        let via = self.sites.get(&addr)?.via;
        (via != 0).then(|| self.site_place(via))
    }

    /// Sites with their places, in no particular order.
    pub fn sites(&self) -> impl Iterator<Item = (Place, &SiteStats)> {
        self.sites.iter().map(|(&a, s)| (self.site_place(a), s))
    }
}

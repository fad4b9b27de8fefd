//! The kernel's lock-contention aggregates: read on the dashboard's tick
//! and at the end (not per event), and the site hints the loader writes
//! back so the kernel can tell call sites apart.

use aya::maps::{HashMap as BpfHashMap, MapData};
use memprof_common::{maps, Contention, ContentionKey, SiteHint, WaiterKey};

use super::loader::Probes;
use crate::{error::Result, features::FastMap};

/// The contention maps, taken out of the object.
pub struct ContentionMaps {
    main: BpfHashMap<MapData, ContentionKey, Contention>,
    other: BpfHashMap<MapData, ContentionKey, Contention>,
    waiters: BpfHashMap<MapData, WaiterKey, u64>,
    hints: BpfHashMap<MapData, u64, SiteHint>,
}

fn take<K: aya::Pod, V: aya::Pod>(
    probes: &mut Probes,
    name: &str,
) -> Result<BpfHashMap<MapData, K, V>> {
    let map = probes.take_map(name)?;
    Ok(BpfHashMap::try_from(map).map_err(anyhow::Error::new)?)
}

impl ContentionMaps {
    pub fn take(probes: &mut Probes) -> Result<Self> {
        Ok(Self {
            main: take(probes, maps::CONTENTION)?,
            other: take(probes, maps::CONTENTION_OTHER)?,
            waiters: take(probes, maps::WAITER_THREADS)?,
            hints: take(probes, maps::SITE_HINTS)?,
        })
    }

    /// Every aggregate now: the individual locks', then the per-site
    /// ones of the locks that did not fit (`addr` 0). At most
    /// `CONTENTION_KEYS + CONTENTION_OTHER_KEYS` entries.
    pub fn snapshot(&self) -> Vec<(ContentionKey, Contention)> {
        let mut out = Vec::new();
        for map in [&self.main, &self.other] {
            // A key the kernel adds while we walk may be missed until the
            // next read; none is ever deleted.
            out.extend(map.iter().filter_map(|r| r.ok()));
        }
        out
    }

    /// Threads that waited, per futex word (a lower bound once the LRU
    /// table of waiting threads has evicted some).
    pub fn threads(&self) -> FastMap<u64, usize> {
        let mut counts: FastMap<u64, usize> = FastMap::default();
        for key in self.waiters.keys().filter_map(|k| k.ok()) {
            *counts.entry(key.addr).or_default() += 1;
        }
        counts
    }

    /// Gives the kernel where the return addresses are at instruction
    /// `ip` (a full table only leaves later sites less distinct).
    pub fn install_hint(&mut self, ip: u64, hint: SiteHint) {
        if let Err(e) = self.hints.insert(ip, hint, 0) {
            tracing::debug!("site hint for {ip:#x} not installed: {e}");
        }
    }
}
